"""Out of memory is not a lost job: the controller re-plans it from its own plans with the
measured memory plus a margin and queues it again from its checkpoint (``orchestrator.oom``).
The figures below are worked out by hand from the plans' memory terms."""

from __future__ import annotations

from dataclasses import replace

from orch_fakes import FifoPolicy, RecordingBackend, plan

from orchestrator.backend import OutOfMemory, Started, VirtualClock
from orchestrator.controller import Controller
from orchestrator.oom import MEMORY_FACTOR, OOM_MARGIN, replan_after_oom
from orchestrator.states import JobEvent, JobState
from predictor.memory import MemoryBreakdown
from scheduler.cluster import ClusterState, Node
from scheduler.job import JobView

GIB = 1 << 30


def _plans() -> tuple:
    """1 GPU: 8 GiB of tensors (+1 GiB outside), needs 10 GiB; 2 GPUs: 4 GiB (+1), 6 GiB."""
    one = replace(plan("A100-40G", 1), rank=1, required_bytes=10 * GIB, memory=MemoryBreakdown(
        parameters=4 * GIB, gradients=0, optimizer_states=0, activations=4 * GIB, logits=0,
        overhead=1 * GIB))
    two = replace(plan("A100-40G", 2), rank=2, required_bytes=6 * GIB, memory=MemoryBreakdown(
        parameters=2 * GIB, gradients=0, optimizer_states=0, activations=2 * GIB, logits=0,
        overhead=1 * GIB))
    return one, two


def _cluster(memory: int = 12 * GIB) -> ClusterState:
    return ClusterState((Node("n0", "A100-40G", memory, 4, 4, "nvlink"),))


def _job() -> JobView:
    return JobView(id="j", submit_time=0.0, plans=_plans(), total_steps=100)


def test_the_plan_that_ran_out_drops_out_and_the_rest_grow_by_the_measured_ratio() -> None:
    one, _ = _plans()
    # the 1-GPU rank held 11 GiB against a prediction of 8: ratio 1.375, +10 % = 1.5125
    out = replan_after_oom(_job(), one, OutOfMemory("j", 5.0, 40, 11 * GIB, 11 * GIB, "oom"),
                           _cluster())
    factor = 11 / 8 * (1 + OOM_MARGIN)
    assert abs(out.factor - factor) < 1e-12 and abs(out.memory_factor - factor) < 1e-12
    assert out.view is not None
    # 1 GPU: device 8·f + 1 = 13.1 GiB, needs 10·13.1/9 = 14.6 GiB > 12: out
    # 2 GPUs: tensors 4·f = 6.05 GiB, device 7.05, needs 6·7.05/5 = 8.46 GiB <= 12: kept
    (kept,) = out.view.plans
    assert kept.num_gpus == 2 and kept.rank == 2
    assert kept.memory.tensors == round(2 * GIB * factor) * 2
    assert kept.memory.overhead == 1 * GIB
    assert abs(kept.required_bytes - 6 * GIB * (4 * factor + 1) / 5) <= 2
    assert out.view.extra[MEMORY_FACTOR] == out.memory_factor
    assert "1.38x the 8 GiB predicted" in out.reason and "1 of 2 plans" in out.reason
    assert "resuming from step 40" in out.reason


def test_a_second_correction_compounds_and_no_fitting_plan_fails_the_job() -> None:
    one, _ = _plans()
    first = replan_after_oom(_job(), one, OutOfMemory("j", 5.0, 0, 11 * GIB, 11 * GIB, "oom"),
                             _cluster())
    assert first.view is not None
    ran = first.view.plans[0]
    # the 2-GPU plan then holds 1.6x its corrected tensors: nothing fits 12 GiB any more
    held = int(ran.memory.tensors * 1.6)
    second = replan_after_oom(first.view, ran, OutOfMemory("j", 9.0, 0, held, held, "oom"),
                              _cluster())
    assert second.view is None
    assert abs(second.memory_factor - first.memory_factor * 1.6 * 1.1) < 1e-9
    assert "no plan of this job fits a GPU of this cluster" in second.reason


