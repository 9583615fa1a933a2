"""Megatron's uneven interleaved splits: the layers each virtual chunk builds under
``--account-for-{embedding,loss}-in-pipeline-split``, the layers in flight that its interleaved
1F1B schedule keeps, and the ``frenzy memory`` spec fields that express them."""

from __future__ import annotations

import pytest

from predictor.errors import SpecError
from predictor.memory import interleaved_layers_in_flight, megatron_chunk_layers
from predictor.memory_spec import memory_report, parse_memory_spec

# The Megatron CI toy GPT of the account_for_embedding_loss rows: 6 layers, h 512, 8 heads,
# seq 1024, micro-batch 4, unfused attention, tp 1, pp 4, 2 virtual stages, dp 2.
TOY = {"name": "toy", "family": "gpt2", "num_layers": 6, "hidden_size": 512, "num_heads": 8,
       "vocab_size": 50257, "max_seq_len": 1024, "tie_embeddings": False}
SPEC = {"model": TOY, "global_batch": 32, "seq_len": 1024, "micro_batch": 4, "tp": 1,
        "pp": 4, "dp": 2, "precision": "bf16", "optimizer": "adam", "runtime": "megatron",
        "zero_stage": 1, "flash_attention": False, "virtual_stages": 2, "stage": "last",
        "account_for_embedding_in_pipeline_split": True,
        "account_for_loss_in_pipeline_split": True}


def test_megatron_chunk_layers_follow_get_num_layers_to_build() -> None:
    # 14 layers + embedding + loss = 16 "layers", 16 / pp 4 = 4 per stage, 4 / vp 2 = 2 per
    # chunk; the first chunk of stage 0 builds 2 - 1 (the embedding) and the last chunk of
    # stage 3 builds 2 - 1 (the loss): 1 + 2 + 2 + 2 + 2 + 2 + 2 + 1 = 14
    assert megatron_chunk_layers(14, 4, 2, embedding=True, loss=True) == (
        (1, 2), (2, 2), (2, 2), (2, 1))
    # the CI rows: 6 + 2 = 8, 2 per stage, 1 per chunk; the embedding and loss chunks are empty
    assert megatron_chunk_layers(6, 4, 2, embedding=True, loss=True) == (
        (0, 1), (1, 1), (1, 1), (1, 0))
    # no interleaving: 6 + 2 = 8 over 4 stages, 2 each, the edge stages one fewer
    assert megatron_chunk_layers(6, 4, embedding=True, loss=True) == ((1,), (2,), (2,), (1,))
    # only the loss: 7 + 1 = 8, 2 per stage, the last builds 1
    assert megatron_chunk_layers(7, 4, loss=True) == ((2,), (2,), (2,), (1,))


@pytest.mark.parametrize("args, says", [
    ((6, 4, 1), "pp of [1, 7]"),  # 6 + 1 = 7 does not divide by 4
    ((14, 4, 3), "virtual_stages of [1, 2, 4]"),  # 4 per stage into 3 chunks
])
def test_megatron_chunk_layers_refuse_what_megatron_asserts(args: tuple, says: str) -> None:
    with pytest.raises(ValueError, match=r"would") as err:
        megatron_chunk_layers(*args, embedding=True, loss=args[2] == 3)
    assert says in str(err.value)


def test_layers_in_flight_replay_the_interleaved_schedule() -> None:
    # last stage of pp 4, v 2, m 4: the schedule table is chunk 0 for micro-batches 0-3, then
    # chunk 1; warm-up 2·0 + 1·4 = 4 forwards (4 × chunk 0), then F(chunk 1)/B(chunk 1) pairs:
    # chunk 1 holds no layer, so 4 layers at most
    assert interleaved_layers_in_flight((1, 0), 4, 3, 4) == 4
    # m 8: after the four chunk-1 pairs, F of chunk 0 (micro-batch 4) comes before the first
    # chunk-0 backward: 5 layers
    assert interleaved_layers_in_flight((1, 0), 4, 3, 8) == 5
    # first stage, m 4: warm-up 2·3 + 4 = 10 >= 8 virtual micro-batches, all forwards first:
    # 4 × 0 + 4 × 1
    assert interleaved_layers_in_flight((0, 1), 4, 0, 4) == 4
    # equal chunks: (warm-up + 1) chunks = min(16, 11) · 2 layers, estimate_stage's formula
    assert interleaved_layers_in_flight((2, 2), 4, 0, 8) == 22


