"""The contention bound on average JCT: hand-worked cases, and never above a replayed policy."""

from __future__ import annotations

import json

import pytest

from benchmarks import jct_bound
from benchmarks.jct_bound import BoundJob, Mode, contention_bound, group_bound, hull_modes
from simulator.traces import traces_dir


def _job(name: str, submit: float, *modes: Mode, launch: float = 10.0) -> BoundJob:
    return BoundJob(name, submit, submit + launch, tuple(modes))


def test_the_hull_keeps_only_plans_no_time_share_beats() -> None:
    # rates per second: (3, 1.2) lies under the segment (2, 1.5)-(4, 1.6); (5, 1.55) is
    # slower than 4 GPUs; (2, 0.4) is slower than another 2-GPU plan
    got = hull_modes("A", [(1, 1.0), (2, 1.5), (3, 1.2), (4, 1.6), (5, 1.55), (2, 0.4)])
    assert [(m.gpus, m.rate) for m in got] == [(1, 1.0), (2, 1.5), (4, 1.6)]
    # a plan that is worse per GPU than a time-share of idle and a bigger plan goes too:
    # (1, 0.2) is under the line from (0, 0) to (4, 1.0)
    assert [(m.gpus, m.rate) for m in hull_modes("A", [(1, 0.2), (4, 1.0)])] == [(4, 1.0)]


def test_one_job_alone_is_its_launch_plus_its_fastest_plan() -> None:
    job = _job("a", 100.0, Mode("A", 1, 1 / 400), Mode("A", 4, 1 / 120), Mode("B", 8, 1 / 150))
    assert job.alone_jct == pytest.approx(130.0)
    assert group_bound([job], {"A": 4, "B": 8}) == pytest.approx(100.0 + 130.0)
    assert contention_bound([job], {"A": 4, "B": 8}) == pytest.approx(130.0)


def test_two_jobs_that_each_need_the_whole_cluster_queue_one_behind_the_other() -> None:
    # One type, 8 GPUs; each job's only plan takes all 8 for T seconds. Arriving together,
    # the best any schedule can do (worked by hand) is one after the other: JCTs 10 + T and
    # 10 + 2T (a time-share of the 8 GPUs only delays the first), average 10 + 1.5 T. The
    # alone bound says 10 + T for both.
    t = 1000.0
    jobs = [_job(n, 0.0, Mode("A", 8, 1 / t)) for n in ("a", "b")]
    got = contention_bound(jobs, {"A": 8}, intervals=240)
    assert got <= 10 + 1.5 * t + 1e-6  # a lower bound: never above the best schedule
    assert got >= 10 + 1.5 * t - t / 60  # and tight to the grid (3 T / 240 per interval)
    assert got > jobs[0].alone_jct + 0.4 * t


def test_jobs_that_fit_side_by_side_keep_the_alone_bound() -> None:
    jobs = [_job(n, 0.0, Mode("A", 4, 1 / 500)) for n in ("a", "b")]
    assert contention_bound(jobs, {"A": 8}) == pytest.approx(510.0)


def test_groups_are_the_longest_jobs_longest_first() -> None:
    jobs = [_job(f"j{k}", float(k), Mode("A", 1, 1 / (100.0 * (k + 1)))) for k in range(6)]
    groups = jct_bound.long_groups(jobs, long_jobs=4, group_size=3)
    assert [[j.id for j in g] for g in groups] == [["j5", "j4", "j3"], ["j2"]]


def test_a_row_label_names_the_workload_replayed() -> None:
    assert jct_bound.workload_spec("sia-rate_20:1", "validation") == ("sia-rate_20:1", 0)
    assert jct_bound.workload_spec("sia-philly:3", "tuning") == ("sia-philly", 2)
    assert jct_bound.workload_spec("newworkload-30", "tuning") == ("newworkload-30", 0)


def test_the_cli_refuses_a_run_with_prediction_error(tmp_path, capsys) -> None:
    src = tmp_path / "v.json"
    src.write_text("table\n" + json.dumps({"error": "measured", "clusters": {}}) + "\n")
    with pytest.raises(SystemExit):
        jct_bound.main(["--from", str(src)])
    assert "error-free" in capsys.readouterr().err
    src.write_text("no json here\n")
    with pytest.raises(SystemExit):
        jct_bound.main(["--from", str(src)])
    assert "not a benchmarks.validation --json output" in capsys.readouterr().err


@pytest.mark.skipif(not traces_dir().exists(), reason="shared/traces not present")
def test_the_bound_is_never_above_what_a_policy_achieves_in_the_simulator() -> None:
    # ground truth from outside the bound: the production control loop's replays
    from benchmarks.validation import workload_views
    from simulator.replay import replay

    views, state = workload_views("sia-rate_20:1", 0, "hetero-128", 40)
    jobs, capacity = jct_bound.workload_jobs("sia-rate_20:1", 0, "hetero-128", 40)
    alone = sum(j.alone_jct for j in jobs) / len(jobs)
    bound = contention_bound(jobs, capacity, long_jobs=6, group_size=3, intervals=60,
                             time_limit_s=10.0)
    assert bound >= alone
    for policy in ("has", "sia", "opportunistic"):
        got = replay(views, state, policy).metrics
        assert got.unfinished == 0
        assert bound <= got.avg_jct_s, policy


def test_jobs_alone_fit_when_no_release_finds_a_type_over_full() -> None:
    a = _job("a", 0.0, Mode("A", 8, 1 / 1000))
    later = _job("b", 2000.0, Mode("A", 8, 1 / 1000))  # a has ended by then
    during = _job("c", 500.0, Mode("A", 8, 1 / 1000))
    assert jct_bound.alone_fits([a, later], {"A": 8})
    assert not jct_bound.alone_fits([a, during], {"A": 8})
    assert jct_bound.alone_fits([a, during], {"A": 16})
    # the bound of a group that does not compete is the alone bound; of one that does, more
    assert contention_bound([a, later], {"A": 8}) == pytest.approx(1010.0)
    # by hand: a runs 10-1010, c 1010-2010 (JCT 1510): average 1260
    assert 1010.0 + 100.0 < contention_bound([a, during], {"A": 8}) <= 1260.0 + 1e-6
