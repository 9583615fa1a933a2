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


def test_the_planner_prices_step_time_for_the_named_runtime() -> None:
    """fp32 matmuls: Megatron-LM runs them on TF32 tensor cores (156 TFLOP/s dense on an
    A100, 8x its 19.5 TFLOP/s fp32 peak), the built-in trainer does not, so the same
    compute-bound plan must be several times faster under ``megatron``; a runtime without
    a step-time profile of its own (torchtune) is priced as the built-in trainer, and
    Hugging Face's Trainer by its own (tests/predictor/test_step_time_hf.py)."""
    from predictor.gpus import get_gpu
    from predictor.planner import plan_job
    from predictor.spec import ModelSpec, Precision, TrainingSpec

    model = ModelSpec.from_name("gpt2-medium")
    train = TrainingSpec(global_batch=16, seq_len=1024, precision=Precision.FP32)
    gpus = [get_gpu("A100-80G")]

    def best(runtime: str) -> float:
        plans = plan_job(model, train, gpus=gpus, max_gpus=1, runtime=runtime).plans
        return plans[0].step_time_s

    assert best("megatron") < best("frenzy") / 3
    assert best("torchtune") == best("frenzy")
    assert best("hf-trainer") != best("frenzy")


def test_a_qwen3_config_with_its_head_dim_prices_like_the_catalog_entry() -> None:
    """Qwen3-0.6B's config.json (head_dim 128 over hidden 1024 and 16 heads) was refused;
    it is priced as the catalog's qwen3-0.6b, and as the same dimensions given by hand."""
    config = {"model_type": "qwen3", "hidden_size": 1024, "intermediate_size": 3072,
              "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8,
              "head_dim": 128, "vocab_size": 151936, "max_position_embeddings": 40960,
              "tie_word_embeddings": True}
    dims = {"family": "qwen3", "num_layers": 28, "hidden_size": 1024, "num_heads": 16,
            "num_kv_heads": 8, "head_dim": 128, "ffn_hidden_size": 3072,
            "vocab_size": 151936, "max_seq_len": 40960, "tie_embeddings": True}
    plan = {**PLAN, "runtime": "frenzy", "dp": 2, "zero_stage": 1}
    reports = [memory_report({**plan, **m}) for m in (
        {"hf_config": config}, {"model": "qwen3-0.6b"}, {"model": dims})]
    assert reports[0]["tensors_bytes"] == reports[1]["tensors_bytes"] == reports[2][
        "tensors_bytes"]
    # fp32 weights (the built-in trainer's), whole under ZeRO-1, at tp 2: per layer the
    # projections (2,097,152 + 2 x 1,048,576 + 2,097,152 + 3 x 3,145,728) / 2 = 7,864,320 and
    # the replicated norms 2 x 1024 + 2 x 128: 7,866,624 x 28 = 220,265,472; the embedding's
    # 75,968 rows x 1024 = 77,791,232 (tied); the final norm 1024: 298,057,728
    assert reports[0]["breakdown"]["parameters"] == 4 * 298_057_728


def test_context_parallel_is_one_ranks_share() -> None:
    # cp = 4 ranks each hold 4096 / 4 tokens of every sequence, and the distributed
    # optimizer's shards spread over dp·cp = 8 ranks, at the same micro-batches per step
    spec = {"model": "llama-2-7b", "global_batch": 16, "seq_len": 4096, "tp": 2, "dp": 2,
            "micro_batch": 1, "zero_stage": 1, "runtime": "megatron", "gpu": "H100-80G"}
    with_cp = memory_report({**spec, "cp": 4})
    by_hand = memory_report({**spec, "seq_len": 1024, "dp": 8, "global_batch": 64})
    assert with_cp["breakdown"] == by_hand["breakdown"]
    assert with_cp["device_bytes"] == by_hand["device_bytes"]
    assert with_cp["tensors_bytes"] < memory_report(spec)["tensors_bytes"]


@pytest.mark.parametrize("cp, field, says", [(3, "cp", "divide seq_len=4096"),
                                             (0, "cp", "positive integer"),
                                             (True, "cp", "positive integer")])
def test_bad_context_parallel_names_the_field(cp, field: str, says: str) -> None:
    with pytest.raises(SpecError) as e:
        memory_report({"model": "llama-2-7b", "global_batch": 8, "seq_len": 4096, "cp": cp})
    assert e.value.field == field and says in e.value.reason
