"""The API's per-request reads on SQLite without SQLAlchemy's per-statement machinery.

Every authenticated request reads its token, and every ``GET /v1/jobs/{id}`` reads the
job's row: through an engine connection each costs a pool checkout, ``BEGIN``, the statement
and a ``ROLLBACK`` — Python work per statement, and three releases of the GIL, each of which
waits for the GIL again (up to the 5 ms switch interval) while another thread of the worker
runs Python. ``SqliteReads`` keeps one DBAPI connection (from the engine's pool, so it has
the engine's pragmas; it is in autocommit, so each statement reads its own snapshot; a lock
lets the event loop and any other thread share it: a read takes microseconds, and in WAL
mode no writer blocks it) and runs the same Core statements the synchronous path runs,
compiled once, with the columns' own bind and result processors: the rows are what the
engine would return.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any, NamedTuple

import sqlalchemy as sa
from sqlalchemy.dialects import sqlite

from service.db import repositories as repo

_DIALECT = sqlite.dialect(paramstyle="named")


class Prepared:
    """A Core ``SELECT`` compiled once for SQLite: its SQL text with ``:name``
    placeholders, the bind processors of its parameters and the result processors and
    names of its columns (those of SQLAlchemy's own types, so values convert as the engine
    converts them)."""

    def __init__(self, stmt: sa.Select[Any]) -> None:
        compiled = stmt.compile(dialect=_DIALECT)
        self.sql = str(compiled)
        self._binds: dict[str, Callable[[Any], Any] | None] = {
            name: bind.type.dialect_impl(_DIALECT).bind_processor(_DIALECT)
            for name, bind in compiled.binds.items()}
        columns = list(stmt.selected_columns)
        self._results = [c.type.dialect_impl(_DIALECT).result_processor(_DIALECT, None)
                         for c in columns]
        self.row_type: type[Any] = NamedTuple(  # type: ignore[misc]
            "Row", [(str(c.key), Any) for c in columns])

    def params(self, values: Mapping[str, Any]) -> dict[str, Any]:
        out = {}
        for name, value in values.items():
            process = self._binds[name]
            out[name] = process(value) if process is not None else value
        return out

    def row(self, values: Sequence[Any]) -> Any:
        return self.row_type._make(
            value if process is None else process(value)
            for process, value in zip(self._results, values, strict=True))


_TOKEN = Prepared(repo.ACTIVE_TOKEN)
_JOB = Prepared(repo.SELECT_JOB_ROW)
_HELD = Prepared(repo.SELECT_HELD)


class SqliteReads:
    """``read_token`` and ``read_job`` (the interface of ``service.db.pg_async.AsyncPg``'s
    reads) on one DBAPI connection of ``engine``, checked out on first use."""

    def __init__(self, engine: sa.Engine) -> None:
        if engine.dialect.name != "sqlite":
            raise ValueError(f"SqliteReads needs a SQLite engine, got {engine.dialect.name}")
        self._engine = engine
        self._conn: Any = None
        self._lock = threading.Lock()

    def _all(self, prepared: Prepared, values: Mapping[str, Any]) -> list[Any]:
        params = prepared.params(values)
        with self._lock:
            if self._conn is None:  # autocommit: the engine's connect hook
                self._conn = self._engine.raw_connection()
            found = self._conn.execute(prepared.sql, params).fetchall()
        return [prepared.row(r) for r in found]

    def _first(self, prepared: Prepared, values: Mapping[str, Any]) -> Any | None:
        found = self._all(prepared, values)
        return found[0] if found else None

    def read_token(self, token_hash: str, now: datetime) -> tuple[Any, ...] | None:
        """(id, owner, is_admin) of the live token with this hash at ``now``, else None
        (``repositories.ACTIVE_TOKEN``)."""
        return self._first(_TOKEN, {"token_hash": token_hash, "now": now})

    def read_job(self, job_id: str) -> tuple[Any | None, list[Any]]:
        """The job's row (``repositories.SELECT_JOB_ROW``'s columns) and the allocations it
        holds; (None, []) if there is no such job."""
        row = self._first(_JOB, {"job_id": job_id})
        if row is None or not row.state.holds_gpus:
            return row, []
        return row, self._all(_HELD, {"job_id": job_id})

    def close(self) -> None:
        """Give the connection back to the engine's pool."""
        with self._lock:
            conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()
