"""HAS (Frenzy Algorithm 1): plan walk, best-fit placement, backfilling, re-timing."""

from __future__ import annotations

import pytest
from builders import (
    GIB,
    IdentityPerf,
    NodesPenaltyPerf,
    apply_decisions,
    assert_allocation_valid,
    cluster,
    make_job,
    make_node,
    make_plan,
    phoebe,
    ranked,
)

from scheduler.cluster import Allocation, ClusterState
from scheduler.decision import DecisionKind
from scheduler.job import JobView, RunningJob
from scheduler.policies.has import HasPolicy
from scheduler.policy import make_policy, policy_names


def test_registered() -> None:
    assert {"has", "opportunistic", "sia"} <= set(policy_names())
    assert isinstance(make_policy("has", perf=IdentityPerf()), HasPolicy)


def test_takes_first_plan_the_free_gpus_satisfy() -> None:
    # 8xA100 ranked first but only 4 A100 free: the walk falls to plan #2 (4xA100),
    # not to plan #3 (RTX) even though 8 RTX are free
    state = cluster(make_node("dgx", "A100-40G", 8, 4, interconnect="nvlink"),
                    make_node("rtx", "RTX2080Ti", 8))
    job = make_job("j", ranked(make_plan("A100-40G", 8, step_s=1.0),
                               make_plan("A100-40G", 4, step_s=1.8),
                               make_plan("RTX2080Ti", 8, step_s=3.0, req_gib=9)))
    (d,) = HasPolicy(IdentityPerf()).decide(state, [job], [], 0.0)
    assert d.kind is DecisionKind.START
    assert d.allocation is not None
    assert d.allocation.plan.num_gpus == 4 and d.allocation.plan.gpu_type == "A100-40G"
    assert d.allocation.placement == (("dgx", 4),)
    assert "plan #2" in d.reason and "plans #1-#1 did not fit" in d.reason


def test_a_plan_of_one_type_never_lands_on_another_type() -> None:
    # the A100 plan's memory (30 GiB) would fit the 48 GB L40S, but it was sized and timed for A100
    state = cluster(make_node("l40s", "L40S", 8))
    job = make_job("j", ranked(make_plan("A100-40G", 2, req_gib=30)))
    assert HasPolicy(IdentityPerf()).decide(state, [job], [], 0.0) == []


def test_plans_needing_more_memory_than_the_gpus_have_are_skipped() -> None:
    state = cluster(make_node("rtx", "RTX2080Ti", 8))  # 11 GiB cards
    job = make_job("j", ranked(make_plan("RTX2080Ti", 2, req_gib=12),
                               make_plan("RTX2080Ti", 4, req_gib=10)))
    (d,) = HasPolicy(IdentityPerf()).decide(state, [job], [], 0.0)
    assert d.allocation is not None and d.allocation.num_gpus == 4


def test_paper_example_best_fit_node_for_two_gpu_job() -> None:
    # Job(2, 32GB) goes to Node(3, 40) rather than Node(6, 80)
    state = cluster(make_node("n80", "A100", 8, 6, memory_gib=80),
                    make_node("n40", "A100", 8, 3, memory_gib=40))
    job = make_job("j", ranked(make_plan("A100", 2, req_gib=32)))
    (d,) = HasPolicy(IdentityPerf()).decide(state, [job], [], 0.0)
    assert d.allocation is not None and d.allocation.placement == (("n40", 2),)
    assert "best-fit on n40" in d.reason


def test_paper_example_one_node_rather_than_four() -> None:
    nodes = [make_node(f"one-{i}", "A100-40G", 8, 1) for i in range(4)]
    nodes.append(make_node("four", "A100-40G", 8, 4))
    job = make_job("j", ranked(make_plan("A100-40G", 4, req_gib=35)))
    (d,) = HasPolicy(IdentityPerf()).decide(cluster(*nodes), [job], [], 0.0)
    assert d.allocation is not None and d.allocation.placement == (("four", 4),)


def test_jobs_in_one_call_share_the_free_gpus_fcfs() -> None:
    state = cluster(make_node("a", "A100-40G", 8, 6), make_node("b", "A100-40G", 8, 2))
    jobs = [make_job(f"j{i}", ranked(make_plan("A100-40G", 4)), submit=i) for i in range(3)]
    out = HasPolicy(IdentityPerf()).decide(state, jobs, [], 0.0)
    # j0 best-fits a (6 free; b has 2), j1 then needs 4 of a:2 + b:2 -> spread; j2 waits
    assert [d.job_id for d in out] == ["j0", "j1"]
    assert out[0].allocation is not None and out[0].allocation.placement == (("a", 4),)
    assert out[1].allocation is not None
    assert sorted(out[1].allocation.placement) == [("a", 2), ("b", 2)]
    applied = apply_decisions(state, [], out)
    assert applied.state.free_gpus == 0


def test_backfill_lets_a_later_job_start_and_strict_fcfs_does_not() -> None:
    state = cluster(make_node("a", "A100-40G", 8, 2))
    big = make_job("big", ranked(make_plan("A100-40G", 8)), submit=0)
    small = make_job("small", ranked(make_plan("A100-40G", 2)), submit=1)
    out = HasPolicy(IdentityPerf()).decide(state, [big, small], [], 5.0)
    assert [d.job_id for d in out] == ["small"]
    assert HasPolicy(IdentityPerf(), backfill=False).decide(state, [big, small], [], 5.0) == []


def test_full_cluster_or_empty_queue_gives_nothing() -> None:
    state = cluster(make_node("a", "A100-40G", 8, 0))
    job = make_job("j", ranked(make_plan("A100-40G", 1)))
    perf = IdentityPerf()
    assert HasPolicy(perf).decide(state, [job], [], 0.0) == []
    assert HasPolicy(perf).decide(phoebe(), [], [], 0.0) == []
    assert perf.calls == []


