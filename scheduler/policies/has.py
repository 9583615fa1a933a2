"""HAS — Frenzy's heterogeneity-aware scheduler (Algorithm 1 of the Frenzy paper).

For each waiting job, in FCFS order:

1. walk its predicted plans in priority order (MARP's ranking, best first) and take the first
   one the free GPUs satisfy: enough free GPUs of the plan's type whose memory is at least the
   plan's ``required_bytes`` (Algorithm 1 lines 3-10);
2. place it best-fit: the node whose free GPUs fit the plan exactly or most tightly, else the
   node with the most free GPUs and again for the rest — fewest nodes (lines 11-36); GPUs are
   taken in multiples of the plan's ``tp`` per node when possible (``FreeGpus.best_fit``);
3. re-time the plan for the placement it actually got (``PerfModel.placed_plan``): a tensor-
   parallel group split over nodes, or a PCIe-only node, is slower than the plan assumed.

Choices the paper leaves open, and why:

* **Plans are per GPU type.** A plan timed and sized for type X runs only on type-X nodes; the
  plans of other types are separate entries in the same ranked list, so "take a 40 GB card when
  no 80 GB card is free" (paper §IV-B) is the walk reaching the next plan. Algorithm 1 line 5
  counts any GPU with enough memory; running an X plan on a different Y with enough memory would
  run at Y's speed, which the ranking never saw.
* **Backfilling** (``backfill=True``, default): a job none of whose plans fits now does not
  block the jobs behind it. HAS is invoked per job as resources change; holding free GPUs idle
  for the head of the queue would only add queueing delay, and MARP's smallest plans are small
  enough that large jobs are not starved in practice (each job has many plan sizes to fall back
  to). ``backfill=False`` stops at the first job that cannot be placed (strict FCFS).
* **No preemption**: HAS only starts jobs, as in the paper.

Speed (called on every event; target ≤ 1 ms median at 2,048 GPUs and 1,000 queued jobs): a call
returns at once when nothing is free or nothing waits; each job's plans are indexed once
(``PlanIndexCache``) so a job none of whose plans can fit is skipped after one dict lookup and an
O(GPU types) check; the loop stops as soon as the cluster is full.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from scheduler.cluster import Allocation, ClusterState, Placement
from scheduler.decision import Decision, start
from scheduler.job import JobView, RunningJob
from scheduler.perf import AnalyticalPerfModel
from scheduler.placement import FreeGpus
from scheduler.policies.common import PlanIndexCache
from scheduler.policy import PerfModel, register

log = logging.getLogger(__name__)


def describe_placement(placement: Placement, free: FreeGpus, single: str) -> str:
    """'best-fit on node-3 (3 free)' or 'greedy over 2 nodes: 8@a + 4@b' (before taking)."""
    if len(placement) == 1:
        node_id, _ = placement[0]
        return f"{single} on {node_id} ({free.free_on(node_id)} free)"
    where = " + ".join(f"{n}@{node}" for node, n in placement)
    return f"no single node fits: spread over {len(placement)} nodes, most free first: {where}"


@register("has")
class HasPolicy:
    """Frenzy's HAS. ``perf`` re-times plans for their placement (default: the analytical
    step-time model); ``backfill`` lets later jobs start when an earlier one cannot; ``seed`` is
    accepted for a uniform policy interface (HAS uses no randomness)."""

    name = "has"

    def __init__(
        self,
        perf: PerfModel | None = None,
        *,
        backfill: bool = True,
        plan_order: str = "ranked",
        seed: int = 0,
    ) -> None:
        if plan_order not in ("ranked", "share"):
            raise ValueError(f"plan_order must be 'ranked' or 'share', got {plan_order!r}")
        self.perf: PerfModel = perf if perf is not None else AnalyticalPerfModel()
        self.backfill = backfill
        self.plan_order = plan_order
        self.seed = seed
        self._plans = PlanIndexCache()

    def decide(
        self,
        state: ClusterState,
        pending: Sequence[JobView],
        running: Sequence[RunningJob],
        now: float,
    ) -> list[Decision]:
        """Start every waiting job (FCFS) whose best satisfiable plan fits the free GPUs."""
        if not pending:
            return []
        if not any(n.free_gpus for n in state.nodes):
            return []
        free = FreeGpus.from_state(state)
        out: list[Decision] = []
        cache = self._plans
        entries = cache.entries
        free_by_type = free.free_by_type
        for k, job in enumerate(pending):
            index = entries.get(job.id)
            if index is None or index.plans is not job.plans:
                index = cache.get(job)
            # quick reject: no GPU type has as many free GPUs as the job's smallest plan on it
            for t, n in index.min_items:
                if free_by_type.get(t, 0) >= n:
                    break
            else:
                if not self.backfill:
                    break
                continue
            decision = None
            if self.plan_order == "share":
                # fastest plan within an equal share of the free GPUs among the waiting jobs
                share = max(1, free.total_free // max(1, len(pending) - k))
                fitting = tuple(p for p in index.by_speed if p.num_gpus <= share)
                decision = self._place(job, fitting, free, state)
            if decision is None:
                decision = self._place(job, index.plans, free, state)
            if decision is None:
                if not self.backfill:
                    break
                continue
            out.append(decision)
            if free.total_free == 0:
                break
        cache.prune(pending)
        return out

    def _place(self, job: JobView, plans, free: FreeGpus, state: ClusterState) -> Decision | None:
        for k, plan in enumerate(plans, start=1):
            n = plan.num_gpus
            ava = free.free(plan.gpu_type, plan.required_bytes)
            if ava < n:
                continue
            placement = free.best_fit(plan.gpu_type, n, plan.required_bytes, plan.parallel.tp)
            if placement is None:  # pragma: no cover  (ava >= n guarantees a placement)
                continue
            where = describe_placement(placement, free, "best-fit")
            free.take(placement)
            placed = self.perf.placed_plan(job, plan, placement, state)
            reason = (
                f"HAS: plan #{plan.rank or k} {plan.label()} is the first of {len(plans)} ranked "
                f"plans the free GPUs satisfy ({ava} free {plan.gpu_type} >= {n}"
                f"{f'; plans #1-#{k - 1} did not fit' if k > 1 else ''}); {where}"
            )
            if abs(placed.step_time_s - plan.step_time_s) > 1e-3 * plan.step_time_s:
                reason += (
                    f"; step re-timed for this placement: {plan.step_time_s:.3f}s -> "
                    f"{placed.step_time_s:.3f}s"
                )
            return start(Allocation(job.id, placed, placement), reason)
        return None
