"""The built-in trainer without Ray: tensor parallelism is exact, the loss falls, and a
checkpoint saved at tp=2·dp=1 resumes at tp=1·dp=2 with the same weights (elastic resize)."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from orchestrator.trainer import checkpoint as ckpt
from orchestrator.trainer.local import run_local
from orchestrator.trainer.loop import (
    RunConfig,
    full_state,
    init_distributed,
    numbered_losses,
    pick_device,
    train,
)
from orchestrator.trainer.model import ParallelTransformer, init_canonical
from orchestrator.trainer.parallel import build_layout
from predictor.spec import Family, ModelSpec

TINY = ModelSpec("tiny-gpt2", Family.GPT2, num_layers=2, hidden_size=64, num_heads=4,
                 vocab_size=256, max_seq_len=32)


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


def _cfg(tmp_path: Path, job_id: str, **kw: object) -> RunConfig:
    base = RunConfig(job_id=job_id, model=TINY, global_batch=8, seq_len=32, total_steps=3,
                     micro_batch=2, checkpoint_dir=str(tmp_path), checkpoint_every=100)
    return replace(base, **kw)


def reload_and_save(cfg: RunConfig, rank: int) -> int:
    """Load ``cfg.job_id``'s newest checkpoint at cfg's layout, save it as job ``<id>-re``."""
    assert cfg.model is not None
    init_distributed(cfg, rank, pick_device())
    layout = build_layout(rank, cfg.world_size, cfg.tp, cfg.dp)
    model = ParallelTransformer(cfg.model, layout)
    init_canonical(model, layout, seed=123)  # different init: the load must overwrite it
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    step = ckpt.load(cfg.checkpoint_dir, cfg.job_id, model, opt, layout)
    ckpt.save(cfg.checkpoint_dir, f"{cfg.job_id}-re", step, model, opt, layout)
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    return step


def test_tensor_parallel_matches_one_rank_and_loss_falls(tmp_path: Path) -> None:
    single = train(_cfg(tmp_path, "one"), 0)
    tp2 = run_local(_cfg(tmp_path, "tp2", tp=2))
    assert single.finished and single.steps_done == 3
    assert tp2[0].losses == pytest.approx(single.losses, abs=1e-4)
    assert tp2[1].losses == tp2[0].losses  # every rank reports the same global loss
    assert single.losses[-1] < single.losses[0] - 0.1


def test_checkpoint_saved_at_tp2_resumes_at_dp2_with_same_weights(tmp_path: Path) -> None:
    saved = run_local(_cfg(tmp_path, "job", tp=2, total_steps=2))
    assert saved[0].checkpoint_step == 2
    # Reshard: load at tp=1·dp=2 and write it back; every tensor must be identical.
    steps = run_local(_cfg(tmp_path, "job", tp=1, dp=2), fn=reload_and_save)
    assert steps == [2, 2]
    before = ckpt.job_dir(tmp_path, "job") / "step-00000002.pt"
    after = ckpt.job_dir(tmp_path, "job-re") / "step-00000002.pt"
    a = torch.load(before, weights_only=True)
    b = torch.load(after, weights_only=True)
    assert a["tp"] == 2 and b["dp"] == 2
    assert set(a["model"]) == set(b["model"])
    for name in a["model"]:
        assert torch.equal(a["model"][name], b["model"][name]), name
        for k, v in a["optim"][name].items():
            assert torch.equal(torch.as_tensor(v), torch.as_tensor(b["optim"][name][k])), name
    # And training continues identically on the new layout and on one rank.
    shutil.copytree(ckpt.job_dir(tmp_path, "job"), ckpt.job_dir(tmp_path, "solo"))
    resumed = run_local(_cfg(tmp_path, "job", tp=1, dp=2, total_steps=4))
    solo = train(_cfg(tmp_path, "solo", total_steps=4), 0)
    assert resumed[0].first_step == 2 and solo.first_step == 2
    assert resumed[0].losses == pytest.approx(solo.losses, abs=1e-4)
    for name, t in full_state(_cfg(tmp_path, "job")).items():
        assert torch.allclose(t, full_state(_cfg(tmp_path, "solo"))[name], atol=1e-5), name


@pytest.mark.parametrize("family", ["llama", "qwen3", "gpt_neox", "bert"])
def test_other_families_train_with_recompute_and_bf16(tmp_path: Path, family: str) -> None:
    spec = ModelSpec("t", family, 2, 64, 4, vocab_size=256, max_seq_len=32, num_kv_heads=2,
                     ffn_hidden_size=128)
    out = train(_cfg(tmp_path, family, model=spec, recompute="full", precision="bf16"), 0)
    assert out.finished and all(torch.isfinite(torch.tensor(out.losses)))
    assert ckpt.latest_step(tmp_path, family) == 3


QWEN3 = ModelSpec("tiny-qwen3", Family.QWEN3, num_layers=2, hidden_size=64, num_heads=4,
                  vocab_size=256, max_seq_len=32, num_kv_heads=2, ffn_hidden_size=128,
                  tie_embeddings=True, explicit_head_dim=32)


def test_wide_heads_with_qk_norm_train_the_same_at_tp2(tmp_path: Path) -> None:
    """Qwen3's layout with heads of 32 over hidden 64 (Q and the attention output 4 x 32 =
    128 wide, K and V 2 x 32): tp = 2 gives each rank two query heads and one K/V head, which
    it normalises with the replicated q_norm / k_norm weights; their gradients are summed
    over the tp group, so both layouts train the same weights. The loss falls."""
    single = train(_cfg(tmp_path, "q1", model=QWEN3, total_steps=4), 0)
    tp2 = run_local(_cfg(tmp_path, "q2", model=QWEN3, tp=2, total_steps=4))
    assert single.finished and tp2[0].losses == pytest.approx(single.losses, abs=1e-4)
    assert single.losses[-1] < single.losses[0] - 0.1
    one = full_state(_cfg(tmp_path, "q1", model=QWEN3))
    two = full_state(_cfg(tmp_path, "q2", model=QWEN3, tp=2))
    assert tuple(one["layers.0.attn.q.weight"].shape) == (4 * 32, 64)
    assert tuple(one["layers.0.attn.k.weight"].shape) == (2 * 32, 64)
    assert tuple(one["layers.0.attn.o.weight"].shape) == (64, 4 * 32)
    for name in ("layers.0.attn.q_norm.weight", "layers.1.attn.k_norm.weight"):
        assert one[name].shape == (32,)
        assert not torch.allclose(one[name], torch.ones(32))  # trained (no weight decay)
        assert torch.allclose(one[name], two[name], atol=1e-5), name


def test_more_pipeline_stages_than_layers_are_refused_with_a_reason(tmp_path: Path) -> None:
    # TINY has 2 layers: a third stage would hold none (refused before any rendezvous)
    with pytest.raises(ValueError, match="pp=3 exceeds num_layers=2"):
        train(_cfg(tmp_path, "pp", pp=3), 0)


def test_numbered_losses_pairs_each_loss_with_its_step() -> None:
    # a launch resumed from step 10 made steps 11, 12, 13
    assert numbered_losses([0.5, 0.4, 0.3], 13) == ((11, 0.5), (12, 0.4), (13, 0.3))
    assert numbered_losses([0.5, 0.4, 0.3], 13, last=2) == ((12, 0.4), (13, 0.3))
    assert numbered_losses([], 13) == ()


def _world_groups(cfg: RunConfig, rank: int) -> tuple[bool, bool]:
    """Whether rank ``rank``'s tp and dp groups are the default group itself."""
    init_distributed(cfg, rank, torch.device("cpu"))
    layout = build_layout(rank, cfg.world_size, cfg.tp, cfg.dp)
    world = torch.distributed.group.WORLD
    out = (layout.tp_group is world, layout.dp_group is world)
    torch.distributed.destroy_process_group()
    return out


