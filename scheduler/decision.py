"""What a policy returns: start, stop, resize or reject a job, each with the reason why."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from scheduler.cluster import Allocation


class DecisionKind(StrEnum):
    START = "start"  # place a pending job on ``allocation``
    STOP = "stop"  # preempt a running job back to the queue (checkpoint first)
    RESIZE = "resize"  # move a running job to ``allocation`` (checkpoint-restart)
    REJECT = "reject"  # refuse a pending job (admission control): it ends, never runs


@dataclass(frozen=True, slots=True)
class Decision:
    kind: DecisionKind
    job_id: str
    allocation: Allocation | None
    reason: str

    def __post_init__(self) -> None:
        if self.kind in (DecisionKind.START, DecisionKind.RESIZE) and self.allocation is None:
            raise ValueError(f"{self.kind.value} decision for {self.job_id} needs an allocation")
        if self.kind is DecisionKind.REJECT and self.allocation is not None:
            raise ValueError(f"reject decision for {self.job_id} cannot carry an allocation")
        if self.allocation is not None and self.allocation.job_id != self.job_id:
            raise ValueError("decision and allocation name different jobs")


def start(alloc: Allocation, reason: str) -> Decision:
    return Decision(DecisionKind.START, alloc.job_id, alloc, reason)


def stop(job_id: str, reason: str) -> Decision:
    return Decision(DecisionKind.STOP, job_id, None, reason)


def resize(alloc: Allocation, reason: str) -> Decision:
    return Decision(DecisionKind.RESIZE, alloc.job_id, alloc, reason)


def reject(job_id: str, reason: str) -> Decision:
    """Refuse a pending job for good (e.g. its deadline cannot be met); the controller ends it
    as CANCELLED with ``reason``."""
    return Decision(DecisionKind.REJECT, job_id, None, reason)
