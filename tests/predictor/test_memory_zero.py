"""The built-in trainer's ZeRO-1/2 priced as it runs them (orchestrator.trainer.zero): fp32
weights are the master (no copy), Adam's states and (ZeRO-2) the gradients in chunks of
ceil(n/dp) per tensor, and in a step of one micro-batch the gradients appear as the
activations go. Figures worked out by hand."""

from __future__ import annotations

import random

from predictor.memory import estimate_memory, peak_tensors
from predictor.runtimes import FRENZY, FRENZY_CPU
from predictor.spec import ModelSpec, ParallelConfig, Recompute, TrainingSpec

GPT = ModelSpec(name="g", family="gpt2", num_layers=2, hidden_size=64, num_heads=4,
                vocab_size=1000, max_seq_len=64)
LLAMA = ModelSpec(name="l", family="llama", num_layers=2, hidden_size=64, num_heads=4,
                  num_kv_heads=4, ffn_hidden_size=128, vocab_size=1024, max_seq_len=64,
                  tie_embeddings=False)


def test_zero_1_by_hand_untied_llama_one_micro_batch() -> None:
    # n = 213312 parameters, every tensor even: chunks of n/2 at dp = 2. bf16 AdamW, 2
    # tokens, one micro-batch per step. The peak is the embedding's backward (its gradient
    # made last): fp32 weights 4n, every gradient 4n (ZeRO-1 keeps them whole), m and v of
    # the chunk 8·n/2, the bf16 logits the loop holds 2·2·1024, the fp32 gradient flowing
    # into the embedding 4·64·2, the ids and labels 16·2.
    n = LLAMA.num_params()
    assert n == 213312
    want = 4 * n + 4 * n + 8 * n // 2 + 2 * 2 * 1024 + 4 * 64 * 2 + 16 * 2
    assert want == 2564384
    train = TrainingSpec(global_batch=2, seq_len=2)
    par = ParallelConfig(dp=2, micro_batch=1, zero_stage=1)
    got = estimate_memory(LLAMA, train, par, runtime=FRENZY_CPU)
    assert got.tensors == want
    assert got.optimizer_states == 8 * n // 2  # no master copy: the fp32 weights are it
    unsharded = estimate_memory(LLAMA, train, ParallelConfig(dp=2, micro_batch=1),
                                runtime=FRENZY_CPU)
    assert unsharded.optimizer_states == 8 * n


def test_zero_2_by_hand_tied_gpt2_one_micro_batch() -> None:
    # n = 168192, the tied embedding 1000·64 = 64000 elements; dp = 2, every tensor even.
    # The peak is the tied weight's two gradients summed (3 tensors of 4·64000 B) beside the
    # other tensors' gradient chunks 4·(n - 64000)/2, the weights 4n, Adam's chunk states
    # 8·n/2 and the held bf16 logits 2·2·1000; the sum follows the embedding's backward, so
    # its incoming gradient, like every activation, is gone.
    n = GPT.num_params()
    assert n == 168192
    want = 4 * n + 8 * n // 2 + 4 * (n - 64000) // 2 + 3 * 4 * 64000 + 2 * 2 * 1000
    assert want == 2325920
    train = TrainingSpec(global_batch=2, seq_len=2)
    par = ParallelConfig(dp=2, micro_batch=1, zero_stage=2)
    assert estimate_memory(GPT, train, par, runtime=FRENZY_CPU).tensors == want