def test_a_job_none_of_whose_plans_fits_is_planned_again_with_more_recomputation() -> None:
    from predictor.gpus import get_gpu
    from predictor.planner import plan_job
    from predictor.spec import ModelSpec, Recompute, TrainingSpec

    # gpt2-large, 16 sequences of 1024 tokens, one A100-40G: the planner stores its fastest
    # plan per (type, count), here without recomputation (micro-batch 4, needs 30.2 GiB)
    gpu = get_gpu("A100-40G")
    model, train = ModelSpec.from_name("gpt2-large"), TrainingSpec(16, 1024, steps=100)
    (stored,) = plan_job(model, train, [gpu], max_gpus=1).plans
    assert stored.parallel.recompute is Recompute.NONE
    job = JobView(id="g", submit_time=0.0, plans=(stored,), total_steps=100, model=model,
                  train=train)
    state = ClusterState((Node("n0", "A100-40G", gpu.memory_bytes, 1, 1, "nvlink"),))
    # the rank held 1.5 / 1.1 of its predicted tensors: the correction is 1.5, and the stored
    # plan, 1.5 x its tensors, no longer fits 40 GiB
    held = round(stored.model_tensors_bytes * 1.5 / (1 + OOM_MARGIN))
    assert stored.with_tensors_scaled(1.5, "").required_bytes > gpu.memory_bytes
    out = replan_after_oom(job, stored, OutOfMemory("g", 5.0, 20, held, held, "oom"), state)
    assert out.view is not None, out.reason
    best = out.view.plans[0]
    # a plan the first planning passed over: full recomputation holds far fewer activations
    assert best.parallel.recompute is Recompute.FULL and best.num_gpus == 1
    assert best.required_bytes <= gpu.memory_bytes
    assert abs(best.memory_factor - 1.5) < 1e-6 and best.rank == 1 and best.num_steps == 100
    assert "none of its 1 plans fits any more; planned again" in out.reason


def test_the_controller_requeues_the_job_from_its_checkpoint_on_the_plan_that_fits() -> None:
    clock = VirtualClock()
    backend = RecordingBackend()
    events: list[JobEvent] = []
    ctl = Controller(FifoPolicy(), backend, _cluster(), clock, listeners=[events.append])
    ctl.submit(_job())
    assert ctl.job("j").allocation is not None and ctl.job("j").allocation.num_gpus == 1
    backend.emit(Started("j", 1.0))
    clock.advance_to(5.0)
    backend.emit(OutOfMemory("j", 5.0, 40, 11 * GIB, 11 * GIB, "oom"))
    rec = ctl.job("j")
    # requeued and placed again at once (the FIFO policy takes plans[0]): now the 2-GPU plan
    assert rec.state is JobState.STARTING and rec.allocation is not None
    assert rec.allocation.num_gpus == 2 and rec.view.steps_done == 40
    assert rec.view.restarts == 1
    requeue = next(e for e in events if e.to_state is JobState.PENDING and e.from_state)
    assert requeue.data["held_bytes"] == 11 * GIB and requeue.data["steps_done"] == 40
    assert requeue.data["memory_factor"] == rec.view.extra[MEMORY_FACTOR]
    assert requeue.reason.startswith("out of memory, re-planned")
    assert ctl.cluster.free_gpus == 2


def test_a_job_planned_again_keeps_its_gpu_cap_and_its_ranking() -> None:
    from orchestrator.oom import PLAN_MAX_GPUS, PLAN_RANKING, fresh_plans
    from predictor.gpus import get_gpu
    from predictor.planner import plan_job
    from predictor.spec import ModelSpec, TrainingSpec

    gpu = get_gpu("A100-40G")
    model, train = ModelSpec.from_name("gpt2-large"), TrainingSpec(16, 1024, steps=100)
    stored = plan_job(model, train, [gpu], max_gpus=1).plans[0]
    state = ClusterState((Node("n0", "A100-40G", gpu.memory_bytes, 8, 8, "nvlink"),))

    def again(**extra: object) -> tuple:
        job = JobView(id="g", submit_time=0.0, plans=(stored,), total_steps=100, model=model,
                      train=train, extra=dict(extra))
        return fresh_plans(job, stored, 1.5, "x1.50: measured after an out-of-memory run",
                           state)

    free = again()
    assert max(p.num_gpus for p in free) > 2  # the node's 8 GPUs are open to it
    gs = [p.gpu_seconds for p in free]
    assert gs == sorted(gs)  # ranked by GPU-seconds when the job named no ranking
    capped = again(**{PLAN_MAX_GPUS: 2, PLAN_RANKING: "job_time"})
    assert capped and max(p.num_gpus for p in capped) <= 2  # the user's max_gpus holds
    times = [p.job_time_s for p in capped]
    assert times == sorted(times)  # and its ranking: fastest first
    assert [p.rank for p in capped] == list(range(1, len(capped) + 1))
    # a ranking the planner does not know falls back to GPU-seconds instead of failing
    odd = again(**{PLAN_RANKING: "cheapest"})
    assert [p.gpu_seconds for p in odd] == sorted(p.gpu_seconds for p in odd)
