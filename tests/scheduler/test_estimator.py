"""The online step-time estimator, and the deadline policy's use of it; expected values are
worked out by hand from the formulas in ``scheduler.estimator``'s docstring."""

from __future__ import annotations

import math

import pytest
from builders import IdentityPerf, cluster, make_node, make_plan

from scheduler.decision import DecisionKind
from scheduler.estimator import StepTimeEstimator
from scheduler.job import JobView
from scheduler.policy import make_policy, policy_accepts


def test_a_jobs_own_observation_sets_its_factor_and_moves_by_alpha() -> None:
    est = StepTimeEstimator(alpha=0.5, prior_jobs=2.0)
    est.observe("j1", "A100-40G", "gpt2", 1.0, 1.2)
    assert est.factor("j1", "A100-40G", "gpt2") == pytest.approx(1.2)
    # the second report moves half-way in log space: ln 1.2 + 0.5·(ln 1.44 − ln 1.2)
    est.observe("j1", "A100-40G", "gpt2", 1.0, 1.44)
    assert est.factor("j1", "A100-40G", "gpt2") == pytest.approx(1.2 ** 1.5)


def test_an_unseen_job_gets_the_shrunk_group_mean_and_other_groups_stay_at_one() -> None:
    est = StepTimeEstimator(prior_jobs=2.0)
    est.observe("j1", "A100-40G", "gpt2", 2.0, 2.4)  # r = ln 1.2
    # one job plus two pseudo-jobs at 0: exp(ln 1.2 / 3)
    assert est.factor("j2", "A100-40G", "gpt2") == pytest.approx(1.2 ** (1 / 3))
    assert est.factor("j2", "A100-40G", "llama") == 1.0
    assert est.factor("j2", "T4", "gpt2") == 1.0
    est.observe("j3", "A100-40G", "gpt2", 1.0, 0.8)  # r = ln 0.8
    assert est.factor("j2", "A100-40G", "gpt2") == pytest.approx((1.2 * 0.8) ** (1 / 4))


def test_corrections_are_clipped_and_groups_are_bounded() -> None:
    est = StepTimeEstimator(max_factor=4.0, window=2, prior_jobs=0.0)
    est.observe("j1", "T4", "bert", 1.0, 100.0)
    assert est.factor("j1", "T4", "bert") == pytest.approx(4.0)
    est.observe("j2", "T4", "bert", 1.0, 2.0)
    est.observe("j3", "T4", "bert", 1.0, 2.0)  # j1 leaves the window of 2
    assert est.factor("new", "T4", "bert") == pytest.approx(2.0)


def test_margin_is_the_quantile_of_first_observation_under_predictions() -> None:
    est = StepTimeEstimator(prior_jobs=0.0, quantile=0.5)
    assert est.margin() == 0.0
    est.observe("j1", "A100-40G", "gpt2", 1.0, 1.5)  # error vs group 0: ln 1.5
    # j2: the group then said 1.5, the job runs at 1.5 → error 0; sorted [0, ln 1.5],
    # index int(0.5·2) = 1 → ln 1.5 → margin 1 − 1/1.5
    est.observe("j2", "A100-40G", "gpt2", 1.0, 1.5)
    assert est.margin() == pytest.approx(1.0 - 1.0 / 1.5)
    est.observe("j1", "A100-40G", "gpt2", 1.0, 1.5)  # a repeat report is not a first error
    assert est.margin() == pytest.approx(1.0 - 1.0 / 1.5)


def test_over_prediction_only_gives_no_margin_and_forget_drops_the_job() -> None:
    est = StepTimeEstimator()
    est.observe("j1", "A100-40G", "gpt2", 2.0, 1.0)
    assert est.margin() == 0.0
    est.forget("j1")
    # its own entry is gone: the group's shrunk mean is used, exp(ln 0.5 / 3)
    assert est.factor("j1", "A100-40G", "gpt2") == pytest.approx(0.5 ** (1 / 3))


@pytest.mark.parametrize("kwargs, field", [
    ({"alpha": 0.0}, "alpha"), ({"prior_jobs": -1.0}, "prior_jobs"),
    ({"max_factor": 1.0}, "max_factor"), ({"window": 0}, "window"),
    ({"quantile": 1.0}, "quantile"),
])
def test_bad_settings_name_the_field(kwargs: dict[str, float], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        StepTimeEstimator(**kwargs)  # type: ignore[arg-type]


def test_bad_observation_names_the_job() -> None:
    with pytest.raises(ValueError, match="job j9"):
        StepTimeEstimator().observe("j9", "T4", "bert", 0.0, 1.0)


# -- the deadline policy -----------------------------------------------------------------------


def _deadline_job(deadline: float) -> JobView:
    return JobView(id="j", submit_time=0.0, plans=(make_plan("A100-40G", 1, step_s=0.5),),
                   total_steps=100, deadline=deadline, requested_gpus=1)


def test_elastic_takes_an_estimator_and_the_others_do_not_need_one() -> None:
    assert policy_accepts("elastic", "estimator")
    assert not policy_accepts("opportunistic", "estimator")
    assert not policy_accepts("no-such-policy", "estimator")


def test_elastic_admits_on_the_prediction_and_rejects_on_the_observed_slowdown() -> None:
    state = cluster(make_node("a0", "A100-40G", 1))
    # predicted: 100 steps × 0.5 s + 10 s launch = 60 s ≤ 70 s × (1 − 0.05) = 66.5 s
    plain = make_policy("elastic", perf=IdentityPerf())
    assert [d.kind for d in plain.decide(state, [_deadline_job(70.0)], [], 0.0)] == [
        DecisionKind.START]
    # other jobs on A100-40G ran 1.5x slower (group mean, no prior): 75 s + 10 s > 66.5 s;
    # and the slack widens to 1 − 1/1.5 = 0.333, capped at MAX_SLACK 0.3
    est = StepTimeEstimator(prior_jobs=0.0)
    est.observe("o1", "A100-40G", "", 1.0, 1.5)
    pol = make_policy("elastic", perf=IdentityPerf(), estimator=est)
    assert pol.engine.prediction.margin == pytest.approx(0.3)  # type: ignore[attr-defined]
    out = pol.decide(state, [_deadline_job(70.0)], [], 0.0)
    assert [d.kind for d in out] == [DecisionKind.REJECT]
    # with room for the slowdown and the widened slack: 85 s ≤ 125 s × 0.7 = 87.5 s
    pol2 = make_policy("elastic", perf=IdentityPerf(), estimator=est)
    assert [d.kind for d in pol2.decide(state, [_deadline_job(125.0)], [], 0.0)] == [
        DecisionKind.START]


def test_elastic_without_observations_keeps_its_base_slack() -> None:
    pol = make_policy("elastic", perf=IdentityPerf(), estimator=StepTimeEstimator(), slack=0.1)
    assert pol.engine.prediction.margin == pytest.approx(0.1)  # type: ignore[attr-defined]
    assert math.isclose(pol.engine.prediction.step_factor(  # type: ignore[attr-defined]
        _deadline_job(1.0), pol.engine.options(  # type: ignore[attr-defined]
            _deadline_job(1.0), cluster(make_node("a0", "A100-40G", 1)))["A100-40G"][0]), 1.0)
