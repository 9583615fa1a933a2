"""``frenzy memory`` specs that give the model as a Hugging Face ``config.json``: the same
figures as the catalog entry built from that published config, and errors that name the
field under ``hf_config``."""

from __future__ import annotations

import pytest

from predictor.errors import SpecError
from predictor.memory_spec import memory_report

# meta-llama/Llama-2-7b-hf config.json (the fields that size the model)
LLAMA_2_7B = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 11008,
              "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 32,
              "vocab_size": 32000, "max_position_embeddings": 4096,
              "tie_word_embeddings": False, "torch_dtype": "float16"}
PLAN = {"global_batch": 8, "seq_len": 4096, "tp": 2, "dp": 4, "micro_batch": 1,
        "runtime": "megatron", "gpu": "A100-80G"}


def test_an_hf_config_prices_like_its_catalog_model() -> None:
    by_config = memory_report({"hf_config": LLAMA_2_7B, **PLAN})
    by_name = memory_report({"model": "llama-2-7b", **PLAN})
    assert by_config["tensors_bytes"] == by_name["tensors_bytes"]
    assert by_config["device_bytes"] == by_name["device_bytes"]
    assert by_config["breakdown"] == by_name["breakdown"]
    # 6.74e9 parameters in bf16 over tp = 2: about 6.7 GB of weights per GPU
    assert 6.5e9 < by_config["breakdown"]["parameters"] < 7.0e9


@pytest.mark.parametrize("spec, field, says", [
    ({"hf_config": LLAMA_2_7B, "model": "llama-2-7b"}, "hf_config", "not both"),
    ({"hf_config": {k: v for k, v in LLAMA_2_7B.items() if k != "num_hidden_layers"}},
     "hf_config.num_hidden_layers", "missing"),
    ({"hf_config": {**LLAMA_2_7B, "model_type": "t5"}}, "hf_config.model_type", "t5"),
    ({"hf_config": [1, 2]}, "hf_config", "JSON object"),
    ({}, "model", "hf_config"),
])
def test_bad_hf_configs_name_the_field(spec: dict, field: str, says: str) -> None:
    with pytest.raises(SpecError) as err:
        memory_report({**PLAN, **spec})
    assert err.value.field == field and says in err.value.reason
