"""The job state machine, in one place.

Every job the controller knows is in exactly one ``JobState``. Moves between states go
through ``transition``, which checks them against ``TRANSITIONS`` and returns the
``JobEvent`` that records the move (what a database stores and a dashboard shows). An
illegal move raises ``IllegalTransition``: a controller bug must surface, not corrupt state.

::

    PENDING ─► PLACED ─► STARTING ─► RUNNING ─► SUCCEEDED
       ▲          │          │        │   ▲
       └──────────┴──────────┴────────┤   │ (checkpoint-restart)
            (stopped / preempted)     ▼   │
                                   RESIZING
    any non-terminal state ─► FAILED | CANCELLED
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from scheduler.cluster import Allocation


class JobState(StrEnum):
    PENDING = "pending"  # queued, holds no GPUs
    PLACED = "placed"  # GPUs granted by the policy, launch not yet requested
    STARTING = "starting"  # backend is launching workers / restoring a checkpoint
    RUNNING = "running"  # training steps are being made
    RESIZING = "resizing"  # checkpoint-restart onto a new allocation
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL

    @property
    def holds_gpus(self) -> bool:
        """Does a job in this state own an allocation?"""
        return self in HOLDING


TERMINAL = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})
HOLDING = frozenset({JobState.PLACED, JobState.STARTING, JobState.RUNNING, JobState.RESIZING})

_END = frozenset({JobState.FAILED, JobState.CANCELLED})

TRANSITIONS: Mapping[JobState, frozenset[JobState]] = {
    JobState.PENDING: frozenset({JobState.PLACED}) | _END,
    JobState.PLACED: frozenset({JobState.STARTING, JobState.PENDING}) | _END,
    JobState.STARTING: frozenset({JobState.RUNNING, JobState.PENDING}) | _END,
    JobState.RUNNING: frozenset({JobState.RESIZING, JobState.PENDING, JobState.SUCCEEDED}) | _END,
    JobState.RESIZING: frozenset({JobState.RUNNING, JobState.PENDING}) | _END,
    JobState.SUCCEEDED: frozenset(),
    JobState.FAILED: frozenset(),
    JobState.CANCELLED: frozenset(),
}
"""Allowed moves: ``TRANSITIONS[src]`` is the set of states ``src`` may go to."""


class IllegalTransition(ValueError):
    """A move the state machine does not allow (e.g. SUCCEEDED → RUNNING)."""


@dataclass(frozen=True, slots=True)
class JobEvent:
    """One state change of one job: what the controller's listeners (metrics, the DB) see.

    ``allocation`` is the allocation the job holds *after* the move (None when it holds no
    GPUs); ``data`` carries event-specific facts (steps done, the backend's failure reason).
    """

    job_id: str
    time: float
    from_state: JobState | None  # None: the job's first event (submission)
    to_state: JobState
    reason: str
    allocation: Allocation | None = None
    data: Mapping[str, Any] = field(default_factory=dict)


def check_transition(src: JobState, dst: JobState) -> None:
    """Raise ``IllegalTransition`` unless ``src → dst`` is allowed."""
    if dst not in TRANSITIONS[src]:
        allowed = ", ".join(sorted(s.value for s in TRANSITIONS[src])) or "nothing (terminal)"
        raise IllegalTransition(f"{src.value} → {dst.value} is not allowed; from {src.value}: "
                                f"{allowed}")


def transition(
    job_id: str,
    time: float,
    src: JobState,
    dst: JobState,
    reason: str,
    *,
    allocation: Allocation | None = None,
    data: Mapping[str, Any] | None = None,
) -> JobEvent:
    """Validate ``src → dst`` for ``job_id`` and return the event recording it."""
    try:
        check_transition(src, dst)
    except IllegalTransition as e:
        raise IllegalTransition(f"job {job_id}: {e}") from None
    return JobEvent(job_id, time, src, dst, reason, allocation, dict(data or {}))


def submitted(job_id: str, time: float, reason: str = "submitted") -> JobEvent:
    """The first event of a job: it enters the queue as PENDING."""
    return JobEvent(job_id, time, None, JobState.PENDING, reason)
