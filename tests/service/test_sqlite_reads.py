"""The SQLite hot reads (``service.db.sqlite_reads``): the rows are the ones the engine's
Core path returns (the job in each state, with its held allocations), a token is found
only while it is live, and each read sees what was committed just before it."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from service_builders import T0

from orchestrator.states import JobState
from service.auth import create_token, hash_token
from service.db import repositories as repo
from service.db.engine import (
    make_engine,
    make_session_factory,
    migrate,
    write_connection,
    write_session,
)
from service.db.sqlite_reads import SqliteReads

PLANS = [{"rank": 1, "gpu_type": "A100-80G", "num_gpus": 2}]


@pytest.fixture
def engine(tmp_path: Path) -> Any:
    url = f"sqlite:///{tmp_path / 'frenzy.db'}"
    migrate(url)
    engine = make_engine(url)
    yield engine
    engine.dispose()


def _insert(engine: sa.Engine, job_id: str, now: datetime) -> None:
    with write_connection(engine) as conn:
        repo.insert_jobs(conn=conn, jobs=[dict(
            job_id=job_id, owner="alice", name=f"n-{job_id}", model_name="gpt2",
            model_spec_json=json.dumps({"name": "gpt2"}), training_json="{}",
            request_json="{}", request_hash="h" * 64, idempotency_key=None, total_steps=100,
            plans_json=json.dumps(PLANS), plan_count=1, now=now, priority=0,
            deadline_s=30.0, entrypoint=None)])


def _engine_read(engine: sa.Engine, job_id: str) -> tuple[Any, list[Any]]:
    with engine.connect() as conn:
        row = repo.get_job_row(conn=conn, job_id=job_id)
        return row, repo.held_allocation_rows(conn=conn, job_id=job_id)


def test_job_rows_are_the_engines_in_every_state(engine: sa.Engine) -> None:
    reads = SqliteReads(engine)
    try:
        _insert(engine, "j1", T0)
        row, held = reads.read_job("j1")  # pending, read right after the commit
        assert row.state is JobState.PENDING and held == []
        assert row.created_at == T0 and row.created_at.tzinfo == UTC
        assert row.deadline_at == T0 + timedelta(seconds=30)
        assert json.loads(row.plans) == PLANS
        sync, _ = _engine_read(engine, "j1")
        assert tuple(sync) == tuple(row) and row._fields == tuple(sync._fields)

        factory = make_session_factory(engine)
        with write_session(factory) as s:
            job = repo.get_job(session=s, job_id="j1", for_update=True)
            assert job is not None
            repo.transition_job(session=s, job=job, to=JobState.PLACED, reason="placed",
                                now=T0)
            repo.set_allocation(session=s, job=job, placement=[("n1", 2), ("n2", 1)],
                                gpu_type="A100-80G", plan_rank=1, now=T0)
        row, held = reads.read_job("j1")
        assert row.state is JobState.PLACED
        assert sorted((a.node_id, a.gpus, a.released_at) for a in held) == [
            ("n1", 2, None), ("n2", 1, None)]
        sync, sync_held = _engine_read(engine, "j1")
        assert tuple(sync) == tuple(row)
        assert [tuple(a) for a in sync_held] == [tuple(a) for a in held]
        assert reads.read_job("missing") == (None, [])
    finally:
        reads.close()


def test_a_token_is_found_only_while_it_is_live(engine: sa.Engine) -> None:
    factory = make_session_factory(engine)
    now = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)
    with write_session(factory) as s:
        forever = create_token(session=s, owner="alice", now=now)
        hour = create_token(session=s, owner="root", is_admin=True, now=now,
                            expires_in=timedelta(hours=1))
    reads = SqliteReads(engine)
    try:
        found = reads.read_token(hash_token(forever), now)
        assert found is not None and tuple(found)[1:] == ("alice", False)
        assert tuple(reads.read_token(hash_token(hour), now))[1:] == ("root", True)
        # expiry: live a second before, not at the hour
        assert reads.read_token(hash_token(hour), now + timedelta(minutes=59)) is not None
        assert reads.read_token(hash_token(hour), now + timedelta(hours=1)) is None
        assert reads.read_token(hash_token("frz_unknown"), now) is None
        # revocation is seen by the very next read (no cache)
        with write_session(factory) as s:
            repo.revoke_token(session=s, token_id=int(found[0]), now=now)
        assert reads.read_token(hash_token(forever), now) is None
    finally:
        reads.close()


def test_only_sqlite(engine: sa.Engine) -> None:
    pg = sa.create_engine("postgresql+psycopg://u@localhost/db")
    with pytest.raises(ValueError, match="SQLite engine, got postgresql"):
        SqliteReads(pg)
