"""Operators and deadlines: infeasible deadlines at submission, the ranking preference,
owners, GPU-hours and durations, per-user usage, resubmission, offline /docs."""

from __future__ import annotations

from service_builders import job_body


import math

LONG = {"global_batch": 32, "seq_len": 1024, "steps": 100_000}
"""gpt2 for 100,000 steps: an hour or so on the test cluster's fastest plan"""


def _fastest(plans: list[dict]) -> tuple[float, int, dict]:
    """(job time, rank, plan) of the plan with the least predicted job time."""
    return min((p["job_time_s"], p["rank"], p) for p in plans)[:3]


def test_infeasible_deadline_is_refused_with_the_earliest_completion(env) -> None:  # type: ignore[no-untyped-def]
    alice = env.headers("alice")
    free = env.client.post("/v1/jobs?plans=all", json=job_body(training=LONG), headers=alice).json()
    plans = free["plans"]
    # a plan's job time is its predicted step time × the 100,000 steps asked for
    for p in plans:
        assert abs(p["job_time_s"] - 100_000 * p["step_time_s"]) < 1e-6 * p["job_time_s"]
    earliest, rank, best = _fastest(plans)

    r = env.client.post("/v1/jobs", json=job_body(training=LONG, deadline_s=earliest * 0.5), headers=alice)
    assert r.status_code == 422, r.text
    err = r.json()
    assert err["errors"][0]["field"] == "deadline_s"
    msg = err["errors"][0]["message"]
    assert f"earliest feasible completion is {earliest:.0f} s" in msg
    assert f"plan #{rank}: {best['num_gpus']}×{best['gpu_type']}" in msg
    assert earliest > 60  # printed in whole seconds
    assert f"deadline_s >= {math.ceil(earliest)}" in msg and "best_effort: true" in msg
    # a deadline the fastest plan meets is accepted as usual
    ok = env.client.post("/v1/jobs", json=job_body(training=LONG, deadline_s=earliest * 1.01), headers=alice)
    assert ok.status_code == 201, ok.text
    assert ok.json()["state_reason"] == "queued: waiting for the scheduler"


def test_best_effort_accepts_the_deadline_and_says_so(env) -> None:  # type: ignore[no-untyped-def]
    alice = env.headers("alice")
    plans = env.client.post("/v1/jobs?plans=all", json=job_body(training=LONG),
                            headers=alice).json()["plans"]
    earliest, rank, _ = _fastest(plans)
    r = env.client.post("/v1/jobs", json=job_body(training=LONG, deadline_s=earliest / 4,
                                                     best_effort=True), headers=alice)
    assert r.status_code == 201, r.text
    job = r.json()
    assert job["state_reason"].startswith("queued best-effort: deadline")
    assert (f"predicted completion ≥ {earliest:.0f} s ({earliest / 60:.1f} min) after "
            f"submission (plan #{rank}:") in job["state_reason"]
    assert job["notes"][0] == job["state_reason"]
    got = env.client.get(f"/v1/jobs/{job['id']}", headers=alice).json()
    assert got["state_reason"] == job["state_reason"]
    events = env.client.get(f"/v1/jobs/{job['id']}/events", headers=alice).json()["data"]
    assert events[0]["kind"] == "submitted" and "best-effort" in events[0]["message"]
    # best_effort must be a JSON boolean
    bad = env.client.post("/v1/jobs", json=job_body(training=LONG, deadline_s=10.0, best_effort="yes"),
                          headers=alice)
    assert bad.status_code == 422 and bad.json()["errors"][0]["field"] == "best_effort"
