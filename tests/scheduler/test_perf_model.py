"""AnalyticalPerfModel: a plan re-timed for its real placement (nodes, links, network)."""

from __future__ import annotations

import pytest
from builders import IdentityPerf, cluster, make_job, make_node, make_plan

from predictor.gpus import get_gpu
from predictor.planner import plan_job
from predictor.spec import ModelSpec, TrainingSpec
from scheduler.job import JobView
from scheduler.perf import AnalyticalPerfModel, placement_topology


@pytest.fixture(scope="module")
def job() -> JobView:
    model = ModelSpec.from_name("gpt2-large")
    train = TrainingSpec(global_batch=32, seq_len=1024, steps=100)
    res = plan_job(model, train, [get_gpu("A100-40G"), get_gpu("RTX2080Ti")], max_gpus=16)
    return JobView(id="j", submit_time=0.0, plans=res.plans, total_steps=100, model=model,
                   train=train)


def _plan(job: JobView, gpu_type: str, n: int):
    return next(p for p in job.plans if p.gpu_type == gpu_type and p.num_gpus == n)


def _dgx(n_nodes: int, free: int = 8):
    return cluster(*(make_node(f"dgx{i}", "A100-40G", 8, free, interconnect="nvlink")
                     for i in range(n_nodes)))


def test_packed_single_node_matches_the_planners_estimate(job: JobView) -> None:
    plan = _plan(job, "A100-40G", 4)
    placed = AnalyticalPerfModel().placed_plan(job, plan, (("dgx0", 4),), _dgx(1))
    assert placed.step_time_s == pytest.approx(plan.step_time_s, rel=1e-9)


def test_splitting_over_nodes_is_slower(job: JobView) -> None:
    plan = _plan(job, "A100-40G", 4)
    perf = AnalyticalPerfModel()
    one = perf.placed_plan(job, plan, (("dgx0", 4),), _dgx(2))
    two = perf.placed_plan(job, plan, (("dgx0", 2), ("dgx1", 2)), _dgx(2))
    assert two.step_time_s > one.step_time_s
    assert two.step.dp_comm_s > one.step.dp_comm_s


def test_pcie_node_is_no_faster_than_nvlink(job: JobView) -> None:
    plan = _plan(job, "A100-40G", 8)
    nv = _dgx(1)
    pcie = cluster(make_node("dgx0", "A100-40G", 8, interconnect="pcie"))
    perf = AnalyticalPerfModel()
    assert (perf.placed_plan(job, plan, (("dgx0", 8),), pcie).step_time_s
            >= perf.placed_plan(job, plan, (("dgx0", 8),), nv).step_time_s)


def test_bf16_job_on_a_gpu_without_bf16_is_retimed_in_the_plans_precision(job: JobView) -> None:
    plan = _plan(job, "RTX2080Ti", 8)
    state = cluster(make_node("rtx", "RTX2080Ti", 8))
    placed = AnalyticalPerfModel().placed_plan(job, plan, (("rtx", 8),), state)
    assert placed.precision is plan.precision
    assert placed.step_time_s > 0


def test_results_are_cached_by_plan_and_shape(job: JobView) -> None:
    plan = _plan(job, "A100-40G", 4)
    perf = AnalyticalPerfModel()
    state = _dgx(2)
    a = perf.placed_plan(job, plan, (("dgx0", 4),), state)
    b = perf.placed_plan(job, plan, (("dgx1", 4),), state)  # same shape, other node
    assert a is b and perf.hits == 1 and perf.misses == 1


def test_jobs_without_a_model_keep_their_plan() -> None:
    plan = make_plan("A100-40G", 2)
    state = _dgx(1)
    assert AnalyticalPerfModel().placed_plan(make_job("x", [plan]), plan, (("dgx0", 2),),
                                             state) is plan
    assert IdentityPerf().placed_plan(make_job("x", [plan]), plan, (("dgx0", 2),), state) is plan


def test_topology_of_mixed_links_uses_the_slowest() -> None:
    state = cluster(make_node("a", "A100-40G", 8, interconnect="nvlink"),
                    make_node("b", "A100-40G", 8, interconnect="pcie"), inter_bw_gbs=25.0)
    topo = placement_topology((("a", 4), ("b", 2)), state)
    assert (topo.num_nodes, topo.intra_link, topo.gpus_per_node, topo.inter_bw_gbs) == (
        2, "pcie", (4, 2), 25.0)


def test_placed_plan_cache_is_bounded_and_keeps_what_is_still_asked(job: JobView) -> None:
    """Ended jobs' plans age out (at most two generations of ``plan_cache`` entries); a plan
    asked about again (a live job's, every round) keeps its entry and its placed object."""
    state = _dgx(1)
    live = _plan(job, "A100-40G", 4)
    perf = AnalyticalPerfModel(plan_cache=3)
    first = perf.placed_plan(job, live, (("dgx0", 4),), state)
    for i in range(20):  # 20 one-off jobs: fresh plan objects of equal value
        gone = job.plans[i % len(job.plans)].with_step(job.plans[i % len(job.plans)].step)
        perf.placed_plan(job, gone, (("dgx0", gone.num_gpus),), state)
        assert perf.placed_plan(job, live, (("dgx0", 4),), state) is first
        assert len(perf._cache) + len(perf._old) <= 2 * 3
    assert perf.misses == 21  # the live plan was computed once
    # an aged-out plan comes back with the same value (the step-time cache still has it)
    again = perf.placed_plan(job, gone, (("dgx0", gone.num_gpus),), state)
    assert again.step == AnalyticalPerfModel().placed_plan(
        job, gone, (("dgx0", gone.num_gpus),), state).step
