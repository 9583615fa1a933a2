"""The loop's view of a stored job (``stored_view``): the ranked plans stored at submission,
read back exactly; plans the backend's built-in trainer cannot run (pp > 1 on Ray: plans
stored before the planner searched only what the runtime executes) kept away from the
scheduler unless the job brings its own entrypoint (ZeRO-3 ones it runs); a job left with no
plan gets the reason instead."""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

from predictor.gpus import get_gpu
from predictor.planner import plan_job
from predictor.runtimes import FRENZY
from predictor.spec import ModelSpec, TrainingSpec
from service.app_runtime import decoded_plans, stored_view

MODEL = ModelSpec.from_name("gpt2-medium")
TRAIN = TrainingSpec(global_batch=8, seq_len=1024, steps=10)


def _stored(value: Any) -> Any:
    """``value`` as the database gives it back: through JSON, enums as their values."""
    return json.loads(json.dumps(value, default=str))


def _row(plans: tuple[Any, ...], entrypoint: str | None = None) -> SimpleNamespace:
    return SimpleNamespace(
        id="j1", request={}, created_at=datetime.now(UTC), total_steps=10, steps_done=0,
        deadline_at=None, priority=0, entrypoint=entrypoint, max_runtime_s=None, running_s=0.0,
        memory=None,
        model_spec=_stored(dataclasses.asdict(MODEL)),
        training=_stored(dataclasses.asdict(TRAIN)),
        plans=_stored([p.to_dict() for p in plans]))


def _plans() -> tuple[Any, ...]:
    # as stored before the planner searched only what the built-in trainer executes
    result = plan_job(MODEL, TRAIN, [get_gpu("A100-80G")], max_gpus=8, keep_all=True,
                      runtime=FRENZY.unrestricted())
    plans = result.plans
    assert {p.parallel.pp for p in plans} > {1}  # the search has pipelined plans too
    # gpt2-medium needs no ZeRO on 80 GB: restamp the data-parallel ones as ZeRO-3 plans
    zero = tuple(dataclasses.replace(p, parallel=dataclasses.replace(p.parallel, zero_stage=3))
                 for p in plans if p.parallel.dp > 1 and p.parallel.pp == 1)
    assert zero
    return plans + zero


def test_stored_plans_come_back_exactly() -> None:
    plans = _plans()
    view = stored_view(_row(plans))  # type: ignore[arg-type]
    assert not isinstance(view, str)
    assert view.plans == plans  # every field, the rank included: nothing re-planned
    assert view.model == MODEL and view.train == TRAIN


def test_the_stored_text_gives_the_same_plans_decoded_once_per_document() -> None:
    """The Controller reads a new job's plans as the stored JSON text (``plans_text``):
    the same view as from the decoded column, and two jobs with the same document share
    one decoded tuple (what keeps a queue of identical submissions cheap to hold)."""
    plans = _plans()
    row = _row(plans)
    text = json.dumps(row.plans)
    first = stored_view(row, plans_text=text)  # type: ignore[arg-type]
    second = stored_view(_row(plans), plans_text=json.dumps(row.plans))  # type: ignore[arg-type]
    assert not isinstance(first, str) and not isinstance(second, str)
    assert first.plans == plans == second.plans
    assert first.plans[0] is second.plans[0]  # decoded once, shared (Plan is frozen)
    assert decoded_plans(text) is decoded_plans(json.dumps(row.plans))
    filtered = stored_view(_row(plans), max_pipeline=1, plans_text=text)  # type: ignore[arg-type]
    assert not isinstance(filtered, str)
    assert filtered.plans == stored_view(_row(plans), max_pipeline=1).plans  # type: ignore[union-attr, arg-type]
    assert stored_view(_row(()), plans_text="[]") == "it has no stored plan"  # type: ignore[arg-type]
    assert stored_view(_row(()), plans_text="null") == "it has no stored plan"  # type: ignore[arg-type]
    broken = stored_view(_row(plans), plans_text="[{}]")  # type: ignore[arg-type]
    assert isinstance(broken, str) and broken.startswith("its stored specs or plans cannot")


def test_ray_trainer_sees_only_unpipelined_plans() -> None:
    plans = _plans()
    view = stored_view(_row(plans), max_pipeline=1)  # type: ignore[arg-type]
    assert not isinstance(view, str)
    assert view.plans and all(p.parallel.pp == 1 for p in view.plans)
    assert len(view.plans) == sum(p.parallel.pp == 1 for p in plans)
    assert any(p.parallel.zero_stage == 3 for p in view.plans)  # the trainer runs ZeRO-3


def test_entrypoint_jobs_and_simulation_keep_every_plan() -> None:
    plans = _plans()
    view = stored_view(_row(plans, entrypoint="python train.py"), max_pipeline=1)  # type: ignore[arg-type]
    assert not isinstance(view, str) and view.plans == plans
    view = stored_view(_row(plans), max_pipeline=None)  # type: ignore[arg-type]
    assert not isinstance(view, str) and view.plans == plans


def test_job_with_only_pipelined_plans_fails_with_reason() -> None:
    pipelined = tuple(p for p in _plans() if p.parallel.pp > 1)
    reason = stored_view(_row(pipelined), max_pipeline=1)  # type: ignore[arg-type]
    assert isinstance(reason, str)
    assert "pipeline parallelism" in reason and "entrypoint" in reason


def test_job_with_only_zero_3_plans_keeps_them() -> None:
    sharded = tuple(p for p in _plans() if p.parallel.zero_stage == 3)
    view = stored_view(_row(sharded), max_pipeline=1)  # type: ignore[arg-type]
    assert not isinstance(view, str) and view.plans == sharded


def test_the_view_carries_the_gpu_cap_and_ranking_a_replan_must_keep() -> None:
    from orchestrator.oom import PLAN_MAX_GPUS, PLAN_RANKING

    plans = _plans()
    row = _row(plans)
    view = stored_view(row, max_gpus=64, ranking="gpu_seconds")  # type: ignore[arg-type]
    assert not isinstance(view, str)
    assert view.extra[PLAN_MAX_GPUS] == 64 and view.extra[PLAN_RANKING] == "gpu_seconds"
    row.request = {"model": "gpt2-medium", "max_gpus": 4, "ranking": "job_time",
                   "training": {"global_batch": 8, "seq_len": 1024, "steps": 10}}
    view = stored_view(row, max_gpus=64, ranking="gpu_seconds")  # type: ignore[arg-type]
    assert not isinstance(view, str)
    assert view.extra[PLAN_MAX_GPUS] == 4 and view.extra[PLAN_RANKING] == "job_time"
    # the operator's per-owner cap bounds a plan as it did at submission
    row.owner = "alice"
    view = stored_view(row, max_gpus=64, max_owner_gpus=2)  # type: ignore[arg-type]
    assert not isinstance(view, str) and view.extra[PLAN_MAX_GPUS] == 2
    # without defaults and without the job's own, nothing is added
    row.request = {}
    view = stored_view(row)  # type: ignore[arg-type]
    assert not isinstance(view, str)
    assert PLAN_MAX_GPUS not in view.extra and PLAN_RANKING not in view.extra
