"""`frenzy memory --spec` and POST /v1/memory: three figures, hand-checked, and errors that
name the field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from service_builders import Env

from service.cli import main

# A two-layer llama-style model: per layer 4·h² (attention) + 3·h·f (SwiGLU) + 2·h (RMSNorm
# weights) = 16384 + 24576 + 128 = 41088 parameters; embedding 1024·64 = 65536; head: final
# norm 64 + untied output 65536. N = 2·41088 + 65536 + 65600 = 213312.
N = 213312
SPEC: dict[str, Any] = {
    "model": {"family": "llama", "num_layers": 2, "hidden_size": 64, "num_heads": 4,
              "num_kv_heads": 4, "ffn_hidden_size": 128, "vocab_size": 1024,
              "tie_embeddings": False},
    "global_batch": 1, "seq_len": 1, "micro_batch": 1, "runtime": "torchtune",
}
# torchtune: pure bf16 weights, grads and AdamW m, v (8 B/param); at one token the peak is
# the optimizer step with torch's foreach sqrt(v) temporary over all parameters (2 B/param).
TENSORS = 10 * N
RESERVED = TENSORS + int(0.09 * TENSORS)  # the calibrated allocator slack (9 %)


def _run(tmp_path: Path, spec: Any, capsys: pytest.CaptureFixture[str], *extra: str
         ) -> tuple[int, str, str]:
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec), encoding="utf-8")
    rc = main(["memory", "--spec", str(path), *extra])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_memory_json_matches_hand_count(tmp_path: Path, capsys) -> None:
    rc, out, _ = _run(tmp_path, SPEC, capsys, "--json")
    got = json.loads(out.strip().splitlines()[-1])
    assert rc == 0 and got["runtime"] == "torchtune" and got["gpu"] is None
    assert got["tensors_bytes"] == TENSORS
    assert got["reserved_bytes"] == got["device_bytes"] == RESERVED  # no GPU: no context
    b = got["breakdown"]
    assert b["parameters"] == b["gradients"] == 2 * N and b["optimizer_states"] == 4 * N


def test_memory_on_a_gpu_adds_workspace_context_and_nccl(tmp_path: Path, capsys) -> None:
    spec = {**SPEC, "gpu": "V100-16G", "precision": "fp16", "dp": 2, "global_batch": 2}
    rc, out, _ = _run(tmp_path, spec, capsys, "--json")
    got = json.loads(out.strip().splitlines()[-1])
    assert rc == 0 and got["gpu"] == "V100-16G" and got["fits"] is True
    # 64 MiB cuBLAS workspaces; outside the allocator: 1343 MiB context + 512 MiB NCCL
    assert got["breakdown"]["workspace"] == 64 << 20
    assert got["device_bytes"] - got["reserved_bytes"] == (1343 + 512) << 20


def test_memory_takes_a_device_name_and_a_framework_name(tmp_path: Path, capsys) -> None:
    base = {**SPEC, "precision": "fp16", "dp": 2, "global_batch": 2}
    rc, out, _ = _run(tmp_path, {**base, "gpu": "V100-16G"}, capsys, "--json")
    want = json.loads(out.strip().splitlines()[-1])
    rc2, out2, _ = _run(tmp_path, {**base, "gpu": "Tesla V100-SXM2-16GB"}, capsys, "--json")
    got = json.loads(out2.strip().splitlines()[-1])
    assert rc == rc2 == 0 and got == want and got["gpu"] == "V100-16G"  # the entry it used
    rc3, out3, _ = _run(tmp_path, {**base, "runtime": "Megatron-LM"}, capsys, "--json")
    assert rc3 == 0 and json.loads(out3.strip().splitlines()[-1])["runtime"] == "megatron"


@pytest.mark.parametrize(("change", "field", "hint"), [
    ({"tpp": 2}, "tpp", "tp"),
    ({"gpu": "H100"}, "gpu", "H100-80G"),
    ({"runtime": "deepspeed3"}, "runtime", "deepspeed"),
    ({"runtime_options": {"dropuot": True}}, "runtime_options.dropuot", "hidden_dropout"),
    ({"pp": 2, "layers_per_stage": [1, 2]}, "layers_per_stage", "summing to num_layers=2"),
    ({"dropout": 1.5}, "dropout", "[0, 1)"),
    ({"optimizer": "adafactor", "runtime": "frenzy"}, "optimizer", "adam, adamw, sgd"),
    ({"runtime_options": {"loss_chunks": 8}}, "runtime_options.loss_chunks", "compiled"),
])
def test_bad_spec_names_the_field(tmp_path: Path, capsys, change, field, hint) -> None:
    rc, _, err = _run(tmp_path, {**SPEC, **change}, capsys, "--json")
    assert rc == 2 and err.startswith(f"error: {field}:") and hint in err


@pytest.mark.parametrize("name", ["megatron", "Megatron-LM"])
def test_plan_takes_a_runtime(capsys, name: str) -> None:
    rc = main(["plan", "--model", "gpt2-medium", "--batch", "16", "--seq", "1024",
               "--gpus", "A100-80G", "--max-gpus", "4", "--json", "--runtime", name])
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rc == 0 and {p["runtime"] for p in out["plans"]} == {"megatron"}


def test_plan_names_an_unknown_runtime(capsys) -> None:
    rc = main(["plan", "--model", "gpt2-medium", "--batch", "16", "--gpus", "A100-80G",
               "--runtime", "deepspeed3"])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("error: runtime:") and "deepspeed" in err


def test_post_memory(env: Env) -> None:
    r = env.client.post("/v1/memory", json=SPEC, headers=env.headers("alice"))
    assert r.status_code == 200, r.text
    assert r.json()["tensors_bytes"] == TENSORS and r.json()["reserved_bytes"] == RESERVED
    bad = env.client.post("/v1/memory", json={**SPEC, "micro_batchs": 1},
                          headers=env.headers("alice"))
    assert bad.status_code == 422 and bad.json()["errors"][0]["field"] == "micro_batchs"
    assert env.client.post("/v1/memory", json=SPEC).status_code == 401


def test_jobs_are_priced_for_their_runtime(env: Env) -> None:
    from service_builders import job_body

    h = env.headers("alice")
    preview = env.client.post("/v1/plans", json=job_body(), headers=h).json()
    built_in = preview["plans"]
    mega = env.client.post("/v1/plans", json=job_body(runtime="megatron"), headers=h)
    own = env.client.post("/v1/plans", json=job_body(entrypoint="train.py"), headers=h)
    assert {p["runtime"] for p in built_in} == {"frenzy"}
    # the built-in trainer executes the whole space (pipeline stages too): no note excludes
    # a plan dimension; one says when its pipelines are searched
    assert preview["notes"] == ["runtime frenzy searches pipeline stages only when no "
                                "single-stage plan fits any GPU type"]
    assert mega.json()["notes"] == []
    assert {p["runtime"] for p in mega.json()["plans"]} == {"megatron"}
    assert {p["runtime"] for p in own.json()["plans"]} == {"hf-trainer"}  # most conservative
    bad = env.client.post("/v1/plans", json=job_body(runtime="megatorn"), headers=h)
    assert bad.status_code == 422 and bad.json()["errors"][0]["field"] == "runtime"
    assert "megatron" in bad.json()["detail"]


def test_jobs_with_an_optimizer_the_built_in_trainer_does_not_run(env: Env) -> None:
    h = env.headers("alice")
    training = {"global_batch": 32, "seq_len": 1024, "steps": 100, "optimizer": "adafactor"}
    from service_builders import job_body

    bad = env.client.post("/v1/plans", json=job_body(training=training), headers=h)
    assert bad.status_code == 422 and bad.json()["errors"][0]["field"] == "training.optimizer"
    assert "adam, adamw, sgd" in bad.json()["detail"]
    own = env.client.post("/v1/plans", json=job_body(training=training, entrypoint="train.py"),
                          headers=h)
    assert own.status_code == 200, own.text
    assert {p["runtime"] for p in own.json()["plans"]} == {"hf-trainer"}


# Qwen3-style: heads of 32 over hidden 64 (Q and the attention output 4 x 32 = 128 wide, K
# and V 2 x 32 = 64) and a 32-wide q_norm and k_norm. Per layer: q 64 x 128 = 8192, k and v
# 64 x 64 = 4096 each, o 128 x 64 = 8192; q/k norms 64; SwiGLU 3 x 64 x 128 = 24576;
# RMSNorms 128: 49344. N = 2 x 49344 + 65536 (embedding) + 65600 (norm + untied head).
N_WIDE = 229824
WIDE_MODEL = {"family": "qwen3", "num_layers": 2, "hidden_size": 64, "num_heads": 4,
              "num_kv_heads": 2, "head_dim": 32, "ffn_hidden_size": 128, "vocab_size": 1024,
              "tie_embeddings": False}


def test_memory_with_an_explicit_head_dim_matches_hand_count(tmp_path: Path, capsys,
                                                               env: Env) -> None:
    spec = {**SPEC, "model": WIDE_MODEL}
    rc, out, _ = _run(tmp_path, spec, capsys, "--json")
    got = json.loads(out.strip().splitlines()[-1])
    assert rc == 0 and got["tensors_bytes"] == 10 * N_WIDE
    assert got["breakdown"]["parameters"] == 2 * N_WIDE
    r = env.client.post("/v1/memory", json=spec, headers=env.headers("alice"))
    assert r.status_code == 200 and r.json()["tensors_bytes"] == 10 * N_WIDE
    # the field is checked like the others
    rc, _, err = _run(tmp_path, {**spec, "model": {**WIDE_MODEL, "head_dim": -32}}, capsys)
    assert rc == 2 and err.startswith("error: head_dim:")
    rc, _, err = _run(tmp_path, {**spec, "model": {**WIDE_MODEL, "head_dims": 32}}, capsys)
    assert rc == 2 and err.startswith("error: model.head_dims:") and "head_dim" in err


def test_jobs_take_a_head_dim_in_their_dimensions(env: Env) -> None:
    h = env.headers("alice")
    dims = {**WIDE_MODEL, "max_seq_len": 256}
    r = env.client.post("/v1/plans", json={
        "dimensions": dims, "training": {"global_batch": 8, "seq_len": 256, "steps": 10}},
        headers=h)
    assert r.status_code == 200, r.text
    model = r.json()["model"]
    assert model["head_dim"] == 32 and model["num_params"] == N_WIDE
    r = env.client.post("/v1/jobs", json={
        "dimensions": dims, "training": {"global_batch": 8, "seq_len": 256, "steps": 10}},
        headers=h)
    assert r.status_code in (200, 201, 202), r.text
    job = env.client.get(f"/v1/jobs/{r.json()['id']}", headers=h).json()
    assert job["model"]["head_dim"] == 32 and job["model"]["num_params"] == N_WIDE
    bad = env.client.post("/v1/plans", json={
        "dimensions": {**dims, "head_dim": 0, "hidden_size": 66},
        "training": {"global_batch": 8, "seq_len": 256, "steps": 10}}, headers=h)
    assert bad.status_code == 422 and bad.json()["errors"][0]["field"] == "dimensions.hidden_size"
