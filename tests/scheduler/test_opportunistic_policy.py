"""Opportunistic FCFS baseline: user's GPU count, fastest free type, first-fit placement."""

from __future__ import annotations

from builders import IdentityPerf, apply_decisions, cluster, make_job, make_node, make_plan, ranked

from scheduler.policies.opportunistic import OpportunisticPolicy


def _plans() -> tuple:
    # ranking (MARP's) deliberately differs from speed: opportunistic ignores it
    return ranked(
        make_plan("RTX2080Ti", 2, step_s=4.0, req_gib=10),
        make_plan("RTX2080Ti", 4, step_s=2.2, req_gib=9),
        make_plan("A100-40G", 1, step_s=2.0, req_gib=30),
        make_plan("A100-40G", 4, step_s=0.6, req_gib=20),
    )


def test_uses_the_requested_count_on_the_fastest_type() -> None:
    state = cluster(make_node("rtx", "RTX2080Ti", 8), make_node("dgx", "A100-40G", 8))
    job = make_job("j", _plans(), requested=4)
    (d,) = OpportunisticPolicy(IdentityPerf()).decide(state, [job], [], 0.0)
    assert d.allocation is not None
    assert (d.allocation.plan.gpu_type, d.allocation.num_gpus) == ("A100-40G", 4)
    assert "user asked 4 GPUs" in d.reason


def test_falls_to_the_next_fastest_type_when_the_fastest_is_busy() -> None:
    state = cluster(make_node("rtx", "RTX2080Ti", 8), make_node("dgx", "A100-40G", 8, 3))
    job = make_job("j", _plans(), requested=4)
    (d,) = OpportunisticPolicy(IdentityPerf()).decide(state, [job], [], 0.0)
    assert d.allocation is not None
    assert (d.allocation.plan.gpu_type, d.allocation.num_gpus) == ("RTX2080Ti", 4)


def test_a_count_no_plan_has_is_rounded_up_per_type() -> None:
    # asks 3: RTX has 4 (rounded up), A100 has 4 too; A100's 4-GPU plan is fastest
    state = cluster(make_node("rtx", "RTX2080Ti", 8), make_node("dgx", "A100-40G", 8))
    job = make_job("j", _plans(), requested=3)
    (d,) = OpportunisticPolicy(IdentityPerf()).decide(state, [job], [], 0.0)
    assert d.allocation is not None and d.allocation.num_gpus == 4


def test_no_request_uses_the_first_ranked_plans_count() -> None:
    state = cluster(make_node("rtx", "RTX2080Ti", 8))
    job = make_job("j", _plans())
    (d,) = OpportunisticPolicy(IdentityPerf()).decide(state, [job], [], 0.0)
    assert d.allocation is not None and d.allocation.num_gpus == 2


def test_first_fit_not_best_fit() -> None:
    state = cluster(make_node("a", "A100-40G", 8, 6), make_node("b", "A100-40G", 8, 4))
    job = make_job("j", ranked(make_plan("A100-40G", 4)), requested=4)
    (d,) = OpportunisticPolicy(IdentityPerf()).decide(state, [job], [], 0.0)
    assert d.allocation is not None and d.allocation.placement == (("a", 4),)


def test_fcfs_with_backfill_and_strict() -> None:
    state = cluster(make_node("a", "A100-40G", 8, 3))
    first = make_job("first", ranked(make_plan("A100-40G", 4)), requested=4, submit=0)
    second = make_job("second", ranked(make_plan("A100-40G", 2)), requested=2, submit=1)
    third = make_job("third", ranked(make_plan("A100-40G", 1)), requested=1, submit=2)
    out = OpportunisticPolicy(IdentityPerf()).decide(state, [first, second, third], [], 0.0)
    assert [d.job_id for d in out] == ["second", "third"]
    apply_decisions(state, [], out)
    strict = OpportunisticPolicy(IdentityPerf(), backfill=False)
    assert strict.decide(state, [first, second, third], [], 0.0) == []


def test_a_request_larger_than_any_type_runs_on_the_most_gpus_a_type_has() -> None:
    """Asks 32 GPUs; the cluster has 16 A100s and 8 2080Tis. The request is clamped per type
    (A100: 16, RTX: 8) and the faster clamped plan starts (16 A100s: 0.2 s/step). Before, no
    plan of 32 could ever be placed and the job waited forever."""
    state = cluster(make_node("a0", "A100-40G", 8), make_node("a1", "A100-40G", 8),
                    make_node("rtx", "RTX2080Ti", 8))
    plans = ranked(*(make_plan("A100-40G", n, step_s=3.2 / n) for n in (4, 8, 16, 32)),
                   *(make_plan("RTX2080Ti", n, step_s=12.8 / n, req_gib=8) for n in (8, 32)))
    job = make_job("big", plans, requested=32)
    (d,) = OpportunisticPolicy(IdentityPerf()).decide(state, [job], [], 0.0)
    assert d.allocation is not None
    assert (d.allocation.plan.gpu_type, d.allocation.num_gpus) == ("A100-40G", 16)
    assert "the most A100-40G this cluster has: 16" in d.reason
    # with the A100s busy it takes the 8 2080Tis (its RTX request clamped to 8)
    busy = cluster(make_node("a0", "A100-40G", 8, 0), make_node("a1", "A100-40G", 8),
                   make_node("rtx", "RTX2080Ti", 8))
    (d,) = OpportunisticPolicy(IdentityPerf()).decide(busy, [job], [], 0.0)
    assert d.allocation is not None
    assert (d.allocation.plan.gpu_type, d.allocation.num_gpus) == ("RTX2080Ti", 8)


def test_a_request_some_type_can_hold_is_not_clamped() -> None:
    """Asks 8: the 4-GPU RTX 6000 node is too small and is not offered (its 4-GPU plan is
    faster than 8 2080Tis, but the user asked for 8 and the 2080Tis can hold 8)."""
    state = cluster(make_node("q", "RTX6000", 4), make_node("rtx", "RTX2080Ti", 8))
    plans = ranked(make_plan("RTX6000", 4, step_s=1.0, req_gib=8),
                   make_plan("RTX6000", 8, step_s=0.5, req_gib=8),
                   make_plan("RTX2080Ti", 8, step_s=2.0, req_gib=8))
    (d,) = OpportunisticPolicy(IdentityPerf()).decide(state, [make_job("j", plans, requested=8)],
                                                      [], 0.0)
    assert d.allocation is not None
    assert (d.allocation.plan.gpu_type, d.allocation.num_gpus) == ("RTX2080Ti", 8)
