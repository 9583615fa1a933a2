"""The service plans on step times corrected from what its jobs report
(``Settings.step_correction``), with the estimator and policy wrapping the simulator uses.

The simulated backend runs every plan at twice its predicted step time; launches take 10 s,
progress is reported every 5 s (``virtual_service``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from virtual_service import SMALL, services

from scheduler.corrected import CorrectedPolicy
from service.settings import Settings, SettingsError


@pytest.fixture
def make_service(tmp_path: Path) -> Iterator[Any]:
    with services(tmp_path, step_factor=lambda job_id, gpu_type: 2.0) as make:
        yield make


def test_on_the_policy_plans_on_the_step_times_jobs_report(make_service: Any) -> None:
    s = make_service(policy="has", step_correction="on")
    jid = s.submit(SMALL)["id"]
    rt = s.runtime
    assert rt.estimator is not None
    assert isinstance(rt.controller.policy, CorrectedPolicy)
    s.at(0)  # placed, launching
    s.at(10)  # running from 10
    s.at(20)  # two progress reports: 10 s of steps at twice the predicted step time
    got = s.job(jid)
    plan = got["chosen_plan"]
    predicted = plan["step_time_s"]
    assert got["progress"]["steps_done"] == pytest.approx(10 / (2 * predicted))
    # the job's own factor on its GPU type: observed / predicted = 2 (ln 2 kept exactly)
    view = rt.controller.live[jid].view
    assert rt.estimator.factor(jid, plan["gpu_type"], view.family) == pytest.approx(2.0)
    # the decision the backend ran, and the database stored, carries the model's own time
    assert rt.controller.live[jid].allocation.plan.step_factor == 1.0


def test_elastic_gets_the_estimator_itself(make_service: Any) -> None:
    s = make_service(policy="elastic", step_correction="on")
    policy = s.runtime.controller.policy
    assert not isinstance(policy, CorrectedPolicy)
    assert policy.engine.config.prediction.estimator is s.runtime.estimator


def test_auto_is_off_where_the_backend_does_not_measure_gpus(make_service: Any) -> None:
    s = make_service(policy="has")  # step_correction auto; the simulated backend
    assert s.runtime.estimator is None
    assert not isinstance(s.runtime.controller.policy, CorrectedPolicy)
    jid = s.submit(SMALL)["id"]
    s.at(0)
    s.at(20)
    assert s.job(jid)["state"] == "running"


def test_a_bad_value_names_the_variable_and_the_choices() -> None:
    with pytest.raises(SettingsError) as err:
        Settings.from_env({"FRENZY_STEP_CORRECTION": "maybe"})
    text = str(err.value)
    assert "FRENZY_STEP_CORRECTION" in text
    assert "'auto'" in text and "'on'" in text and "'off'" in text
