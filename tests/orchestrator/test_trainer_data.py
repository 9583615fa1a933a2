"""The trainer's data path: token shards and text read as fixed samples, sharded by dp rank,
resumed exactly from a checkpoint; the learning-rate schedule and gradient clipping."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from orchestrator.trainer.data import DataConfig, DataError, TokenData, summarize
from orchestrator.trainer.local import run_local
from orchestrator.trainer.loop import (
    Control,
    RunConfig,
    clip_grads,
    full_state,
    lr_at,
    train,
)
from orchestrator.trainer.parallel import Layout
from predictor.spec import Family, ModelSpec
from tests.orchestrator.corpus import train_tokenizer, write_bin_shards, write_text_corpus

pytest.importorskip("tokenizers")

TINY = ModelSpec("tiny-llama", Family.LLAMA, num_layers=2, hidden_size=32, num_heads=4,
                 num_kv_heads=2, ffn_hidden_size=64, vocab_size=320, max_seq_len=64,
                 tie_embeddings=False)


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


def test_bin_shards_read_across_boundaries_in_order(tmp_path: Path) -> None:
    stream = write_bin_shards(tmp_path / "d", (50, 30, 41), vocab=97)
    data = TokenData(DataConfig(kind="tokens", path=str(tmp_path / "d"), shuffle=False))
    assert data.num_tokens == 121
    assert np.array_equal(data.read(45, 40), stream[45:85])  # spans all three shards
    # seq_len 8: (121 - 1) // 8 = 15 samples; without shuffling position p is window p % 15.
    w = data.windows(position=16, count=2, seq_len=8, seed=0)
    assert w.tolist() == [stream[8:17].tolist(), stream[16:25].tolist()]


def test_every_epoch_visits_each_sample_once_in_a_new_order(tmp_path: Path) -> None:
    write_bin_shards(tmp_path / "d", (201,), vocab=1000)  # token i is i: windows identify
    data = TokenData(DataConfig(kind="tokens", path=str(tmp_path / "d")))
    first = [int(r[0]) // 10 for r in data.windows(0, 20, seq_len=10, seed=3)]
    second = [int(r[0]) // 10 for r in data.windows(20, 20, seq_len=10, seed=3)]
    assert sorted(first) == sorted(second) == list(range(20))
    assert first != second


def test_dp_ranks_read_disjoint_rows_of_the_same_global_batch(tmp_path: Path) -> None:
    write_bin_shards(tmp_path / "d", (500,), vocab=300)
    data = TokenData(DataConfig(kind="tokens", path=str(tmp_path / "d")))
    whole = data.batch(40, 8, dp=1, dp_rank=0, seq_len=16, seed=1)
    parts = [data.batch(40, 8, dp=2, dp_rank=r, seq_len=16, seed=1) for r in range(2)]
    assert torch.equal(torch.cat(parts), whole)


def test_npy_shards_and_uint32_bins_are_read(tmp_path: Path) -> None:
    arr = np.arange(100, 170, dtype=np.int32)
    np.save(tmp_path / "a.npy", arr)
    data = TokenData(DataConfig(kind="tokens", path=str(tmp_path / "a.npy")))
    assert data.read(0, 70).tolist() == arr.tolist()
    big = np.array([70_000, 5, 80_000], dtype=np.uint32)
    big.tofile(tmp_path / "b.bin")
    data32 = TokenData(DataConfig(kind="tokens", path=str(tmp_path / "b.bin"), dtype="uint32"))
    assert data32.read(0, 3).tolist() == [70_000, 5, 80_000]


def test_summary_counts_tokens_and_epochs(tmp_path: Path) -> None:
    write_bin_shards(tmp_path / "d", (1000, 1001), vocab=300)
    s = summarize(DataConfig(kind="tokens", path=str(tmp_path / "d")), seq_len=20,
                  global_batch=8, steps=50)
    # 2001 tokens -> (2001 - 1) // 20 = 100 samples; 50 steps x 8 = 400 samples = 4 epochs
    assert (s.tokens, s.samples, s.tokens_needed) == (2001, 100, 50 * 8 * 20)
    assert s.epochs == pytest.approx(4.0)
    assert "4.00 epochs" in s.note
    assert s.vocab_size == 300


def test_text_summary_counts_what_the_tokenizer_makes(tmp_path: Path) -> None:
    corpus = write_text_corpus(tmp_path / "c")
    tok_path = train_tokenizer(tmp_path / "tok")
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tok_path))
    eos = tok.token_to_id("<|endoftext|>")
    import json

    docs = [json.loads(line)["text"] for line in (corpus / "corpus.jsonl").read_text().split(
        "\n") if line] + [(corpus / "more.txt").read_text()]
    expected = sum(len(tok.encode(d, add_special_tokens=False).ids) + 1 for d in docs)
    s = summarize(DataConfig(kind="text", path=str(corpus), tokenizer=str(tok_path)),
                  seq_len=16, global_batch=4, steps=2)
    assert s.exact and s.tokens == expected
    data = TokenData(DataConfig(kind="text", path=str(corpus), tokenizer=str(tok_path)))
    assert data.num_tokens == expected
    assert int(data.read(0, expected)[-1]) == eos  # each document ends with end-of-text


@pytest.mark.parametrize(("cfg", "field", "words"), [
    (DataConfig(kind="tokens", path="/nonexistent/x.bin"), "data.path", "does not exist"),
    (DataConfig(kind="text", path="TEXT"), "data.tokenizer", "needs a tokenizer"),
    (DataConfig(kind="text", path="TEXT", tokenizer="/nonexistent"), "data.tokenizer",
     "no tokenizer.json"),
    (DataConfig(kind="tokens", path="SHORT"), "data.path", "make no sample"),
    (DataConfig(kind="tokens", path="ODD", dtype="uint32"), "data.dtype", "whole number"),
])
def test_bad_data_is_refused_naming_the_field(tmp_path: Path, cfg: DataConfig, field: str,
                                              words: str) -> None:
    write_text_corpus(tmp_path / "text")
    write_bin_shards(tmp_path / "short", (10,), vocab=50)
    (tmp_path / "odd.bin").write_bytes(b"\x00" * 6)
    where = {"TEXT": tmp_path / "text", "SHORT": tmp_path / "short", "ODD": tmp_path / "odd.bin"}
    cfg = replace(cfg, path=str(where.get(cfg.path, cfg.path)))
    with pytest.raises(DataError) as err:
        summarize(cfg, seq_len=32, global_batch=4, steps=10)
    assert err.value.field == field and words in err.value.reason


def test_lr_schedule_values_worked_by_hand() -> None:
    base = RunConfig(job_id="x", model=None, global_batch=1, seq_len=1, total_steps=6, lr=1.0,
                     warmup_steps=2, min_lr_ratio=0.1, lr_schedule="cosine")
    # warmup: (s+1)/2; then progress (s-2)/3 over steps 2..5, cosine from 1.0 to 0.1
    assert [lr_at(base, s) for s in (0, 1, 2)] == [0.5, 1.0, 1.0]
    assert lr_at(base, 3) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi / 3)))
    assert lr_at(base, 5) == pytest.approx(0.1)
    lin = replace(base, lr_schedule="linear")
    assert lr_at(lin, 3) == pytest.approx(1.0 - 0.9 / 3)
    assert lr_at(replace(base, lr_schedule="constant"), 5) == 1.0


def test_clip_grads_scales_to_the_global_norm() -> None:
    lin = torch.nn.Linear(2, 2)
    lin.weight.grad = torch.tensor([[3.0, 0.0], [0.0, 0.0]])
    lin.bias.grad = torch.tensor([0.0, 4.0])
    norm = clip_grads(lin, Layout(0, 1, 1, 1), max_norm=1.0)
    assert norm == pytest.approx(5.0)  # sqrt(3² + 4²)
    assert lin.weight.grad[0, 0].item() == pytest.approx(0.6, rel=1e-5)
    assert lin.bias.grad[1].item() == pytest.approx(0.8, rel=1e-5)


def _text_cfg(tmp_path: Path, job_id: str, **kw: object) -> RunConfig:
    corpus = tmp_path / "corpus"
    if not corpus.exists():
        write_text_corpus(corpus)
        train_tokenizer(tmp_path / "tok")
    base = RunConfig(job_id=job_id, model=TINY, global_batch=4, seq_len=16, total_steps=6,
                     dp=2, micro_batch=1, checkpoint_dir=str(tmp_path / "ckpt"),
                     checkpoint_every=100, lr=3e-3, lr_schedule="cosine", warmup_steps=2,
                     grad_clip=1.0, seed=7,
                     data=DataConfig(kind="text", path=str(corpus),
                                     tokenizer=str(tmp_path / "tok")))
    return replace(base, **kw)


def train_stop_after_3(cfg: RunConfig, rank: int):
    """``train`` with a stop requested once step 3 is reported (so it stops after step 4,
    as a preemption would: the stop is agreed at the next step's all-reduce)."""
    control = Control()

    def on_step(status: dict) -> None:
        if status.get("steps_done", 0) >= 3:
            control.stop.set()

    control.on_step = on_step
    return train(cfg, rank, control)


def test_text_job_stopped_and_resumed_matches_an_uninterrupted_run(tmp_path: Path) -> None:
    straight = train(_text_cfg(tmp_path, "straight", dp=1), 0)
    first = train_stop_after_3(_text_cfg(tmp_path, "resumed", dp=1), 0)
    assert first.stopped and first.checkpoint_step == 4
    second = train(_text_cfg(tmp_path, "resumed", dp=1), 0)
    assert second.first_step == 4 and second.finished
    assert first.losses + second.losses == straight.losses  # bit for bit
    a = full_state(_text_cfg(tmp_path, "straight"))
    b = full_state(_text_cfg(tmp_path, "resumed"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert straight.losses[-1] < straight.losses[0]


def test_two_ranks_resume_a_one_rank_checkpoint_on_the_same_batches(tmp_path: Path) -> None:
    first = train_stop_after_3(_text_cfg(tmp_path, "job", dp=1), 0)
    second = run_local(_text_cfg(tmp_path, "job", dp=2))  # each rank reads half the rows
    straight = train(_text_cfg(tmp_path, "straight", dp=1), 0)
    assert second[0].first_step == 4 and second[0].losses == second[1].losses
    assert first.losses + second[0].losses == pytest.approx(straight.losses, abs=1e-5)
