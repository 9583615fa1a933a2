"""The RayBackend hands a job's trainer options (``JobView.extra["trainer"]``: data, learning
rate schedule, seed) to its workers: a 2-GPU job on token shards trains on them with the
losses a local one-process run of the same options gives."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from orchestrator.ray_backend import gpus_in_use, live_placement_groups, wait_released
from orchestrator.states import JobState
from orchestrator.trainer import checkpoint as ckpt
from orchestrator.trainer.loop import RunConfig, apply_options, train
from predictor.gpus import get_gpu
from predictor.planner import plan_job
from predictor.spec import TrainingSpec
from scheduler.job import JobView
from tests.orchestrator.corpus import write_bin_shards
from tests.orchestrator.test_ray_backend import TINY, Rig, cluster  # noqa: F401 (fixture)

pytestmark = pytest.mark.ray


@pytest.fixture
def rig(cluster, tmp_path: Path) -> Iterator[Rig]:  # noqa: F811
    r = Rig(tmp_path / "ckpt", checkpoint_every=100)
    try:
        yield r
    finally:
        r.close()
        assert wait_released(10), f"leaked: {gpus_in_use()} GPUs, {live_placement_groups()}"


def test_job_trains_on_its_data_with_its_options(rig: Rig, tmp_path: Path) -> None:
    write_bin_shards(tmp_path / "tokens", (3000, 2001), vocab=TINY.vocab_size)
    options = {"lr": 2e-3, "lr_schedule": "cosine", "warmup_steps": 1, "min_lr_ratio": 0.1,
               "weight_decay": 0.1, "grad_clip": 1.0, "seed": 4, "init_from": None,
               "data": {"kind": "tokens", "path": str(tmp_path / "tokens"),
                        "tokenizer": None, "dtype": "uint16", "text_field": "text",
                        "shuffle": True}}
    train_spec = TrainingSpec(global_batch=8, seq_len=32, precision="fp32", steps=4)
    gpu_types = [get_gpu(t) for t in rig.controller.cluster.gpu_types()]
    plans = tuple(p for p in plan_job(TINY, train_spec, gpu_types, max_gpus=3).plans
                  if p.parallel.pp == 1 and p.parallel.num_gpus == 2)
    job = JobView(id="d", submit_time=time.time(), plans=plans, total_steps=4, model=TINY,
                  train=train_spec, requested_gpus=2, extra={"trainer": options})
    rig.submit(job)
    rig.wait("d", lambda r: r.state.terminal)
    assert rig.controller.job("d").state is JobState.SUCCEEDED
    saved = ckpt.read(ckpt.step_path(tmp_path / "ckpt", "d", 4))
    assert saved["data_position"] == 4 * 8 and saved["data_fingerprint"]
    local = apply_options(RunConfig(job_id="local", model=TINY, global_batch=8, seq_len=32,
                                    total_steps=4, checkpoint_dir=str(tmp_path / "local")),
                          options)
    expected = train(replace(local, micro_batch=1), 0).losses
    assert rig.backend.losses["d"] == pytest.approx(list(expected), abs=1e-4)
