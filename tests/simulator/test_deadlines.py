"""Deadline generation (λ·duration, seeded), the REJECT decision through the controller, the
deadline metrics of a replay, and the quick deadline benchmark's JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.states import JobState
from predictor.gpus import get_gpu
from predictor.memory import MemoryBreakdown
from predictor.plan import Plan
from predictor.spec import ParallelConfig, Precision
from predictor.step_time import StepTime
from scheduler.cluster import ClusterState, Node
from scheduler.decision import Decision, DecisionKind, reject
from scheduler.job import JobView
from simulator.deadlines import (
    LAMBDA_RANGE,
    LAUNCH_S,
    deadline_metrics,
    requested_duration,
    with_deadlines,
)
from simulator.replay import SimConfig, replay
from simulator.traces import traces_dir

GIB = 1 << 30


def make_plan(gpu_type: str, n: int, *, step_s: float) -> Plan:
    """A data-parallel plan on ``n`` GPUs with a hand-chosen step time (no planner)."""
    mem = MemoryBreakdown(parameters=GIB, gradients=GIB, optimizer_states=0, activations=GIB,
                          logits=0, overhead=0)
    step = StepTime(compute_s=step_s, tp_comm_s=0.0, pp_bubble_s=0.0, pp_p2p_s=0.0,
                    dp_comm_s=0.0, optimizer_s=0.0, total_s=step_s)
    return Plan(gpu_type=gpu_type, parallel=ParallelConfig(dp=n), precision=Precision.FP16,
                memory=mem, step=step, num_steps=100, required_bytes=3 * GIB)


def make_node(node_id: str, gpu_type: str, total: int) -> Node:
    return Node(id=node_id, gpu_type=gpu_type, gpu_memory=get_gpu(gpu_type).memory_bytes,
                total_gpus=total, free_gpus=total)


class _Stub:
    """A perf model keeping the plan's step time."""

    def placed_plan(self, job, plan, placement, state):  # type: ignore[no-untyped-def]
        return plan


def jobs(n: int = 50) -> list[JobView]:
    plans = (make_plan("A100-40G", 1, step_s=2.0), make_plan("A100-40G", 2, step_s=1.2),
             make_plan("RTX2080Ti", 2, step_s=3.0))
    return [JobView(id=f"j{i}", submit_time=10.0 * i, plans=plans, total_steps=100,
                    requested_gpus=2) for i in range(n)]


def test_duration_is_the_requested_count_on_its_fastest_type_plus_launch() -> None:
    assert requested_duration(jobs(1)[0]) == pytest.approx(LAUNCH_S + 1.2 * 100)


def test_deadlines_are_lambda_times_duration_and_seeded() -> None:
    a = with_deadlines(jobs(), seed=3)
    b = with_deadlines(jobs(), seed=3)
    c = with_deadlines(jobs(), seed=4)
    assert [j.deadline for j in a] == [j.deadline for j in b]
    assert [j.deadline for j in a] != [j.deadline for j in c]
    dur = LAUNCH_S + 120.0
    lams = [(j.deadline - j.submit_time) / dur for j in a]
    assert all(LAMBDA_RANGE[0] <= x <= LAMBDA_RANGE[1] for x in lams)
    assert min(lams) < 0.7 and max(lams) > 1.3  # spread over the range


def test_reject_decision_needs_no_allocation() -> None:
    d = reject("x", "deadline cannot be met")
    assert d.kind is DecisionKind.REJECT and d.allocation is None
    with pytest.raises(ValueError):
        Decision(DecisionKind.REJECT, "x", object(), "no")  # type: ignore[arg-type]


def test_rejected_jobs_end_cancelled_and_count_as_missed() -> None:
    state = ClusterState(nodes=(make_node("a0", "A100-40G", 2),))
    plans = (make_plan("A100-40G", 1, step_s=1.0), make_plan("A100-40G", 2, step_s=0.6))
    js = [JobView(id="ok", submit_time=0.0, plans=plans, total_steps=100, deadline=500.0),
          JobView(id="late", submit_time=0.0, plans=plans, total_steps=100, deadline=30.0),
          JobView(id="free", submit_time=0.0, plans=plans, total_steps=10)]
    res = replay(js, state, "elastic", perf=_Stub(), config=SimConfig(tick_s=60.0))
    recs = res.controller.jobs
    assert recs["late"].state is JobState.CANCELLED
    assert recs["ok"].state is JobState.SUCCEEDED and recs["free"].state is JobState.SUCCEEDED
    m = deadline_metrics(res.records.values())
    assert (m.deadline_jobs, m.met, m.rejected) == (2, 1, 1)
    assert m.deadline_ratio == 0.5


