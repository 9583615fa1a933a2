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
    # max_memory_allocated of 30 plans (54 rows with repeats): within 2 % on average and
    # never under by more than the allocator's rounding of blocks (below)
    assert s["tensors"]["mape"] <= 2.0
    assert s["tensors"]["worst"] >= -3.5
    # the device figure (nvidia-smi) plus the planner's margin covers every measured run
    assert s["oom_after_margin"] == 0


def test_rmsnorm_models_are_priced_with_cudas_fused_kernel() -> None:
    # torch's fused CUDA RMSNorm keeps no fp32 normalised input: the llama and qwen2 plans
    # measured within 0.2 % (with the CPU's composite norm they were 3.6-7.5 % over)
    for r in replay(ROWS):
        if r["plan"].startswith(("tinyllama", "qwen2")) and r["world"] == 1:
            assert abs(r["err_tensors_pct"]) < 0.2, r["plan"]


def test_zero_and_the_vocabulary_split_ran_on_the_gpu_and_hold() -> None:
    rows = [r for r in replay(ROWS) if r.get("vocab_parallel")]
    zero = [r for r in rows if " zero" in r["plan"]]
    split = [r for r in rows if "tp1dp" not in r["plan"]]
    assert len(zero) >= 8 and {" zero1", " zero2"} <= {r["plan"][-6:] for r in zero}
    assert len(split) >= 6
    for r in zero + split:
        assert -3.5 <= r["err_tensors_pct"] <= 2.0, r["plan"]


def test_the_bytes_asked_for_match_where_the_allocator_rounds_blocks_up() -> None:
    # torch's requested_bytes peak (what the program asked for) against the prediction: the
    # tp 2 x dp 2 plans sit 1.3-3.3 % under max_memory_allocated, which counts the blocks
    # the caching allocator did not split (remainders of 1 MiB or less), and within 0.3 %
    # of the bytes asked for; the pythia tp 4 full-recompute row was 4.7 % under before the
    # forward's end (all of autocast's weight copies) was priced
    rows = [r for r in replay(ROWS) if "err_requested_pct" in r]
    assert len(rows) == 4
    for r in rows:
        assert abs(r["err_requested_pct"]) < 0.3, r["plan"]
        assert r["measured"]["requested"] <= r["measured"]["alloc"] * 1.003


def test_the_allocation_history_replays_to_the_requested_bytes_of_another_run() -> None:
    # rank 0's allocation history (FRENZY_CUDA_SNAPSHOT) replayed alloc by free gives, to the
    # byte, the requested-bytes peak torch counted in a separate run of the same plan: the
    # history records the sizes asked for, so what max_memory_allocated adds is block rounding
    import json

    from benchmarks.trainer_cuda import GPU_RUNS

    def rows(name: str) -> dict[str, dict]:
        with open(GPU_RUNS / name) as f:
            return {r["plan"]: r["measured"] for r in map(json.loads, f)}

    traced, requested = rows("peak_contents_h200.jsonl"), rows("trainer_cuda_h200_requested.jsonl")
    assert len(traced) == 3
    for plan, m in traced.items():
        assert m["peak_contents"]["peak_bytes"] == requested[plan]["requested"]
        assert m["peak_contents"]["peak_bytes"] < m["alloc"]


def test_peak_contents_replays_a_history_by_hand() -> None:
    from benchmarks.trainer_cuda import peak_contents

    ours = [{"filename": "/r/orchestrator/trainer/model.py", "line": 7, "name": "forward"}]
    trace = [
        {"action": "alloc", "addr": 1, "size": 100, "frames": ours},
        {"action": "alloc", "addr": 2, "size": 50, "frames": []},
        {"action": "free_requested", "addr": 1, "size": 100},  # another stream still uses it
        {"action": "alloc", "addr": 3, "size": 60, "frames": ours},  # 210 until completed
        {"action": "free_completed", "addr": 1, "size": 100},
        {"action": "alloc", "addr": 4, "size": 60, "frames": ours},  # 170
    ]
    out = peak_contents({"device_traces": [trace]})
    assert out["peak_bytes"] == 210  # as max_memory_allocated counts: until free_completed
    assert out["peak_bytes_free_requested"] == 170  # 50 + 60 + 60
    assert out["blocks"] == 3
    assert out["groups"][0] == {"site": "trainer/model.py:7 forward", "block_bytes": 100,
                                "count": 1, "bytes": 100}
    assert out["freed_not_completed"] == [out["groups"][0]]
