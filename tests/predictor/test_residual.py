"""The online memory residual: bounded, explained corrections from measured peaks, and the
planner pricing a GPU type's plans with one."""

from __future__ import annotations

import pytest

from predictor.gpus import get_gpu
from predictor.planner import plan_job
from predictor.residual import HIGH, MIN_RUNS, MemoryResidual
from predictor.spec import ModelSpec, TrainingSpec

KIND = ("frenzy", "A100-40G", "gpt2")


def test_no_correction_before_enough_runs_or_when_the_model_was_high() -> None:
    r = MemoryResidual()
    r.observe(KIND, 110, 100)
    assert MIN_RUNS == 2 and r.correction(KIND) is None  # one run can be noise
    low = MemoryResidual()
    low.observe(KIND, 90, 100)
    low.observe(KIND, 95, 100)
    assert low.correction(KIND) is None  # never lowered below the model


def test_the_worst_recent_run_counts_and_the_factor_is_bounded() -> None:
    r = MemoryResidual(window=3)
    for measured in (130, 110, 105, 112):  # 130 % leaves the 3-run window
        r.observe(KIND, measured, 100)
    c = r.correction(KIND)
    assert c is not None and c.factor == pytest.approx(1.12) and c.runs == 3
    r.observe(KIND, 300, 100)
    c = r.correction(KIND)
    assert c is not None and c.factor == HIGH and c.worst == pytest.approx(3.0)
    assert "bounded from 3.00" in c.note(KIND)
    assert r.factors("frenzy", "gpt2", ["A100-40G", "T4"]) == {"A100-40G": (HIGH, c.note(KIND))}


def test_the_planner_prices_a_corrected_gpu_type_and_keeps_the_others() -> None:
    model = ModelSpec.from_name("gpt2")
    train = TrainingSpec(global_batch=64, seq_len=1024, steps=10)
    gpus = [get_gpu("A100-40G"), get_gpu("T4")]
    base = {p.label(): p for p in plan_job(model, train, gpus, max_gpus=4, keep_all=True).plans}
    fixed = plan_job(model, train, gpus, max_gpus=4, keep_all=True,
                     memory_factors={"A100-40G": (1.25, "why")}).plans
    a100 = [p for p in fixed if p.gpu_type == "A100-40G"]
    for p in fixed:  # uncorrected (their ranking text may name other plans)
        if p.gpu_type == "T4":
            b = base[p.label()]
            assert (p.memory, p.required_bytes, p.memory_factor) == (b.memory,
                                                                     b.required_bytes, 1.0)
    common = [p for p in a100 if p.label() in base]
    assert common
    for p in common:
        b = base[p.label()]
        assert p.memory_factor == 1.25 and p.notes[-1] == "why"
        assert p.memory.activations == round(b.memory.activations * 1.25)
        assert p.memory.parameters == round(b.memory.parameters * 1.25)
        assert p.memory.overhead == b.memory.overhead
        assert p.memory.workspace == b.memory.workspace
        assert p.model_tensors_bytes == pytest.approx(b.model_tensors_bytes * 1.25, abs=8)
    # the fit uses the corrected tensors: the largest micro-batches no longer fit
    dropped = {label for label, b in base.items() if b.gpu_type == "A100-40G"} - {
        p.label() for p in a100}
    assert dropped
    assert all(p.required_bytes <= get_gpu("A100-40G").memory_bytes for p in a100)
