"""The real-GPU rows as specs, and the leave-one-source-out calibration on made-up rows."""

from __future__ import annotations

import pytest

from benchmarks import real_memory
from benchmarks.real_memory import Prediction, RealRow, fit_slack, margin_from, stats
from predictor.memory_spec import estimate_request, parse_memory_spec
from predictor.overhead import NonTensorModel

SPEC = {"model": "gpt2", "global_batch": 4, "seq_len": 256, "micro_batch": 4,
        "runtime": "hf-trainer", "gpu": "V100-16G"}


def _row(source: str, quantity: str, measured: int) -> RealRow:
    return RealRow(source, f"{source}:1", dict(SPEC), quantity, measured)


def test_fit_slack_recovers_a_known_fraction() -> None:
    base = NonTensorModel(workspace_bytes=64 << 20)
    mem = estimate_request(parse_memory_spec(SPEC), base)
    # reserved = tensors · 1.10; device = tensors · 1.10 + context (1343 MiB on the V100)
    rows = [_row("a", "reserved", int(mem.tensors * 1.10)),
            _row("b", "device", int(mem.tensors * 1.10) + (1343 << 20)),
            _row("c", "tensors", 1)]  # allocated rows carry no slack information
    assert fit_slack(rows, base) == pytest.approx(0.10, abs=1e-6)


def test_margin_covers_the_quantile_of_under_predictions() -> None:
    rows = [_row("a", "tensors", 100) for _ in range(20)]
    # 19 rows predicted exactly, one under by 20 %: need 1 − 80/100 = 0.2 for that one
    preds = [Prediction(r, 100, 100, NonTensorModel()) for r in rows[:19]]
    preds.append(Prediction(rows[19], 80, 80, NonTensorModel()))
    assert margin_from(preds, 0.95) == 0.2  # the 20th of 20 sorted needs
    assert margin_from(preds, 0.90) == 0.0
    s = stats([p.err_pct for p in preds])
    assert s["n"] == 20 and s["under_5pct"] == 1 and s["mape"] == pytest.approx(1.0)


def test_public_rows_load_as_specs() -> None:
    try:
        rows = real_memory.load_rows()
    except FileNotFoundError:
        pytest.skip("shared real_memory data not present")
    usable = [r for r in rows if not r.skip]
    assert len({r.source for r in usable}) >= 3 and len(usable) >= 40
    # every CSV row is accounted for: 313 shared, 10 in the repository (torchtitan)
    assert sum(r.duplicates for r in rows if r.source != "torchtitan") == 313
    assert sum(r.duplicates for r in rows if r.source == "torchtitan") == 10
    for r in usable:
        parse_memory_spec(r.spec)  # each row is a valid `frenzy memory` spec
    seven_b = [r for r in usable if "megatron-7b" in r.tags]
    assert seven_b and all(r.spec["stage"] == "last" for r in seven_b)


def test_rows_tagged_flags_fit_no_constant() -> None:
    base = NonTensorModel(workspace_bytes=64 << 20)
    mem = estimate_request(parse_memory_spec(SPEC), base)
    flagged = RealRow("b", "b:1", dict(SPEC), "device", mem.tensors * 3,
                      tags=(real_memory.UNCALIBRATED,))
    rows = [_row("a", "reserved", int(mem.tensors * 1.10)), flagged]
    assert fit_slack(rows, base) == pytest.approx(0.10, abs=1e-6)  # the flagged row ignored
    preds = [Prediction(_row("a", "tensors", 100), 100, 100, NonTensorModel()),
             Prediction(RealRow("b", "b:1", dict(SPEC), "tensors", 100,
                                tags=(real_memory.UNCALIBRATED,)), 50, 50, NonTensorModel())]
    assert margin_from(preds, 0.95) == 0.0
    assert margin_from(preds, 0.95, calibrated_only=False) == 0.5


def test_torchtune_rows_carry_their_cumulative_flags() -> None:
    try:
        rows = {r.row_id: r for r in real_memory.load_rows() if r.source == "torchtune"}
    except FileNotFoundError:
        pytest.skip("shared real_memory data not present")
    assert all(not r.skip for r in rows.values()) and len(rows) == 7
    packed = rows["torchtune-readme-optflags:1:packed"]
    assert "runtime_options" not in packed.spec and not packed.tags
    compiled = rows["torchtune-readme-optflags:2:compile"].spec
    assert compiled["runtime_options"] == {"compiled": True}
    assert compiled["recompute"] == "none"
    last = rows["torchtune-readme-optflags:7:adamw8bit"].spec
    assert last["runtime_options"] == {"compiled": True, "loss_chunks": 8,
                                       "optimizer_in_backward": True,
                                       "activation_offload": True}
    assert last["recompute"] == "full" and last["optimizer"] == "adamw8bit"
    assert real_memory.UNCALIBRATED in rows["torchtune-readme-optflags:7:adamw8bit"].tags


def test_torchtitan_rows_live_in_the_repository() -> None:
    # the repository's own source (benchmarks/data/real_memory): read beside the shared
    # folder, so only that file is needed here
    tt = real_memory.load_rows(sources=("torchtitan",))
    used = [r for r in tt if r.spec is not None]
    assert len(tt) == 10 and len(used) == 2  # the eager FSDP rows; compile / Float8 skipped
    assert all("not modelled" in r.skip for r in tt if r.spec is None)
    for r in used:
        assert r.quantity == "reserved" and r.spec["gpu"] == "H100-96G"
        assert r.spec["runtime"] == "fsdp2" and r.spec["recompute"] == "selective"
        parse_memory_spec(r.spec)  # a valid `frenzy memory` spec
    # 8 and 128 GPUs differ only in the FSDP shard of the 16 bytes per parameter of state
    (r8,) = [r for r in used if r.spec["dp"] == 8]
    (r128,) = [r for r in used if r.spec["dp"] == 128]
    assert r8.measured_bytes - r128.measured_bytes == pytest.approx(15.4 * 2**30, rel=1e-6)
