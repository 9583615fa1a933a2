"""Operators and deadlines: infeasible deadlines at submission, the ranking preference,
owners, GPU-hours and durations, per-user usage, resubmission, offline /docs."""

from __future__ import annotations

import math
from datetime import timedelta

from service_builders import T0, job_body

from orchestrator.backend import VirtualClock
from orchestrator.backends.sim import SimBackend
from orchestrator.loop import ControlLoop
from orchestrator.states import JobState
from scheduler.perf import AnalyticalPerfModel
from scheduler.policy import make_policy
from service.api.inventory import DbClusterProvider
from service.app_runtime import DbJobSource, WakeRunner
from service.db import repositories as repo
from service.db.engine import write_session
from service.ranking_note import ranking_note
from service.runner import EventRecorder

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

    r = env.client.post("/v1/jobs", json=job_body(training=LONG, deadline_s=earliest * 0.5),
                        headers=alice)
    assert r.status_code == 422, r.text
    err = r.json()
    assert err["errors"][0]["field"] == "deadline_s"
    msg = err["errors"][0]["message"]
    assert f"earliest feasible completion is {earliest:.0f} s" in msg
    assert f"plan #{rank}: {best['num_gpus']}×{best['gpu_type']}" in msg
    assert earliest > 60  # printed in whole seconds
    assert f"deadline_s >= {math.ceil(earliest)}" in msg and "best_effort: true" in msg
    # a deadline the fastest plan meets is accepted as usual
    ok = env.client.post("/v1/jobs", json=job_body(training=LONG, deadline_s=earliest * 1.01),
                         headers=alice)
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
    bad = env.client.post("/v1/jobs", json=job_body(training=LONG, deadline_s=10.0,
                                                    best_effort="yes"), headers=alice)
    assert bad.status_code == 422 and bad.json()["errors"][0]["field"] == "best_effort"


def test_ranking_orders_the_stored_plans(env) -> None:  # type: ignore[no-untyped-def]
    """Each ranking's key (predictor.planner: gpu_seconds, then job time; job_time, then
    GPU-seconds; fewest_gpus, then job time) is non-decreasing down the stored list."""
    alice = env.headers("alice")
    keys = {
        "gpu_seconds": lambda p: (p["gpu_seconds"], p["job_time_s"]),
        "job_time": lambda p: (p["job_time_s"], p["gpu_seconds"]),
        "fewest_gpus": lambda p: (p["num_gpus"], p["job_time_s"]),
    }
    firsts = {}
    for ranking, key in keys.items():
        r = env.client.post("/v1/jobs?plans=all", json=job_body(training=LONG, ranking=ranking),
                            headers=alice)
        assert r.status_code == 201, r.text
        plans = r.json()["plans"]
        assert [key(p) for p in plans] == sorted(key(p) for p in plans), ranking
        firsts[ranking] = plans[0]
    # the three orders differ on this job: one GPU is cheapest to hold, 16 fastest
    assert firsts["fewest_gpus"]["num_gpus"] == 1
    assert firsts["job_time"]["job_time_s"] < firsts["fewest_gpus"]["job_time_s"]
    bad = env.client.post("/v1/jobs", json=job_body(ranking="cheapest"), headers=alice)
    assert bad.status_code == 422 and bad.json()["errors"][0]["field"] == "ranking"


def _loop(env, policy):  # type: ignore[no-untyped-def]
    """The service's loop (as in test_service_cluster_admin) over the simulated backend,
    with the runtime's ranking note for ``policy``."""
    clock = VirtualClock(T0.timestamp())
    state = DbClusterProvider(env.factory)().state
    backend = SimBackend(clock, AnalyticalPerfModel(), state, launch_delay_s=0,
                         restart_delay_s=0)
    recorder = EventRecorder(env.factory)
    source = DbJobSource(env.factory, ranking_note=ranking_note(policy))
    return ControlLoop(policy, backend, source, clock, listeners=[recorder],
                       around_turn=recorder.batched, tick_s=None)


def test_ranked_policy_runs_the_first_ranked_plan_and_says_nothing(make_env) -> None:  # type: ignore[no-untyped-def]
    env = make_env(runner=WakeRunner())
    policy = make_policy("has", plan_order="ranked", grow=False)
    assert ranking_note(policy) is None
    loop = _loop(env, policy)
    alice = env.headers("alice")
    job = env.client.post("/v1/jobs", json=job_body(training=LONG, ranking="fewest_gpus"),
                          headers=alice).json()
    loop.step()
    got = env.client.get(f"/v1/jobs/{job['id']}", headers=alice).json()
    # the cluster is empty: the first ranked plan (one GPU) fits and is the one placed
    assert got["chosen_plan"]["rank"] == 1 and got["chosen_plan"]["num_gpus"] == 1
    kinds = [e["kind"] for e in env.client.get(f"/v1/jobs/{job['id']}/events",
                                               headers=alice).json()["data"]]
    assert "ranking" not in kinds