def test_under_overload_elastic_meets_no_fewer_deadlines_than_elasticflow() -> None:
    """Overload, worked by hand (16 A100s, ``elastic`` and ElasticFlow at their defaults).

    b0..b32 arrive every 60 s, each needing all 16 GPUs for 2,010 s (2,000 steps of 1 s plus
    the 10 s launch, 32,160 GPU-seconds) by 2,150 s after it came: b0 is admitted and runs
    until 2,010 s; every later one would finish at 4,020 s at the earliest, past its deadline
    (at most 1,920 + 2,042.5 s with the 5 % margin), and is rejected. At 2,015 s the GPUs are
    free and x and y arrive, each 400 steps due in 500 s: on 16 GPUs 410 s (6,560
    GPU-seconds), on 8 GPUs 810 s, too late. Both policies admit x on all 16 (done at
    2,425 s); y then has no room before its deadline and is rejected: b0 and x are met.

    The opportunity-cost rule before the capacity bound priced x's booking at the arrival
    rate alone: 33 arrivals over 2,015 s, all 34 of the window blocked for 410 s, so 33 /
    2,015 × 410 = 6.7 expected arrivals turned away, more than its limit of 3: x (and y)
    ran best-effort, the leftover fill gave each 8 GPUs (810 s), and both missed: it met
    b0 only. But those arrivals want 32,160 GPU-seconds each and the booking holds 6,560:
    in the mix they come in (33 b's and x, 1,067,840 / 34 GPU-seconds each) it could have
    served 6,560 × 34 / 1,067,840 = 0.21 of them, below the limit (1.25 now), so x is
    booked."""
    state = ClusterState(nodes=(make_node("a0", "A100-40G", 8), make_node("a1", "A100-40G", 8)))
    whole = (make_plan("A100-40G", 16, step_s=1.0),)
    js = [JobView(id=f"b{i}", submit_time=60.0 * i, plans=whole, total_steps=2000,
                  deadline=60.0 * i + 2150.0) for i in range(33)]
    either = (make_plan("A100-40G", 8, step_s=2.0), make_plan("A100-40G", 16, step_s=1.0))
    js += [JobView(id=k, submit_time=2015.0, plans=either, total_steps=400, deadline=2515.0)
           for k in ("x", "y")]

    def met(policy: str, **kw: object) -> set[str]:
        res = replay(js, state, policy, perf=_Stub(), config=SimConfig(), policy_kwargs=kw)
        out = {j for j, r in res.records.items() if r.state is JobState.SUCCEEDED
               and r.end_time is not None and r.end_time <= r.view.deadline + 1e-6}
        assert deadline_metrics(res.records.values()).met == len(out)
        return out

    assert met("elasticflow") == {"b0", "x"}
    assert met("elastic") == {"b0", "x"}
    # the rule before: fewer
    before = {"capacity_bound": False, "refusal_guard": False, "opportunity_cost": 3.0}
    assert met("elastic", **before) == {"b0"}


