"""Deadline feasibility at submission: a ``deadline_s`` no plan can meet is refused.

The earliest feasible completion is the fastest stored plan's predicted job time
(``Plan.job_time_s``: steps × predicted step time) on the cluster's GPU types, counted from
submission as if the job started at once; queueing can only add to it. So a deadline below
it cannot be met by any plan the scheduler may choose, and the submission gets a 422 naming
``deadline_s`` with that time and the plan — unless the body says ``best_effort: true``,
in which case the job is queued and its state reason and ``submitted`` event say it is
best-effort, with the predicted completion.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from service.api.errors import ApiError


@dataclass(frozen=True, slots=True)
class Feasibility:
    """The fastest plan of a job and whether it meets the deadline."""

    deadline_s: float
    earliest_s: float
    """predicted completion of the fastest plan, seconds after submission"""
    plan: Any
    """the fastest plan (a ``predictor.plan.Plan``)"""
    rank: int
    """its rank in the job's ranked list (1: the first)"""

    @property
    def meets(self) -> bool:
        return self.earliest_s <= self.deadline_s

    def plan_text(self) -> str:
        p = self.plan
        par = p.parallel
        return (f"plan #{self.rank}: {p.num_gpus}×{p.gpu_type} tp={par.tp} pp={par.pp} "
                f"dp={par.dp}")

    def best_effort_note(self) -> str:
        """The state reason / event text of an accepted best-effort job."""
        return (f"queued best-effort: deadline {_dur(self.deadline_s)} cannot be met; "
                f"predicted completion ≥ {_dur(self.earliest_s)} after submission "
                f"({self.plan_text()}, if started at once)")


def _dur(seconds: float) -> str:
    """``5400 s (1.50 h)``: the seconds a client compares, and a readable form."""
    if seconds >= 3600:
        return f"{seconds:.0f} s ({seconds / 3600:.2f} h)"
    if seconds >= 60:
        return f"{seconds:.0f} s ({seconds / 60:.1f} min)"
    return f"{seconds:.1f} s"


def feasibility(plans: Sequence[Any], deadline_s: float) -> Feasibility:
    """The fastest of ``plans`` (least predicted job time; ties: the better ranked)."""
    i = min(range(len(plans)), key=lambda k: (plans[k].job_time_s, k))
    return Feasibility(deadline_s=deadline_s, earliest_s=float(plans[i].job_time_s),
                       plan=plans[i], rank=i + 1)


def check_deadline(plans: Sequence[Any], deadline_s: float | None, *, best_effort: bool,
                   gpu_types: Sequence[str]) -> str | None:
    """None when there is no deadline or a plan meets it; the best-effort note when none
    does and ``best_effort``; otherwise ``ApiError`` 422 naming ``deadline_s`` with the
    earliest feasible completion and the plan that gives it."""
    if deadline_s is None or not plans:
        return None
    f = feasibility(plans, deadline_s)
    if f.meets:
        return None
    if best_effort:
        return f.best_effort_note()
    on = f" on this cluster's GPU types ({', '.join(gpu_types)})" if gpu_types else ""
    raise ApiError(
        422, "deadline_s",
        f"no plan can finish within {_dur(deadline_s)}: the earliest feasible completion is "
        f"{_dur(f.earliest_s)} after submission ({f.plan_text()}, the fastest of "
        f"{len(plans)} ranked plans{on}, if started at once); give deadline_s >= "
        f"{math.ceil(f.earliest_s)}, or best_effort: true to queue it anyway",
    )
