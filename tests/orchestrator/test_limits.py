"""Run-time limits and owner GPU quotas enforced by the Controller and the loop
(``orchestrator.quotas``); the figures are worked out by hand in each test."""

from __future__ import annotations

from dataclasses import replace

import pytest
from orch_fakes import FifoPolicy, IdentityPerf, RecordingBackend, ScriptedPolicy, cluster, job

from orchestrator.backend import Preempted, Started, VirtualClock
from orchestrator.backends.sim import SimBackend
from orchestrator.controller import Controller
from orchestrator.loop import ControlLoop, ListJobSource
from orchestrator.quotas import (
    MAX_RUNTIME_KEY,
    OWNER_KEY,
    OWNER_MAX_GPUS_KEY,
    RUNNING_S_KEY,
    Queued,
    owner_room,
)
from orchestrator.states import JobEvent, JobState
from scheduler.cluster import Allocation
from scheduler.decision import resize, start
from scheduler.job import JobView


def limited(view: JobView, limit_s: float, ran_s: float = 0.0) -> JobView:
    extra = {MAX_RUNTIME_KEY: limit_s}
    if ran_s:
        extra[RUNNING_S_KEY] = ran_s
    return replace(view, extra=extra)


def owned(view: JobView, owner: str, quota: int) -> JobView:
    return replace(view, extra={OWNER_KEY: owner, OWNER_MAX_GPUS_KEY: quota})


# -- run-time limit ---------------------------------------------------------------------------


def test_running_time_accumulates_over_a_preemption_and_the_job_stops_at_the_limit() -> None:
    clock = VirtualClock()
    be = RecordingBackend()
    events: list[JobEvent] = []
    ctl = Controller(FifoPolicy(), be, cluster(4), clock, listeners=[events.append])
    ctl.submit(limited(job("a", steps=10_000), 100.0))
    assert ctl.job("a").state is JobState.STARTING
    clock.advance_to(5.0)
    be.emit(Started("a", 5.0))  # RUNNING from 5
    clock.advance_to(65.0)  # 60 s running
    be.emit(Preempted("a", 65.0, 30.0, "node lost"))  # back to the queue, FIFO restarts it
    assert ctl.job("a").running_time(65.0) == 60.0
    assert ctl.job("a").state is JobState.STARTING
    clock.advance_to(90.0)  # STARTING does not count
    be.emit(Started("a", 90.0))
    assert ctl.next_limit_time() == 130.0  # 90 + (100 - 60)
    clock.advance_to(129.0)
    assert ctl.enforce_limits() == [] and ctl.job("a").state is JobState.RUNNING
    clock.advance_to(130.0)
    be.progress["a"] = 70.0  # the checkpoint the stop takes
    assert ctl.enforce_limits() == ["a"]
    rec = ctl.job("a")
    assert rec.state is JobState.FAILED and rec.end_time == 130.0
    assert be.commands[-1] == ("stop", "a")  # checkpointed, not killed
    end = events[-1]
    assert end.reason == ("run-time limit of 100 s reached after 100 s running; last "
                          "checkpoint step 70")
    assert end.data["running_s"] == 100.0 and end.data["steps_done"] == 70.0
    assert ctl.cluster.free_gpus == 4 and ctl.next_limit_time() is None
    # the preemption's event carried the running time so far (the service persists it)
    pre = next(e for e in events if e.reason == "preempted: node lost")
    assert pre.data["running_s"] == 60.0


def test_the_loop_stops_a_job_at_its_limit_on_the_virtual_clock_across_a_restart() -> None:
    # 2 GPUs, 1 s a step; launch 10 s, restore 60 s. RUNNING 10..70 (60 s, 60 steps), node
    # n0 leaves at 70, relaunched on n1: RUNNING again from 70 + 10 + 60 = 140; 40 s more
    # reach the 100 s limit at 180 with 100 steps (not at 70 + 100 + 70 = 240).
    clock = VirtualClock()
    be = SimBackend(clock, IdentityPerf(), cluster(2, 2), launch_delay_s=10, restart_delay_s=60)
    events: list[JobEvent] = []
    a = limited(job("a", steps=1000, step_s=1.0, gpus=2), 100.0)
    loop = ControlLoop(FifoPolicy(), be, ListJobSource([a]), clock, listeners=[events.append],
                       tick_s=None)
    loop.run_virtual(until_s=70.0)  # started at 10
    assert loop.controller.job("a").state is JobState.RUNNING
    clock.advance_to(70.0)
    be.remove_node("n0")
    loop.step()
    loop.run_virtual()
    rec = loop.controller.job("a")
    assert rec.state is JobState.FAILED and rec.end_time == 180.0
    assert events[-1].reason == ("run-time limit of 100 s reached after 100 s running; last "
                                 "checkpoint step 100")


def test_time_already_run_counts_and_a_job_recovered_over_its_limit_ends_at_once() -> None:
    clock = VirtualClock(1000.0)
    be = RecordingBackend()
    ctl = Controller(FifoPolicy(), be, cluster(4), clock)
    ctl.submit(limited(job("a", steps=10_000), 100.0, ran_s=80.0))
    be.emit(Started("a", 1000.0))
    assert ctl.next_limit_time() == 1020.0
    clock.advance_to(2000.0)
    ctl2 = Controller(ScriptedPolicy(), RecordingBackend(), cluster(4), clock)
    ctl2.submit(limited(job("b"), 100.0, ran_s=100.0))  # pending, already at its limit
    assert ctl2.enforce_limits() == ["b"]
    assert ctl2.job("b").state is JobState.FAILED


