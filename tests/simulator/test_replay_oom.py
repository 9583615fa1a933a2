"""A job that runs out of memory in the simulator (its true peak above its GPU's memory) is
re-planned with its measured memory and placed again by every policy on a plan that fits;
one that no GPU can hold ends failed with the measurement as its reason, and the replay ends.

The cluster: 4 V100-32G and 4 A100-80G. The job has a 4-GPU plan on each type, with 24 GiB
of tensors and 1 GiB outside them, needing 28 GiB a GPU; the V100 plan runs at 1 s a step,
the A100 one at 2 s, so every policy starts it on the V100s. Its true peak is the predicted
one × ``TRUE``: at 1.3, 25 GiB × 1.3 = 32.5 GiB > 32 GiB, out of memory on the V100s (the
first step fails at the end of the launch delay, t = 10 s); the re-plan multiplies the
tensors by 1.3 (what the rank held over what was predicted) + 10 %, 1.43: the plans need
28 × (24 × 1.43 + 1) / 25 = 39.6 GiB, the V100 plan drops out and the A100 one stays; there
the true peak, 32.5 GiB, fits 80 GiB."""

from __future__ import annotations

from dataclasses import replace

import pytest

from orchestrator.backends.sim import DEFAULT_LAUNCH_DELAY_S
from orchestrator.oom import OOM_MARGIN
from predictor.memory import MemoryBreakdown
from predictor.plan import Plan
from predictor.spec import ParallelConfig, Precision
from predictor.step_time import StepTime
from scheduler.cluster import ClusterState, Node, Placement
from scheduler.job import JobView
from simulator.error import ErrorModel
from simulator.replay import SimConfig, replay

GIB = 1 << 30
STEPS = 100
POLICIES = ("elasticflow", "elastic", "has", "has-paper", "sia", "opportunistic")


def _plan(gpu_type: str, step_s: float, rank: int) -> Plan:
    """4 GPUs (dp4): 24 GiB of tensors, 1 GiB outside them, 28 GiB required a GPU."""
    mem = MemoryBreakdown(parameters=12 * GIB, gradients=0, optimizer_states=0,
                          activations=12 * GIB, logits=0, overhead=1 * GIB)
    step = StepTime(compute_s=step_s, tp_comm_s=0.0, pp_bubble_s=0.0, pp_p2p_s=0.0,
                    dp_comm_s=0.0, optimizer_s=0.0, total_s=step_s)
    return Plan(gpu_type=gpu_type, parallel=ParallelConfig(tp=1, pp=1, dp=4),
                precision=Precision.FP16, memory=mem, step=step, num_steps=STEPS,
                required_bytes=28 * GIB, rank=rank)


def _job(deadline: float | None = None) -> JobView:
    return JobView(id="j", submit_time=0.0, plans=(_plan("V100-32G", 1.0, 1),
                                                   _plan("A100-80G", 2.0, 2)),
                   total_steps=STEPS, deadline=deadline)


def _cluster() -> ClusterState:
    return ClusterState((Node("v0", "V100-32G", 32 * GIB, 4, 4, "nvlink"),
                         Node("a0", "A100-80G", 80 * GIB, 4, 4, "nvlink")))


class _Perf:
    """A plan runs at its planned speed wherever it is placed."""

    def placed_plan(self, job: JobView, plan: Plan, placement: Placement,
                    state: ClusterState) -> Plan:
        return plan


def _truth(monkeypatch: pytest.MonkeyPatch, memory: float) -> None:
    """Every job's true peak is its prediction × ``memory``; step times are as predicted."""

    class Truth(ErrorModel):
        def step_factor(self, job_id: str, gpu_type: str) -> float:
            return 1.0

        def memory_factor(self, job_id: str) -> float:
            return memory

    monkeypatch.setattr("simulator.replay.ErrorModel", Truth)


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("deadline", [None, 5_000.0])
def test_a_job_out_of_memory_is_placed_again_on_the_plan_that_fits(
        monkeypatch: pytest.MonkeyPatch, policy: str, deadline: float | None) -> None:
    _truth(monkeypatch, 1.3)
    res = replay([_job(deadline)], _cluster(), policy, perf=_Perf(),
                 config=SimConfig(tick_s=600.0, error="measured"))
    assert res.backend.over_memory == {"j"}
    # ran on the V100s at 1 s a step, then on the A100s at 2 s
    assert res.backend.step_time_by_job["j"] == [1.0, 2.0]
    assert res.metrics.finished == 1 and res.unfinished == {}
    rec = res.records["j"]
    assert rec.allocation is None and rec.view.restarts == 1
    assert rec.view.extra["memory_factor"] == pytest.approx(1.3 * (1 + OOM_MARGIN))
    (kept,) = rec.view.plans
    assert kept.gpu_type == "A100-80G"
    # OOM at the end of the first launch (t = 10 s), re-placed in the same turn, launched
    # again (10 s; no step was done, nothing to restore) and 100 steps of 2 s
    oom_at = DEFAULT_LAUNCH_DELAY_S
    assert rec.end_time == pytest.approx(oom_at + DEFAULT_LAUNCH_DELAY_S + STEPS * 2.0)


@pytest.mark.parametrize("policy", POLICIES)
def test_a_job_no_gpu_can_hold_fails_with_what_was_measured(
        monkeypatch: pytest.MonkeyPatch, policy: str) -> None:
    # true peak 25 GiB × 3.5 = 87.5 GiB: out of memory on the V100s; re-planned ×3.85 the
    # plans need 28 × (24 × 3.85 + 1) / 25 = 104.6 GiB, above the A100-80G's 80 GiB too
    _truth(monkeypatch, 3.5)
    res = replay([_job()], _cluster(), policy, perf=_Perf(),
                 config=SimConfig(tick_s=600.0, error="measured"))
    assert res.metrics.finished == 0 and res.metrics.unfinished == 1
    assert res.backend.step_time_by_job["j"] == [1.0]  # never launched again
    why = res.unfinished["j"]
    assert why.startswith("failed: out of memory: ")
    assert "3.50x the 24 GiB predicted" in why
    assert "no plan of this job fits a GPU of this cluster" in why
    assert res.records["j"].end_time == pytest.approx(DEFAULT_LAUNCH_DELAY_S)


class _Idle:
    """Places nothing, ever."""

    name = "idle"

    def decide(self, state, pending, running, now):  # type: ignore[no-untyped-def]
        return []


def test_a_job_no_round_places_is_reported_unfinished_and_the_replay_ends() -> None:
    job = replace(_job(), submit_time=100.0)
    pol = _Idle()
    res = replay([job], _cluster(), pol, perf=_Perf(), config=SimConfig(tick_s=600.0))
    # called on the arrival (t = 100 s) and at the next tick (t = 600 s; ticks every 600 s
    # from t = 0): nothing placed on an idle cluster with nothing more to come, it ends there
    assert res.controller.policy_call_count == 2
    assert res.loop.clock.now() == 600.0
    assert res.metrics.unfinished == 1
    assert res.unfinished == {"j": (
        "never placed: at t=600s the cluster was idle with nothing more to arrive or happen "
        "and idle placed it in no round; 2 plan(s), its smallest plan needs 4xV100-32G "
        "(28 GiB each)")}