def test_plan_is_retimed_for_the_placement_it_gets() -> None:
    state = cluster(make_node("a", "A100-40G", 8, 2), make_node("b", "A100-40G", 8, 2))
    job = make_job("j", ranked(make_plan("A100-40G", 4, step_s=2.0)))
    # the stub's +50 % is within this guard (with the default 1.25 the job would wait)
    (d,) = HasPolicy(NodesPenaltyPerf(), max_slowdown=2.0).decide(state, [job], [], 0.0)
    assert d.allocation is not None and d.allocation.num_nodes == 2
    assert d.allocation.plan.step_time_s == 3.0  # 2 nodes: +50% in the stub
    assert "re-timed" in d.reason


def test_a_plan_its_placement_slows_too_much_is_passed_over_for_a_smaller_one() -> None:
    # 6 + 2 free: the 8-GPU plan splits over two nodes (+50 % in the stub: 1.5 s > 1.25 x
    # 1.0 s); the 4-GPU plan fits node a whole at its own 1.8 s
    state = cluster(make_node("a", "A100-40G", 8, 6), make_node("b", "A100-40G", 8, 2))
    job = make_job("j", ranked(make_plan("A100-40G", 8, step_s=1.0),
                               make_plan("A100-40G", 4, step_s=1.8)))
    (d,) = HasPolicy(NodesPenaltyPerf()).decide(state, [job], [], 0.0)
    assert d.allocation is not None
    assert d.allocation.placement == (("a", 4),)
    assert d.allocation.plan.step_time_s == 1.8
    # a looser guard takes the split 8-GPU placement at 1.5 s, as before the guard
    (d,) = HasPolicy(NodesPenaltyPerf(), max_slowdown=1.5).decide(state, [job], [], 0.0)
    assert d.allocation is not None and d.allocation.num_gpus == 8
    assert d.allocation.num_nodes == 2 and d.allocation.plan.step_time_s == 1.5


def test_when_every_fitting_plan_is_slowed_the_job_starts_only_if_no_later_than_its_slowest_plan(
) -> None:
    state = cluster(make_node("a", "A100-40G", 8, 2), make_node("b", "A100-40G", 8, 2))
    # 2 + 2 free: the 4-GPU plan splits (1.5 s x 100 steps = 150 s), the 3-GPU plan too
    # (2 + 1: 2.4 s, 240 s); the slowest plan takes 1.6 s x 100 = 160 s: 150 s is no later
    job = make_job("j", ranked(make_plan("A100-40G", 4, step_s=1.0),
                               make_plan("A100-40G", 3, step_s=1.6)))
    (d,) = HasPolicy(NodesPenaltyPerf()).decide(state, [job], [], 0.0)
    assert d.allocation is not None and d.allocation.num_gpus == 4
    assert d.allocation.plan.job_time_s == 150.0 and "ends soonest" in d.reason
    # the slowest plan takes 1.4 s x 100 = 140 s: 150 s on the split is later, so it waits
    job = make_job("j", ranked(make_plan("A100-40G", 4, step_s=1.0),
                               make_plan("A100-40G", 3, step_s=1.4)))
    assert HasPolicy(NodesPenaltyPerf()).decide(state, [job], [], 0.0) == []


def test_max_slowdown_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="max_slowdown"):
        HasPolicy(max_slowdown=0.9)


def test_phoebe_mix_every_allocation_valid() -> None:
    state = phoebe()
    jobs = []
    for i in range(12):
        jobs.append(make_job(f"j{i}", ranked(
            make_plan("A100-40G", 4, step_s=1.0, req_gib=30),
            make_plan("RTX6000", 4, step_s=3.0, req_gib=20),
            make_plan("RTX2080Ti", 8, step_s=4.0, req_gib=10)), submit=i))
    out = HasPolicy(IdentityPerf()).decide(state, jobs, [], 0.0)
    # 4 A100 jobs (16 GPUs), 1 RTX6000 job, 3 RTX2080Ti jobs
    kinds = [d.allocation.plan.gpu_type for d in out if d.allocation]
    assert kinds.count("A100-40G") == 4
    assert kinds.count("RTX6000") == 1
    assert kinds.count("RTX2080Ti") == 3
    applied = apply_decisions(state, [], out)
    for alloc in applied.holding.values():
        assert_allocation_valid(state, alloc)
    assert applied.state.free_gpus == 0


def test_required_bytes_units() -> None:
    assert make_plan("A100-40G", 1, req_gib=3).required_bytes == 3 * GIB


def _long_job_and_short_arrival() -> tuple[ClusterState, RunningJob, JobView]:
    """L: 100,000 s left on all 8 A100 of a full node (1 s/step); its 4-GPU plan is 2.2 s/step
    (10% more GPU-seconds, so shrinking it is not undoing growth). S: 600 s on one A100."""
    state = cluster(make_node("dgx", "A100-40G", 8, 0, interconnect="nvlink"))
    l_plans = ranked(make_plan("A100-40G", 8, step_s=1.0, num_steps=100_000),
                     make_plan("A100-40G", 4, step_s=2.2, num_steps=100_000))
    l_job = make_job("L", l_plans, total_steps=100_000)
    l_run = RunningJob(l_job, Allocation("L", l_plans[0], (("dgx", 8),)), started_at=0.0)
    s_job = make_job("S", ranked(make_plan("A100-40G", 1, step_s=1.0, num_steps=600)),
                     submit=1_000.0, total_steps=600)
    return state, l_run, s_job


