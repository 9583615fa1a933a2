"""Plan search: validity, fit, ranking, and the infeasible answer."""

from __future__ import annotations

from dataclasses import replace

import pytest

from predictor.errors import SpecError
from predictor.gpus import GIB, get_gpu
from predictor.memory import estimate_memory
from predictor.overhead import NON_TENSOR
from predictor.planner import DEFAULT_MARGIN, RANKINGS, divisors, plan_job
from predictor.runtimes import FRENZY
from predictor.spec import ModelSpec, Precision, Recompute, TrainingSpec


def test_divisors() -> None:
    assert divisors(12) == [1, 2, 3, 4, 6, 12]
    assert divisors(64, 8) == [1, 2, 4, 8]


@pytest.fixture(scope="module")
def llama_result():
    model = ModelSpec.from_name("llama-2-7b")
    train = TrainingSpec(global_batch=32, seq_len=4096, steps=100)
    return plan_job(model, train, [get_gpu("A100-80G"), get_gpu("A100-40G"), get_gpu("L40S")],
                    max_gpus=32)


def test_every_plan_is_valid_and_fits(llama_result) -> None:
    r = llama_result
    assert r.plans
    for p in r.plans:
        p.parallel.check(r.model, r.train)  # heads % tp, layers % pp, batch divisibility
        gpu = get_gpu(p.gpu_type)
        # the device figure (tensors + slack + context + NCCL) fits with the margin kept free
        assert p.peak_memory_bytes <= gpu.memory_bytes * (1 - DEFAULT_MARGIN)
        assert p.required_bytes >= p.peak_memory_bytes
        assert p.num_gpus <= 32 and p.parallel.tp <= 8
        assert p.runtime == "frenzy" and p.to_dict()["runtime"] == "frenzy"
        # the plan's memory is the model's own prediction for that configuration
        again = estimate_memory(r.model, r.train, p.parallel, runtime=FRENZY)
        assert p.memory.tensors == again.tensors + NON_TENSOR.workspace_bytes
        outside = gpu.cuda_context_bytes + (NON_TENSOR.nccl_bytes if p.num_gpus > 1 else 0)
        assert p.memory.device == p.memory.tensors + p.memory.slack + outside


def test_one_plan_per_gpu_type_and_count(llama_result) -> None:
    keys = [(p.gpu_type, p.num_gpus) for p in llama_result.plans]
    assert len(keys) == len(set(keys))


def test_ranked_by_the_named_key_with_reasons(llama_result) -> None:
    plans = llama_result.plans
    keys = [RANKINGS["gpu_seconds"](p) for p in plans]
    assert keys == sorted(keys)
    assert [p.rank for p in plans] == list(range(1, len(plans) + 1))
    assert all(p.reason.startswith(f"#{p.rank} by gpu_seconds") for p in plans)
    assert all(p.job_time_s == pytest.approx(p.step_time_s * 100) for p in plans)


def test_ranking_is_swappable() -> None:
    model = ModelSpec.from_name("gpt2-medium")
    train = TrainingSpec(global_batch=64, seq_len=1024, steps=1000)
    gpus = [get_gpu("A100-80G"), get_gpu("RTX3090")]
    fast = plan_job(model, train, gpus, ranking="job_time", max_gpus=16)
    assert [p.job_time_s for p in fast.plans] == sorted(p.job_time_s for p in fast.plans)
    few = plan_job(model, train, gpus, ranking=lambda p: (p.num_gpus, p.step_time_s), max_gpus=16)
    assert few.plans[0].num_gpus == 1
    with pytest.raises(SpecError) as exc:
        plan_job(model, train, gpus, ranking="cheapest")
    assert exc.value.field == "ranking"


def test_memory_savers_only_when_needed() -> None:
    # gpt2 (124M) at batch 8 × 1024 fits one A100-80G without recomputation or ZeRO.
    model = ModelSpec.from_name("gpt2")
    train = TrainingSpec(global_batch=8, seq_len=1024)
    r = plan_job(model, train, [get_gpu("A100-80G")], max_gpus=8, keep_all=True)
    single = [p for p in r.plans if p.num_gpus == 1]
    assert single and all(p.parallel.recompute is Recompute.NONE for p in single)
    assert all(p.parallel.zero_stage == 0 for p in single)


