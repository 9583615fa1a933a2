"""The app factory the security tests run under uvicorn (settings from the environment;
jobs stay PENDING: no Controller)."""

from __future__ import annotations

from fastapi import FastAPI

from service.api import create_app
from service.settings import Settings


def app() -> FastAPI:
    return create_app(settings=Settings.from_env())
