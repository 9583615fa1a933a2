"""Admission and re-plan: who holds a deadline guarantee, and the bookings that keep it.

Every admitted job holds a booking (its minimum satisfactory share) that meets its deadline;
what it holds *now* may change. Admitted jobs book first, running ones from now, so admitting
an arrival never takes anything promised away. With ``Admission.replan``, an arrival that
does not fit beside the bookings makes every booking again in deadline order (a job due in
half an hour is otherwise refused whenever one due tomorrow holds the GPUs): a running job
with slack may be paused, its booking resuming it in time with the restart charged, and the
arrival is admitted only if every job booked before still is."""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence

from scheduler.decision import ReasonCode, reject
from scheduler.policies.deadline.bookings import Profile, Share, ticks_floor
from scheduler.policies.deadline.candidates import Candidate, Round, deadline_order
from scheduler.policies.deadline.ledger import Ledger
from scheduler.policies.deadline.opportunity import ArrivalWindow, RefusalAccount
from scheduler.policies.deadline.options import Option
from scheduler.policies.deadline.prediction import Prediction
from scheduler.policies.deadline.shares import Booker, reserve
from scheduler.policies.deadline.strategies import Admission

log = logging.getLogger(__name__)


class Admitter:
    """Keeps the admitted jobs' bookings and decides each deadline arrival by the
    ``Admission`` strategy, recording the outcome in the ``Ledger``."""

    def __init__(self, name: str, rule: Admission, booker: Booker, prediction: Prediction,
                 ledger: Ledger, window: ArrivalWindow, *, pin_type: bool) -> None:
        self.name = name
        self.rule = rule
        self.booker = booker
        self.prediction = prediction
        self.ledger = ledger
        self.window = window
        self.pin_type = pin_type
        oc = rule.opportunity
        self.account = RefusalAccount(guard=oc is not None and oc.guard)

    # -- the phases ------------------------------------------------------------------------
    def keep_promises(self, rnd: Round) -> None:
        """Admitted jobs book first, in deadline order: running ones from now
        (``Booker.book_running``: a share of theirs starting later would stop them), then the
        queued ones; with ``replan``, a job left without a share re-plans every booking.
        Fills ``rnd.booked``; a job no booking fits any more runs best-effort."""
        booker, now, cap, profile = self.booker, rnd.now, rnd.cap, rnd.profile
        admitted = sorted((c for c in rnd.cands.values() if c.job.id in self.ledger.admitted),
                          key=deadline_order)
        on = [c for c in admitted if c.current is not None]
        left = booker.book_running(on, profile, now, cap)
        booked = [c for c in on if c not in left]
        failed: list[Candidate] = []
        for c in left + [c for c in admitted if c.current is None]:
            share = booker.min_share(c, profile, now, cap)
            if share is None:
                failed.append(c)
                continue
            if self.pin_type and c.fixed_type is None:  # unpinned by a re-plan of its plans
                self.ledger.pin(c.job.id, share.option.gpu_type)
                c.fixed_type = share.option.gpu_type
            reserve(c, share, profile)
            booked.append(c)
        if failed and self.rule.replan:
            # the running-first order left a booked job without a share: deadline order over
            # every admitted job may still fit them all (a job with slack paused for a while)
            plan = self.replan([*booked, *failed], {c.job.id for c in booked}, cap, now)
            if plan is not None and len(plan) > len(booked):
                rnd.profile = self._apply_plan(plan, rnd.cands, cap, now)
                booked = [c for c in admitted if c.job.id in plan]
                failed = [c for c in failed if c.job.id not in plan]
        for c in failed:
            c.why.append("admitted but its deadline can no longer be met: best-effort")
        rnd.booked = booked

    def admit(self, rnd: Round) -> None:
        """Each deadline arrival not seen before (FCFS) gets a minimum satisfactory share
        beside the bookings (or, with ``replan``, after re-planning them all), passes the
        opportunity-cost test, and is admitted; otherwise it is rejected (it leaves
        ``rnd.cands``; its decision goes to ``rnd.rejected``) or kept best-effort, as
        ``Admission.infeasible`` (``within_margin`` where only the safety margin refuses it)
        / ``OpportunityCost.costly`` say. First, a waiting job kept best-effort only while it
        can be on time that no longer can is let go (``_lapse``)."""
        ledger, oc, now, cap = self.ledger, self.rule.opportunity, rnd.now, rnd.cap
        self._lapse(rnd)
        arrivals = [c for c in rnd.cands.values() if c.current is None
                    and c.job.deadline is not None and c.job.id not in ledger.admitted
                    and c.job.id not in ledger.best_effort]
        arrivals.sort(key=lambda c: (c.job.submit_time, c.job.id))
        for c in arrivals:
            fewest = self._needs(c, cap, now) if self.rule.replan or oc is not None else {}
            needs = {t: o.num_gpus for t, o in fewest.items()}
            if oc is not None:
                self.window.record(c.job.submit_time, needs, job_id=c.job.id, work={
                    t: o.num_gpus * self.prediction.remaining_s(c, o)
                    for t, o in fewest.items()})
                ledger.changed.add(c.job.id)
            share = self.booker.min_share(c, rnd.profile, now, cap, arrival=True)
            if share is None and needs and self.rule.replan and (plan := self.replan(
                    [*rnd.booked, c], {x.job.id for x in [*rnd.booked, c]}, cap, now,
                    c)) is not None:
                rnd.profile = self._apply_plan(plan, rnd.cands, cap, now)
                ledger.admit(c.job.id)
                sh = plan[c.job.id]
                c.why.append(f"admitted after re-planning every booking in deadline order: "
                             f"minimum satisfactory share {sh.option.label()} from "
                             f"t={sh.start_t:.0f}s, done by {sh.end_t:.0f}s (deadline "
                             f"{c.job.deadline:.0f}s)")
                rnd.booked.append(c)
                continue
            how, code = self.rule.infeasible, ReasonCode.REJECT
            on_time_only = False
            if share is None:
                why = self._infeasible_reason(c, now)
                if self.rule.within_margin is not None and self._only_margin(c, now):
                    how, on_time_only = self.rule.within_margin, True
                    why += (" (on time without the safety margin: runs only on an option "
                            "that is)")
            elif oc is not None and (lost := self.window.displaced(share, cap, rnd.profile)) \
                    * self.account.factor(rnd.profile.now) > oc.limit:
                why = (f"booking {share.option.label()} for {share.end_t - share.start_t:.0f}s "
                       f"would turn away ~{lost:.1f} expected arrivals (more than "
                       f"{oc.limit:g})")
                how, code = oc.costly, ReasonCode.TOO_COSTLY
                self.account.refuse(share, lost)
                log.debug("%s: %s not reserved: %s", self.name, c.job.id, why)
            else:
                why = None
            if why is not None:
                if how == "reject":
                    rnd.rejected.append(reject(c.job.id, f"{self.name}: rejected: {why}", code))
                    del rnd.cands[c.job.id]
                else:
                    ledger.refuse(c.job.id, on_time_only=on_time_only)
                    c.on_time_only = on_time_only
                    c.why.append(f"admitted best-effort: {why}")
                continue
            if oc is not None:
                self.account.admitted(share, rnd.profile)
            self._admit(c, share, rnd.profile)
            rnd.booked.append(c)

    # -- re-planning in deadline order -----------------------------------------------------
    def replan(self, jobs: Sequence[Candidate], must: set[str], cap: Mapping[str, int],
               now: float, arrival: Candidate | None = None) -> dict[str, Share] | None:
        """Every booking again, in deadline order (EDF) from an empty profile: a running job
        takes a share from now when one fits (``now_share``, else its current option when
        that is on time), otherwise one starting later — it is paused until then, the restart
        charged; a waiting job takes its minimum share. ``None`` when a job in ``must`` gets
        none, or when ``arrival``'s share turns away more than the opportunity-cost limit
        (measured against every other booking). Admitting in deadline order is what lets an
        arrival due soon run before a job due much later that already holds the GPUs
        (ElasticFlow admits only into what the existing bookings leave, so it must refuse
        it)."""
        booker = self.booker
        prof = Profile(ticks_floor(now), cap)
        shares: dict[str, Share] = {}
        for x in sorted(jobs, key=deadline_order):
            sh = None
            if x.current is not None:
                sh = booker.now_share(x, prof, now, cap)
                if sh is None and (k := booker.keep_share(x, now)) is not None and \
                        prof.earliest_fit(k.option.gpu_type, k.option.num_gpus, k.end - k.start,
                                          k.end) == k.start:
                    sh = k
            if sh is None:
                sh = booker.min_share(x, prof, now, cap, arrival=x is arrival)
            if sh is None:
                if x.job.id in must:
                    return None
                continue
            prof.reserve(sh.option.gpu_type, sh.option.num_gpus, sh.start, sh.end)
            shares[x.job.id] = sh
        oc = self.rule.opportunity
        if arrival is not None and oc is not None:
            sh = shares[arrival.job.id]  # measured against every other booking
            prof.reserve(sh.option.gpu_type, -sh.option.num_gpus, sh.start, sh.end)
            if self.window.displaced(sh, cap, prof) > oc.limit:
                return None
        return shares

    def _apply_plan(self, shares: Mapping[str, Share], cands: Mapping[str, Candidate],
                    cap: Mapping[str, int], now: float) -> Profile:
        """Replace every admitted job's booking by ``shares`` (from ``replan``); returns the
        new profile."""
        profile = Profile(ticks_floor(now), cap)
        for jid, c in cands.items():
            if c.reserved is None and jid not in shares:
                continue
            c.reserved, c.target, c.mandatory = None, None, False
            sh = shares.get(jid)
            if sh is None:
                continue
            reserve(c, sh, profile)
            if c.current is not None and sh.start > profile.now:
                c.why.append(f"paused until t={sh.start_t:.0f}s for earlier deadlines: resumes "
                             f"on {sh.option.label()}, done by {sh.end_t:.0f}s (deadline "
                             f"{c.job.deadline:.0f}s)")
        return profile

    # -- one arrival -----------------------------------------------------------------------
    def _admit(self, c: Candidate, share: Share, profile: Profile) -> None:
        """Admit ``c`` with the deadline guarantee and reserve its minimum share."""
        assert c.job.deadline is not None
        self.ledger.admit(c.job.id)
        if self.pin_type:
            self.ledger.pin(c.job.id, share.option.gpu_type)
            c.fixed_type = share.option.gpu_type
        c.why.append(f"admitted: minimum satisfactory share {share.option.label()} from "
                     f"t={share.start_t:.0f}s, done by {share.end_t:.0f}s "
                     f"(deadline {c.job.deadline:.0f}s)")
        reserve(c, share, profile)

    def _needs(self, c: Candidate, cap: Mapping[str, int], now: float) -> dict[str, Option]:
        """Per GPU type, the option with the fewest GPUs that finishes ``c`` by its deadline
        (with the safety margin) from now on an otherwise empty cluster; types where none
        does are left out."""
        d = c.job.deadline
        assert d is not None
        pred = self.prediction
        latest = now + (d - now) * (1.0 - pred.margin)
        out: dict[str, Option] = {}
        for t in c.types():
            for o in c.options[t]:
                if o.num_gpus > cap.get(t, 0):
                    break
                if now + pred.remaining_s(c, o) <= latest:
                    out[t] = o
                    break
        return out

    def _on_time(self, c: Candidate, now: float) -> bool:
        """Whether some option of ``c`` from now finishes by its deadline itself (no margin)."""
        return any(self.prediction.meets(c, o, now, margin=False)
                   for t in c.types() for o in c.options[t])

    def _only_margin(self, c: Candidate, now: float) -> bool:
        """Whether only the safety margin refuses ``c`` a share: on an otherwise empty
        cluster no option finishes it with the margin held back, but one by the deadline
        itself (a job the bookings crowd out is not one)."""
        pred = self.prediction
        opts = [o for t in c.types() for o in c.options[t]]
        return not any(pred.meets(c, o, now) for o in opts) and self._on_time(c, now)

    def _lapse(self, rnd: Round) -> None:
        """Waiting jobs kept best-effort only while they can be on time
        (``Ledger.on_time_only``): one that can still be is marked so (it starts only on an
        on-time option); one that no longer can is rejected if it never ran (a certain miss
        that would only queue), else kept as plain best-effort (it has made progress)."""
        ledger = self.ledger
        for jid in sorted(ledger.on_time_only):
            c = rnd.cands.get(jid)
            if c is None or c.current is not None:
                continue
            if self._on_time(c, rnd.now):
                c.on_time_only = True
                continue
            ledger.on_time_only.discard(jid)
            if c.job.steps_done > 0:
                c.why.append("best-effort: its deadline can no longer be met")
                continue
            ledger.best_effort.discard(jid)
            ledger.changed.add(jid)
            rnd.rejected.append(reject(jid, f"{self.name}: rejected: no option finishes it "
                                            "by its deadline any more (it was kept "
                                            "best-effort while one could)"))
            del rnd.cands[jid]

    def _infeasible_reason(self, c: Candidate, now: float) -> str:
        job = c.job
        assert job.deadline is not None
        pred = self.prediction
        budget = (job.deadline - now) * (1.0 - pred.margin)
        fastest = min((pred.remaining_s(c, o) for t in c.types() for o in c.options[t]),
                      default=math.inf)
        if fastest > budget:
            return (f"even its fastest option needs {fastest:.0f}s, {budget:.0f}s usable before "
                    f"the deadline")
        return (f"its options that would finish in {budget:.0f}s need GPUs already promised to "
                f"{len(self.ledger.admitted)} admitted job(s)")
