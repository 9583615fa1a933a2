"""predictor.memory: each term against hand-worked values from the papers' formulas."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest

from predictor.gpus import GpuType
from predictor.memory import (
    MemoryBreakdown,
    estimate_memory,
    estimate_stage,
    frenzy_memory,
    stage_layers,
    stage_param_numels,
)
from predictor.spec import Family, ModelSpec, ParallelConfig, TrainingSpec

# A gpt2-shaped model small enough to count by hand: l=2, h=64, a=4, V=1000, f=4h.
GPT = ModelSpec("tiny-gpt", Family.GPT2, num_layers=2, hidden_size=64, num_heads=4,
                vocab_size=1000, max_seq_len=128)
LLAMA = ModelSpec("tiny-llama", Family.LLAMA, num_layers=4, hidden_size=64, num_heads=8,
                  num_kv_heads=2, ffn_hidden_size=176, vocab_size=1000, max_seq_len=256,
                  tie_embeddings=False)


def _train(**kw: object) -> TrainingSpec:
    base = dict(global_batch=4, seq_len=128, precision="bf16", optimizer="adamw")
    base.update(kw)
    return TrainingSpec(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("precision", "optimizer", "param_b", "grad_b", "opt_b"),
    [("bf16", "adamw", 2, 4, 12),  # 18 B/param: Megatron's mixed-precision Adam
     ("fp16", "adam", 2, 4, 12),
     ("fp32", "adam", 4, 4, 8),  # 16 B/param
     ("bf16", "sgd", 2, 4, 8),  # master + momentum
     ("fp32", "sgd", 4, 4, 4)],
)
def test_static_bytes_per_parameter(precision: str, optimizer: str, param_b: int, grad_b: int,
                                    opt_b: int) -> None:
    mem = estimate_memory(GPT, _train(precision=precision, optimizer=optimizer),
                          ParallelConfig())
    n = GPT.num_params()
    assert sum(stage_param_numels(GPT, 1, 1, 0)) == n
    assert (mem.parameters, mem.gradients, mem.optimizer_states) == (
        param_b * n, grad_b * n, opt_b * n)


def test_zero_stages_divide_over_dp() -> None:
    numels = stage_param_numels(LLAMA, 1, 1, 0)
    dp = 4
    shard = sum(-(-x // dp) for x in numels)
    full = sum(numels)
    tr = _train(global_batch=16)
    z = {k: estimate_memory(LLAMA, tr, ParallelConfig(dp=dp, zero_stage=k)) for k in range(4)}
    assert z[0].optimizer_states == 12 * full
    assert z[1].optimizer_states == 12 * shard and z[1].gradients == 4 * full
    assert z[2].gradients == 4 * shard and z[2].parameters == 2 * full
    assert z[3].parameters == 2 * shard
    assert z[3].tensors < z[2].tensors < z[1].tensors < z[0].tensors


def test_tensor_parallel_shards_weights_but_not_norms() -> None:
    # per layer at tp=2: Q,K,V,O = 4h²/2, MLP 8h²/2 (+ fc1 bias 4h/2), replicated: QKV bias is
    # column-split 3h/2, attention-out bias h, MLP-out bias h, two LayerNorms 4h
    h = 64
    per_layer = sum(stage_param_numels(GPT, 2, 1, 0)) - sum(
        stage_param_numels(GPT.with_(num_layers=1), 2, 1, 0))
    assert per_layer == 6 * h * h + 3 * h // 2 + h + 2 * h + h + 4 * h
    # embedding (vocab-parallel) on the first stage, output (untied) on the last
    first = stage_param_numels(LLAMA, 2, 2, 0)
    last = stage_param_numels(LLAMA, 2, 2, 1)
    assert 500 * 64 in first and 500 * 64 in last
    assert stage_layers(4, 2, 0) == (0, 2) and stage_layers(4, 2, 1) == (2, 4)


def test_tied_embedding_is_duplicated_on_the_last_stage() -> None:
    one = sum(stage_param_numels(GPT, 1, 1, 0))
    two = sum(stage_param_numels(GPT, 1, 2, 0)) + sum(stage_param_numels(GPT, 1, 2, 1))
    assert two - one == GPT.vocab_size * GPT.hidden_size


def _layer_act(model: ModelSpec, train: TrainingSpec, par: ParallelConfig) -> int:
    """One layer's activations, from the difference of a 2- and a 1-layer model."""
    def acts(layers: int) -> int:
        m = model.with_(num_layers=layers)
        # the full-recompute breakdown is independent of the loss; read activations at the
        # backward moment of a non-last stage by making pp=2 with the layers on stage 0
        b = estimate_stage(m.with_(num_layers=2 * layers), train,
                           ParallelConfig(**{**_par_dict(par), "pp": 2}), 0)
        return b.activations
    return acts(2) - acts(1)


