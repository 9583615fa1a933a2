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
    assert {r["world"] for r in rows} == {1, 2, 4, 6, 8}


def test_tensor_peaks_hold_on_the_gpu_and_no_plan_that_fits_would_run_out() -> None:
    rows = replay(ROWS)
    s = summary(rows)
    # max_memory_allocated of 53 plans (77 rows with repeats): within 2 % on average and
    # never under by more than the allocator's rounding of blocks (below)
    assert s["tensors"]["n"] == 77 and s["tensors"]["mape"] <= 2.0
    assert min(r["err_tensors_pct"] for r in rows) >= -4.0
    # the device figure (nvidia-smi) plus the planner's margin covers every measured run
    assert s["oom_after_margin"] == 0


def test_rmsnorm_models_are_priced_with_cudas_fused_kernel() -> None:
    # torch's fused CUDA RMSNorm keeps no fp32 normalised input: the llama and qwen2 plans
    # measured within 0.2 % (with the CPU's composite norm they were 3.6-7.5 % over)
    for r in replay(ROWS):
        if r["plan"].startswith(("tinyllama", "qwen2")) and r["world"] == 1:
            assert abs(r["err_tensors_pct"]) < 0.2, r["plan"]


PIPELINE_ZERO3 = "trainer_cuda_h200_pp_zero3.jsonl"
ZERO3_PP_FP32 = "trainer_cuda_h200_zero3_pp_fp32.jsonl"


def test_zero_and_the_vocabulary_split_ran_on_the_gpu_and_hold() -> None:
    rows = [r for r in replay(ROWS) if r.get("vocab_parallel")
            and r["source"] not in (PIPELINE_ZERO3, ZERO3_PP_FP32)]
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
    rows = [r for r in replay(ROWS) if r["source"] == "trainer_cuda_h200_requested.jsonl"]
    assert len(rows) == 4
    for r in rows:
        assert abs(r["err_requested_pct"]) < 0.3, r["plan"]
        assert r["measured"]["requested"] <= r["measured"]["alloc"] * 1.003


def test_pipeline_stages_and_zero3_ran_on_the_gpu_and_hold() -> None:
    # 19 plans priced before they first ran (third device session): 11 with pipeline
    # stages under 1F1B (every stage's first rank measured), 8 with ZeRO-3
    by_label = {p.label(): p for p in PLANS}
    rows = [r for r in replay(ROWS) if r["source"] == PIPELINE_ZERO3]
    pipeline = [r for r in rows if "err_stage_tensors_pct" in r]
    zero3 = [r for r in rows if r["plan"].endswith(" zero3")]
    assert len(rows) == 19 and len(pipeline) == 11 and len(zero3) == 8
    for r in zero3:
        # the bytes asked for within 3 %; max_memory_allocated adds the allocator's rounding
        assert abs(r["err_requested_pct"]) < 3.0, r["plan"]
        assert -4.0 <= r["err_tensors_pct"] <= 3.0, r["plan"]
    shallow = []
    for r in pipeline:
        plan = by_label[r["plan"]]
        m = plan.global_batch // (plan.dp * plan.micro_batch)
        assert len(r["err_stage_tensors_pct"]) == plan.pp
        for stage, err in enumerate(r["err_stage_tensors_pct"]):
            assert -2.5 <= err <= 2.5, (r["plan"], stage)
            if m <= plan.pp - stage:
                shallow.append(err)
    # the two first stages with m <= pp micro-batches (their first backward, all m in
    # flight, runs before any gradient exists; the later ones with fewer in flight) were
    # +12.5 and +19.6 % when every backward was priced beside every gradient: these rows
    # found it, so they do not check the change (benchmarks.trainer_memory's CPU plans do)
    assert len(shallow) == 2 and all(abs(err) < 1.0 for err in shallow)


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


def test_fp32_zero3_pipeline_stages_ran_on_the_gpu_and_hold() -> None:
    # four plans priced before they first ran (fourth device session), each micro-batch in
    # flight keeping the gathered matrices its forward saved: all 11 stages within
    # -1.2 … +3.2 % (the count of once per stage read 6-19 % under on every stage with more
    # than one micro-batch in flight)
    by_label = {p.label(): p for p in PLANS}
    rows = [r for r in replay(ROWS) if r["source"] == ZERO3_PP_FP32]
    assert len(rows) == 4
    stages = 0
    for r in rows:
        plan = by_label[r["plan"]]
        assert (plan.precision, plan.zero, plan.recompute) == ("fp32", 3, "none")
        assert len(r["err_stage_tensors_pct"]) == plan.pp > 1
        for err in r["err_stage_tensors_pct"]:
            assert -2.0 <= err <= 3.5, r["plan"]
        stages += plan.pp
    assert stages == 11