def test_a_long_job_lends_gpus_to_a_short_one_and_gets_them_back_first() -> None:
    # nothing free for S. Loan cost = 600 s x (2.2 - 1) + 2 x 70 s restarts = 860 s, far
    # below S's wait (L's 100,000 s), and L has 4x more work left than S: L shrinks to 4 GPUs
    # in place.
    state, l_run, s_job = _long_job_and_short_arrival()
    policy = HasPolicy(IdentityPerf())
    (d,) = policy.decide(state, [s_job], [l_run], 1_000.0)
    assert d.kind is DecisionKind.RESIZE and d.job_id == "L"
    assert d.allocation is not None and d.allocation.placement == (("dgx", 4),)
    # S starts on the freed GPUs
    state = state.release(l_run.allocation).allocate(d.allocation)
    l_small = RunningJob(l_run.job, d.allocation, started_at=1_000.0)
    (s_start,) = policy.decide(state, [s_job], [l_small], 1_000.0)
    assert s_start.kind is DecisionKind.START and s_start.job_id == "S"
    # S has ended and T arrives: L is repaid its 8 GPUs before T may take any
    t_job = make_job("T", ranked(make_plan("A100-40G", 4, step_s=1.0, num_steps=50_000)),
                     submit=1_700.0, total_steps=50_000)
    decisions = policy.decide(state, [t_job], [l_small], 1_700.0)
    assert [(x.kind, x.job_id) for x in decisions] == [(DecisionKind.RESIZE, "L")]
    assert decisions[0].allocation is not None
    assert decisions[0].allocation.placement == (("dgx", 8),)
    assert "repaid" in decisions[0].reason


def test_without_loans_the_shrink_is_priced_as_permanent() -> None:
    # the same situation priced the old way: L's delay = 100,000 steps x 1.2 s + 70 s, far
    # above both S's expected wait and 10x its run time: no shrink
    state, l_run, s_job = _long_job_and_short_arrival()
    assert HasPolicy(IdentityPerf(), loans=False).decide(state, [s_job], [l_run], 1_000.0) == []


def test_has_starts_on_the_fastest_plan_at_the_knee_and_has_paper_on_the_ranked_first() -> None:
    # 1 GPU: 260 s (260 GPU-s, ranked #1); 4 GPUs: 68 s (272 GPU-s, within the knee's 80%);
    # 8 GPUs: 53 s (424 GPU-s, beyond it). Eight A100 free.
    state = cluster(make_node("dgx", "A100-40G", 8, interconnect="nvlink"))
    job = make_job("j", ranked(make_plan("A100-40G", 1, step_s=2.60),
                               make_plan("A100-40G", 4, step_s=0.68),
                               make_plan("A100-40G", 8, step_s=0.53)))
    # the knee walk alone (an idle node would widen the start: see the wide-start tests)
    (ours,) = HasPolicy(IdentityPerf(), widen_gain=None).decide(state, [job], [], 0.0)
    (paper,) = make_policy("has-paper", perf=IdentityPerf()).decide(state, [job], [], 0.0)
    assert ours.allocation is not None and ours.allocation.num_gpus == 4
    assert paper.allocation is not None and paper.allocation.num_gpus == 1


def test_a_job_of_seconds_starts_on_its_cheapest_plan() -> None:
    # 100 steps: 1 GPU 26 s (ranked #1), 4 GPUs 6.8 s. The 4-GPU plan is at the knee but saves
    # 19 s < min_saving_s (60 s), less than launching and joining three more workers costs.
    state = cluster(make_node("dgx", "A100-40G", 8, interconnect="nvlink"))
    job = make_job("j", ranked(make_plan("A100-40G", 1, step_s=0.26),
                               make_plan("A100-40G", 4, step_s=0.068)))
    (d,) = HasPolicy(IdentityPerf(), widen_gain=None).decide(state, [job], [], 0.0)
    assert d.allocation is not None and d.allocation.num_gpus == 1
    (d,) = HasPolicy(IdentityPerf(), min_saving_s=10.0, widen_gain=None).decide(
        state, [job], [], 0.0)
    assert d.allocation is not None and d.allocation.num_gpus == 4
    # nobody waits and the node is idle: the wide start takes the 4 GPUs (no floor by
    # default), unless it must save min_saving_s too
    (d,) = HasPolicy(IdentityPerf()).decide(state, [job], [], 0.0)
    assert d.allocation is not None and d.allocation.num_gpus == 4
    (d,) = HasPolicy(IdentityPerf(), widen_min_saving_s=None).decide(state, [job], [], 0.0)
    assert d.allocation is not None and d.allocation.num_gpus == 1


def _short_running_and_long_waiting(held: int) -> tuple[ClusterState, RunningJob, JobView]:
    """R: 5,000 of its 10,000 steps left; 8 A100 at 1 s/step or 4 at 2 s/step (the same
    GPU-seconds), holding ``held`` of the node's 8 GPUs since t = 0, so 5,000 s left on its
    fastest plan. W: 100,000 s of work on 4 A100 (1 s/step), waiting."""
    state = cluster(make_node("dgx", "A100-40G", 8, 8 - held, interconnect="nvlink"))
    r_plans = ranked(make_plan("A100-40G", 8, step_s=1.0, num_steps=10_000),
                     make_plan("A100-40G", 4, step_s=2.0, num_steps=10_000))
    r_job = JobView(id="R", submit_time=0.0, plans=r_plans, total_steps=10_000,
                    steps_done=5_000.0)
    r_plan = r_plans[0] if held == 8 else r_plans[1]
    r_run = RunningJob(r_job, Allocation("R", r_plan, (("dgx", held),)), started_at=0.0)
    w_job = make_job("W", ranked(make_plan("A100-40G", 4, step_s=1.0, num_steps=100_000)),
                     submit=500.0, total_steps=100_000)
    return state, r_run, w_job


