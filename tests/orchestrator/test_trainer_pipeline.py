"""Pipeline stages in the built-in trainer: 1F1B over real gloo ranks gives the losses and
weights of the one-stage run (tied embeddings, uneven splits, with dp + ZeRO and with tp),
checkpoints resume across pp, and the layout and split are the ones the predictor prices."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from orchestrator.trainer import checkpoint as ckpt
from orchestrator.trainer.export import export_hf
from orchestrator.trainer.local import run_local
from orchestrator.trainer.loop import RunConfig, train
from orchestrator.trainer.model import ParallelTransformer, stage_layer_range
from orchestrator.trainer.parallel import Layout
from predictor.memory import stage_layer_counts
from predictor.runtimes import FRENZY
from predictor.spec import Family, ModelSpec
from tests.orchestrator.test_trainer import _one_thread  # noqa: F401 (autouse fixture)

# 3 layers: pp 2 splits them 2 + 1 (uneven); gpt2 ties the head to the embedding
GPT3 = ModelSpec("tiny-gpt2-3", Family.GPT2, num_layers=3, hidden_size=64, num_heads=4,
                 vocab_size=256, max_seq_len=32)
LLAMA = ModelSpec("tiny-llama", Family.LLAMA, num_layers=2, hidden_size=64, num_heads=4,
                  num_kv_heads=2, ffn_hidden_size=128, vocab_size=256, max_seq_len=32,
                  tie_embeddings=False)


def _cfg(tmp_path: Path, job_id: str, **kw: object) -> RunConfig:
    """8 sequences in micro-batches of 2 (4 per step and dp rank), clipping on."""
    base = RunConfig(job_id=job_id, model=GPT3, global_batch=8, seq_len=32, total_steps=3,
                     micro_batch=2, grad_clip=0.5, checkpoint_dir=str(tmp_path),
                     checkpoint_every=100)
    return replace(base, **kw)


def _weights(tmp_path: Path, job: str, step: int) -> dict[str, torch.Tensor]:
    return ckpt.read(ckpt.step_path(tmp_path, job, step))["model"]


def _same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], atol: float
                  ) -> None:
    assert set(a) == set(b)
    for name, t in a.items():
        assert b[name].shape == t.shape, name
        assert torch.allclose(b[name], t, atol=atol), (name, float((b[name] - t).abs().max()))


def test_layout_puts_tp_innermost_and_stages_outermost() -> None:
    # tp 2 · dp 2 · pp 2: rank 5 = stage 1 · 4 + dp 0 · 2 + tp 1 (Megatron's tp-dp-pp)
    lay = Layout(5, 8, 2, 2, pp=2)
    assert (lay.tp_rank, lay.dp_rank, lay.pp_rank) == (1, 0, 1)
    assert lay.last_stage and not lay.first_stage
    assert lay.stage_peer(0) == 1 and lay.dp_peer(1) == 7
    assert Layout(2, 8, 2, 2, pp=2).dp_rank == 1


def test_stages_hold_the_layers_the_predictor_prices() -> None:
    # 5 layers on 2 stages: the first takes the remainder (3 + 2), as FRENZY.stage_split says
    assert stage_layer_range(5, 2, 0) == range(0, 3)
    assert stage_layer_range(5, 2, 1) == range(3, 5)
    assert [len(stage_layer_range(7, 4, i)) for i in range(4)] == \
        list(stage_layer_counts(7, 4, FRENZY.stage_split)) == [2, 2, 2, 1]
    last = ParallelTransformer(GPT3, Layout(1, 2, 1, 1, pp=2))
    names = {n for n, _ in last.named_parameters()}
    # the last stage: layer 2 under its global name, the final norm, the tied head's copy
    assert "layers.2.attn.q.weight" in names and "layers.0.attn.q.weight" not in names
    assert {"final_norm.weight", "embed.weight"} <= names and "pos.weight" not in names
    assert last.tied_copy


def test_two_stages_match_one_rank_with_tied_embeddings_and_uneven_split(tmp_path: Path
                                                                           ) -> None:
    one = train(_cfg(tmp_path, "one"), 0)
    two = run_local(_cfg(tmp_path, "two", pp=2))
    assert two[0].finished and all(r.losses == two[0].losses for r in two)
    assert two[0].losses == pytest.approx(one.losses, abs=1e-6)
    assert one.losses[-1] < one.losses[0]
    _same_weights(_weights(tmp_path, "one", 3), _weights(tmp_path, "two", 3), atol=1e-5)
    # the export reads the collected checkpoint: every weight, the tied one once
    files = export_hf(tmp_path, "two", tmp_path / "hf")
    assert any(f.name == "model.safetensors" for f in files)


@pytest.mark.parametrize("zero", [2, 3])
def test_pipeline_with_data_parallel_zero_matches_one_rank(tmp_path: Path, zero: int) -> None:
    # ZeRO-2 reduce-scatters in the backward's hooks (the tied embedding's chunk summed
    # between the stages), ZeRO-3 also gathers each layer of the stage around its passes
    one = train(_cfg(tmp_path, "one"), 0)
    four = run_local(_cfg(tmp_path, "pz", pp=2, dp=2, zero_stage=zero))
    assert all(r.losses == four[0].losses for r in four)
    assert four[0].losses == pytest.approx(one.losses, abs=1e-5)
    _same_weights(_weights(tmp_path, "one", 3), _weights(tmp_path, "pz", 3), atol=1e-5)


def test_pipeline_with_tensor_parallel_matches_one_rank(tmp_path: Path) -> None:
    one = train(_cfg(tmp_path, "one", model=LLAMA), 0)
    four = run_local(_cfg(tmp_path, "tpp", model=LLAMA, tp=2, pp=2))
    assert four[0].losses == pytest.approx(one.losses, abs=1e-5)
    _same_weights(_weights(tmp_path, "one", 3), _weights(tmp_path, "tpp", 3), atol=1e-4)


def test_checkpoints_resume_across_pipeline_depths(tmp_path: Path) -> None:
    solo = train(_cfg(tmp_path, "solo", total_steps=4), 0)
    # 2 steps at pp 2, then 2 at pp 1 ...
    run_local(_cfg(tmp_path, "a", pp=2, total_steps=2))
    down = train(_cfg(tmp_path, "a", total_steps=4), 0)
    # ... and 2 steps at pp 1, then 2 at pp 2
    train(_cfg(tmp_path, "b", total_steps=2), 0)
    up = run_local(_cfg(tmp_path, "b", pp=2, total_steps=4))
    assert down.first_step == 2 and up[0].first_step == 2
    assert down.losses == pytest.approx(solo.losses[2:], abs=1e-6)
    assert up[0].losses == pytest.approx(solo.losses[2:], abs=1e-6)
    want = _weights(tmp_path, "solo", 4)
    _same_weights(want, _weights(tmp_path, "a", 4), atol=1e-5)
    _same_weights(want, _weights(tmp_path, "b", 4), atol=1e-5)
