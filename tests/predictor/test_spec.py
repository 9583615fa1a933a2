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


# -- other Hugging Face model types mapped onto the known families ------------------------

OPT_1_3B = {  # facebook/opt-1.3b config.json (the keys that size the model)
    "_name_or_path": "facebook/opt-1.3b", "architectures": ["OPTForCausalLM"],
    "model_type": "opt", "activation_function": "relu", "do_layer_norm_before": True,
    "ffn_dim": 8192, "hidden_size": 2048, "max_position_embeddings": 2048,
    "num_attention_heads": 32, "num_hidden_layers": 24, "vocab_size": 50272,
    "word_embed_proj_dim": 2048, "torch_dtype": "float16",
}
GEMMA_2B = {  # google/gemma-2b config.json (no tie_word_embeddings: GemmaConfig's True)
    "architectures": ["GemmaForCausalLM"], "model_type": "gemma", "head_dim": 256,
    "hidden_act": "gelu", "hidden_size": 2048, "intermediate_size": 16384,
    "max_position_embeddings": 8192, "num_attention_heads": 8, "num_hidden_layers": 18,
    "num_key_value_heads": 1, "rms_norm_eps": 1e-06, "vocab_size": 256000,
}
GEMMA_7B = {**GEMMA_2B, "hidden_size": 3072, "intermediate_size": 24576,  # google/gemma-7b
            "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 16}
PHI3_MINI = {  # microsoft/Phi-3-mini-4k-instruct config.json
    "architectures": ["Phi3ForCausalLM"], "model_type": "phi3", "hidden_act": "silu",
    "hidden_size": 3072, "intermediate_size": 8192, "max_position_embeddings": 4096,
    "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 32,
    "original_max_position_embeddings": 4096, "rope_scaling": None, "sliding_window": 2047,
    "tie_word_embeddings": False, "vocab_size": 32064,
}
PHI4_MINI = {  # microsoft/Phi-4-mini-instruct config.json: GQA, tied, 3/4 rotary
    **PHI3_MINI, "num_attention_heads": 24, "num_key_value_heads": 8, "vocab_size": 200064,
    "max_position_embeddings": 131072, "partial_rotary_factor": 0.75,
    "sliding_window": 262144, "tie_word_embeddings": True,
}
ROBERTA_BASE = {  # FacebookAI/roberta-base config.json
    "architectures": ["RobertaForMaskedLM"], "model_type": "roberta", "hidden_act": "gelu",
    "hidden_size": 768, "intermediate_size": 3072, "layer_norm_eps": 1e-05,
    "max_position_embeddings": 514, "num_attention_heads": 12, "num_hidden_layers": 12,
    "type_vocab_size": 1, "vocab_size": 50265,
}
XLM_ROBERTA_BASE = {**ROBERTA_BASE, "model_type": "xlm-roberta", "vocab_size": 250002,
                    "architectures": ["XLMRobertaForMaskedLM"]}  # FacebookAI/xlm-roberta-base


def test_opt_1_3b_is_gpt2_with_a_relu_mlp() -> None:
    """facebook/opt-1.3b: 1,315,758,080 parameters (OPTForCausalLM). By hand, per layer:
    q/k/v/out_proj 4 x (2048² + 2048) = 16,785,408; fc1 + fc2 2 x 2048 x 8192 + 8192 + 2048
    = 33,564,672; two LayerNorms 2 x 2 x 2048 = 8,192 -> 50,358,272, x 24 = 1,208,598,528.
    Tokens 50,272 x 2048 = 102,957,056 (lm_head tied); positions 2048 x 2048 = 4,194,304;
    final LayerNorm 4,096: 1,315,753,984. OPT's learned positions have 2 more rows (the
    fairseq offset: Embedding(2050, 2048)), 4,096 parameters the spec leaves out."""
    m = ModelSpec.from_hf_config(OPT_1_3B)
    assert m.family is Family.GPT2 and m.activation == "relu" and not m.swiglu
    assert m.mlp_kept == 1 and m.tie_embeddings and m.linear_bias and m.qkv_bias
    assert (m.num_layers, m.hidden_size, m.num_heads, m.ffn_hidden_size) == (24, 2048, 32, 8192)
    assert (m.vocab_size, m.max_seq_len, m.name) == (50272, 2048, "facebook/opt-1.3b")
    assert m.layer_params() == 50_358_272
    assert m.num_params() == 1_315_753_984 == 1_315_758_080 - 2 * 2048
    # OPTConfig's default activation is relu; gelu / gelu_new are the gpt2 MLP
    default = {k: v for k, v in OPT_1_3B.items() if k != "activation_function"}
    assert ModelSpec.from_hf_config(default) == m
    for act in ("gelu", "gelu_new"):
        assert ModelSpec.from_hf_config({**OPT_1_3B, "activation_function": act}).activation \
            == "gelu"
    # a config written without word_embed_proj_dim (OPTConfig: hidden_size) is the same
    assert ModelSpec.from_hf_config({**default, "word_embed_proj_dim": None}) == m
    untied = ModelSpec.from_hf_config({**OPT_1_3B, "tie_word_embeddings": False})
    assert untied.num_params() - m.num_params() == 50272 * 2048


def test_opt_125m_by_hand() -> None:
    """facebook/opt-125m: 125,239,296 (OPTForCausalLM). 12 layers of 768 (ffn 3072): per
    layer 4 x (768² + 768) + 2 x 768 x 3072 + 3072 + 768 + 4 x 768 = 7,087,872, x 12 =
    85,054,464; tokens 50,272 x 768 = 38,608,896; positions 2048 x 768 = 1,572,864; final
    LayerNorm 1,536: 125,237,760, the published count less the 2 offset rows (1,536)."""
    m = ModelSpec.from_hf_config({**OPT_1_3B, "hidden_size": 768, "ffn_dim": 3072,
                                  "num_attention_heads": 12, "num_hidden_layers": 12,
                                  "word_embed_proj_dim": 768})
    assert m.num_params() == 125_237_760 == 125_239_296 - 2 * 768


@pytest.mark.parametrize("change, field", [
    ({"word_embed_proj_dim": 512, "hidden_size": 1024, "ffn_dim": 4096,  # opt-350m
      "num_attention_heads": 16, "do_layer_norm_before": False}, "config.word_embed_proj_dim"),
    ({"do_layer_norm_before": False}, "config.do_layer_norm_before"),
    ({"enable_bias": False}, "config.enable_bias"),
    ({"activation_function": "silu"}, "config.activation_function"),
    ({"activation_function": ["relu"]}, "config.activation_function"),
    ({"ffn_dim": None}, "config.ffn_dim"),
])
def test_opt_layouts_that_are_not_gpt2_are_refused(change: dict, field: str) -> None:
    with pytest.raises(SpecError) as exc:
        ModelSpec.from_hf_config({**OPT_1_3B, **change})
    assert exc.value.field == field


def test_gemma_is_llama_with_tied_embeddings() -> None:
    """google/gemma-2b: 2,506,172,416 parameters. Per layer: q 2048 x (8 x 256) = 4,194,304;
    k and v 2048 x 256 = 524,288 each (one kv head); o 4,194,304; GeGLU gate/up/down
    3 x 2048 x 16384 = 100,663,296; two RMSNorms 4,096 -> 110,104,576, x 18 =
    1,981,882,368. Embedding 256,000 x 2048 = 524,288,000 (tied); final norm 2,048:
    2,506,172,416, exactly.
    google/gemma-7b: 8,537,680,896. head_dim 256 x 16 heads = 4096 != hidden 3072, so the
    explicit width is kept. Per layer: q, k, v 3072 x 4096 and o 4096 x 3072 = 4 x
    12,582,912; 3 x 3072 x 24576 = 226,492,416; norms 6,144 -> 276,830,208, x 28 =
    7,751,245,824; embedding 256,000 x 3072 = 786,432,000; final norm 3,072: 8,537,680,896."""
    m = ModelSpec.from_hf_config(GEMMA_2B)
    assert m.family is Family.LLAMA and m.swiglu and m.rmsnorm and m.tie_embeddings
    assert (m.num_heads, m.num_kv_heads, m.head_dim, m.explicit_head_dim) == (8, 1, 256, 0)
    assert (m.ffn_hidden_size, m.vocab_size, m.max_seq_len) == (16384, 256000, 8192)
    assert m.layer_params() == 110_104_576
    assert m.num_params() == 2_506_172_416
    big = ModelSpec.from_hf_config(GEMMA_7B)
    assert (big.explicit_head_dim, big.attn_hidden, big.kv_hidden) == (256, 4096, 4096)
    assert big.layer_params() == 276_830_208
    assert big.num_params() == 8_537_680_896
    # GemmaConfig's defaults: head_dim 256, num_key_value_heads 16, tied embeddings
    bare = {k: v for k, v in GEMMA_7B.items() if k not in ("head_dim", "num_key_value_heads")}
    assert ModelSpec.from_hf_config(bare) == big
    untied = ModelSpec.from_hf_config({**GEMMA_2B, "tie_word_embeddings": False})
    assert untied.num_params() - m.num_params() == 256000 * 2048


@pytest.mark.parametrize("config, field, says", [
    ({**GEMMA_2B, "attention_bias": True}, "config.attention_bias", "gemma"),
    ({**GEMMA_2B, "use_bidirectional_attention": True}, "config.use_bidirectional_attention",
     "causal"),
    ({**GEMMA_2B, "model_type": "gemma2"}, "config.model_type", "soft-capping"),
    ({**GEMMA_2B, "model_type": "gemma3_text"}, "config.model_type", "sandwich norms"),
    ({**GEMMA_2B, "model_type": "gemma3"}, "config.model_type", "Gemma 2 and 3"),
])
def test_gemma_variants_that_are_not_llama_are_refused(config: dict, field: str,
                                                       says: str) -> None:
    with pytest.raises(SpecError) as exc:
        ModelSpec.from_hf_config(config)
    assert exc.value.field == field and says in exc.value.reason


def test_phi3_is_llama() -> None:
    """microsoft/Phi-3-mini-4k-instruct: 3,821,079,552 parameters. The fused qkv_proj
    3072 x 9216 = 28,311,552 and gate_up_proj are llama's q/k/v and gate/up: per layer
    28,311,552 + o 9,437,184 + 3 x 3072 x 8192 = 75,497,472 + norms 6,144 = 113,252,352,
    x 32 = 3,624,075,264; embedding and the untied lm_head 2 x 32,064 x 3072 = 197,001,216;
    final norm 3,072: 3,821,079,552, exactly.
    microsoft/Phi-4-mini-instruct: 3,836,021,760. 24 heads of 128, 8 kv heads, tied, and
    partial_rotary_factor 0.75 (rotary has no parameters): per layer q 3072 x 3072 =
    9,437,184, k and v 3072 x 1024 = 3,145,728 each, o 9,437,184, MLP 75,497,472, norms
    6,144 -> 100,669,440, x 32 = 3,221,422,080; embedding 200,064 x 3072 = 614,596,608;
    final norm 3,072: 3,836,021,760."""
    m = ModelSpec.from_hf_config(PHI3_MINI)
    assert m.family is Family.LLAMA and m.swiglu and not m.tie_embeddings and not m.qkv_bias
    assert (m.num_heads, m.num_kv_heads, m.head_dim) == (32, 32, 96)
    assert m.layer_params() == 113_252_352
    assert m.num_params() == 3_821_079_552
    # Phi3Config: num_key_value_heads None -> num_attention_heads, untied by default
    bare = {k: v for k, v in PHI3_MINI.items()
            if k not in ("num_key_value_heads", "tie_word_embeddings")}
    assert ModelSpec.from_hf_config(bare) == m
    phi4 = ModelSpec.from_hf_config(PHI4_MINI)
    assert (phi4.num_heads, phi4.num_kv_heads, phi4.head_dim) == (24, 8, 128)
    assert phi4.tie_embeddings and phi4.layer_params() == 100_669_440
    assert phi4.num_params() == 3_836_021_760


def test_phi_2_is_not_phi3() -> None:
    with pytest.raises(SpecError) as exc:
        ModelSpec.from_hf_config({"model_type": "phi", "hidden_size": 2560,
                                  "num_hidden_layers": 32, "num_attention_heads": 32,
                                  "intermediate_size": 10240, "vocab_size": 51200,
                                  "max_position_embeddings": 2048})
    assert exc.value.field == "config.model_type" and "parallel" in exc.value.reason


def test_roberta_is_bert() -> None:
    """FacebookAI/roberta-base (RobertaForMaskedLM): its safetensors hold 124,697,433
    parameters (and the 514 int64 position ids). Per layer, bert's: 4 x (768² + 768) +
    2 x 768 + (768 x 3072 + 3072) + (3072 x 768 + 768) + 2 x 768 = 7,087,872, x 12 =
    85,054,464; embeddings 50,265 x 768 = 38,603,520 + positions 514 x 768 = 394,752 +
    one token type 768 + LayerNorm 1,536 = 39,000,576; MLM head dense 768² + 768,
    LayerNorm 1,536, output bias 50,265 = 642,393 (decoder tied): 124,697,433, exactly
    (RobertaModel with its pooler instead of the head: 124,645,632).
    FacebookAI/xlm-roberta-base: 278,295,186 (the same with 250,002 tokens)."""
    m = ModelSpec.from_hf_config(ROBERTA_BASE)
    assert m.family is Family.BERT and not m.causal and m.learned_positions
    assert (m.type_vocab_size, m.max_seq_len, m.vocab_size) == (1, 514, 50265)
    assert m.layer_params() == 7_087_872
    assert m.embedding_params() == 39_000_576 and m.head_params() == 642_393
    assert m.num_params() == 124_697_433
    x = ModelSpec.from_hf_config(XLM_ROBERTA_BASE)
    assert x.family is Family.BERT and x.num_params() == 278_295_186
    # RobertaConfig keeps BertConfig's type_vocab_size default, 2
    bare = {k: v for k, v in ROBERTA_BASE.items() if k != "type_vocab_size"}
    assert ModelSpec.from_hf_config(bare).num_params() == m.num_params() + 768


@pytest.mark.parametrize("change, field", [
    ({"position_embedding_type": "relative_key"}, "config.position_embedding_type"),
    ({"add_cross_attention": True}, "config.add_cross_attention"),
    ({"intermediate_size": None}, "config.intermediate_size"),
])
def test_roberta_layouts_that_are_not_bert_are_refused(change: dict, field: str) -> None:
    for base in (ROBERTA_BASE, XLM_ROBERTA_BASE):
        with pytest.raises(SpecError) as exc:
            ModelSpec.from_hf_config({**base, **change})
        assert exc.value.field == field


@pytest.mark.parametrize("config", [
    {**HF_CONFIGS["mistral"], "model_type": "mixtral", "num_local_experts": 8,
     "num_experts_per_tok": 2},
    {**HF_CONFIGS["qwen2"], "model_type": "qwen2_moe", "num_experts": 60},
    {"model_type": "deepseek_v2", "n_routed_experts": 160},
    {"model_type": "deepseek_v3"},
    {"model_type": "some_new_moe"},
    {"model_type": "brand_new", "num_local_experts": 4},
])
def test_mixture_of_experts_is_refused_and_says_so(config: dict) -> None:
    with pytest.raises(SpecError) as exc:
        ModelSpec.from_hf_config(config)
    assert exc.value.field == "config.model_type"
    assert "mixture-of-experts" in exc.value.reason and "not modelled" in exc.value.reason


@pytest.mark.parametrize("model_type", ["t5", "mixtral", "gemma2", "phi", 7, ["llama"]])
def test_unsupported_types_list_every_supported_one(model_type) -> None:
    with pytest.raises(SpecError) as exc:
        ModelSpec.from_hf_config({"model_type": model_type})
    assert exc.value.field == "config.model_type"
    for supported in ("gpt2", "llama", "mistral", "qwen2", "qwen3", "gpt_neox", "bert", "opt",
                      "gemma", "phi3", "roberta", "xlm-roberta"):
        assert supported in exc.value.reason
    with pytest.raises(SpecError) as exc:
        ModelSpec.from_hf_config({"hidden_size": 768})
    assert exc.value.field == "config.model_type" and "xlm-roberta" in exc.value.reason


def test_family_aliases_are_the_same_spec() -> None:
    dims = dict(name="x", num_layers=2, hidden_size=256, num_heads=8, vocab_size=1000,
                max_seq_len=512)
    llama = ModelSpec(**dims, family="llama", ffn_hidden_size=688, tie_embeddings=False)
    for alias in ("mistral", "phi3"):
        m = ModelSpec(**dims, family=alias, ffn_hidden_size=688, tie_embeddings=False)
        assert m.family is Family.LLAMA and m == llama and hash(m) == hash(llama)
    bert = ModelSpec(**dims, family="bert", type_vocab_size=1)
    for alias in ("roberta", "xlm-roberta"):
        m = ModelSpec.from_dict({**dims, "family": alias, "type_vocab_size": 1})
        assert m.family is Family.BERT and m == bert and hash(m) == hash(bert)
    # the aliased dims of a config are the config's spec
    phi = ModelSpec(name="hf-phi3", family="phi3", num_layers=32, hidden_size=3072,
                    num_heads=32, vocab_size=32064, max_seq_len=4096, ffn_hidden_size=8192,
                    tie_embeddings=False)
    assert phi == ModelSpec.from_hf_config(PHI3_MINI)


@pytest.mark.parametrize("family, says", [
    ("opt", 'activation: "relu"'), ("gemma", "tie_embeddings: true"),
    ("gemma2", "known:"), ("Llama", "known:"),
])
def test_families_that_are_not_aliases_say_what_to_give(family: str, says: str) -> None:
    with pytest.raises(SpecError) as exc:
        ModelSpec(name="x", family=family, num_layers=2, hidden_size=256, num_heads=8,
                  vocab_size=1000, max_seq_len=512, ffn_hidden_size=688)
    assert exc.value.field == "family" and says in exc.value.reason
    if family in ("opt", "gemma"):
        assert "hf_config" in exc.value.reason
        assert ("gpt2" if family == "opt" else "llama") in exc.value.reason.split(". ")[-1]


def test_frenzy_memory_prices_an_opt_config() -> None:
    """``frenzy memory --spec`` with ``hf_config``: OPT-1.3B is priced as the gpt2 layout
    with a ReLU MLP (one f-wide tensor kept per MLP, where GeLU keeps two), its weights as
    the 1,315,753,984 parameters in fp32 (whole at tp = dp = 1; the Trainer's bf16 is
    autocast over the fp32 model, whose weights are the master) under the Hugging Face
    Trainer that runs OPT's own code; the
    built-in trainer, which builds gpt2's GeLU MLP only, refuses it by the field; the same
    dims by hand price the same; unknown spec keys are still errors."""
    from predictor.memory_spec import memory_report

    plan = {"global_batch": 8, "seq_len": 2048, "tp": 1, "dp": 1, "micro_batch": 1,
            "precision": "bf16", "runtime": "hf-trainer"}
    with pytest.raises(SpecError) as exc:
        memory_report({"hf_config": OPT_1_3B, **plan, "runtime": "frenzy"})
    assert exc.value.field == "activation" and "hf-trainer" in exc.value.reason
    by_config = memory_report({"hf_config": OPT_1_3B, **plan})
    assert by_config["tensors_bytes"] > 0
    assert by_config["breakdown"]["parameters"] == 4 * 1_315_753_984
    dims = {"family": "gpt2", "num_layers": 24, "hidden_size": 2048, "num_heads": 32,
            "ffn_hidden_size": 8192, "vocab_size": 50272, "max_seq_len": 2048,
            "activation": "relu", "name": "facebook/opt-1.3b"}
    by_hand = memory_report({"model": dims, **plan})
    assert by_hand["tensors_bytes"] == by_config["tensors_bytes"]
    # GeLU keeps one more f-wide tensor per layer: at a micro-batch of 8 (the activations'
    # peak; at 1 the optimizer step is the peak) 24 layers x 8 x 2048 x 8192 bf16 more, and
    # its backward's working set at the first layer is up to two f-wide tensors larger
    whole = {**plan, "micro_batch": 8}
    relu = memory_report({"hf_config": OPT_1_3B, **whole})
    gelu = memory_report({"hf_config": {**OPT_1_3B, "activation_function": "gelu"}, **whole})
    kept = 24 * 8 * 2048 * 8192 * 2
    assert kept <= gelu["tensors_bytes"] - relu["tensors_bytes"] <= kept + 2 * kept // 24
    # dims with an alias family price like the family's
    phi = {"family": "phi3", "num_layers": 32, "hidden_size": 3072, "num_heads": 32,
           "ffn_hidden_size": 8192, "vocab_size": 32064, "max_seq_len": 4096,
           "tie_embeddings": False}
    # (Phi-3's config sets no dropout, which the Trainer's profile reads; by dimensions
    # the profile keeps its masks unless told: (2·32 + 1) one-byte h·T masks)
    by_config = memory_report({"hf_config": PHI3_MINI, **plan})["tensors_bytes"]
    assert memory_report({"model": phi, **plan, "dropout": 0.0})["tensors_bytes"] == by_config
    assert memory_report({"model": phi, **plan})["tensors_bytes"] - by_config == \
        65 * 3072 * 2048
    with pytest.raises(SpecError) as exc:
        memory_report({"hf_config": OPT_1_3B, **plan, "hf_confg": {}})
    assert exc.value.field == "hf_confg"
    with pytest.raises(SpecError) as exc:
        memory_report({"model": {**dims, "ffn_dim": 8192}, **plan})
    assert exc.value.field == "model.ffn_dim"
    with pytest.raises(SpecError) as exc:
        memory_report({"hf_config": {**OPT_1_3B, "do_layer_norm_before": False}, **plan})
    assert exc.value.field == "hf_config.do_layer_norm_before"


@pytest.mark.parametrize(("field", "written", "canonical"), [
    ("precision", "bfloat16", "bf16"), ("precision", "bf16-mixed", "bf16"),
    ("precision", "16-mixed", "fp16"), ("precision", 16, "fp16"), ("precision", "float32", "fp32"),
    ("precision", "BF16", "bf16"),
    ("optimizer", "torch.optim.AdamW", "adamw"), ("optimizer", "adamw_torch_fused", "adamw"),
    ("optimizer", "FusedAdam", "adamw"), ("optimizer", "paged_adamw_8bit", "paged_adamw8bit"),
    ("optimizer", "adamw_bnb_8bit", "adamw8bit"), ("optimizer", "Adam", "adam"),
    ("optimizer", "torch.optim.SGD", "sgd"),
])
def test_precisions_and_optimizers_as_frameworks_write_them(field: str, written: object,
                                                            canonical: str) -> None:
    train = TrainingSpec(global_batch=8, seq_len=64, **{field: written})
    assert getattr(train, field).value == canonical


@pytest.mark.parametrize(("written", "canonical"), [
    (True, "full"), (False, "none"), ("gradient_checkpointing", "full"), ("Selective", "selective"),
    ("off", "none"),
])
def test_recompute_as_users_write_it(written: object, canonical: str) -> None:
    assert ParallelConfig(recompute=written).recompute.value == canonical  # type: ignore[arg-type]


def test_unknown_spellings_still_name_the_field() -> None:
    for field, value in (("precision", "bf16-true"), ("precision", "fp8"), ("optimizer", "lion")):
        with pytest.raises(SpecError) as exc:
            TrainingSpec(global_batch=8, seq_len=64, **{field: value})
        assert exc.value.field == field
    with pytest.raises(SpecError) as exc:
        TrainingSpec(global_batch=8, seq_len=64, precision="bf16-true")
    assert "pure_low_precision" in exc.value.reason  # pure bf16: a runtime option, not a mode
    with pytest.raises(SpecError) as exc:
        ParallelConfig(recompute="sometimes")  # type: ignore[arg-type]
    assert exc.value.field == "recompute"