def test_srpt_a_running_job_nearer_its_end_grows_before_a_longer_waiting_job_starts() -> None:
    # 4 A100 idle. R would finish in 5,000 s on all 8, W needs 100,000 s: SRPT gives the idle
    # GPUs to R (10,000 s left on 4 -> 5,000 + 70 s restart on 8: a 49% cut), W keeps waiting.
    state, r_run, w_job = _short_running_and_long_waiting(held=4)
    (d,) = HasPolicy(IdentityPerf()).decide(state, [w_job], [r_run], 1_000.0)
    assert (d.kind, d.job_id) == (DecisionKind.RESIZE, "R")
    assert d.allocation is not None and d.allocation.placement == (("dgx", 8),)
    # the published order (waiting jobs first, growth only when nobody waits) starts W instead
    (d,) = HasPolicy(IdentityPerf(), srpt=False).decide(state, [w_job], [r_run], 1_000.0)
    assert (d.kind, d.job_id) == (DecisionKind.START, "W")


def test_srpt_a_longer_waiting_job_does_not_undo_the_growth_of_a_shorter_one() -> None:
    # R holds all 8 GPUs (grown: its 4-GPU plan costs no more GPU-seconds). W (100,000 s)
    # waits; R ends in 5,000 s. Undoing R's growth would put the longer job first.
    state, r_run, w_job = _short_running_and_long_waiting(held=8)
    assert HasPolicy(IdentityPerf()).decide(state, [w_job], [r_run], 1_000.0) == []
    # the published order undoes it (without the guard below, which would keep it too)
    (d,) = HasPolicy(IdentityPerf(), srpt=False, undo_guard=False).decide(
        state, [w_job], [r_run], 1_000.0)
    assert (d.kind, d.job_id) == (DecisionKind.RESIZE, "R")
    assert d.allocation is not None and d.allocation.num_gpus == 4


def test_growth_is_not_undone_when_the_lender_would_lose_more_than_the_waiting_job_waits(
) -> None:
    # R holds all 8 GPUs, grown (its 4-GPU plan costs no more GPU-seconds), 5,000 s left.
    # W needs 4 GPUs for 100,000 s. Taking R back to 4 GPUs costs R two restarts (140 s) and
    # runs it at half speed while W runs: far more than the 5,000 s W waits for R to end
    # anyway. So growth stays, and W waits (order ignored: srpt=False).
    state, r_run, w_job = _short_running_and_long_waiting(held=8)
    assert HasPolicy(IdentityPerf(), srpt=False).decide(state, [w_job], [r_run], 1_000.0) == []
    # a short W (100 s on 4 GPUs): R loses 140 + 100 x (2 - 1) = 240 s < 5,000 s: undone
    short = make_job("W", ranked(make_plan("A100-40G", 4, step_s=1.0, num_steps=100)),
                     submit=500.0, total_steps=100)
    (d,) = HasPolicy(IdentityPerf(), srpt=False).decide(state, [short], [r_run], 1_000.0)
    assert (d.kind, d.job_id) == (DecisionKind.RESIZE, "R")
    assert d.allocation is not None and d.allocation.num_gpus == 4


def test_the_guard_counts_every_job_that_waits_behind_the_first() -> None:
    # W needs 4 GPUs for 6,000 s: R would lose 140 + 6,000 x (2 - 1) = 6,140 s, more than
    # the 5,000 s W alone waits for R to end: growth stays. With a second such job waiting,
    # both wait at least 5,000 s (10,000 s in all): growth is undone for the first.
    state, r_run, _ = _short_running_and_long_waiting(held=8)

    def w(name: str, submit: float) -> JobView:
        return make_job(name, ranked(make_plan("A100-40G", 4, step_s=1.0, num_steps=6_000)),
                        submit=submit, total_steps=6_000)

    policy = HasPolicy(IdentityPerf(), srpt=False)
    assert policy.decide(state, [w("W1", 500.0)], [r_run], 1_000.0) == []
    (d,) = HasPolicy(IdentityPerf(), srpt=False).decide(
        state, [w("W1", 500.0), w("W2", 600.0)], [r_run], 1_000.0)
    assert (d.kind, d.job_id) == (DecisionKind.RESIZE, "R")
    assert d.allocation is not None and d.allocation.num_gpus == 4


def test_a_growth_held_back_by_min_hold_asks_to_be_called_again() -> None:
    # R started at 900 s; at 1,000 s it has held its GPUs 100 s < min_hold_s (300 s): no
    # growth now, and the policy asks for a call at 1,200 s, when it may grow
    state, r_run, _ = _short_running_and_long_waiting(held=4)
    r_run = RunningJob(r_run.job, r_run.allocation, started_at=900.0)
    policy = HasPolicy(IdentityPerf())
    assert policy.decide(state, [], [r_run], 1_000.0) == []
    assert policy.wake_at == 1_200.0
    (d,) = policy.decide(state, [], [r_run], 1_200.0)
    assert (d.kind, d.job_id) == (DecisionKind.RESIZE, "R") and policy.wake_at is None


def _past_the_knee() -> tuple[ClusterState, RunningJob]:
    """Two nodes of 8 A100, R on one of them since t = 0: 10,000 steps left, 8 A100 at
    1 s/step (8 GPU-s a step, its cheapest) or 16 at 0.65 s/step (10.4 GPU-s: 1.3x the
    cheapest, past the knee's 1.25x)."""
    state = cluster(make_node("dgx-0", "A100-40G", 8, 0, interconnect="nvlink"),
                    make_node("dgx-1", "A100-40G", 8, interconnect="nvlink"))
    plans = ranked(make_plan("A100-40G", 8, step_s=1.0, num_steps=10_000),
                   make_plan("A100-40G", 16, step_s=0.65, num_steps=10_000))
    job = JobView(id="R", submit_time=0.0, plans=plans, total_steps=10_000)
    return state, RunningJob(job, Allocation("R", plans[0], (("dgx-0", 8),)), started_at=0.0)


