"""Per-user quotas (``Settings.quota_*``) refuse a submission with a 4xx naming the quota
and its value; nothing is stored for a refused job.

Finding (issue 15): no quotas — a job of 2^62 steps was accepted and held a GPU."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from security_helpers import Env, job_body

from orchestrator.states import JobState
from service.db import repositories as repo
from service.db.engine import write_session
from service.settings import Settings, SettingsError


def _count(env: Env, who: str) -> int:
    return int(env.client.get("/v1/jobs", headers=env.headers(who)).json()["count"])


def test_max_steps_per_job(make_env: Callable[..., Env]) -> None:
    env = make_env(quota_max_steps=1000)
    env.submit(training={"global_batch": 32, "seq_len": 1024, "steps": 1000})
    r = env.client.post("/v1/jobs", json=job_body(training={
        "global_batch": 32, "seq_len": 1024, "steps": 1001}), headers=env.headers("alice"))
    assert r.status_code == 422
    assert r.json()["errors"][0] == {
        "field": "training.steps",
        "message": "quota_max_steps: at most 1,000 steps per job, this job has 1,001"}
    # tokens: 32 × 1024 × 2000 tokens are 2000 steps
    r = env.client.post("/v1/jobs", json=job_body(training={
        "global_batch": 32, "seq_len": 1024, "tokens": 32 * 1024 * 2000}),
        headers=env.headers("alice"))
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "training.tokens"
    assert _count(env, "alice") == 1


def test_max_predicted_job_time(make_env: Callable[..., Env]) -> None:
    env = make_env(quota_max_job_time_s=3600)
    env.submit()  # 100 steps of gpt2: seconds
    r = env.client.post("/v1/jobs", json=job_body(training={
        "global_batch": 32, "seq_len": 1024, "steps": 1 << 40}), headers=env.headers("alice"))
    assert r.status_code == 422
    assert r.json()["detail"].startswith("training: quota_max_job_time_s: at most 3,600 s per "
                                         "job, the fastest plan takes ")


def test_max_queued_per_user(make_env: Callable[..., Env]) -> None:
    env = make_env(quota_max_queued=2)
    env.submit()
    env.submit()
    r = env.client.post("/v1/jobs", json=job_body(), headers=env.headers("alice"))
    assert r.status_code == 429
    assert r.json()["errors"][0] == {
        "field": "quota",
        "message": "quota_max_queued: alice has 2 job(s) waiting for GPUs, the most allowed "
                   "is 2; wait for one to start or cancel one"}
    env.submit("bob")  # per user
    assert _count(env, "alice") == 2


def test_max_gpus_held_per_user(make_env: Callable[..., Env]) -> None:
    env = make_env(quota_max_gpus=4)
    first = env.submit()
    plans = env.client.get(f"/v1/jobs/{first}?plans=all", headers=env.headers("alice")).json()
    assert max(p["num_gpus"] for p in plans["plans"]) <= 4  # plans capped at the quota
    with write_session(env.factory) as s:  # the first job holds 4 GPUs
        job = repo.get_job(session=s, job_id=first, for_update=True)
        assert job is not None
        repo.set_allocation(session=s, job=job, placement=[("a100-0", 4)],
                            gpu_type="A100-80G", plan_rank=1, now=env.clock())
        repo.transition_job(session=s, job=job, to=JobState.PLACED, reason="t",
                            now=env.clock())
    r = env.client.post("/v1/jobs", json=job_body(), headers=env.headers("alice"))
    assert r.status_code == 429
    assert r.json()["detail"] == ("quota: quota_max_gpus: alice holds 4 GPU(s) and this job "
                                  "needs at least 1; at most 4 may be held at once")
    env.submit("bob")


def test_max_runtime_s_above_the_operators_maximum_or_malformed_is_a_422(
        make_env: Callable[..., Env]) -> None:
    env = make_env(max_runtime_s_max=3600)
    r = env.client.post("/v1/jobs", json=job_body(max_runtime_s=7200),
                        headers=env.headers("alice"))
    assert r.status_code == 422
    assert r.json()["errors"][0] == {
        "field": "max_runtime_s",
        "message": "at most 3,600 s (the operator's max_runtime_s_max), got 7,200"}
    for bad in (-5, 0, True, "100", [100]):
        r = env.client.post("/v1/jobs", json=job_body(max_runtime_s=bad),
                            headers=env.headers("alice"))
        assert r.status_code == 422, bad
        assert r.json()["errors"][0]["field"] == "max_runtime_s", r.json()
    assert _count(env, "alice") == 0
    job = env.client.get(f"/v1/jobs/{env.submit(max_runtime_s=3600)}",
                         headers=env.headers("alice")).json()
    assert job["max_runtime_s"] == 3600 and job["running_s"] == 0
    # no request: the maximum is the limit when there is no default
    job = env.client.get(f"/v1/jobs/{env.submit()}", headers=env.headers("alice")).json()
    assert job["max_runtime_s"] == 3600


def test_max_runtime_s_default_and_no_limit(make_env: Callable[..., Env]) -> None:
    env = make_env(max_runtime_s_default=600)
    job = env.client.get(f"/v1/jobs/{env.submit()}", headers=env.headers("alice")).json()
    assert job["max_runtime_s"] == 600
    job = env.client.get(f"/v1/jobs/{env.submit(max_runtime_s=1e6)}",
                         headers=env.headers("alice")).json()
    assert job["max_runtime_s"] == 1e6  # no maximum: any limit may be asked for
    env = make_env()
    job = env.client.get(f"/v1/jobs/{env.submit()}", headers=env.headers("alice")).json()
    assert job["max_runtime_s"] is None


def test_a_default_above_the_maximum_is_refused() -> None:
    with pytest.raises(SettingsError, match=r"settings: .*max_runtime_s_default \(7200\) is "
                                            r"above max_runtime_s_max \(3600\)"):
        Settings.from_env({"FRENZY_MAX_RUNTIME_S_DEFAULT": "7200",
                           "FRENZY_MAX_RUNTIME_S_MAX": "3600"})
