"""The online memory residual as the API plans with it: ``predictor.residual`` fed from the
measured peaks stored on recent jobs (``jobs.memory``), reread at most every ``ttl_s``.

Reading the database (not listening to the loop) lets the API and the control loop run in
different processes; the cost is one indexed query per ``ttl_s`` on the submission path.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from predictor.residual import MemoryResidual
from service.db.models import Job
from service.job_memory import residual_sample

log = logging.getLogger(__name__)

RECENT_JOBS = 500
"""Jobs read per refresh: the most recently placed ones with a measurement."""


def load_residual(session: Session, limit: int = RECENT_JOBS) -> MemoryResidual:
    """A residual of the measurements on the ``limit`` most recently placed jobs (fed oldest
    first, so each kind's window keeps the latest runs)."""
    rows = session.scalars(
        sa.select(Job.memory)
        .where(Job.placed_at.is_not(None), Job.memory.is_not(None))
        .order_by(Job.placed_at.desc()).limit(limit)
    ).all()
    residual = MemoryResidual()
    for doc in reversed(rows):
        sample = residual_sample(doc)
        if sample is not None:
            residual.observe(*sample)
    return residual


class ResidualCache:
    """``factors`` for the planner from a residual reread every ``ttl_s`` seconds."""

    def __init__(self, session_factory: sessionmaker[Session], ttl_s: float = 30.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._factory = session_factory
        self._ttl_s = ttl_s
        self._clock = clock
        self._lock = threading.Lock()
        self._residual = MemoryResidual()
        self._read_at: float | None = None
        self.version = 0
        """Changes when a reread changes the corrections (part of the plan caches' keys)."""

    def factors(self, runtime: str, family: str,
                gpu_types: Sequence[str]) -> dict[str, tuple[float, str]]:
        """The corrections of ``runtime`` / ``family`` jobs on ``gpu_types`` (see
        ``predictor.residual``); empty while nothing of that kind was under-predicted."""
        self.refresh()
        with self._lock:
            return self._residual.factors(runtime, family, tuple(gpu_types))

    def due(self) -> bool:
        """Whether the next ``refresh`` rereads the database (no I/O here: callers on an
        event loop ask this and leave the reread to a worker thread)."""
        with self._lock:
            return self._read_at is None or self._clock() - self._read_at >= self._ttl_s

    def refresh(self) -> int:
        """Reread the measurements when ``ttl_s`` has passed; the current ``version``."""
        now = self._clock()
        with self._lock:
            stale = self._read_at is None or now - self._read_at >= self._ttl_s
            if stale:
                self._read_at = now  # one reader; the others use the current residual
        if stale:
            try:
                with self._factory() as session:
                    fresh = load_residual(session)
                with self._lock:
                    if fresh.snapshot() != self._residual.snapshot():
                        self._residual = fresh
                        self.version += 1
            except Exception:  # planning goes on with the residual it has
                log.exception("reading the measured memory of recent jobs failed")
        return self.version