def test_idle_past_knee_grows_onto_idle_gpus_only_when_nothing_waits() -> None:
    # 10,000 s left on 8 A100; on 16: 6,500 s + 70 s restart = 6,570 s, a 34% cut (>= 30%),
    # but the 16-GPU plan is past the knee: growth at the knee leaves 8 A100 idle
    state, r_run = _past_the_knee()
    assert HasPolicy(IdentityPerf(), idle_past_knee=False).decide(
        state, [], [r_run], 1_000.0) == []
    (d,) = HasPolicy(IdentityPerf()).decide(state, [], [r_run], 1_000.0)
    assert (d.kind, d.job_id) == (DecisionKind.RESIZE, "R")
    assert d.allocation is not None
    assert d.allocation.placement == (("dgx-0", 8), ("dgx-1", 8))
    assert "167 -> 110 min" in d.reason  # 10,000 s -> 6,570 s
    # a job waits (an RTX 2080Ti job, none here): the idle A100 are not handed out past the
    # knee while anyone waits
    waiting = make_job("W", ranked(make_plan("RTX2080Ti", 1)))
    assert HasPolicy(IdentityPerf()).decide(state, [waiting], [r_run], 1_000.0) == []
    # the cut must still clear min_gain: at 0.7 s/step (7,070 s, a 29% cut) it stays put
    plans = ranked(r_run.job.plans[0], make_plan("A100-40G", 16, step_s=0.7, num_steps=10_000))
    slow = RunningJob(JobView(id="R", submit_time=0.0, plans=plans, total_steps=10_000),
                      Allocation("R", plans[0], (("dgx-0", 8),)), started_at=0.0)
    assert HasPolicy(IdentityPerf()).decide(state, [], [slow], 1_000.0) == []


def test_growth_past_the_knee_is_undone_for_a_shorter_waiting_job() -> None:
    # R was grown onto both nodes (16 A100, 0.65 s/step: 6,500 s left on its fastest plan).
    # W needs 8 A100 for 1,000 s, less work than R: R goes back to its 8-GPU plan (fewer
    # GPU-seconds) on the first node, in place, and frees dgx-1 for W
    _, r_run = _past_the_knee()
    state = cluster(make_node("dgx-0", "A100-40G", 8, 0, interconnect="nvlink"),
                    make_node("dgx-1", "A100-40G", 8, 0, interconnect="nvlink"))
    grown = RunningJob(r_run.job, Allocation("R", r_run.job.plans[1],
                                             (("dgx-0", 8), ("dgx-1", 8))), started_at=0.0)
    w = make_job("W", ranked(make_plan("A100-40G", 8, step_s=1.0, num_steps=1_000)),
                 submit=900.0, total_steps=1_000)
    (d,) = HasPolicy(IdentityPerf()).decide(state, [w], [grown], 1_000.0)
    assert (d.kind, d.job_id) == (DecisionKind.RESIZE, "R")
    assert d.allocation is not None and d.allocation.placement == (("dgx-0", 8),)
    assert d.allocation.plan.num_gpus == 8


@pytest.mark.parametrize(("minimal", "kept"), [(True, 16), (False, 4)])
def test_undoing_growth_frees_what_the_waiting_job_needs_not_more(minimal: bool,
                                                                  kept: int) -> None:
    # L runs grown on all 32 A100 (2.42 s/step, 77.4 GPU-s a step); 16 A100 (3.81 s, 61.0)
    # and 4 A100 (13.2 s, 52.8; ZeRO-3) cost fewer GPU-seconds. W waits for 4 A100 and
    # none is free. Undoing L's growth down to 16 frees 16 >= 4 and keeps L at 3.81 s a
    # step; its cheapest plan would free 28 and run it 3.5x slower (the old rule)
    nodes = [make_node(f"dgx-{i}", "A100-40G", 8, 0, interconnect="nvlink") for i in range(4)]
    state = cluster(*nodes)
    steps = 100_000
    plans = ranked(make_plan("A100-40G", 4, step_s=13.2, num_steps=steps),
                   make_plan("A100-40G", 16, step_s=3.81, num_steps=steps),
                   make_plan("A100-40G", 32, step_s=2.42, num_steps=steps))
    grown = RunningJob(JobView(id="L", submit_time=0.0, plans=plans, total_steps=steps),
                       Allocation("L", plans[2], tuple((f"dgx-{i}", 8) for i in range(4))),
                       started_at=0.0)
    w = make_job("W", ranked(make_plan("A100-40G", 4, step_s=0.1, num_steps=1_000)),
                 submit=900.0, total_steps=1_000)
    out = HasPolicy(IdentityPerf(), minimal_undo=minimal).decide(state, [w], [grown], 1_000.0)
    shrink = [d for d in out if d.job_id == "L"]
    assert len(shrink) == 1 and shrink[0].kind is DecisionKind.RESIZE
    alloc = shrink[0].allocation
    assert alloc is not None and alloc.plan.num_gpus == kept
    assert sum(n for _, n in alloc.placement) == kept  # in place, on a prefix of its GPUs
    assert f"freeing {32 - kept} GPUs" in shrink[0].reason


def _grown_long_and_a_short_arrival(steps: int) -> tuple[ClusterState, RunningJob, JobView]:
    """L grown onto both A100 nodes (16 at 0.55 s/step; 8 at 1 s/step costs fewer
    GPU-seconds, 8 < 8.8 a step), 100,000 steps left. J arrives with ``steps`` steps:
    8 A100 at 0.1 s/step or 8 RTX 2080Ti at 0.3 s/step; the RTX node is free."""
    state = cluster(make_node("dgx-0", "A100-40G", 8, 0, interconnect="nvlink"),
                    make_node("dgx-1", "A100-40G", 8, 0, interconnect="nvlink"),
                    make_node("rtx", "RTX2080Ti", 8))
    plans = ranked(make_plan("A100-40G", 8, step_s=1.0, num_steps=100_000),
                   make_plan("A100-40G", 16, step_s=0.55, num_steps=100_000))
    long = RunningJob(JobView(id="L", submit_time=0.0, plans=plans, total_steps=100_000),
                      Allocation("L", plans[1], (("dgx-0", 8), ("dgx-1", 8))),
                      started_at=0.0)
    short = make_job("J", ranked(make_plan("A100-40G", 8, step_s=0.1, num_steps=steps),
                                 make_plan("RTX2080Ti", 8, step_s=0.3, req_gib=9,
                                           num_steps=steps)),
                     submit=1_000.0, total_steps=steps)
    return state, long, short


