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


QWEN3_06B = {  # Qwen/Qwen3-0.6B config.json (the keys that matter)
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "attention_bias": False,
    "head_dim": 128, "hidden_act": "silu", "hidden_size": 1024, "intermediate_size": 3072,
    "max_position_embeddings": 40960, "num_attention_heads": 16, "num_hidden_layers": 28,
    "num_key_value_heads": 8, "rms_norm_eps": 1e-06, "rope_theta": 1000000,
    "tie_word_embeddings": True, "use_sliding_window": False, "vocab_size": 151936,
}


def test_qwen3_0_6b_parameter_count_by_hand() -> None:
    """Qwen3-0.6B: 0.6B parameters, 0.44B without the embedding (model card). By hand, per
    layer: q 1024 x (16 x 128 = 2048) = 2,097,152; k and v 1024 x (8 x 128) = 1,048,576
    each; o 2048 x 1024 = 2,097,152; q_norm and k_norm 128 each; SwiGLU 3 x 1024 x 3072 =
    9,437,184; two RMSNorms 2 x 1024 -> 15,730,944, x 28 layers = 440,466,432. Embedding
    151,936 x 1024 = 155,582,464 (tied: no separate head), final norm 1,024. Total
    596,049,920 (non-embedding 440,467,456 = 0.44B)."""
    m = ModelSpec.from_hf_config(QWEN3_06B, name="qwen3-0.6b")
    assert m.family is Family.QWEN3 and m.qk_norm and not m.qkv_bias
    assert (m.head_dim, m.attn_hidden, m.kv_hidden) == (128, 2048, 1024)
    assert m.layer_params() == 15_730_944
    assert m.embedding_params() == 155_582_464 and m.head_params() == 1024
    assert m.num_params() == 596_049_920
    assert m == MODEL_CATALOG["qwen3-0.6b"].with_(name="qwen3-0.6b")
    # the same config without head_dim would be 16 heads of 64: 3 x 1024² + ... fewer
    # parameters (the refusal this replaces existed to prevent exactly that mispricing)
    implicit = ModelSpec.from_hf_config({**QWEN3_06B, "head_dim": None})
    assert implicit.head_dim == 64 and implicit.num_params() < m.num_params()


def test_hf_config_keeps_an_explicit_head_dim() -> None:
    """Mistral-Nemo's config.json: hidden 5120, 32 heads, head_dim 128, so Q is 4096 wide,
    not 5120. By hand, per layer: q 5120 x 4096 = 20,971,520; k, v 5120 x 1024 = 5,242,880
    each; o 4096 x 5120 = 20,971,520; SwiGLU 3 x 5120 x 14336 = 220,200,960; norms 10,240 ->
    272,640,000; x 40 = 10,905,600,000; embedding and untied head 2 x 131,072 x 5120 =
    1,342,177,280; final norm 5120: 12,247,782,400 (the model card's 12.2B). A head_dim that
    equals hidden / heads (Llama 3's 4096 / 32 = 128) is the same spec as without it."""
    nemo = {**HF_CONFIGS["mistral"], "hidden_size": 5120, "head_dim": 128,
            "num_hidden_layers": 40, "vocab_size": 131072, "max_position_embeddings": 1024000}
    m = ModelSpec.from_hf_config(nemo, name="mistral-nemo-12b")
    assert (m.head_dim, m.attn_hidden, m.kv_hidden) == (128, 4096, 1024)
    assert m.layer_params() == 272_640_000
    assert m.num_params() == 12_247_782_400
    assert m == MODEL_CATALOG["mistral-nemo-12b"]
    same = ModelSpec.from_hf_config({**HF_CONFIGS["llama"], "head_dim": 128})
    assert same == ModelSpec.from_hf_config(HF_CONFIGS["llama"])
    assert same.explicit_head_dim == 0 and same.num_params() == MODEL_CATALOG[
        "llama-2-7b"].num_params()
    for bad in (0, -128, "128", 12.5, True):
        with pytest.raises(SpecError) as exc:
            ModelSpec.from_hf_config({**nemo, "head_dim": bad})
        assert exc.value.field == "config.head_dim"
    with pytest.raises(SpecError) as exc:
        ModelSpec.from_hf_config({**QWEN3_06B, "attention_bias": True})
    assert exc.value.field == "config.attention_bias"


