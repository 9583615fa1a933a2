"""8-bit and Adafactor optimizer states and torchtune's memory flags, counted by hand from
the libraries' code (bitsandbytes ``Optimizer2State.init_state``, transformers
``Adafactor.step``, torchtune's recipe and ``OffloadActivations``)."""

from __future__ import annotations

from typing import Any

import pytest

from predictor.errors import SpecError
from predictor.gpus import get_gpu
from predictor.memory import (
    MemoryBreakdown,
    _layer_counts,
    _traits,
    estimate_memory,
    optimizer_state_bytes,
    static_terms,
)
from predictor.memory_spec import memory_report
from predictor.planner import plan_job
from predictor.runtimes import TORCHTUNE
from predictor.spec import ModelSpec, Optimizer, ParallelConfig, TrainingSpec

# Two llama layers, h 64, 4 heads of 16 (no GQA), SwiGLU branch 128, vocab 1024, untied:
# per layer q, k, v, o 64x64 (4096 elements each), w1, w3 128x64, w2 64x128 (8192 each),
# two RMSNorm vectors of 64; embedding and output 1024x64 (65536 each), final norm 64.
# N = 2·(4·4096 + 3·8192 + 128) + 2·65536 + 64 = 213312 parameters.
DIMS: dict[str, Any] = {"family": "llama", "num_layers": 2, "hidden_size": 64, "num_heads": 4,
                        "num_kv_heads": 4, "ffn_hidden_size": 128, "vocab_size": 1024,
                        "tie_embeddings": False}
N = 213312
LLAMA = ModelSpec(name="l", family="llama", num_layers=2, hidden_size=64, num_heads=4,
                  num_kv_heads=4, ffn_hidden_size=128, vocab_size=1024, max_seq_len=64,
                  tie_embeddings=False)


def _spec(**kw: Any) -> dict[str, Any]:
    spec = {"model": dict(DIMS), "global_batch": 1, "seq_len": 1, "micro_batch": 1,
            "runtime": "torchtune"}
    spec.update(kw)
    return spec


def test_bitsandbytes_8bit_states_of_one_tensor_by_hand() -> None:
    # 1024x1024 = 1,048,576 elements >= min_8bit_size 4096: m and v as uint8 (2 x 1,048,576 B)
    # plus one fp32 absmax per 2048-element block and state: 2 x 4 x 512 = 4096 B
    assert optimizer_state_bytes(Optimizer.ADAM8BIT, (1024, 1024)) == (2_101_248, 0)
    assert optimizer_state_bytes(Optimizer.ADAMW8BIT, (1024, 1024)) == (2_101_248, 0)
    # paged: the uint8 states of >= 100,000 elements live in unified memory (not in the
    # allocator); the absmax stays a torch tensor
    assert optimizer_state_bytes(Optimizer.PAGED_ADAMW8BIT, (1024, 1024)) == (4096, 2_097_152)
    # 300x300 = 90,000 < 100,000: an ordinary tensor even when paged; ceil(90000/2048) = 44
    assert optimizer_state_bytes(Optimizer.PAGED_ADAM8BIT, (300, 300)) == (
        180_000 + 2 * 4 * 44, 0)
    # a 1024-vector < 4096 elements keeps fp32 m and v: 8 x 1024
    assert optimizer_state_bytes(Optimizer.ADAM8BIT, (1024,)) == (8192, 0)


def test_adafactor_states_of_one_tensor_by_hand() -> None:
    # factored second moment: fp32 row (1024) and column (4096) means; no first moment
    assert optimizer_state_bytes(Optimizer.ADAFACTOR, (1024, 4096)) == (4 * 5120, 0)
    # a vector keeps a full fp32 exp_avg_sq
    assert optimizer_state_bytes(Optimizer.ADAFACTOR, (1024,)) == (4096, 0)
    with pytest.raises(ValueError):
        optimizer_state_bytes(Optimizer.ADAMW, (4, 4))