def test_reclaim_undoes_growth_for_an_arrival_when_it_gains_more_than_the_lender_loses() -> None:
    # J with 2,000 steps: 600 s on the RTX node, 200 s on 8 A100, a gain of 400 s. L back on
    # 8 A100 while J runs loses 200 s x (1 / 0.55 - 1) = 164 s plus two 70 s restarts = 304 s
    # < 400 s: L is shrunk in place to dgx-0 (a loan) and J starts on dgx-1
    state, long, short = _grown_long_and_a_short_arrival(2_000)
    policy = HasPolicy(IdentityPerf())
    resize_d, start_d = policy.decide(state, [short], [long], 1_000.0)
    assert (resize_d.kind, resize_d.job_id) == (DecisionKind.RESIZE, "L")
    assert resize_d.allocation is not None and resize_d.allocation.placement == (("dgx-0", 8),)
    assert (start_d.kind, start_d.job_id) == (DecisionKind.START, "J")
    assert start_d.allocation is not None
    assert start_d.allocation.placement == (("dgx-1", 8),)
    assert policy._loans == {"L": ("J", long.allocation.plan)}
    # without ``reclaim`` J starts on the RTX node and L keeps its GPUs
    (d,) = HasPolicy(IdentityPerf(), reclaim=False).decide(state, [short], [long], 1_000.0)
    assert d.allocation is not None and d.allocation.placement == (("rtx", 8),)


def test_reclaim_keeps_the_lender_when_it_would_lose_more() -> None:
    # J with 1,000 steps gains 300 - 100 = 200 s; L would lose 100 x 0.818 + 140 = 222 s
    state, long, short = _grown_long_and_a_short_arrival(1_000)
    (d,) = HasPolicy(IdentityPerf()).decide(state, [short], [long], 1_000.0)
    assert (d.kind, d.job_id) == (DecisionKind.START, "J")
    assert d.allocation is not None and d.allocation.placement == (("rtx", 8),)


def test_a_loan_is_not_repaid_onto_gpus_split_over_nodes() -> None:
    # L lent 4 of its 8 A100 (8 at 1 s/step, 4 at 2 s/step); its borrower has ended, but
    # jobs started meanwhile leave 2 free on dgx-0 beside L's 4 and 2 on dgx-1: the 8 GPUs
    # come back as 6 + 2 over two nodes, 1.5 s/step under NodesPenaltyPerf (> 1.25 x 1 s)
    state = cluster(make_node("dgx-0", "A100-40G", 8, 2, interconnect="nvlink"),
                    make_node("dgx-1", "A100-40G", 8, 2, interconnect="nvlink"))
    plans = ranked(make_plan("A100-40G", 8, step_s=1.0, num_steps=10_000),
                   make_plan("A100-40G", 4, step_s=2.0, num_steps=10_000))
    lender = RunningJob(JobView(id="L", submit_time=0.0, plans=plans, total_steps=10_000),
                        Allocation("L", plans[1], (("dgx-0", 4),)), started_at=1_000.0)
    policy = HasPolicy(NodesPenaltyPerf())
    policy._loans = {"L": ("B", plans[0])}
    assert policy.decide(state, [], [lender], 1_100.0) == []  # (growth held by min_hold_s)
    assert policy._loans == {}
    # where the split costs nothing (IdentityPerf) the loan is repaid on the same 6 + 2
    policy = HasPolicy(IdentityPerf())
    policy._loans = {"L": ("B", plans[0])}
    (d,) = policy.decide(state, [], [lender], 1_100.0)
    assert (d.kind, d.job_id) == (DecisionKind.RESIZE, "L")
    assert d.allocation is not None and d.allocation.placement == (("dgx-0", 6), ("dgx-1", 2))


def _a_7b_job() -> JobView:
    """Three A100 plans, shaped like llama-2-7b's on phoebe: 8 GPUs at 1.0 s a step (8.0
    GPU-s), 16 at 0.6 s (9.6 GPU-s) and 4 at 3.0 s (12.0 GPU-s: slower than the 8-GPU plan
    at more GPU-seconds, so dominated; past the knee too, 8.0 < 0.8 x 12.0)."""
    return make_job("L", ranked(make_plan("A100-40G", 8, step_s=1.0, num_steps=10_000),
                                make_plan("A100-40G", 16, step_s=0.6, num_steps=10_000),
                                make_plan("A100-40G", 4, step_s=3.0, num_steps=10_000)),
                    total_steps=10_000)


