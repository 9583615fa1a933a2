"""Run-time limits and the per-user GPU quota, enforced by the service's control loop.

The loop runs the simulated backend on a virtual clock, turned by hand (no thread): launches
take 10 s, a plan runs at its predicted step time, progress is reported every 5 s
(``virtual_service``). The figures are worked out by hand in each test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from virtual_service import SMALL, T0, services

FOUR_GPUS = {"model": "llama-2-13b", "training": {"global_batch": 16, "seq_len": 1024,
                                                  "steps": 10_000_000}}
"""Every plan of it needs 4 A100-80G (at most 4 with quota_max_gpus = 4)."""


@pytest.fixture
def make_service(tmp_path: Path) -> Iterator[Any]:
    with services(tmp_path) as make:
        yield make


def test_run_time_limit_counts_running_time_across_a_service_restart(make_service: Any) -> None:
    s = make_service(max_runtime_s_max=3600)
    job = s.submit({**SMALL, "max_runtime_s": 100})
    jid = job["id"]
    assert job["max_runtime_s"] == 100 and job["running_s"] == 0
    s.at(0)  # placed, launching
    s.at(10)  # running from 10
    s.at(70)  # 60 s running, reported with the progress
    got = s.job(jid)
    assert got["state"] == "running" and got["running_s"] == 60
    step_s = got["chosen_plan"]["step_time_s"]
    assert got["progress"]["steps_done"] == pytest.approx(60 / step_s)

    s.restart()  # requeued at its progress, back on its GPUs at 70: running again from 80
    assert s.job(jid)["state"] == "starting" and s.job(jid)["running_s"] == 60
    s.at(80)
    assert s.job(jid)["state"] == "running"
    s.at(119)  # 60 + 39 s
    assert s.job(jid)["state"] == "running"
    s.at(120)  # 60 + 40 = 100 s: stopped at a checkpoint (not at 80 + 100 = 180)
    got = s.job(jid)
    steps = 100 / step_s
    reason = (f"run-time limit of 100 s reached after 100 s running; last checkpoint step "
              f"{steps:.0f}")
    assert got["state"] == "failed" and got["state_reason"] == reason
    assert got["running_s"] == 100 and got["allocation"] == []
    assert got["progress"]["steps_done"] == pytest.approx(steps)
    assert s.events(jid)[-1]["message"] == reason


def test_the_operators_default_limit_applies_to_a_job_that_asks_for_none(
        make_service: Any) -> None:
    s = make_service(max_runtime_s_default=30)
    jid = s.submit(SMALL)["id"]
    assert s.job(jid)["max_runtime_s"] == 30
    s.at(0)
    s.at(10)
    s.at(39)
    assert s.job(jid)["state"] == "running"
    s.at(40)
    assert s.job(jid)["state_reason"].startswith("run-time limit of 30 s reached after 30 s "
                                                 "running; last checkpoint step ")


def test_a_users_queued_jobs_are_not_placed_together_above_quota_max_gpus(
        make_service: Any) -> None:
    s = make_service(quota_max_gpus=4)
    a1 = s.submit(FOUR_GPUS)["id"]
    s.clock.advance_to(T0 + 0.5)
    a2 = s.submit(FOUR_GPUS)["id"]  # both queued while alice holds nothing: accepted
    s.at(1)
    assert s.job(a1)["state"] in ("placed", "starting")
    assert sum(a["gpus"] for a in s.job(a1)["allocation"]) == 4
    j2 = s.job(a2)
    assert j2["state"] == "pending"  # 4 GPUs are free: only the quota holds it back
    assert j2["waiting"]["kind"] == "user_gpu_quota"
    assert j2["waiting"]["message"].startswith("your jobs hold 4 GPUs; quota_max_gpus is 4")
    queue = s.client.get("/v1/cluster/queue", headers=s.headers("alice")).json()["data"]
    assert [(e["job_id"], e["waiting"]["kind"]) for e in queue] == [(a2, "user_gpu_quota")]

    b1 = s.submit(FOUR_GPUS, "bob")["id"]  # another user is not held back by alice
    s.at(2)
    assert s.job(b1, "bob")["state"] in ("placed", "starting")
    assert s.job(a2)["state"] == "pending"
    s.at(20)
    assert s.job(a2)["state"] == "pending"

    r = s.client.post(f"/v1/jobs/{a1}/cancel", json={}, headers=s.headers("alice"))
    assert r.status_code == 200, r.text
    s.at(21)  # alice holds nothing now: her second job takes a1's GPUs
    j2 = s.job(a2)
    assert j2["state"] in ("placed", "starting") and j2["waiting"] is None
    assert sum(a["gpus"] for a in j2["allocation"]) == 4
