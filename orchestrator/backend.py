"""The narrow port between the controller and whatever runs the training: ``Backend``.

Two implementations share it: ``orchestrator.backends.sim.SimBackend`` (virtual clock,
progress from predicted step times) and the Ray backend (real workers). The controller only
issues commands (start / stop / resize / cancel) and reacts to the ``BackendEvent`` values a
backend reports through the sink it was connected to. Time comes from a ``Clock``: virtual in
simulation, wall time in production, never ``time.time()`` inside the control logic.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from scheduler.cluster import Allocation
from scheduler.job import JobView

# -- clocks ----------------------------------------------------------------------------------


@runtime_checkable
class Clock(Protocol):
    """Seconds on the controller's time line."""

    def now(self) -> float: ...


class WallClock:
    """Production time: seconds since the epoch (what a database timestamp means)."""

    def now(self) -> float:
        return time.time()


class VirtualClock:
    """Simulated time that only moves when told; it never goes backwards."""

    def __init__(self, start: float = 0.0) -> None:
        self._t = float(start)

    def now(self) -> float:
        return self._t

    def advance_to(self, t: float) -> None:
        if t < self._t:
            raise ValueError(f"virtual clock cannot go back from {self._t} to {t}")
        self._t = float(t)


# -- events a backend reports ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Started:
    """The job's workers run its first step on the allocation it was started/resized on."""

    job_id: str
    time: float


@dataclass(frozen=True, slots=True)
class Progress:
    """Periodic progress of a running job."""

    job_id: str
    time: float
    steps_done: float
    loss: float | None = None
    samples_per_s: float | None = None
    peak_tensors_bytes: int | None = None  # measured per-rank peak (max over the ranks seen)
    peak_reserved_bytes: int | None = None  # CUDA's allocator reserve; None on the CPU


@dataclass(frozen=True, slots=True)
class Finished:
    """All steps done; the backend has already freed the workers."""

    job_id: str
    time: float


@dataclass(frozen=True, slots=True)
class Failed:
    """The job cannot continue (crash, OOM, bad spec); it will not be retried."""

    job_id: str
    time: float
    reason: str


@dataclass(frozen=True, slots=True)
class Preempted:
    """The backend lost the job's workers (node gone, spot reclaim); the job resumes from
    ``steps_done`` (its last checkpoint) when placed again."""

    job_id: str
    time: float
    steps_done: float
    reason: str


@dataclass(frozen=True, slots=True)
class OutOfMemory:
    """A rank ran out of memory: ``held_bytes`` of tensors (a lower bound of what the plan
    needs; on CUDA, ``cuda``, with the cuBLAS workspaces) against a capacity of
    ``cap_bytes``; the workers are gone and the job can resume from ``steps_done`` (its
    last checkpoint) on a plan with room for what was measured."""

    job_id: str
    time: float
    steps_done: float
    held_bytes: int
    cap_bytes: int
    reason: str
    cuda: bool = False


BackendEvent = Started | Progress | Finished | Failed | Preempted | OutOfMemory
EventSink = Callable[[BackendEvent], None]


@runtime_checkable
class Backend(Protocol):
    """Runs jobs on allocations the controller chose, and reports what happens.

    Commands return promptly; what follows (workers up, steps made, job done) arrives later
    as events through the sink given to ``connect``. ``stop`` and ``resize`` checkpoint the
    job and return the steps that checkpoint holds, which is where it resumes.
    """

    def connect(self, sink: EventSink) -> None:
        """Where to report events (the controller's ``on_event``)."""
        ...

    def start(self, job: JobView, allocation: Allocation) -> None:
        """Launch ``job`` on ``allocation``, resuming from ``job.steps_done``."""
        ...

    def stop(self, job_id: str, reason: str) -> float:
        """Checkpoint and stop the job; return the steps done at the checkpoint."""
        ...

    def resize(self, job: JobView, allocation: Allocation) -> float:
        """Checkpoint, stop, and relaunch on ``allocation``; return the checkpointed steps.
        A ``Started`` event follows when the job runs again."""
        ...

    def cancel(self, job_id: str) -> None:
        """Kill the job without a checkpoint (user cancellation)."""
        ...

    def steps_done(self, job_id: str) -> float:
        """Latest known progress of a running job (policies see it in ``JobView``)."""
        ...