def test_bf16_on_gpu_without_bf16_is_planned_in_fp16() -> None:
    r = plan_job(ModelSpec.from_name("gpt2"), TrainingSpec(global_batch=8, seq_len=512),
                 [get_gpu("V100-32G")], max_gpus=4)
    assert r.plans and all(p.precision is Precision.FP16 for p in r.plans)
    assert "no bf16" in r.plans[0].notes[0]


def test_infeasible_model_reports_smallest_need() -> None:
    model = ModelSpec.from_name("llama-3-70b")
    train = TrainingSpec(global_batch=8, seq_len=8192)
    r = plan_job(model, train, [get_gpu("RTX2080Ti")], max_gpus=8)
    assert not r.plans
    assert r.min_required_bytes is not None and r.min_required_bytes > 11 * GIB
    assert "RTX2080Ti" in r.infeasible and "GiB per GPU" in r.infeasible
    with pytest.raises(SpecError):
        _ = r.best


def test_bad_arguments() -> None:
    m, t = ModelSpec.from_name("gpt2"), TrainingSpec(global_batch=8, seq_len=4096)
    with pytest.raises(SpecError) as exc:
        plan_job(m, t)  # gpt2's learned positions stop at 1024
    assert exc.value.field == "seq_len"
    with pytest.raises(SpecError):
        plan_job(m, TrainingSpec(global_batch=8, seq_len=512), max_gpus=0)


