"""Migrations create the schema from empty, match the models, and go back down; the token
CLI stores hashes only."""

from __future__ import annotations

import argparse

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from service.auth import hash_token, verify_token
from service.db.engine import alembic_config, make_engine, make_session_factory, migrate
from service.db.models import Base
from service.settings import Settings
from service.tokens_cli import add_token_parser, run_token

TABLES = {"tokens", "jobs", "allocations", "events", "nodes"}


def test_upgrade_from_empty_matches_models_and_downgrades(db_url: str) -> None:
    engine = make_engine(db_url)
    try:
        assert not set(sa.inspect(engine).get_table_names()) & TABLES
        migrate(db_url)
        assert set(sa.inspect(engine).get_table_names()) >= TABLES | {"alembic_version"}
        with engine.connect() as conn:
            ctx = MigrationContext.configure(conn, opts={"compare_type": True})
            assert compare_metadata(ctx, Base.metadata) == []
            assert ctx.get_current_revision() == "0007"
        migrate(db_url)  # idempotent
        command.downgrade(alembic_config(db_url), "base")
        assert not set(sa.inspect(engine).get_table_names()) & TABLES
    finally:
        engine.dispose()


def test_state_column_rejects_unknown_states(migrated_url: str) -> None:
    engine = make_engine(migrated_url)
    try:
        with pytest.raises(sa.exc.IntegrityError), engine.begin() as conn:
            conn.execute(sa.text(
                "INSERT INTO jobs (id, owner, state, state_reason, model_name, model_spec, "
                "training, request, request_hash, priority, total_steps, steps_done, "
                "created_at, updated_at) VALUES ('x', 'o', 'exploded', '', 'm', '{}', '{}', "
                "'{}', 'h', 0, 1, 0, CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)"
            ))
    finally:
        engine.dispose()


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="frenzy")
    add_token_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(list(argv))


def test_token_cli_creates_hashed_admin_token(
    db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    args = _parse("token", "create", "--admin", "--owner", "ops", "--database-url", db_url)
    assert args.handler is run_token
    assert run_token(args, settings=Settings(database_url=db_url)) == 0  # migrates first
    token = capsys.readouterr().out.strip()
    assert token.startswith("frz_")
    engine = make_engine(db_url)
    try:
        with make_session_factory(engine)() as s:
            stored = s.execute(sa.text("SELECT token_hash, is_admin FROM tokens")).one()
            assert stored[0] == hash_token(token) and token not in stored
            assert bool(stored[1]) is True
            principal = verify_token(session=s, token=token)
            assert principal is not None and principal.owner == "ops" and principal.is_admin
            assert verify_token(session=s, token=token + "x") is None
        revoke = _parse("token", "revoke", "--owner", "ops", "--database-url", db_url)
        assert run_token(revoke, settings=Settings(database_url=db_url)) == 0
        with make_session_factory(engine)() as s:
            assert verify_token(session=s, token=token) is None
    finally:
        engine.dispose()


def test_settings_from_env() -> None:
    s = Settings.from_env({"DATABASE_URL": "postgresql://u@h/db", "FRENZY_PLAN_CACHE_SIZE": "7"})
    assert s.database_url == "postgresql+psycopg://u@h/db" and s.plan_cache_size == 7
    # the state lives in one folder per user, whatever the working directory
    home = Settings.from_env({"HOME": "/home/ann"})
    assert home.database_url == "sqlite:////home/ann/.local/share/frenzy/frenzy.db"
    assert home.checkpoint_dir == "/home/ann/.local/share/frenzy/checkpoints"
    xdg = Settings.from_env({"HOME": "/home/ann", "XDG_DATA_HOME": "/data"})
    assert xdg.database_url == "sqlite:////data/frenzy/frenzy.db"
    own = Settings.from_env({"FRENZY_HOME": "/srv/frenzy", "FRENZY_CHECKPOINT_DIR": "/nfs/c"})
    assert own.database_url == "sqlite:////srv/frenzy/frenzy.db"
    assert own.checkpoint_dir == "/nfs/c"
    with pytest.raises(ValueError, match="FRENZY_MAX_GPUS"):
        Settings.from_env({"FRENZY_MAX_GPUS": "0"})


def test_extra_gpu_pools_from_env() -> None:
    s = Settings.from_env({"FRENZY_EXTRA_GPU_POOLS": "A100-80G:4, L4:2"})
    assert s.extra_gpu_pools == {"A100-80G": 4, "L4": 2}
    assert Settings.from_env({}).extra_gpu_pools == {}
    with pytest.raises(ValueError, match=r"FRENZY_EXTRA_GPU_POOLS.*TYPE:COUNT"):
        Settings.from_env({"FRENZY_EXTRA_GPU_POOLS": "A100-80G"})
    with pytest.raises(ValueError, match="FRENZY_EXTRA_GPU_POOLS"):
        Settings.from_env({"FRENZY_EXTRA_GPU_POOLS": "A100-80G:0"})
