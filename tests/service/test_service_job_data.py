"""Submitting a job with its data, training knobs and init_from: the files are checked at
submission (422 naming the field), the epochs noted, the options reach the trainer's config;
GET /v1/jobs/{id}/artifacts lists its checkpoints."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from service_builders import Env, job_body

from orchestrator.trainer.data import DataConfig
from orchestrator.trainer.loop import RunConfig, apply_options
from service.api.job_inputs import trainer_options
from service.settings import Settings

TINY = {"name": "tiny", "family": "gpt2", "num_layers": 2, "hidden_size": 64, "num_heads": 4,
        "vocab_size": 512, "max_seq_len": 128}


@pytest.fixture
def settings(migrated_url: str, tmp_path: Path) -> Settings:
    return Settings(database_url=migrated_url, inventory_ttl_s=0,
                    checkpoint_dir=str(tmp_path / "ckpt"))


def _tokens(tmp_path: Path, n: int, top: int = 500) -> Path:
    folder = tmp_path / "tokens"
    folder.mkdir(parents=True, exist_ok=True)
    (np.arange(n) % (top + 1)).astype(np.uint16).tofile(folder / "train.bin")
    return folder


def _body(**kw: object) -> dict:
    return job_body(**{"model": None, "dimensions": TINY,
                       "training": {"global_batch": 8, "seq_len": 64, "steps": 50}, **kw})


def _post(env: Env, body: dict, who: str = "alice"):
    body = {k: v for k, v in body.items() if v is not None}
    return env.client.post("/v1/jobs", json=body, headers=env.headers(who))


def test_job_with_token_shards_notes_its_epochs_and_carries_its_options(
        env: Env, tmp_path: Path) -> None:
    folder = _tokens(tmp_path, 6401)  # (6401 - 1) // 64 = 100 samples
    body = _body(data={"path": str(folder)})
    body["training"].update(lr=1e-3, lr_schedule="linear", seed=5)
    r = _post(env, body)
    assert r.status_code == 201, r.text
    job = r.json()
    # 50 steps x 8 sequences = 400 samples = 4 epochs of 100
    assert job["notes"] == ["data: 6,401 tokens in 1 file(s); the job reads 25,600, 4.00 "
                            "epochs (samples repeat, reshuffled each epoch)"]
    with env.factory() as s:
        from service.db.models import Job

        request = s.get(Job, job["id"]).request
    opts = trainer_options(request, total_steps=50)
    assert opts == {"lr": 1e-3, "lr_schedule": "linear", "warmup_steps": 2,  # 50 // 20
                    "min_lr_ratio": 0.1, "weight_decay": 0.1, "grad_clip": 1.0, "seed": 5,
                    "data": {"kind": "tokens", "path": str(folder), "tokenizer": None,
                             "dtype": "uint16", "text_field": "text", "shuffle": True},
                    "init_from": None}
    cfg = apply_options(RunConfig(job_id="j", model=None, global_batch=8, seq_len=64,
                                  total_steps=50), opts)
    assert cfg.data == DataConfig(kind="tokens", path=str(folder))
    assert (cfg.lr, cfg.lr_schedule, cfg.seed, cfg.warmup_steps) == (1e-3, "linear", 5, 2)


def test_synthetic_stays_the_default_and_can_be_named(env: Env) -> None:
    plain = _post(env, _body())
    named = _post(env, _body(data="synthetic"))
    assert plain.status_code == named.status_code == 201
    assert plain.json()["notes"] == [] and named.json()["notes"] == []
    opts = trainer_options(_body(data="synthetic"), total_steps=50)
    assert opts["data"] is None and opts["lr"] == 3e-3  # the synthetic default


@pytest.mark.parametrize(("data", "training", "field", "words"), [
    ({"path": "/nonexistent/train.bin"}, {}, "data.path", "does not exist"),
    ({"path": "SHORT"}, {}, "data.path", "make no sample"),
    ({"path": "BIGVOCAB"}, {}, "data.path", "beyond the model's vocab_size 512"),
    ({"path": "TEXT"}, {}, "data.tokenizer", "needs a tokenizer"),
    ({"path": "TEXT", "tokenizer": "/nonexistent"}, {}, "data.tokenizer", "no tokenizer.json"),
    ({"path": "TOKENS", "dtype": "int8"}, {}, "data.dtype", "uint16"),
    ({"path": "TOKENS", "format": "x"}, {}, "data.format", "unknown field"),
    ("imagenet", {}, "data", "a path goes under data.path"),
    ({"path": "TOKENS"}, {"lr": -1}, "training.lr", "greater than 0"),
    ({"path": "TOKENS"}, {"lr_schedule": "step"}, "training.lr_schedule", "cosine"),
    ({"path": "TOKENS"}, {"grad_clip": -1}, "training.grad_clip", "greater than or equal"),
])
def test_bad_data_and_knobs_are_422_naming_the_field(
        env: Env, tmp_path: Path, data: object, training: dict, field: str,
        words: str) -> None:
    where = {"SHORT": _tokens(tmp_path / "s", 10), "TOKENS": _tokens(tmp_path / "t", 5000),
             "BIGVOCAB": _tokens(tmp_path / "b", 5000, top=600)}
    text = tmp_path / "text"
    text.mkdir()
    (text / "a.txt").write_text("some words " * 100)
    where["TEXT"] = text
    if isinstance(data, dict):
        data = {k: str(where.get(v, v)) if k == "path" else v for k, v in data.items()}
    body = _body(data=data)
    body["training"].update(training)
    r = _post(env, body)
    assert r.status_code == 422, r.text
    err = r.json()["errors"][0]
    assert err["field"] == field, r.json()
    assert words in err["message"], r.json()
    assert env.runner.submitted == []


def _hf_folder(tmp_path: Path) -> Path:
    from orchestrator.trainer.hf import save_folder
    from orchestrator.trainer.model import Numerics, ParallelTransformer, init_canonical
    from orchestrator.trainer.parallel import Layout
    from predictor.spec import ModelSpec

    spec = ModelSpec(**TINY)
    model = ParallelTransformer(spec, Layout(0, 1, 1, 1))
    init_canonical(model, Layout(0, 1, 1, 1), seed=0)
    save_folder(tmp_path / "my-gpt2", model.state_dict(), spec, Numerics())
    return tmp_path / "my-gpt2"


def test_init_from_alone_names_the_model_and_a_different_model_is_refused(
        env: Env, tmp_path: Path) -> None:
    folder = _hf_folder(tmp_path)
    r = _post(env, {"init_from": str(folder),
                    "training": {"global_batch": 8, "seq_len": 64, "steps": 10}})
    assert r.status_code == 201, r.text
    m = r.json()["model"]
    assert (m["name"], m["family"], m["num_layers"], m["vocab_size"]) == ("my-gpt2", "gpt2",
                                                                          2, 512)
    assert trainer_options({"init_from": str(folder), "training": {
        "global_batch": 8, "seq_len": 64}}, total_steps=10)["lr"] == 3e-5
    other = _post(env, _body(init_from=str(folder), dimensions={**TINY, "num_layers": 3}))
    assert other.status_code == 422
    assert other.json()["errors"][0]["field"] == "init_from"
    assert "num_layers 3 vs 2" in other.json()["detail"]
    missing = _post(env, _body(init_from=str(tmp_path)))
    assert missing.status_code == 422 and "no config.json" in missing.json()["detail"]


def test_artifacts_lists_the_jobs_checkpoints(env: Env, settings: Settings) -> None:
    job = _post(env, _body()).json()
    d = Path(settings.checkpoint_dir) / job["id"]
    empty = env.client.get(f"/v1/jobs/{job['id']}/artifacts", headers=env.headers("alice"))
    assert empty.status_code == 200 and empty.json()["data"] == []
    d.mkdir(parents=True)
    (d / "step-00000020.pt").write_bytes(b"x" * 10)
    (d / "step-00000040.pt").write_bytes(b"x" * 30)
    (d / ".tmp-00000060-1.pt").write_bytes(b"partial")  # a write in progress: not listed
    r = env.client.get(f"/v1/jobs/{job['id']}/artifacts", headers=env.headers("alice"))
    got = r.json()
    assert [(a["step"], a["size_bytes"]) for a in got["data"]] == [(20, 10), (40, 30)]
    assert got["data"][1]["path"] == str((d / "step-00000040.pt").resolve())
    assert got["checkpoint_dir"] == str(d.resolve())
    assert got["export"].startswith(f"frenzy export {job['id']} --format hf")
    other = env.client.get(f"/v1/jobs/{job['id']}/artifacts", headers=env.headers("bob"))
    assert other.status_code == 404  # another user's job is not there for bob


def test_frenzy_export_finds_the_checkpoints_through_the_service(
        env: Env, settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("safetensors")
    from orchestrator.trainer.loop import train
    from predictor.spec import ModelSpec
    from service import serve_cli
    from service.cli import main as cli_main

    job = _post(env, _body()).json()
    train(RunConfig(job_id=job["id"], model=ModelSpec(**TINY), global_batch=2, seq_len=16,
                    total_steps=1, checkpoint_dir=settings.checkpoint_dir), 0)

    def call(method: str, path: str, **kw: object) -> object:
        r = env.client.request(method, path, headers=env.headers("alice"), **kw)
        if r.status_code >= 400:
            raise serve_cli.ClientError(f"{r.status_code}: {r.json()['detail']}")
        return r.json()

    monkeypatch.setattr(serve_cli, "_call", call)
    out = tmp_path / "out"
    assert cli_main(["export", job["id"], str(out)]) == 0
    config = __import__("json").loads((out / "config.json").read_text())
    assert config["model_type"] == "gpt2" and config["n_layer"] == 2
    assert (out / "model.safetensors").stat().st_size > 0
    assert cli_main(["export", "0" * 32, str(tmp_path / "x")]) == 1  # no such job: the 404
