"""The engine behind the deadline-aware elastic policies (``elastic`` and ``elasticflow``).

Both follow ElasticFlow's structure (Gu et al., ASPLOS'23) and differ only in the options a job
may run on, how GPUs are placed, and whether a resize must pay for itself:

1. **Admission control with minimum satisfactory shares.** Every admitted deadline job, in
   order of deadline (EDF), reserves its *minimum satisfactory share*: the cheapest option
   (GPU type, count, plan) that finishes its remaining steps by its deadline, held from the
   earliest time the cluster has room for it. Admitted jobs that are running reserve first,
   from now (a share starting later would stop them; see ``_reserve_running``), so one on
   time never loses what it holds. Reservations live in a per-GPU-type
   ``Profile`` of promised GPUs over time. A new job is checked against the profile *after*
   every admitted job has reserved, so admitting it never takes anything promised away; a job
   no option can satisfy is rejected (``mode='reject'``) or kept as best-effort
   (``mode='best_effort'``), with the reason. A share may be reserved as early as possible
   (ElasticFlow) or as late as possible (``reserve_latest``; ``elastic``'s default), which keeps
   the near future free for short jobs while a long job advances on leftovers.
2. **Allocation now.** Jobs whose reservation starts now get it; running jobs keep what they
   hold when it still fits (no restart for nothing); the leftover GPUs go greedily where the
   predicted marginal gain is largest: ``Δ(1/T) / ΔGPUs``, the increase in the job's
   completion rate (T = its predicted remaining time) per added GPU, with diminishing returns
   because the options are the job's step times at each size. Best-effort jobs (no deadline,
   or rejected-as-best-effort, or admitted jobs that fell behind) share these leftovers.
3. **Resizes cost a checkpoint-restart.** Any change of a running job's option is charged
   ``launch_delay_s + restart_delay_s`` in its predicted time, and with ``resize_guard`` a
   running job is only grown when the time saved exceeds ``resize_gain_factor`` × that cost.
4. **Opportunity cost** (``elastic`` only). The deadline ratio counts jobs, so a booking is
   worth one job; admitting a long job whose share holds most of a pool turns away the short
   arrivals that needed it. With ``opportunity_cost`` set, an arrival whose every share would
   turn away more than that many expected arrivals (observed arrival rate × the fraction of
   recent arrivals that what the booking leaves free could no longer serve, integrated over
   the booking) is kept best-effort instead of reserved (Moore–Hodgson's rule for counting
   on-time jobs: give up the long job to keep many short ones), and shares are chosen to turn
   away the fewest.
5. **Deadline-order re-plan** (``elastic`` only). Bookings are made running jobs first, then
   in arrival order, so a job due in half an hour is refused whenever one due tomorrow holds
   the GPUs. With ``replan``, an arrival that does not fit beside the bookings makes every
   booking again in deadline order (``_replan``): a running job with slack may be *paused*
   (stopped, its booking resuming it in time with the restart charged) so that the earlier
   deadline fits. It is admitted only if every job booked before still is. The same re-plan
   rescues an admitted job that the running-first order leaves without a share. Every
   admitted job therefore always holds a booking that meets its deadline (``bookings``); what
   it holds *now* may change. ElasticFlow admits only into what the bookings leave.

The cost of an option, for choosing the minimum share across GPU types, is its GPU-seconds
weighted by the type's value (dense FP16 TFLOP/s from the GPU catalog): "A100-equivalent
GPU-time", so a job that gains little from fast GPUs takes a slow type and leaves the fast
ones to jobs that need them.

Simplifications (documented in docs/deadlines.md): a reservation is one fixed option over one
interval (ElasticFlow's slot-by-slot shares may vary over time); the profile counts GPUs per
type and ignores which node they are on (placement happens afterwards, and a placement that
splits a tensor-parallel group is re-timed by the performance model).
"""

from __future__ import annotations

import heapq
import logging
import math
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

from predictor.plan import Plan
from scheduler.cluster import Allocation, ClusterState, Placement
from scheduler.decision import Decision, reject, resize, start, stop
from scheduler.estimator import StepTimeEstimator
from scheduler.job import JobView, RunningJob
from scheduler.placement import FreeGpus
from scheduler.policies.bookings import (  # noqa: F401  (re-exported)
    TICKS_PER_S,
    Profile,
    tick_seconds,
    ticks_ceil,
    ticks_floor,
)
from scheduler.policies.common import order_for_sequential_apply
from scheduler.policy import PerfModel, PolicyNote

log = logging.getLogger(__name__)

LAUNCH_DELAY_S = 10.0
"""Workers scheduled and stepping (mirrors the simulator's launch delay; kept here so the
scheduler package stays free of orchestrator imports)."""

RESTART_DELAY_S = 60.0
"""Checkpoint save + load on a restart (mirrors the simulator's restart delay)."""

MODES = ("reject", "best_effort")

MAX_SLACK = 0.3
"""The widest safety margin an estimator may widen ``slack`` to (a third of every budget
held back would turn away most deadline jobs)."""


@dataclass(frozen=True, slots=True)
class Option:
    """One way to run a job now: ``num_gpus`` GPUs of ``gpu_type`` with ``plan``."""

    gpu_type: str
    num_gpus: int
    plan: Plan

    @property
    def step_s(self) -> float:
        return self.plan.step_time_s

    def same_shape(self, other: Option | None) -> bool:
        return other is not None and (self.gpu_type, self.num_gpus) == (other.gpu_type,
                                                                        other.num_gpus)

    def label(self) -> str:
        return self.plan.label()


OptionsFn = Callable[[JobView, ClusterState, PerfModel], Mapping[str, tuple[Option, ...]]]
"""A job's options per GPU type, fewest GPUs first, each strictly faster than the previous
(steps timed with the engine's performance model)."""

PlaceFn = Callable[[FreeGpus, Option], Placement | None]
"""Where an option's GPUs go (does not take them)."""


def pareto(options: Sequence[Option]) -> tuple[Option, ...]:
    """Options sorted by GPU count, keeping only those faster than every smaller one (a larger
    allocation that is not faster is never worth its GPUs)."""
    out: list[Option] = []
    for o in sorted(options, key=lambda o: (o.num_gpus, o.step_s)):
        if out and o.num_gpus == out[-1].num_gpus:
            continue
        if not out or o.step_s < out[-1].step_s:
            out.append(o)
    return tuple(out)