def test_a_dominated_plan_is_passed_over() -> None:
    # 4 A100 free on dgx-0, dgx-1 full: the ranked walk used to start L on its 4-GPU plan
    # (30,000 s on 4 GPUs); it now waits for the 8 that run it in 10,000 s at fewer
    # GPU-seconds, and nothing else is asked (no running job to shrink)
    state = cluster(make_node("dgx-0", "A100-40G", 8, 4, interconnect="nvlink"),
                    make_node("dgx-1", "A100-40G", 8, 0, interconnect="nvlink"))
    job = _a_7b_job()
    assert HasPolicy(IdentityPerf()).decide(state, [job], [], 0.0) == []
    # the old walk, kept behind the switch, in the ranked order (the stored ranking as it
    # is) and in has-paper (Algorithm 1 as published)
    for policy in (HasPolicy(IdentityPerf(), skip_dominated=False),
                   HasPolicy(IdentityPerf(), plan_order="ranked"),
                   make_policy("has-paper", perf=IdentityPerf())):
        (d,) = policy.decide(state, [job], [], 0.0)
        assert (d.kind, d.job_id) == (DecisionKind.START, "L")
        assert d.allocation is not None and d.allocation.placement == (("dgx-0", 4),)
        assert d.allocation.plan.step_time_s == 3.0
    # once 8 are free on one node L starts on its 8-GPU plan there
    state = cluster(make_node("dgx-0", "A100-40G", 8, 4, interconnect="nvlink"),
                    make_node("dgx-1", "A100-40G", 8, 8, interconnect="nvlink"))
    (d,) = HasPolicy(IdentityPerf()).decide(state, [job], [], 0.0)
    assert d.allocation is not None and d.allocation.placement == (("dgx-1", 8),)
    assert d.allocation.plan.num_gpus == 8


def test_a_smaller_plan_that_is_not_dominated_still_starts() -> None:
    # 4 A100 at 1.9 s a step cost 7.6 GPU-s < 8.0: fewer GPU-seconds, so not dominated by
    # the 8-GPU plan (only slower); with 4 free it starts there as before
    state = cluster(make_node("dgx-0", "A100-40G", 8, 4, interconnect="nvlink"))
    job = make_job("j", ranked(make_plan("A100-40G", 8, step_s=1.0),
                               make_plan("A100-40G", 4, step_s=1.9)))
    (d,) = HasPolicy(IdentityPerf()).decide(state, [job], [], 0.0)
    assert d.allocation is not None and d.allocation.placement == (("dgx-0", 4),)
    assert d.allocation.plan.step_time_s == 1.9


def test_no_running_job_is_shrunk_to_make_room_for_a_dominated_plan() -> None:
    # G runs grown on 4 A100 of dgx-0 (its 2-GPU plan costs no more GPU-seconds, 2 x 1.0 <=
    # 4 x 0.5, and G has more work left than L, 50,000 s against 6,000 s: its growth is
    # undone for L if that frees enough); dgx-1 is full. Undoing G frees 2, and 2 + 2 free
    # = 4 would hold only L's dominated 4-GPU plan; its 8- and 16-GPU plans need 6 and 14
    # more. Nothing is shrunk (the old code shrank G so that L could start on the 4)
    state = cluster(make_node("dgx-0", "A100-40G", 8, 2, interconnect="nvlink"),
                    make_node("dgx-1", "A100-40G", 8, 0, interconnect="nvlink"))
    g_plans = ranked(make_plan("A100-40G", 2, step_s=1.0, num_steps=100_000),
                     make_plan("A100-40G", 4, step_s=0.5, num_steps=100_000))
    grown = RunningJob(JobView(id="G", submit_time=0.0, plans=g_plans, total_steps=100_000),
                       Allocation("G", g_plans[1], (("dgx-0", 4),)), started_at=0.0)
    job = _a_7b_job()
    assert HasPolicy(IdentityPerf()).decide(state, [job], [grown], 10_000.0) == []
    (d,) = HasPolicy(IdentityPerf(), skip_dominated=False).decide(state, [job], [grown],
                                                                  10_000.0)
    assert (d.kind, d.job_id) == (DecisionKind.RESIZE, "G")
    assert d.allocation is not None and d.allocation.placement == (("dgx-0", 2),)


def _one_job_on_an_idle_node(steps: int) -> tuple[ClusterState, JobView]:
    """8 idle A100; a job of ``steps`` steps: 1 GPU at 2.6 s/step (2.6 GPU-s, ranked #1),
    4 at 0.68 s (2.72 GPU-s, at the knee), 8 at 0.53 s (4.24 GPU-s, past it: 2.6 < 0.8 x
    4.24)."""
    state = cluster(make_node("dgx", "A100-40G", 8, interconnect="nvlink"))
    job = make_job("j", ranked(make_plan("A100-40G", 1, step_s=2.60, num_steps=steps),
                               make_plan("A100-40G", 4, step_s=0.68, num_steps=steps),
                               make_plan("A100-40G", 8, step_s=0.53, num_steps=steps)),
                   total_steps=steps)
    return state, job


def test_a_job_started_while_nobody_waits_starts_wide_on_the_idle_gpus() -> None:
    # 1,000 steps: the knee walk gives it 4 A100 (680 s; 2,600 s on one saves >= 60 s).
    # Nobody else waits and 4 A100 stay idle: 8 GPUs run it at 0.53 s, 22 % faster (>= 10 %)
    # and 150 s sooner (>= min_saving_s), so it starts on all 8 (not launched yet: no restart)
    state, job = _one_job_on_an_idle_node(1_000)
    (d,) = HasPolicy(IdentityPerf()).decide(state, [job], [], 0.0)
    assert (d.kind, d.job_id) == (DecisionKind.START, "j")
    assert d.allocation is not None and d.allocation.placement == (("dgx", 8),)
    assert "widened" in d.reason and "0.680s -> 0.530s" in d.reason
    # off, it keeps the knee's plan
    (d,) = HasPolicy(IdentityPerf(), widen_gain=None).decide(state, [job], [], 0.0)
    assert d.allocation is not None and d.allocation.num_gpus == 4
    # 22 % is below a 25 % threshold
    (d,) = HasPolicy(IdentityPerf(), widen_gain=0.25).decide(state, [job], [], 0.0)
    assert d.allocation is not None and d.allocation.num_gpus == 4


def test_neither_the_ranked_order_nor_start_only_has_widens() -> None:
    # the ranked walk follows the stored ranking (#1: one GPU); without growth nothing would
    # take the extra GPUs back: the knee's 4 GPUs
    state, job = _one_job_on_an_idle_node(1_000)
    (d,) = HasPolicy(IdentityPerf(), plan_order="ranked").decide(state, [job], [], 0.0)
    assert d.allocation is not None and d.allocation.num_gpus == 1
    (d,) = HasPolicy(IdentityPerf(), grow=False).decide(state, [job], [], 0.0)
    assert d.allocation is not None and d.allocation.num_gpus == 4


