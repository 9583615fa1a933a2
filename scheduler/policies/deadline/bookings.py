"""The booking profile of the deadline policies: GPUs promised per type over time.

A deadline job's minimum satisfactory share (``Share``) is booked as "n GPUs of type T over
[start, end)". ``Profile`` holds every booking as one step function per GPU type and answers
the two questions admission asks: the earliest and the latest start at which n GPUs stay free
for a duration before a given end. Time is integer ticks so that interval arithmetic is exact.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections.abc import Mapping
from dataclasses import dataclass

from scheduler.policies.deadline.options import Option

TICKS_PER_S = 1_000_000
"""The booking profile counts time in integer ticks (microseconds): interval arithmetic on
integers is exact, so a share found free over ``[s, s + d)`` is reserved over exactly that
interval. (With float seconds, ``(e - d) + d`` may land one unit past ``e`` and overlap the busy
segment the fit stopped at.) Seconds become ticks only at the engine's boundary
(``ticks_floor`` / ``ticks_ceil``); a microsecond is far below any scheduling decision, and
1e9 s is 1e15 ticks, still exact in the float it converts from."""


def ticks_floor(t: float) -> int:
    """An instant in ticks, rounded down (a deadline or an end bound never moves later)."""
    return math.floor(t * TICKS_PER_S)


def ticks_ceil(d: float) -> int:
    """A duration in ticks, rounded up (a booking never holds less time than its work)."""
    return math.ceil(d * TICKS_PER_S)


def tick_seconds(k: int) -> float:
    """Ticks back to seconds (for reasons and reports)."""
    return k / TICKS_PER_S


class Profile:
    """Promised GPUs per type over time, in integer ticks (``TICKS_PER_S``): a step function per
    type (breakpoint ticks ``ts`` and GPUs in use from each breakpoint on, ``us``), starting at
    tick ``now``."""

    __slots__ = ("_ts", "_us", "cap", "now")

    def __init__(self, now: int, cap: Mapping[str, int]) -> None:
        self.now = int(now)
        self.cap = dict(cap)
        self._ts: dict[str, list[int]] = {t: [self.now] for t in cap}
        self._us: dict[str, list[int]] = {t: [0] for t in cap}

    def used_at(self, gpu_type: str, t: int) -> int:
        ts = self._ts[gpu_type]
        return self._us[gpu_type][max(0, bisect_right(ts, t) - 1)]

    def earliest_fit(self, gpu_type: str, n: int, dur: int, latest_end: int) -> int | None:
        """The earliest start ``s >= now`` with ``n`` GPUs free over ``[s, s + dur)`` and
        ``s + dur <= latest_end``; ``None`` if there is none."""
        cap = self.cap.get(gpu_type, 0)
        if n > cap or self.now + dur > latest_end:
            return None
        ts, us = self._ts[gpu_type], self._us[gpu_type]
        s: int | None = None
        for i, u in enumerate(us):
            if u + n <= cap:
                if s is None:
                    s = ts[i]
                    if s + dur > latest_end:
                        return None
                if i + 1 == len(ts) or ts[i + 1] >= s + dur:
                    return s
            else:
                s = None
        return s  # pragma: no cover  (the last segment reaches infinity)

    def latest_fit(self, gpu_type: str, n: int, dur: int, latest_end: int) -> int | None:
        """The latest start ``s >= now`` with ``n`` GPUs free over ``[s, s + dur)`` and
        ``s + dur <= latest_end``; ``None`` if there is none."""
        cap = self.cap.get(gpu_type, 0)
        if n > cap or self.now + dur > latest_end:
            return None
        ts, us = self._ts[gpu_type], self._us[gpu_type]
        e = latest_end
        i = bisect_left(ts, e) - 1  # the segment holding the tick just before e
        while i >= 0:
            if us[i] + n > cap:
                e = ts[i]  # the window must end before this busy segment
                if e - dur < self.now:
                    return None
            elif ts[i] <= e - dur:
                return e - dur
            i -= 1
        return None  # pragma: no cover  (ts[0] == now and e - dur >= now end the loop)

    def breakpoints(self, gpu_type: str, start: int, end: int) -> list[int]:
        """The ticks in ``(start, end)`` where the GPUs promised of ``gpu_type`` change."""
        ts = self._ts.get(gpu_type, [])
        i = bisect_right(ts, start)
        j = bisect_left(ts, end)
        return ts[i:j]

    def reserve(self, gpu_type: str, n: int, start: int, end: int) -> None:
        """Promise ``n`` GPUs of ``gpu_type`` over ticks ``[start, end)`` (``n < 0`` gives a
        promise back)."""
        if start < self.now or end < start:
            raise ValueError(f"reservation [{start}, {end}) must lie within [now={self.now}, "
                             "...) and end at or after its start")
        ts, us = self._ts[gpu_type], self._us[gpu_type]
        for t in (start, end):
            i = bisect_right(ts, t) - 1
            if ts[i] != t:
                ts.insert(i + 1, t)
                us.insert(i + 1, us[i])
        for i in range(bisect_left(ts, start), bisect_left(ts, end)):
            us[i] += n
            if us[i] > self.cap[gpu_type]:
                raise ValueError(f"reservation exceeds {gpu_type} capacity at "
                                 f"{tick_seconds(ts[i])}s")


@dataclass(frozen=True, slots=True)
class Share:
    """A minimum satisfactory share: ``option`` over ticks ``[start, end)``; ``cost`` is its
    value-weighted GPU-seconds."""

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
