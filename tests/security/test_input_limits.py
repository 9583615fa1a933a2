"""Bad input is a 4xx naming the field, never a 500: strings the databases cannot store,
nesting bombs, numbers beyond what the planner computes, booleans given as numbers, and
the retired ``priority`` field. Each runs on SQLite and PostgreSQL (``db_url``).

Findings (issue 15): 500s from a NUL byte on PostgreSQL, an ``hf_config`` nested ~900
deep, ``POST /v1/plans`` with maximal dimensions (integer overflow); ``"steps": true``
accepted as one step; ``priority`` accepted and read by no policy."""

from __future__ import annotations

import json
from typing import Any

import pytest
from security_helpers import Env, job_body

from service.limits import MAX_HF_CONFIG_DEPTH, MODEL_BOUNDS

GPT2_CONFIG = {"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 2,
               "vocab_size": 1000, "n_positions": 1024}


def _fields(r: Any) -> list[str]:
    return [e["field"] for e in r.json()["errors"]]


@pytest.mark.parametrize(("where", "body"), [
    ("name", job_body(name="a\x00b")),
    ("entrypoint", job_body(entrypoint="python train.py\x00--evil")),
    ("model", job_body(model="gpt2\x00")),
    ("hf_config", {"hf_config": {**GPT2_CONFIG, "_name_or_path": "x\x00y"},
                   "training": job_body()["training"]}),
    ("hf_config", {"hf_config": {**GPT2_CONFIG, "k\x00ey": 1},
                   "training": job_body()["training"]}),
])
def test_nul_in_a_body_string_is_a_422(env: Env, where: str, body: dict[str, Any]) -> None:
    r = env.client.post("/v1/jobs", json=body, headers=env.headers("alice"))
    assert r.status_code == 422, r.text
    assert _fields(r) == [where] and "NUL" in r.json()["detail"]


def test_nul_in_path_query_and_cancel_reason_is_a_422(env: Env) -> None:
    h = env.headers("alice")
    for method, path in (("get", "/v1/jobs/a%00b"), ("get", "/v1/jobs/a%00b/events"),
                         ("post", "/v1/jobs/a%00b/cancel"), ("get", "/v1/jobs?owner=a%00b")):
        r = env.client.request(method, path, headers=h)
        assert r.status_code == 422, (path, r.text)
        assert "NUL" in r.json()["detail"]
    job_id = env.submit()
    r = env.client.post(f"/v1/jobs/{job_id}/cancel", json={"reason": "x\x00"}, headers=h)
    assert r.status_code == 422 and _fields(r) == ["reason"]
    assert env.client.get(f"/v1/jobs/{job_id}", headers=h).json()["state"] == "pending"


def test_lone_surrogate_is_a_422(env: Env) -> None:
    raw = b'{"model": "gpt2", "name": "a\\ud800b", "training": ' \
          b'{"global_batch": 32, "seq_len": 1024, "steps": 1}}'
    r = env.client.post("/v1/jobs", content=raw, headers=env.headers(
        "alice", **{"Content-Type": "application/json"}))
    assert r.status_code == 422 and _fields(r) == ["name"]


def test_depth_bomb_is_a_422(env: Env) -> None:
    deep: dict[str, Any] = {}
    node = deep
    for _ in range(900):
        node["a"] = {}
        node = node["a"]
    for path in ("/v1/jobs", "/v1/plans"):
        r = env.client.post(path, json={"hf_config": {**GPT2_CONFIG, "x": deep},
                                        "training": job_body()["training"]},
                            headers=env.headers("alice"))
        assert r.status_code == 422, r.text
        assert f"nested deeper than {MAX_HF_CONFIG_DEPTH} levels" in r.json()["detail"]
    # deeper than the JSON parser's own recursion limit: refused as unparseable (a 4xx)
    raw = '{"hf_config":' + '{"a":' * 5000 + "1" + "}" * 5000 + \
          ',"training":{"global_batch":32,"seq_len":1024,"steps":1}}'
    r = env.client.post("/v1/jobs", content=raw, headers=env.headers(
        "alice", **{"Content-Type": "application/json"}))
    assert 400 <= r.status_code < 500


def test_wide_hf_config_is_a_422(env: Env) -> None:
    wide = {**GPT2_CONFIG, "junk": list(range(5000))}
    r = env.client.post("/v1/jobs", json={"hf_config": wide, "training": job_body()["training"]},
                        headers=env.headers("alice"))
    assert r.status_code == 422 and "more than 4096 keys and list items" in r.json()["detail"]


