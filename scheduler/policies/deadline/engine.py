"""``DeadlineEngine``: one round of a deadline policy as named phases over its parts.

A round reads as Kueue's scheduler loop: **nominate** (every job with its options), **keep
promises** (admitted jobs book first), **admit** (each arrival admitted, kept best-effort or
rejected), **claim** (bookings that start now, running jobs keep or shrink), **fill** (the
leftover GPUs by marginal gain, then wide starts when nobody waits), **preempt and place**
(stops, then starts and resizes). The parts: ``Admitter`` (admission and re-plan, over
the ``Booker`` of shares and the ``ArrivalWindow`` of the opportunity cost), ``Allocator``
and ``LeftoverFill``; what survives between calls is in the ``Ledger``, the
``ArrivalWindow`` and the admitter's ``RefusalAccount`` (the last, and the ledger's
``on_time_only`` marks, not across a restart: ``restore`` leaves them clean)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from predictor.plan import Plan
from scheduler.cluster import ClusterState
from scheduler.decision import Decision
from scheduler.job import JobView, RunningJob
from scheduler.policies.deadline.admission import Admitter
from scheduler.policies.deadline.allocation import Allocator
from scheduler.policies.deadline.bookings import Profile, Share, ticks_floor
from scheduler.policies.deadline.candidates import Candidate, Round
from scheduler.policies.deadline.ledger import DeadlineNote, Ledger
from scheduler.policies.deadline.leftovers import LeftoverFill
from scheduler.policies.deadline.opportunity import ArrivalWindow, RefusalAccount
from scheduler.policies.deadline.options import Option
from scheduler.policies.deadline.shares import Booker
from scheduler.policies.deadline.strategies import DeadlineConfig
from scheduler.policy import PerfModel, PolicyNote


class DeadlineEngine:
    """A deadline policy named ``name``, composed by ``config`` (one strategy per question),
    timing plans with ``perf``. ``bookings``: the admitted jobs' minimum satisfactory shares
    as of the last call."""

    def __init__(self, name: str, perf: PerfModel, config: DeadlineConfig) -> None:
        self.name = name
        self.perf = perf
        self.config = config
        self.prediction = config.prediction
        oc = config.admission.opportunity
        self.ledger = Ledger()
        self.window = ArrivalWindow(oc.window if oc is not None else 64,
                                    capacity_bound=oc is None or oc.capacity_bound)
        self.booker = Booker(config.booking, config.prediction, oc, self.window)
        self.admitter = Admitter(name, config.admission, self.booker, config.prediction,
                                 self.ledger, self.window, pin_type=config.plans.pin_type)
        self.allocator = Allocator(name, config.prediction, config.plans.place, perf)
        self.leftovers = LeftoverFill(config.growth, config.prediction)
        self.bookings: dict[str, Share] = {}
        self.holds_until: float | None = None
        """The latest future start among ``bookings`` (``scheduler.policy.holds_until``)."""
        self._options: dict[str, tuple[tuple[Plan, ...], Mapping[str, tuple[Option, ...]]]] = {}

    def options(self, job: JobView, state: ClusterState) -> Mapping[str, tuple[Option, ...]]:
        """``job``'s options per GPU type (``PlanSpace.options``, cached while its plans are
        the same)."""
        hit = self._options.get(job.id)
        if hit is not None and hit[0] is job.plans:
            return hit[1]
        opts = self.config.plans.options(job, state, self.perf)
        self._options[job.id] = (job.plans, opts)
        return opts

    # -- the round ---------------------------------------------------------------------------
    def decide(
        self,
        state: ClusterState,
        pending: Sequence[JobView],
        running: Sequence[RunningJob],
        now: float,
    ) -> list[Decision]:
        """One round in named phases (see the module docstring). Every job's reasons are
        collected on its candidate (``Candidate.why``) along the way and become the text of
        its decision; the decision's ``ReasonCode`` says which outcome it is."""
        if not pending and not running:
            self.bookings = {}
            self.holds_until = None
            self.ledger.live = set()
            return []
        rnd = self.nominate(state, pending, running, now)
        self.admitter.keep_promises(rnd)
        self.admitter.admit(rnd)
        free = self.allocator.claim(rnd)
        self.leftovers.fill(rnd.cands, free, now)
        self.leftovers.widen(rnd.cands, free, rnd.profile, now)
        self.bookings = {jid: c.reserved for jid, c in rnd.cands.items()
                         if c.reserved is not None and jid in self.ledger.admitted}
        self.holds_until = max((sh.start_t for sh in self.bookings.values()
                                if sh.start_t > now), default=None)
        decisions = rnd.rejected + self.allocator.preempt_and_place(state, rnd)
        self._pin_types(rnd)
        self._forget(set(rnd.cands))
        return decisions

    def nominate(self, state: ClusterState, pending: Sequence[JobView],
                 running: Sequence[RunningJob], now: float) -> Round:
        """Every running and pending job with its options (and, with ``pin_type``, the GPU
        type it must stay on), an empty booking profile of the cluster's GPUs."""
        cands: dict[str, Candidate] = {}
        for rj in running:
            a = rj.allocation
            cur = Option(a.plan.gpu_type, a.num_gpus, a.plan)
            cands[rj.job.id] = Candidate(rj.job, self.options(rj.job, state), cur, a)
        for j in pending:
            cands[j.id] = Candidate(j, self.options(j, state), None, None)
        if self.config.plans.pin_type:
            pinned = self.ledger.pinned
            for c in cands.values():
                fixed = pinned.get(c.job.id) or (c.current.gpu_type if c.current else None)
                if fixed is not None and c.current is None and fixed not in c.options:
                    self._unpin(c, fixed)
                    fixed = None
                c.fixed_type = fixed
        cap = state.total_by_type()
        return Round(now, cap, cands, Profile(ticks_floor(now), cap))

    def _unpin(self, c: Candidate, gpu_type: str) -> None:
        """Free a waiting job from ``gpu_type``, its pinned pool, where it has no option left:
        its plans changed since it was pinned (an out-of-memory re-plan drops the plans that
        no longer fit a GPU of their type), so that pool can never run it again; it may go
        to any type its plans still allow, and is pinned there when it books or starts."""
        self.ledger.unpin(c.job.id)
        c.why.append(f"no plan of it fits {gpu_type} any more (re-planned): may move to "
                     f"{', '.join(sorted(c.options)) or 'no GPU type'}")

    def _pin_types(self, rnd: Round) -> None:
        """With ``pin_type``, a job given GPUs for the first time stays on their type."""
        if not self.config.plans.pin_type:
            return
        for c in rnd.cands.values():
            if c.target is not None and c.job.id not in self.ledger.pinned:
                self.ledger.pin(c.job.id, c.target.gpu_type)

    def _forget(self, live: set[str]) -> None:
        """Drop what is kept about jobs that left (finished, cancelled, rejected)."""
        if len(self._options) > len(live) + 1024:
            self._options = {k: v for k, v in self._options.items() if k in live}
        self.ledger.forget(live)

    # -- what survives a restart ---------------------------------------------------------------
    def note(self, job_id: str) -> DeadlineNote:
        """What is kept about ``job_id`` now."""
        return DeadlineNote(self.ledger.status(job_id), self.ledger.pinned.get(job_id),
                            self.window.entry_of.get(job_id))

    def take_notes(self) -> list[PolicyNote]:
        """The notes of the jobs whose note changed since the last call, in id order (an
        arrival rejected in the last call gets one too: it stays in the arrival window)."""
        out = [PolicyNote(j, self.note(j).to_data()) for j in sorted(self.ledger.changed)]
        self.ledger.changed.clear()
        self.window.prune(self.ledger.live)
        return out

    def restore(self, jobs: Sequence[JobView], notes: Mapping[str, DeadlineNote]) -> None:
        """Rebuild the state ``decide`` carries between calls from the notes alone: the
        admitted and best-effort sets and the pinned types of the live ``jobs``, and the
        arrival window from every note with an arrival (ended jobs' too), in arrival order.
        The bookings follow at the next ``decide``, which makes every admitted job's booking
        again from its progress, so an admitted job keeps its guarantee and goes through no
        admission; derived caches (options, type values) are refilled on demand."""
        live = {j.id for j in jobs}
        self.ledger.restore(notes, live)
        self.admitter.account = RefusalAccount(guard=self.admitter.account.guard)
        self.window.restore(((k, n.arrival) for k, n in notes.items()
                             if n.arrival is not None), live)
        self.bookings = {}
        self.holds_until = None


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
        (``DeadlineEngine.decide``)."""
        return self.engine.decide(state, pending, running, now)

    @property
    def holds_until(self) -> float | None:
        """The latest booked start still to come (``scheduler.policy.holds_until``)."""
        return self.engine.holds_until

    def take_notes(self) -> list[PolicyNote]:
        """What to keep about jobs whose admission changed (``scheduler.policy``)."""
        return self.engine.take_notes()

    def restore(self, jobs: Sequence[JobView], notes: Sequence[PolicyNote]) -> None:
        """Rebuild the admitted set and the arrival window after a restart from the stored
        notes (``DeadlineEngine.restore``); notes of other policies' form raise
        ``ValueError``."""
        self.engine.restore(jobs, {n.job_id: DeadlineNote.from_data(n.data) for n in notes})
