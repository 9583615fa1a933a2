"""A job's output logs as the API serves them.

Each rank's output (an entrypoint's stdout/stderr) is written by the worker to
``<checkpoint_dir>/.logs/<job_id>/rank-<R>.log`` (``orchestrator.sandbox``: service-owned,
``0600``, at most ``LOG_LIMIT_BYTES`` per launch; the previous launch's log is kept as
``rank-<R>.log.1``, so a rank holds at most two launches' worth). This module finds those
files and reads them in chunks from an offset, which is all following a log needs.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from orchestrator.sandbox import LOG_DIR, check_job_id

CHUNK_BYTES = 64 * 1024
POLL_S = 0.5
"""How often a followed log is checked for new output (the target: a line shows within 2 s)."""


def log_path(checkpoint_dir: str | Path, job_id: str, rank: int) -> Path:
    """Where rank ``rank`` of ``job_id`` writes its output (the file may not exist yet)."""
    if rank < 0:
        raise ValueError(f"rank must be >= 0, got {rank}")
    return Path(checkpoint_dir) / LOG_DIR / check_job_id(job_id) / f"rank-{rank}.log"


def read_from(path: Path, offset: int, limit: int = CHUNK_BYTES) -> tuple[bytes, int]:
    """Up to ``limit`` bytes of ``path`` from ``offset`` and the offset after them.

    A missing file reads as empty. A file shorter than ``offset`` was started again (a new
    launch rotated it): reading restarts from its beginning."""
    try:
        with path.open("rb") as f:
            size = f.seek(0, 2)
            if size < offset:
                offset = 0
            f.seek(offset)
            data = f.read(limit)
    except FileNotFoundError:
        return b"", offset
    return data, offset + len(data)


async def follow_log(checkpoint_dir: str | Path, job_id: str, rank: int,
                     finished: Callable[[], bool] | None, poll_s: float = POLL_S,
                     offset: int = 0, max_s: float | None = None,
                     clock: Callable[[], float] = time.monotonic) -> AsyncIterator[bytes]:
    """The log's bytes from ``offset``; with ``finished`` (None: no following), then
    whatever is appended, polled every ``poll_s``, until ``finished()`` is true and the file
    is drained — or, at the latest, ``max_s`` seconds after the start (a client that wants
    more reconnects from the offset it reached: no connection is held for ever). ``finished``
    reads the database: it is run in a thread, off the event loop."""
    path = log_path(checkpoint_dir, job_id, rank)
    until = None if max_s is None else clock() + max_s
    while True:
        data, offset = read_from(path, offset)
        if data:
            yield data
            continue
        if finished is None:
            return
        if until is not None and clock() >= until:
            return
        if await asyncio.to_thread(finished):
            finished = None  # drain what the last moments wrote, then stop
            continue
        await asyncio.sleep(poll_s)