def best_plan_options(job: JobView, state: ClusterState,
                      perf: PerfModel) -> dict[str, tuple[Option, ...]]:
    """Every plan the predictor gave, fastest per (type, count): tp/dp/pp all allowed. Each is
    re-timed by ``perf`` on the packed placement of this cluster (the planner timed it on the
    GPU type's default servers, whose network may be faster than this cluster's)."""
    free = FreeGpus.from_state(state)
    best: dict[tuple[str, int], Plan] = {}
    for p in job.plans:
        packed = free.packed(p.gpu_type, p.num_gpus)
        if packed is None:
            continue
        p = perf.placed_plan(job, p, packed, state)
        k = (p.gpu_type, p.num_gpus)
        if k not in best or p.step_time_s < best[k].step_time_s:
            best[k] = p
    by_type: dict[str, list[Option]] = {}
    for (t, n), p in best.items():
        by_type.setdefault(t, []).append(Option(t, n, p))
    return {t: pareto(opts) for t, opts in by_type.items()}


# -- the reservation profile: scheduler/policies/bookings.py -------------------------------------


@dataclass(frozen=True, slots=True)
class Share:
    """A minimum satisfactory share: ``option`` over ticks ``[start, end)``."""

    option: Option
    start: int
    end: int
    cost: float

    @property
    def start_t(self) -> float:
        """Start in seconds."""
        return tick_seconds(self.start)

    @property
    def end_t(self) -> float:
        """End in seconds."""
        return tick_seconds(self.end)


# -- what survives a restart ---------------------------------------------------------------------

STATUSES = ("admitted", "best_effort")


@dataclass(frozen=True, slots=True)
class DeadlineNote:
    """What the engine keeps about one deadline job across a restart (``PolicyNote.data``).

    ``status``: 'admitted' (holds the deadline guarantee), 'best_effort' (was refused one),
    or None (seen as an arrival and rejected, or a job without a deadline pinned to a type);
    ``pinned``: the GPU type it may use (``pin_type``); ``arrival``: its entry in the
    opportunity-cost window, (order of arrival, submit time, fewest GPUs per type that met its
    deadline). Bookings are not kept: ``decide`` makes every booking again on each call from
    the admitted set and the jobs' progress, so they follow from these."""

    status: str | None = None
    pinned: str | None = None
    arrival: tuple[int, float, tuple[tuple[str, int], ...]] | None = None

    def to_data(self) -> dict[str, Any]:
        """The JSON form stored with the job."""
        arr = None if self.arrival is None else [
            self.arrival[0], self.arrival[1], [[t, n] for t, n in self.arrival[2]]]
        return {"status": self.status, "pinned": self.pinned, "arrival": arr}

    @classmethod
    def from_data(cls, data: Mapping[str, Any]) -> DeadlineNote:
        """Read a stored note back; a malformed one raises ``ValueError`` naming the field."""
        status = data.get("status")
        if status is not None and status not in STATUSES:
            raise ValueError(f"deadline note: status {status!r} is not one of "
                             f"{', '.join(STATUSES)} or null")
        pinned = data.get("pinned")
        if pinned is not None and not isinstance(pinned, str):
            raise ValueError(f"deadline note: pinned must be a GPU type name, not {pinned!r}")
        raw = data.get("arrival")
        arrival = None
        if raw is not None:
            try:
                seq, submit, need = raw
                arrival = (int(seq), float(submit),
                           tuple((str(t), int(n)) for t, n in need))
            except (TypeError, ValueError) as exc:
                raise ValueError(f"deadline note: arrival must be [order, submit time, "
                                 f"[[gpu type, gpus], ...]], not {raw!r}") from exc
        return cls(status, pinned, arrival)


# -- the policy engine ---------------------------------------------------------------------------


@dataclass(slots=True)
class _Cand:
    """Per-call working record of one job."""

    job: JobView
    options: Mapping[str, tuple[Option, ...]]
    current: Option | None  # what it holds now (running jobs)
    held: Allocation | None
    target: Option | None = None
    mandatory: bool = False  # the target is its minimum share starting now
    reserved: Share | None = None
    fixed_type: str | None = None  # elasticflow: the one GPU type it may use
    why: list[str] = field(default_factory=list)