def test_compute_lower_bound_never_exceeds_the_step_time() -> None:
    import random

    from predictor.spec import MODEL_CATALOG, ParallelConfig
    from predictor.step_time import compute_lower_bound, default_topology, estimate_step_time

    rng = random.Random(7)
    names = sorted(MODEL_CATALOG)
    for _ in range(300):
        m = MODEL_CATALOG[rng.choice(names)]
        t = TrainingSpec(global_batch=rng.choice([16, 64]), seq_len=512,
                         precision=rng.choice(["bf16", "fp32"]))
        tp = rng.choice([x for x in (1, 2, 4, 8) if m.num_heads % x == 0])
        pp = rng.choice([x for x in (1, 2, 4) if m.num_layers % x == 0])
        dp = rng.choice([1, 2, 4])
        par = ParallelConfig(tp=tp, pp=pp, dp=dp, micro_batch=rng.choice([1, 2, 4]),
                             recompute=rng.choice(list(Recompute)),
                             zero_stage=rng.choice([0, 1, 3]), sequence_parallel=True)
        gpu = get_gpu(rng.choice(["A100-80G", "RTX2080Ti", "H100-80G"]))
        runtime = rng.choice(["frenzy", "hf-trainer"])  # hf-trainer: its weight casts too
        lb = compute_lower_bound(m, t, gpu, tp=tp, pp=pp, dp=dp, micro_batch=par.micro_batch,
                                 recompute=par.recompute, flash=True, sequence_parallel=True,
                                 runtime=runtime)
        for nodes in (1, 4):
            topo = default_topology(gpu, par.num_gpus, max(1, par.num_gpus // nodes))
            step = estimate_step_time(m, t, par, gpu, topo, runtime=runtime)
            assert lb <= step.total_s * (1 + 1e-9)


def _exhaustive_best_step_times(model, train, gpus, max_gpus: int, runtime=FRENZY) -> dict:
    """Reference search without any of the planner's shortcuts: every (tp, pp, dp,
    micro-batch) on each GPU type, the first memory saver in order of time cost whose
    ``estimate_memory`` fits (95%), and of those (largest micro-batch per saver without
    pipelining, as the planner's rule) the smallest ``estimate_step_time`` per (GPU type,
    GPU count). Pipeline depths and ZeRO stages ``runtime`` does not execute are skipped."""
    from predictor.planner import _SAVERS, _tp_options
    from predictor.spec import ParallelConfig
    from predictor.step_time import default_topology, estimate_step_time

    best: dict[tuple[str, int], float] = {}
    for gpu in gpus:
        gtrain = train if gpu.supports(train.precision) else replace(train,
                                                                    precision=Precision.FP16)
        one = NON_TENSOR.budget(gpu.memory_bytes, gpu, 1, DEFAULT_MARGIN)
        several = NON_TENSOR.budget(gpu.memory_bytes, gpu, 2, DEFAULT_MARGIN)
        for tp in _tp_options(model, train, min(8, max_gpus)):
            for pp in divisors(model.num_layers, min(8, max_gpus // tp)):
                if runtime.max_pp and pp > runtime.max_pp:
                    continue
                for dp in divisors(train.global_batch, max_gpus // (tp * pp)):
                    chosen = []  # (saver index, micro-batch)
                    budget = several if tp * pp * dp > 1 else one
                    for mb in divisors(train.global_batch // dp):
                        for i, (rc, zero) in enumerate(_SAVERS):
                            if (zero and dp == 1) or zero not in runtime.zero_stages:
                                continue
                            par = ParallelConfig(tp=tp, pp=pp, dp=dp, micro_batch=mb,
                                                 recompute=rc, zero_stage=zero,
                                                 sequence_parallel=train.sequence_parallel,
                                                 flash_attention=train.flash_attention)
                            if estimate_memory(model, train, par,
                                               runtime=FRENZY).tensors <= budget:
                                chosen.append((i, par))
                                break
                    if pp == 1:  # only the largest micro-batch of each saver
                        chosen = [c for j, c in enumerate(chosen)
                                  if j + 1 == len(chosen) or chosen[j + 1][0] != c[0]]
                    n = tp * pp * dp
                    topo = default_topology(gpu, n, 8)
                    for _, par in chosen:
                        t = estimate_step_time(model, gtrain, par, gpu, topo).total_s
                        key = (gpu.name, n)
                        best[key] = min(best.get(key, t), t)
    return best


@pytest.mark.parametrize("restricted", [False, True])
@pytest.mark.parametrize(("name", "batch", "seq", "gpu_names"), [
    ("gpt2-medium", 32, 1024, ("A100-40G", "RTX2080Ti", "V100-32G")),
    ("llama-2-7b", 16, 2048, ("A100-80G", "L40S")),
])
def test_search_shortcuts_find_the_exhaustive_optimum(name, batch, seq, gpu_names,
                                                      restricted) -> None:
    # Bisection over memory curves, bound pruning and the cached step-time parts must keep,
    # per (GPU type, count), a plan as fast as the best one an exhaustive search finds; over
    # the whole space and as the built-in trainer's profile searches it (single-stage plans,
    # pipelines only when none fits any GPU type).
    model = ModelSpec.from_name(name)
    train = TrainingSpec(global_batch=batch, seq_len=seq, steps=10)
    gpus = [get_gpu(g) for g in gpu_names]
    runtime = FRENZY if restricted else FRENZY.unrestricted()
    want = _exhaustive_best_step_times(model, train, gpus, max_gpus=16, runtime=runtime)
    if runtime.pp_when_needed:
        want = _exhaustive_best_step_times(model, train, gpus, max_gpus=16,
                                           runtime=replace(runtime, max_pp=1)) or want
    got = plan_job(model, train, gpus, max_gpus=16, runtime=runtime)
    assert {(p.gpu_type, p.num_gpus): p.step_time_s for p in got.plans} == want
    assert want  # both searches found plans


@pytest.mark.parametrize(("name", "batch", "seq", "optimizer"), [
    ("gpt2-medium", 24, 1024, "adamw"),  # 24 layers: pp 1..8; batch 24: odd micro-batch sizes
    ("llama-2-7b", 8, 2048, "sgd"),
])
def test_memory_values_match_estimate_memory(name, batch, seq, optimizer) -> None:
    # The planner compares one array of every (layout, saver, micro-batch) with the budgets;
    # each entry must be estimate_memory's tensors, and savers a layout cannot use (ZeRO at
    # dp = 1) and micro-batches past its last must never fit.
    from predictor.planner import _SAVERS, _Layout, _memory_values, _MemoryTable
    from predictor.spec import ParallelConfig

    model = ModelSpec.from_name(name)
    train = TrainingSpec(global_batch=batch, seq_len=seq, optimizer=optimizer, steps=10)
    table = _MemoryTable(model, train, FRENZY.unrestricted())
    layouts = [_Layout(table, tp, pp, dp) for tp in (1, 2, 4) for pp in divisors(24, 8)
               if model.num_layers % pp == 0 for dp in divisors(batch)]
    values = _memory_values(table, layouts)
    # the built-in trainer runs every ZeRO stage (pp > 1 it does not, which the planner's
    # layouts, not the memory values, leave out): the same values with or without the limits
    plain = _memory_values(_MemoryTable(model, train, FRENZY), layouts)
    zero3 = [si for si, (_, z) in enumerate(_SAVERS) if z == 3]
    assert zero3 and (plain[:, zero3] < 1 << 59).any()
    assert (plain == values).all()
    width = max(len(divisors(batch // layout.dp)) for layout in layouts)
    assert values.shape == (len(layouts), len(_SAVERS), width)
    for li, layout in enumerate(layouts):
        mbs = divisors(batch // layout.dp)
        for si, (rc, zero) in enumerate(_SAVERS):
            for c in range(width):
                got = int(values[li, si, c])
                if c >= len(mbs) or (zero and layout.dp == 1):
                    assert got > 1 << 59
                    continue
                par = ParallelConfig(tp=layout.tp, pp=layout.pp, dp=layout.dp,
                                     micro_batch=mbs[c], recompute=rc, zero_stage=zero,
                                     sequence_parallel=train.sequence_parallel,
                                     flash_attention=train.flash_attention)
                assert got == estimate_memory(model, train, par, runtime=FRENZY).tensors


def test_default_topology_takes_the_declared_network() -> None:
    from predictor.step_time import default_topology

    a100 = get_gpu("A100-40G")  # catalog: DGX A100 servers, 200 GB/s between nodes
    assert a100.inter_node_bw_gbs == 200.0
    # 20 GPUs packed on nodes of 8: 3 nodes; the cluster's 12.5 GB/s replaces the default
    assert default_topology(a100, 20, 8, 12.5).num_nodes == 3
    assert default_topology(a100, 20, 8, 12.5).inter_bw_gbs == 12.5
    assert default_topology(a100, 20, 8).inter_bw_gbs == 200.0


def test_multi_node_plans_are_timed_on_the_declared_network() -> None:
    """``inter_node_bw_gbs`` is the network the plans are timed on: plans inside one node do
    not move, every multi-node plan has the step time of its own configuration on nodes of
    8 joined by that network, and none is faster on 12.5 GB/s than the best on 200 GB/s."""
    import math

    from predictor.step_time import Topology, estimate_step_time

    model = ModelSpec.from_name("gpt2-large")
    train = TrainingSpec(global_batch=128, seq_len=1024, steps=10)
    a100 = get_gpu("A100-40G")
    dgx = {p.num_gpus: p for p in plan_job(model, train, [a100], max_gpus=32).plans}
    slow = {p.num_gpus: p for p in plan_job(model, train, [a100], max_gpus=32,
                                            inter_node_bw_gbs=12.5).plans}
    assert set(dgx) == set(slow) and max(slow) == 32
    for n, p in slow.items():
        if n <= 8:
            assert p.parallel == dgx[n].parallel
            assert p.step_time_s == dgx[n].step_time_s
            continue
        topo = Topology(num_nodes=math.ceil(n / 8), inter_bw_gbs=12.5)
        assert p.step_time_s == pytest.approx(
            estimate_step_time(model, train, p.parallel, a100, topo).total_s, rel=1e-9)
        assert p.step_time_s > dgx[n].step_time_s
    with pytest.raises(SpecError, match="inter_node_bw_gbs"):
        plan_job(model, train, [a100], inter_node_bw_gbs=0.0)


def test_a_single_micro_batch_that_fits_where_smaller_ones_do_not_is_kept() -> None:
    # The built-in trainer frees the gradients between steps: with one micro-batch per step
    # none exists at the loss, so gpt2-medium's 4·n bytes of gradients (1.4 GB) outweigh
    # the activations that micro-batch 2 adds over micro-batch 1 at 128 tokens. With the
    # budget at micro-batch 2's peak, micro-batch 1 (m = 2) does not fit but 2 (m = 1) does:
    # the planner must keep it although the fitting micro-batches are no prefix.
    from predictor.planner import _fitting_groups, _Layout, _MemoryTable
    from predictor.spec import ParallelConfig

    model = ModelSpec.from_name("gpt2-medium")
    train = TrainingSpec(global_batch=2, seq_len=128, steps=10)
    one = estimate_memory(model, train, ParallelConfig(micro_batch=2), runtime=FRENZY).tensors
    two = estimate_memory(model, train, ParallelConfig(micro_batch=1), runtime=FRENZY).tensors
    assert one < two
    table = _MemoryTable(model, train, FRENZY)
    (groups, _), = _fitting_groups(table, [_Layout(table, 1, 1, 1)], [(one, one)])
    cfgs = [cfg for _, _, _, group_cfgs in groups for cfg in group_cfgs]
    assert [(cfg[3], cfg[4]) for cfg in cfgs] == [(2, Recompute.NONE)]
