"""A real resize on the emulated Ray cluster: a running job is checkpointed, its placement
group released, a new one placed on another node and GPU type with a different plan (dp1 on
one GPU -> tp2 on two), and training resumes from the checkpoint: the step counter and the
loss carry on instead of starting over."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from orchestrator.backend import WallClock
from orchestrator.emulated import RayCluster, start_emulated
from orchestrator.loop import ControlLoop, ListJobSource
from orchestrator.ray_backend import (
    NODE_ID_LABEL,
    RayBackend,
    RayBackendConfig,
    gpus_in_use,
    live_placement_groups,
    wait_released,
)
from orchestrator.states import JobEvent, JobState
from predictor.gpus import get_gpu
from predictor.planner import plan_job
from predictor.spec import Family, ModelSpec, TrainingSpec
from scheduler.cluster import Allocation
from scheduler.decision import resize
from scheduler.job import JobView
from scheduler.policy import make_policy

pytestmark = pytest.mark.ray

SMALL = Path(__file__).parent / "data" / "small-cluster.yaml"
TINY = ModelSpec("tiny-gpt2", Family.GPT2, num_layers=2, hidden_size=64, num_heads=4,
                 vocab_size=256, max_seq_len=32)
STEPS = 40


@pytest.fixture(scope="module")
def cluster() -> Iterator[RayCluster]:
    os.environ.pop("RAY_ADDRESS", None)
    c = start_emulated(SMALL)
    try:
        yield c
    finally:
        c.shutdown()


def test_resize_moves_a_running_job_and_training_continues(cluster: RayCluster,
                                                           tmp_path: Path) -> None:
    backend = RayBackend(RayBackendConfig(checkpoint_dir=str(tmp_path), checkpoint_every=2))
    events: list[JobEvent] = []
    source = ListJobSource()
    loop = ControlLoop(make_policy("opportunistic"), backend, source, WallClock(),
                       listeners=[events.append]).start()
    ctl = loop.controller
    try:
        train = TrainingSpec(global_batch=8, seq_len=32, precision="fp32", steps=STEPS)
        one = next(p for p in plan_job(TINY, train, [get_gpu("A100-40G")], max_gpus=1).plans
                   if p.num_gpus == 1)  # starts on node "small", the only A100-40G
        job = JobView(id="r", submit_time=time.time(), plans=(one,), total_steps=STEPS,
                      model=TINY, train=train, requested_gpus=1)
        source.submit(job)
        loop.wake()
        assert loop.wait_until(lambda c: "r" in c.jobs and c.job("r").state is JobState.RUNNING
                               and c.job("r").view.steps_done >= 6, 90)
        before = list(backend.losses["r"])
        assert before and before[-1] < before[0]

        # the new plan: tensor parallel over both GPUs of the A100-80G node "big"
        big = next(p for p in plan_job(TINY, train, [get_gpu("A100-80G")], max_gpus=2).plans
                   if p.num_gpus == 2)
        tp2 = replace(big, parallel=replace(big.parallel, tp=2, dp=1, pp=1))
        alloc = Allocation("r", tp2, (("big", 2),))
        loop.call(lambda c: c.apply([resize(alloc, "test: move to 2xA100-80G tp2")]))
        assert loop.wait_until(lambda c: c.job("r").state.terminal, 120), ctl.job("r").state
        rec = ctl.job("r")
        assert rec.state is JobState.SUCCEEDED and rec.view.restarts == 1

        resized = next(e for e in events if e.job_id == "r" and e.to_state is JobState.RESIZING)
        at = int(resized.data["steps_done"])
        assert 2 <= at < STEPS  # resumed from a checkpoint taken on the old allocation
        assert [e.to_state for e in events if e.job_id == "r"].count(JobState.RUNNING) >= 2
        # the new launch ran on the new node, two workers (tp2)
        nodes = {w["labels"][NODE_ID_LABEL] for w in backend.placements["r"]}
        assert nodes == {"big"} and len(backend.placements["r"]) == 2
        # the step counter went on from the checkpoint to the end, and the loss did not start
        # over (a fresh model would report a loss near before[0])
        k = events.index(resized)
        after = [e for e in events[k:] if e.job_id == "r" and e.reason == "progress"]
        steps_after = [e.data["steps_done"] for e in after]
        assert steps_after and min(steps_after) > at and max(steps_after) == STEPS
        assert steps_after == sorted(steps_after)
        first_loss = next(e.data["loss"] for e in after if e.data["loss"] is not None)
        assert first_loss < before[0] - 0.05
        assert backend.losses["r"][-1] < before[-1]
    finally:
        loop.stop()
        backend.shutdown()
        assert wait_released(10), f"leaked: {gpus_in_use()} GPUs, {live_placement_groups()}"
