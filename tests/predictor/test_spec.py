"""ModelSpec / TrainingSpec / ParallelConfig: catalog, HF ingestion, validation messages."""

from __future__ import annotations

import pytest

from predictor.errors import SpecError
from predictor.spec import (
    MODEL_CATALOG,
    Family,
    ModelSpec,
    ParallelConfig,
    Recompute,
    TrainingSpec,
)

REQUIRED = [
    "gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl", "gpt2-350m", "gpt2-7b", "bert-base",
    "bert-large", "llama-2-7b", "llama-2-13b", "llama-2-70b", "llama-3-8b", "llama-3-70b",
    "mistral-7b",
]

# Published parameter counts (model cards / papers), in parameters.
PUBLISHED = {
    "gpt2": 124_439_808,  # HF gpt2: 124,439,808
    "gpt2-medium": 354_823_168,
    "gpt2-large": 774_030_080,
    "gpt2-xl": 1_557_611_200,
    "llama-2-7b": 6_738_415_616,
    "llama-2-13b": 13_015_864_320,
    "llama-2-70b": 68_976_648_192,
    "llama-3-8b": 8_030_261_248,
    "mistral-7b": 7_241_732_096,
}


@pytest.mark.parametrize("name", REQUIRED)
def test_catalog_has_required_models(name: str) -> None:
    assert ModelSpec.from_name(name).name == name


@pytest.mark.parametrize("name,count", sorted(PUBLISHED.items()))
def test_parameter_count_matches_published(name: str, count: int) -> None:
    assert ModelSpec.from_name(name).num_params() == count


def test_gpt2_layer_params_match_frenzy_formula() -> None:
    # Frenzy: a GPT layer has 12h^2 + 13h parameters.
    h = 1024
    m = ModelSpec.from_name("gpt2-medium")
    assert m.layer_params() == 12 * h * h + 13 * h


def test_bert_base_by_hand() -> None:
    m = ModelSpec.from_name("bert-base")
    h, f, v = 768, 3072, 30522
    layer = 4 * (h * h + h) + 2 * h + (h * f + f) + (f * h + h) + 2 * h
    emb = v * h + 512 * h + 2 * h + 2 * h
    head = h * h + h + 2 * h + v
    assert m.num_params() == emb + 12 * layer + head  # 109,514,298 (HF's 110M adds the pooler)


def test_llama_gqa_by_hand() -> None:
    m = ModelSpec.from_name("llama-2-70b")
    h, kv, f = 8192, 8 * 128, 28672
    layer = h * h + 2 * h * kv + h * h + 3 * h * f + 2 * h
    assert m.layer_params() == layer


def test_unknown_name_suggests() -> None:
    with pytest.raises(SpecError) as exc:
        ModelSpec.from_name("llama2-7b")
    assert exc.value.field == "model"
    assert "llama-2-7b" in exc.value.reason


HF_CONFIGS = {
    "gpt2": {"model_type": "gpt2", "n_layer": 12, "n_embd": 768, "n_head": 12,
             "vocab_size": 50257, "n_positions": 1024},
    "llama": {"model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096,
              "num_attention_heads": 32, "num_key_value_heads": 32, "intermediate_size": 11008,
              "vocab_size": 32000, "max_position_embeddings": 4096,
              "tie_word_embeddings": False},
    "mistral": {"model_type": "mistral", "num_hidden_layers": 32, "hidden_size": 4096,
                "num_attention_heads": 32, "num_key_value_heads": 8,
                "intermediate_size": 14336, "vocab_size": 32000,
                "max_position_embeddings": 32768},
    "qwen2": {"model_type": "qwen2", "num_hidden_layers": 28, "hidden_size": 3584,
              "num_attention_heads": 28, "num_key_value_heads": 4, "intermediate_size": 18944,
              "vocab_size": 152064, "max_position_embeddings": 32768,
              "tie_word_embeddings": False},
    "gpt_neox": {"model_type": "gpt_neox", "num_hidden_layers": 24, "hidden_size": 2048,
                 "num_attention_heads": 16, "intermediate_size": 8192, "vocab_size": 50304,
                 "max_position_embeddings": 2048},
    "bert": {"model_type": "bert", "num_hidden_layers": 12, "hidden_size": 768,
             "num_attention_heads": 12, "intermediate_size": 3072, "vocab_size": 30522,
             "max_position_embeddings": 512, "type_vocab_size": 2},
}


