"""Group commit for submissions: one writer thread per process and database.

A submission used to be its own transaction on a request thread. Under load those threads
queued on the database's one writer (SQLite) or on commits (PostgreSQL), and each waiter,
once its turn came, still had to win the GIL back from the others before it could run its
few statements, so the writer lock was held mostly by threads waiting to be scheduled.
``JobWriter`` has the request hand its rows to one thread that writes every submission
queued at that moment in one short transaction (two ``executemany`` INSERTs) and then
answers each request's future on its event loop. Nothing is acknowledged before its
transaction committed, so an accepted job is always in the database.

If a batch fails on a constraint (a taken idempotency key), its submissions are written
again one per transaction so only the offending one gets the error.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
from typing import Any

import sqlalchemy as sa

from service.db import repositories as repo
from service.db.engine import write_connection

log = logging.getLogger(__name__)

_STOP = object()


def _resolve(fut: asyncio.Future[Any], result: Any, exc: BaseException | None) -> None:
    if fut.done():  # the request went away (client disconnected)
        return
    if exc is not None:
        fut.set_exception(exc)
    else:
        fut.set_result(result)


class JobWriter:
    """Writes ``repositories.insert_jobs`` batches on its own thread (see module doc)."""

    def __init__(self, engine: sa.Engine, max_batch: int = 256) -> None:
        self._engine = engine
        self._max_batch = max_batch
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._guard = threading.Lock()
        self.batches = 0
        self.written = 0

    async def insert_job(self, **job: Any) -> dict[str, Any]:
        """``repositories.insert_job``'s arguments (no ``conn``); the row once committed."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[dict[str, Any]] = loop.create_future()
        self._ensure_thread()
        self._queue.put((job, loop, fut))
        return await fut

    def close(self) -> None:
        with self._guard:
            thread, self._thread = self._thread, None
        if thread is not None:
            self._queue.put(_STOP)
            thread.join(timeout=10)

    def _ensure_thread(self) -> None:
        if self._thread is not None:
            return
        with self._guard:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="frenzy-job-writer",
                                                daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            batch = [item]
            stop = False
            while len(batch) < self._max_batch:
                try:
                    nxt = self._queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is _STOP:
                    stop = True
                    break
                batch.append(nxt)
            self._write(batch)
            if stop:
                return

    def _write(self, batch: list[Any]) -> None:
        outcomes: list[tuple[Any, BaseException | None]]
        try:
            with write_connection(self._engine) as conn:
                rows = repo.insert_jobs(conn=conn, jobs=[job for job, _, _ in batch])
            outcomes = [(row, None) for row in rows]
            self.batches += 1
            self.written += len(rows)
        except sa.exc.IntegrityError as exc:
            if len(batch) == 1:
                outcomes = [(None, exc)]
            else:
                outcomes = [self._write_one(job) for job, _, _ in batch]
        except Exception as exc:
            log.exception("writing %d submissions failed", len(batch))
            outcomes = [(None, exc)] * len(batch)
        for (_, loop, fut), (row, exc) in zip(batch, outcomes, strict=True):
            with contextlib.suppress(RuntimeError):  # that event loop is closed
                loop.call_soon_threadsafe(_resolve, fut, row, exc)

    def _write_one(self, job: dict[str, Any]) -> tuple[Any, BaseException | None]:
        try:
            with write_connection(self._engine) as conn:
                return repo.insert_jobs(conn=conn, jobs=[job])[0], None
        except Exception as exc:
            return None, exc
