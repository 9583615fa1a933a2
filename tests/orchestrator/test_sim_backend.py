"""SimBackend progress and preemption arithmetic, worked by hand."""

from __future__ import annotations

import pytest
from orch_fakes import FifoPolicy, IdentityPerf, cluster, job

from orchestrator.backend import Finished, Started, VirtualClock
from orchestrator.backends.sim import SimBackend
from orchestrator.loop import ControlLoop, ListJobSource
from orchestrator.states import JobState
from scheduler.cluster import Allocation


def backend() -> tuple[SimBackend, VirtualClock, list]:  # type: ignore[type-arg]
    clock = VirtualClock()
    be = SimBackend(clock, IdentityPerf(), cluster(4), launch_delay_s=10, restart_delay_s=60)
    seen: list = []  # type: ignore[type-arg]
    be.connect(seen.append)
    return be, clock, seen


def test_finish_time_is_delay_plus_steps_times_step_time() -> None:
    be, _clock, _ = backend()
    j = job("a", steps=100, step_s=2.0)
    be.start(j, Allocation("a", j.plans[0], (("n0", 1),)))
    assert be.next_event_time() == 10.0
    events = be.pop_due(1e9)
    assert events == [Started("a", 10.0), Finished("a", 210.0)]  # 10 + 100 x 2


def test_stop_accounts_progress_and_restart_pays_the_restore_delay() -> None:
    be, clock, _ = backend()
    j = job("a", steps=100, step_s=2.0)
    alloc = Allocation("a", j.plans[0], (("n0", 1),))
    be.start(j, alloc)
    clock.advance_to(110.0)
    assert be.steps_done("a") == pytest.approx(50.0)  # (110 - 10) / 2
    steps = be.stop("a", "preempt")
    assert steps == pytest.approx(50.0)
    assert be.next_event_time() is None  # old launch's events are void
    from dataclasses import replace

    be.start(replace(j, steps_done=steps), alloc)
    # resumes at 110 + 10 launch + 60 restore = 180; 50 steps x 2 s left -> 280
    assert [e.time for e in be.pop_due(1e9)] == [180.0, 280.0]


def test_resize_reruns_the_remaining_steps_at_the_new_speed() -> None:
    be, clock, _ = backend()
    j = job("a", steps=100, step_s=2.0)
    be.start(j, Allocation("a", j.plans[0], (("n0", 1),)))
    clock.advance_to(50.0)  # 20 steps done
    fast = job("a", steps=100, step_s=0.5, gpus=2).plans[0]
    steps = be.resize(j, Allocation("a", fast, (("n0", 2),)))
    assert steps == pytest.approx(20.0)
    # 50 + 70 delay = 120 start, 80 steps x 0.5 = 40 s -> 160
    assert [e.time for e in be.pop_due(1e9)] == [120.0, 160.0]


def test_control_loop_over_sim_backend_runs_a_queue_to_completion() -> None:
    clock = VirtualClock()
    state = cluster(2)
    be = SimBackend(clock, IdentityPerf(), state, launch_delay_s=0, restart_delay_s=0)
    jobs = [job(f"j{k}", steps=10, step_s=1.0, gpus=2) for k in range(3)]
    loop = ControlLoop(FifoPolicy(), be, ListJobSource(jobs), clock, tick_s=None)
    loop.run_virtual()
    ctl = loop.controller
    ends = sorted(r.end_time for r in ctl.jobs.values())  # type: ignore[type-var]
    assert ends == [10.0, 20.0, 30.0]  # one at a time on the 2 GPUs
    assert all(r.state is JobState.SUCCEEDED for r in ctl.jobs.values())
    assert ctl.cluster.free_gpus == 2


def test_a_launch_whose_true_peak_exceeds_the_gpu_fails_and_is_replanned() -> None:
    """Prediction error on memory: the 1-GPU plan's true peak is 2x its prediction and does
    not fit the 40 GiB node, so its first step fails at 10 s (the launch delay); the job is
    re-planned with the measured ratio and runs its 2-GPU plan, whose corrected need fits."""
    from dataclasses import replace

    from orch_fakes import GIB, plan

    from predictor.memory import MemoryBreakdown
    from scheduler.job import JobView

    def sized(gpus: int, tensors_gib: int, rank: int):  # type: ignore[no-untyped-def]
        mem = MemoryBreakdown(parameters=tensors_gib * GIB, gradients=0, optimizer_states=0,
                              activations=0, logits=0, overhead=1 * GIB)
        return replace(plan("A100-40G", gpus, step_s=2.0, steps=10), rank=rank, memory=mem,
                       required_bytes=(tensors_gib + 1) * GIB * 10 // 9)

    # 1 GPU: 30 GiB + 1, true 62 GiB > 40; 2 GPUs: 15 GiB + 1, true 32 GiB <= 40
    j = JobView(id="a", submit_time=0.0, plans=(sized(1, 30, 1), sized(2, 15, 2)),
                total_steps=10)
    clock = VirtualClock()
    be = SimBackend(clock, IdentityPerf(), cluster(4), launch_delay_s=10, restart_delay_s=60,
                    memory_factor=lambda job_id: 2.0)
    seen: list = []  # type: ignore[type-arg]
    loop = ControlLoop(FifoPolicy(), be, ListJobSource([j]), clock, tick_s=None,
                       listeners=[seen.append])
    loop.run_virtual()
    rec = loop.controller.job("a")
    assert rec.state is JobState.SUCCEEDED and be.over_memory == {"a"}
    (oom,) = [e for e in seen if e.to_state is JobState.PENDING and e.from_state is not None]
    assert oom.time == 10.0 and oom.reason.startswith("out of memory, re-planned")
    assert oom.data["held_bytes"] == 60 * GIB  # the true tensors: 30 GiB x 2
    assert oom.data["memory_factor"] == pytest.approx(2.0 * 1.1)
    # the 2-GPU plan starts at once: 10 + 10 launch (no checkpoint to restore) + 10 x 2 s
    assert rec.end_time == pytest.approx(40.0)
    assert [n for e in seen if e.to_state is JobState.PLACED and e.allocation
            for _, n in e.allocation.placement] == [1, 2]
