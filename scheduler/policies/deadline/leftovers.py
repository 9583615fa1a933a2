"""Filling the leftover GPUs: what nobody is promised goes where it buys the most.

Greedily, the job whose next larger option gains the most completion rate per added GPU,
``Δ(1/T) / ΔGPUs`` (T its predicted remaining time, restart included), takes it; returns
diminish because the options are the job's step times at each size. Best-effort jobs (no
deadline, refused a guarantee, or fallen behind) share these leftovers with admitted jobs
that may run ahead of their bookings."""

from __future__ import annotations

import heapq
from collections.abc import Mapping

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