def test_8bit_adam_states_of_a_model_by_hand() -> None:
    # per layer: four 64x64 tensors 2·4096 + 2·4·2 = 8208 B each, three 8192-element ones
    # 2·8192 + 2·4·4 = 16416 each, two norm vectors (< 4096: fp32 m, v) 8·64 = 512 each:
    # 83104; embedding and output 2·65536 + 2·4·32 = 131328 each; final norm 512
    states = 2 * 83104 + 2 * 131328 + 512
    assert states == 429_376
    out = memory_report(_spec(optimizer="adam8bit"))  # torchtune: bf16 weights, no master
    assert out["breakdown"]["optimizer_states"] == states
    # mixed precision with an fp32 master (deepspeed: bf16 weights beside it): 4 bytes per
    # parameter on top; under hf-trainer the fp32 weights are the master (autocast)
    mixed = memory_report(_spec(optimizer="adamw8bit", runtime="deepspeed", dropout=0.0))
    assert mixed["breakdown"]["optimizer_states"] == 4 * N + states
    hf = memory_report(_spec(optimizer="adamw8bit", runtime="hf-trainer", dropout=0.0))
    assert hf["breakdown"]["optimizer_states"] == states
    assert hf["breakdown"]["parameters"] == 4 * N


def test_adafactor_states_and_step_temporary_of_a_model_by_hand() -> None:
    # per layer: four (64+64)·4 = 512, three (128+64)·4 = 768, two norms 64·4 = 256: 4864;
    # embedding and output (1024+64)·4 = 4352 each; final norm 256
    states = 2 * 4864 + 2 * 4352 + 256
    assert states == 18_688
    out = memory_report(_spec(optimizer="adafactor"))
    assert out["breakdown"]["optimizer_states"] == states
    # at one token the step is the peak: bf16 parameters (torchtune) make Adafactor take
    # fp32 copies of the gradient and the parameter, then grad**2 + eps and the factored
    # approximation: four fp32 tensors of the largest (65536 elements)
    assert out["breakdown"]["transient"] == 4 * 4 * 65536
    assert out["tensors_bytes"] == 2 * N + 2 * N + states + 4 * 4 * 65536


def test_paged_states_count_on_the_device_only() -> None:
    # vocab 2048: embedding and output 2048x64 = 131072 elements >= 100,000: paged
    dims = dict(DIMS, vocab_size=2048)
    plain = memory_report(_spec(model=dims, optimizer="adamw8bit", gpu="A100-80G"))
    paged = memory_report(_spec(model=dims, optimizer="paged_adamw8bit", gpu="A100-80G"))
    out_of_allocator = 2 * 2 * 131072
    assert paged["breakdown"]["paged_optimizer_states"] == out_of_allocator
    assert (plain["breakdown"]["optimizer_states"]
            - paged["breakdown"]["optimizer_states"]) == out_of_allocator
    assert paged["device_bytes"] == (paged["reserved_bytes"] + out_of_allocator
                                     + paged["breakdown"]["outside_allocator"])
    assert "paged_optimizer_states" not in plain["breakdown"]
    # other plans serialise as before
    assert "paged" not in MemoryBreakdown(1, 2, 3, 4, 5, 6).as_dict()


def test_the_built_in_trainer_refuses_optimizers_it_does_not_run() -> None:
    with pytest.raises(SpecError) as err:
        memory_report(_spec(optimizer="adafactor", runtime="frenzy"))
    assert err.value.field == "optimizer" and "adam, adamw, sgd" in str(err.value)
    train = TrainingSpec(global_batch=2, seq_len=32, optimizer="adam8bit")
    with pytest.raises(SpecError) as err:
        plan_job(LLAMA, train, [get_gpu("A100-80G")], max_gpus=1)
    assert err.value.field == "optimizer"
    assert plan_job(LLAMA, train, [get_gpu("A100-80G")], max_gpus=1,
                    runtime="torchtune").plans


def test_compiled_llama_layer_keeps_what_inductor_saves() -> None:
    # per token (bf16, h = q = 64, a = 4, f = 128): input, mid residual and both norm outputs
    # 4·64·2, two fp32 1/rms 8, Q, K and V repeated and the attention output 4·64·2, lse
    # 4·4, gate, up and product 3·128·2 = 512 + 8 + 512 + 16 + 768 = 1816
    rt = TORCHTUNE.with_overrides(compiled=True)
    s = 32
    one = _layer_counts(LLAMA, 1, s, s, s, 2, False, True, _traits(LLAMA), rt)[4]
    assert one == 1816 * s
    from benchmarks.compiled_layer import formula_per_token
    assert formula_per_token(h=64, q=64, f=128, a=4) == 1816


