"""``EstimatorFeed``: turns the controller's progress events into step-time observations for a
``scheduler.estimator.StepTimeEstimator``.

A ``Controller`` listener. Two points of the same run of a job — its start, its progress
reports, its finish or the stop, resize or preemption that ends the run — give its observed
seconds per step (Δtime / Δsteps); the prediction for that allocation is its plan re-timed for
the placement by the performance model (what the policy was told). A new allocation (start,
resize, restart) starts a new pair; an ended job is forgotten.

``estimating_policy`` builds a policy by name around an estimator, the way both the simulator
and the service do: a policy that takes an estimator gets it, every other one plans on step
times corrected from it (``scheduler.corrected``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from orchestrator.states import JobEvent, JobState
from scheduler.cluster import Allocation, ClusterState
from scheduler.corrected import CorrectedPerfModel, CorrectedPolicy
from scheduler.estimator import StepTimeEstimator
from scheduler.job import JobView
from scheduler.policy import PerfModel, Policy, make_policy, policy_accepts

log = logging.getLogger(__name__)

MIN_STEPS = 1.0
"""Least steps between two reports for an observation (a shorter pair measures little)."""


def estimating_policy(name: str, perf: PerfModel, estimator: StepTimeEstimator | None, *,
                      correct: bool = True, **kwargs: Any) -> Policy:
    """The registered policy ``name`` on ``perf``: given ``estimator`` when it takes one
    (``elastic``), else, with ``correct``, wrapped to plan on corrected step times
    (``CorrectedPolicy``); without an estimator, as it is."""
    if estimator is not None and policy_accepts(name, "estimator"):
        return make_policy(name, perf=perf, estimator=estimator, **kwargs)
    if estimator is not None and correct:
        corrected = CorrectedPerfModel(perf, estimator)
        return CorrectedPolicy(make_policy(name, perf=corrected, **kwargs), corrected)
    return make_policy(name, perf=perf, **kwargs)


class EstimatorFeed:
    """Listener feeding ``estimator``; ``view_of`` returns a job's submitted view (None:
    unknown, the event is skipped), ``topology`` the cluster used to re-time plans.

    Anchors: a job's steps begin to accrue when it enters RUNNING (at the steps it was
    stopped, resized or preempted at: those events carry ``steps_done``); each progress report,
    the finish (all steps done) and the stop, resize or preemption that ends the run (at the
    steps it checkpointed) close a pair with the latest anchor on the same allocation. Short
    jobs, which finish before a second report, and runs cut short before their first report
    (a job shrunk for an arrival minutes after it started) are thus observed too."""

    def __init__(self, estimator: StepTimeEstimator, perf: PerfModel,
                 view_of: Callable[[str], JobView | None],
                 topology: Callable[[], ClusterState]) -> None:
        self.estimator = estimator
        self.perf = perf
        self.view_of = view_of
        self.topology = topology
        self._anchor: dict[str, tuple[Allocation, float, float]] = {}
        self._steps: dict[str, float] = {}

    def __call__(self, ev: JobEvent) -> None:
        job_id = ev.job_id
        if "steps_done" in ev.data:
            self._steps[job_id] = float(ev.data["steps_done"])
        if ev.to_state is JobState.SUCCEEDED:
            view = self.view_of(job_id)
            if view is not None:
                self._pair(job_id, ev.time, float(view.total_steps), None)
        if ev.to_state.terminal:
            self._anchor.pop(job_id, None)
            self._steps.pop(job_id, None)
            self.estimator.forget(job_id)
            return
        if ev.to_state is JobState.RUNNING and ev.allocation is not None:
            if ev.reason == "progress":
                self._pair(job_id, ev.time, self._steps.get(job_id, 0.0), ev.allocation)
            elif ev.from_state is not JobState.RUNNING:  # steps begin to accrue now
                self._anchor[job_id] = (ev.allocation, ev.time, self._steps.get(job_id, 0.0))
            return
        if ev.from_state is JobState.RUNNING and "steps_done" in ev.data:
            # stopped, resized or preempted: the steps it checkpointed at close the run
            self._pair(job_id, ev.time, self._steps[job_id], None)
        self._anchor.pop(job_id, None)  # no pair across a stop, resize or preemption

    def _pair(self, job_id: str, t: float, steps: float, alloc: Allocation | None) -> None:
        """Close a pair from the job's anchor to (``t``, ``steps``) on ``alloc`` (None: the
        anchor's own, for the finish); the end becomes the next anchor."""
        last = self._anchor.get(job_id)
        if alloc is not None and (last is None or last[0] is not alloc):
            self._anchor[job_id] = (alloc, t, steps)
            return
        if last is None:
            return
        d_steps, d_t = steps - last[2], t - last[1]
        if d_steps < MIN_STEPS or d_t <= 0:
            return  # keep the older anchor until enough steps have passed
        self._anchor[job_id] = (last[0], t, steps)
        view = self.view_of(job_id)
        if view is None:
            return
        a = last[0]
        placed = self.perf.placed_plan(view, a.plan, a.placement, self.topology())
        if placed.step_time_s > 0:
            self.estimator.observe(job_id, placed.gpu_type, view.family,
                                   placed.step_time_s, d_t / d_steps)
