"""The vocab-parallel embedding, head and cross entropy of the built-in trainer: the loss
and its gradient against values worked out by hand, tp = 2 and 4 train like tp = 1 for every
head the trainer has (gpt2 tied, llama untied, BERT's output bias), and a checkpoint holds
the whole vocabulary whatever tp wrote it, so it resumes at any other tp and exports."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from orchestrator.trainer import checkpoint as ckpt
from orchestrator.trainer.local import run_local
from orchestrator.trainer.loop import RunConfig, full_state, init_distributed, train
from orchestrator.trainer.model import ParallelTransformer, shard
from orchestrator.trainer.parallel import (
    Layout,
    build_layout,
    split_sizes,
    vocab_parallel_cross_entropy,
    vocab_range,
)
from predictor.spec import Family, ModelSpec, Precision
from tests.orchestrator.test_trainer import reload_and_save

# 250 rows: tp = 4 splits them 63, 63, 62, 62 (no padding row anywhere)
V = 250
SPECS = {
    "gpt2": ModelSpec("t-gpt2", Family.GPT2, 2, 64, 4, vocab_size=V, max_seq_len=32),
    "llama": ModelSpec("t-llama", Family.LLAMA, 2, 64, 4, vocab_size=V, max_seq_len=32,
                       num_kv_heads=4, ffn_hidden_size=128, tie_embeddings=False),
    "bert": ModelSpec("t-bert", Family.BERT, 2, 64, 4, vocab_size=V, max_seq_len=32,
                      type_vocab_size=2),
}


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


def _cfg(tmp_path: Path, job_id: str, spec: ModelSpec, **kw: object) -> RunConfig:
    base = RunConfig(job_id=job_id, model=spec, global_batch=8, seq_len=32, total_steps=3,
                     micro_batch=2, checkpoint_dir=str(tmp_path), checkpoint_every=100,
                     grad_clip=1.0)
    return replace(base, **kw)


def test_vocabulary_rows_split_unevenly_without_padding() -> None:
    assert split_sizes(250, 4) == [63, 63, 62, 62]
    assert split_sizes(256, 4) == [64] * 4
    assert [vocab_range(10, Layout(r, 4, 4, 1)) for r in range(4)] == [
        (0, 3), (3, 6), (6, 8), (8, 10)]
    full = torch.arange(10.0)
    assert [shard(full, 0, Layout(r, 4, 4, 1)).tolist() for r in range(4)] == [
        [0.0, 1.0, 2.0], [3.0, 4.0, 5.0], [6.0, 7.0], [8.0, 9.0]]


def _cross_entropy_rank(cfg: RunConfig, rank: int) -> tuple[float, list[list[float]]]:
    """Rank ``rank`` of tp = 2 over V = 3 (rows 0-1 and 2): the loss and this shard's
    gradient of two tokens' logits ln(1, 2, 3) with targets 2 and ignored."""
    init_distributed(cfg, rank, torch.device("cpu"))
    layout = build_layout(rank, 2, 2, 1)
    full = torch.tensor([[0.0, math.log(2.0), math.log(3.0)]] * 2)
    start, stop = vocab_range(3, layout)
    logits = full[:, start:stop].clone().requires_grad_()
    loss = vocab_parallel_cross_entropy(logits, torch.tensor([2, -100]), start, layout)
    loss.backward()
    torch.distributed.destroy_process_group()
    return float(loss.detach()), [x for row in logits.grad.tolist() for x in row]


def test_vocab_parallel_cross_entropy_matches_the_hand_values(tmp_path: Path) -> None:
    # softmax of ln(1, 2, 3) is (1, 2, 3)/6: the loss of target 2 is -ln(3/6) = ln 2 (mean
    # over the one token not ignored); its gradient softmax - one-hot = (1/6, 1/3, -1/2),
    # the ignored token's zero
    cfg = _cfg(tmp_path, "ce", SPECS["gpt2"], tp=2)
    (l0, g0), (l1, g1) = run_local(cfg, fn=_cross_entropy_rank)
    assert l0 == pytest.approx(math.log(2.0), abs=1e-6)
    assert l1 == l0
    assert g0 == pytest.approx([1 / 6, 1 / 3, 0.0, 0.0], abs=1e-6)  # rows 0-1, both tokens
    assert g1 == pytest.approx([-0.5, 0.0], abs=1e-6)  # row 2


