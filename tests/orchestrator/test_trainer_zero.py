"""ZeRO in the built-in trainer: the same losses as the unsharded run, states sharded over the
dp group, checkpoints that resume at another dp (and without ZeRO), and a clear refusal of a
stage the trainer cannot run."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from orchestrator.trainer import checkpoint as ckpt
from orchestrator.trainer.export import export_hf
from orchestrator.trainer.local import run_local
from orchestrator.trainer.loop import RunConfig, build_optimizer, train
from orchestrator.trainer.model import ParallelTransformer
from orchestrator.trainer.parallel import Layout
from orchestrator.trainer.zero import ZeroOptimizer
from predictor.runtimes import FRENZY
from predictor.spec import Precision, Recompute
from tests.orchestrator.test_trainer import TINY, _one_thread  # noqa: F401 (autouse fixture)
from tests.orchestrator.test_trainer import _cfg as _trainer_cfg


def _cfg(tmp_path: Path, job_id: str, **kw: object) -> RunConfig:
    """test_trainer's run of TINY, with gradient clipping on (ZeRO sums the norm over chunks)."""
    return _trainer_cfg(tmp_path, job_id, **{"grad_clip": 0.5, **kw})


def test_zero_1_and_2_give_the_unsharded_losses_and_hold_less(tmp_path: Path) -> None:
    z0 = run_local(_cfg(tmp_path, "z0", dp=2))
    z1 = run_local(_cfg(tmp_path, "z1", dp=2, zero_stage=1))
    z2 = run_local(_cfg(tmp_path, "z2", dp=2, zero_stage=2))
    assert z0[0].finished and z1[0].finished and z2[0].finished
    # Adam's update is elementwise: the chunks' updates are the whole tensor's
    assert z1[0].losses == pytest.approx(z0[0].losses, abs=1e-6)
    assert z2[0].losses == pytest.approx(z0[0].losses, abs=1e-6)
    assert z0[0].losses[-1] < z0[0].losses[0]
    # the same weights after three steps (clipping active: grad_clip=0.5; K's bias has a
    # zero gradient up to rounding, which Adam scales to ~1e-6 steps in any summation order)
    w0 = ckpt.read(ckpt.step_path(tmp_path, "z0", 3))
    for job in ("z1", "z2"):
        w = ckpt.read(ckpt.step_path(tmp_path, job, 3))
        for name, t in w0["model"].items():
            assert torch.allclose(w["model"][name], t, atol=1e-5), (job, name)
            for k, v in w0["optim"][name].items():  # states gathered back to full shape
                assert torch.allclose(torch.as_tensor(w["optim"][name][k]),
                                      torch.as_tensor(v), atol=1e-5), (job, name, k)
    # each ZeRO stage holds less than the last: Adam's m, v are halved (stage 1), the
    # gradients too (stage 2)
    peaks = [r[0].peak_tensors_bytes for r in (z0, z1, z2)]
    assert peaks[0] > peaks[1] > peaks[2]


def test_zero_2_with_tensor_parallel_and_fp16_matches_one_rank(tmp_path: Path) -> None:
    # 257 rows: tp 2 splits the embedding and head 129 + 128 (vocab-parallel), then ZeRO-2
    # chunks each tp rank's shard over dp; the checkpoint gathers both back
    odd = replace(TINY, vocab_size=257)
    one = train(_cfg(tmp_path, "a", model=odd, precision="fp16", total_steps=2), 0)
    z2 = run_local(_cfg(tmp_path, "b", model=odd, tp=2, dp=2, precision="fp16",
                        total_steps=2, zero_stage=2))
    assert z2[0].losses == pytest.approx(one.losses, abs=1e-4)
    assert all(r.losses == z2[0].losses for r in z2)
    a = ckpt.read(ckpt.step_path(tmp_path, "b", 2))
    b = ckpt.read(ckpt.step_path(tmp_path, "a", 2))
    assert a["model"]["embed.weight"].shape == (257, 64)  # no padding row
    # Adam's moments, gathered from the dp chunks of each tp shard, are the one rank's up to
    # fp16 rounding in another summation order (5 % on q's small bias gradient; K's bias has
    # a zero gradient up to rounding, so no match); the weights are not compared: at fp16 an
    # element whose gradient is rounding noise moves by +-lr in either direction
    for name, t in b["model"].items():
        assert a["model"][name].shape == t.shape, name
        if name.endswith("attn.k.bias"):
            continue
        for k in ("exp_avg", "exp_avg_sq"):
            want = b["optim"][name][k]
            err = float((a["optim"][name][k] - want).norm() / want.norm())
            assert err < 0.1, (name, k, err)  # a misplaced row or chunk: order 1


