"""Sia — heterogeneity-aware, goodput-optimised, round-based scheduling (Jayaram Subramanya et
al., SOSP'23), as a baseline, solved with a real MILP solver (SciPy's HiGHS).

The formulation follows the public artifact (``siasosp23/artifacts``, ``sia-simulator/sia.py``,
defaults in ``simulator_config.py``):

* **Configurations.** Per GPU type with ``g`` GPUs per node: ``1, 2, 4, ... < g`` GPUs on one
  node, then whole nodes ``g, 2g, ...`` up to the type's node count (the artifact's
  ``CONFIGS_8GPU`` / ``CONFIGS_4GPU``). On a configuration of ``c`` GPUs a job runs its
  largest plan of that GPU type with at most ``c`` GPUs whose memory fits the type's GPUs
  (adaptive mode; the artifact's ``scale_unit``: a job whose replica needs 3 GPUs runs
  ``c // 3`` replicas, so its plans of 3, 6 and 12 GPUs are its configurations 4, 8 and 16;
  the configuration holds only the plan's GPUs, the artifact's idle remainder is not kept
  from other jobs), or — ``mode="rigid"`` — only the user's requested count on each type
  (the artifact's rigid jobs).
* **Goodput** = throughput × statistical efficiency. Our LLM jobs train with a fixed global
  batch, so statistical efficiency is 1 and goodput is throughput: ``1 / step time`` of the plan
  re-timed (``PerfModel``) on the placement the configuration would run on. A waiting job's
  configurations are timed packed (largest nodes first, as on an empty cluster). A running job's
  current configuration is timed on the placement it holds, and each other configuration on the
  placement the allocator would give it (best fit on the free GPUs plus the job's own): both
  sides of a move are valued on placements they would really get, so a job on a split
  placement is not moved to a configuration that would be split as well just because its
  packed shape is faster. Where that does not fit (the move needs GPUs other jobs hold, and
  its placement depends on what they do) the configuration is valued packed, or at the step
  time the job got the last time it was placed on it if that was slower: a move that landed
  on a split placement is not made again on the packed shape's promise (Sia too re-fits a
  job's throughput from what it observes).
* **Normalisation** per job: every goodput divided by the job's smallest goodput over all its
  configurations, times that configuration's GPU count (the artifact's scale unit: 1 for
  data-parallel jobs, the GPUs of one replica for model-parallel ones).
* **Restart penalty** (Pollux's re-allocation factor, ``sia_use_pollux_realloc_factor=True``):
  for a running job every configuration other than its current one is scaled by
  ``r = max(age − restarts·R, 0) / (age + R)`` (``r = 1`` while ``age < R``), ``age`` = time
  since submission, ``R`` = restart penalty in seconds: what a checkpoint-restart really
  costs here, the launch plus the checkpoint save and load (10 + 60 = 70 s in the simulator;
  the artifact measured 25-250 s per model on its cluster).
* **Objective** (p < 0): minimise ``Σ X·round(G^p, 2) + λ_n · (jobs − Σ X)`` with ``G^p``
  clipped at 3000, ``X`` binary, at most one configuration per job, and per GPU type
  ``Σ GPUs(X) ≤ GPUs of that type``. Defaults p = −0.5, λ_n = 1.1 (so allocating any job beats
  leaving it out), relative MIP gap 1e-4.
* **Jobs mid checkpoint-restore** keep their allocation (the artifact's hard constraint): a job
  started or re-allocated less than ``min_hold_s`` seconds ago (at least ``R``: the restore is
  still under way) is not re-allocated.

Where the artifact is silent or we had to choose (and why):

* ``λ_a`` (0.01, "penalty for change of alloc") is read by the artifact but never enters its
  objective. We add it as a cost on every configuration change of a running job. At 0.01 against
  normalised costs of 0.1-1 it only breaks near-ties in favour of staying put.
* **Stopping is a re-allocation too** (``charge_stops``, default on). The artifact scales the
  goodput of every *other configuration* by ``r`` but leaves "no allocation" at ``λ_n``, so
  preempting a running job costs it only ``λ_n − G^p`` (0.1 for a job on its smallest
  configuration) — exactly what starting a waiting job gains. Swapping two jobs is then free
  although each swap throws away a restart, and the MILP swaps on every rounding tie (19,000
  restarts for 150 jobs on loaded windows). Sia's paper charges every re-allocation with the
  restart penalty; we charge leaving a running job out the same factor as any other change:
  its no-allocation cost is ``λ_n · r^p`` (for p < 0 this is ``λ_n`` divided by the goodput
  share the job keeps, clipped like the goodputs), so a job is stopped only when the jobs that
  take its GPUs gain more than the restart it loses.
* **Placement.** The solver picks (type, count); GPUs are then assigned per type: jobs whose
  configuration did not change keep their GPUs (no restart); the others are placed largest
  first with best fit, multi-node jobs on the emptiest nodes (Sia's "smart placement" without
  evictions). Fragmentation can split a job over more nodes than its configuration assumed; its
  plan is then re-timed for the real placement, so the penalty is real, not ignored as in the
  artifact's simulator. A job that cannot be placed at all (GPUs of the type differ in memory)
  is left out of the round.
* **Rounds.** The artifact solves every 60 s. Here the policy is called on every event; it
  re-solves the whole problem when a round boundary (a multiple of ``round_s`` on the
  controller's clock) has passed. Between boundaries, if jobs wait and GPUs are idle,
  ``fill_idle_between_rounds`` (default on) runs the same MILP over the waiting jobs and the
  idle GPUs only, with every running job kept as it is — no extra restarts, less idle time.
  This is kinder to Sia than waiting for the next round (up to 60 s of extra queueing per job);
  ``fill_idle_between_rounds=False`` gives the artifact's strict rounds.
* Only the artifact's regime ``p < 0`` is implemented (minimisation with λ_n > 0).
* The solver runs without a time limit by default, so the answer does not depend on the
  machine's speed; ``time_limit_s`` trades that for bounded latency.
"""

