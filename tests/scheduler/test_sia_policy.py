"""Sia baseline: configuration sets, restart factor, and MILPs small enough to solve by hand."""

from __future__ import annotations

import pytest
from builders import (
    IdentityPerf,
    apply_decisions,
    assert_allocation_valid,
    cluster,
    make_job,
    make_node,
    make_plan,
    ranked,
)

from predictor.plan import Plan
from scheduler.cluster import Allocation, ClusterState, Placement
from scheduler.decision import DecisionKind
from scheduler.job import JobView, RunningJob
from scheduler.policies.sia import (
    SiaPolicy,
    config_plan_counts,
    realloc_factor,
    sia_config_counts,
)


def _linear_job(job_id: str, gpu_type: str = "A100-40G", submit: float = 0.0):
    """Plans on 1, 2 and 4 GPUs with perfect scaling: step 4/n seconds."""
    return make_job(job_id, ranked(*(make_plan(gpu_type, n, step_s=4.0 / n) for n in (1, 2, 4))),
                    submit=submit)


def _sia(**kw) -> SiaPolicy:
    return SiaPolicy(IdentityPerf(), **kw)


def test_config_sets_follow_the_artifact() -> None:
    assert sia_config_counts(8, 3) == [1, 2, 4, 8, 16, 24]  # CONFIGS_8GPU up to 3 nodes
    assert sia_config_counts(4, 3) == [1, 2, 4, 8, 12]  # CONFIGS_4GPU up to 3 nodes
    assert sia_config_counts(4, 1) == [1, 2, 4]


def test_a_configuration_runs_the_largest_plan_it_holds() -> None:
    # the artifact's scale unit: a 3-GPU replica runs c // 3 replicas on c GPUs
    assert config_plan_counts([1, 2, 4, 8, 16], [3, 6, 12]) == [3, 6, 12]
    assert config_plan_counts([1, 2, 4, 8, 16, 24], [1, 2, 4, 8, 16, 24]) == [1, 2, 4, 8, 16, 24]
    assert config_plan_counts([1, 2, 4, 8, 16, 24], [2, 12]) == [2, 12]  # 24 -> 12 once
    assert config_plan_counts([1, 2], [4]) == []


def test_a_pipeline_job_with_no_power_of_two_plan_is_placed() -> None:
    # plans of 3 and 6 GPUs only (a 3-stage pipeline): configurations 4 and 8 run them;
    # on one idle 8-GPU node the MILP gives it 6 (perfect scaling: cost 6^-0.5 < 3^-0.5)
    state = cluster(make_node("n", "A100-40G", 8))
    job = make_job("pp3", ranked(make_plan("A100-40G", 3, step_s=2.0),
                                 make_plan("A100-40G", 6, step_s=1.0)))
    out = _sia().decide(state, [job], [], 0.0)
    assert [(d.job_id, d.allocation.num_gpus) for d in out if d.allocation] == [("pp3", 6)]
    assert out[0].allocation is not None
    assert_allocation_valid(state, out[0].allocation)


def test_realloc_factor_is_pollux_s() -> None:
    assert realloc_factor(10.0, 0, 30.0) == 1.0  # younger than one restart
    assert realloc_factor(100.0, 0, 30.0) == pytest.approx(100 / 130)
    assert realloc_factor(100.0, 2, 30.0) == pytest.approx(40 / 130)
    assert realloc_factor(100.0, 5, 30.0) == 0.0


def test_two_jobs_share_four_gpus_two_each() -> None:
    # normalised goodput = GPU count (perfect scaling), cost = round(n^-0.5, 2):
    #   1 GPU -> 1.00, 2 -> 0.71, 4 -> 0.50; a job left out costs lambda_n = 1.1.
    #   {4, none} = 1.60, {2, 2} = 1.42, {2, 1} = 1.71, {1, 1} = 2.00  ->  2 + 2.
    state = cluster(make_node("n", "A100-40G", 4))
    policy = _sia()
    out = policy.decide(state, [_linear_job("a"), _linear_job("b", submit=1)], [], 0.0)
    assert sorted((d.job_id, d.allocation.num_gpus) for d in out if d.allocation) == [
        ("a", 2), ("b", 2)]
    assert all(d.kind is DecisionKind.START for d in out)
    assert policy.last_round is not None
    assert policy.last_round.objective == pytest.approx(1.42)
    assert policy.last_round.variables == 6