def test_equal_chunks_price_like_the_virtual_stage_formula() -> None:
    even = {**SPEC, "model": {**TOY, "num_layers": 8}, "stage": "worst"}
    for key in ("account_for_embedding_in_pipeline_split",
                "account_for_loss_in_pipeline_split"):
        even.pop(key)
    plain = memory_report(even)
    nested = memory_report({**even, "layers_per_stage": [[1, 1]] * 4})
    assert nested["tensors_bytes"] == plain["tensors_bytes"]
    assert nested["breakdown"] == plain["breakdown"]


def test_the_accounting_flags_give_the_nested_split() -> None:
    req = parse_memory_spec(SPEC)
    assert req.chunks == ((0, 1), (1, 1), (1, 1), (1, 0))
    by_flags = memory_report(SPEC)
    explicit = {k: v for k, v in SPEC.items() if not k.startswith("account_for")}
    by_list = memory_report({**explicit, "layers_per_stage": [[0, 1], [1, 1], [1, 1], [1, 0]]})
    assert by_flags == by_list


def test_one_more_micro_batch_round_keeps_one_more_layer_on_the_last_stage() -> None:
    # m 4 -> 8 (global batch 32 -> 64) keeps 4 -> 5 layers in flight on stage 3 (above); one
    # layer's saved tensors under Megatron's profile, T = T_f = 4·1024 tokens, D = 2, P = 2:
    #   norms 4·h·T·D = 16,777,216 + LayerNorm statistics 2·2·T·D = 32,768
    #   Q, K, V, re-laid output 4·h·T·D = 16,777,216; softmax output a·s·T·D = 67,108,864
    #   attention dropout mask + output a·s·T·3 = 100,663,296; GeLU in/out 2·4h·T·D
    #   = 33,554,432; two hidden dropout masks 2·h·T = 4,194,304
    per_layer = 239_108_096
    m4 = memory_report(SPEC)["breakdown"]
    m8 = memory_report({**SPEC, "global_batch": 64})["breakdown"]
    assert m8["activations"] - m4["activations"] == per_layer
    assert m8["parameters"] == m4["parameters"]


@pytest.mark.parametrize("change, field, says", [
    ({"account_for_loss_in_pipeline_split": "yes"}, "account_for_loss_in_pipeline_split",
     "true or false"),
    ({"pp": 2, "dp": 4}, "account_for_embedding_in_pipeline_split",
     "virtual_stages of [1, 2, 4]"),  # 8 / 2 = 4 per stage: fine; see the next case
    ({"pp": 3, "dp": 2}, "account_for_embedding_in_pipeline_split", "pp of [1, 2, 4, 8]"),
    ({"layers_per_stage": [1, 2, 2, 1]}, "account_for_embedding_in_pipeline_split",
     "not both"),
])
def test_bad_split_fields_name_the_field(change: dict, field: str, says: str) -> None:
    spec = {**SPEC, **change}
    if change.get("pp") == 2:  # 4 layers per stage do divide into 2 chunks: accepted
        assert parse_memory_spec(spec).chunks == ((1, 2), (2, 1))
        spec["virtual_stages"] = 3
    with pytest.raises(SpecError) as err:
        parse_memory_spec(spec)
    assert err.value.field == field
    assert says in str(err.value)


@pytest.mark.parametrize("layers", [
    [[0, 1], [1, 1], [1, 1], [1, 1]],  # sums to 7
    [[0, 1, 0], [1, 1], [1, 1], [1, 0]],  # a stage with 3 chunks at virtual_stages 2
    [[0, 1], [1, 1], [1, 1]],  # 3 stages at pp 4
])
def test_bad_nested_layers_name_the_field(layers: list) -> None:
    explicit = {k: v for k, v in SPEC.items() if not k.startswith("account_for")}
    with pytest.raises(SpecError) as err:
        parse_memory_spec({**explicit, "layers_per_stage": layers})
    assert err.value.field == "layers_per_stage"
    assert "per virtual chunk" in str(err.value)
