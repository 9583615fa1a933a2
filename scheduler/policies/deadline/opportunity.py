"""The opportunity cost of a booking: how many expected deadline arrivals it turns away.

The deadline ratio counts jobs, so a booking worth one job that costs several is a bad trade
(Moore–Hodgson's rule for counting on-time jobs: give up the long job to keep many short
ones). ``ArrivalWindow`` remembers the recent deadline arrivals (when each came, the fewest
GPUs per type that met its deadline, and the GPU-seconds that share takes) and prices a
booking against them.

A booking's price is the arrivals expected while it holds the GPUs (the rate observed over
the window) that would have found room without it and not with it, but no more of them than
the GPUs it holds could have served: admission is first come, first served, so its
GPU-seconds would have gone to those arrivals in the mix they come in (its GPU-seconds over
their mean GPU-seconds), and the rest would have been turned away whatever was booked.
Without that bound a booking is priced as if every arrival it blocks would otherwise have
run; under overload, when the arrivals want far more GPU-time than the cluster has, that
counts many times over arrivals the booking's GPUs could never have served, and admission
turns away jobs that would have met their deadlines for room that no job then uses.

``RefusalAccount`` checks the prediction against the policy's own bookings: of the arrivals
predicted to use the room of the bookings it refused, how many it then admitted into that
room; the price is scaled by that ratio (at most 1), so when the room goes unused the
policy stops refusing and admits as ElasticFlow does."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping
from itertools import pairwise

from scheduler.policies.deadline.bookings import Profile, Share, tick_seconds

ArrivalEntry = tuple[int, float, tuple[tuple[str, int], ...], tuple[tuple[str, float], ...]]
"""One arrival as kept in a job's note: (order of arrival, submit time, fewest GPUs per
type that met its deadline, the GPU-seconds of that share per type; empty in notes written
before the GPU-seconds were kept)."""

_Group = tuple[dict[str, int], int, dict[str, tuple[float, int]]]
"""Recent arrivals with the same need: the need, how many, and per GPU type the sum of the
GPU-seconds of those that came with that figure and how many did."""


class ArrivalWindow:
    """The last ``size`` deadline arrivals, and what booking a share would cost in them.

    State kept across calls: the window itself (``arrivals`` and ``work``), how many arrivals
    were ever recorded (``seq``, orders the notes) and the live jobs' entries (``entry_of``,
    for their notes); ``restore`` rebuilds all of it from the notes after a restart.
    ``capacity_bound``: price a booking at no more arrivals than its GPUs could have served
    (see the module docstring); off, at the arrival-rate count alone."""

    def __init__(self, size: int, *, capacity_bound: bool = True) -> None:
        self.arrivals: deque[tuple[float, dict[str, int]]] = deque(maxlen=size)
        """Recent deadline arrivals: submit time and the fewest GPUs per type that would have
        met the deadline on arrival."""
        self.work: deque[dict[str, float]] = deque(maxlen=size)
        """The same arrivals' GPU-seconds per type on those fewest GPUs (empty: not known)."""
        self.seq = 0
        """Arrivals recorded so far."""
        self.entry_of: dict[str, ArrivalEntry] = {}
        """Live jobs' entries in the window (for their notes)."""
        self.capacity_bound = capacity_bound
        self._groups: list[_Group] | None = None

    def record(self, submit_time: float, need: Mapping[str, int], *,
               work: Mapping[str, float] | None = None, job_id: str | None = None) -> None:
        """Remember a deadline arrival: when it came and, per GPU type, the fewest GPUs that
        met its deadline (empty: none did) and the GPU-seconds they take (``work``; None:
        not known); with ``job_id``, it goes into that job's note."""
        w = {t: float(v) for t, v in (work or {}).items() if t in need}
        self.arrivals.append((submit_time, dict(need)))
        self.work.append(w)
        self._groups = None
        if job_id is not None:
            self.entry_of[job_id] = (self.seq, submit_time, tuple(sorted(need.items())),
                                     tuple(sorted(w.items())))
        self.seq += 1

    def prune(self, live: set[str]) -> None:
        """Drop the entries of jobs that left (their notes were handed out)."""
        if len(self.entry_of) > len(live):
            self.entry_of = {k: v for k, v in self.entry_of.items() if k in live}

    def restore(self, entries: Iterable[tuple[str, ArrivalEntry]], live: set[str]) -> None:
        """Rebuild the window from stored entries (ended jobs' too), in arrival order."""
        ordered = sorted((e[0], k, e) for k, e in entries)
        self.arrivals.clear()
        self.work.clear()
        for _, _, (_, submit, need, work) in ordered:
            self.arrivals.append((submit, dict(need)))
            self.work.append(dict(work))
        self._groups = None
        self.seq = ordered[-1][0] + 1 if ordered else 0
        self.entry_of = {k: e for _, k, e in ordered if k in live}

    def displaced(self, share: Share, cap: Mapping[str, int], profile: Profile) -> float:
        """Expected deadline arrivals that ``share``'s booking would turn away, beyond those
        already turned away by what ``profile`` holds: the observed arrival rate (over the
        window) times, integrated over the booking's interval segment by segment, the
        fraction of those arrivals that the GPUs left free could serve without the booking
        and not with it. With ``capacity_bound``, in each segment no more of them than the
        booking's GPU-seconds there could have served in the mix they come in (arrivals with
        no GPU-seconds recorded count in full). 0 until 8 arrivals have been seen."""
        obs = self.arrivals
        if len(obs) < 8:
            return 0.0
        span = obs[-1][0] - obs[0][0]
        # per second, the expected arrivals like each recorded one
        rate = (len(obs) - 1) / span / len(obs) if span > 0 and self.capacity_bound else 0.0
        lost, excess = self._marginal_blocked(share, cap, profile, rate)
        if lost <= 0:
            return 0.0
        if span <= 0:
            return math.inf
        return max(0.0, (len(obs) - 1) / span * lost / len(obs) - excess)

    def _group(self) -> list[_Group]:
        """The window's arrivals that some type could serve, grouped by need (cached until the
        next ``record``)."""
        if self._groups is None:
            by: dict[tuple[tuple[str, int], ...], _Group] = {}
            for (_, need), work in zip(self.arrivals, self.work, strict=True):
                if not need:
                    continue  # no option met its deadline: never counted
                k = tuple(sorted(need.items()))
                _, count, works = by.get(k) or (need, 0, {})
                for t, w in work.items():
                    total, known = works.get(t, (0.0, 0))
                    works[t] = (total + w, known + 1)
                by[k] = (need, count + 1, works)
            self._groups = list(by.values())
        return self._groups

    def _marginal_blocked(self, share: Share, cap: Mapping[str, int], profile: Profile,
                          rate: float) -> tuple[float, float]:
        """Seconds × recent arrivals blocked because of ``share`` and not without it, summed
        over the profile's segments in the booking's interval; and how many of the arrivals
        expected there (``rate`` per second for each recorded one; 0: none) the booking's
        GPUs could not have served anyway: in each segment, its GPU-seconds over the mean
        GPU-seconds of the blocked arrivals (served in the order they come, so in the mix
        they come in; an arrival with no GPU-seconds recorded is always counted). An arrival
        is blocked when no type has its fewest GPUs free."""
        t, n = share.option.gpu_type, share.option.num_gpus
        cuts = {share.start, share.end}
        for t2 in cap:
            cuts.update(profile.breakpoints(t2, share.start, share.end))
        groups = self._group()
        total = 0
        excess = 0.0
        for a, b in pairwise(sorted(cuts)):
            left = {t2: c - profile.used_at(t2, a) for t2, c in cap.items()}
            left_t = left.get(t, 0)
            work, known = 0.0, 0  # GPU-seconds on t of the blocked arrivals that have one
            for need, count, by_type in groups:
                k = need.get(t)
                # blocked with the booking and not without it: only type t had room for it
                if k is None or not left_t - n < k <= left_t or any(
                        kk <= left.get(t2, 0) for t2, kk in need.items() if t2 != t):
                    continue
                total += (b - a) * count
                w, m = by_type.get(t, (0.0, 0))
                work, known = work + w, known + m
            if known and work > 0 and rate > 0:
                secs = tick_seconds(b - a)
                expected = rate * secs * known  # of the arrivals with GPU-seconds recorded
                served = n * secs / (work / known)  # the booking's GPU-seconds, FCFS mix
                excess += max(0.0, expected - served)
        return tick_seconds(total), excess


