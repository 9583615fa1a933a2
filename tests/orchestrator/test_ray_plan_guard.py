"""The Ray backend's launch refuses a plan the built-in trainer would not run as priced (a
dimension its profile excludes) with an error naming the field and what would fit, never a
silent run that needs far more memory than predicted, and hands ZeRO-1/2/3 plans' stage and
pipelined plans' depth to the trainer. Checked on ``_run_config`` alone, with no Ray
cluster."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from orchestrator.ray_backend import RayBackend, RayBackendConfig
from predictor.gpus import get_gpu
from predictor.plan import Plan
from predictor.planner import plan_job
from predictor.runtimes import FRENZY
from predictor.spec import Family, ModelSpec, TrainingSpec
from scheduler.cluster import Allocation
from scheduler.job import JobView

TINY = ModelSpec("tiny-gpt2", Family.GPT2, num_layers=2, hidden_size=64, num_heads=4,
                 vocab_size=256, max_seq_len=32)
TRAIN = TrainingSpec(global_batch=8, seq_len=32, precision="fp32", steps=4)


def _plan(**parallel: int) -> Plan:
    plans = plan_job(TINY, TRAIN, [get_gpu("A100-40G")], max_gpus=4, keep_all=True,
                     runtime=FRENZY.unrestricted()).plans
    base = next(p for p in plans if p.parallel.dp == 2 and p.parallel.pp == 1)
    return dataclasses.replace(base, parallel=dataclasses.replace(base.parallel, **parallel))


def _config(plan: Plan, tmp_path, entrypoint: str | None = None):
    job = JobView(id="j", submit_time=0.0, plans=(plan,), total_steps=4, model=TINY,
                  train=TRAIN, extra={"entrypoint": entrypoint} if entrypoint else {})
    alloc = Allocation("j", plan, (("n0", plan.parallel.num_gpus),))
    backend = SimpleNamespace(config=RayBackendConfig(checkpoint_dir=str(tmp_path)),
                              _state=None)  # no inventory: no emulated memory cap
    backend._tensor_cap = lambda a: RayBackend._tensor_cap(backend, a)  # type: ignore[arg-type]
    return RayBackend._run_config(backend, job, alloc)  # type: ignore[arg-type]


def test_a_plan_without_zero_or_pipeline_launches(tmp_path) -> None:
    cfg = _config(_plan(zero_stage=0), tmp_path)
    assert (cfg.tp, cfg.dp, cfg.pp, cfg.zero_stage) == (1, 2, 1, 0)


@pytest.mark.parametrize("zero", [1, 2, 3])
def test_zero_1_2_and_3_launch_with_the_plans_stage(tmp_path, zero) -> None:
    cfg = _config(_plan(zero_stage=zero), tmp_path)
    assert (cfg.dp, cfg.zero_stage) == (2, zero)


def test_a_pipelined_plan_launches_with_its_depth(tmp_path) -> None:
    # the built-in trainer runs pipeline stages (1F1B): tp·dp·pp ranks, the plan's pp
    cfg = _config(_plan(pp=2, dp=1), tmp_path)
    assert (cfg.tp, cfg.dp, cfg.pp, cfg.world_size) == (1, 1, 2, 2)


@pytest.mark.parametrize(("parallel", "field"), [
    ({"pp": 2, "dp": 1}, "parallel.pp=2"),
    ({"zero_stage": 3}, "parallel.zero_stage=3"),
])
def test_plans_the_trainer_does_not_execute_are_refused(tmp_path, parallel, field,
                                                        monkeypatch) -> None:
    # a trainer profile narrower than the planner's space (here: no pipeline, ZeRO-1/2):
    # what it would not run as priced is refused with the field named
    import orchestrator.ray_backend as rb

    monkeypatch.setattr(rb, "FRENZY", dataclasses.replace(FRENZY, max_pp=1,
                                                          zero_stages=(0, 1, 2)))
    with pytest.raises(ValueError) as e:
        _config(_plan(**parallel), tmp_path)
    assert field in str(e.value) and "entrypoint" in str(e.value)


def test_an_entrypoint_job_runs_any_plan(tmp_path) -> None:
    cfg = _config(_plan(zero_stage=3), tmp_path, entrypoint="python train.py")
    assert cfg.entrypoint == ("python", "train.py")