def test_a_wide_starts_floor_on_a_job_of_seconds() -> None:
    # 100 steps: 8 GPUs save 15 s over 4 (68 s -> 53 s); the default floor (0) takes them,
    # None asks for min_saving_s (60 s), which 15 s does not clear
    state, job = _one_job_on_an_idle_node(100)
    (d,) = HasPolicy(IdentityPerf()).decide(state, [job], [], 0.0)
    assert d.allocation is not None and d.allocation.num_gpus == 8
    (d,) = HasPolicy(IdentityPerf(), widen_min_saving_s=None).decide(state, [job], [], 0.0)
    assert d.allocation is not None and d.allocation.num_gpus == 4
    # under 15 s the 15 s saving clears the floor, at 20 s it does not
    for floor, gpus in ((0.0, 8), (14.0, 8), (20.0, 4)):
        (d,) = HasPolicy(IdentityPerf(), widen_min_saving_s=floor).decide(state, [job], [],
                                                                          0.0)
        assert d.allocation is not None and d.allocation.num_gpus == gpus, floor
    with pytest.raises(ValueError, match="widen_min_saving_s"):
        HasPolicy(IdentityPerf(), widen_min_saving_s=-1.0)


def test_no_job_starts_wide_while_another_waits() -> None:
    # W (8 A100 only, 10,000 steps) cannot start beside j's knee plan: it waits, so j keeps
    # its 4 GPUs and the other 4 stay free for W's turn
    state, job = _one_job_on_an_idle_node(1_000)
    w = make_job("W", ranked(make_plan("A100-40G", 8, step_s=1.0, num_steps=10_000)),
                 total_steps=10_000)
    (d,) = HasPolicy(IdentityPerf()).decide(state, [job, w], [], 0.0)
    assert (d.job_id, d.allocation is not None and d.allocation.num_gpus) == ("j", 4)


def _two_on_a100_and_idle_v100(v100_step_s: float) -> tuple[ClusterState, list[RunningJob]]:
    """8 A100 held by A and B (4 each since t = 0), 8 V100 idle. Both: 4 A100 at 2 s/step,
    8 A100 at 1 s/step, 2,000 steps. A has done none (2,000 s left on its fastest plan), B
    half (1,000 s). A can also run on 8 V100 at ``v100_step_s``; B has no V100 plan."""
    state = cluster(make_node("a100", "A100-40G", 8, 0, interconnect="nvlink"),
                    make_node("v100", "V100-32G", 8, interconnect="nvlink"))
    both = (make_plan("A100-40G", 4, step_s=2.0, num_steps=2_000),
            make_plan("A100-40G", 8, step_s=1.0, num_steps=2_000))
    a_plans = ranked(*both, make_plan("V100-32G", 8, step_s=v100_step_s, num_steps=2_000))
    b_plans = ranked(*both)
    a = JobView(id="A", submit_time=0.0, plans=a_plans, total_steps=2_000)
    b = JobView(id="B", submit_time=0.0, plans=b_plans, total_steps=2_000, steps_done=1_000.0)
    return state, [RunningJob(a, Allocation("A", a_plans[0], (("a100", 4),)), 0.0),
                   RunningJob(b, Allocation("B", b_plans[0], (("a100", 4),)), 0.0)]


def test_exchange_moves_the_longer_job_to_an_idle_type_so_the_shorter_one_grows() -> None:
    # Nobody waits, the V100 node is idle and no job grows into it (A's V100 plan, 2.2 s,
    # is slower than where it runs). A (4,000 s left) onto 8 V100: 4,400 s + 70 s restart,
    # it loses 470 s; B (2,000 s left) onto all 8 A100: 1,000 s + 70 s, it gains 930 s.
    # The pair gains 460 s > 10 % of B's 2,000 s and > two restarts: both move
    state, running = _two_on_a100_and_idle_v100(2.2)
    out = HasPolicy(IdentityPerf()).decide(state, [], running, 1_000.0)
    assert [(d.kind, d.job_id) for d in out] == [(DecisionKind.RESIZE, "A"),
                                                 (DecisionKind.RESIZE, "B")]
    assert out[0].allocation is not None and out[0].allocation.placement == (("v100", 8),)
    assert out[1].allocation is not None and out[1].allocation.placement == (("a100", 8),)
    assert "100 -> 92 min" in out[0].reason  # 6,000 s -> 4,470 + 1,070 s for the pair
    applied = apply_decisions(state, running, out)  # feasible one decision at a time
    assert applied.state.free_gpus == 0
    # off, nothing moves
    assert HasPolicy(IdentityPerf(), exchange_gain=None).decide(state, [], running, 1_000.0) == []


def test_no_exchange_when_the_pair_gains_too_little_or_a_job_waits() -> None:
    # A on 8 V100 at 2.4 s: 4,800 + 70 s, it loses 870 s; B gains 930 s: 60 s < 200 s
    state, running = _two_on_a100_and_idle_v100(2.4)
    assert HasPolicy(IdentityPerf()).decide(state, [], running, 1_000.0) == []
    # a job waits (an RTX 2080Ti job; there is none): the idle V100 are not exchanged for
    state, running = _two_on_a100_and_idle_v100(2.2)
    waiting = make_job("W", ranked(make_plan("RTX2080Ti", 1)))
    assert HasPolicy(IdentityPerf()).decide(state, [waiting], running, 1_000.0) == []
    # held less than min_hold_s (300 s): too early to move either
    assert HasPolicy(IdentityPerf()).decide(state, [], running, 200.0) == []
