"""POST /v1/plans previews without writing; plan results are cached per identical body."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from service_builders import Env, job_body

from predictor.planner import PlanResult
from predictor.spec import ModelSpec, TrainingSpec
from service.api.planning import default_planner


def test_preview_plans_writes_nothing(env: Env) -> None:
    r = env.client.post("/v1/plans", json=job_body(), headers=env.headers("alice"))
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["count"] == len(body["plans"]) > 0
    assert body["gpu_types"] == ["A100-80G", "L40S"] and body["max_gpus"] == 16
    assert body["model"]["name"] == "gpt2" and body["training"]["num_steps"] == 100
    assert all(p["num_gpus"] <= 16 for p in body["plans"])
    assert env.count("jobs") == 0 and env.count("events") == 0
    assert env.client.post("/v1/plans", json=job_body()).status_code == 401


def test_identical_bodies_plan_once(make_env: Callable[..., Env]) -> None:
    calls: list[dict[str, Any]] = []

    def counting(
        model: ModelSpec, train: TrainingSpec, gpu_types: Sequence[str] | None, *,
        max_gpus: int, ranking: str,
    ) -> PlanResult:
        calls.append({"gpus": gpu_types, "max_gpus": max_gpus, "ranking": ranking})
        return default_planner(model, train, gpu_types, max_gpus=max_gpus, ranking=ranking)

    env = make_env(planner=counting)
    h = env.headers("alice")
    a = env.client.post("/v1/jobs", json=job_body(name="a"), headers=h)
    b = env.client.post("/v1/jobs", json=job_body(name="b"), headers=h)
    p = env.client.post("/v1/plans", json=job_body(), headers=h)
    assert a.status_code == b.status_code == 201 and p.status_code == 200
    assert len(calls) == 1 and a.json()["plans"] == b.json()["plans"]
    assert calls[0] == {"gpus": ["A100-80G", "L40S"], "max_gpus": 16, "ranking": "gpu_seconds"}
    env.client.post("/v1/jobs", json=job_body(ranking="job_time"), headers=h)
    assert len(calls) == 2


def test_empty_cluster_plans_against_the_catalog(make_env: Callable[..., Env]) -> None:
    env = make_env(nodes={})
    r = env.client.post("/v1/plans", json=job_body(), headers=env.headers("alice"))
    assert r.status_code == 200 and r.json()["gpu_types"] == []
    assert len({p["gpu_type"] for p in r.json()["plans"]}) > 2


def test_openapi_documents_the_routes(env: Env) -> None:
    paths = env.client.get("/openapi.json").json()["paths"]
    assert {"/v1/jobs", "/v1/plans", "/v1/jobs/{job_id}/cancel", "/v1/cluster",
            "/v1/admin/stats"} <= set(paths)
    assert env.client.get("/docs").status_code == 200
