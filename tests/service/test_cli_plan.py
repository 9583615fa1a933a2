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
