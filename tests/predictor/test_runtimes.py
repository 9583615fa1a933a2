"""Runtime profiles: each knob changes the predicted bytes by the amount worked out by hand."""

from __future__ import annotations

from dataclasses import replace

import pytest

from predictor.errors import SpecError
from predictor.gpus import GIB, get_gpu
from predictor.memory import MemoryBreakdown, _logit_bytes, estimate_memory, peak_tensors
from predictor.overhead import NON_TENSOR, NonTensorModel
from predictor.planner import plan_job
from predictor.runtimes import FRENZY, FRENZY_CPU, MEGATRON, REFERENCE, RUNTIMES, get_runtime
from predictor.spec import ModelSpec, ParallelConfig, Recompute, TrainingSpec

GPT = ModelSpec(name="g", family="gpt2", num_layers=2, hidden_size=64, num_heads=4,
                vocab_size=1000, max_seq_len=64)
LLAMA = ModelSpec(name="l", family="llama", num_layers=2, hidden_size=64, num_heads=4,
                  num_kv_heads=4, ffn_hidden_size=128, vocab_size=1024, max_seq_len=64,
                  tie_embeddings=False)


def _train(s: int = 32, B: int = 2, **kw) -> TrainingSpec:
    return TrainingSpec(global_batch=B, seq_len=s, **kw)


def test_korthikanti_per_layer_activations_under_megatron() -> None:
    # Korthikanti et al. 2022, eq. (1): 34·s·b·h + 5·a·s²·b bytes per layer (fp16, t = 1,
    # no flash, with dropout), plus the two LayerNorms' statistics (2 · 2·s·b·2 bytes) that
    # the paper leaves out. One extra layer adds exactly that.
    s, b, h, a = 32, 2, 64, 4
    train = _train(s, b, flash_attention=False)
    par = ParallelConfig(micro_batch=b, flash_attention=False)
    two = estimate_memory(GPT, train, par, runtime=MEGATRON)
    three = estimate_memory(GPT.with_(num_layers=3), train, par, runtime=MEGATRON)
    assert three.activations - two.activations == 34 * s * b * h + 5 * a * s * s * b + 8 * s * b
    # the reference build (and the built-in trainer) keep no dropout: 32·s·b·h + 2·a·s²·b
    # (+ statistics)
    two_f = estimate_memory(GPT, train, par)
    three_f = estimate_memory(GPT.with_(num_layers=3), train, par)
    assert three_f.activations - two_f.activations == 32 * s * b * h + 2 * a * s * s * b + 8 * s * b


def test_dropout_masks_with_flash_attention() -> None:
    # flash regenerates the attention dropout: only the two residual masks per layer (1 byte
    # per element) and the embedding mask remain: (2·2 + 1)·s·b·h bytes for 2 layers.
    s, b, h = 32, 2, 64
    par = ParallelConfig(micro_batch=b)
    on = estimate_memory(GPT, _train(s, b), par, runtime=MEGATRON)
    off = estimate_memory(GPT, _train(s, b), par, runtime=MEGATRON.with_overrides(dropout=0.0))
    assert on.activations - off.activations == 5 * s * b * h


def test_megatron_pads_the_vocabulary_to_128_tp() -> None:
    assert MEGATRON.padded_vocab(50257, 1) == 50304
    assert MEGATRON.padded_vocab(50257, 2) == 50432  # 197 · 256
    assert REFERENCE.padded_vocab(50257, 2) == 50257
    train, par = _train(), ParallelConfig(micro_batch=2)
    m = GPT.with_(vocab_size=1000)  # padded to 1024: 24 more rows of h = 64 (tied)
    mega = estimate_memory(m, train, par, runtime=MEGATRON.with_overrides(dropout=0.0))
    base = estimate_memory(m, train, par, runtime=MEGATRON.with_overrides(dropout=0.0,
                                                                          vocab_pad=1))
    assert mega.parameters - base.parameters == 2 * 24 * 64  # bf16 weights


def test_pure_bf16_is_eight_bytes_per_parameter() -> None:
    rt = get_runtime("torchtune").with_overrides(optimizer_foreach=False)
    mem = estimate_memory(LLAMA, _train(), ParallelConfig(micro_batch=2), runtime=rt)
    assert mem.parameters + mem.gradients + mem.optimizer_states == 8 * LLAMA.num_params()


