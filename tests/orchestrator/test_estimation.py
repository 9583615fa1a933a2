"""``EstimatorFeed``: progress events become step-time observations (values by hand)."""

from __future__ import annotations

import pytest
from orch_fakes import IdentityPerf, cluster, plan

from orchestrator.estimation import EstimatorFeed
from orchestrator.states import JobEvent, JobState
from scheduler.cluster import Allocation
from scheduler.estimator import StepTimeEstimator
from scheduler.job import JobView

R = JobState.RUNNING


def _setup():  # type: ignore[no-untyped-def]
    p = plan("A100-40G", 1, step_s=2.0)
    view = JobView(id="j", submit_time=0.0, plans=(p,), total_steps=1000)
    est = StepTimeEstimator()
    state = cluster(1)
    feed = EstimatorFeed(est, IdentityPerf(), {"j": view}.get, lambda: state)
    return est, feed, p


def _progress(t: float, steps: float, alloc: Allocation) -> JobEvent:
    return JobEvent("j", t, R, R, "progress", alloc, {"steps_done": steps})


def test_two_reports_on_one_allocation_give_the_observed_step_time() -> None:
    est, feed, plan = _setup()
    alloc = Allocation("j", plan, (("n0", 1),))
    feed(_progress(100.0, 10.0, alloc))
    assert est.observations == 0
    feed(_progress(400.0, 110.0, alloc))  # 300 s / 100 steps = 3 s vs 2 s predicted
    assert est.factor("j", "A100-40G", "") == pytest.approx(1.5)


def test_a_new_allocation_starts_a_new_pair_and_too_few_steps_wait() -> None:
    est, feed, plan = _setup()
    first = Allocation("j", plan, (("n0", 1),))
    second = Allocation("j", plan, (("n0", 1),))
    feed(_progress(100.0, 10.0, first))
    feed(_progress(200.0, 50.0, second))  # another run: no pair across it
    assert est.observations == 0
    feed(_progress(300.0, 50.5, second))  # half a step: keeps the older anchor
    assert est.observations == 0
    feed(_progress(400.0, 150.0, second))  # 200 s / 100 steps = 2 s: factor 1
    assert est.factor("j", "A100-40G", "") == pytest.approx(1.0)


def test_an_ended_job_is_forgotten() -> None:
    est, feed, plan = _setup()
    alloc = Allocation("j", plan, (("n0", 1),))
    feed(_progress(0.0, 0.0, alloc))
    feed(_progress(100.0, 100.0, alloc))  # 1 s vs 2 s: factor 0.5
    # the finish closes one more pair: 900 s for the last 900 steps, 1 s each again
    feed(JobEvent("j", 1000.0, R, JobState.SUCCEEDED, "all steps done"))
    # own entry gone; the group mean shrunk by two pseudo-jobs: exp(ln 0.5 / 3)
    assert est.factor("j", "A100-40G", "") == pytest.approx(0.5 ** (1 / 3))


def test_a_short_job_is_observed_from_its_start_to_its_finish() -> None:
    est, feed, plan = _setup()
    alloc = Allocation("j", plan, (("n0", 1),))
    seen: list[float] = []
    est.observe = lambda job_id, gpu, fam, pred, obs: seen.append(obs / pred)  # type: ignore[method-assign]
    # stopped at 400 steps, restarted: running from t = 500 at 400 steps
    feed(JobEvent("j", 300.0, R, JobState.PENDING, "preempted", None, {"steps_done": 400.0}))
    feed(JobEvent("j", 450.0, JobState.PENDING, JobState.STARTING, "start", alloc))
    feed(JobEvent("j", 500.0, JobState.STARTING, R, "workers running", alloc))
    # 600 steps left done by t = 2300: 1800 s / 600 = 3 s per step vs 2 s predicted
    feed(JobEvent("j", 2300.0, R, JobState.SUCCEEDED, "all steps done"))
    assert seen == [pytest.approx(1.5)]


def test_a_run_cut_short_by_a_resize_is_observed_up_to_its_checkpoint() -> None:
    est, feed, plan = _setup()
    first = Allocation("j", plan, (("n0", 1),))
    second = Allocation("j", plan, (("n0", 1),))
    feed(JobEvent("j", 10.0, JobState.STARTING, R, "workers running", first))
    # resized at t = 110 before any progress report, checkpointed at 25 steps:
    # 100 s / 25 steps = 4 s per step vs 2 s predicted
    feed(JobEvent("j", 110.0, R, JobState.RESIZING, "shrunk", second, {"steps_done": 25.0}))
    assert est.observations == 1
    assert est.factor("j", "A100-40G", "") == pytest.approx(2.0)
    # the new run is anchored when it runs again (t = 180, 25 steps); a report at t = 200 at
    # 35 steps: 2 s per step, factor 1, averaged in with weight 0.5: exp(ln 2 / 2)
    feed(JobEvent("j", 180.0, JobState.RESIZING, R, "workers running", second))
    feed(_progress(200.0, 35.0, second))
    assert est.observations == 2
    assert est.factor("j", "A100-40G", "") == pytest.approx(2.0 ** 0.5)


def test_a_stop_or_preemption_closes_the_run_and_a_stop_without_steps_does_not() -> None:
    est, feed, plan = _setup()
    alloc = Allocation("j", plan, (("n0", 1),))
    seen: list[float] = []
    est.observe = lambda job_id, gpu, fam, pred, obs: seen.append(obs)  # type: ignore[method-assign]
    feed(JobEvent("j", 0.0, JobState.STARTING, R, "workers running", alloc))
    # preempted at t = 30 at 10 steps: 3 s per step
    feed(JobEvent("j", 30.0, R, JobState.PENDING, "preempted", None, {"steps_done": 10.0}))
    assert seen == [pytest.approx(3.0)]
    # again from 10 steps at t = 100; stopped at t = 100.5 at 10.2 steps: under one step,
    # too little to measure
    feed(JobEvent("j", 100.0, JobState.STARTING, R, "workers running", alloc))
    feed(JobEvent("j", 100.5, R, JobState.PENDING, "paused", None, {"steps_done": 10.2}))
    assert seen == [pytest.approx(3.0)]


def test_estimating_policy_gives_each_policy_the_estimator_its_way() -> None:
    from orchestrator.estimation import estimating_policy
    from scheduler.corrected import CorrectedPolicy

    est, perf = StepTimeEstimator(), IdentityPerf()
    elastic = estimating_policy("elastic", perf, est)  # takes an estimator of its own
    assert not isinstance(elastic, CorrectedPolicy)
    assert elastic.engine.config.prediction.estimator is est
    has = estimating_policy("has", perf, est)  # plans on corrected step times
    assert isinstance(has, CorrectedPolicy)
    assert has.perf is perf and has.corrected.estimator is est
    assert has.name == "has"
    plain = [estimating_policy("has", perf, None), estimating_policy("has", perf, est,
                                                                    correct=False)]
    assert not any(isinstance(p, CorrectedPolicy) for p in plain)
    assert all(p.perf is perf for p in plain)
    assert estimating_policy("has", perf, None, min_gain=0.5).min_gain == 0.5
