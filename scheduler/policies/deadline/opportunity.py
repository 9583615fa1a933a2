"""The opportunity cost of a booking: how many expected deadline arrivals it turns away.

The deadline ratio counts jobs, so a booking worth one job that costs several is a bad trade
(Moore–Hodgson's rule for counting on-time jobs: give up the long job to keep many short
ones). ``ArrivalWindow`` remembers the recent deadline arrivals (when each came, and the
fewest GPUs per type that met its deadline) and prices a booking against them."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping
from itertools import pairwise

from scheduler.policies.deadline.bookings import Profile, Share, tick_seconds

ArrivalEntry = tuple[int, float, tuple[tuple[str, int], ...]]
"""One arrival as kept in a job's note: (order of arrival, submit time, fewest GPUs per
type that met its deadline)."""


class ArrivalWindow:
    """The last ``size`` deadline arrivals, and what booking a share would cost in them.

    State kept across calls: the window itself (``arrivals``), how many arrivals were ever
    recorded (``seq``, orders the notes) and the live jobs' entries (``entry_of``, for their
    notes); ``restore`` rebuilds all three from the notes after a restart."""

    def __init__(self, size: int) -> None:
        self.arrivals: deque[tuple[float, dict[str, int]]] = deque(maxlen=size)
        """Recent deadline arrivals: submit time and the fewest GPUs per type that would have
        met the deadline on arrival."""
        self.seq = 0
        """Arrivals recorded so far."""
        self.entry_of: dict[str, ArrivalEntry] = {}
        """Live jobs' entries in the window (for their notes)."""
        self._need_counts: list[tuple[tuple[tuple[str, int], ...], int]] | None = None

    def record(self, submit_time: float, need: Mapping[str, int], *,
               job_id: str | None = None) -> None:
        """Remember a deadline arrival: when it came and, per GPU type, the fewest GPUs that
        met its deadline (empty: none did); with ``job_id``, it goes into that job's note."""
        self.arrivals.append((submit_time, dict(need)))
        self._need_counts = None
        if job_id is not None:
            self.entry_of[job_id] = (self.seq, submit_time, tuple(sorted(need.items())))
        self.seq += 1

    def prune(self, live: set[str]) -> None:
        """Drop the entries of jobs that left (their notes were handed out)."""
        if len(self.entry_of) > len(live):
            self.entry_of = {k: v for k, v in self.entry_of.items() if k in live}

    def restore(self, entries: Iterable[tuple[str, ArrivalEntry]], live: set[str]) -> None:
        """Rebuild the window from stored entries (ended jobs' too), in arrival order."""
        ordered = sorted((e[0], k, e) for k, e in entries)
        self.arrivals.clear()
        for _, _, (_, submit, need) in ordered:
            self.arrivals.append((submit, dict(need)))
        self._need_counts = None
        self.seq = ordered[-1][0] + 1 if ordered else 0
        self.entry_of = {k: e for _, k, e in ordered if k in live}

    def displaced(self, share: Share, cap: Mapping[str, int], profile: Profile) -> float:
        """Expected deadline arrivals that ``share``'s booking would turn away, beyond those
        already turned away by what ``profile`` holds: the observed arrival rate (over the
        window) times, integrated over the booking's interval segment by segment, the
        fraction of those arrivals that the GPUs left free could serve without the booking
        and not with it. Future arrivals' own bookings are not known, so this is a lower
        bound. 0 until 8 arrivals have been seen."""
        obs = self.arrivals
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
            for _, need in self.arrivals:
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