def train_nccl_style(cfg: RunConfig, rank: int) -> object:
    """``train`` with ZeRO's NCCL collectives (reduce-scatter, in-place all-gather, padded
    copies where dp does not divide a tensor) run on gloo, which implements them too."""
    from orchestrator.trainer import zero

    zero._in_place_only = lambda group: False
    return train(cfg, rank)


def _same_weights(got: torch.Tensor, want: torch.Tensor, name: str) -> None:
    """``got`` is ``want`` but for summation-order rounding: a misplaced chunk or row moves
    many elements by about the learning rate (3e-3); rounding moves only the odd element
    whose gradient is itself at the level of rounding noise, which Adam's normalisation
    turns into a step of its own (seen: 1 element of 16,384 by 1.1e-5 and 1.7e-5 on one
    machine, none on another)."""
    diff = (got - want).abs()
    assert float(diff.max()) < 1e-4, (name, float(diff.max()))
    assert int((diff > 1e-5).sum()) <= max(1, diff.numel() // 1000), name


def test_zero_2_nccl_collectives_at_dp_3_match_one_rank(tmp_path: Path) -> None:
    # dp = 3 divides no tensor of TINY (sizes are multiples of 64): every chunk is padded
    one = train(_cfg(tmp_path, "one", global_batch=6, total_steps=2), 0)
    z2 = run_local(_cfg(tmp_path, "z2", global_batch=6, dp=3, zero_stage=2, total_steps=2),
                   fn=train_nccl_style)
    assert z2[0].losses == pytest.approx(one.losses, abs=1e-5)
    a = ckpt.read(ckpt.step_path(tmp_path, "z2", 2))
    b = ckpt.read(ckpt.step_path(tmp_path, "one", 2))
    for name, t in b["model"].items():
        _same_weights(a["model"][name], t, name)


def test_zero_checkpoint_resumes_at_another_dp_and_exports(tmp_path: Path) -> None:
    # 2 steps at dp=2 with ZeRO-1, then 2 more at dp=4 with ZeRO-2, and at dp=1 unsharded:
    # both continue the uninterrupted unsharded run
    run_local(_cfg(tmp_path, "job", dp=2, zero_stage=1, total_steps=2))
    shutil.copytree(ckpt.job_dir(tmp_path, "job"), ckpt.job_dir(tmp_path, "solo"))
    wide = run_local(_cfg(tmp_path, "job", dp=4, zero_stage=2, total_steps=4))
    solo = train(_cfg(tmp_path, "solo", total_steps=4), 0)
    straight = train(_cfg(tmp_path, "straight", total_steps=4), 0)
    assert wide[0].first_step == 2 and solo.first_step == 2
    assert wide[0].losses == pytest.approx(straight.losses[2:], abs=1e-5)
    assert solo.losses == pytest.approx(straight.losses[2:], abs=1e-5)
    a = ckpt.read(ckpt.step_path(tmp_path, "job", 4))
    b = ckpt.read(ckpt.step_path(tmp_path, "straight", 4))
    assert a["dp"] == 4
    for name, t in b["model"].items():
        _same_weights(a["model"][name], t, name)
        assert a["optim"][name]["exp_avg"].shape == t.shape
    files = export_hf(tmp_path, "job", tmp_path / "hf")
    assert any(f.name.endswith(".safetensors") for f in map(Path, files))


def test_chunks_are_ceil_n_over_dp_and_the_states_only_the_chunk() -> None:
    # rank 1 of dp=4 without a process group: the layout alone decides the chunks
    layout = Layout(rank=1, world_size=4, tp=1, dp=4)
    model = ParallelTransformer(TINY, layout)
    opt = build_optimizer(_cfg(Path("."), "x", dp=4, zero_stage=1), list(model.parameters()),
                          layout)
    assert isinstance(opt, ZeroOptimizer)
    emb = model.embed.weight  # 256·64 = 16384 elements: chunk 4096, rank 1 owns [4096, 8192)
    chunk = opt.chunks[emb]
    assert chunk.numel() == 4096 and chunk.data_ptr() == emb.data_ptr() + 4096 * 4
    # weight decay on matrices' chunks only
    decays = {g["weight_decay"] for g in opt.param_groups}
    assert decays == {0.01, 0.0}
    assert sum(v.numel() for v in opt.chunks.values()) == sum(
        -(-p.numel() // 4) for p in model.parameters())


def test_zero_3_gives_the_unsharded_run_and_keeps_only_chunks_of_the_layers(
        tmp_path: Path) -> None:
    # bf16 and fp32 (where the matmuls keep a view of the forward's gathered weights), one
    # and two micro-batches per step: the dp = 2 ZeRO-3 run is the one rank's
    for precision, micro in ((Precision.BF16, 2), (Precision.FP32, 4)):
        one = train(_cfg(tmp_path, f"one-{precision}", precision=precision,
                         micro_batch=micro), 0)
        z3 = run_local(_cfg(tmp_path, f"z3-{precision}", dp=2, zero_stage=3,
                            precision=precision, micro_batch=micro))
        assert z3[0].losses == pytest.approx(one.losses, abs=1e-4)
        assert z3[0].losses == z3[1].losses
        a = ckpt.read(ckpt.step_path(tmp_path, f"z3-{precision}", 3))
        b = ckpt.read(ckpt.step_path(tmp_path, f"one-{precision}", 3))
        for name, t in b["model"].items():  # the layers' weights gathered back from chunks
            assert a["model"][name].shape == t.shape, name
            if name.endswith("attn.k.bias"):  # a zero gradient up to rounding (see above)
                continue
            _same_weights(a["model"][name], t, f"{precision} {name}")
            assert torch.allclose(a["optim"][name]["exp_avg"], b["optim"][name]["exp_avg"],
                                  atol=1e-6), (precision, name)
    # rank 1 of dp = 2 without a process group: after shard_blocks a layer's weights are
    # placeholders of their shape (one shared element), the embedding whole, the chunks
    # ceil(n/2) and their own tensors
    layout = Layout(rank=1, world_size=2, tp=1, dp=2)
    model = ParallelTransformer(TINY, layout)
    opt = build_optimizer(_cfg(tmp_path, "x", dp=2, zero_stage=3), list(model.parameters()),
                          layout, model.layers)
    assert isinstance(opt, ZeroOptimizer)
    up = model.layers[0].mlp.up.weight  # 256 x 64 = 16384: rank 1 owns [8192, 16384)
    want = up.detach().view(-1)[8192:].clone()
    opt.shard_blocks(model)
    assert up.shape == (256, 64) and up.untyped_storage().nbytes() == 4
    assert torch.equal(opt.chunks[up], want) and opt.chunks[up].untyped_storage().nbytes() == (
        8192 * 4)
    assert model.embed.weight.untyped_storage().nbytes() == 256 * 64 * 4
    opt.gather(model.layers[0])  # no group: the other rank's half is not filled in
    assert up.untyped_storage().nbytes() == 256 * 64 * 4
    assert torch.equal(up.detach().view(-1)[8192:], want)
    opt.release(model.layers[0])
    assert up.untyped_storage().nbytes() == 4


def test_zero_3_with_tensor_parallel_full_recompute_and_nccl_collectives(
        tmp_path: Path) -> None:
    # tp 2 x dp 2, full recomputation (the replay runs between the gather and the release),
    # a 257-row vocabulary (the root whole, vocab-parallel); and dp = 3 with the NCCL path
    # (all-gather into a padded buffer: no tensor of TINY divides by 3)
    odd = replace(TINY, vocab_size=257)
    one = train(_cfg(tmp_path, "one", model=odd, recompute=Recompute.FULL, total_steps=2), 0)
    z3 = run_local(_cfg(tmp_path, "z3", model=odd, tp=2, dp=2, zero_stage=3,
                        recompute=Recompute.FULL, total_steps=2))
    assert z3[0].losses == pytest.approx(one.losses, abs=1e-5)
    # the weights: those of ZeRO-2 on the same layout, bit for bit (against the one rank,
    # tp's summation order moves an element whose gradient is rounding noise by ~lr)
    z2 = run_local(_cfg(tmp_path, "z2", model=odd, tp=2, dp=2, zero_stage=2,
                        recompute=Recompute.FULL, total_steps=2))
    assert z2[0].losses == z3[0].losses
    a = ckpt.read(ckpt.step_path(tmp_path, "z3", 2))
    b = ckpt.read(ckpt.step_path(tmp_path, "z2", 2))
    for name, t in b["model"].items():
        assert torch.equal(a["model"][name], t), name
    six = train(_cfg(tmp_path, "six", global_batch=6, total_steps=2), 0)
    z3n = run_local(_cfg(tmp_path, "z3n", global_batch=6, dp=3, zero_stage=3, total_steps=2),
                    fn=train_nccl_style)
    assert z3n[0].losses == pytest.approx(six.losses, abs=1e-5)


def test_zero_3_checkpoint_resumes_at_dp_1_and_without_zero_and_exports(
        tmp_path: Path) -> None:
    # 2 steps at dp = 2 under ZeRO-3, then 2 more at dp = 1 (no sharding) and at dp = 2
    # ZeRO-0: both continue the uninterrupted run; the export has the full weights
    run_local(_cfg(tmp_path, "job", dp=2, zero_stage=3, total_steps=2))
    shutil.copytree(ckpt.job_dir(tmp_path, "job"), ckpt.job_dir(tmp_path, "plain"))
    files = export_hf(tmp_path, "job", tmp_path / "hf")
    solo = train(_cfg(tmp_path, "job", total_steps=4), 0)
    plain = run_local(_cfg(tmp_path, "plain", dp=2, total_steps=4))
    straight = train(_cfg(tmp_path, "straight", total_steps=4), 0)
    assert solo.first_step == 2 and plain[0].first_step == 2
    assert solo.losses == pytest.approx(straight.losses[2:], abs=1e-5)
    assert plain[0].losses == pytest.approx(straight.losses[2:], abs=1e-5)
    from safetensors.torch import load_file

    st = [f for f in map(Path, files) if f.name.endswith(".safetensors")]
    assert st
    exported = {}
    for f in st:
        exported.update(load_file(f))
    two = ckpt.read(ckpt.step_path(tmp_path, "plain", 2))  # the dp = 2 ZeRO-3 file, copied
    up = two["model"]["layers.0.mlp.up.weight"]
    assert up.shape == (256, 64)
    # GPT-2's Conv1D stores the weight transposed
    assert any(torch.equal(t, up) or torch.equal(t.t(), up) for t in exported.values())


def test_zero_3_is_offered_and_an_unknown_stage_refused(tmp_path: Path) -> None:
    assert FRENZY.zero_stages == (0, 1, 2, 3) and FRENZY.unsupported(1, 3) is None
    with pytest.raises(ValueError, match="zero_stage=4"):
        train(_cfg(tmp_path, "z4", zero_stage=4), 0)