def test_goodput_aware_type_assignment() -> None:
    # one A100 and one 2080Ti. X runs 4x faster on the A100, Y only 1.2x.
    #   X: G = {rtx 1, a100 4}  -> costs {1.00, 0.50};  Y: G = {rtx 1, a100 1.2} -> {1.00, 0.91}
    #   X->A100, Y->RTX = 1.50  <  X->RTX, Y->A100 = 1.91
    state = cluster(make_node("dgx", "A100-40G", 1), make_node("rtx", "RTX2080Ti", 1))
    x = make_job("x", ranked(make_plan("A100-40G", 1, step_s=1.0),
                             make_plan("RTX2080Ti", 1, step_s=4.0, req_gib=8)))
    y = make_job("y", ranked(make_plan("A100-40G", 1, step_s=1.0),
                             make_plan("RTX2080Ti", 1, step_s=1.2, req_gib=8)), submit=1)
    policy = _sia()
    out = policy.decide(state, [x, y], [], 0.0)
    got = {d.job_id: d.allocation.plan.gpu_type for d in out if d.allocation}
    assert got == {"x": "A100-40G", "y": "RTX2080Ti"}
    assert policy.last_round is not None and policy.last_round.objective == pytest.approx(1.50)


def _running(job, plan, placement, started_at: float) -> RunningJob:
    return RunningJob(job, Allocation(job.id, plan, placement), started_at)


def _mover(a100_step: float):
    rtx = make_plan("RTX2080Ti", 1, step_s=1.1, req_gib=8)
    job = make_job("r", ranked(make_plan("A100-40G", 1, step_s=a100_step), rtx))
    state = cluster(make_node("dgx", "A100-40G", 1), make_node("rtx", "RTX2080Ti", 1, 0))
    return state, job, rtx


def test_restart_penalty_keeps_a_job_where_a_small_gain_would_move_it() -> None:
    # running on the 2080Ti (G=1, cost 1.00); the A100 is 1.1x faster: G=1.1, cost 0.95 + 0.01
    # would win, but after 100 s with R = 30 s, r = 100/130: G = 0.846 -> cost 1.09 + 0.01 > 1.00
    state, job, rtx = _mover(1.0)
    run = _running(job, rtx, (("rtx", 1),), started_at=0.0)
    assert _sia(restart_penalty_s=30.0).decide(state, [], [run], 100.0) == []


def test_a_large_gain_is_worth_a_restart() -> None:
    # A100 4.4x faster: G = 4.4 * 100/130 = 3.38 -> cost 0.54 + 0.01 < 1.00: resize
    state, job, rtx = _mover(0.25)
    run = _running(job, rtx, (("rtx", 1),), started_at=0.0)
    (d,) = _sia(restart_penalty_s=30.0).decide(state, [], [run], 100.0)
    assert d.kind is DecisionKind.RESIZE
    assert d.allocation is not None and d.allocation.placement == (("dgx", 1),)
    apply_decisions(state, [run], [d])


def test_a_job_mid_checkpoint_restore_is_not_moved() -> None:
    state, job, rtx = _mover(0.25)
    run = _running(job, rtx, (("rtx", 1),), started_at=90.0)  # restarted 10 s ago (< R)
    assert _sia().decide(state, [], [run], 100.0) == []


def test_preempts_when_another_job_gains_more_from_the_gpus() -> None:
    # R only runs on the A100 (its one config: cost 1.00) and holds it. P runs 4x faster there
    # than on the free 2080Ti.  keep R, P->RTX: 1.00 + 1.00 = 2.00;
    # stop R (age 600 s, R = 70 s: r = 600/670, leaving it out costs 1.1 * r^-0.5 = 1.162),
    # P->A100: 1.162 + 0.50 = 1.662  ->  Sia preempts R (its p<0 fairness trades R's
    # allocation for P's larger relative gain; the 2080Ti stays idle: R cannot use it).
    state = cluster(make_node("dgx", "A100-40G", 1, 0), make_node("rtx", "RTX2080Ti", 1))
    r_plan = make_plan("A100-40G", 1, step_s=1.0)
    r = make_job("r", ranked(r_plan))
    p = make_job("p", ranked(make_plan("A100-40G", 1, step_s=1.0),
                             make_plan("RTX2080Ti", 1, step_s=4.0, req_gib=8)), submit=5)
    run = _running(r, r_plan, (("dgx", 1),), started_at=0.0)
    out = _sia().decide(state, [p], [run], 600.0)
    assert [(d.kind, d.job_id) for d in out] == [(DecisionKind.STOP, "r"),
                                                 (DecisionKind.START, "p")]
    assert "preempted" in out[0].reason
    apply_decisions(state, [run], out)