class DeadlineEngine:
    """See the module docstring. ``options_fn`` lists a job's options; ``place_fn`` places
    one; ``pin_type`` keeps each job on the GPU type it was admitted to (ElasticFlow's
    homogeneous-pool assumption); ``resize_guard`` requires a grow to save more than
    ``resize_gain_factor`` × the restart cost; ``slack`` is the fraction of the time to the
    deadline kept as a safety margin in admission (prediction and placement error);
    ``fewest_now``: a running job books the fewest GPUs of a type that meet its deadline from
    now (``now_share``), not the cheapest size; ``opportunity_cost`` (``None``: off, as in
    ElasticFlow): an arrival whose every share would turn away more than this many expected
    deadline arrivals (``displaced``, from the last ``arrival_window`` arrivals) is not
    reserved for but kept best-effort (``costly_mode='best_effort'``) or rejected, and shares
    are chosen to turn away the fewest; ``stay_type``: a running job's share from now stays on
    its current GPU type when one there meets its deadline (moving it to a slower, cheaper
    type lengthens its run); ``cross_type_grow``: the leftovers may move a running job onto a
    faster option of another type (under the same restart guard as a grow); ``replan``: an
    arrival that does not fit beside the bookings, or an admitted job left without a share,
    re-plans every booking in deadline order, pausing running jobs with slack
    (``_replan``)."""

    def __init__(
        self,
        name: str,
        perf: PerfModel,
        options_fn: OptionsFn,
        place_fn: PlaceFn,
        *,
        mode: str = "reject",
        reserve_latest: bool = False,
        wake_s: float = 600.0,
        pin_type: bool = False,
        resize_guard: bool = True,
        resize_gain_factor: float = 1.0,
        slack: float = 0.05,
        launch_delay_s: float = LAUNCH_DELAY_S,
        restart_delay_s: float = RESTART_DELAY_S,
        type_value: Callable[[str], float] | None = None,
        fewest_now: bool = False,
        opportunity_cost: float | None = None,
        costly_mode: str = "best_effort",
        arrival_window: int = 64,
        stay_type: bool = False,
        cross_type_grow: bool = False,
        replan: bool = False,
        estimator: StepTimeEstimator | None = None,
        max_slack: float = MAX_SLACK,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if costly_mode not in MODES:
            raise ValueError(f"costly_mode must be one of {MODES}, got {costly_mode!r}")
        self.name = name
        self.perf = perf
        self.options_fn = options_fn
        self.place_fn = place_fn
        self.mode = mode
        self.reserve_latest = reserve_latest
        self.wake_s = wake_s
        self.pin_type = pin_type
        self.resize_guard = resize_guard
        self.resize_gain_factor = resize_gain_factor
        self.base_slack = slack
        self.estimator = estimator
        self.max_slack = max(slack, max_slack)
        self.launch_delay_s = launch_delay_s
        self.restart_delay_s = restart_delay_s
        self.type_value = type_value or _catalog_value
        self.fewest_now = fewest_now
        self.opportunity_cost = opportunity_cost
        self.costly_mode = costly_mode
        self.stay_type = stay_type
        self.cross_type_grow = cross_type_grow
        self.replan = replan
        self._need_counts: list[tuple[tuple[tuple[str, int], ...], int]] | None = None
        self._cap: dict[str, int] = {}
        self._arrivals: deque[tuple[float, dict[str, int]]] = deque(maxlen=arrival_window)
        """Recent deadline arrivals: submit time and the fewest GPUs per type that would have
        met the deadline on arrival (for ``opportunity_cost``)."""
        self._value_cache: dict[str, float] = {}
        self.admitted: set[str] = set()
        """Ids of jobs admitted with a deadline guarantee (kept until they leave)."""
        self.best_effort: set[str] = set()
        """Ids of deadline jobs that could not be admitted and run best-effort."""
        self.pinned: dict[str, str] = {}
        self.bookings: dict[str, Share] = {}
        """Admitted jobs' minimum satisfactory shares as of the last call."""
        self._options: dict[str, tuple[tuple[Plan, ...], Mapping[str, tuple[Option, ...]]]] = {}
        self._now = 0.0
        self._seq = 0
        """Arrivals recorded so far (orders the notes' ``arrival`` entries)."""
        self._arrival_of: dict[str, tuple[int, float, tuple[tuple[str, int], ...]]] = {}
        """Live jobs' entries in the arrival window (for their notes)."""
        self._changed: set[str] = set()
        """Jobs whose note changed since ``take_notes``."""
        self._live: set[str] = set()

    # -- helpers -----------------------------------------------------------------------------
    @property
    def slack(self) -> float:
        """The safety margin in force: ``base_slack``, widened to the estimator's margin of
        uncorrected error when it has one (at most ``max_slack``)."""
        if self.estimator is None:
            return self.base_slack
        return min(self.max_slack, max(self.base_slack, self.estimator.margin()))

    def step_factor(self, job: JobView, option: Option) -> float:
        """Observed / predicted step time the estimator expects for ``job`` on ``option``'s
        GPU type (1 without an estimator)."""
        if self.estimator is None:
            return 1.0
        family = str(job.model.family) if job.model is not None else ""
        return self.estimator.factor(job.id, option.gpu_type, family)

    def value(self, gpu_type: str) -> float:
        v = self._value_cache.get(gpu_type)
        if v is None:
            v = self._value_cache[gpu_type] = self.type_value(gpu_type)
        return v

    def options(self, job: JobView, state: ClusterState) -> Mapping[str, tuple[Option, ...]]:
        hit = self._options.get(job.id)
        if hit is not None and hit[0] is job.plans:
            return hit[1]
        opts = self.options_fn(job, state, self.perf)
        self._options[job.id] = (job.plans, opts)
        return opts

    def overhead(self, job: JobView, option: Option, current: Option | None) -> float:
        """Seconds before ``option`` makes steps: 0 if the job already runs it, a launch for a
        fresh job, a launch plus a checkpoint-restart for a resumed or resized one."""
        if current is not None and option.same_shape(current):
            return 0.0
        if current is not None or job.steps_done > 0:
            return self.launch_delay_s + self.restart_delay_s
        return self.launch_delay_s

    def remaining_s(self, c: _Cand, option: Option, *, stopped: bool = False) -> float:
        """Predicted seconds to finish ``c`` on ``option`` from now; ``stopped``: the job is
        stopped now and resumed later (a checkpoint-restart even on its current shape)."""
        step_s = option.step_s
        if self.estimator is not None:
            step_s *= self.step_factor(c.job, option)
        if stopped and c.current is not None:
            return (c.job.remaining_steps * step_s + self.launch_delay_s
                    + self.restart_delay_s)
        return c.job.remaining_steps * step_s + self.overhead(c.job, option, c.current)

    def _types(self, c: _Cand) -> list[str]:
        if c.fixed_type is not None:
            return [c.fixed_type] if c.fixed_type in c.options else []
        return list(c.options)

    def min_share(self, c: _Cand, profile: Profile, now: float, *,
                  arrival: bool = False) -> Share | None:
        """The cheapest option (value-weighted GPU-seconds) that finishes ``c`` by its
        deadline within what ``profile`` leaves free; ties: the earlier finish.

        Reserved from the earliest time the profile has room, or with ``reserve_latest`` from
        the latest time that still meets the deadline (the near future stays free for
        arrivals; the job runs earlier on leftovers when there are any). A late reservation
        needs a policy call by its start: one starting within ``wake_s`` (at least the tick
        interval) is reserved as early as possible instead.

        With ``opportunity_cost`` set, the share that turns away the fewest expected arrivals
        (``displaced``, to 0.1) is preferred, then the cheapest; for an ``arrival`` being
        admitted, an option turning away more than ``opportunity_cost`` is passed over for
        more GPUs of its type (a shorter booking), and if every option does, the one turning
        away the fewest is returned (the caller then does not reserve it)."""
        job = c.job
        assert job.deadline is not None
        budget = job.deadline - now
        if budget <= 0:
            return None
        latest = now + budget * (1.0 - self.slack)
        latest_k = ticks_floor(latest)
        wake_k = ticks_floor(now + self.wake_s)
        best: tuple[tuple[float, float, int], Share] | None = None
        costly: tuple[float, Share] | None = None
        for t in self._types(c):
            if t not in profile.cap:
                continue
            w = self.value(t)
            for o in c.options[t]:
                # a running job whose share starts later is stopped until then: restart charged
                dur = self.remaining_s(c, o, stopped=True)
                if now + dur > latest:
                    continue  # too slow at this size: try more GPUs
                dur_k = ticks_ceil(dur)
                s = None
                if self.reserve_latest:
                    s = profile.latest_fit(t, o.num_gpus, dur_k, latest_k)
                    if s is not None and s < wake_k:
                        s = None  # too close to wait for: the next call may come too late
                if s is None:
                    s = profile.earliest_fit(t, o.num_gpus, dur_k, latest_k)
                if s is None:
                    continue
                cost = w * o.num_gpus * dur
                cand = Share(o, s, s + dur_k, cost)
                lost = 0.0
                if self.opportunity_cost is not None:
                    lost = self.displaced(cand, self._cap, profile)
                    if arrival and lost > self.opportunity_cost:
                        if costly is None or lost < costly[0]:
                            costly = (lost, cand)
                        continue  # turns away too many arrivals: try more GPUs (shorter)
                key = (round(lost, 1), cost, cand.end)
                if best is None or key < best[0]:
                    best = (key, cand)
                break  # fewest GPUs of this type that meet the deadline
        if best is None and costly is not None:
            return costly[1]
        return best[1] if best is not None else None

    def now_share(self, c: _Cand, profile: Profile, now: float) -> Share | None:
        """A running admitted job's minimum share, starting now (a share starting later would
        stop it, taking away what it holds): the cheapest option, its current one preferred on
        ties, that finishes by the deadline with the safety margin and fits the profile from
        now (a different option is a resize, charged the restart). With ``fewest_now`` only
        the fewest GPUs of each type that meet it are candidates (as in ``min_share``): when a
        job scales nearly linearly every size costs about the same GPU-seconds, and booking
        the largest one would hold GPUs an arrival needs (the job keeps them anyway while
        nobody does). With ``opportunity_cost`` set, the option turning away the fewest
        expected arrivals comes first (``displaced``)."""
        job = c.job
        assert job.deadline is not None and c.current is not None
        budget = job.deadline - now
        if budget <= 0:
            return None
        latest = now + budget * (1.0 - self.slack)
        latest_k = ticks_floor(latest)
        now_k = profile.now
        best: tuple[tuple[float, bool, float, int, bool], Share] | None = None
        for t in self._types(c):
            if t not in profile.cap:
                continue
            w = self.value(t)
            for o in c.options[t]:
                dur = self.remaining_s(c, o)
                if now + dur > latest:
                    continue
                dur_k = ticks_ceil(dur)
                s = profile.earliest_fit(t, o.num_gpus, dur_k, latest_k)
                if s is None or s > now_k:
                    continue
                cost = w * o.num_gpus * dur
                sh = Share(o, now_k, now_k + dur_k, cost)
                lost = 0.0
                if self.opportunity_cost is not None:
                    lost = self.displaced(sh, self._cap, profile)
                key = (round(lost, 1), self.stay_type and t != c.current.gpu_type, cost, sh.end,
                       not o.same_shape(c.current))
                if best is None or key < best[0]:
                    best = (key, sh)
                if self.fewest_now:
                    break  # the fewest GPUs of this type that meet the deadline from now
        return best[1] if best is not None else None

    def _keep_share(self, c: _Cand, now: float) -> Share | None:
        """Its current option from now, if that finishes by the deadline itself (no margin:
        keeping it costs no restart, and a job on time is never stopped for the margin)."""
        cur = c.current
        assert cur is not None and c.job.deadline is not None
        dur = self.remaining_s(c, cur)
        if now + dur > c.job.deadline:
            return None
        now_k = ticks_floor(now)
        return Share(cur, now_k, now_k + ticks_ceil(dur),
                     self.value(cur.gpu_type) * cur.num_gpus * dur)

    def _reserve_running(self, running: Sequence[_Cand], profile: Profile,
                         now: float) -> list[_Cand]:
        """Running admitted jobs reserve first, from now. Each on time first holds its current
        option (they all fit: they run now); then, in deadline order, each gives that back and
        takes its cheapest option from now, or keeps the current one when nothing cheaper
        fits. So no admitted job on time loses what it holds, whatever the others take.
        Returns the jobs left without a share from now."""
        keep: dict[str, Share] = {}
        for c in running:
            sh = self._keep_share(c, now)
            if sh is not None:
                profile.reserve(sh.option.gpu_type, sh.option.num_gpus, sh.start, sh.end)
                keep[c.job.id] = sh
        left: list[_Cand] = []
        for c in running:
            k = keep.get(c.job.id)
            if k is not None:
                profile.reserve(k.option.gpu_type, -k.option.num_gpus, k.start, k.end)
            share = self.now_share(c, profile, now) or k
            if share is None:
                left.append(c)
                continue
            if share is k and not self._meets(c, k.option, now):
                c.why.append("keeps its GPUs: on time, within the safety margin")
            self._reserve(c, share, profile, now)
        return left

    # -- the decision ------------------------------------------------------------------------
    def decide(
        self,
        state: ClusterState,
        pending: Sequence[JobView],
        running: Sequence[RunningJob],
        now: float,
    ) -> list[Decision]:
        """One round, in named phases: book the admitted jobs (deadline order), admit or turn
        away the arrivals, allocate now (the bookings that must start, then running jobs keep,
        shrink or stop), fill the leftover GPUs by marginal gain, and emit the decisions. Every
        job's reasons are collected on its candidate (``_Cand.why``) along the way."""
        if not pending and not running:
            self.bookings = {}
            self._live = set()
            return []
        cap = state.total_by_type()
        self._cap = cap
        self._now = now
        cands = self._candidates(state, pending, running)
        live = set(cands)
        profile = Profile(ticks_floor(now), cap)
        profile, booked = self._book_admitted(cands, profile, cap, now)
        decisions, profile = self._admit_arrivals(cands, live, booked, profile, cap, now)
        free = self._allocate_now(cands, cap, now)
        self._fill(cands, free, now)
        self.bookings = {jid: c.reserved for jid, c in cands.items()
                         if c.reserved is not None and jid in self.admitted}
        decisions.extend(self._decisions(state, cands, now))
        self._forget(live)
        return decisions

    # -- the phases of ``decide`` -------------------------------------------------------------
    def _candidates(self, state: ClusterState, pending: Sequence[JobView],
                    running: Sequence[RunningJob]) -> dict[str, _Cand]:
        """Every running and pending job with its options (and, with ``pin_type``, the GPU
        type it must stay on)."""
        cands: dict[str, _Cand] = {}
        for rj in running:
            a = rj.allocation
            cur = Option(a.plan.gpu_type, a.num_gpus, a.plan)
            cands[rj.job.id] = _Cand(rj.job, self.options(rj.job, state), cur, a)
        for j in pending:
            cands[j.id] = _Cand(j, self.options(j, state), None, None)
        for c in cands.values():
            if self.pin_type:
                c.fixed_type = self.pinned.get(c.job.id) or (
                    c.current.gpu_type if c.current else None)
        return cands

    def _book_admitted(self, cands: dict[str, _Cand], profile: Profile,
                       cap: Mapping[str, int], now: float) -> tuple[Profile, list[_Cand]]:
        """Phase 1: admitted jobs reserve first, in deadline order: running admitted jobs from
        now (``_reserve_running``: a share of theirs starting later would stop them), then the
        queued ones; with ``replan``, a job left without a share re-plans every booking.
        Returns the profile (replaced by a re-plan) and the jobs booked."""
        admitted = sorted((c for c in cands.values() if c.job.id in self.admitted),
                          key=lambda c: (c.job.deadline, c.job.submit_time, c.job.id))
        on = [c for c in admitted if c.current is not None]
        left = self._reserve_running(on, profile, now)
        booked = [c for c in on if c not in left]
        failed: list[_Cand] = []
        for c in left + [c for c in admitted if c.current is None]:
            share = self.min_share(c, profile, now)
            if share is None:
                failed.append(c)
                continue
            self._reserve(c, share, profile, now)
            booked.append(c)
        if failed and self.replan:
            # the running-first order left a booked job without a share: deadline order over
            # every admitted job may still fit them all (a job with slack paused for a while)
            plan = self._replan([*booked, *failed], {c.job.id for c in booked}, cap, now)
            if plan is not None and len(plan) > len(booked):
                profile = self._apply_plan(plan, cands, cap, now)
                booked = [c for c in admitted if c.job.id in plan]
                failed = [c for c in failed if c.job.id not in plan]
        for c in failed:
            c.why.append("admitted but its deadline can no longer be met: best-effort")
        return profile, booked

    def _admit_arrivals(self, cands: dict[str, _Cand], live: set[str], booked: list[_Cand],
                        profile: Profile, cap: Mapping[str, int], now: float
                        ) -> tuple[list[Decision], Profile]:
        """Phase 1, arrivals (FCFS): each deadline job not yet admitted gets a minimum
        satisfactory share beside the bookings (or, with ``replan``, after re-planning them
        all), passes the opportunity-cost test, and is admitted; otherwise it is rejected or
        kept best-effort (``mode`` / ``costly_mode``). A rejected job leaves ``cands`` and
        ``live``; an admitted one joins ``booked``."""
        decisions: list[Decision] = []
        arrivals = [c for c in cands.values() if c.current is None
                    and c.job.deadline is not None and c.job.id not in self.admitted
                    and c.job.id not in self.best_effort]
        arrivals.sort(key=lambda c: (c.job.submit_time, c.job.id))
        for c in arrivals:
            needs = self._needs(c, cap, now) if self.replan or \
                self.opportunity_cost is not None else {}
            if self.opportunity_cost is not None:
                self.record_arrival(c.job.submit_time, needs, job_id=c.job.id)
            share = self.min_share(c, profile, now, arrival=True)
            if share is None and needs and self.replan and (plan := self._replan(
                    [*booked, c], {x.job.id for x in [*booked, c]}, cap, now, c)) is not None:
                profile = self._apply_plan(plan, cands, cap, now)
                self.admitted.add(c.job.id)
                self._changed.add(c.job.id)
                sh = plan[c.job.id]
                c.why.append(f"admitted after re-planning every booking in deadline order: "
                             f"minimum satisfactory share {sh.option.label()} from "
                             f"t={sh.start_t:.0f}s, done by {sh.end_t:.0f}s (deadline "
                             f"{c.job.deadline:.0f}s)")
                booked.append(c)
                continue
            how = self.mode
            if share is None:
                why = self._infeasible_reason(c, now)
            elif self.opportunity_cost is not None and \
                    (lost := self.displaced(share, cap, profile)) > self.opportunity_cost:
                why = (f"booking {share.option.label()} for {share.end_t - share.start_t:.0f}s "
                       f"would turn away ~{lost:.1f} expected arrivals (more than "
                       f"{self.opportunity_cost:g})")
                how = self.costly_mode
                log.debug("%s: %s not reserved: %s", self.name, c.job.id, why)
            else:
                why = None
            if why is not None:
                if how == "reject":
                    decisions.append(reject(c.job.id, f"{self.name}: rejected: {why}"))
                    live.discard(c.job.id)
                    del cands[c.job.id]
                else:
                    self.best_effort.add(c.job.id)
                    self._changed.add(c.job.id)
                    c.why.append(f"admitted best-effort: {why}")
                continue
            self._admit(c, share, profile, now)
            booked.append(c)
        return decisions, profile

    def _allocate_now(self, cands: Mapping[str, _Cand], cap: Mapping[str, int],
                      now: float) -> dict[str, int]:
        """Phase 2: the shares that must start now take their GPUs; running jobs keep what
        they hold when it fits (a mandatory share is swapped for the current allocation only
        when that also meets the deadline), else shrink to what is left of their type (else
        they stop). Returns the GPUs left free per type."""
        free = dict(cap)
        mandatory = sorted((c for c in cands.values() if c.mandatory),
                           key=lambda c: (c.job.deadline, c.job.id))
        for c in mandatory:
            assert c.target is not None
            free[c.target.gpu_type] -= c.target.num_gpus
        if any(v < 0 for v in free.values()):  # pragma: no cover  (the profile prevents it)
            raise AssertionError(f"minimum shares exceed capacity: {free}")
        keepers = [c for c in cands.values() if c.current is not None]
        keepers.sort(key=lambda c: (not c.mandatory, -self._keep_value(c), c.job.id))
        for c in keepers:
            cur = c.current
            assert cur is not None
            if c.target is not None and c.target.same_shape(cur):
                continue
            room = free.get(cur.gpu_type, 0)
            if c.target is not None and c.target.gpu_type == cur.gpu_type:
                room += c.target.num_gpus
            if room < cur.num_gpus:
                continue
            if c.target is not None:
                if not self._meets(c, cur, now) and cur.step_s > c.target.step_s:
                    continue
                free[c.target.gpu_type] += c.target.num_gpus
                c.why.append(f"keeps {cur.label()} (meets its deadline; no restart)")
            c.target = cur
            free[cur.gpu_type] -= cur.num_gpus
        for c in keepers:
            if c.target is not None:
                continue
            cur = c.current
            assert cur is not None
            fit = [o for o in c.options.get(cur.gpu_type, ()) if o.num_gpus <= free[cur.gpu_type]]
            if fit:
                c.target = fit[-1]
                free[cur.gpu_type] -= fit[-1].num_gpus
                c.why.append(f"shrunk to {fit[-1].label()}: its GPUs are promised to deadline "
                             "jobs")
        return free

    def _replan(self, jobs: Sequence[_Cand], must: set[str], cap: Mapping[str, int],
                now: float, arrival: _Cand | None = None,
                ) -> dict[str, Share] | None:
        """Every booking again, in deadline order (EDF) from an empty profile: a running job
        takes a share from now when one fits (``now_share``, else its current option when
        that is on time), otherwise one starting later — it is paused until then, the restart
        charged; a waiting job takes its minimum share. ``None`` when a job in ``must`` gets
        none, or when ``arrival``'s share turns away more than ``opportunity_cost`` expected
        arrivals (measured against every other booking). Admitting in deadline order is what
        lets an arrival due soon run before a job due much later that already holds the GPUs
        (ElasticFlow admits only into what the existing bookings leave, so it must refuse it)."""
        prof = Profile(ticks_floor(now), cap)
        shares: dict[str, Share] = {}
        for x in sorted(jobs, key=lambda x: (x.job.deadline, x.job.submit_time, x.job.id)):
            sh = None
            if x.current is not None:
                sh = self.now_share(x, prof, now)
                if sh is None and (k := self._keep_share(x, now)) is not None and \
                        prof.earliest_fit(k.option.gpu_type, k.option.num_gpus, k.end - k.start,
                                          k.end) == k.start:
                    sh = k
            if sh is None:
                sh = self.min_share(x, prof, now, arrival=x is arrival)
            if sh is None:
                if x.job.id in must:
                    return None
                continue
            prof.reserve(sh.option.gpu_type, sh.option.num_gpus, sh.start, sh.end)
            shares[x.job.id] = sh
        if arrival is not None and self.opportunity_cost is not None:
            sh = shares[arrival.job.id]  # measured against every other booking
            prof.reserve(sh.option.gpu_type, -sh.option.num_gpus, sh.start, sh.end)
            if self.displaced(sh, cap, prof) > self.opportunity_cost:
                return None
        return shares

    def _apply_plan(self, shares: Mapping[str, Share], cands: Mapping[str, _Cand],
                    cap: Mapping[str, int], now: float) -> Profile:
        """Replace every admitted job's booking by ``shares`` (from ``_replan``); returns the
        new profile."""
        profile = Profile(ticks_floor(now), cap)
        for jid, c in cands.items():
            if c.reserved is None and jid not in shares:
                continue
            c.reserved, c.target, c.mandatory = None, None, False
            sh = shares.get(jid)
            if sh is None:
                continue
            self._reserve(c, sh, profile, now)
            if c.current is not None and sh.start > profile.now:
                c.why.append(f"paused until t={sh.start_t:.0f}s for earlier deadlines: resumes "
                             f"on {sh.option.label()}, done by {sh.end_t:.0f}s (deadline "
                             f"{c.job.deadline:.0f}s)")
        return profile

    def _admit(self, c: _Cand, share: Share, profile: Profile, now: float) -> None:
        """Admit ``c`` with the deadline guarantee and reserve its minimum share."""
        assert c.job.deadline is not None
        self.admitted.add(c.job.id)
        self._changed.add(c.job.id)
        if self.pin_type:
            self.pinned[c.job.id] = c.fixed_type = share.option.gpu_type
        c.why.append(f"admitted: minimum satisfactory share {share.option.label()} from "
                     f"t={share.start_t:.0f}s, done by {share.end_t:.0f}s "
                     f"(deadline {c.job.deadline:.0f}s)")
        self._reserve(c, share, profile, now)

    def _reserve(self, c: _Cand, share: Share, profile: Profile, now: float) -> None:
        profile.reserve(share.option.gpu_type, share.option.num_gpus, share.start, share.end)
        c.reserved = share
        if share.start <= profile.now:
            c.target = share.option
            c.mandatory = True

    def _needs(self, c: _Cand, cap: Mapping[str, int], now: float) -> dict[str, int]:
        """Per GPU type, the fewest GPUs that finish ``c`` by its deadline (with the safety
        margin) from now on an otherwise empty cluster; types where none does are left out."""
        d = c.job.deadline
        assert d is not None
        latest = now + (d - now) * (1.0 - self.slack)
        out: dict[str, int] = {}
        for t in self._types(c):
            for o in c.options[t]:
                if o.num_gpus > cap.get(t, 0):
                    break
                if now + self.remaining_s(c, o) <= latest:
                    out[t] = o.num_gpus
                    break
        return out

    def record_arrival(self, submit_time: float, need: Mapping[str, int], *,
                       job_id: str | None = None) -> None:
        """Remember a deadline arrival for the opportunity cost: when it came and, per GPU
        type, the fewest GPUs that met its deadline (empty: none did); with ``job_id``, it
        goes into that job's note too."""
        self._arrivals.append((submit_time, dict(need)))
        self._need_counts = None
        if job_id is not None:
            self._arrival_of[job_id] = (self._seq, submit_time, tuple(sorted(need.items())))
            self._changed.add(job_id)
        self._seq += 1

    # -- restart -----------------------------------------------------------------------------
    def note(self, job_id: str) -> DeadlineNote:
        """What is kept about ``job_id`` now."""
        status = ("admitted" if job_id in self.admitted else
                  "best_effort" if job_id in self.best_effort else None)
        return DeadlineNote(status, self.pinned.get(job_id), self._arrival_of.get(job_id))

    def take_notes(self) -> list[PolicyNote]:
        """The notes of the jobs whose note changed since the last call, in id order (an
        arrival rejected in the last call gets one too: it stays in the arrival window)."""
        out = [PolicyNote(j, self.note(j).to_data()) for j in sorted(self._changed)]
        self._changed.clear()
        if len(self._arrival_of) > len(self._live):
            self._arrival_of = {k: v for k, v in self._arrival_of.items() if k in self._live}
        return out

    def restore(self, jobs: Sequence[JobView], notes: Mapping[str, DeadlineNote]) -> None:
        """Rebuild the state ``decide`` carries between calls from the notes alone: the
        admitted and best-effort sets and the pinned types of the live ``jobs``, and the
        arrival window from every note with an arrival (ended jobs' too), in arrival order.
        The bookings follow at the next ``decide``, which makes every admitted job's booking
        again from its progress, so an admitted job keeps its guarantee and goes through no
        admission; derived caches (options, type values) are refilled on demand."""
        live = {j.id for j in jobs}
        mine = {k: n for k, n in notes.items() if k in live}
        self.admitted = {k for k, n in mine.items() if n.status == "admitted"}
        self.best_effort = {k for k, n in mine.items() if n.status == "best_effort"}
        self.pinned = {k: n.pinned for k, n in mine.items() if n.pinned is not None}
        arrivals = sorted((n.arrival[0], k, n.arrival) for k, n in notes.items()
                          if n.arrival is not None)
        self._arrivals.clear()
        for _, _, (_, submit, need) in arrivals:
            self._arrivals.append((submit, dict(need)))
        self._need_counts = None
        self._seq = arrivals[-1][0] + 1 if arrivals else 0
        self._arrival_of = {k: n.arrival for k, n in mine.items() if n.arrival is not None}
        self._live = live
        self._changed.clear()
        self.bookings = {}

    def displaced(self, share: Share, cap: Mapping[str, int], profile: Profile) -> float:
        """Expected deadline arrivals that ``share``'s booking would turn away, beyond those
        already turned away by what ``profile`` holds: the observed arrival rate (over the
        last ``arrival_window`` arrivals) times, integrated over the booking's interval
        segment by segment, the fraction of those arrivals that the GPUs left free could serve
        without the booking and not with it. The deadline ratio counts jobs, so a booking
        worth one job that costs several is a bad trade (Moore–Hodgson: drop the long job to
        keep many short ones). Future arrivals' own bookings are not known, so this is a lower
        bound. 0 until 8 arrivals have been seen."""
        obs = self._arrivals
        if len(obs) < 8:
            return 0.0
        lost = self._marginal_blocked(share, cap, profile)
        if lost <= 0:
            return 0.0
        span = obs[-1][0] - obs[0][0]
        if span <= 0:
            return math.inf
        return (len(obs) - 1) / span * lost / len(obs)

    def _blocked(self, left: Mapping[str, float]) -> int:
        """Recent arrivals that no GPU type could serve with ``left`` GPUs free (an arrival
        none of whose options met its deadline is never counted)."""
        if self._need_counts is None:
            counts: dict[tuple[tuple[str, int], ...], int] = {}
            for _, need in self._arrivals:
                if need:
                    k = tuple(sorted(need.items()))
                    counts[k] = counts.get(k, 0) + 1
            self._need_counts = list(counts.items())
        return sum(m for need, m in self._need_counts
                   if all(k > left.get(t, 0.0) for t, k in need))

    def _marginal_blocked(self, share: Share, cap: Mapping[str, int], profile: Profile) -> float:
        """Seconds × recent arrivals blocked because of ``share`` and not without it, summed
        over the profile's segments in the booking's interval."""
        t, n = share.option.gpu_type, share.option.num_gpus
        cuts = {share.start, share.end}
        for t2 in cap:
            cuts.update(profile.breakpoints(t2, share.start, share.end))
        total = 0
        for a, b in pairwise(sorted(cuts)):
            left = {t2: float(c - profile.used_at(t2, a)) for t2, c in cap.items()}
            before = self._blocked(left)
            left[t] = left.get(t, 0.0) - n
            total += (b - a) * (self._blocked(left) - before)
        return tick_seconds(total)

    def _meets(self, c: _Cand, option: Option, now: float) -> bool:
        d = c.job.deadline
        if d is None:
            return False
        return now + self.remaining_s(c, option) <= now + (d - now) * (1.0 - self.slack)

    def _keep_value(self, c: _Cand) -> float:
        cur = c.current
        assert cur is not None
        t = self.remaining_s(c, cur)
        return 1.0 / (max(t, 1e-9) * cur.num_gpus)

    def _infeasible_reason(self, c: _Cand, now: float) -> str:
        job = c.job
        assert job.deadline is not None
        budget = (job.deadline - now) * (1.0 - self.slack)
        fastest = min((self.remaining_s(c, o) for t in self._types(c) for o in c.options[t]),
                      default=math.inf)
        if fastest > budget:
            return (f"even its fastest option needs {fastest:.0f}s, {budget:.0f}s usable before "
                    f"the deadline")
        return (f"its options that would finish in {budget:.0f}s need GPUs already promised to "
                f"{len(self.admitted)} admitted job(s)")

    def _gain(self, c: _Cand, frm: Option | None, to: Option) -> float:
        """Completion-rate gain per added GPU of moving ``c`` from ``frm`` to ``to``; 0 when
        the move does not pay for its restart."""
        t_to = self.remaining_s(c, to)
        added = to.num_gpus - (frm.num_gpus if frm is not None and
                               frm.gpu_type == to.gpu_type else 0)
        if added <= 0 or t_to <= 0:
            return 0.0
        if frm is None:
            return 1.0 / (t_to * added)
        t_frm = self.remaining_s(c, frm)
        if self.resize_guard and c.current is not None and frm.same_shape(c.current):
            # t_to already includes the restart: the net saving must exceed the cost again
            saved = t_frm - t_to
            if saved <= self.resize_gain_factor * (self.launch_delay_s + self.restart_delay_s):
                return 0.0
        return max(0.0, 1.0 / t_to - 1.0 / t_frm) / added

    def _best_move(self, c: _Cand, free: Mapping[str, int]) -> tuple[float, Option] | None:
        best: tuple[float, Option] | None = None
        frm = c.target
        if frm is None:
            types = self._types(c)
            if c.current is not None:
                types = [c.current.gpu_type] if c.current.gpu_type in c.options else []
        else:
            types = [frm.gpu_type]
            if self.cross_type_grow and c.fixed_type is None and c.current is not None and \
                    frm.same_shape(c.current):
                types = list(c.options)  # a running job may move onto faster free GPUs
        # an admitted job waiting for a later reservation starts early only on an option that
        # meets its deadline by itself: otherwise it would have to move (and restart) later
        need_meet = frm is None and c.reserved is not None
        now = self._now
        for t in types:
            room = self._room(free, frm, t)
            for o in c.options.get(t, ()):
                if o.num_gpus > room:
                    break
                if not self._is_grow(frm, o):
                    continue
                if need_meet and not self._meets(c, o, now):
                    continue
                g = self._gain(c, frm, o)
                if g > 0 and (best is None or g > best[0]):
                    best = (g, o)
        return best

    @staticmethod
    def _room(free: Mapping[str, int], frm: Option | None, t: str) -> int:
        """GPUs of type ``t`` a job now on ``frm`` could move onto."""
        return free.get(t, 0) + (frm.num_gpus if frm is not None and frm.gpu_type == t else 0)

    @staticmethod
    def _is_grow(frm: Option | None, o: Option) -> bool:
        """More GPUs of the same type, or a faster option on another type."""
        if frm is None:
            return True
        if o.gpu_type == frm.gpu_type:
            return o.num_gpus > frm.num_gpus
        return o.step_s < frm.step_s

    def _fill(self, cands: Mapping[str, _Cand], free: dict[str, int], now: float) -> None:
        heap: list[tuple[float, str, Option]] = []
        for jid, c in cands.items():
            mv = self._best_move(c, free)
            if mv is not None:
                heapq.heappush(heap, (-mv[0], jid, mv[1]))
        while heap:
            _, jid, o = heapq.heappop(heap)
            c = cands[jid]
            if o.num_gpus > self._room(free, c.target, o.gpu_type) or \
                    not self._is_grow(c.target, o):
                mv = self._best_move(c, free)  # stale: recompute against what is left
                if mv is not None:
                    heapq.heappush(heap, (-mv[0], jid, mv[1]))
                continue
            if c.target is not None:
                free[c.target.gpu_type] += c.target.num_gpus
            free[o.gpu_type] -= o.num_gpus
            frm = c.target
            c.target = o
            c.why.append(f"{'grown' if frm else 'given'} {o.label()}: largest marginal gain "
                         "per GPU of the leftover GPUs")
            mv = self._best_move(c, free)
            if mv is not None:
                heapq.heappush(heap, (-mv[0], jid, mv[1]))

    def _decisions(self, state: ClusterState, cands: Mapping[str, _Cand],
                   now: float) -> list[Decision]:
        free = FreeGpus.from_state(state)
        out: list[Decision] = []
        moves: list[_Cand] = []
        for c in cands.values():
            if c.held is None:
                if c.target is not None:
                    moves.append(c)
                continue
            if c.target is None:
                out.append(stop(c.job.id, f"{self.name}: preempted: "
                                          f"{'; '.join(c.why) or 'its GPUs are promised'}"))
                free.give(c.held.placement)
            elif not c.target.same_shape(c.current):
                free.give(c.held.placement)
                moves.append(c)
        # mandatory shares first, then running jobs' resizes, then starts
        moves.sort(key=lambda c: (not c.mandatory, c.held is None,
                                  c.job.deadline if c.job.deadline is not None else math.inf,
                                  c.job.submit_time, c.job.id))
        for c in moves:
            o = c.target
            assert o is not None
            placement = self.place_fn(free, o)
            if placement is None:
                if c.held is not None:
                    out.append(stop(c.job.id, f"{self.name}: cannot place {o.label()} "
                                              "(fragmented); back to the queue"))
                continue
            free.take(placement)
            placed = self.perf.placed_plan(c.job, o.plan, placement, state)
            alloc = Allocation(c.job.id, placed, placement)
            est = self.remaining_s(c, Option(o.gpu_type, o.num_gpus, placed))
            why = "; ".join(c.why) or "allocated"
            ddl = (f"; predicted done at {now + est:.0f}s, deadline {c.job.deadline:.0f}s"
                   if c.job.deadline is not None else "; no deadline")
            if c.held is not None:
                cost = self.launch_delay_s + self.restart_delay_s
                out.append(resize(alloc, f"{self.name}: {why}; resize {c.current.label() if c.current else ''} -> {o.label()} charged {cost:.0f}s checkpoint-restart{ddl}"))  # noqa: E501
            else:
                out.append(start(alloc, f"{self.name}: {why}{ddl}"))
        if self.pin_type:
            for c in cands.values():
                if c.target is not None and c.job.id not in self.pinned:
                    self.pinned[c.job.id] = c.target.gpu_type
                    self._changed.add(c.job.id)
        running = [RunningJob(c.job, c.held, now) for c in cands.values() if c.held is not None]
        return order_for_sequential_apply(state, running, out)

    def _forget(self, live: set[str]) -> None:
        """Drop bookkeeping of jobs that left (finished, cancelled, rejected)."""
        if len(self._options) > len(live) + 1024:
            self._options = {k: v for k, v in self._options.items() if k in live}
        self.admitted &= live
        self.best_effort &= live
        self._live = live
        if len(self.pinned) > len(live) + 1024:
            self.pinned = {k: v for k, v in self.pinned.items() if k in live}


def _catalog_value(gpu_type: str) -> float:
    """A GPU type's value for cost weighting: dense FP16 TFLOP/s from the catalog (1 if
    unknown)."""
    try:
        from predictor.gpus import get_gpu

        return float(get_gpu(gpu_type).fp16_tflops)
    except (KeyError, ValueError):
        return 1.0


def best_fit_place(free: FreeGpus, o: Option) -> Placement | None:
    """Frenzy's best-fit placement, tensor-parallel groups kept inside nodes when possible."""
    return free.best_fit(o.gpu_type, o.num_gpus, o.plan.required_bytes, o.plan.parallel.tp)


class EnginePolicy:
    """A deadline policy that is a configured ``DeadlineEngine``: subclasses set
    ``self.engine`` (and ``self.perf``, ``self.seed``) in ``__init__``."""

    name: str
    engine: DeadlineEngine

    def decide(
        self,
        state: ClusterState,
        pending: Sequence[JobView],
        running: Sequence[RunningJob],
        now: float,
    ) -> list[Decision]:
        """Admit or reject arrivals, keep every admitted job's minimum share, share the rest
        (the engine's policy; see the module docstring)."""
        return self.engine.decide(state, pending, running, now)

    def take_notes(self) -> list[PolicyNote]:
        """What to keep about jobs whose admission changed (``scheduler.policy``)."""
        return self.engine.take_notes()

    def restore(self, jobs: Sequence[JobView], notes: Sequence[PolicyNote]) -> None:
        """Rebuild the admitted set and the arrival window after a restart from the stored
        notes (``DeadlineEngine.restore``); notes of other policies' form raise
        ``ValueError``."""
        self.engine.restore(jobs, {n.job_id: DeadlineNote.from_data(n.data) for n in notes})
