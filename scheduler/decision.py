"""What a policy returns: start, stop, resize or reject a job, each with the reason why.

A reason has two parts: ``Decision.reason``, the sentence a person reads (stored with the
job's events, shown by the API and the dashboard), and ``Decision.code``, a ``ReasonCode``
that code can act on without parsing that sentence (Kueue's typed reasons)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from scheduler.cluster import Allocation


class DecisionKind(StrEnum):
    START = "start"  # place a pending job on ``allocation``
    STOP = "stop"  # preempt a running job back to the queue (checkpoint first)
    RESIZE = "resize"  # move a running job to ``allocation`` (checkpoint-restart)
    REJECT = "reject"  # refuse a pending job (admission control): it ends, never runs


class ReasonCode(StrEnum):
    """Why a policy took a decision, in one word."""

    PLACE = "place"  # start: the policy's order placed a queued job on free GPUs
    ADMIT = "admit"  # start: a deadline job runs on its booking (admitted now or before)
    FILL = "fill"  # start: leftover GPUs nobody is promised (best-effort or ahead of a booking)
    GROW = "grow"  # resize: more GPUs of the job's type
    SHRINK = "shrink"  # resize: fewer GPUs of the job's type (others need them)
    MOVE = "move"  # resize: another GPU type, or another layout of as many GPUs
    PREEMPT = "preempt"  # stop: its GPUs go to other jobs
    PAUSE = "pause"  # stop: its booking resumes it later, after jobs due sooner
    NO_FIT = "no_fit"  # stop: what it was given cannot be placed (fragmented GPUs)
    REJECT = "reject"  # reject: its deadline cannot be met beside what is promised
    TOO_COSTLY = "too_costly"  # reject: its booking would turn away too many expected arrivals


@dataclass(frozen=True, slots=True)
class Decision:
    """One action on one job. ``code`` (None where the policy gives none) is left out of
    equality, so two decisions with the same action and text compare equal as before."""

    kind: DecisionKind
    job_id: str
    allocation: Allocation | None
    reason: str
    code: ReasonCode | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.kind in (DecisionKind.START, DecisionKind.RESIZE) and self.allocation is None:
            raise ValueError(f"{self.kind.value} decision for {self.job_id} needs an allocation")
        if self.kind is DecisionKind.REJECT and self.allocation is not None:
            raise ValueError(f"reject decision for {self.job_id} cannot carry an allocation")
        if self.allocation is not None and self.allocation.job_id != self.job_id:
            raise ValueError("decision and allocation name different jobs")


def start(alloc: Allocation, reason: str, code: ReasonCode | None = None) -> Decision:
    return Decision(DecisionKind.START, alloc.job_id, alloc, reason, code)


def stop(job_id: str, reason: str, code: ReasonCode | None = None) -> Decision:
    return Decision(DecisionKind.STOP, job_id, None, reason, code)


def resize(alloc: Allocation, reason: str, code: ReasonCode | None = None) -> Decision:
    return Decision(DecisionKind.RESIZE, alloc.job_id, alloc, reason, code)


def reject(job_id: str, reason: str, code: ReasonCode = ReasonCode.REJECT) -> Decision:
    """Refuse a pending job for good (e.g. its deadline cannot be met); the controller ends it
    as CANCELLED with ``reason``."""
    return Decision(DecisionKind.REJECT, job_id, None, reason, code)


def resize_code(before: Allocation, after: Allocation) -> ReasonCode:
    """The code of a resize from ``before`` to ``after``: more GPUs of the same type is a
    grow, fewer a shrink, anything else (another type, another layout) a move."""
    if after.plan.gpu_type == before.plan.gpu_type and after.num_gpus != before.num_gpus:
        return ReasonCode.GROW if after.num_gpus > before.num_gpus else ReasonCode.SHRINK
    return ReasonCode.MOVE