def test_fsdp2_keeps_fp32_shards_gathered_blocks_and_the_root() -> None:
    dp = 4
    rt = get_runtime("fsdp2")
    par = ParallelConfig(dp=dp, micro_batch=1, zero_stage=3)
    mem = estimate_memory(LLAMA, _train(B=4), par, runtime=rt)
    n = LLAMA.num_params()  # every tensor of LLAMA divides by 4
    root = LLAMA.embedding_params() + LLAMA.head_params()
    assert mem.gradients == 4 * n // dp and mem.optimizer_states == 8 * n // dp
    # fp32 shards + bf16 running and prefetched block + bf16 unsharded root
    assert mem.parameters == 4 * n // dp + 2 * 2 * LLAMA.layer_params() + 2 * root


def test_foreach_adam_temporary_is_the_whole_shard() -> None:
    big = LLAMA.with_(hidden_size=256, num_heads=4, num_kv_heads=4, ffn_hidden_size=512)
    train, par = _train(s=8, B=1), ParallelConfig(micro_batch=1)
    rt = get_runtime("hf-trainer").with_overrides(dropout=0.0)
    mem = estimate_memory(big, train, par, runtime=rt)
    assert mem.transient == 4 * big.num_params() and mem.activations == 0
    loop = estimate_memory(big, train, par, runtime=rt.with_overrides(optimizer_foreach=False))
    assert loop.transient < mem.transient


def test_ddp_buckets_and_classification_head() -> None:
    rt = get_runtime("hf-trainer").with_overrides(optimizer_foreach=False)
    par = ParallelConfig(dp=2, micro_batch=1)
    mem = estimate_memory(LLAMA, _train(), par, runtime=rt)
    one = estimate_memory(LLAMA, _train(), ParallelConfig(micro_batch=1), runtime=rt)
    # DDP's fp32 buckets beside param.grad: with the gradients set to None between steps
    # (the Trainer's zero_grad) they persist with the weights: 4 bytes per parameter more
    n = LLAMA.num_params()
    assert mem.parameters - one.parameters == 4 * n
    kept = get_runtime("hf-trainer").with_overrides(optimizer_foreach=False,
                                                    grads_set_to_none=False)
    assert estimate_memory(LLAMA, _train(), par, runtime=kept).gradients == 2 * 4 * n
    cls = estimate_memory(LLAMA, _train(), par,
                          runtime=rt.with_overrides(classification_head=True))
    assert cls.logits == 0


def test_relu_keeps_one_mlp_tensor() -> None:
    # GeLU keeps fc1's output and the GeLU output (2·f·T·D), ReLU only its output (f·T·D)
    s, b = 32, 2
    par, train = ParallelConfig(micro_batch=b), _train(s, b)
    gelu = estimate_memory(GPT, train, par)
    relu = estimate_memory(GPT.with_(activation="relu"), train, par)
    assert gelu.activations - relu.activations == 2 * 256 * s * b * 2  # 2 layers, f = 4h


@pytest.mark.parametrize("name", sorted(RUNTIMES))
@pytest.mark.parametrize("cfg", [
    dict(tp=2, pp=2, dp=2, micro_batch=1, zero_stage=1, recompute="selective"),
    dict(tp=1, pp=1, dp=4, micro_batch=2, zero_stage=3),
    dict(tp=2, pp=1, dp=1, micro_batch=4, recompute="full", flash_attention=False),
])
def test_split_form_agrees_with_estimate_for_every_runtime(name: str, cfg: dict) -> None:
    m = ModelSpec.from_name("gpt2-medium")
    train = _train(s=512, B=16, flash_attention=cfg.get("flash_attention", True))
    par = ParallelConfig(**cfg, sequence_parallel=True)
    rt = get_runtime(name)
    assert peak_tensors(m, train, par, rt) == estimate_memory(m, train, par, runtime=rt).tensors


