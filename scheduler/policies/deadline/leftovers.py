"""Filling the leftover GPUs: what nobody is promised goes where it buys the most.

Greedily, the job whose next larger option gains the most completion rate per added GPU,
``Δ(1/T) / ΔGPUs`` (T its predicted remaining time, restart included), takes it; returns
diminish because the options are the job's step times at each size. Best-effort jobs (no
deadline, refused a guarantee, or fallen behind) share these leftovers with admitted jobs
that may run ahead of their bookings. With ``Growth.widen_gain``, when nobody waits and
GPUs stay idle after that, the jobs being started move to a faster option on them (``widen``),
never one that would break a booking."""

from __future__ import annotations

import heapq
from collections.abc import Mapping

from scheduler.policies.deadline.bookings import Profile, ticks_ceil, ticks_floor
from scheduler.policies.deadline.candidates import Candidate
from scheduler.policies.deadline.options import Option
from scheduler.policies.deadline.prediction import Prediction
from scheduler.policies.deadline.strategies import Growth


class LeftoverFill:
    """Hands out the leftover GPUs by marginal gain, growing or moving running jobs as the
    ``Growth`` strategy allows."""

    def __init__(self, growth: Growth, prediction: Prediction) -> None:
        self.growth = growth
        self.prediction = prediction

    def fill(self, cands: Mapping[str, Candidate], free: dict[str, int], now: float) -> None:
        """Give ``free`` (GPUs per type, taken as they go) to the candidates, largest marginal
        gain first, each move re-priced against what is left."""
        heap: list[tuple[float, str, Option]] = []
        for jid, c in cands.items():
            mv = self._best_move(c, free, now)
            if mv is not None:
                heapq.heappush(heap, (-mv[0], jid, mv[1]))
        while heap:
            _, jid, o = heapq.heappop(heap)
            c = cands[jid]
            if o.num_gpus > _room(free, c.target, o.gpu_type) or not _is_grow(c.target, o):
                mv = self._best_move(c, free, now)  # stale: recompute against what is left
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
            mv = self._best_move(c, free, now)
            if mv is not None:
                heapq.heappush(heap, (-mv[0], jid, mv[1]))

    def widen(self, cands: Mapping[str, Candidate], free: dict[str, int], profile: Profile,
              now: float) -> None:
        """Wide starts (``Growth.widen_gain``): when every job has GPUs after the fill (none
        queued, refused or waiting for a later booking) and some stay idle, each job being
        started in this call (shortest first) moves to the fastest option the idle GPUs and
        its own hold that finishes it at least ``widen_gain`` sooner. It has not launched, so
        the move costs no restart. An admitted job moves only onto an option that meets its
        deadline and whose type holds, from now and beside every other booking in
        ``profile``, a share of at most that many GPUs meeting it: running jobs book first
        from now at the next call, so that share is what it will book there, and no other
        job's booking is broken. The GPUs past that share are lent like grown ones: a later
        booking takes them back (``Allocator.claim`` shrinks it, charging the restart)."""
        g = self.growth.widen_gain
        if g is None or not any(free.values()) or \
                any(c.target is None for c in cands.values()):
            return
        pred = self.prediction
        starting = sorted((c for c in cands.values() if c.held is None and c.target is not None),
                          key=lambda c: (pred.remaining_s(c, c.target), c.job.id))
        for c in starting:
            frm = c.target
            assert frm is not None
            t_frm = pred.remaining_s(c, frm)
            best: tuple[float, Option] | None = None
            for t in c.types():
                room = _room(free, frm, t)
                for o in c.options.get(t, ()):
                    if o.num_gpus > room:
                        break
                    t_o = pred.remaining_s(c, o)
                    if t_o >= t_frm or t_o > (1.0 - g) * t_frm or \
                            (best is not None and t_o >= best[0]):
                        continue
                    if c.reserved is not None and not self._keeps_bookings(c, o, profile,
                                                                           now):
                        continue
                    if c.on_time_only and not pred.meets(c, o, now, margin=False):
                        continue
                    best = (t_o, o)
            if best is None:
                continue
            o = best[1]
            free[frm.gpu_type] += frm.num_gpus
            free[o.gpu_type] -= o.num_gpus
            c.narrow, c.target = frm, o
            c.why.append(f"started wide on {o.label()} instead of {frm.label()} (nobody "
                         f"waits, GPUs idle): predicted {t_frm:.0f}s -> {best[0]:.0f}s")

    def _keeps_bookings(self, c: Candidate, o: Option, profile: Profile, now: float) -> bool:
        """Whether admitted ``c`` may start on ``o``: it meets the deadline (margin held back),
        and ``o``'s type has, beside every booking but ``c``'s own, room from now for an
        option of at most ``o.num_gpus`` GPUs that does (what ``c`` books there next)."""
        pred = self.prediction
        if not pred.meets(c, o, now):
            return False
        own = c.reserved
        assert own is not None and c.job.deadline is not None
        latest_k = ticks_floor(now + (c.job.deadline - now) * (1.0 - pred.margin))
        profile.reserve(own.option.gpu_type, -own.option.num_gpus, own.start, own.end)
        try:
            for p in c.options.get(o.gpu_type, ()):
                if p.num_gpus > o.num_gpus:
                    break
                if not pred.meets(c, p, now):
                    continue
                dur_k = ticks_ceil(pred.remaining_s(c, p))
                if profile.earliest_fit(o.gpu_type, p.num_gpus, dur_k, latest_k) == \
                        profile.now:
                    return True
            return False
        finally:
            profile.reserve(own.option.gpu_type, own.option.num_gpus, own.start, own.end)

    def gain(self, c: Candidate, frm: Option | None, to: Option) -> float:
        """Completion-rate gain per added GPU of moving ``c`` from ``frm`` to ``to``; 0 when
        the move does not pay for its restart."""
        pred = self.prediction
        t_to = pred.remaining_s(c, to)
        added = to.num_gpus - (frm.num_gpus if frm is not None and
                               frm.gpu_type == to.gpu_type else 0)
        if added <= 0 or t_to <= 0:
            return 0.0
        if frm is None:
            return 1.0 / (t_to * added)
        t_frm = pred.remaining_s(c, frm)
        if self.growth.guard and c.current is not None and frm.same_shape(c.current):
            # t_to already includes the restart: the net saving must exceed the cost again
            saved = t_frm - t_to
            if saved <= self.growth.gain_factor * (pred.launch_delay_s + pred.restart_delay_s):
                return 0.0
        return max(0.0, 1.0 / t_to - 1.0 / t_frm) / added

    def _best_move(self, c: Candidate, free: Mapping[str, int],
                   now: float) -> tuple[float, Option] | None:
        best: tuple[float, Option] | None = None
        frm = c.target
        if frm is None:
            types = c.types()
            if c.current is not None:
                types = [c.current.gpu_type] if c.current.gpu_type in c.options else []
        else:
            types = [frm.gpu_type]
            if self.growth.cross_type and c.fixed_type is None and c.current is not None and \
                    frm.same_shape(c.current):
                types = list(c.options)  # a running job may move onto faster free GPUs
        # an admitted job waiting for a later reservation starts early only on an option that
        # meets its deadline by itself: otherwise it would have to move (and restart) later;
        # a job kept best-effort only while it can be on time starts only on an on-time option
        need_meet = frm is None and c.reserved is not None
        on_time = frm is None and c.on_time_only
        for t in types:
            room = _room(free, frm, t)
            for o in c.options.get(t, ()):
                if o.num_gpus > room:
                    break
                if not _is_grow(frm, o):
                    continue
                if need_meet and not self.prediction.meets(c, o, now):
                    continue
                if on_time and not self.prediction.meets(c, o, now, margin=False):
                    continue
                g = self.gain(c, frm, o)
                if g > 0 and (best is None or g > best[0]):
                    best = (g, o)
        return best


def _room(free: Mapping[str, int], frm: Option | None, t: str) -> int:
    """GPUs of type ``t`` a job now on ``frm`` could move onto."""
    return free.get(t, 0) + (frm.num_gpus if frm is not None and frm.gpu_type == t else 0)


def _is_grow(frm: Option | None, o: Option) -> bool:
    """More GPUs of the same type, or a faster option on another type."""
    if frm is None:
        return True
    if o.gpu_type == frm.gpu_type:
        return o.num_gpus > frm.num_gpus
    return o.step_s < frm.step_s