def test_explicit_head_dim_validation_and_identity() -> None:
    base = dict(name="x", family=Family.LLAMA, num_layers=2, hidden_size=1000, num_heads=12,
                num_kv_heads=4, ffn_hidden_size=2048, vocab_size=1000, max_seq_len=512)
    # 1000 / 12 does not divide: refused without head_dim, accepted with one
    with pytest.raises(SpecError) as exc:
        ModelSpec(**base)
    assert exc.value.field == "hidden_size" and "head_dim" in exc.value.reason
    m = ModelSpec(**base, explicit_head_dim=96)
    assert (m.head_dim, m.attn_hidden, m.kv_hidden) == (96, 1152, 384)
    for bad in (-1, "96", 1.5, True, None):
        with pytest.raises(SpecError) as exc:
            ModelSpec(**{**base, "hidden_size": 1152}, explicit_head_dim=bad)
        assert exc.value.field == "head_dim"
    # the implicit width given explicitly is the same spec: equal, same hash, same dict
    plain = ModelSpec(**{**base, "hidden_size": 1152})
    given = ModelSpec(**{**base, "hidden_size": 1152}, explicit_head_dim=96)
    assert given == plain and hash(given) == hash(plain) and given.explicit_head_dim == 0
    assert plain != m.with_(hidden_size=1152, explicit_head_dim=64)
    # from_dict takes the user-facing name, or the field's, not both
    assert ModelSpec.from_dict({**base, "head_dim": 96}) == m
    assert ModelSpec.from_dict({**base, "explicit_head_dim": 96}) == m
    with pytest.raises(SpecError) as exc:
        ModelSpec.from_dict({**base, "head_dim": 96, "explicit_head_dim": 96})
    assert exc.value.field == "head_dim"
    # an explicit width survives a change of the hidden size (with_ keeps the field)
    assert m.with_(hidden_size=2048).head_dim == 96
    # families whose Hugging Face layout has no head_dim take none other than h / heads
    with pytest.raises(SpecError) as exc:
        ModelSpec(**{**base, "family": Family.GPT2}, explicit_head_dim=96)
    assert exc.value.field == "head_dim" and "gpt2" in exc.value.reason
    assert ModelSpec(**{**base, "family": Family.GPT2, "hidden_size": 1152},
                     explicit_head_dim=96) == ModelSpec(**{**base, "family": Family.GPT2,
                                                           "hidden_size": 1152})


def test_qwen3_family_traits() -> None:
    m = MODEL_CATALOG["qwen3-8b"]  # 32 heads of 128 = 4096: an implicit head width
    assert m.explicit_head_dim == 0 and m.head_dim == 128
    assert m.rmsnorm and m.swiglu and m.causal and m.qk_norm and not m.qkv_bias
    assert not m.linear_bias and not m.learned_positions
    # 8.19B (model card 8.2B): two 128-wide norm weights per layer over llama's layout
    llama_twin = ModelSpec("twin", Family.LLAMA, 36, 4096, 32, 151936, 40960, num_kv_heads=8,
                           ffn_hidden_size=12288, tie_embeddings=False)
    assert m.num_params() - llama_twin.num_params() == 36 * 2 * 128
    assert m.num_params() == 8_190_735_360
    with pytest.raises(SpecError) as exc:
        ModelSpec("q", Family.QWEN3, 2, 64, 4, 100, 64)  # SwiGLU: ffn must be given
    assert exc.value.field == "ffn_hidden_size"
