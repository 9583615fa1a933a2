"""Allocation now, and the decisions that carry it out.

``claim``: the bookings that start now take their GPUs; running jobs keep what they hold when
it fits (no restart for nothing), else shrink to what is left of their type, else stop.
``preempt_and_place``: the jobs that lose their GPUs stop, then the moves are placed (the
bookings that must start first, then running jobs' resizes, then starts), each decision with
its reasons and a ``ReasonCode``."""

from __future__ import annotations

import math

from scheduler.cluster import Allocation, ClusterState
from scheduler.decision import Decision, ReasonCode, resize, resize_code, start, stop
from scheduler.job import RunningJob
from scheduler.placement import FreeGpus
from scheduler.policies.common import order_for_sequential_apply
from scheduler.policies.deadline.candidates import Candidate, Round
from scheduler.policies.deadline.options import Option, PlaceFn
from scheduler.policies.deadline.prediction import Prediction
from scheduler.policy import PerfModel


class Allocator:
    """Turns the round's bookings and leftovers into GPUs held now and into decisions:
    options are placed with ``place`` and re-timed on their placement with ``perf``."""

    def __init__(self, name: str, prediction: Prediction, place: PlaceFn,
                 perf: PerfModel) -> None:
        self.name = name
        self.prediction = prediction
        self.place = place
        self.perf = perf

    def claim(self, rnd: Round) -> dict[str, int]:
        """The shares that must start now take their GPUs; running jobs keep what they hold
        when it fits (a mandatory share is swapped for the current allocation only when that
        also meets the deadline), else shrink to what is left of their type (else they stop).
        Returns the GPUs left free per type."""
        cands, now = rnd.cands, rnd.now
        free = dict(rnd.cap)
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
                if not self.prediction.meets(c, cur, now) and cur.step_s > c.target.step_s:
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

    def preempt_and_place(self, state: ClusterState, rnd: Round) -> list[Decision]:
        """Stop the running jobs left without a target, then place every move (mandatory
        shares first, then running jobs' resizes, then starts; a move that cannot be placed
        stops a running job), in an order the controller can apply one by one."""
        cands, now = rnd.cands, rnd.now
        free = FreeGpus.from_state(state)
        out: list[Decision] = []
        moves: list[Candidate] = []
        for c in cands.values():
            if c.held is None:
                if c.target is not None:
                    moves.append(c)
                continue
            if c.target is None:
                out.append(stop(c.job.id, f"{self.name}: preempted: "
                                          f"{'; '.join(c.why) or 'its GPUs are promised'}",
                                self._stop_code(c, rnd)))
                free.give(c.held.placement)
            elif not c.target.same_shape(c.current):
                free.give(c.held.placement)
                moves.append(c)
        moves.sort(key=lambda c: (not c.mandatory, c.held is None,
                                  c.job.deadline if c.job.deadline is not None else math.inf,
                                  c.job.submit_time, c.job.id))
        for c in moves:
            d = self._place(state, free, c, now)
            if d is not None:
                out.append(d)
        running = [RunningJob(c.job, c.held, now) for c in cands.values() if c.held is not None]
        return order_for_sequential_apply(state, running, out)

    def _place(self, state: ClusterState, free: FreeGpus, c: Candidate,
               now: float) -> Decision | None:
        """The start or resize putting ``c`` on its target (taking the GPUs from ``free``), a
        stop when a running job's target cannot be placed, or None for a queued one."""
        o = c.target
        assert o is not None
        placement = self.place(free, o)
        if placement is None and c.held is None and c.narrow is not None:
            o = c.target = c.narrow  # the wide start does not fit the nodes: start as before
            c.why.append(f"wide start unplaceable (fragmented): {o.label()}")
            placement = self.place(free, o)
        if placement is None:
            if c.held is not None:
                return stop(c.job.id, f"{self.name}: cannot place {o.label()} "
                                      "(fragmented); back to the queue", ReasonCode.NO_FIT)
            return None
        free.take(placement)
        placed = self.perf.placed_plan(c.job, o.plan, placement, state)
        alloc = Allocation(c.job.id, placed, placement)
        est = self.prediction.remaining_s(c, Option(o.gpu_type, o.num_gpus, placed))
        why = "; ".join(c.why) or "allocated"
        ddl = (f"; predicted done at {now + est:.0f}s, deadline {c.job.deadline:.0f}s"
               if c.job.deadline is not None else "; no deadline")
        if c.held is not None:
            cost = self.prediction.launch_delay_s + self.prediction.restart_delay_s
            was = c.current.label() if c.current else ""
            return resize(alloc, f"{self.name}: {why}; resize {was} -> {o.label()} charged "
                                 f"{cost:.0f}s checkpoint-restart{ddl}",
                          resize_code(c.held, alloc))
        return start(alloc, f"{self.name}: {why}{ddl}",
                     ReasonCode.ADMIT if c.mandatory else ReasonCode.FILL)

    @staticmethod
    def _stop_code(c: Candidate, rnd: Round) -> ReasonCode:
        """Paused when its booking resumes it later, else preempted."""
        if c.reserved is not None and c.reserved.start > rnd.profile.now:
            return ReasonCode.PAUSE
        return ReasonCode.PREEMPT

    def _keep_value(self, c: Candidate) -> float:
        cur = c.current
        assert cur is not None
        t = self.prediction.remaining_s(c, cur)
        return 1.0 / (max(t, 1e-9) * cur.num_gpus)