def _par_dict(par: ParallelConfig) -> dict[str, object]:
    return dict(tp=par.tp, dp=par.dp, micro_batch=par.micro_batch, recompute=par.recompute,
                zero_stage=par.zero_stage, sequence_parallel=par.sequence_parallel,
                flash_attention=par.flash_attention)


def test_korthikanti_per_layer_activations() -> None:
    s, b, h, a = 128, 2, 64, 4
    tr = _train(global_batch=2, seq_len=s, precision="fp16", flash_attention=False,
                sequence_parallel=False)
    stats = 2 * 2 * (s * b) * 2  # two LayerNorms × (mean, rstd) × tokens × 2 B
    # Korthikanti et al.: 34sbh + 5as²b per layer (fp16, with dropout); without dropout
    # (no masks 2sbh + as²b, no dropout output 2as²b): 32sbh + 2as²b
    no_dropout = 34 * s * b * h + 5 * a * s * s * b - (2 * s * b * h + 3 * a * s * s * b)
    assert no_dropout == 32 * s * b * h + 2 * a * s * s * b
    got = _layer_act(GPT, tr, ParallelConfig(micro_batch=b, flash_attention=False))
    assert got == no_dropout + stats
    # tensor parallel without SP: 10sbh + 24sbh/t + 5as²b/t less dropout (2sbh, 3as²b/t)
    t = 2
    got = _layer_act(GPT, tr, ParallelConfig(tp=t, micro_batch=b, flash_attention=False))
    assert got == 8 * s * b * h + 24 * s * b * h // t + 2 * a * s * s * b // t + stats
    # with sequence parallelism everything is divided by t (norm statistics too)
    tr_sp = _train(global_batch=2, seq_len=s, precision="fp16", flash_attention=False)
    got = _layer_act(GPT, tr_sp, ParallelConfig(tp=t, micro_batch=b, flash_attention=False,
                                                 sequence_parallel=True))
    assert got == (32 * s * b * h + 2 * a * s * s * b + stats) // t
    # selective recompute drops the s² term and keeps Q, K, V and the attention output
    got = _layer_act(GPT, tr, ParallelConfig(micro_batch=b, recompute="selective",
                                             flash_attention=False))
    assert got == 32 * s * b * h + stats
    # full recompute keeps only the layer input: 2sbh
    got = _layer_act(GPT, tr, ParallelConfig(micro_batch=b, recompute="full"))
    assert got == 2 * s * b * h


def test_flash_attention_keeps_logsumexp_instead_of_s2() -> None:
    s, b, h, a = 128, 2, 64, 4
    tr = _train(global_batch=2, seq_len=s, precision="fp16")
    got = _layer_act(GPT, tr, ParallelConfig(micro_batch=b))
    stats = 2 * 2 * (s * b) * 2
    # 32sbh less nothing: Q,K,V 6sbh + kernel output 2sbh + re-laid output 2sbh, plus lse
    assert got == 34 * s * b * h + 4 * a * s * b + stats


def test_gqa_and_swiglu_counts() -> None:
    s, b = 256, 1
    h, kv, f = 64, 2 * 8, 176  # kv width = 2 heads · head_dim 8
    tr = _train(global_batch=1, seq_len=s)
    got = _layer_act(LLAMA, tr, ParallelConfig(micro_batch=b))
    # norms 4h·2B, rstd 2·4B, Q h, K/V kv each, kernel out h, re-laid out h, lse 8 heads fp32,
    # SwiGLU gate/up/product 3f
    expect = s * b * (4 * h * 2 + 2 * 4 + (3 * h + 2 * kv) * 2 + 4 * 8 + 3 * f * 2)
    assert got == expect


def test_one_f_one_b_in_flight() -> None:
    per = {}
    for gb in (8, 1):
        b = estimate_stage(GPT, _train(global_batch=gb, optimizer="sgd"),
                           ParallelConfig(pp=2, micro_batch=1, recompute="full"), 0)
        per[gb] = b.activations
    # stage 0 of 2 holds min(m, 2) micro-batches: 2 with m=8, 1 with m=1
    assert per[8] == 2 * per[1]
    from predictor.measure import in_flight

    assert in_flight(ParallelConfig(pp=4), _train(global_batch=8), 1) == 3
    assert in_flight(ParallelConfig(pp=4), _train(global_batch=2), 0) == 2


