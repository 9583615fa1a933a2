"""Opportunistic FCFS — the Frenzy paper's baseline (§V-A, "Opportunistic Scheduling").

First come, first served; each job gets the GPU count its user asked for (``requested_gpus``,
from the trace), greedily on the fastest GPU type that has that many free GPUs with enough
memory; no preemption. This is the usual practice Frenzy is measured against: the user, not the
system, picks the GPU count, and the scheduler prefers the most powerful nodes.

Choices, and why (kept as strong as the description allows — a weak baseline proves nothing):

* **Which plan.** A job runs the best-ranked plan of the chosen GPU type on exactly the requested
  count; when no plan has that count (the model does not fit in that many GPUs of that type, or
  the count does not factor into tp·pp·dp), the plan on the fewest GPUs above it — what a user
  would have to ask for to run at all. No request: the count of the job's first-ranked plan.
  ``requested_gpu_type`` is ignored: the paper's baseline chooses the fastest free type itself.
* **A request larger than every GPU type.** A plan runs on one GPU type, so a job asking for
  more GPUs than any type has in the whole cluster could never start. Such a job runs the plan
  on the most GPUs each type holds (the request clamped to the type, as a user told "this pool
  has only 16" would resubmit), fastest first. A request that some type can hold is left as
  asked (types too small for it are not offered). Without the clamp these jobs waited forever
  and the average JCT silently left them out.
* **Fastest** is per job: the GPU types are tried in order of the job's own step time on the
  requested count (which is what "higher computational power" buys), ties by type name.
* **Placement.** The first node (cluster order) holding the whole request, else the fewest
  nodes, most free first; tp groups kept inside nodes when possible (``FreeGpus.first_fit``).
  The plan is re-timed for that placement, as for every policy.
* **Backfilling** (``backfill=True``, default): jobs behind one that cannot start may start
  ("greedily allocating idle resources to newly submitted tasks"). Strict FCFS with head-of-line
  blocking (``backfill=False``) is strictly worse for average JCT and available as an option.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from predictor.plan import Plan
from scheduler.cluster import Allocation, ClusterState
from scheduler.decision import Decision, ReasonCode, start
from scheduler.job import JobView, RunningJob
from scheduler.perf import AnalyticalPerfModel
from scheduler.placement import FreeGpus
from scheduler.policies.common import PlanIndex, PlanIndexCache
from scheduler.policies.has import describe_placement
from scheduler.policy import PerfModel, register


def requested_plans(job: JobView, index: PlanIndex,
                    capacity: Mapping[str, int] | None = None) -> list[Plan]:
    """The job's plan for its requested GPU count on each GPU type, fastest first. With
    ``capacity`` (GPUs per type in the cluster) only plans a type can hold are offered, and when
    no type can hold the request, each type offers its plan on the most GPUs it has."""
    want = job.requested_gpus or (index.plans[0].num_gpus if index.plans else 1)
    cands = [p for t in index.by_type if (p := index.at_least(t, want)) is not None]
    if capacity is not None:
        cands = [p for p in cands if p.num_gpus <= capacity.get(p.gpu_type, 0)]
        if not cands:  # larger than every type: clamp the request to each type
            for t, plans in index.by_type.items():
                fits = [n for n in plans if n <= capacity.get(t, 0)]
                if fits:
                    cands.append(plans[max(fits)])
    cands.sort(key=lambda p: (p.step_time_s, p.gpu_type))
    return cands


@register("opportunistic")
class OpportunisticPolicy:
    """FCFS, the user's GPU count, fastest free GPU type first. ``perf`` re-times plans for
    their placement; ``seed`` is accepted for a uniform interface (no randomness used)."""

    name = "opportunistic"

    def __init__(
        self, perf: PerfModel | None = None, *, backfill: bool = True, seed: int = 0
    ) -> None:
        self.perf: PerfModel = perf if perf is not None else AnalyticalPerfModel()
        self.backfill = backfill
        self.seed = seed
        self._plans = PlanIndexCache()
        self._requested: dict[str, tuple[tuple[Plan, ...], int | None, list[Plan]]] = {}
        self._capacity: dict[str, int] = {}

    def decide(
        self,
        state: ClusterState,
        pending: Sequence[JobView],
        running: Sequence[RunningJob],
        now: float,
    ) -> list[Decision]:
        """Start waiting jobs in submission order on the fastest GPUs that fit their request."""
        if not pending or not any(n.free_gpus for n in state.nodes):
            return []
        free = FreeGpus.from_state(state)
        capacity = state.total_by_type()
        if capacity != self._capacity:  # the inventory changed: re-derive clamped requests
            self._capacity = capacity
            self._requested = {}
        out: list[Decision] = []
        for job in pending:
            cands = self._candidates(job)
            decision = None
            for plan in cands:
                n = plan.num_gpus
                placement = free.first_fit(plan.gpu_type, n, plan.required_bytes,
                                           plan.parallel.tp)
                if placement is None:
                    continue
                where = describe_placement(placement, free, "first fit")
                free.take(placement)
                placed = self.perf.placed_plan(job, plan, placement, state)
                asked = job.requested_gpus
                clamp = (f" (the most {plan.gpu_type} this cluster has: {capacity[plan.gpu_type]})"
                         if asked and n < asked else "")
                reason = (
                    f"opportunistic FCFS: user asked {asked if asked else 'no count'} GPUs -> "
                    f"{plan.label()}{clamp}; fastest GPU type with {n} free "
                    f"({len(cands)} type(s) able to run it); {where}"
                )
                decision = start(Allocation(job.id, placed, placement), reason,
                                 ReasonCode.PLACE)
                break
            if decision is None:
                if not self.backfill:
                    break
                continue
            out.append(decision)
            if free.total_free == 0:
                break
        self._plans.prune(pending)
        if len(self._requested) > len(pending) + 4096:
            ids = {j.id for j in pending}
            self._requested = {k: v for k, v in self._requested.items() if k in ids}
        return out

    def _candidates(self, job: JobView) -> list[Plan]:
        hit = self._requested.get(job.id)
        if hit is not None and hit[0] is job.plans and hit[1] == job.requested_gpus:
            return hit[2]
        cands = requested_plans(job, self._plans.get(job), self._capacity)
        self._requested[job.id] = (job.plans, job.requested_gpus, cands)
        return cands