class RefusalAccount:
    """The opportunity cost's own account of its refusals, on its own bookings (no outcomes).

    A refusal gives up a job whose share fitted beside the bookings on the prediction that
    the room it leaves is used by ``displaced`` arrivals over the share's interval. An
    arrival admitted later whose share would not have fitted beside the refused shares is
    one of them. ``factor`` is how many were admitted per one predicted so far (the
    prediction prorated over the part of each refused interval that has passed); with
    ``guard`` the price of a booking is multiplied by it, so a prediction that its own
    bookings do not bear out (the room kept goes unused, as under overload) stops refusing.
    State kept across calls, not across a restart."""

    def __init__(self, *, guard: bool = True) -> None:
        self.guard = guard
        self.refused: list[tuple[Share, float]] = []
        """Refused shares that have not ended yet, with the arrivals predicted to use their
        room."""
        self.expected_done = 0.0
        """Arrivals predicted to use the room of refused shares that have ended."""
        self.repaid = 0
        """Arrivals admitted whose share would not have fitted beside the refused shares."""

    def _prune(self, now: int) -> None:
        live = []
        for sh, e in self.refused:
            if sh.end <= now:
                self.expected_done += e
            else:
                live.append((sh, e))
        self.refused = live

    def factor(self, now: int) -> float:
        """Arrivals admitted into refused room per one predicted so far, at most 1 (1 until
        one arrival is predicted)."""
        if not self.guard:
            return 1.0
        self._prune(now)
        expected = self.expected_done + sum(
            e * max(0, now - sh.start) / max(1, sh.end - sh.start) for sh, e in self.refused)
        return 1.0 if expected < 1.0 else min(1.0, self.repaid / expected)

    def refuse(self, share: Share, predicted: float) -> None:
        """Record a refusal of ``share``'s booking, predicted to leave room for
        ``predicted`` arrivals."""
        self.refused.append((share, predicted))

    def admitted(self, share: Share, profile: Profile) -> None:
        """Record an admission of ``share`` (not yet in ``profile``): one of the predicted
        arrivals when it would not have fitted beside the refused shares."""
        self._prune(profile.now)
        t, n = share.option.gpu_type, share.option.num_gpus
        mine = [r for r, _ in self.refused if r.option.gpu_type == t
                and r.start < share.end and share.start < r.end]
        if not mine:
            return
        cap = profile.cap.get(t, 0)
        points = {share.start, *profile.breakpoints(t, share.start, share.end)}
        points.update(r.start for r in mine if share.start < r.start)
        for x in points:
            used = profile.used_at(t, x) + sum(r.option.num_gpus for r in mine
                                               if r.start <= x < r.end)
            if used + n > cap:
                self.repaid += 1
                return
