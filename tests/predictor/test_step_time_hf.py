"""The ``hf-trainer`` step profile: Hugging Face's eager layer, loss and optimizer counted
from transformers' and torch's code (values worked out by hand here), and checked against
the Trainer's step times measured on an H200 (docs/gpu_runs)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from predictor.memory_spec import parse_memory_spec
from predictor.spec import ModelSpec, ParallelConfig, Precision, TrainingSpec
from predictor.step_time import (
    estimate_step_time,
    hf_elementwise_bytes,
    hf_loss_bytes,
)

RUNS = Path(__file__).parents[2] / "docs" / "gpu_runs"
LLAMA = ModelSpec(name="l", family="llama", num_layers=2, hidden_size=2048, num_heads=16,
                  num_kv_heads=4, ffn_hidden_size=5632, vocab_size=32000, max_seq_len=2048)


def test_a_llama_layer_in_bf16_under_autocast() -> None:
    # per token·h: two composite RMSNorms of 7 fp32 passes (56), five half casts of the fp32
    # stream (5 x 6), two residual adds fp32 + bf16 -> fp32 (2 x 10), the attention
    # output's transpose copy (2 x 2): 110; per token·f: silu (2 + 2) and the product
    # (2 + 2 + 2): 10; per rotated Q/K element: 5 x 2 + 20 for rotary in fp32, 6 to cast back
    assert hf_elementwise_bytes(LLAMA, Precision.BF16) == (110.0, 10.0, 36.0)


def test_the_same_layer_in_fp32_has_no_casts() -> None:
    # 56 + 2 x 12 + 2 x 4; 5 x 4; 5 x 4 + 20
    assert hf_elementwise_bytes(LLAMA, Precision.FP32) == (88.0, 20.0, 40.0)


def test_qwen3_adds_its_qk_norms_and_a_wider_q() -> None:
    qwen3 = ModelSpec(name="q", family="qwen3", num_layers=2, hidden_size=1024,
                      num_heads=16, num_kv_heads=8, ffn_hidden_size=3072, vocab_size=1000,
                      max_seq_len=2048, explicit_head_dim=128)
    # Q is 16 x 128 = 2048 wide: the transpose copy is 2 x 2 x 2 per token·h; the q/k norms
    # add 4 x 2 + 28 per Q/K element
    assert hf_elementwise_bytes(qwen3, Precision.BF16) == (114.0, 10.0, 72.0)


def test_gpt2_from_its_config_keeps_dropouts_and_gelu_new() -> None:
    model = parse_memory_spec({
        "hf_config": {"model_type": "gpt2", "n_layer": 2, "n_embd": 768, "n_head": 12,
                      "vocab_size": 50257, "n_positions": 1024},
        "global_batch": 8, "seq_len": 1024, "runtime": "hf-trainer"}).model
    # two LayerNorms (2 x 8), c_attn's and c_fc's casts (2 x 6), two residual adds (2 x 10),
    # the transpose copy (4), two residual dropouts of output and mask (2 x 5): 62; gelu_new's
    # eight ops over f: 18 x 2
    assert hf_elementwise_bytes(model, Precision.BF16) == (62.0, 36.0, 0.0)


def test_the_loss_upcasts_half_logits() -> None:
    assert hf_loss_bytes(Precision.BF16) == 36.0  # (2 + 4) + 8 + 4 + 12 + (4 + 2)
    assert hf_loss_bytes(Precision.FP32) == 24.0


def test_the_optimizer_step_moves_92_bytes_per_parameter() -> None:
    from predictor.gpus import get_gpu

    train = TrainingSpec(global_batch=4, seq_len=1024)
    par = ParallelConfig()
    gpu = get_gpu("H100-80G")
    hf = estimate_step_time(LLAMA, train, par, gpu, runtime="hf-trainer").optimizer_s
    frenzy = estimate_step_time(LLAMA, train, par, gpu, runtime="frenzy").optimizer_s
    assert hf / frenzy == pytest.approx(92.0 / 30.0)


def _rows(name: str) -> list[dict]:
    path = RUNS / name
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.skipif(not (RUNS / "hf_trainer_h200_holdout.jsonl").exists(),
                    reason="committed GPU rows absent")
def test_measured_trainer_step_times_on_the_h200() -> None:
    # the held-out Trainer plans (Adafactor's per-tensor Python loop is not priced): the
    # profile's error against the measured median step time, and the built-in trainer's
    # profile (what hf-trainer plans were priced with before) on the same rows
    errs: dict[str, list[float]] = {"hf-trainer": [], "frenzy": []}
    for row in _rows("hf_trainer_h200_holdout.jsonl") + _rows("hf_trainer_h200_more.jsonl"):
        measured = row["measured"].get("step_time_s")
        if not measured or row["spec"]["optimizer"] == "adafactor":
            continue
        req = parse_memory_spec(row["spec"])
        for runtime, out in errs.items():
            step = estimate_step_time(req.model, req.train, req.par, req.gpu, runtime=runtime)
            out.append(100.0 * (step.total_s / measured - 1.0))
    mape = {k: statistics.fmean(abs(e) for e in v) for k, v in errs.items()}
    assert len(errs["hf-trainer"]) == 20
    assert mape["hf-trainer"] < 10.0 < mape["frenzy"]
    assert abs(statistics.fmean(errs["hf-trainer"])) < 3.0  # no bias left (frenzy: -14 %)
