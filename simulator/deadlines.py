"""Deadlines for workloads that have none, generated as ElasticFlow does, and deadline metrics.

ElasticFlow (ASPLOS'23 §6) and vTrain (§VI-B) give each job the deadline
``submit + λ · duration`` with ``λ ~ U[0.5, 1.5]``. *duration* here is the job's predicted run
time on its user-requested allocation: the trace's GPU count (``requested_gpus``) on the GPU
type on which that count runs fastest (the plan the opportunistic baseline would start it
with), plus the launch delay: the time the user would expect from the GPUs they asked for.
λ is drawn from a ``random.Random(seed)`` in job order, so a (workload, seed) pair always
gives the same deadlines. λ < 1 makes a deadline that the requested allocation alone cannot meet.

``deadline_metrics`` reads a finished replay: the deadline ratio counts a job as met only when
it succeeded by its deadline (a rejected job is a miss), over the jobs that had a deadline.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from orchestrator.controller import JobRecord
from orchestrator.states import JobState
from scheduler.job import JobView
from scheduler.policies.common import PlanIndex
from scheduler.policies.opportunistic import requested_plans

LAMBDA_RANGE = (0.5, 1.5)


LAUNCH_S = 10.0
"""Launch delay counted in a job's duration (the simulator's default launch delay)."""


def requested_duration(job: JobView, launch_s: float = LAUNCH_S) -> float | None:
    """Predicted seconds for ``job`` on its requested GPU count, fastest GPU type, launch
    included (``None`` when no plan runs that count)."""
    cands = requested_plans(job, PlanIndex.build(job.plans))
    if not cands:
        return None
    return launch_s + cands[0].step_time_s * job.total_steps


def with_deadlines(jobs: Sequence[JobView], *, seed: int = 0,
                   lam: tuple[float, float] = LAMBDA_RANGE) -> list[JobView]:
    """``jobs`` with ``deadline = submit + λ·duration`` (λ ~ U[lam], seeded, in job order).
    A job with no plan for its request keeps no deadline (best-effort)."""
    rng = random.Random(seed)
    out = []
    for j in jobs:
        x = rng.uniform(*lam)  # drawn for every job, so one job's plans do not shift the rest
        dur = requested_duration(j)
        out.append(replace(j, deadline=None if dur is None else j.submit_time + x * dur))
    return out


@dataclass(frozen=True, slots=True)
class DeadlineMetrics:
    """Deadline outcome of one replay."""

    deadline_jobs: int
    met: int
    rejected: int
    resizes: int  # resize decisions plus stop/restart moves of running jobs

    @property
    def deadline_ratio(self) -> float:
        return self.met / self.deadline_jobs if self.deadline_jobs else float("nan")


def deadline_metrics(records: Iterable[JobRecord]) -> DeadlineMetrics:
    """Count the jobs with deadlines, those that met them, those rejected (ended CANCELLED
    before running), and the restarts of running jobs (resizes and preemptions), over the
    final records of a replay (``ReplayResult.records``)."""
    n = met = rejected = restarts = 0
    for rec in records:
        restarts += rec.view.restarts
        d = rec.view.deadline
        if d is None:
            continue
        n += 1
        if rec.state is JobState.SUCCEEDED and rec.end_time is not None and \
                rec.end_time <= d + 1e-6:
            met += 1
        elif rec.state is JobState.CANCELLED and rec.first_start is None:
            rejected += 1
    return DeadlineMetrics(n, met, rejected, restarts)