def test_logits_on_the_last_stage() -> None:
    s, b, t, V = 128, 2, 2, 1000
    tr = _train(global_batch=2, seq_len=s)
    last = estimate_stage(LLAMA, tr, ParallelConfig(tp=t, pp=2, micro_batch=b), 1)
    assert last.logits == 6 * s * b * V // t  # fp32 4·s·b·V/t + the bf16 copy
    tr32 = _train(global_batch=2, seq_len=s, precision="fp32")
    last32 = estimate_stage(LLAMA, tr32, ParallelConfig(tp=t, pp=2, micro_batch=b), 1)
    assert last32.logits == 4 * s * b * V // t
    first = estimate_stage(LLAMA, tr, ParallelConfig(tp=t, pp=2, micro_batch=b), 0)
    assert first.logits == 0


def test_frenzy_formula_by_hand() -> None:
    m = GPT
    tr = _train(global_batch=8, seq_len=128)
    par = ParallelConfig(tp=2, dp=2, micro_batch=1)
    W = 1000 * 64 + 2 * (12 * 64 * 64 + 13 * 64)
    b = 8 / 2
    expect = 20 * W / 2 + 128 * b * 64 * 2 * (10 + 24 / 2 + 5 * 4 * 128 / (64 * 2))
    assert frenzy_memory(m, tr, par) == int(expect)


def test_overhead_and_breakdown_properties() -> None:
    gpu = GpuType("X", 1 << 34, 1.0, 1.0, 1.0, 1.0, "pcie", 1.0, 1.0, "test",
                  cuda_context_bytes=123)
    mem = estimate_memory(LLAMA, _train(), ParallelConfig(), gpu)
    assert isinstance(mem, MemoryBreakdown)
    assert mem.overhead == 123 and mem.total == mem.tensors + 123
    d = mem.as_dict()
    assert d["total"] == mem.total and d["tensors"] == mem.tensors
    assert estimate_memory(LLAMA, _train(), ParallelConfig()).overhead == 0


def test_estimate_is_fast() -> None:
    m = ModelSpec.from_name("llama-2-70b")
    tr = TrainingSpec(global_batch=64, seq_len=4096)
    par = ParallelConfig(tp=8, pp=8, dp=1, micro_batch=1, zero_stage=1,
                         sequence_parallel=True)
    n = 2000
    t0 = time.perf_counter()
    for _ in range(n):
        estimate_memory(m, tr, par)
    per_call = (time.perf_counter() - t0) / n
    assert per_call < 150e-6, per_call  # ~40-60 µs on a quiet core (two stages); CI slack


def _random_configs(n: int, seed: int):
    """Random (model, training, plan) triples over the catalog, incl. non-divisor batches."""
    import random

    from predictor.spec import MODEL_CATALOG, Recompute

    rng = random.Random(seed)
    names = sorted(MODEL_CATALOG)
    for _ in range(n):
        m = MODEL_CATALOG[rng.choice(names)]
        gb = rng.choice([4, 12, 64, 512])
        tr = _train(global_batch=gb, seq_len=rng.choice([128, 512, 1024]),
                    precision=rng.choice(["bf16", "fp32"]), optimizer=rng.choice(["adamw", "sgd"]),
                    sequence_parallel=rng.random() < 0.7, flash_attention=rng.random() < 0.7)
        tp = rng.choice([t for t in (1, 2, 4, 8) if m.num_heads % t == 0
                         and m.ffn_hidden_size % t == 0
                         and (m.num_kv_heads % t == 0 or t % m.num_kv_heads == 0)])
        pp = rng.choice([p for p in (1, 2, 3, 4, 8) if m.num_layers % p == 0])
        dp = rng.choice([d for d in (1, 2, 4) if gb % d == 0])
        par = ParallelConfig(tp=tp, pp=pp, dp=dp, micro_batch=rng.choice([1, 2, 4]),
                             recompute=rng.choice(list(Recompute)),
                             zero_stage=rng.choice([0, 1, 2, 3]),
                             sequence_parallel=rng.random() < 0.8,
                             flash_attention=rng.random() < 0.8)
        yield m, tr, par


def test_split_form_matches_estimate_memory() -> None:
    # The planner searches with static + activation terms; they must give estimate_memory's
    # tensor bytes exactly (integers), whatever the model, saver, stage count or flags.
    from predictor.memory import peak_tensors

    for m, tr, par in _random_configs(1500, seed=3):
        assert peak_tensors(m, tr, par) == estimate_memory(m, tr, par).tensors, (m.name, par)


