"""Prediction error in the simulator: the fit, the draws, the backend's truth, the estimator
feed, and that a policy never sees the truth."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import pytest

from orchestrator.clusters import load_cluster
from scheduler.estimator import StepTimeEstimator
from simulator.error import (
    MEASURED_STEP_ERROR,
    POOLED,
    ErrorModel,
    LogError,
    fit_step_error,
)
from simulator.mapping import map_jobs
from simulator.replay import PlanCache, SimConfig, job_view, replay
from simulator.traces import load_trace

DATA = Path(__file__).parent / "data"
SHARED = Path(__file__).resolve().parents[2].parent / "shared"


def test_fit_weights_every_data_set_equally_within_a_gpu_type() -> None:
    # set a: 10 rows at measured/predicted 1.1; set b: 1 row at 0.9 (ratios by hand)
    rows = [("X", "a", 1.0, 1.1)] * 10 + [("X", "b", 2.0, 1.8)]
    fit = fit_step_error(rows)
    bias = (math.log(1.1) + math.log(0.9)) / 2
    assert fit["X"].bias == pytest.approx(bias)
    # no spread within a set: sigma = |ln 1.1 − ln 0.9| / 2
    assert fit["X"].sigma == pytest.approx(abs(math.log(1.1) - math.log(0.9)) / 2)
    assert (fit["X"].n, fit["X"].sets) == (11, 2)


def test_fit_pools_over_types_and_keeps_within_set_spread() -> None:
    rows = [("X", "a", 1.0, 1.0), ("X", "a", 1.0, math.e ** 0.2),  # mean 0.1, var 0.01
            ("Y", "c", 1.0, math.e ** 0.4)]  # mean 0.4, var 0
    fit = fit_step_error(rows)
    assert fit["X"].bias == pytest.approx(0.1) and fit["X"].sigma == pytest.approx(0.1)
    assert fit["Y"].bias == pytest.approx(0.4) and fit["Y"].sigma == pytest.approx(0.0)
    # pooled: bias (0.1 + 0.4)/2 = 0.25; var mean(0.01 + 0.15², 0 + 0.15²) = 0.0275
    assert fit[POOLED].bias == pytest.approx(0.25)
    assert fit[POOLED].sigma == pytest.approx(math.sqrt(0.0275))


def test_fit_rejects_non_positive_times_and_no_rows() -> None:
    with pytest.raises(ValueError, match="X/a: predicted and measured must be > 0"):
        fit_step_error([("X", "a", 0.0, 1.0)])
    with pytest.raises(ValueError, match="no rows"):
        fit_step_error([])


@pytest.mark.skipif(not (SHARED / "measurements" / "vtrain").exists(),
                    reason="shared measurements not available")
def test_measured_constants_are_the_fit_on_the_measured_sets() -> None:
    from benchmarks.step_time_accuracy import error_model, evaluate, load_cases

    cases, _ = load_cases()
    _, pairs = evaluate(cases)
    fitted = error_model(pairs)
    assert set(fitted) == set(MEASURED_STEP_ERROR)
    for gpu, e in fitted.items():
        c = MEASURED_STEP_ERROR[gpu]
        assert (c.n, c.sets) == (e.n, e.sets), gpu
        assert c.bias == pytest.approx(e.bias, abs=6e-5), gpu
        assert c.sigma == pytest.approx(e.sigma, abs=6e-5), gpu


def test_error_model_draws_are_deterministic_and_none_is_exact() -> None:
    none = ErrorModel("none")
    assert none.step_factor("j", "A100-40G") == 1.0 and none.memory_factor("j") == 1.0
    a, b = ErrorModel("measured", seed=1), ErrorModel("measured", seed=1)
    assert a.step_factor("j1", "A100-40G") == b.step_factor("j1", "A100-40G")
    assert a.step_factor("j1", "A100-40G") != a.step_factor("j2", "A100-40G")
    assert a.step_factor("j1", "A100-40G") != ErrorModel("measured", seed=2).step_factor(
        "j1", "A100-40G")
    with pytest.raises(ValueError, match="error mode must be one of none, measured, 2x"):
        ErrorModel("huge")
    with pytest.raises(ValueError, match=r"SimConfig\.error"):
        SimConfig(error="huge")


def test_draws_follow_the_calibrated_bias_and_spread_and_2x_doubles_them() -> None:
    step = {"G": LogError(0.1, 0.2), POOLED: LogError(-0.3, 0.05)}
    m, two = ErrorModel("measured", step=step), ErrorModel("2x", step=step)
    logs = [math.log(m.step_factor(f"j{i}", "G")) for i in range(4000)]
    # mean within 4 standard errors (0.2 / sqrt(4000) ≈ 0.0032), spread within 5 %
    assert statistics.fmean(logs) == pytest.approx(0.1, abs=0.013)
    assert statistics.pstdev(logs) == pytest.approx(0.2, rel=0.05)
    for i in range(50):  # 2x: twice the log error of the same draw
        assert math.log(two.step_factor(f"j{i}", "G")) == pytest.approx(
            2 * math.log(m.step_factor(f"j{i}", "G")))
    pooled = [math.log(m.step_factor(f"j{i}", "V100")) for i in range(2000)]
    assert statistics.fmean(pooled) == pytest.approx(-0.3, abs=0.01)


# -- the simulator --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def setup():  # type: ignore[no-untyped-def]
    state = load_cluster("phoebe").state
    cache = PlanCache(state)
    views = [job_view(m, cache) for m in map_jobs(load_trace(DATA / "golden_trace.csv").jobs)]
    return state, views


def test_a_lone_job_runs_at_the_prediction_times_its_drawn_factor(setup) -> None:  # type: ignore[no-untyped-def]
    state, views = setup
    job = views[0]
    base = replay([job], state, "has")
    err = replay([job], state, "has", config=SimConfig(error="measured"))
    (pred,) = base.backend.step_time_by_job[job.id]
    (true,) = err.backend.step_time_by_job[job.id]
    factor = ErrorModel("measured").step_factor
    # the job got the same placement in both runs (the policy saw the same predictions); its
    # true step time is the prediction times the factor drawn for that placement's GPU type
    types = {n.gpu_type for n in state.nodes}
    matches = [t for t in types if true == pytest.approx(pred * factor(job.id, t), rel=1e-12)]
    assert len(matches) == 1 and true != pytest.approx(pred)
    # JCT = launch delay + steps × true step time (it starts at submission on an idle cluster)
    jct = err.metrics.avg_jct_s
    assert jct == pytest.approx(10.0 + job.total_steps * true, rel=1e-9)


class _Recording:
    """Wraps a policy; records the step times of the plans it is shown for running jobs."""

    def __init__(self, inner):  # type: ignore[no-untyped-def]
        self.inner = inner
        self.name = inner.name
        self.seen: dict[str, set[float]] = {}

    def decide(self, state, pending, running, now):  # type: ignore[no-untyped-def]
        for rj in running:
            self.seen.setdefault(rj.job.id, set()).add(rj.allocation.plan.step_time_s)
        return self.inner.decide(state, pending, running, now)

    @property
    def wake_at(self):  # type: ignore[no-untyped-def]
        return getattr(self.inner, "wake_at", None)


def test_the_policy_sees_predictions_and_the_feed_measures_the_truth(setup, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from scheduler.policy import make_policy
    from simulator.replay import _default_perf

    state, views = setup
    jobs = views[:12]
    perf = _default_perf()
    pol = _Recording(make_policy("elastic", perf=perf))
    observed: list[tuple[str, str, float, float]] = []

    class Spy(StepTimeEstimator):
        def observe(self, job_id, gpu_type, family, predicted_s, observed_s):  # type: ignore[no-untyped-def]
            observed.append((job_id, gpu_type, predicted_s, observed_s))
            super().observe(job_id, gpu_type, family, predicted_s, observed_s)

    monkeypatch.setattr("simulator.replay.StepTimeEstimator", Spy)
    res = replay(jobs, state, pol, perf=perf,
                 config=SimConfig(error="measured", progress_every_s=60.0))
    truth = ErrorModel("measured")
    assert observed, "no progress pair reached the estimator"
    for job_id, gpu, pred, obs in observed:
        # Δt / Δsteps of two progress reports recovers the drawn factor exactly
        assert obs / pred == pytest.approx(truth.step_factor(job_id, gpu), rel=1e-6)
    true_steps = {j: set(v) for j, v in res.backend.step_time_by_job.items()}
    for job_id, shown in pol.seen.items():
        # what the policy was shown is never a true step time (factors differ from 1)
        assert not shown & true_steps[job_id], job_id


def test_policies_without_an_estimator_plan_on_corrected_times(setup, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from orchestrator.backends.sim import SimBackend
    from scheduler.corrected import CorrectedPolicy

    state, views = setup
    jobs = views[:12]
    launched: list[float] = []
    real_launch = SimBackend._launch

    def spy(self, job, allocation, now, delay):  # type: ignore[no-untyped-def]
        launched.append(allocation.plan.step_factor)
        return real_launch(self, job, allocation, now, delay)

    monkeypatch.setattr(SimBackend, "_launch", spy)
    cfg = SimConfig(error="measured", progress_every_s=60.0)
    res = replay(jobs, state, "has", config=cfg)
    pol = res.loop.controller.policy
    assert isinstance(pol, CorrectedPolicy) and pol.name == "has"
    # the estimator was fed, and it corrected what the policy saw
    assert pol.corrected.estimator.observations > 0
    # nothing outside the policy sees a corrected plan: every launch the backend ran (at the
    # model's prediction for the placement times the drawn factor) carries the model's time
    assert launched and all(f == 1.0 for f in launched)
    assert res.metrics.finished == len(jobs)
    off = replay(jobs, state, "has", config=SimConfig(error="measured", progress_every_s=60.0,
                                                      correct=False))
    assert not isinstance(off.loop.controller.policy, CorrectedPolicy)
    # 'elastic' takes the estimator itself (its deadline engine corrects), so it is not wrapped
    el = replay(jobs[:4], state, "elastic", config=cfg)
    assert not isinstance(el.loop.controller.policy, CorrectedPolicy)
    # without error nothing is wrapped: the error-free replays are the ones they were
    assert not isinstance(replay(jobs[:4], state, "has").loop.controller.policy,
                          CorrectedPolicy)