def test_rounds_and_filling_idle_gpus_between_them() -> None:
    state = cluster(make_node("n", "A100-40G", 4))
    # R = 30 s: at 60 s, r = 60/90; a on 2 GPUs: G = 2 * 2/3 -> 0.87 + 0.01, b on 2: 0.71,
    # total 1.59 < a keeps 4 (0.50) + b left out (1.10) = 1.60
    policy = _sia(restart_penalty_s=30.0)
    (d0,) = policy.decide(state, [_linear_job("a")], [], 0.0)  # alone: takes all 4
    assert d0.allocation is not None and d0.allocation.num_gpus == 4
    run = RunningJob(_linear_job("a"), d0.allocation, 0.0)
    after = apply_decisions(state, [], [d0]).state
    # mid-round, nothing idle: nothing to do, and running jobs are never touched mid-round
    assert policy.decide(after, [_linear_job("b", submit=10)], [run], 10.0) == []
    # at the boundary (60 s) the round re-solves: a goes 4 -> 2, b gets 2
    out = policy.decide(after, [_linear_job("b", submit=10)], [run], 60.0)
    assert sorted((d.kind.value, d.job_id, d.allocation.num_gpus) for d in out
                  if d.allocation) == [("resize", "a", 2), ("start", "b", 2)]


def test_fill_idle_starts_waiting_jobs_without_touching_running_ones() -> None:
    state = cluster(make_node("n", "A100-40G", 4, 2))
    a_plan = make_plan("A100-40G", 2, step_s=2.0)
    run = RunningJob(_linear_job("a"), Allocation("a", a_plan, (("n", 2),)), 0.0)
    policy = _sia()
    policy.decide(state, [], [run], 0.0)  # round at t=0 (a keeps its 2; 2 left idle)
    out = policy.decide(state, [_linear_job("b", submit=5)], [run], 5.0)
    assert [(d.kind, d.job_id, d.allocation.num_gpus) for d in out if d.allocation] == [
        (DecisionKind.START, "b", 2)]
    assert "fill-idle" in out[0].reason
    strict = _sia(fill_idle_between_rounds=False)
    strict.decide(state, [], [run], 0.0)
    assert strict.decide(state, [_linear_job("b", submit=5)], [run], 5.0) == []


def test_rigid_mode_uses_the_requested_count() -> None:
    state = cluster(make_node("n", "A100-40G", 4))
    job = make_job("j", _linear_job("j").plans, requested=2)
    (adaptive,) = _sia().decide(state, [job], [], 0.0)
    (rigid,) = _sia(mode="rigid").decide(state, [job], [], 0.0)
    assert adaptive.allocation is not None and adaptive.allocation.num_gpus == 4
    assert rigid.allocation is not None and rigid.allocation.num_gpus == 2


def test_phoebe_scale_solution_is_valid() -> None:
    nodes = [make_node(f"rtx-{i}", "RTX2080Ti", 8) for i in range(3)]
    nodes += [make_node(f"dgx-{i}", "A100-40G", 8, interconnect="nvlink") for i in range(2)]
    nodes.append(make_node("quad", "RTX6000", 4))
    state = cluster(*nodes)
    jobs = []
    for i in range(20):
        plans = [make_plan("A100-40G", n, step_s=(2.0 + i % 3) / n ** 0.9) for n in (1, 2, 4, 8)]
        plans += [make_plan("RTX6000", n, step_s=(5.0 + i % 4) / n ** 0.8, req_gib=16)
                  for n in (2, 4)]
        plans += [make_plan("RTX2080Ti", n, step_s=(8.0 + i % 5) / n ** 0.8, req_gib=10)
                  for n in (4, 8, 16)]
        jobs.append(make_job(f"j{i}", ranked(*plans), submit=i))
    out = _sia().decide(state, jobs, [], 0.0)
    applied = apply_decisions(state, [], out)
    for alloc in applied.holding.values():
        assert_allocation_valid(state, alloc)
    assert len(out) >= 10