def test_zero_2_static_state_several_micro_batches() -> None:
    # with two micro-batches per step the gradient chunks exist before the second one's
    # forward: 4·n/2 of gradients, 8·n/2 of states, 4n of weights, no flat all-reduce copy
    n = LLAMA.num_params()
    train = TrainingSpec(global_batch=8, seq_len=32)
    z2 = estimate_memory(LLAMA, train, ParallelConfig(dp=2, micro_batch=2, zero_stage=2),
                         runtime=FRENZY_CPU)
    assert (z2.parameters, z2.optimizer_states) == (4 * n, 8 * n // 2)
    z0 = estimate_memory(LLAMA, train, ParallelConfig(dp=2, micro_batch=2),
                         runtime=FRENZY_CPU)
    assert z0.tensors - z2.tensors >= 8 * n // 2 + 4 * n // 2  # states and gradients halved


def test_split_form_agrees_for_the_trainer_under_zero() -> None:
    # the planner's static + activation terms give estimate_memory's bytes under ZeRO-1/2,
    # one micro-batch per step included (the moments whose gradients ZeRO-2 shards)
    rng = random.Random(11)
    models = [GPT, LLAMA, ModelSpec.from_name("gpt2-medium"), ModelSpec.from_name("llama-2-7b"),
              ModelSpec.from_name("bert-base")]
    for _ in range(400):
        m = rng.choice(models)
        gb = rng.choice([2, 4, 8, 16])
        train = TrainingSpec(global_batch=gb, seq_len=rng.choice([16, 128, 512]),
                             precision=rng.choice(["bf16", "fp32", "fp16"]),
                             optimizer=rng.choice(["adamw", "sgd"]))
        dp = rng.choice([d for d in (1, 2, 4) if gb % d == 0])
        tp = rng.choice([1, 2, 4])
        mb = rng.choice([b for b in (1, 2, 4) if (gb // dp) % b == 0])
        par = ParallelConfig(tp=tp, dp=dp, micro_batch=mb, zero_stage=rng.choice([0, 1, 2]),
                             recompute=rng.choice(list(Recompute)))
        for rt in (FRENZY, FRENZY_CPU):
            assert peak_tensors(m, train, par, rt) == estimate_memory(
                m, train, par, runtime=rt).tensors, (m.name, train, par, rt.name)


def test_zero_3_by_hand_root_whole_and_the_running_layer_gathered() -> None:
    # ZeRO-3 keeps each layer's fp32 weights as chunks and the root (embedding, head, final
    # norm) whole. LLAMA: a layer is 4·64² + 3·64·128 + 2·64 = 41088 elements, the root
    # 2·1024·64 + 64 = 131136. At dp = 2 the weights are 4·(131136 + 2·41088/2) B.
    assert LLAMA.num_params() == 131136 + 2 * 41088
    train = TrainingSpec(global_batch=2, seq_len=2)
    z3 = estimate_memory(LLAMA, train, ParallelConfig(dp=2, micro_batch=1, zero_stage=3),
                         runtime=FRENZY_CPU)
    assert z3.parameters == 4 * (131136 + 41088) == 688896
    # 2 tokens, one micro-batch: the peak is the embedding's backward, when no layer is
    # gathered: the weights, Adam's chunk states 8·n/2, the gradient chunks 4·n/2 and the
    # embedding's full gradient beside its chunk 4·65536, the held bf16 logits 2·2·1024, the
    # fp32 gradient into the embedding 4·64·2, the ids and labels 16·2 (as ZeRO-2's
    # moment, less the layers' other halves)
    n = LLAMA.num_params()
    want = 688896 + 8 * n // 2 + 4 * n // 2 + 4 * 65536 + 2 * 2 * 1024 + 4 * 64 * 2 + 16 * 2
    assert z3.tensors == want == 2235552
    # a vocabulary of 8 and two micro-batches: the peak is the first layer's backward; at
    # dp = 2 over 2 layers ZeRO-3 saves one layer's fp32 weights, 4·41088 B, and holds the
    # running layer's, the same bytes: the peak is ZeRO-2's, with the gathered layer in the
    # working set
    small = LLAMA.with_(name="l8", vocab_size=8)
    train = TrainingSpec(global_batch=4, seq_len=16)
    z2 = estimate_memory(small, train, ParallelConfig(dp=2, micro_batch=1, zero_stage=2),
                         runtime=FRENZY_CPU)
    z3 = estimate_memory(small, train, ParallelConfig(dp=2, micro_batch=1, zero_stage=3),
                         runtime=FRENZY_CPU)
    assert z2.parameters - z3.parameters == 4 * 41088 == z3.transient - z2.transient
    assert z3.tensors == z2.tensors
    # the split form the planner searches agrees
    for par in (ParallelConfig(dp=2, micro_batch=1, zero_stage=3),
                ParallelConfig(dp=4, micro_batch=1, zero_stage=3, recompute=Recompute.FULL)):
        assert peak_tensors(small, train, par, FRENZY) == estimate_memory(
            small, train, par, runtime=FRENZY).tensors
