"""A policy that plans on corrected step times: the predictor's step times × what an online
estimator has observed (``scheduler.estimator``).

Pollux and Sia re-fit each job's throughput model from the step times it reports, so their
schedulers rank configurations by what jobs really run at, not by an offline prediction.
``CorrectedPolicy`` gives any policy that takes no estimator itself the same input without
changing it: before each ``decide`` every plan it is shown — a waiting job's ranked plans,
a running job's current plan, and every plan its performance model re-times for a placement
(``CorrectedPerfModel``) — is scaled by the estimator's observed / predicted factor for that
job on that GPU type (the job's own once it has run there, else its GPU type × model
family's). The decisions it returns carry the model's own step times again
(``Plan.with_step_factor(1.0)``), so what the controller stores, the backend runs and the
estimator compares against stays the prediction.

Within a GPU type every plan of a job is scaled by the same factor, so the policy's order
among them is the model's; what the correction changes is the comparison across GPU types
and the remaining time of running jobs. Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from predictor.plan import Plan
from scheduler.cluster import Allocation, ClusterState, Placement
from scheduler.decision import Decision
from scheduler.estimator import StepTimeEstimator
from scheduler.job import JobView, RunningJob
from scheduler.policy import PerfModel, Policy


class CorrectedPerfModel:
    """``PerfModel``: ``inner``'s step time for the placement × the estimator's factor for
    the job on the plan's GPU type."""

    def __init__(self, inner: PerfModel, estimator: StepTimeEstimator) -> None:
        self.inner = inner
        self.estimator = estimator

    def factor(self, job: JobView, gpu_type: str) -> float:
        """Observed / predicted step time expected for ``job`` on ``gpu_type``."""
        return self.estimator.factor(job.id, gpu_type, job.family)

    def placed_plan(self, job: JobView, plan: Plan, placement: Placement,
                    state: ClusterState) -> Plan:
        placed = self.inner.placed_plan(job, plan, placement, state)
        return placed.with_step_factor(self.factor(job, placed.gpu_type))


class CorrectedPolicy:
    """``inner`` shown corrected step times (see the module docstring). ``corrected`` must be
    the ``CorrectedPerfModel`` ``inner`` was built with (it re-times plans for placements);
    ``perf`` is the model under it, so whoever borrows this policy's performance model (the
    controller's fallback policy) gets the model's own times. Optional policy attributes
    (``wake_at``, ``holds_until``, ``take_notes``, ``restore``) are ``inner``'s."""

    def __init__(self, inner: Policy, corrected: CorrectedPerfModel) -> None:
        self.inner = inner
        self.corrected = corrected
        self.perf = corrected.inner
        self.name = inner.name
        # job id -> (the job's plans, their factors per GPU type, the scaled plans): a job
        # keeps one scaled tuple while its factors hold, so the policy's per-job caches,
        # which check the tuple's identity, keep working
        self._views: dict[str, tuple[tuple[Plan, ...], tuple[float, ...], tuple[Plan, ...]]] = {}
        # job id -> (its allocation, the factor, the allocation with the scaled plan)
        self._allocs: dict[str, tuple[Allocation, float, Allocation]] = {}

    def __getattr__(self, name: str) -> Any:
        if name in ("inner", "corrected", "perf"):  # not set yet (unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.inner, name)

    def decide(
        self,
        state: ClusterState,
        pending: Sequence[JobView],
        running: Sequence[RunningJob],
        now: float,
    ) -> list[Decision]:
        views = {j.id: self._view(j) for j in pending}
        shown_running = [self._running(r) for r in running]
        shown_pending = [views[j.id] for j in pending]
        live = set(views) | {r.job.id for r in running}
        for cache in (self._views, self._allocs):
            for jid in [k for k in cache if k not in live]:
                del cache[jid]
        return [self._uncorrected(d) for d in
                self.inner.decide(state, shown_pending, shown_running, now)]

    def _view(self, job: JobView) -> JobView:
        if not job.plans:
            return job
        types = sorted({p.gpu_type for p in job.plans})
        factors = tuple(self.corrected.factor(job, t) for t in types)
        got = self._views.get(job.id)
        if got is None or got[0] is not job.plans or got[1] != factors:
            if all(f == 1.0 for f in factors):
                scaled = job.plans
            else:
                of = dict(zip(types, factors, strict=True))
                scaled = tuple(p.with_step_factor(of[p.gpu_type]) for p in job.plans)
            got = self._views[job.id] = (job.plans, factors, scaled)
        return job if got[2] is job.plans else replace(job, plans=got[2])

    def _running(self, r: RunningJob) -> RunningJob:
        a = r.allocation
        f = self.corrected.factor(r.job, a.plan.gpu_type)
        got = self._allocs.get(r.job.id)
        if got is None or got[0] is not a or got[1] != f:
            scaled = a if f == a.plan.step_factor else replace(a, plan=a.plan.with_step_factor(f))
            got = self._allocs[r.job.id] = (a, f, scaled)
        job = self._view(r.job)
        if got[2] is a and job is r.job:
            return r
        return replace(r, job=job, allocation=got[2])

    @staticmethod
    def _uncorrected(d: Decision) -> Decision:
        a = d.allocation
        if a is None or a.plan.step_factor == 1.0:
            return d
        return replace(d, allocation=replace(a, plan=a.plan.with_step_factor(1.0)))