def test_compiled_loss_bytes_per_logit() -> None:
    # no chunks: forward the bf16 logits and their eager fp32 copy (6 B), backward the
    # saved fp32 logits and their fp32 gradient (8 B), plus the head's weight and input
    # gradients; 8 chunks: the bf16 chunks (2 B) and one chunk's bf16 gradient
    s, V, h = 64, 1024, 64
    base = _spec(seq_len=s, micro_batch=1, runtime_options={"compiled": True})
    whole = memory_report(base)
    chunked = memory_report({**base, "runtime_options": {"compiled": True, "loss_chunks": 8}})
    assert whole["breakdown"]["logits"] == 8 * s * V
    assert whole["breakdown"]["transient"] == V * h * 2 + h * s * 2
    assert chunked["breakdown"]["logits"] == 2 * s * V + 2 * (s // 8) * V


def test_optimizer_in_backward_keeps_one_gradient() -> None:
    # at one token the end of the backward is the peak: the largest tensor's bf16 gradient
    # (65536 elements) and its foreach sqrt(v) (one parameter per optimizer), instead of
    # every gradient and a sqrt(v) of every parameter
    out = memory_report(_spec(optimizer="adamw",
                              runtime_options={"optimizer_in_backward": True}))
    assert out["breakdown"]["gradients"] == 2 * 65536
    assert out["breakdown"]["transient"] == 2 * 65536
    assert out["tensors_bytes"] == 2 * N + 4 * N + 4 * 65536
    with pytest.raises(SpecError) as err:  # gradient accumulation cannot free gradients
        memory_report(_spec(global_batch=2, runtime_options={"optimizer_in_backward": True}))
    assert err.value.field == "runtime_options.optimizer_in_backward"


def test_activation_offload_keeps_five_checkpointed_inputs() -> None:
    # 8 layers under full recompute (optimizer in backward, so that an activation moment is
    # the peak): the GPU keeps 5 of the 8 layer inputs (h·T·D each) and no token ids (8 B
    # each)
    model = LLAMA.with_(num_layers=8)
    s = 512
    train = TrainingSpec(global_batch=1, seq_len=s)
    par = ParallelConfig(micro_batch=1, recompute="full")
    rt = TORCHTUNE.with_overrides(compiled=True, loss_chunks=8, optimizer_in_backward=True)
    keep = estimate_memory(model, train, par, runtime=rt)
    off = estimate_memory(model, train, par, runtime=rt.with_overrides(activation_offload=True))
    assert (keep.logits, keep.transient) == (off.logits, off.transient)  # the same moment
    assert keep.activations - off.activations == 3 * 64 * s * 2 + 8 * s


def test_flags_outside_their_derivation_name_the_field() -> None:
    with pytest.raises(SpecError) as err:
        memory_report(_spec(runtime_options={"loss_chunks": 8}))
    assert err.value.field == "runtime_options.loss_chunks"
    with pytest.raises(SpecError) as err:
        memory_report({"model": "gpt2", "global_batch": 1, "seq_len": 32,
                       "runtime": "torchtune", "runtime_options": {"compiled": True}})
    assert err.value.field == "runtime_options.compiled" and "llama" in str(err.value)
    with pytest.raises(SpecError) as err:
        memory_report(_spec(runtime="frenzy", runtime_options={"optimizer_in_backward": True}))
    assert err.value.field == "runtime_options.optimizer_in_backward"
    with pytest.raises(SpecError) as err:
        memory_report(_spec(optimizer="lion"))
    assert err.value.field == "optimizer" and "adafactor" in str(err.value)


def test_the_split_form_refuses_flags_it_does_not_price() -> None:
    train = TrainingSpec(global_batch=1, seq_len=32)
    for flag in ("compiled", "optimizer_in_backward", "activation_offload"):
        with pytest.raises(ValueError, match=flag):
            static_terms(LLAMA, train, 1, 1, 1, 0, TORCHTUNE.with_overrides(**{flag: True}))


@pytest.mark.parametrize("runtime", ["hf-trainer", "torchtune", "deepspeed", "fsdp2",
                                     "megatron"])
def test_the_planner_prices_the_new_optimizers_as_estimate_memory_does(runtime: str) -> None:
    from predictor.memory import peak_tensors
    from predictor.runtimes import get_runtime

    rt = get_runtime(runtime)
    for opt in ("adam8bit", "paged_adamw8bit", "adafactor"):
        for zero in (0, 1, 2, 3):
            for s, mb in ((1, 1), (64, 2)):
                train = TrainingSpec(global_batch=4, seq_len=s, optimizer=opt)
                par = ParallelConfig(dp=2, micro_batch=mb, zero_stage=zero)
                assert peak_tensors(LLAMA, train, par, rt) == estimate_memory(
                    LLAMA, train, par, runtime=rt).tensors, (opt, zero, s)