def test_stopping_a_running_job_costs_the_restart_penalty() -> None:
    """Two jobs that run only on the one A100, same speed, one holding it. In the artifact's
    objective a swap is free: keep R + leave P out = 1.00 + 1.10 = stop R + start P. Charging
    the stop (age 300 s, R = 70 s: r = 300/370, left out costs 1.1 * r^-0.5 = 1.2216) makes
    keeping R strictly cheaper (2.10 < 2.2216), so R keeps the GPU. Without the charge the
    objective ties and any rounding tips it."""
    state = cluster(make_node("dgx", "A100-40G", 1, 0))
    plan = make_plan("A100-40G", 1, step_s=1.0)
    r = make_job("r", ranked(plan))
    p = make_job("p", ranked(make_plan("A100-40G", 1, step_s=1.0)), submit=5)
    run = _running(r, plan, (("dgx", 1),), started_at=0.0)
    policy = _sia()
    assert policy.decide(state, [p], [run], 300.0) == []
    assert policy.last_round is not None
    assert policy.last_round.objective == pytest.approx(2.10)
    free = _sia(charge_stops=False)
    free.decide(state, [p], [run], 300.0)
    assert free.last_round is not None and free.last_round.objective == pytest.approx(2.10)


def test_a_job_is_held_at_least_its_restart() -> None:
    """Started 60 s ago (< the 70 s launch + checkpoint restore): frozen, even where moving it
    to a 4x faster GPU would pay (see ``test_a_large_gain_is_worth_a_restart``); at 80 s it
    moves."""
    state, job, rtx = _mover(0.25)
    job = make_job("r", job.plans, submit=-1000.0)
    policy = _sia()
    assert policy.min_hold_s == 70.0 and policy.restart_penalty_s == 70.0
    assert policy.decide(state, [], [_running(job, rtx, (("rtx", 1),), 0.0)], 60.0) == []
    (d,) = _sia().decide(state, [], [_running(job, rtx, (("rtx", 1),), 0.0)], 80.0)
    assert d.kind is DecisionKind.RESIZE
    with pytest.raises(ValueError, match="min_hold_s must be at least"):
        SiaPolicy(min_hold_s=30.0)


def test_rejects_parameters_outside_the_implemented_regime() -> None:
    with pytest.raises(ValueError):
        SiaPolicy(p=0.5)
    with pytest.raises(ValueError):
        SiaPolicy(lambda_n=0.9)
    with pytest.raises(ValueError):
        SiaPolicy(mode="elastic")


class _SplitDoubles:
    """A PerfModel stub: a plan spread over more than one node runs twice as long."""

    def placed_plan(self, job: JobView, plan: Plan, placement: Placement,
                    state: ClusterState) -> Plan:
        if len(placement) == 1:
            return plan
        from dataclasses import replace

        return plan.with_step(replace(plan.step, total_s=2 * plan.step.total_s))


def _on_one_gpu(a_free: int, restarts: int = 0):
    """R runs its 1-GPU plan (3 s/step) on node b (2 A100s, the other held by someone else);
    node a (2 A100s) has ``a_free`` free. R's 2-GPU plan takes 2 s packed, 4 s split."""
    one = make_plan("A100-40G", 1, step_s=3.0)
    two = make_plan("A100-40G", 2, step_s=2.0)
    r = make_job("r", ranked(two, one), submit=-1000.0, restarts=restarts)
    state = cluster(make_node("a", "A100-40G", 2, a_free), make_node("b", "A100-40G", 2, 0))
    return state, _running(r, one, (("b", 1),), started_at=0.0)


def test_an_alternative_that_would_be_split_is_valued_split() -> None:
    """One A100 free on a, R on one of b's: its 2-GPU configuration could only get a:1 + b:1
    (its own GPU back plus the free one), split, 4 s/step: slower than the 3 s it runs at.
    Valued packed (2 s) it looked 1.5x faster and R moved onto the split placement, then back
    (the rate_30 thrash). By hand, at 300 s (age 1,300 s, R = 70 s, r = 1300/1370 = 0.949):
    G = {1: 1/3, 2: 1/4}, normalised by the least (1/4 on 2 GPUs) to {1: 2.67, 2: 2.00};
    staying costs round(2.67^-0.5, 2) = 0.61, moving round((2.00 r)^-0.5, 2) + 0.01 = 0.74."""
    state, run = _on_one_gpu(a_free=1)
    policy = SiaPolicy(_SplitDoubles())
    assert policy.decide(state, [], [run], 300.0) == []
    assert policy.last_round is not None and policy.last_round.objective == pytest.approx(0.61)


