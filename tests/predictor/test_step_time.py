"""Hand-worked checks of the step-time model and a small validation against measured data."""

from __future__ import annotations

import csv
import time
from dataclasses import replace
from pathlib import Path

import pytest

import predictor.step_time as st
from predictor.gpus import get_gpu
from predictor.spec import Family, ModelSpec, ParallelConfig, Precision, Recompute, TrainingSpec
from predictor.step_time import Topology, estimate_step_time

SHARED = Path(__file__).resolve().parents[2].parent / "shared"


def _model(layers: int = 4, h: int = 1024, heads: int = 16, vocab: int = 1024) -> ModelSpec:
    return ModelSpec("t", Family.GPT2, layers, h, heads, vocab_size=vocab, max_seq_len=2048)


@pytest.fixture
def no_overheads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Strip the fixed costs so the pure FLOP / byte terms can be checked by hand."""
    monkeypatch.setattr(st, "GEMM_HALF_FLOPS", 0.0)
    monkeypatch.setattr(st, "LAYER_OVERHEAD_S", 0.0)
    monkeypatch.setattr(st, "ELEMENTWISE_PASSES_H", 0.0)
    monkeypatch.setattr(st, "ELEMENTWISE_PASSES_F", 0.0)
    monkeypatch.setattr(st, "SOFTMAX_PASSES", 0.0)
    monkeypatch.setattr(st, "NCCL_STEP_LATENCY_S", 0.0)
    monkeypatch.setattr(st, "MICRO_BATCH_OVERHEAD_S", 0.0)


def _zero_latency_gpu(name: str = "A100-80G"):
    return replace(get_gpu(name), nccl_latency_us=0.0)


def test_compute_equals_flops_over_throughput(no_overheads: None) -> None:
    gpu = _zero_latency_gpu()
    n_layers, h, v, s, b = 4, 1024, 1024, 512, 2
    model = _model(n_layers, h, 16, v)
    train = TrainingSpec(global_batch=4, seq_len=s, precision=Precision.BF16)
    par = ParallelConfig(micro_batch=b, flash_attention=False)
    # per layer forward: QKV 6bsh², proj 2bsh², MLP 16bsh², attention 4bs²h; logits 2bshV
    t_ = b * s
    layer = 6 * t_ * h * h + 2 * t_ * h * h + 16 * t_ * h * h + 4 * b * s * s * h
    fwd_flops = n_layers * layer + 2 * t_ * h * v
    m = 2
    rate = 312e12 * gpu.matmul_efficiency
    # + the fp32 cross-entropy (3 passes over b·s·V fp32 logits) in forward and backward
    loss = 2 * 3 * t_ * v * 4 / (gpu.mem_bw_gbs * 1e9 * st.MEMORY_EFFICIENCY)
    expected = (3 * fwd_flops / rate + loss) * m
    got = estimate_step_time(model, train, par, gpu, Topology())
    assert got.compute_s == pytest.approx(expected, rel=1e-9)
    assert got.tp_comm_s == 0 and got.pp_bubble_s == 0 and got.dp_comm_s == 0


def test_full_recompute_adds_one_layer_forward(no_overheads: None) -> None:
    gpu = _zero_latency_gpu()
    model = _model(vocab=8)  # negligible logits
    train = TrainingSpec(global_batch=2, seq_len=1024)
    base = estimate_step_time(model, train, ParallelConfig(flash_attention=False), gpu)
    full = estimate_step_time(
        model, train, ParallelConfig(recompute=Recompute.FULL, flash_attention=False), gpu
    )
    assert full.compute_s / base.compute_s == pytest.approx(4 / 3, rel=1e-3)
    sel = estimate_step_time(
        model, train, ParallelConfig(recompute=Recompute.SELECTIVE, flash_attention=False), gpu
    )
    assert base.compute_s < sel.compute_s < full.compute_s


def test_tp_comm_matches_ring_formula_nvlink_vs_pcie(no_overheads: None) -> None:
    gpu = _zero_latency_gpu()
    n_layers, h, s, b, t, m = 4, 1024, 1024, 1, 4, 2
    model = _model(n_layers, h)
    train = TrainingSpec(global_batch=m * b, seq_len=s)
    par = ParallelConfig(tp=t, micro_batch=b)
    nv = estimate_step_time(model, train, par, gpu, Topology())
    bw = gpu.link_bw_gbs * gpu.nccl_efficiency * 1e9
    # exposed: 2 forward + 2·(1 − overlap) backward all-reduces per layer per micro-batch
    n_exposed = 2 + 2 * (1 - st.TP_BWD_OVERLAP)
    expected = n_exposed * n_layers * m * 2 * (t - 1) / t * b * s * h * 2 / bw
    assert nv.tp_comm_s == pytest.approx(expected, rel=1e-9)
    # the raw 4 all-reduces bound it from above
    assert nv.tp_comm_s <= 4 * n_layers * m * 2 * (t - 1) / t * b * s * h * 2 / bw
    pcie = estimate_step_time(model, train, par, gpu, Topology(intra_link="pcie"))
    assert pcie.tp_comm_s > nv.tp_comm_s * 5
    one = estimate_step_time(model, train, ParallelConfig(micro_batch=b), gpu)
    assert one.tp_comm_s == 0.0


def test_tp_across_nodes_is_slower() -> None:
    gpu = get_gpu("A100-80G")
    model, train = _model(8, 4096, 32), TrainingSpec(global_batch=8, seq_len=2048)
    par = ParallelConfig(tp=16)
    inside = estimate_step_time(model, train, par, gpu, Topology(num_nodes=1))
    across = estimate_step_time(model, train, par, gpu, Topology(num_nodes=2, inter_bw_gbs=25))
    assert Topology(num_nodes=2).tp_crosses_nodes(par)
    assert across.tp_comm_s > 2 * inside.tp_comm_s


def test_bubble_follows_p_minus_1_over_m(no_overheads: None) -> None:
    gpu = _zero_latency_gpu()
    model = _model(8, 2048, 16, vocab=8)
    for p, m in ((2, 8), (4, 8), (4, 32)):
        train = TrainingSpec(global_batch=m, seq_len=1024)
        r = estimate_step_time(model, train, ParallelConfig(pp=p), gpu, Topology())
        # the fill is p − 1 stages of layers; the head (vocab 8: ~1e-4 of a stage) runs on
        # the last stage only, so it is in the compute but not in the fill
        assert r.pp_bubble_s / r.compute_s == pytest.approx((p - 1) / m, rel=1e-3)
        assert r.pp_bubble_s / r.compute_s < (p - 1) / m
        assert r.pp_p2p_s > 0


def test_pipeline_boundary_across_nodes_costs_more() -> None:
    gpu = get_gpu("A100-80G")
    model, train = _model(8, 2048), TrainingSpec(global_batch=16, seq_len=1024)
    par = ParallelConfig(pp=2, dp=8)
    local = estimate_step_time(model, train, par, gpu, Topology(num_nodes=1))
    remote = estimate_step_time(model, train, par, gpu, Topology(num_nodes=2))
    assert remote.pp_p2p_s > local.pp_p2p_s


def test_dp_overlap_exposes_at_most_the_raw_all_reduce(no_overheads: None) -> None:
    gpu = _zero_latency_gpu()
    model = _model(8, 2048)
    train = TrainingSpec(global_batch=64, seq_len=1024)
    par = ParallelConfig(dp=8, micro_batch=1)
    r = estimate_step_time(model, train, par, gpu, Topology())
    params = model.num_params()
    raw = 2 * 7 / 8 * params * 2 / (gpu.link_bw_gbs * gpu.nccl_efficiency * 1e9)
    assert 0.0 <= r.dp_comm_s <= raw
    across = estimate_step_time(model, train, par, gpu, Topology(num_nodes=2, inter_bw_gbs=5))
    assert across.dp_comm_s > r.dp_comm_s


def test_more_data_parallel_gpus_less_compute_per_rank() -> None:
    gpu = get_gpu("A100-80G")
    model, train = _model(8, 2048), TrainingSpec(global_batch=64, seq_len=1024)
    prev = None
    for dp in (1, 2, 4, 8):
        r = estimate_step_time(model, train, ParallelConfig(dp=dp), gpu)
        if prev is not None:
            assert r.compute_s < prev
        prev = r.compute_s


def test_parts_sum_to_total_and_call_is_fast() -> None:
    gpu = get_gpu("H100-80G")
    model = ModelSpec.from_name("llama-2-70b")
    train = TrainingSpec(global_batch=512, seq_len=4096)
    par = ParallelConfig(tp=8, pp=4, dp=4, micro_batch=1, sequence_parallel=True,
                         recompute=Recompute.SELECTIVE)
    topo = st.default_topology(gpu, par.num_gpus)
    r = estimate_step_time(model, train, par, gpu, topo)
    parts = r.as_dict()
    total = parts.pop("total_s")
    assert sum(parts.values()) == pytest.approx(total)
    n = 2000
    t0 = time.thread_time()
    for _ in range(n):
        estimate_step_time(model, train, par, gpu, topo)
    assert (time.thread_time() - t0) / n < 50e-6  # target 20 µs; slack for slow CI hosts


def _rows(path: Path) -> list[dict[str, str]]:
    with open(path, encoding="utf-8-sig", newline="") as fh:
        return list(csv.DictReader(fh))


@pytest.mark.skipif(not SHARED.exists(), reason="../shared measurements absent")
def test_validation_subsets_stay_within_reported_bounds() -> None:
    from predictor.gpus import load_gpu_catalog
    from predictor.validation import gpt_pmp_cases, score, vtrain_cases

    gpus = load_gpu_catalog()
    pmp = SHARED / "traces/sia-sosp23/traces/gpt_pmp/placements-rtx.csv"
    multi = SHARED / "measurements/vtrain/ground_truth_multi.csv"
    single = SHARED / "measurements/vtrain/ground_truth_single.csv"
    if not (pmp.exists() and multi.exists() and single.exists()):
        pytest.skip("a data set is missing")
    cases = gpt_pmp_cases(_rows(pmp), "rtx")
    cases += vtrain_cases(_rows(multi), "vtrain_multi")
    cases += vtrain_cases(_rows(single)[::10], "vtrain_single")
    stats = score(cases, gpus)
    # reported in docs/step_time_accuracy.md: 5.1 %, 10.7 %, 8.6 % (full sets)
    assert stats["gpt_pmp_rtx"].mape < 10
    assert stats["vtrain_multi"].mape < 15
    assert stats["vtrain_single"].mape < 15


def test_one_model_reused_over_many_plans_matches_fresh_estimates() -> None:
    # The planner keeps one StepTimeModel per (GPU type, placement) and estimates hundreds of
    # plans with it; its per-layout cache must never leak one layout's parts into another.
    import random

    gpu = get_gpu("A100-40G")
    model = ModelSpec.from_name("llama-2-7b")
    train = TrainingSpec(global_batch=64, seq_len=2048, optimizer="sgd")
    topo = Topology(num_nodes=2, rank_order="tp-pp-dp")
    plans = [ParallelConfig(tp=tp, pp=pp, dp=dp, micro_batch=mb, recompute=rc, zero_stage=z,
                            sequence_parallel=True)
             for tp in (1, 4, 8) for pp in (1, 2, 4) for dp in (1, 2, 8) for mb in (1, 4)
             for rc in Recompute for z in (0, 1, 3)]
    random.Random(0).shuffle(plans)
    shared = st.StepTimeModel(model, train, gpu, topo)
    for par in plans:
        assert shared.estimate(par) == estimate_step_time(model, train, par, gpu, topo), par


# --- runtime profiles, calibration, floor, stage splits -----------------------------------
def test_fp32_matmuls_use_tf32_only_where_the_runtime_and_the_gpu_do() -> None:
    from predictor.step_calibration import matmul_rate

    a100, t4 = get_gpu("A100-40G"), get_gpu("T4")
    # A100: TF32 dense 156 TFLOP/s (half of fp16's 312), fp32 19.5; catalog efficiency 0.8
    assert matmul_rate(a100, Precision.FP32, "megatron") == pytest.approx(156e12 * 0.8)
    assert matmul_rate(a100, Precision.FP32, "frenzy") == pytest.approx(19.5e12 * 0.8)
    # T4 (Turing) has no TF32: fp32 at 8.1 TFLOP/s under any runtime
    assert matmul_rate(t4, Precision.FP32, "megatron") == pytest.approx(8.1e12 * 0.6)
    # H100 bf16: the calibrated 0.55 of 989 TFLOP/s, not the catalog's 0.7
    assert matmul_rate(get_gpu("H100-80G"), Precision.BF16) == pytest.approx(989e12 * 0.55)


def test_unknown_runtime_is_an_error_naming_the_known_ones() -> None:
    from predictor.errors import SpecError

    with pytest.raises(SpecError, match=r"runtime.*frenzy, megatron, deepspeed, fsdp2"):
        estimate_step_time(_model(), TrainingSpec(global_batch=2, seq_len=128),
                           ParallelConfig(), get_gpu("A100-40G"), runtime="jax")


def test_dp_sync_exposed_whole_without_overlap_and_last_bucket_with_it(
        no_overheads: None) -> None:
    gpu = _zero_latency_gpu()
    n_layers = 8
    model = _model(n_layers, 2048, vocab=8)
    train = TrainingSpec(global_batch=64, seq_len=1024)
    par = ParallelConfig(dp=8, micro_batch=1)
    bw = gpu.link_bw_gbs * gpu.nccl_efficiency * 1e9
    raw = 2 * 7 / 8 * st._stage_params_of(model, 1, 1) * 2 / bw  # ring all-reduce, 2-byte grads
    ds = estimate_step_time(model, train, par, gpu, Topology(), runtime="deepspeed")
    assert ds.dp_comm_s == pytest.approx(raw, rel=1e-9)  # issued after the backward pass
    ddp = estimate_step_time(model, train, par, gpu, Topology(), runtime="frenzy")
    # the backward of one micro-batch (~2/3 of its compute) hides all but the last bucket
    assert ddp.compute_s / 8 * 2 / 3 > raw
    assert ddp.dp_comm_s == pytest.approx(raw / n_layers, rel=1e-9)


def test_optimizer_bytes_follow_the_runtime(no_overheads: None) -> None:
    gpu = _zero_latency_gpu()
    model, train = _model(), TrainingSpec(global_batch=2, seq_len=128)
    params = st._stage_params_of(model, 1, 1)
    hbm = gpu.mem_bw_gbs * 1e9 * st.MEMORY_EFFICIENCY
    for runtime, nbytes in (("frenzy", 30), ("megatron", 52), ("fsdp2", 32)):
        r = estimate_step_time(model, train, ParallelConfig(), gpu, Topology(), runtime=runtime)
        assert r.optimizer_s == pytest.approx(nbytes * params / hbm, rel=1e-9)


def test_tp_collectives_hide_under_the_dispatch_floor(monkeypatch: pytest.MonkeyPatch) -> None:
    gpu = _zero_latency_gpu()
    model = _model(4, 1024, vocab=8)
    train = TrainingSpec(global_batch=1, seq_len=64)
    par = ParallelConfig(tp=2, micro_batch=1, flash_attention=False)
    monkeypatch.setattr(st, "LAYER_OVERHEAD_S", 1.0)  # a floor far above GPU work + comm
    monkeypatch.setattr(st, "MICRO_BATCH_OVERHEAD_S", 0.0)
    r = estimate_step_time(model, train, par, gpu, Topology())
    assert r.tp_comm_s == 0.0
    # forward 1 floor + backward 2 floors per layer, plus the tiny head
    assert r.compute_s == pytest.approx(4 * 3 * 1.0, rel=1e-3)
    monkeypatch.setattr(st, "LAYER_OVERHEAD_S", 0.0)  # no floor: the collectives show
    assert estimate_step_time(model, train, par, gpu, Topology()).tp_comm_s > 0


def test_uneven_stage_split_prices_the_slowest_stage(no_overheads: None) -> None:
    gpu = _zero_latency_gpu()
    model = _model(8, 1024, vocab=8)  # negligible head
    m = 8
    train = TrainingSpec(global_batch=m, seq_len=1024)
    even = estimate_step_time(model, train, ParallelConfig(pp=2), gpu, Topology())
    split = ParallelConfig(pp=2, extra={"stage_layers": (2, 6)})
    uneven = estimate_step_time(model, train, split, gpu, Topology())
    # slowest stage holds 6 of 8 layers instead of 4; the fill is the other stage's 2 layers
    assert uneven.compute_s / even.compute_s == pytest.approx(6 / 4, rel=1e-3)
    assert uneven.pp_bubble_s / even.pp_bubble_s == pytest.approx(2 / 4, rel=1e-3)
    with pytest.raises(ValueError, match="stage_layers must give 2"):
        estimate_step_time(model, train, ParallelConfig(pp=2, extra={"stage_layers": (3, 3)}),
                           gpu, Topology())


def test_calibration_and_validation_splits_are_disjoint_and_named() -> None:
    from benchmarks.step_time_accuracy import CALIBRATION, is_calibration, is_validation
    from predictor.validation import Case

    def case(dataset: str, model: str) -> Case:
        return Case(dataset, "x", _model().with_(name=model), TrainingSpec(global_batch=1,
                    seq_len=128), ParallelConfig(), "A100-40G", Topology(), 1.0)

    assert sorted(CALIBRATION) == ["llm_foundry", "torchtitan", "vtrain_single"]
    assert is_calibration(case("vtrain_single", "gpt"))
    assert is_calibration(case("llm_foundry", "mpt-7b"))
    # torchtitan: the 8-GPU row calibrates, the 128-GPU one validates
    tt = case("torchtitan", "llama-3.1-8b")
    assert is_calibration(replace(tt, par=ParallelConfig(dp=8)))
    assert is_validation(replace(tt, par=ParallelConfig(dp=128)))
    for dataset, model in (("llm_foundry", "mpt-13b"), ("llm_foundry", "mpt-760m"),
                           ("vtrain_multi", "gpt"), ("gpt_pmp_rtx", "gpt"), ("amp_t4", "gpt")):
        assert is_validation(case(dataset, model)) and not is_calibration(case(dataset, model))


def test_runtime_work_per_micro_batch_counts_on_every_schedule_step(
        no_overheads: None) -> None:
    # deepspeed and megatron differ, at tp = 1, only in the runtime's work per micro-batch:
    # 2.5 ms (deepspeed's profile) against the module's figure (0 under this fixture). A
    # 1F1B schedule of m = 8 micro-batches over p = 2 stages pays it m + p − 1 = 9 times.
    gpu = _zero_latency_gpu()
    model = _model(4, 1024, vocab=8)
    train = TrainingSpec(global_batch=8, seq_len=256)
    par = ParallelConfig(pp=2, micro_batch=1)
    ds = estimate_step_time(model, train, par, gpu, Topology(), runtime="deepspeed")
    mg = estimate_step_time(model, train, par, gpu, Topology(), runtime="megatron")
    assert ds.total_s - mg.total_s == pytest.approx(9 * 2.5e-3, rel=1e-9)
    # the frenzy (trace) runtime keeps the module's constants, read at call time
    assert st.host_overheads("frenzy") == (0.0, 0.0)
    assert st.host_overheads("deepspeed") == (0.0, 2.5e-3)


def test_backward_tp_all_reduce_hides_behind_its_weight_gradient_gemm(
        no_overheads: None) -> None:
    # deepspeed: each backward input-gradient all-reduce is exposed by what exceeds the
    # weight-gradient GEMM beside it (QKV: 2·T·h·3h/t FLOPs, MLP input: 2·T·h·4h/t);
    # megatron keeps the fixed half. No floor, no latency: by hand from the ring formula.
    from predictor.step_calibration import matmul_rate

    gpu = _zero_latency_gpu()
    n_layers, h, s, t, m = 2, 4096, 1024, 2, 2
    model = _model(n_layers, h, 32, vocab=8)
    train = TrainingSpec(global_batch=m, seq_len=s, precision=Precision.BF16)
    par = ParallelConfig(tp=t, micro_batch=1, flash_attention=False)
    rate = matmul_rate(gpu, Precision.BF16, "deepspeed")
    w_qkv = 2 * s * h * 3 * h / t / rate
    w_in = 2 * s * h * 4 * h / t / rate
    for link, bw_raw in ((None, gpu.link_bw_gbs), ("pcie", gpu.pcie_bw_gbs)):
        ar = 2 * (t - 1) / t * s * h * 2 / (bw_raw * gpu.nccl_efficiency * 1e9)
        topo = Topology(intra_link=link)
        ds = estimate_step_time(model, train, par, gpu, topo, runtime="deepspeed")
        exposed = max(0.0, ar - w_qkv) + max(0.0, ar - w_in)
        assert ds.tp_comm_s == pytest.approx(n_layers * m * (2 * ar + exposed), rel=1e-9)
        mg = estimate_step_time(model, train, par, gpu, topo, runtime="megatron")
        assert mg.tp_comm_s == pytest.approx(n_layers * m * (2 + 2 * 0.5) * ar, rel=1e-9)
        if link is None:  # NVLink: both hidden, only the 2 forward all-reduces show
            assert exposed == 0.0
        else:  # PCIe: the all-reduce outlasts both GEMMs
            assert ar > w_in > w_qkv


def test_op_sac_backward_reruns_the_unsaved_linears_and_elementwise_work() -> None:
    """torchtitan's per-op SAC (the fsdp2 profile's selective) re-runs a llama layer's
    element-wise work (forward − its GEMMs − the attention core) and the three matmuls whose
    outputs it does not save, wk, wo and w3 (the 2nd, 4th and 6th), each its own kernel."""
    from predictor.step_time import GEMM_HALF_FLOPS, _layer_times

    m = ModelSpec.from_name("llama-3-8b")
    s, b, t, rate, bw = 2048, 1, 2, 400e12, 2e12
    (fwd, _, _), (_, _, core), _, (_, _, sac) = _layer_times(
        m, s, Precision.BF16, b, t, True, False, rate, bw)
    tokens, h = b * s, m.hidden_size
    q, kv, f = m.attn_hidden, m.kv_hidden, m.ffn_hidden_size

    def gemm(w: int) -> float:
        return (2.0 * tokens * w / t + GEMM_HALF_FLOPS) / rate

    # the model's forward GEMMs: QKV as one, the output projection, gate, up and down
    dense = gemm(h * (q + 2 * kv)) + gemm(q * h) + 3 * gemm(h * f)
    elementwise = fwd - core - dense
    assert sac == pytest.approx(elementwise + gemm(h * kv) + gemm(q * h) + gemm(h * f),
                                rel=1e-12)
    # and a runtime without it still re-runs the attention core alone
    sel = estimate_step_time(m, TrainingSpec(global_batch=8, seq_len=s),
                             ParallelConfig(dp=8, micro_batch=1, recompute="selective"),
                             get_gpu("H100-80G"), runtime="megatron")
    sac_rt = estimate_step_time(m, TrainingSpec(global_batch=8, seq_len=s),
                                ParallelConfig(dp=8, micro_batch=1, recompute="selective"),
                                get_gpu("H100-80G"), runtime="fsdp2")
    assert sac_rt.compute_s > sel.compute_s