def test_default_policy_says_why_it_does_not_follow_the_ranking(make_env) -> None:  # type: ignore[no-untyped-def]
    env = make_env(runner=WakeRunner())
    loop = _loop(env, make_policy("has"))  # HAS's default: knee plan order, growth
    alice = env.headers("alice")
    asked = env.client.post("/v1/jobs", json=job_body(training=LONG, ranking="fewest_gpus"),
                            headers=alice).json()
    plain = env.client.post("/v1/jobs", json=job_body(training=LONG), headers=alice).json()
    loop.step()
    events = env.client.get(f"/v1/jobs/{asked['id']}/events", headers=alice).json()["data"]
    ranking = [e for e in events if e["kind"] == "ranking"]
    assert len(ranking) == 1
    assert ranking[0]["message"].startswith(
        "ranking 'fewest_gpus': the stored plans are in that order (#1 first), but the "
        "active policy 'has' does not follow the ranked order: it starts a job on the "
        "fastest plan near the knee of its cost curve")
    # a job that named no ranking gets no such event
    other = env.client.get(f"/v1/jobs/{plain['id']}/events", headers=alice).json()["data"]
    assert "ranking" not in [e["kind"] for e in other]
    loop.step()  # a second turn does not repeat it
    events = env.client.get(f"/v1/jobs/{asked['id']}/events", headers=alice).json()["data"]
    assert [e["kind"] for e in events].count("ranking") == 1


def _run(env, job_id: str, *, at: float, gpus: int, until: float | None) -> None:  # type: ignore[no-untyped-def]
    """Place ``job_id`` on ``gpus`` A100s ``at`` seconds after T0 and run it; it succeeds
    at ``until`` (None: still running)."""
    with write_session(env.factory) as s:
        job = repo.get_job(session=s, job_id=job_id, for_update=True)
        t = T0 + timedelta(seconds=at)
        repo.transition_job(session=s, job=job, to=JobState.PLACED, reason="placed", now=t)
        repo.set_allocation(session=s, job=job, placement=[("a100-0", gpus)],
                            gpu_type="A100-80G", plan_rank=1, now=t)
        repo.transition_job(session=s, job=job, to=JobState.STARTING, reason="s", now=t)
        repo.transition_job(session=s, job=job, to=JobState.RUNNING, reason="r", now=t)
        if until is not None:
            repo.transition_job(session=s, job=job, to=JobState.SUCCEEDED, reason="done",
                                now=T0 + timedelta(seconds=until))


def _submit(env, who: str, **over) -> str:  # type: ignore[no-untyped-def]
    r = env.client.post("/v1/jobs", json=job_body(**over), headers=env.headers(who))
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


def test_duration_gpu_hours_and_per_user_usage(env) -> None:  # type: ignore[no-untyped-def]
    done = _submit(env, "alice", name="done")
    live = _submit(env, "alice", name="live")
    queued = _submit(env, "bob", name="queued")
    # done: 4 GPUs from T0+60 s to T0+1860 s -> 1800 s, 4 × 0.5 h = 2.0 GPU-h
    _run(env, done, at=60, gpus=4, until=1860)
    # live: 2 GPUs from T0+100 s, still running at T0+3700 s -> 2 × 1 h = 2.0 GPU-h
    _run(env, live, at=100, gpus=2, until=None)
    env.clock.advance(3700)
    alice = env.headers("alice")

    got = env.client.get(f"/v1/jobs/{done}", headers=alice).json()
    assert got["duration_s"] == 1800.0 and abs(got["gpu_hours"] - 2.0) < 1e-6
    got = env.client.get(f"/v1/jobs/{live}", headers=alice).json()
    assert got["duration_s"] is None and abs(got["gpu_hours"] - 2.0) < 1e-6
    listed = {j["id"]: j for j in env.client.get("/v1/jobs", headers=alice).json()["data"]}
    assert listed[done]["duration_s"] == 1800.0 and abs(listed[done]["gpu_hours"] - 2) < 1e-6
    assert listed[done]["owner"] == "alice"
    everyone = env.client.get("/v1/jobs", headers=env.headers("admin")).json()["data"]
    assert {(j["name"], j["owner"]) for j in everyone} == {
        ("done", "alice"), ("live", "alice"), ("queued", "bob")}
    assert next(j for j in everyone if j["id"] == queued)["gpu_hours"] is None

    users = env.client.get("/v1/admin/users", headers=env.headers("admin")).json()
    rows = [(u["owner"], u["jobs"], u["running"], u["queued"], u["gpus_held"],
             round(u["gpu_hours"], 6)) for u in users["data"]]
    assert rows == [("alice", 2, 1, 0, 2, 4.0), ("bob", 1, 0, 1, 0, 0.0)]
    # the last 600 s (from T0+3100): done had ended; live held 2 GPUs -> 2 × 600 s = 1/3 h
    window = env.client.get("/v1/admin/users?window_s=600",
                            headers=env.headers("admin")).json()
    assert window["window_s"] == 600
    assert abs(window["data"][0]["gpu_hours"] - 1 / 3) < 1e-6
    assert env.client.get("/v1/admin/users", headers=alice).status_code == 403