from __future__ import annotations

import logging
import math
from bisect import bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import csr_array

from predictor.plan import Plan
from scheduler.cluster import Allocation, ClusterState
from scheduler.decision import Decision, ReasonCode, resize, resize_code, start, stop
from scheduler.job import JobView, RunningJob
from scheduler.perf import AnalyticalPerfModel
from scheduler.placement import FreeGpus
from scheduler.policies.common import PlanIndexCache, order_for_sequential_apply
from scheduler.policies.deadline import LAUNCH_DELAY_S, RESTART_DELAY_S
from scheduler.policy import PerfModel, register

log = logging.getLogger(__name__)

Config = tuple[str, int]  # (GPU type, GPU count)


def sia_config_counts(gpus_per_node: int, num_nodes: int) -> list[int]:
    """The artifact's configuration sizes for one GPU type: powers of two below a node, then
    whole nodes (e.g. 8-GPU nodes × 3: 1, 2, 4, 8, 16, 24)."""
    out = []
    c = 1
    while c < gpus_per_node:
        out.append(c)
        c *= 2
    out.extend(gpus_per_node * k for k in range(1, num_nodes + 1))
    return out


def config_plan_counts(sizes: Sequence[int], have: Iterable[int]) -> list[int]:
    """The plan GPU counts a job runs on Sia's configuration ``sizes``: per size ``c``, its
    largest plan of at most ``c`` GPUs (each counted once).

    The artifact runs ``c // S`` replicas of a job whose replica needs ``S`` GPUs (its
    ``scale_unit``: pipeline or model parallel jobs) on a configuration of ``c`` GPUs, so a job
    whose plans need 3, 6 or 12 GPUs (a 3-stage pipeline) still has configurations on 8-GPU
    nodes. Here the configuration is the plan's own count: the remainder is not held idle."""
    counts = sorted(have)
    out: list[int] = []
    for c in sizes:
        k = bisect_right(counts, c) - 1
        if k >= 0 and counts[k] not in out:
            out.append(counts[k])
    return out