@pytest.mark.parametrize("cfg", [
    dict(tp=2, pp=2, dp=2, micro_batch=1, zero_stage=3, recompute="selective"),
    dict(tp=1, pp=1, dp=8, micro_batch=2, zero_stage=3, recompute="selective"),
    dict(tp=4, pp=1, dp=2, micro_batch=2, zero_stage=0, recompute="selective",
         sequence_parallel=False),
])
def test_split_form_agrees_under_torchtitans_op_sac(cfg: dict) -> None:
    # a llama layout (separate q/k/v matmuls, SwiGLU) under fsdp2's per-op SAC and its loss
    m = ModelSpec.from_name("llama-3-8b")
    train = _train(s=1024, B=16)
    par = ParallelConfig(**{"sequence_parallel": True, **cfg})
    rt = get_runtime("fsdp2")
    assert peak_tensors(m, train, par, rt) == estimate_memory(m, train, par, runtime=rt).tensors


def test_unknown_runtime_and_override_name_what_fits() -> None:
    with pytest.raises(SpecError) as e:
        get_runtime("megatorn")
    assert e.value.field == "runtime" and "megatron" in e.value.reason
    with pytest.raises(SpecError) as e:
        MEGATRON.with_overrides(drop_out=0.1)
    assert e.value.field == "runtime.drop_out" and "hidden_dropout" in e.value.reason


@pytest.mark.parametrize(("written", "profile"), [
    ("Megatron-LM", "megatron"), ("megatron_core", "megatron"), ("torchtitan", "fsdp2"),
    ("Megatron-DeepSpeed", "deepspeed"), ("HF Trainer", "hf-trainer"),
    ("transformers", "hf-trainer"), ("Colossal-AI", "colossalai"), ("DeepSpeed", "deepspeed"),
    ("accelerate", "hf-trainer"), ("TRL", "hf-trainer"), ("ms-swift", "hf-trainer"),
    ("LLaMA-Factory", "hf-trainer"), ("axolotl", "hf-trainer"), ("PyTorch Lightning", "hf-trainer"),
    ("NeMo", "megatron"), ("DeepSpeed-Chat", "deepspeed"),
])
def test_runtime_aliases_name_their_profile(written: str, profile: str) -> None:
    assert get_runtime(written).name == profile


def test_fsdp1_is_not_read_as_fsdp2() -> None:
    with pytest.raises(SpecError) as e:
        get_runtime("fsdp")
    assert "fsdp2" in e.value.reason


def test_non_tensor_budget_inverts_the_device_figure() -> None:
    nt = NonTensorModel(slack_fraction=0.04, slack_bytes=0, nccl_bytes=512 << 20,
                        workspace_bytes=64 << 20)
    gpu = get_gpu("A100-80G")
    budget = nt.budget(gpu.memory_bytes, gpu, 8, 0.13)
    mem = nt.fill(MemoryBreakdown(int(budget), 0, 0, 0, 0, 0), gpu, 8)
    assert abs(mem.device - gpu.memory_bytes * 0.87) < 2
    assert mem.device == mem.reserved + gpu.cuda_context_bytes + (512 << 20)
    assert mem.reserved == mem.tensors + int(0.04 * mem.tensors)


def test_planner_prices_plans_for_the_named_runtime() -> None:
    model = ModelSpec.from_name("gpt2-medium")
    train = _train(s=1024, B=16, steps=10)
    gpus = [get_gpu("A100-40G")]
    mega = plan_job(model, train, gpus, max_gpus=4, runtime="megatron")
    assert mega.plans and all(p.runtime == "megatron" for p in mega.plans)
    for p in mega.plans:
        again = estimate_memory(model, train, p.parallel, runtime=MEGATRON)
        assert p.memory.tensors == again.tensors + NON_TENSOR.workspace_bytes
        assert p.required_bytes <= 40 * GIB
    frenzy = plan_job(model, train, gpus, max_gpus=4)
    assert all(p.runtime == "frenzy" for p in frenzy.plans)


def test_recompute_keeps_only_layer_inputs_for_every_runtime() -> None:
    # under full recomputation dropout masks are regenerated: megatron == no-dropout megatron
    train = _train()
    par = ParallelConfig(micro_batch=2, recompute=Recompute.FULL)
    on = estimate_memory(GPT, train, par, runtime=MEGATRON)
    off = estimate_memory(GPT, train, par, runtime=replace(MEGATRON, hidden_dropout=False,
                                                            attention_dropout=False))
    # only the embedding mask (h·T = 64·64 bytes) and the recomputed layer's masks differ
    assert 0 < on.tensors - off.tensors <= 64 * 64 + 2 * 64 * 64 + 4 * 32 * 64 * 3


