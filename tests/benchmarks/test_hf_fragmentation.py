"""The fragmentation benchmark's pure parts: the sample lengths it draws, the job it prices
(checked against the model ``transformers`` builds and the committed H200 measurement), and
the replay of its committed rows."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from benchmarks import hf_fragmentation as hf
from benchmarks.hf_trainer_cuda import GIB, hf_model
from predictor.memory_spec import parse_memory_spec

ROWS = Path(__file__).parents[2] / "docs" / "gpu_runs" / "hf_fragmentation_h200.jsonl"


def test_fixed_lengths_are_all_the_maximum() -> None:
    assert hf.lengths(5, 2048, variable=False) == [2048] * 5


def test_variable_lengths_follow_the_stated_spread_truncated_at_the_maximum() -> None:
    n = 4000
    drawn = hf.lengths(n, 2048, variable=True)
    assert drawn == hf.lengths(n, 2048, variable=True)  # seeded
    assert min(drawn) >= hf.LENGTH_MIN and max(drawn) == 2048
    # P(N(3234, 2548) >= 2048) = Phi((3234 - 2048) / 2548) = Phi(0.4655) = 0.679: the share
    # truncated to exactly the maximum; the binomial's standard deviation at n = 4000 is 0.0074
    share = sum(x == 2048 for x in drawn) / n
    expected = 0.5 * (1 + math.erf((3234 - 2048) / 2548 / math.sqrt(2)))
    assert abs(expected - 0.679) < 0.001
    assert abs(share - expected) < 0.03


def test_the_priced_model_is_the_one_transformers_builds() -> None:
    spec = hf.spec_for(2048)
    built = sum(p.numel() for p in hf_model(spec, "meta").parameters())
    assert built == parse_memory_spec(spec).model.num_params()
    # Qwen-1.8B's published size: 1.84 B parameters with untied embeddings
    assert abs(built / 1e9 - 1.84) < 0.01
    # the job loads it in bf16 (ms-swift's torch_dtype), as the benchmark builds it
    half = hf_model(spec, "meta", dtype=torch.bfloat16)
    assert {p.dtype for p in half.parameters()} == {torch.bfloat16}


@pytest.mark.skipif(not ROWS.exists(), reason="committed GPU rows absent")
def test_committed_rows_replay_and_the_reserve_covers_the_tensors() -> None:
    rows = hf.replay(str(ROWS))
    assert {r["variant"] for r in rows} >= {"var2048", "fix2048", "var2048x", "var4096"}
    for r in rows:
        m = r["measured"]
        assert m["reserved"] >= m["alloc"]  # the allocator's segments hold every tensor
        # the tensor peak of the pure-bf16 job, priced before it ran, within 5 % (H200)
        assert abs(r["predicted"]["tensors"] / m["alloc"] - 1) < 0.05
    summary = hf.as_json(rows)["variants"]
    assert summary["fix2048"]["lengths"] == "fixed"
    assert summary["var2048x"]["allocator"] == "expandable_segments:True"
    by = {r["variant"]: r["measured"] for r in rows}
    # expandable segments hold less in reserve than the default allocator, same tensors
    assert by["var2048x"]["reserved"] < by["var2048"]["reserved"]
    assert abs(by["var2048x"]["alloc"] - by["var2048"]["alloc"]) < 0.2 * GIB


def test_an_unknown_variant_is_refused_with_the_known_ones(capsys: pytest.CaptureFixture
                                                           ) -> None:
    with pytest.raises(SystemExit):
        hf.main(["--predict", "--variants", "var9999"])
    assert "var2048" in capsys.readouterr().err