def test_memory_never_decreases_with_the_micro_batch() -> None:
    # The planner bisects each saver's curve over the micro-batches (divisors of the
    # per-replica batch); that is only right if the peak is monotone in the micro-batch.
    from predictor.memory import activation_peaks, activation_terms, peak_tensor_curve, static_terms

    for m, tr, par in _random_configs(300, seed=4):
        per_replica = tr.global_batch // par.dp
        mbs = [b for b in range(1, per_replica + 1) if per_replica % b == 0]
        peaks = activation_peaks(
            activation_terms(m, tr, par.tp, par.pp, par.recompute, par.sequence_parallel,
                             par.flash_attention), per_replica, mbs)
        curve = peak_tensor_curve(static_terms(m, tr, par.tp, par.pp, par.dp, par.zero_stage),
                                  peaks)
        assert curve == sorted(curve)
        for b, v in zip(mbs, curve, strict=True):
            assert v == estimate_memory(m, tr, replace(par, micro_batch=b)).tensors


# -- explicit head widths and q/k norms ------------------------------------------------------
# heads of 16 over hidden 64 (Q 8 x 16 = 128 wide, K/V 2 x 16 = 32), with and without qwen3's
# per-head q/k RMSNorm
WIDE = ModelSpec("tiny-wide", Family.LLAMA, num_layers=4, hidden_size=64, num_heads=8,
                 num_kv_heads=2, ffn_hidden_size=176, vocab_size=1000, max_seq_len=256,
                 tie_embeddings=False, explicit_head_dim=16)
QWEN3 = WIDE.with_(name="tiny-qwen3", family=Family.QWEN3)


def test_wide_heads_layer_parameters_per_rank_by_hand() -> None:
    from predictor.memory import _layer_param_numels

    # tp 2: q 4 heads x 16 = 64 rows, k and v 1 head x 16; o 64 x 64; SwiGLU f/2 = 88;
    # two RMSNorms of 64 and (qwen3) q_norm, k_norm of 16, replicated
    want = [64 * 64, 16 * 64, 16 * 64, 64 * 64, 88 * 64, 64 * 88, 88 * 64, 64, 64]
    assert _layer_param_numels(WIDE, 2) == want
    assert _layer_param_numels(QWEN3, 2) == [*want, 16, 16]
    # whole layer: 64 x (128 + 2 x 32) + 128 x 64 + 3 x 64 x 176 + 2 x 64 (+ 2 x 16)
    assert WIDE.layer_params() == 20480 + 33792 + 128
    assert QWEN3.layer_params() == WIDE.layer_params() + 32
    assert sum(_layer_param_numels(QWEN3, 2)) == (20480 + 33792) // 2 + 128 + 32


def test_wide_heads_layer_activations_by_hand() -> None:
    """Per token (bf16, flash, tp 1): norms 4h x 2 B, rstd 2 x 4 B, Q 128, K/V 32 each, the
    kernel output and the re-laid output 128 each (x 2 B), lse 8 heads x 4 B, SwiGLU 3f x 2 B
    = 512 + 8 + 896 + 32 + 1056 = 2504; qwen3's q/k norms keep their inputs (128 + 32) x 2 B
    and 1/rms per head (8 + 2) x 4 B: 360 more."""
    s, b = 256, 1
    tr = _train(global_batch=1, seq_len=s)
    assert _layer_act(WIDE, tr, ParallelConfig(micro_batch=b)) == 2504 * s * b
    assert _layer_act(QWEN3, tr, ParallelConfig(micro_batch=b)) == 2864 * s * b
    # selective recompute keeps the norms' inputs (outside the recomputed core) as well
    sel = ParallelConfig(micro_batch=b, recompute="selective")
    assert _layer_act(QWEN3, tr, sel) - _layer_act(WIDE, tr, sel) == 360 * s * b


def test_qk_norm_on_the_built_in_trainer_on_the_cpu() -> None:
    """torch's composite RMSNorm (the CPU) keeps an fp32 input and an fp32 normalised input,
    8 B per element whatever the dtype, where the fused kernel keeps the bf16 input: per
    token (128 + 32) x 8 + (8 + 2) x 4 = 1320 B a layer on the CPU, 360 on CUDA."""
    from predictor.memory import activation_terms
    from predictor.runtimes import FRENZY, FRENZY_CPU

    s = 256
    tr = _train(global_batch=1, seq_len=s)
    for rt, per_token in ((FRENZY_CPU, 1320), (FRENZY, 360)):
        qwen3, wide = (activation_terms(m, tr, 1, 1, ParallelConfig().recompute, False, True,
                                        rt)[0][1] for m in (QWEN3, WIDE))
        assert qwen3 - wide == QWEN3.num_layers * per_token * s, rt.name


