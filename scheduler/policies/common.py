"""Helpers the policies share: per-job plan indexes (cached across calls) and making a decision
list safe to apply one decision at a time."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

from predictor.plan import Plan
from scheduler.cluster import ClusterState
from scheduler.decision import Decision, DecisionKind, start, stop
from scheduler.job import JobView, RunningJob


@dataclass(frozen=True, slots=True)
class PlanIndex:
    """A job's plans grouped for quick lookups.

    ``by_type[t][n]`` is the best-ranked plan of GPU type ``t`` on ``n`` GPUs (the planner keeps
    one per (type, count), but a hand-made list may hold several); ``min_gpus[t]`` is the
    smallest count any plan of type ``t`` needs, so a policy can skip a job in O(types) when the
    free GPUs cannot hold any of its plans.
    """

    plans: tuple[Plan, ...]
    by_type: dict[str, dict[int, Plan]]
    min_gpus: dict[str, int]
    min_items: tuple[tuple[str, int], ...]  # ``min_gpus`` as pairs, for tight loops
    by_speed: tuple[Plan, ...] = ()  # fastest job time first (ties: fewer GPU-seconds)
    efficient_by_speed: tuple[Plan, ...] = ()  # ``by_speed`` of the plans at the knee
    efficient_min_gpus: tuple[tuple[tuple[str, int], ...], ...] = ()
    """``efficient_min_gpus[k]``: (type, fewest GPUs) over the first ``k`` plans of
    ``efficient_by_speed``, so a policy can tell in O(types) that none of them fits."""
    lazy: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    """Views computed on first use (most jobs never need them; indexes are built per job)."""

    def worth_starting(self, min_saving_s: float) -> tuple[Plan, ...]:
        """``efficient_by_speed`` without the plans that save less than ``min_saving_s`` of
        job time over the cheapest plan of their GPU type: more GPUs mean more workers to
        launch and rendezvous, which the step-time model does not see, so a job of seconds
        starts on the cheapest plan, not on four GPUs that save it milliseconds."""
        key = f"worth:{min_saving_s}"
        got = self.lazy.get(key)
        if got is None:
            got = tuple(p for p in self.efficient_by_speed
                        if p.gpu_seconds <= (c := self.cheapest(p.gpu_type)[0]).gpu_seconds
                        or c.job_time_s - p.job_time_s >= min_saving_s)
            self.lazy[key] = got
        return got

    def faster_than(self, limit_s: float) -> int:
        """How many plans lead ``efficient_by_speed`` with a job time below ``limit_s`` (the
        plans a walk in that order sees before the first one at or above ``limit_s``)."""
        got = self.lazy.get("times")
        if got is None:
            times = tuple(p.job_time_s for p in self.efficient_by_speed)
            got = self.lazy["times"] = (times, all(a <= b for a, b in pairwise(times)))
        times, ascending = got
        if ascending:
            return bisect_left(times, limit_s)
        # ``restamp`` scales the times by one factor, which keeps their order up to rounding
        return next((i for i, t in enumerate(times) if t >= limit_s), len(times))

    def any_faster_than(self, limit_s: float) -> tuple[int, tuple[tuple[str, int], ...]]:
        """``faster_than`` and ``efficient_min_gpus`` over every plan (``by_speed``, the knee
        ignored): how many plans lead ``by_speed`` with a job time below ``limit_s``, and
        per GPU type the fewest GPUs any of them needs."""
        got = self.lazy.get("any")
        if got is None:
            times = tuple(p.job_time_s for p in self.by_speed)
            prefix: list[tuple[tuple[str, int], ...]] = [()]
            acc: dict[str, int] = {}
            for p in self.by_speed:
                acc[p.gpu_type] = min(acc.get(p.gpu_type, p.num_gpus), p.num_gpus)
                prefix.append(tuple(acc.items()))
            got = self.lazy["any"] = (times, tuple(prefix))
        times, prefix = got
        # a walk in ``by_speed`` order stops at the first plan not fast enough (asked once
        # per job and allocation: a scan of a few dozen plans)
        k = next((i for i, t in enumerate(times) if t >= limit_s), len(times))
        return k, prefix[k]

    def past_knee(self, plan: Plan) -> bool:
        """Whether ``plan`` (one of these plans, or a copy re-timed for its placement) is
        of a (GPU type, count) that is not among ``efficient_by_speed``."""
        at_knee = self.lazy.get("at_knee")
        if at_knee is None:
            at_knee = self.lazy["at_knee"] = {(p.gpu_type, p.num_gpus)
                                               for p in self.efficient_by_speed}
        return (plan.gpu_type, plan.num_gpus) not in at_knee

    def undominated(self) -> tuple[Plan, ...]:
        """``plans`` (their order kept) without those dominated by another plan of their GPU
        type: one that runs faster at no more GPU-seconds a step, so more GPUs used better. A
        dominated plan only saves GPUs now (a 4-GPU plan of a 7B model that pipelines with
        full recomputation beside an 8-GPU one that does not); taking it holds GPUs at a
        worse rate than the type offers. The fastest plan of each type is never dominated."""
        got = self.lazy.get("undominated")
        if got is None:
            got = self.lazy["undominated"] = tuple(
                p for p in self.plans
                if not any(q.step_time_s < p.step_time_s
                           and q.step_time_s * q.num_gpus <= p.step_time_s * p.num_gpus
                           for q in self.by_type[p.gpu_type].values()))
        return got

    def fastest_of(self, gpu_type: str) -> tuple[Plan, ...]:
        """The plans of ``gpu_type`` in ``by_speed`` order, fastest first; empty if the job
        has none."""
        return self._per_type("fastest_of", gpu_type, lambda: tuple(
            p for p in self.by_speed if p.gpu_type == gpu_type))

    def cheapest(self, gpu_type: str) -> tuple[Plan, ...]:
        """The plans of ``gpu_type`` by GPU-seconds, cheapest first (ties in ``by_type``
        order); empty if the job has none."""
        return self._per_type("cheapest", gpu_type, lambda: tuple(sorted(
            self.by_type.get(gpu_type, {}).values(), key=lambda p: p.gpu_seconds)))

    def _per_type(self, name: str, gpu_type: str,
                  build: Callable[[], tuple[Plan, ...]]) -> tuple[Plan, ...]:
        """``build()`` for ``gpu_type``, made on first use and kept in ``lazy[name]``."""
        cache = self.lazy.get(name)
        if cache is None:
            cache = self.lazy[name] = {}
        got = cache.get(gpu_type)
        if got is None:
            got = cache[gpu_type] = build()
        return got

    def restamp(self, plans: tuple[Plan, ...]) -> PlanIndex:
        """This index for ``plans``, a list with the same shapes in the same order (the
        same model and training shape, another step count): positions carry over, since
        job time and GPU-seconds are the step time scaled by a constant."""
        pos = {id(p): i for i, p in enumerate(self.plans)}

        def swap(xs: tuple[Plan, ...]) -> tuple[Plan, ...]:
            return tuple(plans[pos[id(p)]] for p in xs)

        by_type = {t: {n: plans[pos[id(p)]] for n, p in c.items()}
                   for t, c in self.by_type.items()}
        out = PlanIndex(plans, by_type, self.min_gpus, self.min_items, swap(self.by_speed),
                        swap(self.efficient_by_speed), self.efficient_min_gpus)
        # step times do not depend on the step count: the template's answer carries over
        out.lazy["undominated"] = swap(self.undominated())
        return out

    @classmethod
    def build(cls, plans: tuple[Plan, ...], knee: float = 0.8) -> PlanIndex:
        by_type: dict[str, dict[int, Plan]] = {}
        for plan in plans:
            by_type.setdefault(plan.gpu_type, {}).setdefault(plan.num_gpus, plan)
        min_gpus = {t: min(counts) for t, counts in by_type.items()}
        by_speed = tuple(sorted(plans, key=lambda p: (p.job_time_s, p.gpu_seconds)))
        cheapest = {t: min(p.gpu_seconds for p in c.values()) for t, c in by_type.items()}
        efficient = tuple(p for p in by_speed
                          if cheapest[p.gpu_type] >= knee * p.gpu_seconds)
        prefix_min: list[tuple[tuple[str, int], ...]] = [()]
        acc: dict[str, int] = {}
        for p in efficient:
            acc[p.gpu_type] = min(acc.get(p.gpu_type, p.num_gpus), p.num_gpus)
            prefix_min.append(tuple(acc.items()))
        return cls(plans, by_type, min_gpus, tuple(min_gpus.items()), by_speed, efficient,
                   tuple(prefix_min))

    def at_least(self, gpu_type: str, num_gpus: int) -> Plan | None:
        """The plan of ``gpu_type`` on exactly ``num_gpus`` GPUs, else on the fewest GPUs above
        it (a request the plans cannot run as asked is rounded up, never down: fewer GPUs than
        asked would not fit in memory or would not be what the user asked for)."""
        counts = self.by_type.get(gpu_type)
        if not counts:
            return None
        if num_gpus in counts:
            return counts[num_gpus]
        above = [n for n in counts if n > num_gpus]
        return counts[min(above)] if above else None


class PlanIndexCache:
    """``PlanIndex`` per job id, rebuilt when the job's plan tuple changes (identity check, so
    a lookup costs one dict access). Pruned to the jobs of the current call when it grows."""

    __slots__ = ("entries", "templates")

    def __init__(self) -> None:
        self.entries: dict[str, PlanIndex] = {}
        """job id -> index; read directly in hot loops (check ``plans is job.plans``)."""
        self.templates: dict[tuple[object, ...], PlanIndex] = {}
        """An index per (model, training shape, plan list): jobs that differ only in their
        step counts reuse its sorting (``PlanIndex.restamp``). The planner is deterministic,
        so equal inputs give equal lists; the fingerprint (length, first and last plan) guards
        against hand-made lists."""

    def get(self, job: JobView) -> PlanIndex:
        entry = self.entries.get(job.id)
        if entry is None or entry.plans is not job.plans:
            entry = self.entries[job.id] = self._index(job)
        return entry

    def _index(self, job: JobView) -> PlanIndex:
        plans = job.plans
        if job.model is None or job.train is None or not plans:
            return PlanIndex.build(plans)
        t = job.train
        key = (job.model, t.global_batch, t.seq_len, t.precision, t.optimizer,
               t.flash_attention, t.sequence_parallel,
               len(plans), plans[0].gpu_type, plans[0].parallel, plans[0].step_time_s,
               plans[-1].gpu_type, plans[-1].parallel, plans[-1].step_time_s)
        template = self.templates.get(key)
        if template is None:
            if len(self.templates) > 4096:
                self.templates.clear()
            template = self.templates[key] = PlanIndex.build(plans)
            return template
        return template if template.plans is plans else template.restamp(plans)

    def prune_for(self, pending: Sequence[JobView], running: Sequence[RunningJob],
                  slack: int | None = None) -> None:
        """``prune`` to the pending and running jobs, without listing them unless it prunes
        (policies call it on every decision)."""
        live = len(pending) + len(running)
        if len(self.entries) > live + _slack(live, slack):
            self.prune([*pending, *(r.job for r in running)], slack)

    def prune(self, keep: Sequence[JobView], slack: int | None = None) -> None:
        """Forget finished jobs once the cache holds ``slack`` more entries than ``keep``
        (default: as many as ``keep``, at least ``MIN_PRUNE_SLACK``: the cache stays within
        twice the live jobs, and a prune, O(entries), comes once per that many new jobs)."""
        if len(self.entries) > len(keep) + _slack(len(keep), slack):
            ids = {j.id for j in keep}
            self.entries = {k: v for k, v in self.entries.items() if k in ids}


MIN_PRUNE_SLACK = 256


def _slack(live: int, slack: int | None) -> int:
    return max(MIN_PRUNE_SLACK, live) if slack is None else slack


def order_for_sequential_apply(
    state: ClusterState, running: Sequence[RunningJob], decisions: Sequence[Decision]
) -> list[Decision]:
    """Reorder ``decisions`` so that applying them one at a time on ``state`` never asks for a
    GPU that is still held: every STOP first, then each RESIZE (which releases its old GPUs and
    takes the new ones) once its new GPUs are free, then every START.

    A cycle of RESIZEs (A moves onto B's GPUs while B moves onto A's) has no valid order; the
    first RESIZE of such a cycle is split into a STOP and a later START of the same
    allocation, so the job checkpoints and restarts exactly as a resize would.
    """
    held = {r.job.id: r.allocation for r in running}
    free = {n.id: n.free_gpus for n in state.nodes}
    stops = [d for d in decisions if d.kind is DecisionKind.STOP]
    resizes = [d for d in decisions if d.kind is DecisionKind.RESIZE]
    starts = [d for d in decisions if d.kind is DecisionKind.START]
    for d in stops:
        for node_id, n in held[d.job_id].placement:
            free[node_id] += n

    ordered: list[Decision] = list(stops)
    late_starts: list[Decision] = []
    todo = list(resizes)
    while todo:
        for k, d in enumerate(todo):
            assert d.allocation is not None
            avail = dict(free)
            for node_id, n in held[d.job_id].placement:
                avail[node_id] += n
            if all(avail[node_id] >= n for node_id, n in d.allocation.placement):
                for node_id, n in d.allocation.placement:
                    avail[node_id] -= n
                free = avail
                ordered.append(d)
                todo.pop(k)
                break
        else:  # a cycle: stop the first one now, start it once everything else has moved
            d = todo.pop(0)
            assert d.allocation is not None
            for node_id, n in held[d.job_id].placement:
                free[node_id] += n
            ordered.append(stop(d.job_id, f"{d.reason} [resize split into stop+start: "
                                          "its new GPUs are held by a job that moves later]",
                                d.code))
            late_starts.append(start(d.allocation, d.reason + " [restart after split resize]",
                                     d.code))
    return ordered + late_starts + starts
