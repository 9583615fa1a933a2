"""Per-user quotas and per-job run-time limits (``Settings``; 0 turns one off).

At submission:

* ``quota_max_steps``: a job's optimizer steps (given, or derived from its tokens) — 422.
* ``quota_max_job_time_s``: the predicted run time of the job's fastest plan — 422.
* ``quota_max_gpus``: no plan of a job asks for more GPUs (the planner's cap), and the GPUs
  the user's jobs hold now plus the new job's smallest plan must fit — 429 otherwise.
* ``quota_max_queued``: jobs of the user waiting for GPUs (PENDING) at once — 429.
* ``max_runtime_s``: what the job asks for may not exceed ``max_runtime_s_max`` — 422; a job
  that asks for none gets ``max_runtime_s_default`` (or, when that is 0, the maximum). The
  limit is stored with the job.

The quota_max_gpus/queued checks read the user's usage (their held allocations; their PENDING
jobs through the ``(owner, state)`` index), only when they are set; concurrent submissions of
one user are checked against the same usage.

While jobs run, the control loop enforces the rest (``orchestrator.quotas``; the service
hands it the limits with each job, ``service.app_runtime.DbJobSource``):

* ``quota_max_gpus`` at placement: before each scheduling round the queue is walked in order
  and a job whose owner's held GPUs plus what the owner's earlier queued jobs may take leave
  no room for its smallest plan is held back from the policy (its queue reason is
  ``user_gpu_quota``); the jobs let through keep only the plans that fit. After the round, a
  start or a resize that would still take an owner above the quota (a policy growing a
  running job elastically) is dropped. So queued jobs of one user are never placed together
  above the quota.
* the run-time limit: the time a job spends RUNNING is accumulated over launches, restarts
  and resizes and stored with the job (``jobs.running_s``, with each progress report and
  when it stops running, so a restart loses at most one report interval); at the limit the
  job is checkpointed and stopped and ends FAILED, its reason "run-time limit of N s reached
  after M s running; last checkpoint step K".
"""

from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.orm import Session

from orchestrator.states import JobState
from service.api.errors import ApiError
from service.api.planning import Planned
from service.db.models import AllocationRow, Job
from service.settings import Settings


@dataclass(frozen=True, slots=True)
class Usage:
    """What a user holds and has queued right now."""

    held_gpus: int
    queued: int


@dataclass(frozen=True, slots=True)
class Quotas:
    """The limits of ``Settings`` (0: no limit)."""

    max_gpus: int = 0
    max_queued: int = 0
    max_steps: int = 0
    max_job_time_s: float = 0.0
    max_runtime_s_default: float = 0.0
    max_runtime_s_max: float = 0.0

    @classmethod
    def from_settings(cls, settings: Settings) -> Quotas:
        return cls(max_gpus=settings.quota_max_gpus, max_queued=settings.quota_max_queued,
                   max_steps=settings.quota_max_steps,
                   max_job_time_s=settings.quota_max_job_time_s,
                   max_runtime_s_default=settings.max_runtime_s_default,
                   max_runtime_s_max=settings.max_runtime_s_max)

    def runtime_limit(self, requested: float | None) -> float | None:
        """The run-time limit a job runs under: ``requested`` (``ApiError`` 422 above
        ``max_runtime_s_max``), else the default, else the maximum; None: no limit."""
        if requested is not None:
            if self.max_runtime_s_max and requested > self.max_runtime_s_max:
                raise ApiError(422, "max_runtime_s",
                               f"at most {self.max_runtime_s_max:,.0f} s (the operator's "
                               f"max_runtime_s_max), got {requested:,.0f}")
            return float(requested)
        limit = self.max_runtime_s_default or self.max_runtime_s_max
        return float(limit) if limit else None

    @property
    def needs_usage(self) -> bool:
        """Whether checking a submission needs the user's current usage."""
        return bool(self.max_gpus or self.max_queued)

    def check_job(self, planned: Planned, *, steps_field: str) -> None:
        """``ApiError`` 422 if the job alone is over a per-job quota."""
        steps = planned.train.num_steps
        if self.max_steps and steps > self.max_steps:
            raise ApiError(422, steps_field,
                           f"quota_max_steps: at most {self.max_steps:,} steps per job, "
                           f"this job has {steps:,}")
        if self.max_job_time_s and planned.plans:
            fastest = min(float(p.job_time_s) for p in planned.plans)
            if fastest > self.max_job_time_s:
                raise ApiError(422, "training",
                               f"quota_max_job_time_s: at most {self.max_job_time_s:,.0f} s "
                               f"per job, the fastest plan takes {fastest:,.0f} s; "
                               "train fewer steps or tokens")

    def check_usage(self, owner: str, usage: Usage, planned: Planned) -> None:
        """``ApiError`` 429 if the user's usage leaves no room for this job."""
        if self.max_queued and usage.queued >= self.max_queued:
            raise ApiError(429, "quota",
                           f"quota_max_queued: {owner} has {usage.queued} job(s) waiting for "
                           f"GPUs, the most allowed is {self.max_queued}; wait for one to "
                           "start or cancel one")
        if self.max_gpus and planned.plans:
            smallest = min(int(p.num_gpus) for p in planned.plans)
            if usage.held_gpus + smallest > self.max_gpus:
                raise ApiError(429, "quota",
                               f"quota_max_gpus: {owner} holds {usage.held_gpus} GPU(s) and "
                               f"this job needs at least {smallest}; at most "
                               f"{self.max_gpus} may be held at once")


def read_usage(session: Session, owner: str) -> Usage:
    """The user's held GPUs (active allocations of their jobs) and PENDING job count."""
    held = session.scalar(
        sa.select(sa.func.coalesce(sa.func.sum(AllocationRow.gpus), 0))
        .join(Job, Job.id == AllocationRow.job_id)
        .where(AllocationRow.released_at.is_(None), Job.owner == owner)
    )
    queued = session.scalar(
        sa.select(sa.func.count()).select_from(Job)
        .where(Job.owner == owner, Job.state == JobState.PENDING)
    )
    return Usage(held_gpus=int(held or 0), queued=int(queued or 0))