def test_jobs_without_a_limit_are_never_stopped() -> None:
    clock = VirtualClock()
    be = RecordingBackend()
    ctl = Controller(FifoPolicy(), be, cluster(4), clock)
    ctl.submit(job("a", steps=10_000))
    be.emit(Started("a", 0.0))
    clock.advance_to(1e9)
    assert ctl.enforce_limits() == [] and ctl.next_limit_time() is None


# -- owner GPU quota --------------------------------------------------------------------------


def test_owner_room_reserves_the_largest_plan_let_through_in_queue_order() -> None:
    caps, holds = owner_room(
        [Queued("a1", "alice", 8, (2, 4)), Queued("a2", "alice", 8, (2, 8)),
         Queued("a3", "alice", 8, (2,)), Queued("b1", "bob", 8, (8,))],
        {"alice": 2})
    # alice holds 2: a1 may take up to 6 (reserves 4), a2 up to 2 (reserves 2), a3 has none
    assert caps == {"a1": 6, "a2": 2, "b1": 8}
    h = holds["a3"]
    assert (h.owner, h.quota, h.held_gpus, h.reserved_gpus, h.smallest_gpus) == \
        ("alice", 8, 2, 6, 2)


def test_a_second_job_of_an_owner_at_its_quota_waits_others_do_not() -> None:
    clock = VirtualClock()
    be = RecordingBackend()
    ctl = Controller(FifoPolicy(), be, cluster(8), clock)
    with ctl.batch():
        ctl.submit(owned(job("a1", t=0, gpus=4), "alice", 4))
        ctl.submit(owned(job("a2", t=1, gpus=4), "alice", 4))
        ctl.submit(owned(job("b1", t=2, gpus=4), "bob", 4))
    assert ctl.job("a1").state is JobState.STARTING
    assert ctl.job("a2").state is JobState.PENDING
    assert ctl.job("b1").state is JobState.STARTING  # bob is not held back by alice
    hold = ctl.quota_holds["a2"]  # in that round a1 was let through first (reserved)
    assert (hold.owner, hold.held_gpus, hold.reserved_gpus, hold.quota) == ("alice", 0, 4, 4)
    ctl.tick()
    hold = ctl.quota_holds["a2"]  # now a1 holds its 4
    assert (hold.held_gpus, hold.reserved_gpus, hold.smallest_gpus) == (4, 0, 4)
    ctl.cancel("b1")  # 4 GPUs free, but alice is still at her quota
    assert ctl.job("a2").state is JobState.PENDING
    ctl.cancel("a1")
    assert ctl.job("a2").state is JobState.STARTING and ctl.quota_holds == {}


def test_a_plan_larger_than_the_room_left_is_not_shown_to_the_policy() -> None:
    clock = VirtualClock()
    seen: list[tuple[int, ...]] = []

    class Spy(FifoPolicy):
        def decide(self, state, pending, running, now):  # type: ignore[no-untyped-def]
            seen.extend(tuple(p.num_gpus for p in v.plans) for v in pending)
            return []

    ctl = Controller(Spy(), RecordingBackend(), cluster(8), clock)
    big = job("a", gpus=8)
    two = replace(big, plans=(job("x", gpus=2).plans[0], big.plans[0]))
    ctl.submit(owned(two, "alice", 4))
    assert seen[-1] == (2,)


def test_growth_of_a_running_job_above_its_owners_quota_is_dropped() -> None:
    clock = VirtualClock()
    policy = ScriptedPolicy()
    be = RecordingBackend()
    ctl = Controller(policy, be, cluster(8), clock)
    a = owned(job("a", gpus=4), "alice", 4)
    b = owned(job("b", gpus=2), "bob", 4)
    p4, p8 = a.plans[0], job("x", gpus=8).plans[0]
    policy.next = [start(Allocation("a", p4, (("n0", 4),)), "go")]
    ctl.submit(a)
    assert ctl.job("a").allocation is not None
    be.emit(Started("a", 0.0))
    # grow alice's job to 8 GPUs (above 4) and start bob's: the growth goes, bob's start stays
    policy.next = [resize(Allocation("a", p8, (("n0", 8),)), "grow"),
                   start(Allocation("b", b.plans[0], (("n0", 2),)), "go")]
    ctl.submit(b)
    assert ctl.job("a").allocation.num_gpus == 4  # type: ignore[union-attr]
    assert ctl.job("a").state is JobState.RUNNING
    assert ctl.job("b").state is JobState.STARTING
    assert ("resize", "a") not in be.commands


def test_without_quotas_the_queue_reaches_the_policy_unchanged() -> None:
    clock = VirtualClock()
    ctl = Controller(FifoPolicy(), RecordingBackend(), cluster(8), clock)
    with ctl.batch():
        ctl.submit(job("a1", gpus=4))
        ctl.submit(job("a2", t=1, gpus=4))
    assert ctl.job("a2").state is JobState.STARTING and ctl.quota_holds == {}


@pytest.mark.parametrize("extra", [{OWNER_KEY: "alice", OWNER_MAX_GPUS_KEY: 0},
                                   {OWNER_KEY: "alice", OWNER_MAX_GPUS_KEY: True},
                                   {MAX_RUNTIME_KEY: 0}, {MAX_RUNTIME_KEY: "10"}])
def test_a_zero_or_malformed_limit_is_no_limit(extra: dict[str, object]) -> None:
    clock = VirtualClock()
    be = RecordingBackend()
    ctl = Controller(FifoPolicy(), be, cluster(8), clock)
    with ctl.batch():
        ctl.submit(replace(job("a1", gpus=4), extra=dict(extra)))
        ctl.submit(replace(job("a2", t=1, gpus=4), extra=dict(extra)))
    be.emit(Started("a1", 0.0))
    clock.advance_to(1e6)
    assert ctl.enforce_limits() == []
    assert ctl.job("a2").state is JobState.STARTING