def test_an_alternative_that_would_be_packed_and_pays_its_restart_moves() -> None:
    """Both of a's A100s free: the 2-GPU configuration gets a:2 on one node, 2 s/step.
    G = {1: 1/3, 2: 1/2} -> {1: 1.00, 2: 1.50}; staying costs 1.00, moving
    round((1.50 r)^-0.5, 2) + 0.01 = round(0.838, 2) + 0.01 = 0.85: R moves to a:2. With six
    restarts behind it (r = (1300 - 420)/1370 = 0.642) the gain no longer pays the restart:
    round((1.50 r)^-0.5, 2) + 0.01 = 1.02 + 0.01 > 1.00, it stays."""
    state, run = _on_one_gpu(a_free=2)
    policy = SiaPolicy(_SplitDoubles())
    (d,) = policy.decide(state, [], [run], 300.0)
    assert d.kind is DecisionKind.RESIZE
    assert d.allocation is not None and d.allocation.placement == (("a", 2),)
    assert d.allocation.plan.step_time_s == 2.0
    assert policy.last_round is not None and policy.last_round.objective == pytest.approx(0.85)
    apply_decisions(state, [run], [d])
    state, run = _on_one_gpu(a_free=2, restarts=6)
    assert SiaPolicy(_SplitDoubles()).decide(state, [], [run], 300.0) == []


def _r_and_o(r_node: str, o_node: str) -> tuple:
    """Nodes a and b (2 A100s each, the second GPU of each held by someone Sia cannot move).
    R runs its 1-GPU plan (3 s/step; 2 s on 2 GPUs packed, 4 s split) on ``r_node``; O runs
    its only plan (1 GPU) on ``o_node``. R's 2-GPU configuration needs O's GPU."""
    one = make_plan("A100-40G", 1, step_s=3.0)
    r = make_job("r", ranked(make_plan("A100-40G", 2, step_s=2.0), one), submit=-1000.0)
    o_plan = make_plan("A100-40G", 1, step_s=1.0)
    o = make_job("o", ranked(o_plan), submit=-1000.0)
    state = cluster(make_node("a", "A100-40G", 2, 0), make_node("b", "A100-40G", 2, 0))
    return state, [_running(r, one, ((r_node, 1),), 0.0), _running(o, o_plan, ((o_node, 1),), 0.0)]


def test_a_move_that_landed_split_is_valued_at_what_it_got() -> None:
    """R's 2-GPU configuration does not fit on the free GPUs plus its own (needs O's), so it is
    valued packed: at 300 s (age 1,300 s, r = 1300/1370) R moving to 2 costs
    round((1.5 r)^-0.5, 2) + 0.01 = 0.85 and leaving O out 1.1 r^-0.5 = 1.129: 1.98 < 2.00 for
    keeping both, so O stops and R takes a:1 + b:1, split, 4 s/step (not the 2 s it was valued
    at). Back on 1 GPU later (600 s, mirrored), a policy that has not seen this moves R again
    (0.84 + 1.124 = 1.96 < 2.00: the cycle). The one that placed it remembers 4 s for R's
    2 GPUs: G = {1: 1/3, 2: 1/4} -> {1: 2.67, 2: 2.00}, staying 0.61 + 1.00 = 1.61 < moving
    round((2.00 r)^-0.5, 2) + 0.01 + 1.124 = 0.73 + 1.124: R stays."""
    state, running = _r_and_o("b", "a")
    policy = SiaPolicy(_SplitDoubles())
    out = policy.decide(state, [], running, 300.0)
    assert sorted((d.kind.value, d.job_id) for d in out) == [("resize", "r"), ("stop", "o")]
    (grow,) = [d for d in out if d.job_id == "r"]
    assert grow.allocation is not None and grow.allocation.plan.step_time_s == 4.0
    assert sorted(grow.allocation.placement) == [("a", 1), ("b", 1)]
    state, running = _r_and_o("a", "b")
    assert [d.job_id for d in SiaPolicy(_SplitDoubles()).decide(state, [], running, 600.0)
            if d.kind is DecisionKind.RESIZE] == ["r"]
    assert policy.decide(state, [], running, 600.0) == []
