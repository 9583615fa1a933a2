"""Controller with a recording backend: states, cluster accounting, decisions, listeners."""

from __future__ import annotations

import pytest
from orch_fakes import FifoPolicy, RecordingBackend, ScriptedPolicy, cluster, job

from orchestrator.backend import Failed, Finished, Preempted, Progress, Started, VirtualClock
from orchestrator.controller import Controller, ControllerError
from orchestrator.states import JobEvent, JobState
from scheduler.cluster import Allocation, CapacityError
from scheduler.decision import resize, start, stop


def make(policy=None, sizes=(4,)):  # type: ignore[no-untyped-def]
    clock = VirtualClock()
    backend = RecordingBackend()
    events: list[JobEvent] = []
    ctl = Controller(policy or FifoPolicy(), backend, cluster(*sizes), clock,
                     listeners=[events.append])
    return ctl, backend, clock, events


def test_lifecycle_and_gpu_accounting() -> None:
    ctl, be, clock, events = make()
    ctl.submit(job("a", gpus=3))
    assert ctl.job("a").state is JobState.STARTING
    assert ctl.cluster.free_gpus == 1 and be.commands == [("start", "a")]
    clock.advance_to(10)
    be.emit(Started("a", 10))
    assert ctl.job("a").state is JobState.RUNNING
    be.emit(Progress("a", 20, steps_done=5, loss=3.0, samples_per_s=40))
    assert ctl.job("a").view.steps_done == 5
    clock.advance_to(30)
    be.emit(Finished("a", 30))
    rec = ctl.job("a")
    assert rec.state is JobState.SUCCEEDED and rec.end_time == 30 and rec.first_start == 0
    assert ctl.cluster.free_gpus == 4
    moves = [(e.from_state, e.to_state) for e in events]
    assert moves == [
        (None, JobState.PENDING), (JobState.PENDING, JobState.PLACED),
        (JobState.PLACED, JobState.STARTING), (JobState.STARTING, JobState.RUNNING),
        (JobState.RUNNING, JobState.RUNNING),  # progress report
        (JobState.RUNNING, JobState.SUCCEEDED),
    ]
    assert events[1].allocation is not None and events[-1].allocation is None
    assert len(ctl.policy_wall_s) == len(ctl.policy_calls) >= 2


def test_queue_waits_for_capacity_then_starts_on_finish() -> None:
    ctl, be, _clock, _ = make()
    ctl.submit(job("a", gpus=3))
    ctl.submit(job("b", gpus=2, t=1))
    assert ctl.job("b").state is JobState.PENDING
    be.emit(Started("a", 0))
    be.emit(Finished("a", 50))
    assert ctl.job("b").state is JobState.STARTING


def test_over_allocation_is_refused_before_anything_happens() -> None:
    """Applying it raises; a policy returning it gets its round replaced by the fallback's
    (nothing of the bad round applied: the backend hears only of the fallback's start)."""
    pol = ScriptedPolicy()
    ctl, be, _, _ = make(pol)
    j = job("a", gpus=1)
    ctl.submit(j)
    bad = [start(Allocation("a", j.plans[0], (("n0", 1),)), "fits"),
           start(Allocation("b", j.plans[0], (("n0", 5),)), "too many")]
    with pytest.raises(ControllerError, match="unknown job"):
        ctl.check(bad)
    with pytest.raises(CapacityError):
        ctl.apply([start(Allocation("a", j.plans[0], (("n0", 5),)), "too many")])
    assert ctl.job("a").state is JobState.PENDING and ctl.cluster.free_gpus == 4
    pol.next = bad
    ctl.tick()
    assert ctl.policy_failures == 1
    assert ctl.alerts[0].error == "ControllerError: start b: unknown job"
    assert ctl.alerts[0].fallback == "has-paper"
    rec = ctl.job("a")
    assert rec.state is JobState.STARTING and ctl.cluster.free_gpus == 3
    assert be.commands == [("start", "a")]


def test_start_of_a_running_job_is_refused() -> None:
    pol = ScriptedPolicy()
    ctl, _, _, _ = make(pol)
    j = job("a")
    ctl.submit(j)
    alloc = Allocation("a", j.plans[0], (("n0", 1),))
    pol.next = [start(alloc, "go")]
    ctl.tick()
    with pytest.raises(ControllerError, match="job is starting"):
        ctl.check([start(alloc, "again")])
    with pytest.raises(ControllerError, match="not pending"):
        ctl.apply([start(alloc, "again")])
    pol.next = [start(alloc, "again")]
    ctl.tick()  # the loop is not stopped: the round falls back (nothing left to place)
    assert ctl.policy_failures == 1 and ctl.job("a").state is JobState.STARTING
    assert ctl.cluster.free_gpus == 3


