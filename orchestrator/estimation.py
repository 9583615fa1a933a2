"""``EstimatorFeed``: turns the controller's progress events into step-time observations for a
``scheduler.estimator.StepTimeEstimator``.

A ``Controller`` listener. Two progress reports of the same job on the same allocation give
its observed seconds per step (Δtime / Δsteps); the prediction for that allocation is its
plan re-timed for the placement by the performance model (what the policy was told). A new
allocation (start, resize, restart) starts a new pair; an ended job is forgotten.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from orchestrator.states import JobEvent
from scheduler.cluster import Allocation, ClusterState
from scheduler.estimator import StepTimeEstimator
from scheduler.job import JobView
from scheduler.policy import PerfModel

log = logging.getLogger(__name__)

MIN_STEPS = 1.0
"""Least steps between two reports for an observation (a shorter pair measures little)."""


def family_of(job: JobView) -> str:
    """The model family a job's error is pooled under ("" when the job carries no model)."""
    return str(job.model.family) if job.model is not None else ""


class EstimatorFeed:
    """Listener feeding ``estimator``; ``view_of`` returns a job's submitted view (None:
    unknown, the event is skipped), ``topology`` the cluster used to re-time plans."""

    def __init__(self, estimator: StepTimeEstimator, perf: PerfModel,
                 view_of: Callable[[str], JobView | None],
                 topology: Callable[[], ClusterState]) -> None:
        self.estimator = estimator
        self.perf = perf
        self.view_of = view_of
        self.topology = topology
        self._last: dict[str, tuple[Allocation, float, float]] = {}

    def __call__(self, ev: JobEvent) -> None:
        if ev.to_state.terminal:
            self._last.pop(ev.job_id, None)
            self.estimator.forget(ev.job_id)
            return
        if ev.reason != "progress" or ev.allocation is None:
            if ev.from_state is not None and ev.from_state is not ev.to_state:
                self._last.pop(ev.job_id, None)  # a new run: the next pair starts afresh
            return
        steps = float(ev.data.get("steps_done", 0.0))
        alloc = ev.allocation
        last = self._last.get(ev.job_id)
        self._last[ev.job_id] = (alloc, ev.time, steps)
        if last is None or last[0] is not alloc:
            return
        d_steps, d_t = steps - last[2], ev.time - last[1]
        if d_steps < MIN_STEPS or d_t <= 0:
            if d_steps < MIN_STEPS:
                self._last[ev.job_id] = last  # keep the older anchor until enough steps
            return
        view = self.view_of(ev.job_id)
        if view is None:
            return
        placed = self.perf.placed_plan(view, alloc.plan, alloc.placement, self.topology())
        if not placed.step_time_s > 0:
            return
        self.estimator.observe(ev.job_id, placed.gpu_type, family_of(view),
                               placed.step_time_s, d_t / d_steps)
