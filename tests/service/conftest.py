"""Fixtures for the service tests: a migrated database (SQLite file, and PostgreSQL when
FRENZY_TEST_POSTGRES_URL is set), an app built with ``create_app``, tokens and nodes."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from service_builders import Clock, Env, add_nodes
from sqlalchemy.engine import make_url

from service.api import create_app
from service.auth import create_token
from service.db.engine import make_engine, make_session_factory, migrate, write_session
from service.runner import PendingRunner
from service.settings import Settings

PG_ENV = "FRENZY_TEST_POSTGRES_URL"


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An empty database: a SQLite file, or a fresh PostgreSQL database per test."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'frenzy.db'}"
        return
    base = os.environ.get(PG_ENV)
    if not base:
        pytest.skip(f"{PG_ENV} not set (scripts/start_postgres.sh prints one)")
    base = Settings(database_url=base).database_url
    name = f"frenzy_t_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(base, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    try:
        yield make_url(base).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()


@pytest.fixture
def migrated_url(db_url: str) -> str:
    migrate(db_url)
    return db_url


@pytest.fixture
def settings(migrated_url: str) -> Settings:
    return Settings(database_url=migrated_url, inventory_ttl_s=0)


@pytest.fixture
def factory(settings: Settings) -> Iterator[sa.orm.sessionmaker]:
    engine = make_engine(settings.database_url)
    yield make_session_factory(engine)
    engine.dispose()


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def make_env(
    settings: Settings, factory: sa.orm.sessionmaker, clock: Clock
) -> Iterator[Callable[..., Env]]:
    """Build an app (``create_app``) with tokens for alice, bob and an admin."""
    clients: list[TestClient] = []

    def build(
        runner: Any = None,
        nodes: dict[str, tuple[str, int]] | None = None,
        **kwargs: Any,
    ) -> Env:
        runner = runner if runner is not None else PendingRunner()
        if nodes is None:
            nodes = {"a100-0": ("A100-80G", 8), "a100-1": ("A100-80G", 8),
                     "l40s-0": ("L40S", 4)}
        add_nodes(factory, nodes)
        with write_session(factory) as s:
            tokens = {
                "alice": create_token(session=s, owner="alice"),
                "bob": create_token(session=s, owner="bob"),
                "admin": create_token(session=s, owner="root", is_admin=True),
            }
        app = create_app(settings=settings, runner=runner, clock=clock, **kwargs)
        client = TestClient(app)
        client.__enter__()
        clients.append(client)
        return Env(client=client, runner=runner, factory=factory, clock=clock, tokens=tokens)

    yield build
    for c in clients:
        c.__exit__(None, None, None)


@pytest.fixture
def env(make_env: Callable[..., Env]) -> Env:
    return make_env()