@pytest.mark.skipif(not traces_dir().exists(), reason="shared/traces not present")
def test_quick_benchmark_json(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from benchmarks import deadlines

    assert deadlines.main(["--quick", "--json", "--workers", "1", "--seeds", "2",
                           "--docs", str(tmp_path)]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    res = out["results"]
    sweep = out["seed_sweep"]["results"]
    assert out["seed_sweep"]["seeds"] == [0, 1000] and set(sweep) == {"sia-philly:1@phoebe"}
    s = sweep["sia-philly:1@phoebe"]
    for pol in ("elastic", "elasticflow"):  # draw 0 is the main run's
        r = res["sia-philly:1@phoebe"][pol]
        assert s[f"met_{pol}"][0] == round(r["deadline_ratio"] * r["deadline_jobs"])
    # the JSON rounds each figure to 4 decimals, the median of two is their mean
    assert s["median_ratio"] == pytest.approx(sum(s["ratios"]) / 2, abs=1e-4)
    assert out["slack"] == 0.05  # both deadline policies' default margin
    assert set(res) == {"elasticflow@phoebe", "sia-philly:1@phoebe"}
    for per in res.values():
        assert set(per) == {"elastic", "elasticflow", "has", "opportunistic"}
        for r in per.values():
            assert {"deadline_ratio", "avg_jct_s", "makespan_s", "resizes", "unfinished",
                    "restarts_per_job", "jobs"} <= set(r)
            assert 0.0 <= r["deadline_ratio"] <= 1.0
            assert r["restarts_per_job"] == pytest.approx(r["resizes"] / r["jobs"])
            assert 0 <= r["unfinished"] <= r["jobs"] - r["rejected"]
        assert per["opportunistic"]["resizes"] == 0  # never stops or resizes
        assert "ratio_vs_elasticflow" in per["elastic"]
    assert (tmp_path / "deadlines_ratio.png").stat().st_size > 0
    assert "results:begin" in (tmp_path / "deadlines.md").read_text()


def test_benchmark_refuses_fewer_than_one_seed(capsys: pytest.CaptureFixture[str]) -> None:
    from benchmarks import deadlines

    with pytest.raises(SystemExit) as e:
        deadlines.main(["--quick", "--seeds", "0"])
    assert e.value.code == 2
    assert "--seeds must be at least 1, got 0" in capsys.readouterr().err


def test_benchmark_names_the_elastic_arguments_it_knows(
        capsys: pytest.CaptureFixture[str]) -> None:
    from benchmarks import deadlines

    assert deadlines._elastic_kwargs(["opportunity_cost=1", "replan=false", "mode=reject"]) == (
        ("opportunity_cost", 1), ("replan", False), ("mode", "reject"))
    with pytest.raises(SystemExit):
        deadlines.main(["--quick", "--elastic-arg", "opportunity=1"])
    err = capsys.readouterr().err
    assert "'opportunity=1'" in err and "opportunity_cost" in err and "replan" in err


def test_split_summary_takes_medians_per_cluster_over_the_split() -> None:
    from benchmarks.deadlines import split_summary

    def res(ratio: float, jct: float) -> dict:
        return {"elastic": {"ratio_vs_elasticflow": ratio, "jct_vs_has": jct}}

    out = {"results": {"a@phoebe": res(0.9, 1.2), "b@phoebe": res(1.5, 0.8),
                       "c@phoebe": res(1.1, 1.0), "a@hetero-128": res(2.0, 0.5)}}
    s = split_summary(out, ("phoebe", "hetero-128"))
    # phoebe: ratios 0.9, 1.1, 1.5 -> median 1.1, one below 1.0x; JCTs 0.8, 1.0, 1.2
    assert s["phoebe"] == {"workloads": 3, "median_ratio_vs_elasticflow": 1.1,
                           "min_ratio_vs_elasticflow": 0.9, "max_ratio_vs_elasticflow": 1.5,
                           "below_1x": 1, "median_jct_vs_has": 1.0, "jct_above_has": 1}
    assert s["hetero-128"]["workloads"] == 1 and s["hetero-128"]["below_1x"] == 0


@pytest.mark.skipif(not (traces_dir() / "alibaba-gpu-v2023").exists(),
                    reason="shared/traces/alibaba-gpu-v2023 not present")
def test_benchmark_sets_replace_the_splits_sets(capsys: pytest.CaptureFixture[str]) -> None:
    from benchmarks import deadlines

    assert deadlines.main(["--split", "validation", "--sets", "alibaba-openb:3",
                           "--max-jobs", "3", "--policies", "elastic,elasticflow",
                           "--workers", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["split"]["workloads"] == ["alibaba-openb:3"]
    assert all(sm["workloads"] == 1 for sm in out["split"]["clusters"].values())
    with pytest.raises(SystemExit):
        deadlines.main(["--sets", ","])
