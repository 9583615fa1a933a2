"""The API's hot paths on PostgreSQL without threads: async psycopg on the worker's event loop.

With the synchronous engine, every ``GET /v1/jobs/{id}`` and every submission batch went
event loop → worker thread → (pool pre-ping, BEGIN, statements, COMMIT: one network round
trip each) → back to the event loop. On a busy 2-core machine each of those hand-overs waits
for the GIL (up to the 5 ms switch interval while the loop thread runs Python) or for a CPU,
which is where PostgreSQL's 50-70 ms p50 came from, not from the database (docs/api_load.md).

``AsyncPg`` keeps a few psycopg ``AsyncConnection`` per worker process and runs

* ``read_job``: one prepared ``SELECT`` by primary key in autocommit (plus the job's held
  allocations when it holds GPUs) — one round trip, no BEGIN/ROLLBACK, no ping;
* ``insert_jobs``: a whole group-commit batch (the job rows and their ``submitted`` events)
  as one statement with one binary array parameter per column — one round trip and one
  implicit transaction per batch.

The SQL is compiled once from the same SQLAlchemy statements and column lists the
synchronous path uses (``service.db.repositories``), so both paths read and write the same
columns; statements are prepared on first use (``prepare_threshold=0``).

Connections are checked only when they come back from a long idle spell (``ping_idle_s``):
under load that is never, after a quiet period one ping. A read that fails on a broken
connection is retried once on a new one; a write is not (its outcome is unknown: the
request fails and an ``Idempotency-Key`` makes the client's retry safe).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, NamedTuple

import psycopg
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import make_url

from orchestrator.states import JobState
from service.db import repositories as repo
from service.db.models import Event, Job, UTCDateTime

log = logging.getLogger(__name__)

_DIALECT = postgresql.psycopg.dialect()  # type: ignore[attr-defined]


def _sql(stmt: sa.ClauseElement, column_keys: Sequence[str] | None = None) -> str:
    """PostgreSQL text of a Core statement with ``%(name)s`` placeholders (psycopg's)."""
    compiled = stmt.compile(dialect=_DIALECT, column_keys=list(column_keys or ()) or None)
    return str(compiled)


def libpq_conninfo(url: str) -> str:
    """The libpq URI of a SQLAlchemy ``postgresql+psycopg://`` URL (same host, user,
    password, database and query options)."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def _utc(value: Any) -> Any:
    return value.astimezone(UTC) if isinstance(value, datetime) else value


def _row_type(name: str, columns: Sequence[str]) -> type[Any]:
    return NamedTuple(name, [(c, Any) for c in columns])  # type: ignore[misc]


_JOB_COLUMNS = tuple(c.name for c in repo.JOB_PUBLIC_COLUMNS)
JobRow = _row_type("JobRow", _JOB_COLUMNS)
"""A job as ``repositories.get_job_row`` returns it (state as ``JobState``, UTC datetimes,
JSON documents as text)."""
_HELD_COLUMNS = tuple(c.name for c in repo.ALLOCATION_COLUMNS)
HeldRow = _row_type("HeldRow", _HELD_COLUMNS)

_STATE_AT = _JOB_COLUMNS.index("state")
_JOB_DATETIMES = tuple(
    i for i, c in enumerate(repo.JOB_PUBLIC_COLUMNS) if isinstance(c.type, UTCDateTime))
_HELD_DATETIMES = tuple(
    i for i, c in enumerate(repo.ALLOCATION_COLUMNS) if isinstance(c.type, UTCDateTime))

_SELECT_JOB = _sql(repo.SELECT_JOB_ROW)
_SELECT_HELD = _sql(repo.SELECT_HELD)
_SELECT_TOKEN = _sql(repo.ACTIVE_TOKEN)


def _unnest_insert_sql() -> str:
    """One statement that inserts a whole batch: the job rows and their events, each
    column sent as one binary array parameter (no per-row statements, no text escaping of
    the JSON documents) and unnested server-side. Autocommit makes it one transaction."""
    def arrays(table: sa.Table, keys: Sequence[str], prefix: str) -> str:
        types = {c.name: c.type.compile(dialect=_DIALECT) for c in table.columns}
        return ", ".join(f"%({prefix}{k})b::{types[k]}[]" for k in keys)

    jobs: sa.Table = Job.__table__  # type: ignore[assignment]
    events: sa.Table = Event.__table__  # type: ignore[assignment]
    return (
        f"WITH new_jobs AS (INSERT INTO {jobs.name} ({', '.join(repo.JOB_INSERT_KEYS)}) "
        f"SELECT * FROM unnest({arrays(jobs, repo.JOB_INSERT_KEYS, 'j_')})) "
        f"INSERT INTO {events.name} ({', '.join(repo.EVENT_INSERT_KEYS)}) "
        f"SELECT * FROM unnest({arrays(events, repo.EVENT_INSERT_KEYS, 'e_')})"
    )


_INSERT_BATCH = _unnest_insert_sql()


def _job_row(values: Sequence[Any]) -> Any:
    out = list(values)
    out[_STATE_AT] = JobState(out[_STATE_AT])
    for i in _JOB_DATETIMES:
        out[i] = _utc(out[i])
    return JobRow._make(out)


def _held_row(values: Sequence[Any]) -> Any:
    out = list(values)
    for i in _HELD_DATETIMES:
        out[i] = _utc(out[i])
    return HeldRow._make(out)


def _bind(row: Mapping[str, Any]) -> dict[str, Any]:
    """A row of ``repositories.insert_jobs`` as psycopg parameters (what SQLAlchemy's
    column types do on the synchronous path: the enum's value, datetimes in UTC)."""
    out = dict(row)
    for k, v in out.items():
        if isinstance(v, JobState):
            out[k] = v.value
        elif isinstance(v, datetime):
            if v.tzinfo is None:
                raise ValueError(f"{k}: naive datetime given to a UTC column")
            out[k] = v.astimezone(UTC)
    return out


class AsyncPg:
    """Up to ``size`` async connections of this process's event loop (see module doc)."""

    def __init__(self, url: str, *, size: int = 8, ping_idle_s: float = 10.0) -> None:
        self._conninfo = libpq_conninfo(url)
        self._size = max(1, size)
        self._ping_idle_s = ping_idle_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._idle: list[tuple[psycopg.AsyncConnection[Any], float]] = []
        self._waiters: list[asyncio.Future[None]] = []
        self._open = 0

    # -- connections -------------------------------------------------------------------------
    def _bind_loop(self) -> None:
        loop = asyncio.get_running_loop()
        if loop is self._loop:
            return
        # A new event loop (tests run one per client): the old connections belong to the
        # old loop's callbacks; drop them without awaiting.
        for conn, _ in self._idle:
            conn.pgconn.finish()
        self._idle.clear()
        self._waiters.clear()
        self._open = 0
        self._loop = loop

    async def _connect(self) -> psycopg.AsyncConnection[Any]:
        return await psycopg.AsyncConnection.connect(
            self._conninfo, autocommit=True, prepare_threshold=0)

    async def _acquire(self) -> psycopg.AsyncConnection[Any]:
        self._bind_loop()
        while True:
            if self._idle:
                conn, since = self._idle.pop()
                if conn.closed or conn.broken:
                    self._open -= 1
                    continue
                if time.monotonic() - since > self._ping_idle_s:
                    try:
                        await conn.execute("")
                    except psycopg.Error:
                        self._open -= 1
                        await conn.close()
                        continue
                return conn
            if self._open < self._size:
                self._open += 1
                try:
                    return await self._connect()
                except BaseException:
                    self._open -= 1
                    raise
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            finally:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)

    def _release(self, conn: psycopg.AsyncConnection[Any]) -> None:
        if asyncio.get_running_loop() is not self._loop:
            conn.pgconn.finish()
            return
        if conn.closed or conn.broken or conn.info.transaction_status != (
                psycopg.pq.TransactionStatus.IDLE):
            self._open -= 1
            if not conn.closed:
                conn.pgconn.finish()
        else:
            self._idle.append((conn, time.monotonic()))
        while self._waiters:
            waiter = self._waiters.pop(0)
            if not waiter.done():
                waiter.set_result(None)
                break

    async def open(self, count: int) -> None:
        """Open ``count`` connections now (at most the pool's size), so the first burst of
        requests does not wait for PostgreSQL to start a backend per connection."""
        self._bind_loop()
        count = max(0, min(count, self._size - self._open))
        self._open += count
        results = await asyncio.gather(*(self._connect() for _ in range(count)),
                                       return_exceptions=True)
        for conn in results:
            if isinstance(conn, BaseException):
                self._open -= 1
                log.warning("PostgreSQL connection not opened at startup: %s", conn)
            else:
                self._idle.append((conn, time.monotonic()))

    async def close(self) -> None:
        """Close the idle connections (the app's shutdown)."""
        idle, self._idle = self._idle, []
        for conn, _ in idle:
            if asyncio.get_running_loop() is self._loop:
                await conn.close()
            else:
                conn.pgconn.finish()
        self._open = 0

    # -- the hot paths -----------------------------------------------------------------------
    async def read_token(self, token_hash: str, now: datetime) -> tuple[Any, ...] | None:
        """(id, owner, is_admin) of the live token with this hash at ``now``, else None
        (``repositories.ACTIVE_TOKEN``: one round trip, on every authenticated request)."""
        for attempt in (1, 2):
            conn = await self._acquire()
            try:
                cur = await conn.execute(_SELECT_TOKEN, {"token_hash": token_hash, "now": now})
                return await cur.fetchone()
            except psycopg.OperationalError:
                if attempt == 2 or not conn.broken:
                    raise
                log.info("PostgreSQL connection lost; reading the token again")
            finally:
                self._release(conn)
        raise AssertionError("unreachable")

    async def read_job(self, job_id: str) -> tuple[Any | None, list[Any]]:
        """The job's row (``JobRow``) and the allocations it holds; (None, []) if none."""
        for attempt in (1, 2):
            conn = await self._acquire()
            try:
                cur = await conn.execute(_SELECT_JOB, {"job_id": job_id})
                found = await cur.fetchone()
                if found is None:
                    return None, []
                row = _job_row(found)
                if not row.state.holds_gpus:
                    return row, []
                cur = await conn.execute(_SELECT_HELD, {"job_id": job_id})
                return row, [_held_row(r) for r in await cur.fetchall()]
            except psycopg.OperationalError:
                if attempt == 2 or not conn.broken:
                    raise
                log.info("PostgreSQL connection lost; reading job %s again", job_id)
            finally:
                self._release(conn)
        raise AssertionError("unreachable")

    async def insert_jobs(self, jobs: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """``repositories.insert_jobs`` as one statement (``_INSERT_BATCH``): one round trip,
        all or nothing."""
        rows, events = repo.job_insert_rows(jobs)
        bound_rows = [_bind(r) for r in rows]
        bound_events = [_bind(e) for e in events]
        params = {f"j_{k}": [r[k] for r in bound_rows] for k in repo.JOB_INSERT_KEYS}
        params.update({f"e_{k}": [e[k] for e in bound_events] for k in repo.EVENT_INSERT_KEYS})
        conn = await self._acquire()
        try:
            await conn.execute(_INSERT_BATCH, params)
        finally:
            self._release(conn)
        return rows


class AsyncJobWriter:
    """Group commit on the event loop: ``JobWriter``'s interface over ``AsyncPg``.

    Submissions queued while a batch is being written form the next batch (one transaction,
    one round trip). A request is answered only after its batch committed; if a batch fails
    on a constraint (a taken idempotency key) its submissions are written one per
    transaction so only the offending one gets the error.
    """

    def __init__(self, pg: AsyncPg, max_batch: int = 256) -> None:
        self._pg = pg
        self._max_batch = max_batch
        self._pending: list[tuple[dict[str, Any], asyncio.Future[dict[str, Any]]]] = []
        self._flushing = False
        self.batches = 0
        self.written = 0

    async def insert_job(self, **job: Any) -> dict[str, Any]:
        """``repositories.insert_job``'s arguments (no ``conn``); the row once committed."""
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending.append((job, fut))
        if not self._flushing:
            self._flushing = True
            asyncio.get_running_loop().create_task(self._flush())
        return await fut

    async def _flush(self) -> None:
        try:
            while self._pending:
                batch = self._pending[:self._max_batch]
                del self._pending[:self._max_batch]
                await self._write(batch)
        finally:
            self._flushing = False

    async def _write(self, batch: list[tuple[dict[str, Any], asyncio.Future[Any]]]) -> None:
        try:
            rows = await self._pg.insert_jobs([job for job, _ in batch])
            self.batches += 1
            self.written += len(rows)
            outcomes: list[tuple[Any, BaseException | None]] = [(r, None) for r in rows]
        except psycopg.IntegrityError as exc:
            if len(batch) == 1:
                outcomes = [(None, _as_integrity_error(exc))]
            else:
                outcomes = [await self._write_one(job) for job, _ in batch]
        except Exception as exc:
            log.exception("writing %d submissions failed", len(batch))
            outcomes = [(None, exc)] * len(batch)
        for (_, fut), (row, exc) in zip(batch, outcomes, strict=True):
            if fut.done():  # the request went away
                continue
            if exc is not None:
                fut.set_exception(exc)
            else:
                fut.set_result(row)

    async def _write_one(self, job: dict[str, Any]) -> tuple[Any, BaseException | None]:
        try:
            row = (await self._pg.insert_jobs([job]))[0]
            self.batches += 1
            self.written += 1
            return row, None
        except psycopg.IntegrityError as exc:
            return None, _as_integrity_error(exc)
        except Exception as exc:
            return None, exc

    def close(self) -> None:
        """Nothing to stop: batches run as tasks of the requests' event loop."""


def _as_integrity_error(exc: psycopg.IntegrityError) -> sa.exc.IntegrityError:
    """The driver's constraint error as SQLAlchemy's, which the routes handle."""
    return sa.exc.IntegrityError("INSERT INTO jobs", None, exc)
