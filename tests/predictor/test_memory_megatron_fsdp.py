"""Megatron-FSDP's ``optim_grads_params`` (``runtime_options.sharding = "megatron_fsdp"`` at
ZeRO-3): the distributed optimizer's shards plus what its FSDP units and root keep."""

from __future__ import annotations

import pytest

from predictor.errors import SpecError
from predictor.memory_spec import memory_report

# gpt2-shaped: h 64, 4 heads, ffn 256, vocab 1024 (a multiple of Megatron's 128: no padding),
# 128 positions, tied embeddings, 2 layers
MODEL = {"name": "tiny", "family": "gpt2", "num_layers": 2, "hidden_size": 64, "num_heads": 4,
         "ffn_hidden_size": 256, "vocab_size": 1024, "max_seq_len": 128}
SPEC = {"model": MODEL, "global_batch": 8, "seq_len": 128, "micro_batch": 1, "dp": 4,
        "precision": "bf16", "optimizer": "adam", "runtime": "megatron", "zero_stage": 3}


def test_megatron_fsdp_adds_the_gathered_root_and_one_units_gradient_bucket() -> None:
    zero3 = memory_report(SPEC)["breakdown"]
    fsdp = memory_report({**SPEC, "runtime_options": {"sharding": "megatron_fsdp"}})[
        "breakdown"]
    # one layer: 12·h² + 13·h = 49,152 + 832 = 49,984 elements; the root (modules outside
    # the TransformerLayer units): token embedding 1024·64 = 65,536, positions 128·64 =
    # 8,192, final LayerNorm 2·64 = 128 -> 73,856 elements, gathered in bf16 (2 bytes);
    # one unit's unsharded fp32 gradient bucket: 4 · 49,984
    assert fsdp["parameters"] - zero3["parameters"] == 2 * 73_856
    assert fsdp["gradients"] - zero3["gradients"] == 4 * 49_984
    assert fsdp["optimizer_states"] == zero3["optimizer_states"]


def test_megatron_fsdp_below_zero_3_is_the_distributed_optimizer() -> None:
    z1 = {**SPEC, "zero_stage": 1}
    assert memory_report({**z1, "runtime_options": {"sharding": "megatron_fsdp"}}) == \
        memory_report(z1)


def test_an_unknown_sharding_names_the_field_and_what_fits() -> None:
    with pytest.raises(SpecError) as err:
        memory_report({**SPEC, "runtime_options": {"sharding": "megatron-fsdp"}})
    assert err.value.field == "runtime.sharding"
    assert "megatron_fsdp" in err.value.reason
