"""Alembic environment: runs the revisions in ``migrations/versions`` against one database.

The URL comes from, in order: a connection handed in through ``config.attributes
["connection"]`` (tests, ``service.db.migrate``), the ``sqlalchemy.url`` option when set, or
the service settings (``DATABASE_URL``). The live models' metadata is loaded only for
``alembic revision --autogenerate``; upgrades run the frozen ``op.*`` revisions alone.
"""

from __future__ import annotations

import logging
from logging.config import fileConfig

from alembic import context
from sqlalchemy import Connection, MetaData

config = context.config
if config.config_file_name is not None and config.attributes.get("configure_logger", True):
    fileConfig(config.config_file_name, disable_existing_loggers=False)
log = logging.getLogger("alembic.env")


def _target_metadata() -> MetaData | None:
    """The models' metadata, only when autogenerating a new revision."""
    cmd_opts = getattr(config, "cmd_opts", None)
    if cmd_opts is not None and getattr(cmd_opts, "autogenerate", False):
        from service.db.models import Base

        return Base.metadata
    return None


def _url() -> str:
    url = config.get_main_option("sqlalchemy.url")
    if url:
        return url
    from service.settings import get_settings

    return get_settings().database_url


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=_target_metadata(),
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_offline() -> None:
    """Emit SQL to stdout (``alembic upgrade --sql``) without a database."""
    context.configure(
        url=_url(), target_metadata=_target_metadata(), literal_binds=True,
        dialect_opts={"paramstyle": "named"},
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    from service.db.engine import make_engine

    engine = make_engine(_url())
    try:
        with engine.connect() as conn:
            _run(conn)
            conn.commit()
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
