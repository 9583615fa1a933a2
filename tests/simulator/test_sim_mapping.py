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


def test_plan_cache_times_plans_on_the_clusters_network() -> None:
    """The simulator plans for the cluster the jobs run on: its declared network between
    nodes, not the GPU type's usual servers (phoebe: 12.5 GB/s; the catalog's A100: 200)."""
    from orchestrator.clusters import load_cluster
    from predictor.gpus import get_gpu
    from predictor.planner import plan_job
    from predictor.spec import ModelSpec, TrainingSpec
    from simulator.mapping import TRACE_RUNTIME
    from simulator.replay import PlanCache

    state = load_cluster("phoebe").state
    assert state.inter_node_bw_gbs == 12.5
    model = ModelSpec.from_name("gpt2-large")
    train = TrainingSpec(global_batch=128, seq_len=1024, steps=10)
    got = {(p.gpu_type, p.num_gpus): p for p in PlanCache(state).plans(model, train)}
    a100 = get_gpu("A100-40G")
    want = {p.num_gpus: p for p in plan_job(model, train, [a100], max_gpus=24,
                                            runtime=TRACE_RUNTIME,
                                            inter_node_bw_gbs=12.5).plans}
    two_nodes = got[("A100-40G", 16)]
    assert two_nodes.parallel == want[16].parallel
    assert two_nodes.step_time_s == want[16].step_time_s
    dgx = {p.num_gpus: p for p in plan_job(model, train, [a100], max_gpus=24,
                                           runtime=TRACE_RUNTIME).plans}
    assert two_nodes.step_time_s > dgx[16].step_time_s
