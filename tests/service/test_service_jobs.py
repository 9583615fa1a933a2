"""POST/GET /v1/jobs: submission, plans, idempotency, validation, auth, pagination, cancel."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import sqlalchemy as sa
from service_builders import Env, job_body

from service.runner import SubmittedJob

TABLES = ("jobs", "events", "allocations")


def _counts(env: Env) -> dict[str, int]:
    return {t: env.count(t) for t in TABLES}


def test_submit_returns_job_with_ranked_plans(env: Env) -> None:
    r = env.client.post("/v1/jobs", json=job_body(name="tiny"), headers=env.headers("alice"))
    assert r.status_code == 201, r.text
    job = r.json()
    assert job["state"] == "pending"
    assert job["owner"] == "alice" and job["name"] == "tiny"
    assert job["state_reason"]
    plans = job["plans"]
    assert plans and [p["rank"] for p in plans] == list(range(1, len(plans) + 1))
    assert {p["gpu_type"] for p in plans} <= {"A100-80G", "L40S"}  # the cluster's types only
    for p in plans:
        assert p["peak_memory_bytes"] == p["memory"]["total"] > 0
        assert p["step_time_s"] > 0 and p["num_gpus"] == p["tp"] * p["pp"] * p["dp"]
    assert job["progress"] == {"steps_done": 0.0, "total_steps": 100, "fraction": 0.0}
    assert job["model"]["name"] == "gpt2" and job["model"]["num_params"] > 100_000_000
    assert env.runner.submitted == [job["id"]]
    assert len(plans) == min(5, job["plans_total"])  # top 5 by default
    with env.factory() as s:
        stored = s.execute(sa.text("SELECT plan_count FROM jobs")).scalar_one()
    assert stored == job["plans_total"] > 5

    got = env.client.get(f"/v1/jobs/{job['id']}", headers=env.headers("alice")).json()
    assert got["id"] == job["id"] and got["plans"] == plans
    every = env.client.get(f"/v1/jobs/{job['id']}?plans=all", headers=env.headers("alice"))
    assert [p["rank"] for p in every.json()["plans"]] == list(range(1, stored + 1))
    assert every.json()["plans"][:5] == plans
    two = env.client.get(f"/v1/jobs/{job['id']}?plans=2", headers=env.headers("alice"))
    assert two.json()["plans"] == plans[:2]
    bad = env.client.get(f"/v1/jobs/{job['id']}?plans=many", headers=env.headers("alice"))
    assert bad.status_code == 422 and "plans" in bad.json()["detail"]
    assert got["chosen_plan"] is None and got["allocation"] == []


def test_submit_by_hf_config_and_by_dimensions(env: Env) -> None:
    hf = {"model_type": "gpt2", "n_layer": 4, "n_embd": 256, "n_head": 4, "vocab_size": 1000,
          "n_positions": 512}
    r = env.client.post(
        "/v1/jobs", json={"hf_config": hf, "name": "hf-small",
                          "training": {"global_batch": 8, "seq_len": 512}},
        headers=env.headers("alice"),
    )
    assert r.status_code == 201, r.text
    assert r.json()["model"]["num_layers"] == 4
    dims = {"family": "llama", "num_layers": 4, "hidden_size": 512, "num_heads": 8,
            "num_kv_heads": 2, "ffn_hidden_size": 1376, "vocab_size": 32000, "max_seq_len": 2048}
    r = env.client.post(
        "/v1/jobs", json={"dimensions": dims, "training": {"global_batch": 8, "seq_len": 2048}},
        headers=env.headers("alice"),
    )
    assert r.status_code == 201, r.text
    assert r.json()["model"]["num_kv_heads"] == 2


def test_auth_required(env: Env) -> None:
    assert env.client.post("/v1/jobs", json=job_body()).status_code == 401
    r = env.client.get("/v1/jobs", headers={"Authorization": "Bearer frz_not-a-real-token"})
    assert r.status_code == 401
    assert r.headers["WWW-Authenticate"] == "Bearer"
    assert r.json()["errors"][0]["field"] == "Authorization"
    assert env.client.get("/v1/cluster").status_code == 401
    assert env.count("jobs") == 0


def test_other_users_job_is_not_found(env: Env) -> None:
    job_id = env.client.post("/v1/jobs", json=job_body(), headers=env.headers("alice")).json()["id"]
    for method, path in (("get", f"/v1/jobs/{job_id}"), ("get", f"/v1/jobs/{job_id}/events"),
                         ("post", f"/v1/jobs/{job_id}/cancel")):
        r = env.client.request(method, path, headers=env.headers("bob"))
        assert r.status_code == 404, (path, r.text)  # a 403 would confirm the id exists
    assert env.client.get(f"/v1/jobs/{job_id}", headers=env.headers("admin")).status_code == 200
    assert env.client.get("/v1/jobs/nope", headers=env.headers("alice")).status_code == 404
    # bob's listing does not show alice's job; bob's cancel attempt changed nothing
    assert env.client.get("/v1/jobs", headers=env.headers("bob")).json()["count"] == 0
    got = env.client.get(f"/v1/jobs/{job_id}", headers=env.headers("alice")).json()
    assert got["state"] == "pending"


def test_idempotency_key_returns_the_same_job(env: Env) -> None:
    h = env.headers("alice", **{"Idempotency-Key": "k-1"})
    first = env.client.post("/v1/jobs", json=job_body(), headers=h)
    again = env.client.post("/v1/jobs", json=job_body(), headers=h)
    assert first.status_code == again.status_code == 201
    assert first.json()["id"] == again.json()["id"]
    assert again.headers.get("Idempotent-Replayed") == "true"
    assert env.count("jobs") == 1 and len(env.runner.submitted) == 1
    # the same key for a different body is refused, naming the header
    other = env.client.post("/v1/jobs", json=job_body(name="other"), headers=h)
    assert other.status_code == 422
    assert other.json()["errors"][0]["field"] == "Idempotency-Key"
    # keys are per owner: bob's "k-1" is a new job
    bob = env.client.post("/v1/jobs", json=job_body(),
                          headers=env.headers("bob", **{"Idempotency-Key": "k-1"}))
    assert bob.status_code == 201 and bob.json()["id"] != first.json()["id"]
    assert env.count("jobs") == 2


@pytest.mark.parametrize(
    ("body", "field", "hint"),
    [
        (job_body(model="gpt-5-ultra"), "model", "unknown model"),
        (job_body(model=None), "model", "exactly one of"),
        ({**job_body(), "dimensions": {"num_layers": 2, "hidden_size": 64, "num_heads": 2,
                                       "vocab_size": 10, "max_seq_len": 64}},
         "model", "exactly one of"),
        (job_body(training={"global_batch": 0, "seq_len": 1024}), "training.global_batch",
         "greater than 0"),
        (job_body(training={"global_batch": 8}), "training.seq_len", "required"),
        (job_body(training={"global_batch": 8, "seq_len": 4096}), "training.seq_len", "1024"),
        (job_body(training={"global_batch": 8, "seq_len": 1024, "steps": 5, "tokens": 9}),
         "training.tokens", "not both"),
        (job_body(training={"global_batch": 8, "seq_len": 1024, "precision": "fp8"}),
         "training.precision", "bf16"),
        (job_body(trainng={}), "trainng", "unknown field"),
        ({"hf_config": {"n_layer": 2}, "training": {"global_batch": 8, "seq_len": 64}},
         "hf_config.model_type", "missing"),
        ({"dimensions": {"num_layers": 2, "hidden_size": 100, "num_heads": 3, "vocab_size": 10,
                         "max_seq_len": 64, "family": "gpt2"},
          "training": {"global_batch": 8, "seq_len": 64}},
         "dimensions.hidden_size", "divisible"),
        (job_body(deadline_s=-5), "deadline_s", "greater than 0"),
        (job_body(ranking="cheapest"), "ranking", "gpu_seconds"),
    ],
)
def test_bad_input_names_the_field_and_writes_nothing(
    env: Env, body: dict, field: str, hint: str
) -> None:
    body = {k: v for k, v in body.items() if v is not None}
    before = _counts(env)
    r = env.client.post("/v1/jobs", json=body, headers=env.headers("alice"))
    assert r.status_code == 422, r.text
    err = r.json()
    assert err["errors"][0]["field"] == field, err
    assert hint in err["errors"][0]["message"], err
    assert err["detail"].startswith(field)
    assert _counts(env) == before
    assert env.runner.submitted == []


def test_infeasible_model_reports_per_gpu_need(make_env: Callable[..., Env]) -> None:
    env = make_env(nodes={"old-0": ("RTX2080Ti", 8), "old-1": ("RTX2080Ti", 8)})
    body = {"model": "llama-3-70b", "training": {"global_batch": 64, "seq_len": 8192}}
    r = env.client.post("/v1/jobs", json=body, headers=env.headers("alice"))
    assert r.status_code == 422, r.text
    err = r.json()["errors"][0]
    assert err["field"] == "model"
    assert "GiB per GPU" in err["message"] and "RTX2080Ti" in err["message"]
    assert "11.0 GiB" in err["message"]  # what the largest GPU of this cluster offers
    assert _counts(env) == dict.fromkeys(TABLES, 0)
    # the same body previews to the same answer
    r = env.client.post("/v1/plans", json=body, headers=env.headers("alice"))
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "model"


def test_pagination_and_filters(env: Env) -> None:
    ids = []
    for i in range(5):
        env.clock.advance(1)
        r = env.client.post("/v1/jobs", json=job_body(name=f"j{i}"), headers=env.headers("alice"))
        ids.append(r.json()["id"])
    env.client.post("/v1/jobs", json=job_body(), headers=env.headers("bob"))
    seen = []
    for offset in (0, 2, 4):
        page = env.client.get(f"/v1/jobs?limit=2&offset={offset}",
                              headers=env.headers("alice")).json()
        assert page["count"] == 5 and page["limit"] == 2 and page["offset"] == offset
        seen += [j["id"] for j in page["data"]]
    assert seen == ids[::-1]  # newest first, every job exactly once

    env.client.post(f"/v1/jobs/{ids[0]}/cancel", headers=env.headers("alice"))
    h = env.headers("alice")
    assert env.client.get("/v1/jobs?state=cancelled", headers=h).json()["count"] == 1
    assert env.client.get("/v1/jobs?state=pending&state=cancelled", headers=h).json()[
        "count"] == 5
    r = env.client.get("/v1/jobs?state=bogus", headers=h)
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "state.0"
    assert env.client.get("/v1/jobs?owner=bob", headers=h).status_code == 403
    assert env.client.get("/v1/jobs?limit=100000", headers=h).status_code == 422
    admin = env.headers("admin")
    assert env.client.get("/v1/jobs", headers=admin).json()["count"] == 6
    assert env.client.get("/v1/jobs?owner=bob", headers=admin).json()["count"] == 1


def test_cancel_records_reason_and_event(env: Env) -> None:
    job_id = env.client.post("/v1/jobs", json=job_body(), headers=env.headers("alice")).json()["id"]
    env.clock.advance(30)
    r = env.client.post(f"/v1/jobs/{job_id}/cancel", json={"reason": "wrong lr"},
                        headers=env.headers("alice"))
    assert r.status_code == 200, r.text
    job = r.json()
    assert job["state"] == "cancelled"
    assert job["state_reason"] == "cancelled by alice: wrong lr"
    assert job["finished_at"] is not None
    assert env.runner.cancelled == [job_id]
    again = env.client.post(f"/v1/jobs/{job_id}/cancel", headers=env.headers("alice"))
    assert again.status_code == 409 and again.json()["errors"][0]["field"] == "state"
    events = env.client.get(f"/v1/jobs/{job_id}/events", headers=env.headers("alice")).json()
    assert [e["kind"] for e in events["data"]] == ["submitted", "cancelled"]
    assert events["data"][1]["message"] == "cancelled by alice: wrong lr"
    assert events["data"][1]["state"] == "cancelled"


def test_events_cursor_pagination(env: Env) -> None:
    from service.db import repositories as repo
    from service.db.engine import write_session

    job_id = env.client.post("/v1/jobs", json=job_body(), headers=env.headers("alice")).json()["id"]
    with write_session(env.factory) as s:
        for i in range(4):
            repo.append_event(session=s, job_id=job_id, kind="note", message=f"n{i}",
                              now=env.clock())
    h = env.headers("alice")
    first = env.client.get(f"/v1/jobs/{job_id}/events?limit=3", headers=h).json()
    assert [e["message"] for e in first["data"]][1:] == ["n0", "n1"]
    rest = env.client.get(f"/v1/jobs/{job_id}/events?limit=3&after={first['next_after']}",
                          headers=h).json()
    assert [e["message"] for e in rest["data"]] == ["n2", "n3"]
    assert rest["next_after"] is None


def test_runner_failure_fails_the_job_with_a_reason(make_env: Callable[..., Env]) -> None:
    class Refusing:
        def submit(self, job: SubmittedJob) -> None:
            raise RuntimeError("controller is shutting down")

        def cancel(self, job_id: str, reason: str) -> None:
            pass

    env = make_env(runner=Refusing())
    r = env.client.post("/v1/jobs", json=job_body(), headers=env.headers("alice"))
    assert r.status_code == 503
    assert "controller is shutting down" in r.json()["detail"]
    jobs = env.client.get("/v1/jobs", headers=env.headers("alice")).json()["data"]
    assert len(jobs) == 1 and jobs[0]["state"] == "failed"
    assert "controller is shutting down" in jobs[0]["state_reason"]