def test_built_in_trainer_profile_keeps_fp32_weights_and_a_vocab_parallel_head() -> None:
    # orchestrator/trainer: fp32 weights (the master), fp32 grads, AdamW m and v: 4 + 4 + 8
    # = 16 B/param at tp = 1, with no separate master (two micro-batches per step: the
    # second runs beside every gradient); autocast's bf16 weight copies count with the
    # activations (they live from the forward to the backward)
    par = ParallelConfig(micro_batch=1)
    mem = estimate_memory(LLAMA, _train(), par, runtime=FRENZY)
    n = LLAMA.num_params()
    assert (mem.parameters, mem.gradients, mem.optimizer_states) == (4 * n, 4 * n, 8 * n)
    # tp = 2: the layers split, and so do the embedding and the untied head (1024·64 each)
    # by vocabulary rows (512 per rank); the final norm does not
    tp2 = estimate_memory(LLAMA, _train(), ParallelConfig(tp=2, micro_batch=1), runtime=FRENZY)
    # per layer: half of 4·h² + 3·h·f, both norms whole; half the embedding and the head
    per_rank = 2 * (4 * 64 * 64 // 2 + 3 * 64 * 128 // 2 + 2 * 64) + 512 * 64 + 64 + 512 * 64
    assert tp2.gradients == 4 * per_rank == 4 * 106816
    # the replicated head it ran with before (benchmarks.trainer_cuda's older rows)
    rep = estimate_memory(LLAMA, _train(), ParallelConfig(tp=2, micro_batch=1),
                          runtime=FRENZY.with_overrides(vocab_parallel=False))
    assert rep.gradients == 4 * (41216 + 1024 * 64 + 64 + 1024 * 64) == 4 * 172352


def test_planner_offers_only_what_the_runtime_executes() -> None:
    # gpt2-medium, batch 32 x 1024 on 8 A100-40G: the whole space has pipelined plans; a
    # trainer profile that runs none (every ZeRO stage) gets none of them, and the result
    # says so. The built-in trainer (pipeline stages under 1F1B), Megatron and the reference
    # build keep them.
    model = ModelSpec.from_name("gpt2-medium")
    train = _train(s=1024, B=32, steps=10)
    gpus = [get_gpu("A100-40G"), get_gpu("RTX2080Ti")]
    narrow = plan_job(model, train, gpus, max_gpus=8, keep_all=True,
                      runtime=replace(FRENZY, max_pp=1))
    assert narrow.plans
    assert {p.parallel.pp for p in narrow.plans} == {1}
    assert narrow.notes == ("runtime frenzy executes pp=1; plans needing more were not "
                            "considered (name another runtime, or give an entrypoint, to "
                            "plan them)",)
    # the built-in trainer runs pipelines, but its profile has them searched only when no
    # single-stage plan fits: here one does, and the note says so
    frenzy = plan_job(model, train, gpus, max_gpus=8, keep_all=True)
    assert {p.parallel.pp for p in frenzy.plans} == {1}
    assert frenzy.notes == ("runtime frenzy searches pipeline stages only when no "
                            "single-stage plan fits any GPU type",)
    piped = plan_job(model, train, gpus, max_gpus=8, keep_all=True,
                     runtime=replace(FRENZY, pp_when_needed=False))
    assert {p.parallel.pp for p in piped.plans} > {1} and piped.notes == ()
    for name in ("megatron", "reference"):
        other = plan_job(model, train, gpus, max_gpus=8, keep_all=True, runtime=name)
        assert {p.parallel.pp for p in other.plans} > {1}
        assert {p.parallel.zero_stage for p in other.plans} > {0}
        assert other.notes == ()
    # the unrestricted built-in profile searches the whole space with the same memory terms
    whole = plan_job(model, train, gpus, max_gpus=8, keep_all=True, runtime=FRENZY.unrestricted())
    assert {p.parallel.pp for p in whole.plans} > {1} and whole.notes == ()
    assert all(p.runtime == "frenzy" for p in whole.plans)


def test_a_model_that_needs_zero_3_fits_the_built_in_trainer_only_with_it() -> None:
    # llama-2-13b on 11 GiB cards: its fp32 weights and their bf16 copies, 6 B x 13e9 / 8 tp
    # ranks, nearly fill one, so only ZeRO-3 over dp or a pipeline can fit it: without
    # pipeline stages the trainer's ZeRO-3 shards the layers' fp32 weights over dp (14.7 GiB
    # with ZeRO-2 over dp = 8 and full recomputation), and without ZeRO-3 either the reason
    # names the runtime; with pipelines and ZeRO up to 2 only (no single-stage plan fits, so
    # the built-in profile searches pipelines), pipelines of 4, 5 or 8 stages fit.
    model = ModelSpec.from_name("llama-2-13b")
    train = _train(s=512, B=16, steps=10)
    gpus = [get_gpu("RTX2080Ti")]
    flat = replace(FRENZY, max_pp=1)
    result = plan_job(model, train, gpus, max_gpus=64, runtime=flat)
    assert result.plans
    assert all(p.parallel.zero_stage == 3 and p.parallel.pp == 1 for p in result.plans)
    default = plan_job(model, train, gpus, max_gpus=64)  # ZeRO-3 fits: no pipeline searched
    assert default.plans and all(p.parallel.pp == 1 for p in default.plans)
    piped = plan_job(model, train, gpus, max_gpus=64,
                     runtime=replace(FRENZY, zero_stages=(0, 1, 2)))
    assert piped.plans and all(p.parallel.pp >= 4 for p in piped.plans)
    assert piped.notes == ("runtime frenzy executes ZeRO-1/2 only; plans needing more were "
                           "not considered (name another runtime, or give an entrypoint, to "
                           "plan them)", "runtime frenzy: no single-stage plan fits any GPU "
                           "type, so pipeline stages were searched")
    upto2 = plan_job(model, train, gpus, max_gpus=64,
                     runtime=replace(flat, zero_stages=(0, 1, 2)))
    assert not upto2.plans
    assert "runtime frenzy executes pp=1 and ZeRO-1/2 only" in upto2.infeasible
    assert plan_job(model, train, gpus, max_gpus=64, runtime="reference").plans


def test_execution_fields_are_validated_and_not_overridable() -> None:
    assert FRENZY.max_pp == 0 and FRENZY.zero_stages == (0, 1, 2, 3)
    assert REFERENCE.executes == "" and FRENZY.executes == ""
    assert FRENZY.excluded_note() is None
    flat = replace(FRENZY, max_pp=1)
    assert flat.executes == "pp=1"
    assert replace(flat, zero_stages=(0, 1, 2)).executes == "pp=1 and ZeRO-1/2 only"
    assert replace(flat, zero_stages=(0,)).executes == "pp=1 and no ZeRO"
    assert replace(REFERENCE, max_pp=4, zero_stages=(0, 1)).executes == "pp<=4 and ZeRO-1 only"
    for key, value in (("zero_stages", [0, 1]), ("max_pp", 2)):
        with pytest.raises(SpecError) as e:
            FRENZY.with_overrides(**{key: value})
        assert e.value.field == f"runtime.{key}" and "not a per-job override" in e.value.reason
    for bad in ((1, 2), (0, 0), (0, 4), (2, 0), [0]):
        with pytest.raises(SpecError) as e:
            replace(REFERENCE, zero_stages=bad)
        assert e.value.field == "runtime.zero_stages" and "includes 0" in e.value.reason
    for bad in (-1, True, 1.5):
        with pytest.raises(SpecError) as e:
            replace(REFERENCE, max_pp=bad)
        assert e.value.field == "runtime.max_pp"


def test_unsupported_names_the_field_and_what_would_fit() -> None:
    assert FRENZY.unsupported(1, 0) is None and REFERENCE.unsupported(8, 3) is None
    assert FRENZY.unsupported(8, 3) is None  # the built-in trainer runs pipelines and ZeRO
    flat = replace(FRENZY, max_pp=1)
    assert flat.unsupported(2, 0) == ("parallel.pp=2: runtime frenzy executes pipelines of "
                                      "at most 1 stage; choose a plan with pp<=1")
    assert FRENZY.unsupported(1, 2) is None and FRENZY.unsupported(1, 3) is None
    upto2 = replace(FRENZY, zero_stages=(0, 1, 2))
    assert upto2.unsupported(1, 3) == ("parallel.zero_stage=3: runtime frenzy executes ZeRO "
                                       "stages 0, 1, 2; choose a plan with one of those")


def test_memory_spec_rejects_execution_fields_as_runtime_options() -> None:
    from predictor.memory_spec import RUNTIME_OPTIONS, parse_memory_spec

    assert "max_pp" not in RUNTIME_OPTIONS and "zero_stages" not in RUNTIME_OPTIONS
    with pytest.raises(SpecError) as e:
        parse_memory_spec({"model": "gpt2", "global_batch": 2, "seq_len": 128,
                    "runtime_options": {"zero_stages": [0, 1]}})
    assert e.value.field == "runtime_options.zero_stages"


def test_built_in_trainer_frees_gradients_between_steps() -> None:
    # zero_grad(set_to_none=True): with one micro-batch per step no gradient exists at the
    # loss; with two, the second micro-batch's loss runs beside all 4·n bytes of fp32 grads.
    # Tiny llama (h 64, V 1024), s 512, b 4: the loss backward holds 14 B per logit (bf16
    # logits 2 + log_softmax output 4 + its gradient 4 + the input gradient 4), T·V =
    # 2048·1024 logits, which outweighs every other moment of either step.
    s, b = 512, 4
    one = estimate_memory(LLAMA, _train(s, b), ParallelConfig(micro_batch=b), runtime=FRENZY)
    two = estimate_memory(LLAMA, _train(s, 2 * b), ParallelConfig(micro_batch=b),
                          runtime=FRENZY)
    n = LLAMA.num_params()
    assert (one.gradients, one.logits, one.transient) == (0, 14 * b * s * 1024, 0)
    assert (two.gradients, two.logits) == (4 * n, 14 * b * s * 1024)
    assert two.tensors - one.tensors == 4 * n
    # fp32: the logits are fp32 already, 16 B per logit at the loss backward
    fp32 = estimate_memory(LLAMA, _train(s, b, precision="fp32"),
                           ParallelConfig(micro_batch=b), runtime=FRENZY)
    assert fp32.logits == 16 * b * s * 1024


def test_built_in_trainer_casts_only_the_matmul_weights() -> None:
    # autocast copies (2 B) of what a matmul reads: per layer Q, K, V, O (4·64²) and gate,
    # up, down (3·64·128) = 40960 elements, and the untied head 1024·64; not the embedding
    # or the norms. Full recomputation drops the layers' copies with their activations; the
    # head's stay (the recomputed layer's return during its backward, beside the working set).
    from predictor.memory import _autocast_copies

    assert _autocast_copies(LLAMA, 1, 1, 0, 2, 2, FRENZY, False) == (
        2 * (2 * 40960 + 65536), 2 * 40960)
    assert _autocast_copies(LLAMA, 1, 1, 0, 2, 2, FRENZY, True) == (2 * 65536, 2 * 40960)
    # 2 tokens, one micro-batch: the peak is the embedding's backward, the last, every
    # gradient (4·n) made and every layer's activations and copies gone: left are the token
    # ids and labels (8 B each per token), the fp32 gradient flowing into the embedding
    # (4·64 B per token) and the bf16 logits the loop holds (2·2·1024); the fused optimizer
    # step adds nothing to 16·n. (The trainer's own step under fake tensors,
    # benchmarks.trainer_memory, peaks at 3,417,724 B: 92 B above this count.)
    n = LLAMA.num_params()
    big = estimate_memory(LLAMA, _train(s=2, B=1), ParallelConfig(micro_batch=1),
                          runtime=FRENZY_CPU)
    assert (big.gradients, big.logits) == (4 * n, 2 * 2 * 1024)
    assert big.activations == (8 + 8 + 4 * 64) * 2


def test_built_in_trainer_peak_counted_by_hand() -> None:
    # Tiny llama (2 layers, h 64, 4 heads of 16, no GQA, SwiGLU f 128, V 1024, untied),
    # bf16, flash, s 512, micro-batch 4: T = 2048 tokens. Bytes kept, counted by hand:
    # per layer: norm inputs and outputs 4·h·T·2 = 512T, RMSNorm statistics 2·4T = 8T,
    #   Q, K, V, kernel output, re-laid output 5·64·T·2 = 640T + logsumexp 4·4T = 16T,
    #   SwiGLU's gate, SiLU, up, product 4·128·T·2 = 1024T, each RMSNorm's fp32
    #   normalised input 2·64·T·4 = 512T, the fp32 norm inputs' 2 more bytes 2·64·T·2 =
    #   256T, the three extra autocast casts of the norm outputs (K, V, up) 3·64·T·2 = 384T
    #   -> 3352T;
    # per micro-batch: the stage output 64·T·4 = 256T, token ids and labels 8T + 8T, the
    #   final norm's output 128T, statistics 4T and fp32 normalised input 256T -> 660T;
    # rotary tables 2·s·16·2 = 64·s; autocast's weight copies 2·(2·40960 + 1024·64);
    # the loss backward: 14 bytes per logit, 14·T·1024.
    # Static: fp32 weights 4·n and AdamW's m, v 8·n; the gradients only with m >= 2.
    # That is the trainer on the CPU (FRENZY_CPU). On CUDA torch's fused RMSNorm keeps no
    # normalised input: 512T less per layer and 256T less per micro-batch.
    s, b = 512, 4
    T = b * s
    n = LLAMA.num_params()
    for runtime, layer, stage in ((FRENZY_CPU, 3352, 660), (FRENZY, 2840, 404)):
        act = 2 * layer * T + stage * T + 64 * s + 2 * (2 * 40960 + 1024 * 64)
        one = estimate_memory(LLAMA, _train(s, b), ParallelConfig(micro_batch=b),
                              runtime=runtime)
        assert one.tensors == 12 * n + act + 14 * T * 1024
        two = estimate_memory(LLAMA, _train(s, 2 * b), ParallelConfig(micro_batch=b),
                              runtime=runtime)
        assert two.tensors == 16 * n + act + 14 * T * 1024


def test_built_in_trainer_prices_its_vocab_parallel_loss_on_the_largest_shard() -> None:
    # 1001 rows over tp = 2: the trainer's rank 0 holds 501 (no padding), T = 4·64 = 256
    # tokens. bf16 at tp = 1: F.cross_entropy's backward, 14 bytes per logit of all 1001
    # rows; at tp = 2 the vocab-parallel loss's backward: bf16 logits 2 + the fp32 softmax
    # made the gradient in place 4 + its bf16 copy 2 = 8 bytes per logit of the shard
    model = replace(LLAMA, vocab_size=1001)
    train = _train(s=64, B=4)
    mem = {tp: estimate_memory(model, train, ParallelConfig(tp=tp, micro_batch=4),
                               runtime=FRENZY) for tp in (1, 2)}
    assert mem[1].logits == 14 * 256 * 1001
    assert mem[2].logits == 8 * 256 * 501
    # the same trainer before the split (replicated head, F.cross_entropy at any tp)
    rep = estimate_memory(model, train, ParallelConfig(tp=2, micro_batch=4),
                          runtime=FRENZY.with_overrides(vocab_parallel=False))
    assert rep.logits == 14 * 256 * 1001
    # fp32: logits 4 + the softmax turned into the gradient 4 = 8 at the loss's backward,
    # and the same 8 at the head's matmul backward beside its weight gradient (501·64·4)
    # and input gradient (64·256·4), which is the peak
    fp32 = estimate_memory(model, _train(s=64, B=4, precision="fp32"),
                           ParallelConfig(tp=2, micro_batch=4), runtime=FRENZY)
    assert (fp32.logits, fp32.transient) == (8 * 256 * 501, 501 * 64 * 4 + 64 * 256 * 4)
    assert [_logit_bytes(FRENZY, mixed, fwd, 2) for mixed in (True, False)
            for fwd in (True, False)] == [6, 8, 8, 8]
    assert [_logit_bytes(FRENZY, mixed, fwd, 1) for mixed in (True, False)
            for fwd in (True, False)] == [10, 14, 8, 16]


def test_full_recompute_keeps_the_built_in_trainers_fp32_residual_per_layer() -> None:
    # each recomputed layer keeps only its input: under autocast the built-in trainer's
    # residual stream is fp32, 64·256·4 bytes per layer at T = 256; a bf16 stream (the
    # reference build) keeps 64·256·2
    def per_layer(rt: object) -> int:
        a, b = (estimate_memory(replace(LLAMA, num_layers=n), _train(s=64, B=4),
                                ParallelConfig(micro_batch=4, recompute="full"), runtime=rt)
                for n in (3, 4))
        return b.activations - a.activations

    assert per_layer(FRENZY) == 64 * 256 * 4
    assert per_layer(REFERENCE) == 64 * 256 * 2


def test_deepspeed_zero_reduces_through_its_contiguous_bucket() -> None:
    # DeepSpeed's ZeRO optimizers allocate reduce_bucket_size elements of the model's dtype
    # (5e8 by default) whatever the model's size: ZeRO-1/2 one (two with overlap_comm) at
    # every backward, ZeRO-3 one at start; ZeRO-0 (no ZeRO optimizer) none
    rt = get_runtime("deepspeed").with_overrides(dropout=0.0)
    train = _train(B=4)
    n = LLAMA.num_params()

    def grads(zero: int, profile=rt) -> int:
        par = ParallelConfig(dp=2, micro_batch=2, zero_stage=zero)
        return estimate_memory(LLAMA, train, par, runtime=profile).gradients

    assert grads(0) == 2 * n  # fp16/bf16 gradients, no bucket
    assert grads(2) == 2 * n // 2 + 2 * 500_000_000
    assert grads(2, rt.with_overrides(overlap_comm=True)) == 2 * n // 2 + 2 * 2 * 500_000_000
    lightning = rt.with_overrides(reduce_bucket_elems=200_000_000, overlap_comm=True)
    assert grads(3, lightning) == 2 * n // 2 + 2 * 200_000_000


def test_deepspeed_zero3_keeps_the_last_layers_within_its_reuse_distance() -> None:
    # stage3_max_reuse_distance: a layer j places from the forward's end is used again after
    # about 2·j layers' parameters, so reuse // (2·layer) layers stay gathered (at least the
    # running and the prefetched one)
    rt = get_runtime("deepspeed").with_overrides(dropout=0.0, reduce_bucket_elems=0)
    m = LLAMA.with_(num_layers=12)
    lay = m.layer_params()
    par = ParallelConfig(dp=4, micro_batch=1, zero_stage=3)

    def params(reuse: int) -> int:
        return estimate_memory(m, _train(B=4), par,
                               runtime=rt.with_overrides(zero3_reuse_elems=reuse)).parameters

    assert params(0) - params(2 * 2 * lay) == 0  # two layers either way
    assert params(2 * 5 * lay + 1) - params(0) == 2 * 3 * lay  # five kept: three more, fp16
    assert params(10**12) - params(0) == 2 * 10 * lay  # at most every layer


def test_the_builtin_trainer_plans_only_the_mlp_it_builds() -> None:
    # a ReLU gpt2 (OPT's MLP) is priced for runtimes that run the model's own code, not for
    # the built-in trainer (which builds gpt2's GeLU MLP): the planner refuses by the field,
    # and the simulator's unrestricted variant, which plans hypothetical jobs, does not
    relu = ModelSpec(name="opt-like", family="gpt2", num_layers=2, hidden_size=64,
                     num_heads=4, vocab_size=256, max_seq_len=64, activation="relu")
    train = TrainingSpec(global_batch=8, seq_len=64)
    gpus = [get_gpu("A100-80G")]
    with pytest.raises(SpecError) as e:
        plan_job(relu, train, gpus, max_gpus=1)
    assert e.value.field == "activation" and "gelu" in e.value.reason
    assert plan_job(relu, train, gpus, max_gpus=1, runtime="hf-trainer").plans
    assert plan_job(relu, train, gpus, max_gpus=1, runtime=FRENZY.unrestricted()).plans
    own = relu.with_(activation="gelu")
    assert plan_job(own, train, gpus, max_gpus=1).plans
