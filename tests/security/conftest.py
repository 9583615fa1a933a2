"""Fixtures of the security tests: a migrated database (a SQLite file, and PostgreSQL when
FRENZY_TEST_POSTGRES_URL is set), an in-process app with tokens for alice, bob and an admin,
and a real uvicorn server in a subprocess for what only a server shows (memory, sockets)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from security_helpers import Clock, Env, Server, add_nodes, start_server
from sqlalchemy.engine import make_url

from service.api import create_app
from service.auth import create_token
from service.db.engine import make_engine, make_session_factory, migrate, write_session
from service.runner import PendingRunner
from service.settings import Settings

PG_ENV = "FRENZY_TEST_POSTGRES_URL"


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An empty, migrated database: a SQLite file, or a fresh PostgreSQL database."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'frenzy.db'}"
        migrate(url)
        yield url
        return
    base = os.environ.get(PG_ENV)
    if not base:
        pytest.skip(f"{PG_ENV} not set (scripts/start_postgres.sh prints one)")
    base = Settings(database_url=base).database_url
    name = f"frenzy_s_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(base, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    try:
        url = make_url(base).set(database=name).render_as_string(hide_password=False)
        migrate(url)
        yield url
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'frenzy.db'}"
    migrate(url)
    return url


def _build(url: str, clock: Clock, **settings: Any) -> tuple[Env, TestClient]:
    engine = make_engine(url)
    factory = make_session_factory(engine)
    add_nodes(factory, {"a100-0": ("A100-80G", 8), "a100-1": ("A100-80G", 8)})
    with write_session(factory) as s:
        tokens = {
            "alice": create_token(session=s, owner="alice"),
            "bob": create_token(session=s, owner="bob"),
            "admin": create_token(session=s, owner="root", is_admin=True),
        }
    app = create_app(settings=Settings(database_url=url, inventory_ttl_s=0, **settings),
                     runner=PendingRunner(), clock=clock)
    client = TestClient(app)
    client.__enter__()
    return Env(client=client, factory=factory, clock=clock, tokens=tokens, engine=engine), client


@pytest.fixture
def make_env(db_url: str) -> Iterator[Callable[..., Env]]:
    """``make_env(**settings)``: the app on ``db_url`` with those settings."""
    built: list[tuple[Env, TestClient]] = []

    def make(**settings: Any) -> Env:
        built.append(_build(db_url, Clock(), **settings))
        return built[-1][0]

    yield make
    for env, client in built:
        client.__exit__(None, None, None)
        env.engine.dispose()


@pytest.fixture
def env(make_env: Callable[..., Env]) -> Env:
    return make_env()


@pytest.fixture
def server(sqlite_url: str, tmp_path: Path) -> Iterator[Server]:
    """The API under uvicorn in its own process (SQLite), default settings."""
    s = start_server(sqlite_url, tmp_path)
    try:
        yield s
    finally:
        s.stop()