def _vocab_shapes(state: dict[str, torch.Tensor]) -> dict[str, tuple[int, ...]]:
    return {n: tuple(t.shape) for n, t in state.items()
            if n in ("embed.weight", "head.weight", "out_bias")}


def test_tp4_with_an_uneven_vocabulary_trains_like_one_rank(tmp_path: Path) -> None:
    # gpt2: the head is the embedding (tied), sharded once for both
    spec = SPECS["gpt2"]
    one = train(_cfg(tmp_path, "one", spec), 0)
    tp4 = run_local(_cfg(tmp_path, "tp4", spec, tp=4))
    assert tp4[0].losses == pytest.approx(one.losses, abs=1e-5)
    assert all(r.losses == tp4[0].losses for r in tp4)
    a, b = full_state(_cfg(tmp_path, "one", spec)), full_state(_cfg(tmp_path, "tp4", spec))
    assert _vocab_shapes(b) == {"embed.weight": (V, 64)}  # whole, no padding row
    for name in a:
        assert torch.allclose(a[name], b[name], atol=1e-4), name
    # the Hugging Face export of the tp = 4 checkpoint loads with the trainer's logits
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("safetensors")
    from orchestrator.trainer.export import export_hf

    export_hf(tmp_path, "tp4", tmp_path / "hf")
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    assert hf.config.vocab_size == V
    tokens = torch.randint(0, V, (2, 12), generator=torch.Generator().manual_seed(0))
    ours = ParallelTransformer(spec, Layout(0, 1, 1, 1))
    ours.load_state_dict(b, strict=True)
    with torch.no_grad():
        assert (hf(input_ids=tokens).logits - ours.eval()(tokens)).abs().max() < 1e-5


@pytest.mark.parametrize(("family", "precision", "tol"), [("bert", Precision.FP32, 1e-5),
                                                          ("llama", Precision.BF16, 2e-3)])
def test_tp2_trains_like_one_rank(tmp_path: Path, family: str, precision: Precision,
                                  tol: float) -> None:
    # 251 rows: 126 + 125. BERT's output bias is split with the rows; llama's untied head
    spec = replace(SPECS[family], vocab_size=251)
    one = train(_cfg(tmp_path, "one", spec, precision=precision), 0)
    tp2 = run_local(_cfg(tmp_path, "tp2", spec, precision=precision, tp=2))
    assert tp2[0].losses == pytest.approx(one.losses, abs=tol)
    want = {"embed.weight": (251, 64)}
    want.update({"out_bias": (251,)} if family == "bert" else {"head.weight": (251, 64)})
    assert _vocab_shapes(full_state(_cfg(tmp_path, "tp2", spec))) == want


def test_checkpoint_of_tp2_reshards_to_tp4_and_resumes_at_tp1(tmp_path: Path) -> None:
    # 251 rows: 126 + 125 at tp = 2, 63 + 63 + 63 + 62 at tp = 4
    spec = replace(SPECS["llama"], vocab_size=251)
    run_local(_cfg(tmp_path, "job", spec, tp=2, total_steps=2))
    assert run_local(_cfg(tmp_path, "job", spec, tp=4), fn=reload_and_save) == [2] * 4
    a = torch.load(ckpt.step_path(tmp_path, "job", 2), weights_only=True)
    b = torch.load(ckpt.step_path(tmp_path, "job-re", 2), weights_only=True)
    assert a["tp"] == 2 and b["tp"] == 4
    assert a["model"]["head.weight"].shape == (251, 64)
    for name in a["model"]:
        assert torch.equal(a["model"][name], b["model"][name]), name
        for k, v in a["optim"][name].items():
            assert torch.equal(torch.as_tensor(v), torch.as_tensor(b["optim"][name][k])), name
    # and one rank resumes it where a run of one rank would be
    resumed = train(_cfg(tmp_path, "job", spec, total_steps=3), 0)
    solo = train(_cfg(tmp_path, "solo", spec, total_steps=3), 0)
    assert resumed.first_step == 2 and len(resumed.losses) == 1
    assert resumed.losses[0] == pytest.approx(solo.losses[-1], abs=1e-5)
