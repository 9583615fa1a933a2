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
* **Plan order** (``plan_order="knee"``, default): a job starts on the fastest of its plans
  at the knee of its cost curve (within 80% of the fewest GPU-seconds on that GPU type), the
  first one the free GPUs satisfy, then on MARP's ranked list. The ranking alone (``"ranked"``,
  fewest GPU-seconds first) would start a short job on one GPU when four would run it in a
  quarter of the time for a few percent more GPU-seconds. A larger plan is taken only when it
  saves at least ``min_saving_s`` (60 s) over the cheapest plan of its type: each extra
  worker must be launched and join the rendezvous, which the step-time model does not see
  (worker start-up grows with the number of workers; docs/orchestrator.md).
* **Queue order** (``queue_order="shortest"``, default): waiting jobs are walked by their
  predicted remaining time on their fastest plan, shortest first (MARP makes that known; for
  average JCT it beats FCFS, which ``queue_order="fcfs"`` keeps). Backfilling bounds the wait
  of long jobs: they take whatever the short ones cannot use.
* **Elastic growth** (``grow=True``, default; the mission's "re-balances as jobs arrive and
  finish"): when no job waits and GPUs are idle, a running job moves to a faster plan on its
  own GPUs plus idle ones if that cuts its predicted remaining time by ``min_gain`` and by more
  than the checkpoint-restart cost; when a job cannot start, grown jobs are shrunk back (in
  place) to a smaller plan of no more GPU-seconds, and a long job is shrunk for a much
  shorter waiting one when its own delay stays below ``shrink_delay`` times the short job's run
  time (``shrink_long``, ``shrink_delay``; tuned on the Sia philly/saturn workloads — see
  docs/jct.md).
* **Loans** (``loans=True``, default): shrinking a long job for a short one is a loan, not a
  demotion: its cost is what the long job loses while the short one runs (the slowdown over
  the short job's run time plus two checkpoint-restarts), and as soon as the borrower has
  ended the lender gets its plan back before any waiting job may take the GPUs. Without the
  repayment the freed GPUs would go to the next arrivals and the long job would stay small
  for good, so the loan would have to be priced as permanent.
  Loans are not kept across a restart of the service (the policy has no ``restore``): a
  loan promises nothing (``has`` admits nothing and books nothing) and holds no GPUs of
  its own; the lender resumes on the smaller plan it runs, and after its borrower ends it
  grows back through the ordinary growth onto idle GPUs (``grow``) instead of before every
  waiting job. Losing one costs at most that lender's speed for a while. A loan is not
  repaid onto GPUs that come back split over nodes so that the lender would run more than
  ``max_slowdown`` times slower than its plan, or no faster than where it runs: it stays,
  and growth may move it later.
* **SRPT growth and shrinking** (``srpt=True``, default): growth and shrinking follow the
  queue's key, each job's remaining time on its fastest plan. A running job grows onto idle
  GPUs before a waiting job with more work left starts on them (shortest remaining first,
  even while jobs wait), and a waiting job shrinks only running jobs with more work left
  than its own. LLM jobs scale nearly linearly over a GPU type's plans, and for such jobs
  the average completion time is lowest when the one nearest its end gets the GPUs first;
  otherwise long jobs run side by side on slices of one GPU type and all end late.
  ``srpt=False`` keeps the order above (growth longest
  first, only when nobody waits; any waiting job may undo growth).
* **Placement guard** (``max_slowdown``, default 1.25): a plan is chosen for its predicted
  step time, but step 3 can re-time it far slower: a group split 6 + 2 over two nodes by the
  jobs already running, or any multi-node plan on a cluster whose network is slower than the
  planner's default for that GPU type. A plan whose best-fit placement runs more than
  ``max_slowdown`` times its predicted step time is passed over like a plan that does not
  fit, and the walk goes on to the next plan (often a smaller one on a single node, which
  growth can enlarge later). Only when every plan that fits is slowed that much does the job
  start on the one that would end soonest, and only if it would end no later than the job's
  slowest plan; otherwise it waits. Without the guard a long job could hold GPUs for days
  at a tenth of the speed it was chosen for, and nothing moved it: growth needs a faster
  plan on its own GPUs plus idle ones, and a job split across two nodes blocks the other.
* **Growth past the knee when nobody waits** (``idle_past_knee=True``, default): the knee
  keeps a job's GPU-seconds low while GPUs are contended; GPUs that no waiting job can use
  cost nothing, so once no job waits, the GPUs growth at the knee left idle go to running
  jobs whose fastest plan of any efficiency cuts their remaining time by ``min_gain`` (a
  long job onto more nodes, say). Such growth is undone like any other: a plan of fewer
  GPUs and no more GPU-seconds is always smaller, so ``_shrink_for`` and ``reclaim`` take
  it back for a job that needs the GPUs, whatever its remaining time: GPUs lent past the
  knee do not count as the grown job's in SRPT order.
* **Reclaim** (``reclaim=True``, default): when nobody else waits, an arriving job whose
  knee walk lands on a plan slower (by ``min_gain``) than one held back only by jobs grown
  past a smaller plan, each with more work left than it (SRPT), undoes that growth as a
  loan (repaid when it ends) and starts on the faster plan, if its own gain exceeds what
  the lenders lose (their slowdown over its run time plus two restarts each). Without it a
  short arrival on a heterogeneous cluster runs on the slowest free type while a day-long
  job holds the fast GPUs it grew into; a round-based policy re-places both every round.
* **Growth is undone only where it pays** (``undo_guard=True``, default): undoing a running
  job's growth for a waiting one costs the grown job a restart each way and its speed while
  the waiting job runs (the loan's price above). When that exceeds what waiting costs —
  the waiting job waits until the first running job ends whose GPUs (with the free ones of
  that type) hold one of its plans, and each job waiting behind it at least as long again —
  the growth stays and the job waits. Without it a job grown onto 32 GPUs was shrunk to 16 for
  each 1-GPU, 4-minute arrival and grown back after it, a restart each way every few
  minutes. Chosen on the tuning split (docs/validation.md, round 20).
* **No dominated plans** (``skip_dominated=True``, default): a plan is dominated when
  another plan of its GPU type runs faster at no more GPU-seconds (a 7B model on 4 A100s,
  pipelined four ways with full recomputation, beside its 8-GPU plan that needs neither).
  The ranked walk (and ``_shrink_for``, which makes room for the plan the walk would take)
  passes such plans over: the job waits for the plan that dominates it instead of holding
  fewer GPUs at a worse rate than their type offers. Taking it is not a stopgap either:
  growth needs the dominating plan's GPUs free beside the job's own, and two or three such
  jobs on a type's nodes, one split over two of them, leave no node where any can grow, so
  each keeps its dominated plan to the end (three 7B jobs on 4 A100s each held phoebe's 16
  A100s for ~40 h where 8-GPU plans would have run them in ~16 h). The knee walk is left
  as it is (a plan at the knee costs at most 1/0.8 the type's cheapest GPU-seconds), and
  ``plan_order="ranked"`` follows the stored ranking as it is (a user's ``fewest_gpus``
  ranking asks for the smallest plan whatever its rate).
* **Wide starts when nobody waits** (``widen_gain``, default 0.1): once every waiting job
  has started and growth has run, a job started in this call that GPUs left idle could run
  faster moves, before it launches, to the fastest plan of any efficiency they hold, if that
  runs at least ``widen_gain`` faster and saves at least ``widen_min_saving_s`` over the
  knee's plan. Its default, 0, was chosen on the tuning split (``benchmarks.splits``,
  docs/validation.md): the job has not launched, so a wider plan costs no restart; the extra
  workers' start-up is not charged (``None`` charges ``min_saving_s`` for it, as the knee
  walk does), which the simulator, whose launch delay does not grow with the plan, cannot
  judge. Not under ``plan_order="ranked"``, whose stored ranking is followed as it is, nor
  without growth, whose shrinking takes such GPUs back.
  The knee keeps GPU-seconds low for the jobs that wait; when none does, GPUs held past the
  knee cost nothing now and are lent like grown ones (``_shrink_for`` and ``reclaim`` take
  them back). Growth cannot do this for a short job: it waits ``min_hold_s`` and pays a
  restart, longer than such a job runs. A round-based policy gives every job its fastest
  configuration on an idle cluster.
* **Exchange onto an idle type** (``exchange_gain``, default 0.1): growth moves one job
  onto its own GPUs plus idle ones, so GPUs of a type slower than every running job's stay
  idle while two jobs share a faster type (four 7B jobs on 16 A100 each, 32 V100 idle).
  When nobody waits, a job A with more work left moves to its fastest plan on an idle type
  so that a job B of A's type with no more work left (SRPT) grows onto A's GPUs, if the
  pair's predicted remaining time, a restart each included, drops by more than
  ``exchange_gain`` times B's and by more than two restarts. Both must have run
  ``min_hold_s``; lenders and jobs moved in the same call are left alone. The pairwise
  move is the smallest part of a round-based policy's global re-placement that growth
  cannot reach.
* **Wake-up** (``wake_at``): a growth held back only by ``min_hold_s`` names the time the
  policy wants to be called again, so an event-driven controller (the simulator) asks then
  instead of at the next arrival or completion.

Without growth (``grow=False``) HAS is the paper's start-only Algorithm 1. What each choice
is worth, and on which workloads the thresholds were tuned, is measured in ``docs/jct.md``.

Speed (called on every event; target ≤ 1 ms median at 2,048 GPUs and 1,000 queued jobs): a call
returns at once when nothing is free or nothing waits; each job's plans are indexed once
(``PlanIndexCache``) so a job none of whose plans can fit is skipped after one dict lookup and an
O(GPU types) check; the loop stops as soon as the cluster is full.
"""

from __future__ import annotations

import logging
import math
from bisect import bisect_right
from collections.abc import Callable, Mapping, Sequence
from functools import cache
from operator import itemgetter

from predictor.plan import Plan
from scheduler.cluster import Allocation, ClusterState, Placement
from scheduler.decision import (
    Decision,
    DecisionKind,
    ReasonCode,
    resize,
    resize_code,
    start,
)
from scheduler.job import JobView, RunningJob
from scheduler.perf import AnalyticalPerfModel
from scheduler.placement import FreeGpus
from scheduler.policies.common import MIN_PRUNE_SLACK, PlanIndex, PlanIndexCache
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
        plan_order: str = "knee",
        queue_order: str = "shortest",
        grow: bool = True,
        restart_cost_s: float = 70.0,
        min_gain: float = 0.3,
        min_hold_s: float = 300.0,
        shrink_long: float = 4.0,
        shrink_delay: float = 10.0,
        loans: bool = True,
        min_saving_s: float = 60.0,
        srpt: bool = True,
        max_slowdown: float = 1.25,
        idle_past_knee: bool = True,
        reclaim: bool = True,
        skip_dominated: bool = True,
        widen_gain: float | None = 0.1,
        exchange_gain: float | None = 0.1,
        widen_min_saving_s: float | None = 0.0,
        minimal_undo: bool = True,
        undo_guard: bool = True,
        seed: int = 0,
    ) -> None:
        if plan_order not in ("ranked", "share", "knee", "knee-share"):
            raise ValueError("plan_order must be one of 'ranked', 'share', 'knee', "
                             f"'knee-share', got {plan_order!r}")
        self.perf: PerfModel = perf if perf is not None else AnalyticalPerfModel()
        self.backfill = backfill
        self.plan_order = plan_order
        if queue_order not in ("fcfs", "shortest"):
            raise ValueError(f"queue_order must be 'fcfs' or 'shortest', got {queue_order!r}")
        self.queue_order = queue_order
        self.grow = grow
        self.restart_cost_s = restart_cost_s
        self.min_gain = min_gain
        self.min_hold_s = min_hold_s
        self.shrink_long = shrink_long
        self.shrink_delay = shrink_delay
        self.loans = loans
        self.min_saving_s = min_saving_s
        self.srpt = srpt
        if not max_slowdown >= 1.0:
            raise ValueError(f"max_slowdown must be >= 1, got {max_slowdown!r}")
        self.max_slowdown = max_slowdown
        self.idle_past_knee = idle_past_knee
        self.reclaim = reclaim
        # the ranked order is the stored ranking (MARP's, or the one the user asked for),
        # followed as it is: only the orders that fall back to it skip dominated plans
        self.skip_dominated = skip_dominated and plan_order != "ranked"
        for name, value in (("widen_gain", widen_gain), ("exchange_gain", exchange_gain)):
            if value is not None and not 0.0 <= value < 1.0:
                raise ValueError(f"{name} must be None or in [0, 1), got {value!r}")
        # a wide start leaves the stored ranking (followed as it is under ``ranked``), and
        # only growth's shrinking takes its GPUs back: start-only HAS never widens
        self.widen_gain = widen_gain if grow and plan_order != "ranked" else None
        self.exchange_gain = exchange_gain
        if widen_min_saving_s is not None and not widen_min_saving_s >= 0.0:
            raise ValueError(f"widen_min_saving_s must be None or >= 0, got "
                             f"{widen_min_saving_s!r}")
        # what a wide start must save over the knee's plan (None: ``min_saving_s``)
        self.widen_min_saving_s = (min_saving_s if widen_min_saving_s is None
                                   else widen_min_saving_s)
        self.minimal_undo = minimal_undo
        self.undo_guard = undo_guard
        self.seed = seed
        self._plans = PlanIndexCache()
        self._loans: dict[str, tuple[str, Plan]] = {}
        """lender job id -> (borrower job id, the lender's plan before the loan)"""
        self._fastest: dict[str, tuple[tuple[Plan, ...], float | None]] = {}
        """job id -> (its plans, the job time of its fastest plan): the SRPT key's constant"""
        self._grow_need: dict[str, tuple[Plan, int, tuple[tuple[str, int], ...]]] = {}
        """job id -> ``_growth`` of its current plan (cached per allocation): how many plans
        lead ``efficient_by_speed`` fast enough to grow into, and per GPU type the fewest
        idle GPUs any of them needs; a job none of whose needs the idle GPUs meet is skipped
        before it is keyed and sorted"""
        self._grow_need_any: dict[str, tuple[Plan, int, tuple[tuple[str, int], ...]]] = {}
        """``_grow_need`` over every plan, the knee ignored (``idle_past_knee``)"""
        self.wake_at: float | None = None
        """When the last call held a growth back only for ``min_hold_s``: the time to ask
        again even if nothing else happens (the controller's optional wake-up)."""

    def decide(
        self,
        state: ClusterState,
        pending: Sequence[JobView],
        running: Sequence[RunningJob],
        now: float,
    ) -> list[Decision]:
        """Start every waiting job whose best satisfiable plan fits the free GPUs (shortest
        predicted first, or FCFS), letting running jobs with less work left grow first
        (``srpt``); then grow running jobs onto idle GPUs, or shrink grown ones for the first
        job that cannot start."""
        self.wake_at = None
        full = state.free_gpus == 0
        if full and not (self.grow and pending and running):
            return []
        if not pending and not (self.grow and running):
            return []
        free = FreeGpus.from_state(state)
        cache = self._plans
        left_of = self._left
        if self.queue_order == "shortest":
            pending = sorted(pending, key=lambda j: (left_of(j), j.submit_time, j.id))
        if full:  # only shrinking grown jobs can make room for the head of the queue
            out = self._shrink_for(pending[0], running, free, state, waiting=len(pending))
            self._prune(pending, running)
            return out
        out: list[Decision] = []
        if self._loans:
            repaid = self._repay(running, pending, free, state)
            if repaid:
                out.extend(repaid)
                moved = {d.job_id for d in repaid}
                running = [r for r in running if r.job.id not in moved]
        waiting = 0
        first_waiting: JobView | None = None
        entries = cache.entries
        free_by_type = free.free_by_type
        # SRPT: a running job that would finish sooner than a waiting one on their fastest
        # plans may grow onto the idle GPUs before that waiting job starts on them
        ahead = self._growable(running, now, free_by_type) \
            if self.srpt and self.grow and running else []
        a = 0
        for k, job in enumerate(pending):
            if a < len(ahead):
                key = left_of(job)
                b = a
                while b < len(ahead) and ahead[b][0] < key:
                    b += 1
                if b > a:
                    out.extend(self._grow(ahead[a:b], free, state))
                    a = b
                    if free.total_free == 0:
                        break
            index = entries.get(job.id)
            if index is None or index.plans is not job.plans:
                index = cache.get(job)
            # quick reject: no GPU type has as many free GPUs as the job's smallest plan on it
            for t, n in index.min_items:
                if free_by_type.get(t, 0) >= n:
                    break
            else:
                waiting += 1
                first_waiting = first_waiting or job
                if not self.backfill:
                    break
                continue
            decision = None
            if self.plan_order == "share":
                # fastest plan within an equal share of the free GPUs among the waiting jobs
                share = max(1, free.total_free // max(1, len(pending) - k))
                fitting = tuple(p for p in index.by_speed if p.num_gpus <= share)
                decision = self._place(job, fitting, free, state)
            elif self.plan_order == "knee":
                decision = self._place(job, index.worth_starting(self.min_saving_s),
                                       free, state)
                if self.reclaim and decision is not None and running and not waiting \
                        and k == len(pending) - 1:
                    taken = self._reclaim(job, index, decision, running, out, free, state)
                    if taken:
                        out.extend(taken[:-1])
                        decision = taken[-1]
            elif self.plan_order == "knee-share":
                share = max(1, free.total_free // max(1, len(pending) - k))
                fitting = tuple(p for p in index.efficient_by_speed if p.num_gpus <= share)
                decision = self._place(job, fitting, free, state)
            if decision is None:
                decision = self._place(job, self._walked(index), free, state, fallback=index)
            if decision is None:
                waiting += 1
                first_waiting = first_waiting or job
                if not self.backfill:
                    break
                continue
            out.append(decision)
            if free.total_free == 0:
                break
        if self.grow and not waiting and free.total_free and running:
            out.extend(self._grow(
                ahead[a:] if self.srpt else self._growable(running, now, free_by_type),
                free, state))
            if self.idle_past_knee and free.total_free:
                # nobody waits: GPUs left idle after growth at the knee go to the jobs that
                # gain most from any faster plan (undone by ``_shrink_for`` when one waits)
                out.extend(self._grow(
                    self._growable([r for r in running if r.job.id not in
                                    {d.job_id for d in out}], now, free_by_type, wide=True),
                    free, state, wide=True))
        elif self.grow and first_waiting is not None and running:
            # not the jobs grown in this call (SRPT growth ahead of the queue): their
            # old GPUs are back in ``free`` and may already be someone's
            decided = {d.job_id for d in out}
            out.extend(self._shrink_for(
                first_waiting, [r for r in running if r.job.id not in decided], free, state,
                waiting=waiting))
        if not waiting and free.total_free:
            # nobody waits and GPUs stay idle after growth: jobs started in this call start
            # wide on them (no restart: they have not launched), then pairs of running jobs
            # may exchange onto an idle GPU type
            if self.widen_gain is not None and pending:
                out = self._widen(out, pending, free, state)
            if self.exchange_gain is not None and self.grow and len(running) > 1 and \
                    free.total_free:
                out.extend(self._exchange(running, {d.job_id for d in out}, free, state, now))
        self._prune(pending, running)
        return out

    def _widen(self, out: list[Decision], pending: Sequence[JobView], free: FreeGpus,
               state: ClusterState) -> list[Decision]:
        """``out`` with each job started in this call (shortest first, as started) moved to
        the fastest plan of any efficiency that the idle GPUs hold, when that runs at least
        ``widen_gain`` faster than the plan it got (re-timed for its placement on both
        sides, the placement guard applied). Called only when nobody waits; the job has not
        launched, so the move costs no restart, and GPUs past its knee are lent like grown
        ones (``_shrink_for`` and ``reclaim`` take them back)."""
        by_id = {j.id: j for j in pending}
        res: list[Decision] = []
        for d in out:
            job = by_id.get(d.job_id)
            here = d.allocation
            if d.kind is not DecisionKind.START or job is None or here is None or \
                    not free.total_free:
                res.append(d)
                continue
            # faster by ``widen_gain``, and saving ``widen_min_saving_s`` (default 0: no
            # restart; ``None``: ``min_saving_s``, as growth asks)
            limit = min(here.plan.step_time_s * (1.0 - self.widen_gain),
                        here.plan.step_time_s - self.widen_min_saving_s
                        / max(job.remaining_steps, 1e-9))
            got = self._fastest_fit(job, self._plans.get(job).by_speed, free, state,
                                    limit, give=here.placement)
            if got is None:
                res.append(d)
                continue
            placed, placement = got
            res.append(start(
                Allocation(job.id, placed, placement),
                f"{d.reason}; widened (nobody waits, {free.total_free + here.num_gpus} GPUs "
                f"idle): {here.plan.label()} -> {placed.label()}, step "
                f"{here.plan.step_time_s:.3f}s -> {placed.step_time_s:.3f}s", d.code))
        return res

    def _fastest_fit(self, job: JobView, plans: Sequence[Plan], free: FreeGpus,
                     state: ClusterState, limit_s: float, give: Placement = (),
                     skip_type: str | None = None) -> tuple[Plan, Placement] | None:
        """The first of ``plans`` (fastest first) not of ``skip_type`` that the free GPUs
        plus ``give`` hold and whose best-fit placement runs it below ``limit_s`` a step and
        at most ``max_slowdown`` times its predicted step time: (the plan re-timed there,
        the placement), its GPUs taken and ``give`` given; else None, ``free`` unchanged."""
        if give:
            free.give(give)
        for plan in plans:
            if plan.step_time_s >= limit_s:
                break
            t, n = plan.gpu_type, plan.num_gpus
            if t == skip_type or free.free(t, plan.required_bytes) < n:
                continue
            placement = free.best_fit(t, n, plan.required_bytes, plan.parallel.tp)
            if placement is None:  # pragma: no cover  (enough free GPUs place it)
                continue
            placed = self.perf.placed_plan(job, plan, placement, state)
            if placed.step_time_s >= limit_s or \
                    placed.step_time_s > self.max_slowdown * plan.step_time_s:
                continue
            free.take(placement)
            return placed, placement
        if give:
            free.take(give)
        return None

    def _exchange(self, running: Sequence[RunningJob], moved: set[str], free: FreeGpus,
                  state: ClusterState, now: float) -> list[Decision]:
        """Nobody waits and GPUs of some type stay idle that no running job grows into (each
        is already on a faster type): move a job A with much work left onto its fastest
        plan on an idle type, so that a job B of A's type with no more work left (SRPT)
        grows onto A's GPUs, when the pair's predicted remaining time, two restarts
        included, drops by more than ``exchange_gain`` times B's and by more than two
        restarts. Jobs moved in this call, held less than ``min_hold_s``, or lending or
        borrowing GPUs are left alone. Returns both resizes per exchange."""
        hold, restart = self.min_hold_s, self.restart_cost_s
        live = [r for r in running if r.job.id not in moved and r.job.id not in self._loans
                and now - r.started_at >= hold]
        if len(live) < 2:
            return []
        left_of = self._left
        # per type, the jobs that have a faster plan of their own type (the B side), by key,
        # with a bound on what the pair can gain through each: its fastest plan's saving
        # less one restart and what the pair must gain (predicted times; placement only
        # slows a plan down). A job A is placed on an idle type only if some B with no more
        # work left has a bound above A's least loss.
        groups: dict[str, list[tuple[float, RunningJob, float]]] = {}
        for r in live:
            cur = r.allocation.plan
            fast = self._plans.get(r.job).fastest_of(cur.gpu_type)
            if not fast or fast[0].step_time_s >= cur.step_time_s:
                continue
            rem = r.job.remaining_steps
            left = rem * cur.step_time_s
            bound = left - rem * fast[0].step_time_s - restart - max(
                self.exchange_gain * left, 2 * restart)
            groups.setdefault(cur.gpu_type, []).append((left_of(r.job), r, bound))
        if not groups:
            return []
        peers_of: dict[str, tuple[list[float], list[float], list[tuple[float, RunningJob,
                                                                          float]]]] = {}
        for t, group in groups.items():
            group.sort(key=itemgetter(0))  # stable: ties keep the running order
            best, acc = [], -math.inf
            for _, _, bound in group:
                acc = max(acc, bound)
                best.append(acc)
            peers_of[t] = ([k for k, _, _ in group], best, group)
        out: list[Decision] = []
        # most work left first: the job that gives up the faster type (SRPT)
        for key_a, a in sorted(((left_of(r.job), r) for r in live), key=lambda kr: -kr[0]):
            if not free.total_free:
                break
            cur_a = a.allocation.plan
            t_a = cur_a.gpu_type
            peers = peers_of.get(t_a)
            if a.job.id in moved or peers is None:
                continue
            reach = bisect_right(peers[0], key_a)
            if not reach:
                continue
            index_a = self._plans.get(a.job)
            # A's least loss: its fastest plan of another type that enough idle GPUs could
            # hold (before placing it), plus a restart
            fit_a = next((p for p in index_a.by_speed if p.gpu_type != t_a
                          and free.free(p.gpu_type, p.required_bytes) >= p.num_gpus), None)
            if fit_a is None or peers[1][reach - 1] <= a.job.remaining_steps * (
                    fit_a.step_time_s - cur_a.step_time_s) + restart:
                continue
            got_a = self._fastest_fit(a.job, index_a.by_speed, free, state, math.inf,
                                      skip_type=t_a)
            if got_a is None:
                continue
            placed_a, placement_a = got_a
            left_a = a.job.remaining_steps * cur_a.step_time_s
            new_a = a.job.remaining_steps * placed_a.step_time_s + restart
            free.give(a.allocation.placement)
            done = False
            for _, b, _ in peers[2][:reach]:
                if b is a or b.job.id in moved:
                    continue
                cur_b = b.allocation.plan
                left_b = b.job.remaining_steps * cur_b.step_time_s
                # B's step time at which the pair gains enough: net > both thresholds
                need = max(self.exchange_gain * left_b, 2 * restart)
                limit_b = (left_a + left_b - new_a - restart - need) / b.job.remaining_steps \
                    if b.job.remaining_steps else 0.0
                if limit_b <= 0.0:
                    continue
                got_b = self._fastest_fit(b.job, self._plans.get(b.job).fastest_of(t_a), free,
                                          state, min(limit_b, cur_b.step_time_s),
                                          give=b.allocation.placement)
                if got_b is None:
                    continue
                placed_b, placement_b = got_b
                new_b = b.job.remaining_steps * placed_b.step_time_s + restart
                after_a = Allocation(a.job.id, placed_a, placement_a)
                after_b = Allocation(b.job.id, placed_b, placement_b)
                why = (f"HAS exchange: nobody waits and {placed_a.gpu_type} GPUs are idle; "
                       f"{a.job.id} {cur_a.label()} -> {placed_a.label()} frees "
                       f"{t_a} GPUs for {b.job.id} {cur_b.label()} -> {placed_b.label()}: "
                       f"predicted remaining time {(left_a + left_b) / 60:.0f} -> "
                       f"{(new_a + new_b) / 60:.0f} min for the pair, restarts included")
                out.append(resize(after_a, why, resize_code(a.allocation, after_a)))
                out.append(resize(after_b, why, resize_code(b.allocation, after_b)))
                moved.update((a.job.id, b.job.id))
                done = True
                break
            if not done:
                free.take(a.allocation.placement)
                free.give(placement_a)
        return out

    def _walked(self, index: PlanIndex) -> tuple[Plan, ...]:
        """The plans the ranked walk tries, in order (and ``_shrink_for`` makes room for):
        all of them, or without the dominated ones (``skip_dominated``)."""
        return index.undominated() if self.skip_dominated else index.plans

    def _shrink_for(self, job: JobView, running: Sequence[RunningJob], free: FreeGpus,
                    state: ClusterState, waiting: int = 1) -> list[Decision]:
        """Undo growth for the head of the queue: when ``job`` cannot start, shrink running
        jobs that hold more GPUs than their cheapest plan of the same type back to it (in
        place, on a subset of their GPUs) if that frees enough for ``job``'s best plan.
        ``waiting``: how many jobs wait in all (``job`` first), for ``undo_guard``."""
        index = self._plans.get(job)
        head_left = self._left(job)
        of_type: dict[str, list[RunningJob]] = {}
        for rj in running:
            of_type.setdefault(rj.allocation.plan.gpu_type, []).append(rj)
        # per type, on first use: its running jobs most GPUs first, and when the first ends
        by_size: dict[str, tuple[list[RunningJob], float]] = {}
        # what waiting costs instead of taking GPUs back (``undo_guard``), worked out on
        # first use: only a grown job's undo asks
        @cache
        def waiting_cost() -> float:
            return self._waiting_cost(index, running, free, waiting)

        undo: dict[str, list[tuple[Placement, Plan]]] = {}  # see ``_smaller_plan``
        for plan in self._walked(index):
            t, need = plan.gpu_type, plan.num_gpus - free.free(plan.gpu_type, plan.required_bytes)
            if need <= 0:
                continue
            shrinks: list[tuple[RunningJob, Plan, Placement]] = []
            freed = 0
            wait_s = plan.job_time_s * job.remaining_fraction
            if t not in by_size:
                rs = of_type.get(t, [])
                by_size[t] = (sorted(rs, key=lambda r: -r.allocation.num_gpus),
                              min((r.job.remaining_steps * r.allocation.plan.step_time_s
                                   for r in rs), default=0.0))
            # until then the first running job of this type ends and frees its GPUs
            runs, expected_wait = by_size[t]
            for rj in runs:
                if self.srpt and self._left(rj.job) <= head_left and \
                        not self._past_knee(rj):
                    continue  # ahead of ``job`` in SRPT order: it keeps its GPUs (growth
                    # past the knee was only lent while nobody waited)
                cur = rj.allocation.plan
                keep, base = self._smaller_plan(rj, cur, plan, need - freed, wait_s,
                                                expected_wait, state, undo,
                                                waiting_cost if self.undo_guard else None)
                if base is None or keep is None:
                    continue
                shrinks.append((rj, base, keep))
                freed += _usable(_minus(rj.allocation.placement, keep), state, plan)
                if freed >= need:
                    break
            if freed < need:
                continue
            out: list[Decision] = []
            for rj, base, keep in shrinks:
                released = _minus(rj.allocation.placement, keep)
                free.give(released)
                placed = self.perf.placed_plan(rj.job, base, keep, state)
                if self.loans and base.gpu_seconds > rj.allocation.plan.gpu_seconds:
                    self._loans.setdefault(rj.job.id, (job.id, rj.allocation.plan))
                after = Allocation(rj.job.id, placed, keep)
                out.append(resize(
                    after,
                    f"HAS shrink: {job.id} (predicted {wait_s / 60:.0f} min) waits for "
                    f"{plan.num_gpus}x{t}; {rj.allocation.plan.label()} -> {placed.label()}, "
                    f"freeing {sum(n for _, n in released)} GPUs",
                    resize_code(rj.allocation, after),
                ))
            return out
        return []

    @staticmethod
    def _waiting_cost(index: PlanIndex, running: Sequence[RunningJob], free: FreeGpus,
                      waiting: int) -> float:
        """What not undoing growth costs the queue (``undo_guard``): the head waits until the
        first running job ends whose GPUs, with the free ones of its type, hold one of the
        head's plans there, and each of the ``waiting`` jobs at least as long."""
        least = index.min_gpus
        soonest = math.inf
        for r in running:
            t = r.allocation.plan.gpu_type
            if t in least and free.free_by_type.get(t, 0) + r.allocation.num_gpus >= least[t]:
                soonest = min(soonest, r.job.remaining_steps * r.allocation.plan.step_time_s)
        return soonest * max(1, waiting)

    def _repay(self, running: Sequence[RunningJob], pending: Sequence[JobView],
               free: FreeGpus, state: ClusterState) -> list[Decision]:
        """Give lenders their GPUs back as soon as their borrower has ended, before any
        waiting job can take them (a loan is only worth it if it is short)."""
        out: list[Decision] = []
        by_id = {r.job.id: r for r in running}
        waiting: set[str] | None = None  # built once, and only if a borrower is not running
        for lender, (borrower, before) in list(self._loans.items()):
            rj = by_id.get(lender)
            if rj is None:
                del self._loans[lender]  # the lender ended (or was stopped)
                continue
            if borrower in by_id:
                continue
            if waiting is None:
                waiting = {j.id for j in pending}
            if borrower in waiting:
                continue
            del self._loans[lender]
            own = rj.allocation.placement
            free.give(own)
            placement = free.best_fit(before.gpu_type, before.num_gpus, before.required_bytes,
                                      before.parallel.tp)
            if placement is None:
                free.take(own)
                continue
            placed = self.perf.placed_plan(rj.job, before, placement, state)
            if placed.step_time_s > self.max_slowdown * before.step_time_s or \
                    placed.step_time_s >= rj.allocation.plan.step_time_s:
                # the GPUs it lent came back fragmented (a group split over nodes by the
                # jobs started meanwhile): no faster than where it runs; growth may move it
                free.take(own)
                continue
            free.take(placement)
            after = Allocation(lender, placed, placement)
            out.append(resize(
                after,
                f"HAS loan repaid: {borrower} ended; {rj.allocation.plan.label()} -> "
                f"{placed.label()} again", resize_code(rj.allocation, after)))
        return out

    def _smaller_plan(self, rj: RunningJob, cur: Plan, wanted: Plan, need: int,
                      wait_s: float, expected_wait_s: float, state: ClusterState,
                      undo: dict[str, list[tuple[Placement, Plan]]] | None = None,
                      waiting_cost: Callable[[], float] | None = None,
                      ) -> tuple[Placement | None, Plan | None]:
        """A smaller plan for running job ``rj`` on a subset of its GPUs (of ``wanted``'s
        type, the waiting job's plan), or (None, None).

        Growth is always undone (a plan of fewer GPUs at no more GPU-seconds): as little of
        it as frees ``need`` GPUs that ``wanted`` can use, i.e. the largest such plan, else
        the one that frees most
        (``minimal_undo``; without it, the job's cheapest plan of the type, however slow).
        A job that was not grown is shrunk only for a much shorter waiting job
        (``shrink_long`` times shorter than its own remaining time, SRPT's rule) and when its
        remaining time dwarfs the restart, if the delay it suffers stays below
        ``expected_wait_s`` (how long the waiting job would wait otherwise); then the
        largest smaller plan that frees ``need`` GPUs."""
        t = wanted.gpu_type
        ridx = self._plans.get(rj.job)
        plans = ridx.by_type.get(t, {})

        def fitting(cand: Plan) -> Placement | None:
            keep = _prefix(rj.allocation.placement, cand.num_gpus, cand.parallel.tp)
            if keep is None or any(state.by_id[node].gpu_memory < cand.required_bytes
                                   for node, _ in keep):
                return None
            return keep

        # ``undo`` keeps per job, within one call, the plans that undo its growth (cheapest
        # first): they depend neither on ``need`` nor on the waiting job
        backs = undo.get(rj.job.id) if undo is not None else None
        if backs is None:
            backs = []
            cur_n, cur_gs = cur.num_gpus, cur.gpu_seconds
            for cand in ridx.cheapest(t):
                if cand.num_gpus < cur_n and cand.gpu_seconds <= cur_gs:
                    keep = fitting(cand)
                    if keep is not None:
                        backs.append((keep, cand))
                        if not self.minimal_undo:
                            break
            if undo is not None:
                undo[rj.job.id] = backs
        if backs:
            if not self.minimal_undo:
                return backs[0]
            by_size = sorted(backs, key=lambda kc: -kc[1].num_gpus)
            pick = next((kc for kc in by_size
                         if _usable(_minus(rj.allocation.placement, kc[0]), state,
                                    wanted) >= need), by_size[-1])
            if waiting_cost is not None:
                # what the lender loses (a restart each way, slower while the waiting job
                # runs) against what waiting for GPUs costs anyway
                loss = 2 * self.restart_cost_s + wait_s * max(
                    0.0, pick[1].step_time_s / cur.step_time_s - 1.0)
                if loss >= waiting_cost():
                    return None, None
            return pick
        left = rj.job.remaining_steps * cur.step_time_s
        if not self.shrink_long or left < max(self.shrink_long * wait_s,
                                              4 * self.restart_cost_s):
            return None, None
        smaller = sorted((p for n, p in plans.items() if n < cur.num_gpus),
                         key=lambda p: -p.num_gpus)
        enough = [p for p in smaller if cur.num_gpus - p.num_gpus >= need]
        for cand in (enough or smaller[::-1]):
            keep = fitting(cand)
            if keep is None:
                continue
            # the shrunk job's delay must stay below what the waiting job would otherwise wait
            if self.loans:
                # a loan: the job runs smaller while the short one runs, then grows back
                delay = wait_s * (cand.step_time_s / cur.step_time_s - 1.0) \
                    + 2 * self.restart_cost_s
            else:
                delay = rj.job.remaining_steps * (cand.step_time_s - cur.step_time_s) \
                    + self.restart_cost_s
            if delay < max(expected_wait_s, self.shrink_delay * wait_s):
                return keep, cand
        return None, None

    def _growable(self, running: Sequence[RunningJob], now: float,
                  free_by_type: Mapping[str, int], wide: bool = False
                  ) -> list[tuple[float, float, RunningJob]]:
        """The running jobs that may grow, each with its sort key and its remaining time on
        its current plan, in the order ``_grow`` tries them: held at least ``min_hold_s``
        (no thrashing; ``wake_at`` records when the others may move), with more than two
        restarts of work left, and with a plan fast enough to move to that the idle GPUs
        (``free_by_type``, which only shrink for the rest of the call) could hold; shortest
        remaining time on the fastest plan first (``srpt``), else longest remaining work
        first. ``wide``: plans past the knee count too (``idle_past_knee``)."""
        order: list[tuple[float, float, RunningJob]] = []
        hold, twice_restart, wake = self.min_hold_s, 2 * self.restart_cost_s, self.wake_at
        left_of = self._left
        needs = self._grow_need_any if wide else self._grow_need
        for rj in running:
            if now - rj.started_at < hold:
                end = rj.started_at + hold  # ask again once it may move
                if wake is None or end < wake:
                    wake = end
                continue
            cur = rj.allocation.plan
            left = rj.job.remaining_steps * cur.step.total_s
            if left < twice_restart:
                continue
            got = needs.get(rj.job.id)
            if got is None or got[0] is not cur:
                got = needs[rj.job.id] = (cur, *self._growth(rj, wide))
            for t, extra in got[2]:
                if free_by_type.get(t, 0) >= extra:
                    order.append((left_of(rj.job) if self.srpt else left, left, rj))
                    break
        self.wake_at = wake
        # stable either way: ties keep their order
        order.sort(key=itemgetter(0), reverse=not self.srpt)
        return order

    def _growth(self, rj: RunningJob, wide: bool = False
                ) -> tuple[int, tuple[tuple[str, int], ...]]:
        """How many plans lead ``rj``'s ``efficient_by_speed`` (``wide``: ``by_speed``) at
        least ``min_gain`` faster than its current one, and per GPU type the fewest idle GPUs
        any of them needs (its own GPUs count on its own type; empty if there is none)."""
        cur = rj.allocation.plan
        index = self._plans.get(rj.job)
        limit = cur.job_time_s * (1.0 - self.min_gain)
        if wide:
            faster, mins = index.any_faster_than(limit)
        else:
            faster = index.faster_than(limit)
            mins = index.efficient_min_gpus[faster]
        own_type, own_n = cur.gpu_type, rj.allocation.num_gpus
        return faster, tuple((t, n - own_n if t == own_type else n) for t, n in mins)

    def _grow(self, order: Sequence[tuple[float, float, RunningJob]], free: FreeGpus,
              state: ClusterState, wide: bool = False) -> list[Decision]:
        """Elastic scale-up: move each job of ``order`` (``_growable``, which cached each
        one's ``_growth`` and gives its remaining time) to a faster plan on its own GPUs plus
        idle ones when the predicted remaining time drops by more than ``min_gain`` and by
        more than twice the checkpoint-restart cost."""
        out: list[Decision] = []
        free_by_type = free.free_by_type
        for _, left, rj in order:
            if free.total_free == 0:
                break
            job, cur = rj.job, rj.allocation.plan
            index = self._plans.get(job)
            # skip the job at once when the GPUs taken since ``_growable`` leave no type
            # enough for any plan fast enough to be worth a move
            _, faster, extra_by_type = (self._grow_need_any if wide
                                        else self._grow_need)[job.id]
            for t, extra in extra_by_type:
                if free_by_type.get(t, 0) >= extra:
                    break
            else:
                continue
            own = rj.allocation.placement
            free.give(own)
            best: tuple[float, Plan, Placement] | None = None
            for plan in (index.by_speed if wide else index.efficient_by_speed)[:faster]:
                n = plan.num_gpus
                if free.free(plan.gpu_type, plan.required_bytes) < n:
                    continue
                placement = free.best_fit(plan.gpu_type, n, plan.required_bytes, plan.parallel.tp)
                if placement is None:
                    continue
                placed = self.perf.placed_plan(job, plan, placement, state)
                new_left = job.remaining_steps * placed.step_time_s + self.restart_cost_s
                if new_left <= left * (1.0 - self.min_gain) and \
                        left - new_left > self.restart_cost_s:
                    best = (new_left, placed, placement)
                    break
            if best is None:
                free.take(own)
                continue
            new_left, placed, placement = best
            free.take(placement)
            after = Allocation(job.id, placed, placement)
            out.append(resize(
                after,
                f"HAS grow: no job waits and {free.total_free + sum(n for _, n in placement)}"
                f" GPUs were idle; {cur.label()} -> {placed.label()} cuts the predicted "
                f"remaining time {left / 60:.0f} -> {new_left / 60:.0f} min incl. "
                f"{self.restart_cost_s:.0f} s checkpoint-restart",
                resize_code(rj.allocation, after),
            ))
        return out

    def _left(self, job: JobView) -> float:
        """``job``'s remaining time on its fastest plan: the queue's and SRPT's key."""
        got = self._fastest.get(job.id)
        if got is None or got[0] is not job.plans:
            by_speed = self._plans.get(job).by_speed if job.plans else ()
            got = self._fastest[job.id] = (job.plans,
                                           by_speed[0].job_time_s if by_speed else None)
        if got[1] is None:
            return float("inf")
        total = job.total_steps  # ``job.remaining_fraction``, inlined (hot path)
        return got[1] * (max(0.0, total - job.steps_done) / total) if total else 0.0

    def _prune(self, pending: Sequence[JobView], running: Sequence[RunningJob]) -> None:
        """Forget ended jobs (both per-job caches), once there are many."""
        self._plans.prune_for(pending, running)
        entries = self._plans.entries
        limit = len(entries) + max(MIN_PRUNE_SLACK, len(entries))
        if len(self._fastest) > limit:
            self._fastest = {k: v for k, v in self._fastest.items() if k in entries}
        if len(self._grow_need) > limit:
            self._grow_need = {k: v for k, v in self._grow_need.items() if k in entries}
        if len(self._grow_need_any) > limit:
            self._grow_need_any = {k: v for k, v in self._grow_need_any.items()
                                   if k in entries}

    def _place(self, job: JobView, plans: Sequence[Plan], free: FreeGpus, state: ClusterState,
               fallback: PlanIndex | None = None) -> Decision | None:
        """Start ``job`` on the first of ``plans`` the free GPUs satisfy whose best-fit
        placement runs it at most ``max_slowdown`` times slower than the plan's predicted
        step time. With ``fallback`` (the job's index; the last walk for this job in a
        call), when every fitting plan is slowed more than that, the one that would end
        soonest, provided it ends no later than the job's slowest plan would."""
        slowed: tuple[Plan, Plan, Placement, int, int] | None = None
        for k, plan in enumerate(plans, start=1):
            n = plan.num_gpus
            ava = free.free(plan.gpu_type, plan.required_bytes)
            if ava < n:
                continue
            placement = free.best_fit(plan.gpu_type, n, plan.required_bytes, plan.parallel.tp)
            if placement is None:  # pragma: no cover  (ava >= n guarantees a placement)
                continue
            placed = self.perf.placed_plan(job, plan, placement, state)
            if placed.step_time_s > self.max_slowdown * plan.step_time_s:
                if fallback is not None and (slowed is None
                                             or placed.job_time_s < slowed[0].job_time_s):
                    slowed = (placed, plan, placement, k, ava)
                continue
            return self._start(job, plans, plan, placed, placement, k, ava, free)
        if slowed is not None and fallback is not None and \
                slowed[0].job_time_s <= fallback.by_speed[-1].job_time_s:
            placed, plan, placement, k, ava = slowed
            return self._start(job, plans, plan, placed, placement, k, ava, free,
                               f"; every fitting plan runs > {self.max_slowdown:g}x slower "
                               "where it fits; this one ends soonest")
        return None

    def _reclaim(self, job: JobView, index: PlanIndex, got: Decision,
                 running: Sequence[RunningJob], out: Sequence[Decision], free: FreeGpus,
                 state: ClusterState) -> list[Decision] | None:
        """The last waiting job, about to start on ``got`` (its GPUs already taken) while
        nobody else waits, when a plan of it at least ``min_gain`` faster is held back only
        by running jobs grown past a plan of fewer GPUs and no more GPU-seconds, with more
        work left than ``job`` (SRPT): undo their growth as a loan (repaid when ``job``
        ends) and start ``job`` on the faster plan, if what ``job`` gains exceeds what the
        lenders lose (their slowdown over ``job``'s run time plus two restarts each).
        Returns the lenders' resizes and the start, or None to keep ``got``."""
        assert got.allocation is not None
        here = got.allocation
        limit = here.plan.job_time_s * (1.0 - self.min_gain)
        faster = [p for p in index.worth_starting(self.min_saving_s) if p.job_time_s < limit]
        if not faster:
            return None
        rem, head_left = job.remaining_fraction, self._left(job)
        moved = {d.job_id for d in out}
        free.give(here.placement)
        for plan in faster:
            t = plan.gpu_type
            need = plan.num_gpus - free.free(t, plan.required_bytes)
            if need <= 0:
                continue
            run_s = plan.job_time_s * rem
            budget = (here.plan.job_time_s - plan.job_time_s) * rem
            lenders: list[tuple[RunningJob, Plan, Placement]] = []
            freed = 0
            for rj in running:
                cur = rj.allocation.plan
                if cur.gpu_type != t or rj.job.id in moved or \
                        (self._left(rj.job) <= head_left and not self._past_knee(rj)):
                    continue
                back = self._undo_growth(rj, need - freed, state)
                if back is None:
                    continue
                keep, base = back
                cost = run_s * (base.step_time_s / cur.step_time_s - 1.0) \
                    + 2 * self.restart_cost_s
                if cost >= budget:
                    continue
                budget -= cost
                lenders.append((rj, base, keep))
                freed += _usable(_minus(rj.allocation.placement, keep), state, plan)
                if freed >= need:
                    break
            if freed < need:
                continue
            released = [_minus(rj.allocation.placement, keep) for rj, _, keep in lenders]
            for r in released:
                free.give(r)
            start_d = self._place(job, (plan,), free, state)
            if start_d is None:
                for r in released:
                    free.take(r)
                continue
            taken: list[Decision] = []
            for rj, base, keep in lenders:
                placed = self.perf.placed_plan(rj.job, base, keep, state)
                if self.loans:
                    self._loans.setdefault(rj.job.id, (job.id, rj.allocation.plan))
                after = Allocation(rj.job.id, placed, keep)
                taken.append(resize(
                    after,
                    f"HAS reclaim: {job.id} (predicted {run_s / 60:.0f} min) starts on "
                    f"{plan.num_gpus}x{t} instead of {here.plan.label()}; "
                    f"{rj.allocation.plan.label()} -> {placed.label()} until it ends",
                    resize_code(rj.allocation, after)))
            taken.append(start_d)
            return taken
        free.take(here.placement)
        return None

    def _past_knee(self, rj: RunningJob) -> bool:
        """Whether ``rj`` runs on a plan past the knee (grown onto GPUs nobody waited for)."""
        return self.idle_past_knee and self._plans.get(rj.job).past_knee(rj.allocation.plan)

    def _undo_growth(self, rj: RunningJob, need: int, state: ClusterState
                     ) -> tuple[Placement, Plan] | None:
        """A plan of fewer GPUs and no more GPU-seconds than ``rj``'s on a prefix of its
        GPUs (its growth undone in place): the largest that frees ``need`` GPUs, else the
        one that frees most; None if there is none."""
        cur = rj.allocation.plan
        cands = sorted((p for p in self._plans.get(rj.job).cheapest(cur.gpu_type)
                        if p.num_gpus < cur.num_gpus and p.gpu_seconds <= cur.gpu_seconds),
                       key=lambda p: -p.num_gpus)
        enough = [p for p in cands if cur.num_gpus - p.num_gpus >= need]
        for cand in (enough or cands[::-1]):
            keep = _prefix(rj.allocation.placement, cand.num_gpus, cand.parallel.tp)
            if keep is not None and all(state.by_id[node].gpu_memory >= cand.required_bytes
                                        for node, _ in keep):
                return keep, cand
        return None

    def _start(self, job: JobView, plans: Sequence[Plan], plan: Plan, placed: Plan,
               placement: Placement, k: int, ava: int, free: FreeGpus, note: str = ""
               ) -> Decision:
        """The start decision for ``job`` on ``placement`` (``placed``: ``plan`` re-timed
        there), taking its GPUs from ``free``."""
        where = describe_placement(placement, free, "best-fit")
        free.take(placement)
        reason = (
            f"HAS: plan #{plan.rank or k} {plan.label()} is the first of {len(plans)} ranked "
            f"plans the free GPUs satisfy ({ava} free {plan.gpu_type} >= {plan.num_gpus}"
            f"{f'; plans #1-#{k - 1} did not fit' if k > 1 else ''}); {where}"
        )
        if abs(placed.step_time_s - plan.step_time_s) > 1e-3 * plan.step_time_s:
            reason += (
                f"; step re-timed for this placement: {plan.step_time_s:.3f}s -> "
                f"{placed.step_time_s:.3f}s"
            )
        return start(Allocation(job.id, placed, placement), reason + note, ReasonCode.PLACE)


def _prefix(placement: Placement, n: int, align: int) -> Placement | None:
    """The first ``n`` GPUs of ``placement`` (node order), whole tp groups per node."""
    out: list[tuple[str, int]] = []
    left = n
    for node, k in placement:
        if left <= 0:
            break
        take = min(k, left)
        if take % align and take != left:
            take -= take % align
        if take:
            out.append((node, take))
            left -= take
    return tuple(out) if left == 0 else None


def _minus(placement: Placement, keep: Placement) -> Placement:
    kept = dict(keep)
    return tuple((node, k - kept.get(node, 0)) for node, k in placement if k - kept.get(node, 0))


def _usable(released: Placement, state: ClusterState, plan: Plan) -> int:
    """The GPUs of ``released`` on nodes whose GPUs have the memory ``plan`` needs."""
    return sum(n for node, n in released if state.by_id[node].gpu_memory >= plan.required_bytes)


@register("has-paper")
def paper_has(perf: PerfModel | None = None, *, seed: int = 0, **kwargs: object) -> HasPolicy:
    """HAS exactly as Algorithm 1 publishes it: FCFS walk, start-only (no growth, no
    shrinking). Kept as a named policy so benchmarks measure what our additions bring."""
    policy = HasPolicy(perf, grow=False, queue_order="fcfs", plan_order="ranked", loans=False,
                       skip_dominated=False, widen_gain=None, exchange_gain=None, seed=seed,
                       **kwargs)  # type: ignore[arg-type]
    policy.name = "has-paper"
    return policy
