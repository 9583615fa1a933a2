"""``scheduler.corrected``: a policy shown step times corrected by the online estimator, and
decisions that carry the model's own step times back out."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from predictor.plan import Plan
from scheduler.cluster import Allocation
from scheduler.corrected import CorrectedPerfModel, CorrectedPolicy
from scheduler.decision import DecisionKind
from scheduler.estimator import StepTimeEstimator
from scheduler.job import RunningJob
from scheduler.policy import make_policy
from tests.scheduler.builders import IdentityPerf, cluster, make_job, make_node, make_plan, ranked


def _two_types() -> tuple[Plan, Plan]:
    # 4 A100 at 1.0 s a step, 4 V100 at 1.2 s: the model ranks the A100 plan first
    return make_plan("A100-40G", 4, step_s=1.0), make_plan("V100-32G", 4, step_s=1.2)


def test_with_step_factor_scales_every_part_and_undoes_exactly() -> None:
    p = make_plan("A100-40G", 4, step_s=2.0)
    p = p.with_step(replace(p.step, tp_comm_s=0.5, total_s=2.5))
    up = p.with_step_factor(1.5)
    assert up.step_factor == 1.5
    assert up.step.total_s == pytest.approx(3.75) and up.step.tp_comm_s == pytest.approx(0.75)
    assert up.step.compute_s == pytest.approx(3.0)
    # the factor is the whole correction, not a product of calls
    assert up.with_step_factor(0.5).step.total_s == pytest.approx(1.25)
    back = up.with_step_factor(1.0)
    assert back.step_factor == 1.0 and back.step.total_s == pytest.approx(2.5, rel=1e-15)
    assert p.with_step_factor(1.0) is p
    # a re-estimated step is the model's own again
    assert up.with_step(p.step).step_factor == 1.0
    d = up.to_dict()
    assert d["step_factor"] == 1.5 and Plan.from_dict(d) == up
    assert "step_factor" not in p.to_dict()
    with pytest.raises(ValueError, match="factor must be > 0"):
        p.with_step_factor(0.0)


def test_perf_model_scales_by_the_jobs_own_factor_else_its_groups() -> None:
    est = StepTimeEstimator()
    est.observe("seen", "A100-40G", "", predicted_s=1.0, observed_s=2.0)
    perf = CorrectedPerfModel(IdentityPerf(), est)
    plan = make_plan("A100-40G", 4, step_s=1.0)
    state = cluster(make_node("a", "A100-40G", 8))
    seen = perf.placed_plan(make_job("seen", [plan]), plan, (("a", 4),), state)
    assert seen.step_time_s == pytest.approx(2.0)
    # a job not seen yet: the group's mean log ratio over 1 job + 2 pseudo-jobs at 0
    other = perf.placed_plan(make_job("other", [plan]), plan, (("a", 4),), state)
    assert other.step_time_s == pytest.approx(2.0 ** (1 / 3))
    # no observation on the type: the model's own
    v = make_plan("V100-32G", 4, step_s=1.0)
    assert perf.placed_plan(make_job("seen", [v]), v, (("a", 4),), state) is v


def test_a_type_observed_slower_loses_its_rank_and_the_decision_carries_the_model_time() -> None:
    a100, v100 = _two_types()
    state = cluster(make_node("a", "A100-40G", 8), make_node("v", "V100-32G", 8))
    job = make_job("j", ranked(a100, v100))
    est = StepTimeEstimator()
    plain = make_policy("has", perf=IdentityPerf())
    assert plain.decide(state, [job], [], 0.0)[0].allocation.plan.gpu_type == "A100-40G"
    # another job of the family ran 2× slower than predicted on the A100s: the group's
    # correction, 2^(1/3) = 1.26, makes this job's A100 plan 1.26 s against the V100's 1.2
    est.observe("earlier", "A100-40G", "", predicted_s=1.0, observed_s=2.0)
    perf = CorrectedPerfModel(IdentityPerf(), est)
    pol = CorrectedPolicy(make_policy("has", perf=perf), perf)
    # who borrows the policy's performance model (the controller's fallback) gets the model's
    assert pol.perf is perf.inner
    d, = pol.decide(state, [job], [], 0.0)
    assert d.kind is DecisionKind.START and d.allocation is not None
    assert d.allocation.plan.gpu_type == "V100-32G"
    # what leaves the policy is the prediction: the backend runs and the estimator compares
    # against the model's own time
    assert d.allocation.plan.step_factor == 1.0
    assert d.allocation.plan.step_time_s == pytest.approx(1.2, rel=1e-15)


class _Seen:
    """A policy that records what it is shown and starts each waiting job on its first plan."""

    name = "seen"

    def __init__(self) -> None:
        self.pending: list[tuple[Plan, ...]] = []
        self.running: list[RunningJob] = []
        self.wake_at = 42.0

    def decide(self, state, pending, running, now):  # type: ignore[no-untyped-def]
        from scheduler.decision import start

        self.pending.extend(j.plans for j in pending)
        self.running.extend(running)
        return [start(Allocation(j.id, j.plans[0], (("a", j.plans[0].num_gpus),)), "first")
                for j in pending]


def test_policy_is_shown_corrected_plans_and_running_times_with_stable_identity() -> None:
    a100, v100 = _two_types()
    state = cluster(make_node("a", "A100-40G", 8), make_node("v", "V100-32G", 8))
    est = StepTimeEstimator()
    est.observe("r", "A100-40G", "", predicted_s=1.0, observed_s=1.5)
    perf = CorrectedPerfModel(IdentityPerf(), est)
    inner = _Seen()
    pol = CorrectedPolicy(inner, perf)
    assert pol.name == "seen" and pol.wake_at == 42.0  # optional attributes are the inner's
    waiting = make_job("w", ranked(a100, v100))
    run_plan = make_plan("A100-40G", 2, step_s=3.0)
    running = RunningJob(make_job("r", [run_plan]), Allocation("r", run_plan, (("a", 2),)), 0.0)
    out = pol.decide(state, [waiting], [running], 10.0)
    group = math.exp(math.log(1.5) / 3)
    shown, = inner.pending
    assert shown[0].step_time_s == pytest.approx(group) and shown[0].step_factor == group
    assert shown[1] is waiting.plans[1]  # nothing observed on the V100s
    r, = inner.running
    assert r.allocation.plan.step_time_s == pytest.approx(4.5)  # its own ratio, 1.5
    assert out[0].allocation.plan.step_factor == 1.0
    assert out[0].allocation.plan.step_time_s == pytest.approx(1.0, rel=1e-15)
    # a second call with the same factors shows the same objects (the policies' per-job
    # caches check identity); a new observation changes them
    pol.decide(state, [waiting], [running], 20.0)
    assert inner.pending[1] is inner.pending[0]
    assert inner.running[1].allocation is inner.running[0].allocation
    est.observe("r", "A100-40G", "", predicted_s=3.0, observed_s=3.0)
    pol.decide(state, [waiting], [running], 30.0)
    assert inner.pending[2] is not inner.pending[0]
    # the job's own ratio moved halfway (alpha 0.5) from ln 1.5 towards 0
    assert inner.running[2].allocation.plan.step_time_s == pytest.approx(3.0 * 1.5 ** 0.5)
    # ended jobs are forgotten
    pol.decide(state, [], [], 40.0)
    assert not pol._views and not pol._allocs
