"""Trace → LLM mapping: the class rule, and GPU-time reproduced on the reference GPU."""

from __future__ import annotations

import pytest

from predictor.gpus import get_gpu
from predictor.planner import plan_job
from simulator.mapping import (
    CLASS_GPU_HOURS,
    REFERENCE_GPU,
    TRACE_RUNTIME,
    MappingError,
    map_job,
    size_class,
)
from simulator.traces import TraceJob
from simulator.workloads import new_workload


def tj(app: str, gpu_time_s: float | None = None, **kw: object) -> TraceJob:
    return TraceJob(name="j", submit_time=10.0, application=app, num_gpus=2,
                    gpu_time_s=gpu_time_s, **kw)  # type: ignore[arg-type]


def test_size_class_bins() -> None:
    assert [size_class(h) for h in (0.5, 1.0, 9.9, 10, 99, 100, 1e4)] == \
        ["tiny", "small", "small", "medium", "medium", "large", "large"]


@pytest.mark.parametrize("app,cls,model", [
    ("cifar10", "tiny", "gpt2"), ("ncf", "tiny", "bert-base"),
    ("deepspeech2", "small", "gpt2-medium"), ("bert", "small", "bert-large"),
    ("yolov3", "medium", "gpt2-large"), ("imagenet", "large", "llama-2-7b"),
])
def test_application_picks_class_and_model(app: str, cls: str, model: str) -> None:
    m = map_job(tj(app))
    assert (m.size_class, m.model.name) == (cls, model)
    assert m.gpu_time_s == CLASS_GPU_HOURS[cls] * 3600
    assert m.trace.num_gpus == 2


@pytest.mark.parametrize("app,gpu_h", [("cifar10", None), ("bert", None), ("vgg16", 3.0),
                                       ("resnet50", 40.0)])
def test_steps_reproduce_gpu_time_on_reference_gpu(app: str, gpu_h: float | None) -> None:
    m = map_job(tj(app, gpu_h * 3600 if gpu_h else None))
    # independently re-plan on the reference GPU and price the job's steps
    best = plan_job(m.model, m.train, [get_gpu(REFERENCE_GPU)], max_gpus=64,
                    runtime=TRACE_RUNTIME).best
    per_step = best.step_time_s * best.num_gpus
    assert best.gpu_seconds == pytest.approx(m.steps * per_step)
    assert abs(best.gpu_seconds - m.gpu_time_s) <= per_step / 2 + 1e-6


def test_elasticflow_deadline_becomes_relative_budget() -> None:
    m = map_job(tj("gpt2", 2 * 3600.0, deadline=7210.0))
    assert m.size_class == "small" and m.train.deadline_s == pytest.approx(7200.0)


def test_unknown_application_without_duration_is_an_error() -> None:
    with pytest.raises(MappingError, match="application 'mystery'"):
        map_job(tj("mystery"))


def test_new_workload_is_seeded_and_varied() -> None:
    a, b = new_workload(30, seed=3), new_workload(30, seed=3)
    assert [(m.model.name, m.train) for m in a] == [(m.model.name, m.train) for m in b]
    assert {m.model.family.value for m in a} == {"gpt2", "bert"}
    assert len({m.train.global_batch for m in a}) > 1
    assert all(m.trace.submit_time == 0 for m in a)
    c = new_workload(30, seed=4)
    assert [m.model.name for m in a] != [m.model.name for m in c]