@pytest.mark.parametrize(
    "kind,expected",
    [("gpt2", "gpt2"), ("llama", "llama-2-7b"), ("mistral", "mistral-7b"), ("qwen2", "qwen2-7b"),
     ("gpt_neox", "pythia-1.4b"), ("bert", "bert-base")],
)
def test_hf_config_matches_catalog(kind: str, expected: str) -> None:
    m = ModelSpec.from_hf_config(HF_CONFIGS[kind])
    assert m.num_params() == MODEL_CATALOG[expected].num_params()


def test_hf_config_errors_name_the_field() -> None:
    with pytest.raises(SpecError) as exc:
        ModelSpec.from_hf_config({"model_type": "t5"})
    assert exc.value.field == "config.model_type"
    cfg = dict(HF_CONFIGS["llama"])
    del cfg["intermediate_size"]
    with pytest.raises(SpecError) as exc:
        ModelSpec.from_hf_config(cfg)
    assert exc.value.field == "config.intermediate_size"


@pytest.mark.parametrize(
    "kwargs,field",
    [
        ({"num_layers": 0}, "num_layers"),
        ({"hidden_size": 1000, "num_heads": 12}, "hidden_size"),
        ({"num_kv_heads": 5}, "num_kv_heads"),
        ({"vocab_size": -3}, "vocab_size"),
        ({"family": "rnn"}, "family"),
    ],
)
def test_impossible_dims_name_the_field(kwargs: dict, field: str) -> None:
    base = dict(name="x", family=Family.GPT2, num_layers=4, hidden_size=256, num_heads=8,
                vocab_size=1000, max_seq_len=512)
    base.update(kwargs)
    with pytest.raises(SpecError) as exc:
        ModelSpec(**base)
    assert exc.value.field == field


def test_training_spec_validation() -> None:
    with pytest.raises(SpecError) as exc:
        TrainingSpec(global_batch=0, seq_len=1024)
    assert exc.value.field == "global_batch"
    with pytest.raises(SpecError) as exc:
        TrainingSpec(global_batch=8, seq_len=1024, precision="fp8")
    assert exc.value.field == "precision"
    with pytest.raises(SpecError):
        TrainingSpec(global_batch=8, seq_len=1024, steps=10, tokens=100)
    assert TrainingSpec(global_batch=8, seq_len=1024, tokens=8 * 1024 * 10 + 1).num_steps == 11
    with pytest.raises(SpecError) as exc:
        TrainingSpec(global_batch=8, seq_len=2048).check_against(ModelSpec.from_name("gpt2"))
    assert exc.value.field == "seq_len"


def test_parallel_config_checks() -> None:
    m = ModelSpec.from_name("gpt2")  # 12 heads, 12 layers
    t = TrainingSpec(global_batch=16, seq_len=1024)
    ParallelConfig(tp=4, pp=3, dp=2, micro_batch=2).check(m, t)
    for par, field in [
        (ParallelConfig(tp=8), "tp"),
        (ParallelConfig(pp=5), "pp"),
        (ParallelConfig(dp=3), "micro_batch"),
    ]:
        with pytest.raises(SpecError) as exc:
            par.check(m, t)
        assert exc.value.field == field
    assert ParallelConfig(tp=1, sequence_parallel=True).sequence_parallel is False
    assert ParallelConfig(recompute="full").recompute is Recompute.FULL
    with pytest.raises(SpecError):
        ParallelConfig(zero_stage=4)


def test_hf_config_head_dim_other_than_hidden_over_heads_is_refused() -> None:
    """Mistral-Nemo's config.json: hidden 5120, 32 heads, head_dim 128, so Q is 4096 wide,
    not 5120; pricing it as 5120 / 32 = 160 would count the wrong projections. A head_dim
    that equals hidden / heads (Llama 3's 4096 / 32 = 128) is accepted as before."""
    nemo = {**HF_CONFIGS["mistral"], "hidden_size": 5120, "head_dim": 128}
    with pytest.raises(SpecError) as exc:
        ModelSpec.from_hf_config(nemo)
    assert exc.value.field == "config.head_dim" and "5120 / 32" in exc.value.reason
    same = ModelSpec.from_hf_config({**HF_CONFIGS["llama"], "head_dim": 128})
    assert same.num_params() == MODEL_CATALOG["llama-2-7b"].num_params()
