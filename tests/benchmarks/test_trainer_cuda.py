"""The frenzy profile against the built-in trainer's peaks measured on a real GPU (an NVIDIA
H200, docs/gpu_runs/: ``benchmarks.trainer_cuda`` rows committed from a device session)."""

from __future__ import annotations

from benchmarks.trainer_cuda import COMMITTED_ROWS as ROWS
from benchmarks.trainer_cuda import PLANS, replay, summary


def test_the_committed_gpu_rows_cover_the_plans() -> None:
    rows = replay(ROWS)
    assert len(rows) >= 30
    assert {r["plan"] for r in rows} == {p.label() for p in PLANS}
    assert all(r["device_name"] == "NVIDIA H200" for r in rows)
    # several ranks on the one GPU: tensor parallelism and data parallelism measured
    assert {r["world"] for r in rows} == {1, 2, 4}


def test_tensor_peaks_hold_on_the_gpu_and_no_plan_that_fits_would_run_out() -> None:
    s = summary(replay(ROWS))
    # max_memory_allocated of 19 plans (15 of them twice): within 2 % on average and never
    # under-predicted by more than the 5 % that full recomputation misses on CUDA
    assert s["tensors"]["mape"] <= 2.0
    assert s["tensors"]["worst"] >= -5.5
    # the device figure (nvidia-smi) plus the planner's margin covers every measured run
    assert s["oom_after_margin"] == 0


def test_rmsnorm_models_are_priced_with_cudas_fused_kernel() -> None:
    # torch's fused CUDA RMSNorm keeps no fp32 normalised input: the llama and qwen2 plans
    # measured within 0.2 % (with the CPU's composite norm they were 3.6-7.5 % over)
    for r in replay(ROWS):
        if r["plan"].startswith(("tinyllama", "qwen2")) and r["world"] == 1:
            assert abs(r["err_tensors_pct"]) < 0.2, r["plan"]