MAX_DIMS = {
    "num_layers": 1024, "hidden_size": 1 << 16, "num_heads": 1024, "vocab_size": 1 << 22,
    "max_seq_len": 1 << 21, "num_kv_heads": 1024, "ffn_hidden_size": 1 << 19,
    "type_vocab_size": 1 << 16,
}
"""The documented bounds (docs/security.md), written out independently of the code."""


def test_every_schema_maximum_is_a_4xx_not_a_5xx(env: Env) -> None:
    assert {k: MODEL_BOUNDS[k] for k in MAX_DIMS} == MAX_DIMS
    h = env.headers("alice")
    for family in ("llama", "gpt2", "bert"):
        for training in ({"global_batch": 1 << 20, "seq_len": 1 << 21, "steps": 1 << 40},
                         {"global_batch": 1 << 20, "seq_len": 1 << 21, "tokens": 1 << 62,
                          "flash_attention": False},
                         {"global_batch": 1, "seq_len": 1 << 21, "steps": 1}):
            body = {"dimensions": {**MAX_DIMS, "family": family}, "training": training,
                    "max_gpus": 4096}
            for path in ("/v1/plans", "/v1/jobs"):
                r = env.client.post(path, json=body, headers=h)
                assert 400 <= r.status_code < 500, (family, training, r.status_code, r.text)
    # one past a bound: the error names the field and the bound
    r = env.client.post("/v1/plans", json={
        "dimensions": {**MAX_DIMS, "num_layers": 1025}, "training": job_body()["training"]},
        headers=h)
    assert r.status_code == 422
    assert r.json()["errors"][0] == {"field": "dimensions.num_layers",
                                     "message": "Input should be less than or equal to 1024"}
    # the product check: each number within bounds, the whole batch beyond the planner
    r = env.client.post("/v1/plans", json={
        "dimensions": {**MAX_DIMS, "family": "llama"},
        "training": {"global_batch": 1 << 20, "seq_len": 1 << 21, "steps": 1,
                     "flash_attention": False}}, headers=h)
    assert r.status_code == 422 and _fields(r) == ["training.global_batch"]
    assert "at most 2^61" in r.json()["detail"]


def test_hf_config_numbers_get_the_same_bounds(env: Env) -> None:
    config = {**GPT2_CONFIG, "n_layer": 10**30}
    r = env.client.post("/v1/plans", json={"hf_config": config,
                                           "training": job_body()["training"]},
                        headers=env.headers("alice"))
    assert r.status_code == 422, r.text
    assert r.json()["detail"].startswith("hf_config: num_layers: must be at most 1,024")
    r = env.client.post("/v1/plans", json={"hf_config": {**GPT2_CONFIG, "n_layer": True},
                                           "training": job_body()["training"]},
                        headers=env.headers("alice"))
    assert r.status_code == 422 and r.json()["detail"].endswith("got True")


@pytest.mark.parametrize(("path", "value"), [
    (("training", "steps"), True),
    (("training", "global_batch"), True),
    (("training", "seq_len"), False),
    (("training", "flash_attention"), 1),
    (("deadline_s",), True),
    (("max_gpus",), True),
    (("training", "steps"), "100"),
])
def test_no_bool_as_int(env: Env, path: tuple[str, ...], value: Any) -> None:
    body = json.loads(json.dumps(job_body()))
    target = body
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    r = env.client.post("/v1/jobs", json=body, headers=env.headers("alice"))
    assert r.status_code == 422, r.text
    assert _fields(r) == [".".join(path)]
    assert env.client.get("/v1/jobs", headers=env.headers("alice")).json()["count"] == 0


def test_priority_is_refused_with_a_reason(env: Env) -> None:
    r = env.client.post("/v1/jobs", json=job_body(priority=5), headers=env.headers("alice"))
    assert r.status_code == 422
    assert r.json()["errors"][0]["field"] == "priority"
    assert "no scheduling policy orders jobs by priority" in r.json()["detail"]


def test_stats_window_below_a_second_is_a_422(env: Env) -> None:
    """Found by the schemathesis run: a window of 5e-324 s made zero-length buckets (a
    division by zero, a 500)."""
    r = env.client.get("/v1/admin/stats?window_s=5e-324", headers=env.headers("admin"))
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "window_s"
    r = env.client.get("/v1/admin/stats?window_s=1&buckets=1000", headers=env.headers("admin"))
    assert r.status_code == 200 and r.json()["bucket_s"] == 0.001