@pytest.mark.parametrize("name", ["qwen3-0.6b", "mistral-nemo-12b", "qwen3-8b"])
def test_split_form_agrees_for_explicit_head_widths_under_every_runtime(name: str) -> None:
    from predictor.memory import peak_tensors
    from predictor.runtimes import FRENZY_CPU, RUNTIMES
    from predictor.spec import MODEL_CATALOG

    m = MODEL_CATALOG[name]
    plans = [dict(micro_batch=2), dict(tp=2, dp=2, micro_batch=1, recompute="selective",
                                       zero_stage=2, sequence_parallel=True),
             dict(tp=8, pp=2, dp=2, micro_batch=1, recompute="full", zero_stage=1,
                  flash_attention=False),
             dict(tp=4, pp=4, micro_batch=1, zero_stage=3)]
    for rt in [*RUNTIMES.values(), FRENZY_CPU]:
        for p in plans:
            par = ParallelConfig(**p)
            for micro_batches in (1, 4):  # one micro-batch per step, and several
                tr = _train(global_batch=par.dp * par.micro_batch * micro_batches,
                            seq_len=1024, flash_attention=p.get("flash_attention", True))
                par.check(m, tr)
                assert peak_tensors(m, tr, par, rt) == estimate_memory(
                    m, tr, par, runtime=rt).tensors, (rt.name, p, micro_batches)


def test_models_with_implicit_head_width_price_as_before() -> None:
    """Figures of the catalog models from before explicit head widths existed (commit
    c867974), to the byte and to the last bit of the step time: B 8 x 512 bf16 AdamW on an
    A100-80G."""
    from predictor.gpus import get_gpu
    from predictor.runtimes import FRENZY_CPU, get_runtime
    from predictor.step_time import estimate_step_time

    tr = _train(global_batch=8, seq_len=512)
    plans = [ParallelConfig(micro_batch=2),
             ParallelConfig(tp=2, pp=2, dp=2, micro_batch=1, recompute="selective",
                            zero_stage=1, sequence_parallel=True),
             ParallelConfig(tp=4, dp=2, micro_batch=1, recompute="full", zero_stage=2,
                            flash_attention=False)]
    pinned = [("gpt2", 0, "reference", 2873414144), ("gpt2-medium", 1, "megatron", 1455436800),
              # (frenzy at pp 2, since the trainer runs pipeline stages: autocast's weight
              # copies of both micro-batches in flight on the first stage)
              # (hf-trainer since its Hugging Face terms, autocast over fp32 weights and
              # an fp32 residual stream: bert-base 354784798 and pythia-1.4b 4952342528
              # before)
              ("bert-base", 2, "hf-trainer", 377910812), ("llama-2-7b", 1, "frenzy-cpu",
                                                         29498810368),
              # (fsdp2 since its loss follows torchtitan's: the head's backward holds only
              # the bf16 logits' gradient, 2 bytes per logit, not 6: 4 x 512 x 32064 less)
              ("llama-3-8b", 2, "fsdp2", 20585891840 - 4 * 512 * 32064), ("mistral-7b", 1,
                                                                          "reference",
                                                         22943703040),
              ("qwen2-7b", 0, "frenzy-cpu", 146574548992),
              ("qwen2-7b", 2, "megatron", 19545735168),
              ("pythia-1.4b", 1, "hf-trainer", 5961146368)]
    for name, i, rt_name, tensors in pinned:
        rt = FRENZY_CPU if rt_name == "frenzy-cpu" else get_runtime(rt_name)
        got = estimate_memory(ModelSpec.from_name(name), tr, plans[i], runtime=rt).tensors
        assert got == tensors, (name, i, rt_name)
    gpu = get_gpu("A100-80G")
    for name, i, rt_name, total in [("llama-3-8b", 1, "frenzy", 0.23791804134631936),
                                    ("qwen2-7b", 2, "megatron", 0.42205395425890235),
                                    ("gpt2", 0, "frenzy", 0.13234655136567397)]:
        got = estimate_step_time(ModelSpec.from_name(name), tr, plans[i], gpu, runtime=rt_name)
        assert got.total_s == total, (name, i, rt_name)