def test_resubmit_a_finished_job(env) -> None:  # type: ignore[no-untyped-def]
    alice = env.headers("alice")
    body = job_body(name="again", training=LONG, ranking="job_time")
    first = env.client.post("/v1/jobs", json=body, headers=alice).json()
    # still queued: not yet
    r = env.client.post(f"/v1/jobs/{first['id']}/resubmit", headers=alice)
    assert r.status_code == 409 and r.json()["errors"][0]["field"] == "state"
    assert env.client.post(f"/v1/jobs/{first['id']}/cancel", headers=alice).status_code == 200
    # another user, even an admin, gets the same 404 as for an unknown id
    for who in ("bob", "admin"):
        r = env.client.post(f"/v1/jobs/{first['id']}/resubmit", headers=env.headers(who))
        assert r.status_code == 404, who
    r = env.client.post(f"/v1/jobs/{first['id']}/resubmit", headers=alice)
    assert r.status_code == 201, r.text
    again = r.json()
    assert again["id"] != first["id"] and again["state"] == "pending"
    assert (again["name"], again["training"], again["plans"]) == (
        first["name"], first["training"], first["plans"])
    events = env.client.get(f"/v1/jobs/{again['id']}/events", headers=alice).json()["data"]
    assert [e["kind"] for e in events] == ["submitted", "resubmitted"]
    assert events[1]["message"] == f"resubmission of job {first['id']}"
    with env.factory() as s:
        assert repo.get_job(session=s, job_id=again["id"]).request == \
            repo.get_job(session=s, job_id=first["id"]).request


def test_docs_work_offline(env) -> None:  # type: ignore[no-untyped-def]
    """/docs names no outside host: its script and stylesheet are served by the API."""
    import re

    page = env.client.get("/docs")
    assert page.status_code == 200
    urls = re.findall(r'(?:src|href)="([^"]+)"', page.text)
    assert urls and not [u for u in urls if "//" in u], urls
    assert "/docs-assets/swagger-ui-bundle.js" in urls
    assert "/docs-assets/swagger-ui.css" in urls
    js = env.client.get("/docs-assets/swagger-ui-bundle.js")
    assert js.status_code == 200 and len(js.content) > 100_000  # the real bundle
    assert env.client.get("/docs-assets/swagger-ui.css").status_code == 200
    assert "'/openapi.json'" in page.text or '"/openapi.json"' in page.text
    assert env.client.get("/openapi.json").status_code == 200


def test_cli_jobs_shows_owner_duration_gpu_hours_and_resubmits(env, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    import contextlib

    from service import serve_cli
    from service.cli import main as cli_main

    done = _submit(env, "alice", name="done")
    _submit(env, "bob", name="bobs")
    _run(env, done, at=60, gpus=4, until=60 + 3720)  # 1 h 2 min on 4 GPUs: 4.13 GPU-h
    monkeypatch.setattr(serve_cli, "_client", lambda: contextlib.nullcontext(env.client))
    env.client.headers.update(env.headers("admin"))
    assert cli_main(["jobs"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["id", "name", "owner", "model", "state", "progress", "duration",
                              "GPU-h", "reason"]
    row = next(line for line in out if line.startswith(done[:8]))
    assert row.split()[1:8] == ["done", "alice", "gpt2", "succeeded", "100.0%", "1h02m",
                                "4.13"]
    assert any(line.split()[2] == "bob" for line in out[1:-1])  # the admin sees everyone
    assert out[-1] == "(2 of 2)"

    env.client.headers.update(env.headers("alice"))
    assert cli_main(["jobs", done]) == 0
    assert "  used      1h02m on GPUs, 4.13 GPU-h" in capsys.readouterr().out
    assert cli_main(["resubmit", done]) == 0
    line = capsys.readouterr().out.strip()
    assert line.endswith(f"pending: queued: waiting for the scheduler (resubmission of {done})")
    env.client.headers.update(env.headers("bob"))
    assert cli_main(["resubmit", done]) == 1
    assert f"404: job_id: no job '{done}' of yours" in capsys.readouterr().err


def test_every_endpoint_has_a_description_written_for_users(env) -> None:  # type: ignore[no-untyped-def]
    """Each operation has a summary and a description, and neither talks of the service's
    insides (the route docstrings keep those for developers)."""
    insides = ("``", "async", "event loop", "thread", "runner", "sqlite", "postgresql",
               "psycopg", "cache", "transaction", "service.")
    spec = env.client.get("/openapi.json").json()
    ops = [(m.upper(), path, op) for path, item in spec["paths"].items()
           for m, op in item.items()]
    assert len(ops) >= 14
    for method, path, op in ops:
        text = f"{op.get('summary', '')} {op.get('description', '')}".lower()
        assert op.get("summary") and len(op.get("description", "")) > 40, (method, path)
        assert not [w for w in insides if w in text], (method, path, text)
