"""The runtime keeps plans the backend's built-in trainer cannot run (pp > 1 on Ray) away from
the scheduler, unless the job brings its own entrypoint; a job left with no plan fails with
the reason."""

from __future__ import annotations

from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

from orchestrator.clusters import load_cluster
from predictor.gpus import get_gpu
from predictor.planner import plan_job
from predictor.spec import ModelSpec, TrainingSpec
from service.api.planning import Planned
from service.app_runtime import Runtime
from service.settings import Settings


def _runtime(plans: tuple[Any, ...], max_pipeline: int | None) -> tuple[Runtime, list[str]]:
    rt = Runtime(Settings(database_url="sqlite://"), None,  # type: ignore[arg-type]
                 load_cluster("frenzy-testbed"))
    model = ModelSpec.from_name("gpt2-medium")
    train = TrainingSpec(global_batch=8, seq_len=1024, steps=10)
    rt._planned["h"] = Planned(model=model, train=train, source="catalog", plans=plans,
                               plan_dicts=(), gpu_types=("A100-80G",), max_gpus=8)
    rt.driver = SimpleNamespace(max_pipeline=max_pipeline)  # type: ignore[assignment]
    failed: list[str] = []
    rt._fail = lambda job_id, reason: failed.append(reason)  # type: ignore[method-assign]
    return rt, failed


def _row(entrypoint: str | None = None) -> SimpleNamespace:
    return SimpleNamespace(
        id="j1", request_hash="h", request={}, created_at=datetime.now(UTC), total_steps=10,
        steps_done=0, deadline_at=None, priority=0, entrypoint=entrypoint)


def _plans() -> tuple[Any, ...]:
    result = plan_job(ModelSpec.from_name("gpt2-medium"),
                      TrainingSpec(global_batch=8, seq_len=1024, steps=10),
                      [get_gpu("A100-80G")], max_gpus=8, keep_all=True)
    plans = result.plans
    assert {p.parallel.pp for p in plans} > {1}  # the search has pipelined plans too
    return plans


def test_ray_trainer_sees_only_unpipelined_plans() -> None:
    plans = _plans()
    rt, failed = _runtime(plans, max_pipeline=1)
    view = rt._view_of(_row())  # type: ignore[arg-type]
    assert view is not None and not failed
    assert view.plans and all(p.parallel.pp == 1 for p in view.plans)
    assert len(view.plans) == sum(p.parallel.pp == 1 for p in plans)


def test_entrypoint_jobs_and_simulation_keep_every_plan() -> None:
    plans = _plans()
    rt, _ = _runtime(plans, max_pipeline=1)
    assert rt._view_of(_row(entrypoint="python train.py")).plans == plans  # type: ignore[arg-type,union-attr]
    rt, _ = _runtime(plans, max_pipeline=None)
    assert rt._view_of(_row()).plans == plans  # type: ignore[arg-type,union-attr]


def test_job_with_only_pipelined_plans_fails_with_reason() -> None:
    pipelined = tuple(p for p in _plans() if p.parallel.pp > 1)
    rt, failed = _runtime(pipelined, max_pipeline=1)
    assert rt._view_of(_row()) is None  # type: ignore[arg-type]
    assert failed and "pipeline parallelism" in failed[0] and "entrypoint" in failed[0]