def realloc_factor(age_s: float, restarts: int, penalty_s: float) -> float:
    """Pollux's re-allocation factor: the share of a job's life not lost to restarts, counting
    the restart a change would add. 1 for jobs younger than one restart."""
    if age_s < penalty_s:
        return 1.0
    return max(age_s - restarts * penalty_s, 0.0) / (age_s + penalty_s)


@dataclass(slots=True)
class _Candidate:
    job: JobView
    running: RunningJob | None
    configs: list[Config] = field(default_factory=list)
    plans: list[Plan] = field(default_factory=list)
    goodput: list[float] = field(default_factory=list)  # normalised, before restart scaling
    cost: list[float] = field(default_factory=list)  # MILP objective coefficients
    left_out: float = 0.0  # cost of no configuration (λ_n, more for a running job)


@dataclass(frozen=True, slots=True)
class RoundStats:
    """What the last solve looked at (for benchmarks and logs)."""

    now: float
    full_round: bool
    jobs: int
    variables: int
    status: str
    objective: float | None


@register("sia")
class SiaPolicy:
    """Sia's goodput-optimising MILP scheduler (see the module docstring for the formulation).

    ``p``, ``lambda_n``, ``lambda_a``: the artifact's objective parameters; ``round_s``: round
    length; ``restart_penalty_s``: seconds a checkpoint-restart costs (Pollux's R; default the
    launch plus checkpoint save/load the simulator charges); ``min_hold_s``: a job (re)started
    this recently is not re-allocated (default and minimum ``restart_penalty_s``: its restore is
    under way); ``charge_stops``: leaving a running job out costs the re-allocation factor too;
    ``mode``: "adaptive" (any configuration the job has a plan for) or "rigid" (the requested
    GPU count, any type); ``fill_idle_between_rounds``: place waiting jobs on idle GPUs between
    rounds without touching running ones; ``mip_rel_gap`` / ``time_limit_s``: solver options;
    ``seed``: accepted for a uniform interface (HiGHS is deterministic).
    """

    name = "sia"

    def __init__(
        self,
        perf: PerfModel | None = None,
        *,
        p: float = -0.5,
        lambda_n: float = 1.1,
        lambda_a: float = 0.01,
        round_s: float = 60.0,
        restart_penalty_s: float = LAUNCH_DELAY_S + RESTART_DELAY_S,
        min_hold_s: float | None = None,
        charge_stops: bool = True,
        mode: str = "adaptive",
        fill_idle_between_rounds: bool = True,
        goodput_clip: float = 3000.0,
        mip_rel_gap: float = 1e-4,
        time_limit_s: float | None = None,
        seed: int = 0,
    ) -> None:
        if not p < 0:
            raise ValueError(f"only p < 0 (the artifact's regime) is implemented, got p={p}")
        if lambda_n <= 1.0:
            raise ValueError("lambda_n must exceed 1 (the smallest normalised cost) so that "
                             f"every job prefers an allocation; got {lambda_n}")
        if mode not in ("adaptive", "rigid"):
            raise ValueError(f"mode must be 'adaptive' or 'rigid', got {mode!r}")
        if round_s <= 0:
            raise ValueError(f"round_s must be > 0, got {round_s}")
        if restart_penalty_s < 0:
            raise ValueError(f"restart_penalty_s must be >= 0, got {restart_penalty_s}")
        hold = restart_penalty_s if min_hold_s is None else min_hold_s
        if hold < restart_penalty_s:
            raise ValueError(f"min_hold_s must be at least restart_penalty_s "
                             f"({restart_penalty_s:g} s: a job is not moved mid restore), "
                             f"got {min_hold_s}")
        self.perf: PerfModel = perf if perf is not None else AnalyticalPerfModel()
        self.p = p
        self.lambda_n = lambda_n
        self.lambda_a = lambda_a
        self.round_s = round_s
        self.restart_penalty_s = restart_penalty_s
        self.min_hold_s = hold
        self.charge_stops = charge_stops
        self.mode = mode
        self.fill_idle_between_rounds = fill_idle_between_rounds
        self.goodput_clip = goodput_clip
        self.mip_rel_gap = mip_rel_gap
        self.time_limit_s = time_limit_s
        self.seed = seed
        self._next_round: float | None = None
        self._plans = PlanIndexCache()
        # per job, per configuration: the step time of the placement it last got there
        self._got: dict[str, dict[Config, float]] = {}
        self.last_round: RoundStats | None = None

    # -- the policy interface ----------------------------------------------------------------
    def decide(
        self,
        state: ClusterState,
        pending: Sequence[JobView],
        running: Sequence[RunningJob],
        now: float,
    ) -> list[Decision]:
        """At a round boundary, re-solve every job's configuration; between rounds, only fill
        idle GPUs with waiting jobs (if enabled)."""
        if self._next_round is None or now >= self._next_round:
            self._next_round = (math.floor(now / self.round_s) + 1) * self.round_s
            if not pending and not running:
                return []
            return self._solve(state, pending, running, now, full_round=True)
        if (self.fill_idle_between_rounds and pending
                and any(n.free_gpus for n in state.nodes)):
            return self._solve(state, pending, running, now, full_round=False)
        return []

    # -- one solve ---------------------------------------------------------------------------
    def _solve(
        self,
        state: ClusterState,
        pending: Sequence[JobView],
        running: Sequence[RunningJob],
        now: float,
        *,
        full_round: bool,
    ) -> list[Decision]:
        free = FreeGpus.from_state(state)
        types = free.gpu_types()
        capacity = {t: free.free(t) for t in types}  # GPUs the MILP may hand out, per type
        frozen: list[RunningJob] = []
        movable: list[RunningJob] = []
        for r in running:
            restarting = now - r.started_at < self.min_hold_s
            if full_round and not restarting and free.has_type(r.allocation.plan.gpu_type):
                movable.append(r)
                capacity[r.allocation.plan.gpu_type] += r.allocation.num_gpus
            else:
                frozen.append(r)
        # configurations larger than what this solve may hand out can never be chosen; leaving
        # them out keeps the MILP small (and empty when no waiting job fits the idle GPUs)
        counts = {t: [c for c in sia_config_counts(free.node_size(t), len(free.node_ids(t)))
                      if c <= capacity[t]] for t in types}

        cands = [self._candidate(r.job, r, free, counts, capacity, state, now) for r in movable]
        cands += [self._candidate(j, None, free, counts, capacity, state, now) for j in pending]
        cands = [c for c in cands if c.configs]
        self._plans.prune([*pending, *(r.job for r in running)])
        live = {j.id for j in pending} | {r.job.id for r in running}
        for jid in [k for k in self._got if k not in live]:
            del self._got[jid]
        if not cands:
            return []

        chosen, status, objective = self._milp(cands, types, capacity)
        nvars = sum(len(c.configs) for c in cands)
        self.last_round = RoundStats(now, full_round, len(cands), nvars, status, objective)
        if chosen is None:
            log.warning("sia @%.0fs: solver returned no solution (%s); keeping allocations",
                        now, status)
            return []
        return self._decisions(cands, chosen, free, state, running, now, full_round)

    def _candidate(
        self,
        job: JobView,
        run: RunningJob | None,
        free: FreeGpus,
        counts: dict[str, list[int]],
        limit: dict[str, int],
        state: ClusterState,
        now: float,
    ) -> _Candidate:
        """The job's configurations, their normalised goodputs and MILP costs."""
        index = self._plans.get(job)
        cand = _Candidate(job, run)
        # a running job's alternatives are valued on the placement each would get (the free
        # GPUs plus its own), like its current configuration on the placement it holds
        reachable: FreeGpus | None = None
        if run is not None:
            reachable = FreeGpus.from_state(state)
            reachable.give(run.allocation.placement)
        for t, sizes in counts.items():
            if t not in index.by_type:
                continue
            if self.mode == "rigid":
                want = job.requested_gpus or (index.plans[0].num_gpus if index.plans else 1)
                plan = index.at_least(t, want)
                options = [plan] if plan is not None and plan.num_gpus <= limit[t] else []
            else:
                options = [index.by_type[t][n] for n in config_plan_counts(sizes, index.by_type[t])]
            for plan in options:
                if plan.required_bytes > free.max_memory(t):
                    continue
                shape = None if reachable is None else reachable.best_fit(
                    t, plan.num_gpus, plan.required_bytes, plan.parallel.tp)
                fallback = reachable is not None and shape is None
                if shape is None:  # a waiting job, or it needs GPUs others hold: packed
                    shape = free.packed(t, plan.num_gpus)
                assert shape is not None
                timed = self.perf.placed_plan(job, plan, shape, state)
                step = timed.step_time_s
                if fallback:
                    step = max(step, self._got.get(job.id, {}).get((t, plan.num_gpus), 0.0))
                cand.configs.append((t, plan.num_gpus))
                cand.plans.append(plan)
                cand.goodput.append(1.0 / step)
        current: Config | None = None
        if run is not None:
            current = (run.allocation.plan.gpu_type, run.allocation.num_gpus)
            if current in cand.configs:
                k = cand.configs.index(current)
                cand.goodput[k] = 1.0 / run.allocation.plan.step_time_s  # what it really runs at
            else:  # running outside the config set (started by another rule): staying is a choice
                cand.configs.append(current)
                cand.plans.append(run.allocation.plan)
                cand.goodput.append(1.0 / run.allocation.plan.step_time_s)
        cand.left_out = self.lambda_n
        if not cand.configs:
            return cand
        # normalise: the job's least goodput becomes its GPU count (the artifact's scale unit)
        k_min = min(range(len(cand.goodput)), key=lambda k: (cand.goodput[k], cand.configs[k][1]))
        scale = cand.configs[k_min][1] / cand.goodput[k_min]
        cand.goodput = [g * scale for g in cand.goodput]
        r = 1.0
        if run is not None:
            r = realloc_factor(now - job.submit_time, job.restarts, self.restart_penalty_s)
        if run is not None and self.charge_stops:
            # stopping is a re-allocation: λ_n scaled like a changed goodput (r^p, p < 0)
            cand.left_out = min(self.lambda_n * r ** self.p, self.goodput_clip) if r > 0 else (
                self.goodput_clip)
        for k, g in enumerate(cand.goodput):
            changed = run is not None and cand.configs[k] != current
            scaled = g * r if changed else g
            a = min(round(scaled ** self.p, 2), self.goodput_clip) if scaled > 0 else (
                self.goodput_clip)
            cand.cost.append(a - cand.left_out + (self.lambda_a if changed else 0.0))
        return cand

    def _milp(
        self, cands: list[_Candidate], types: list[str], capacity: dict[str, int]
    ) -> tuple[list[int | None] | None, str, float | None]:
        """Solve the assignment; returns each candidate's chosen configuration index (or None)."""
        type_row = {t: len(cands) + i for i, t in enumerate(types)}
        cost: list[float] = []
        rows: list[int] = []
        cols: list[int] = []
        vals: list[float] = []
        owner: list[tuple[int, int]] = []
        for j, cand in enumerate(cands):
            for k, (t, n) in enumerate(cand.configs):
                v = len(cost)
                cost.append(cand.cost[k])
                owner.append((j, k))
                rows += [j, type_row[t]]
                cols += [v, v]
                vals += [1.0, float(n)]
        nv = len(cost)
        a = csr_array((vals, (rows, cols)), shape=(len(cands) + len(types), nv))
        ub = np.array([1.0] * len(cands) + [float(capacity[t]) for t in types])
        options: dict[str, object] = {"disp": False, "mip_rel_gap": self.mip_rel_gap}
        if self.time_limit_s is not None:
            options["time_limit"] = self.time_limit_s
        res = milp(
            c=np.array(cost), integrality=np.ones(nv), bounds=Bounds(0, 1),
            constraints=LinearConstraint(a, -np.inf, ub), options=options,
        )
        if res.x is None:
            return None, str(res.message), None
        chosen: list[int | None] = [None] * len(cands)
        for v in np.flatnonzero(res.x > 0.5):
            j, k = owner[v]
            chosen[j] = k
        objective = float(res.fun) + sum(c.left_out for c in cands)
        return chosen, "optimal" if res.status == 0 else str(res.message), objective

    def _decisions(
        self,
        cands: list[_Candidate],
        chosen: list[int | None],
        free: FreeGpus,
        state: ClusterState,
        running: Sequence[RunningJob],
        now: float,
        full_round: bool,
    ) -> list[Decision]:
        tag = f"sia round @{now:.0f}s" if full_round else f"sia fill-idle @{now:.0f}s"
        out: list[Decision] = []
        to_place: list[tuple[int, int]] = []  # (candidate, config index)
        for j, (cand, k) in enumerate(zip(cands, chosen, strict=True)):
            run = cand.running
            if run is not None:
                current = (run.allocation.plan.gpu_type, run.allocation.num_gpus)
                if k is not None and cand.configs[k] == current:
                    continue  # unchanged: keeps its GPUs, no restart
                free.give(run.allocation.placement)
                if k is None:
                    out.append(stop(cand.job.id, (
                        f"{tag}: preempted — the MILP gave it no configuration "
                        f"({len(cands)} jobs compete; leaving it out costs "
                        f"{cand.left_out:.2f}, restart penalty included)"), ReasonCode.PREEMPT))
                    continue
            if k is not None:
                to_place.append((j, k))
        # largest first, then the order jobs were considered in (running, then FCFS)
        to_place.sort(key=lambda jk: (-cands[jk[0]].configs[jk[1]][1], jk[0]))
        for j, k in to_place:
            cand = cands[j]
            plan = cand.plans[k]
            t, n = cand.configs[k]
            placement = free.best_fit(t, n, plan.required_bytes, plan.parallel.tp)
            run = cand.running
            if placement is None:
                log.info("%s: %s got %dx%s but no placement; left out", tag, cand.job.id, n, t)
                if run is not None:
                    out.append(stop(cand.job.id, f"{tag}: chosen {n}x{t} could not be placed",
                                    ReasonCode.NO_FIT))
                continue
            free.take(placement)
            placed = self.perf.placed_plan(cand.job, plan, placement, state)
            self._got.setdefault(cand.job.id, {})[(t, n)] = placed.step_time_s
            where = " + ".join(f"{g}@{node}" for node, g in placement)
            why = (f"{tag}: MILP chose {n}x{t} ({plan.label()}), normalised goodput "
                   f"{cand.goodput[k]:.2f}, cost {cand.cost[k] + cand.left_out:.2f}; on {where}")
            alloc = Allocation(cand.job.id, placed, placement)
            if run is None:
                out.append(start(alloc, why, ReasonCode.PLACE))
            else:
                old = run.allocation
                out.append(resize(alloc, f"{why}; was {old.num_gpus}x{old.plan.gpu_type}",
                                  resize_code(old, alloc)))
        return order_for_sequential_apply(state, running, out)
