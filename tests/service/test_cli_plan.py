"""`frenzy plan`: table, JSON, HF config input, and errors that name the field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from service.cli import main


def test_plan_json(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["plan", "--model", "gpt2-medium", "--batch", "16", "--seq", "1024",
               "--gpus", "A100-80G,RTX3090", "--max-gpus", "8", "--json", "--top", "3"])
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rc == 0 and out["feasible"] and out["model"] == "gpt2-medium"
    assert 1 <= len(out["plans"]) <= 3
    first = out["plans"][0]
    for key in ("parameters", "gradients", "optimizer_states", "activations", "logits",
                "overhead"):
        assert key in first["memory"]
    assert first["gpu_type"] in ("A100-80G", "RTX3090") and first["step_time_s"] > 0


def test_plan_table_and_hf_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "tiny-llama.json"
    cfg.write_text(json.dumps({
        "model_type": "llama", "num_hidden_layers": 4, "hidden_size": 512,
        "num_attention_heads": 8, "num_key_value_heads": 4, "intermediate_size": 1376,
        "vocab_size": 32000, "max_position_embeddings": 2048}))
    rc = main(["plan", "--config", str(cfg), "--batch", "8", "--seq", "1024",
               "--gpus", "A10", "--max-gpus", "4"])
    out = capsys.readouterr().out
    assert rc == 0 and "tiny-llama" in out and "xA10" in out and "peak GiB" in out


def test_errors_name_the_field(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--model", "gpt-5", "--batch", "8"]) == 2
    assert "error: model:" in capsys.readouterr().err
    assert main(["plan", "--model", "gpt2", "--batch", "0"]) == 2
    assert "global_batch" in capsys.readouterr().err
    assert main(["plan", "--model", "gpt2", "--batch", "8", "--gpus", "A100-81G"]) == 2
    assert "A100-80G" in capsys.readouterr().err


def test_infeasible_exit_code(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["plan", "--model", "llama-3-70b", "--batch", "8", "--seq", "8192",
               "--gpus", "RTX2080Ti", "--max-gpus", "8"])
    assert rc == 1 and "No plan fits" in capsys.readouterr().out


def test_plan_for_a_cluster_ranks_only_its_gpu_types_and_counts(
        capsys: pytest.CaptureFixture[str]) -> None:
    # frenzy-testbed (orchestrator/data/clusters): 3xA100-40G (2+1), 4xA800-80G,
    # 4xA100-80G (2x2); nothing else
    have = {"A100-40G": 3, "A800-80G": 4, "A100-80G": 4}
    args = ["plan", "--model", "gpt2", "--batch", "16", "--seq", "1024", "--top", "0", "--json"]
    assert main([*args, "--gpus", "A100-40G", "--max-gpus", "4"]) == 0
    unbounded = json.loads(capsys.readouterr().out)["plans"]
    assert any(p["num_gpus"] == 4 for p in unbounded)  # what the cluster cannot give
    assert main([*args, "--cluster", "frenzy-testbed"]) == 0
    plans = json.loads(capsys.readouterr().out)["plans"]
    assert plans and all(p["num_gpus"] <= have[p["gpu_type"]] for p in plans)
    assert {p["gpu_type"] for p in plans} == set(have)
    assert [p["rank"] for p in plans] == list(range(1, len(plans) + 1))
    assert plans[1]["reason"].startswith("#2 by gpu_seconds")
    assert main([*args, "--cluster", "no-such-cluster"]) == 2
    err = capsys.readouterr().err
    assert "error: cluster:" in err and "frenzy-testbed" in err
    assert main([*args, "--cluster", "frenzy-testbed", "--gpus", "A10"]) == 2
    assert "--gpus or --cluster" in capsys.readouterr().err


def test_config_may_be_a_model_folder_and_a_bad_folder_is_named(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "tiny-llama"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({
        "model_type": "llama", "num_hidden_layers": 2, "hidden_size": 256,
        "num_attention_heads": 4, "intermediate_size": 688, "vocab_size": 1000,
        "max_position_embeddings": 512}))
    assert main(["plan", "--config", str(folder), "--batch", "4", "--seq", "256",
                 "--gpus", "A10", "--top", "1"]) == 0
    assert "tiny-llama" in capsys.readouterr().out
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["plan", "--config", str(empty), "--batch", "4"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: config:") and "without a config.json" in err
    assert "Traceback" not in err


def test_a_closed_pipe_ends_quietly(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen(
        [sys.executable, "-c", "import sys; from service.cli import main; "
         "sys.exit(main(sys.argv[1:]))", "plan", "--model", "gpt2", "--batch", "16",
         "--seq", "1024", "--top", "0", "--max-gpus", "64"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)})
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader went away (`| head` after its lines) before any write
    err = proc.stderr.read().decode()
    code = proc.wait(timeout=120)
    assert "Traceback" not in err and "BrokenPipe" not in err, err
    assert code == 141  # 128 + SIGPIPE, as a shell reports it
