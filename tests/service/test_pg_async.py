"""The async PostgreSQL hot paths (``service.db.pg_async``): what they write and read is what
the synchronous repositories write and read; a batch is all or nothing; the writer isolates
a failing submission; a lost connection is replaced. PostgreSQL only (skipped without
FRENZY_TEST_POSTGRES_URL)."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
import sqlalchemy as sa
from service_builders import T0

from orchestrator.states import JobState
from service.db import repositories as repo
from service.db.engine import make_engine, write_connection, write_session
from service.db.pg_async import AsyncJobWriter, AsyncPg, libpq_conninfo

PLANS = [{"rank": 1, "gpu_type": "A100-80G", "num_gpus": 2, "note": 'a "quoted" text'},
         {"rank": 2, "gpu_type": "L40S", "num_gpus": 4, "note": "back\\slash"}]


@pytest.fixture
def pg_url(migrated_url: str) -> str:
    if not migrated_url.startswith("postgresql"):
        pytest.skip("PostgreSQL only")
    return migrated_url


def _job(job_id: str, now: datetime, **extra: Any) -> dict[str, Any]:
    """``insert_job`` keyword arguments of a small job."""
    args: dict[str, Any] = dict(
        job_id=job_id, owner="alice", name=f"n-{job_id}", model_name="gpt2",
        model_spec_json=json.dumps({"name": "gpt2", "layers": 12}),
        training_json=json.dumps({"global_batch": 8}), request_json=json.dumps({"model": "gpt2"}),
        request_hash="h" * 64, idempotency_key=None, total_steps=100,
        plans_json=json.dumps(PLANS), plan_count=len(PLANS), now=now, priority=3,
        deadline_s=None, entrypoint=None,
    )
    return {**args, **extra}


def _run(coro: Any) -> Any:
    return asyncio.run(coro)


def _ids(url: str, table: str = "jobs", column: str = "id") -> list[str]:
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            return sorted(conn.execute(sa.text(f"SELECT {column} FROM {table}")).scalars())
    finally:
        engine.dispose()


def test_conninfo_keeps_user_host_database_and_options() -> None:
    assert libpq_conninfo("postgresql+psycopg://app:pw@db:5433/frenzy?sslmode=require") == (
        "postgresql://app:pw@db:5433/frenzy?sslmode=require")


def test_batch_insert_reads_back_like_the_sync_path(pg_url: str) -> None:
    # A non-UTC "now" must be stored as the same instant and read back in UTC.
    now = datetime(2026, 11, 22, 14, 30, tzinfo=timezone(timedelta(hours=2)))
    pg = AsyncPg(pg_url, size=2)

    async def go() -> tuple[Any, Any]:
        rows = await pg.insert_jobs([_job("j1", now, deadline_s=60.0), _job("j2", now)])
        assert [r["id"] for r in rows] == ["j1", "j2"]
        got = await pg.read_job("j1"), await pg.read_job("missing")
        await pg.close()
        return got

    (row, held), missing = _run(go())
    assert missing == (None, [])
    assert held == []
    assert row.state is JobState.PENDING
    assert row.created_at == datetime(2026, 11, 22, 12, 30, tzinfo=UTC)
    assert row.created_at.tzinfo == UTC
    assert row.deadline_at == datetime(2026, 11, 22, 12, 31, tzinfo=UTC)
    assert json.loads(row.plans) == PLANS
    assert (row.owner, row.priority, row.total_steps, row.plan_count) == ("alice", 3, 100, 2)
    # The synchronous repository reads the same values.
    engine = make_engine(pg_url)
    try:
        with engine.connect() as conn:
            sync = repo.get_job_row(conn=conn, job_id="j1")
            events = conn.execute(sa.text(
                "SELECT job_id, kind, state FROM events ORDER BY job_id")).all()
    finally:
        engine.dispose()
    assert sync is not None
    assert tuple(sync) == tuple(row)
    assert [tuple(e) for e in events] == [("j1", "submitted", "pending"),
                                          ("j2", "submitted", "pending")]


def test_read_job_returns_held_allocations(pg_url: str) -> None:
    _run(_insert_once(pg_url, [_job("held", T0)]))
    engine = make_engine(pg_url)
    try:
        factory = sa.orm.sessionmaker(engine)
        with write_session(factory) as s:
            job = repo.get_job(session=s, job_id="held", for_update=True)
            assert job is not None
            repo.transition_job(session=s, job=job, to=JobState.PLACED, reason="placed",
                                now=T0)
            repo.set_allocation(session=s, job=job, placement=[("n1", 2), ("n2", 1)],
                                gpu_type="A100-80G", plan_rank=1, now=T0)
    finally:
        engine.dispose()
    pg = AsyncPg(pg_url, size=1)

    async def go() -> Any:
        try:
            return await pg.read_job("held")
        finally:
            await pg.close()

    row, held = _run(go())
    assert row.state is JobState.PLACED
    assert sorted((a.node_id, a.gpus, a.released_at) for a in held) == [
        ("n1", 2, None), ("n2", 1, None)]
    assert all(a.created_at == T0 for a in held)


async def _insert_once(url: str, jobs: list[dict[str, Any]]) -> None:
    pg = AsyncPg(url, size=1)
    try:
        await pg.insert_jobs(jobs)
    finally:
        await pg.close()


def test_a_batch_is_all_or_nothing(pg_url: str) -> None:
    _run(_insert_once(pg_url, [_job("taken", T0)]))
    with pytest.raises(Exception, match="duplicate key"):
        _run(_insert_once(pg_url, [_job("fresh", T0), _job("taken", T0)]))
    assert _ids(pg_url) == ["taken"]
    assert _ids(pg_url, "events", "job_id") == ["taken"]


def test_writer_fails_only_the_offending_submission(pg_url: str) -> None:
    with write_connection(make_engine(pg_url)) as conn:
        repo.insert_jobs(conn=conn, jobs=[_job("k0", T0, idempotency_key="key-1")])
    pg = AsyncPg(pg_url, size=2)
    writer = AsyncJobWriter(pg)

    async def go() -> list[Any]:
        try:
            return await asyncio.gather(
                writer.insert_job(**_job("k1", T0)),
                writer.insert_job(**_job("k2", T0, idempotency_key="key-1")),
                writer.insert_job(**_job("k3", T0)),
                return_exceptions=True,
            )
        finally:
            await pg.close()

    ok1, dup, ok3 = _run(go())
    assert ok1["id"] == "k1" and ok3["id"] == "k3"
    assert isinstance(dup, sa.exc.IntegrityError)
    assert _ids(pg_url) == ["k0", "k1", "k3"]
    # The three arrived together: one failed batch, then one transaction each.
    assert writer.written == 2


def test_a_lost_connection_is_replaced(pg_url: str) -> None:
    _run(_insert_once(pg_url, [_job("j", T0)]))
    pg = AsyncPg(pg_url, size=1, ping_idle_s=3600)
    engine = make_engine(pg_url)

    def kill_backends() -> None:
        with engine.connect() as conn:
            conn.execute(sa.text(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"))
            conn.commit()

    async def go() -> tuple[Any, Any]:
        first = await pg.read_job("j")
        kill_backends()  # the pooled connection dies while idle (a server restart)
        await asyncio.sleep(0.2)
        second = await pg.read_job("j")  # retried on a new connection
        await pg.close()
        return first, second

    try:
        (first, _), (second, _) = _run(go())
    finally:
        engine.dispose()
    assert first.id == second.id == "j"


def test_open_warms_the_pool_up_to_its_size(pg_url: str) -> None:
    pg = AsyncPg(pg_url, size=3)

    async def go() -> tuple[int, int, int]:
        await pg.open(2)
        warmed = len(pg._idle)
        await pg.open(5)  # only one more fits
        full = len(pg._idle)
        await pg.read_job("missing")  # uses an idle connection, opens none
        after = len(pg._idle)
        await pg.close()
        return warmed, full, after

    assert _run(go()) == (2, 3, 3)
