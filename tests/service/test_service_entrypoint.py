"""Bring your own script: the entrypoint's script and working directory are checked at
submission (422 naming the field and the path checked), and a job's working directory
reaches the backend's view of the job (which ships it with Ray's runtime_env)."""

from __future__ import annotations

from pathlib import Path

import pytest
from service_builders import Env, job_body

from service.api.entrypoint_check import script_word
from service.app_runtime import stored_view
from service.db.models import Job
from service.job_paths import resolve_relative_paths

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "byo"


def _post(env: Env, **kw: object):
    return env.client.post("/v1/jobs", json=job_body(**kw), headers=env.headers("alice"))


@pytest.mark.parametrize(("command", "word"), [
    ("python train.py --lr 3", "train.py"),
    ("python3.11 -u src/train.py", "src/train.py"),
    ("torchrun --nproc_per_node=2 train.py", "train.py"),
    ("accelerate launch train.py", "train.py"),
    ("./run.sh fast", "./run.sh"),
    ("/opt/job/bin/train", "/opt/job/bin/train"),
    ("train.py", "train.py"),
    ("python -m mypkg.train", None),
    ("python -c 'print(1)'", None),
    ("sleep 5", None),
])
def test_the_script_word_is_found_in_common_commands(command: str, word: str | None) -> None:
    import shlex

    assert script_word(shlex.split(command)) == word


@pytest.mark.parametrize(("kw", "field", "words"), [
    ({"entrypoint": "python train.py"}, "entrypoint", "has no working_dir"),
    ({"entrypoint": "python nope.py", "working_dir": str(EXAMPLE)}, "entrypoint",
     f"'nope.py' was not found in working_dir (checked {EXAMPLE / 'nope.py'})"),
    ({"entrypoint": "python /no/such/train.py"}, "entrypoint",
     "'/no/such/train.py' was not found (checked /no/such/train.py)"),
    ({"entrypoint": "python train.py", "working_dir": "/no/such/folder"}, "working_dir",
     "/no/such/folder: no such folder"),
    ({"entrypoint": "python train.py", "working_dir": "examples/byo"}, "working_dir",
     "is relative"),
    ({"working_dir": str(EXAMPLE)}, "working_dir", "give 'entrypoint' too"),
    ({"entrypoint": "python 'train.py"}, "entrypoint", "cannot split"),
])
def test_a_missing_script_is_refused_at_submission_naming_the_path(
        env: Env, kw: dict, field: str, words: str) -> None:
    r = _post(env, **kw)
    assert r.status_code == 422, r.text
    err = r.json()["errors"][0]
    assert err["field"] == field, r.json()
    assert words in err["message"], r.json()
    assert env.runner.submitted == [] and env.count("jobs") == 0


def test_a_job_with_its_folder_is_accepted_and_the_backend_sees_the_folder(env: Env) -> None:
    r = _post(env, entrypoint="python3 train.py", working_dir=str(EXAMPLE))
    assert r.status_code == 201, r.text
    assert _post(env, entrypoint="sleep 5").status_code == 201  # a program on PATH
    with env.factory() as s:
        row = s.get(Job, r.json()["id"])
        view = stored_view(row)
    assert not isinstance(view, str), view
    assert view.extra["entrypoint"] == "python3 train.py"
    assert view.extra["working_dir"] == str(EXAMPLE)


def test_a_job_files_relative_working_dir_is_read_against_the_file(tmp_path: Path) -> None:
    body = resolve_relative_paths({"entrypoint": "python train.py", "working_dir": "byo"},
                                  tmp_path)
    assert body["working_dir"] == str(tmp_path / "byo")


def test_the_example_job_file_is_accepted(env: Env) -> None:
    from service.serve_cli import load_job_file

    body = load_job_file(EXAMPLE / "job.yaml")
    assert body["working_dir"] == str(EXAMPLE)
    r = env.client.post("/v1/jobs", json=body, headers=env.headers("alice"))
    assert r.status_code == 201, r.text


def test_a_working_dir_with_private_files_or_links_to_them_is_refused(
        env: Env, tmp_path: Path) -> None:
    """The service ships the folder with its own rights: a 0600 file (its token, its
    database) must not reach a job, directly or through a link."""
    secret = tmp_path / "admin-token"
    secret.write_text("frz-secret")
    secret.chmod(0o600)
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text("print('hi')\n")
    for p in (tmp_path, code, code / "train.py"):
        p.chmod(0o755 if p.is_dir() else 0o644)
    assert _post(env, entrypoint="python train.py", working_dir=str(code)).status_code == 201
    (code / "token").symlink_to(secret)
    r = _post(env, entrypoint="python train.py", working_dir=str(code))
    assert r.status_code == 422, r.text
    err = r.json()["errors"][0]
    assert err["field"] == "working_dir"
    assert f"{code / 'token'} (a link to {secret}) is a file not readable by every user" \
        in err["message"]
    (code / "token").unlink()
    (code / "private.txt").write_text("x")
    (code / "private.txt").chmod(0o640)
    r = _post(env, entrypoint="python train.py", working_dir=str(code))
    assert r.status_code == 422 and "private.txt is a file not readable" in \
        r.json()["errors"][0]["message"], r.text


def test_a_link_to_a_folder_is_followed_when_checking(tmp_path: Path) -> None:
    from orchestrator.sandbox import check_shippable

    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "key").write_text("k")
    (outside / "key").chmod(0o600)
    code = tmp_path / "code"
    code.mkdir()
    (code / "lib").symlink_to(outside, target_is_directory=True)
    for p in (tmp_path, code, outside):
        p.chmod(0o755)
    with pytest.raises(ValueError, match=r"lib/key is a file not readable by every user"):
        check_shippable(code)


# facebook/opt-125m's config.json (the fields the predictor reads): the gpt2 layout with a
# ReLU MLP, which the built-in trainer does not build
OPT_125M = {"model_type": "opt", "hidden_size": 768, "num_hidden_layers": 12,
            "num_attention_heads": 12, "ffn_dim": 3072, "vocab_size": 50272,
            "max_position_embeddings": 2048, "activation_function": "relu",
            "word_embed_proj_dim": 768, "do_layer_norm_before": True}


def test_a_model_type_the_builtin_trainer_does_not_build_needs_an_entrypoint(env: Env) -> None:
    # priced as gpt2 with a ReLU MLP; the built-in trainer would train a GeLU gpt2 instead
    # (and export it as one), so without an entrypoint the job is refused and nothing kept
    r = _post(env, model=None, hf_config=OPT_125M,
              training={"global_batch": 8, "seq_len": 512, "steps": 10})
    assert r.status_code == 422, r.text
    err = r.json()["errors"][0]
    assert err["field"] == "hf_config.model_type"
    assert "'opt'" in err["message"] and "entrypoint" in err["message"]
    assert env.runner.submitted == [] and env.count("jobs") == 0
    # with its own script it runs as the user's code: accepted, priced with the ReLU MLP
    r = _post(env, model=None, hf_config=OPT_125M, entrypoint="python3 train.py",
              working_dir=str(EXAMPLE), training={"global_batch": 8, "seq_len": 512,
                                                  "steps": 10})
    assert r.status_code == 201, r.text
    with env.factory() as s:
        view = stored_view(s.get(Job, r.json()["id"]))
    assert not isinstance(view, str), view
    assert view.model.family.value == "gpt2" and view.model.activation == "relu"