def test_a_group_of_every_rank_is_the_default_group(tmp_path: Path) -> None:
    # a second group of the same ranks would be a second NCCL communicator (its buffers on
    # every GPU); a group of fewer ranks is its own
    assert run_local(_cfg(tmp_path, "dp", tp=1, dp=2), fn=_world_groups) == [(False, True)] * 2
    assert run_local(_cfg(tmp_path, "tp", tp=2, dp=1), fn=_world_groups) == [(True, False)] * 2


def test_a_resumed_optimizer_keeps_every_state_tensor_on_the_parameters_device(
        tmp_path: Path) -> None:
    # On a GPU the fused optimizers keep each parameter's step count on its device and
    # refuse a CPU one (found resuming on an H200: "state_steps is on cpu"). Here the
    # checkpoint is CPU's and the resumed model lives on the meta device, which stands in
    # for another device: every state tensor, the 0-d step included, must follow it.
    from orchestrator.trainer.loop import train

    cfg = _cfg(tmp_path, "dev", total_steps=1, checkpoint_every=1)
    train(cfg, 0)
    layout = build_layout(0, 1, 1, 1)
    with torch.device("meta"):
        model = ParallelTransformer(TINY, layout)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    assert ckpt.load(cfg.checkpoint_dir, cfg.job_id, model, opt, layout) == 1
    states = [opt.state[p] for p in model.parameters()]
    assert states and all("step" in s and s["step"].dim() == 0 for s in states)
    assert {v.device.type for s in states for v in s.values() if isinstance(v, torch.Tensor)} \
        == {"meta"}


def test_an_mlp_activation_the_trainer_does_not_run_is_refused_by_name(tmp_path: Path) -> None:
    # the predictor prices a ReLU MLP (OPT's) with one f-wide tensor kept, GeLU with two: a
    # ReLU spec trained as GeLU would hold more than it was priced for
    from orchestrator.trainer.model import check_supported

    with pytest.raises(ValueError, match="activation=relu: the built-in trainer runs the gpt2 MLP"):
        check_supported(replace(TINY, activation="relu"), tp=1)
    check_supported(replace(TINY, activation="gelu"), tp=1)  # its own: fine
