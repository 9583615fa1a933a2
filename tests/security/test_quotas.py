"""Per-user quotas (``Settings.quota_*``) refuse a submission with a 4xx naming the quota
and its value; nothing is stored for a refused job.

Finding (issue 15): no quotas — a job of 2^62 steps was accepted and held a GPU."""

from __future__ import annotations

from collections.abc import Callable

from security_helpers import Env, job_body

from orchestrator.states import JobState
from service.db import repositories as repo
from service.db.engine import write_session


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