def test_check_follows_the_order_of_apply() -> None:
    """Stops free GPUs before starts take them, resizes release before they grant: a round
    that is valid in ``apply``'s order passes."""
    ctl, _, _, _ = make(ScriptedPolicy(), sizes=(2,))
    a, b = job("a", gpus=2), job("b", gpus=2)
    ctl.submit(a)
    ctl.apply([start(Allocation("a", a.plans[0], (("n0", 2),)), "go")])
    ctl.submit(b)
    swap = [start(Allocation("b", b.plans[0], (("n0", 2),)), "b"), stop("a", "make room")]
    ctl.check(swap)  # the stop is applied first
    with pytest.raises(CapacityError):
        ctl.check(swap[:1])


def test_stop_requeues_with_checkpointed_progress_and_resize_moves() -> None:
    pol = ScriptedPolicy()
    ctl, be, _, _ = make(pol, sizes=(4, 4))
    j = job("a", gpus=2)
    ctl.submit(j)
    pol.next = [start(Allocation("a", j.plans[0], (("n0", 2),)), "go")]
    ctl.tick()
    be.emit(Started("a", 1))
    be.progress["a"] = 40.0
    pol.next = [resize(Allocation("a", j.plans[0], (("n1", 2),)), "move")]
    ctl.tick()
    rec = ctl.job("a")
    assert rec.state is JobState.RESIZING and rec.view.steps_done == 40 and rec.view.restarts == 1
    assert ctl.cluster.node("n0").free_gpus == 4 and ctl.cluster.node("n1").free_gpus == 2
    be.emit(Started("a", 5))
    be.progress["a"] = 60.0
    pol.next = [stop("a", "make room")]
    ctl.tick()
    rec = ctl.job("a")
    assert rec.state is JobState.PENDING and rec.view.steps_done == 60 and rec.view.restarts == 2
    assert ctl.cluster.free_gpus == 8
    assert be.commands == [("start", "a"), ("resize", "a"), ("stop", "a")]


def test_preempted_and_failed_events_release_gpus() -> None:
    ctl, be, _, _ = make(ScriptedPolicy())
    pol = ctl.policy
    j1, j2 = job("a"), job("b")
    ctl.submit(j1)
    ctl.submit(j2)
    pol.next = [start(Allocation("a", j1.plans[0], (("n0", 1),)), "go"),  # type: ignore[attr-defined]
                start(Allocation("b", j2.plans[0], (("n0", 1),)), "go")]
    ctl.tick()
    be.emit(Started("a", 1))
    be.emit(Preempted("a", 2, steps_done=7, reason="node lost"))
    assert ctl.job("a").state is JobState.PENDING and ctl.job("a").view.steps_done == 7
    be.emit(Failed("b", 3, reason="OOM"))
    assert ctl.job("b").state is JobState.FAILED
    assert ctl.cluster.free_gpus == 4


def test_cancel_frees_gpus_and_tells_the_backend() -> None:
    ctl, be, _, _ = make()
    ctl.submit(job("a", gpus=4))
    ctl.cancel("a")
    assert ctl.job("a").state is JobState.CANCELLED and ctl.cluster.free_gpus == 4
    assert ("cancel", "a") in be.commands
    with pytest.raises(ControllerError):
        ctl.cancel("a")


def test_batch_makes_one_policy_call() -> None:
    pol = ScriptedPolicy()
    ctl, _, _, _ = make(pol)
    with ctl.batch():
        for k in range(5):
            ctl.submit(job(f"j{k}"))
    assert pol.calls == 1


def test_submit_twice_and_planless_job() -> None:
    ctl, _, _, _ = make()
    ctl.submit(job("a"))
    with pytest.raises(ControllerError, match="twice"):
        ctl.submit(job("a"))
    from dataclasses import replace

    ctl.submit(replace(job("b"), plans=()))
    assert ctl.job("b").state is JobState.FAILED


def test_a_decisions_typed_reason_reaches_the_event_data() -> None:
    from scheduler.decision import ReasonCode

    ctl, _, _, events = make(ScriptedPolicy())
    j = job("a")
    ctl.submit(j)
    ctl.policy.next = [  # type: ignore[attr-defined]
        start(Allocation("a", j.plans[0], (("n0", 1),)), "go", code=ReasonCode.PLACE)]
    ctl.tick()
    placed = next(e for e in events if e.to_state is JobState.PLACED)
    assert placed.data["code"] == "place" and placed.reason == "go"
