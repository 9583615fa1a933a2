"""What a user submits: the model (``ModelSpec``) and how to train it (``TrainingSpec``),
and the knobs of one parallel plan (``ParallelConfig``).

A ``ModelSpec`` comes from a catalog name (``ModelSpec.from_name``), a Hugging Face
``config.json`` dict (``ModelSpec.from_hf_config``) or explicit numbers (the constructor).
Every field is validated on construction; a bad value raises ``SpecError`` naming the field.

The architecture is described by traits rather than by family-specific code paths, so the
memory model, the step-time model and the PyTorch ground-truth builder all read the same few
facts: which norm, which MLP, which position embedding, which biases, tied or not.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from predictor.errors import SpecError


class Family(StrEnum):
    """Architecture families whose layer structure the predictor and the builder know."""

    GPT2 = "gpt2"  # pre-LN decoder, GeLU MLP, learned positions, tied embeddings, biases
    LLAMA = "llama"  # pre-RMSNorm decoder, SwiGLU MLP, rotary, GQA, no biases (also mistral,
    # phi3 and gemma: the same tensors)
    QWEN2 = "qwen2"  # llama layout with q/k/v biases
    QWEN3 = "qwen3"  # llama layout with per-head RMSNorm on Q and K (q_norm, k_norm)
    GPT_NEOX = "gpt_neox"  # parallel-residual decoder, GeLU MLP, rotary, untied output
    BERT = "bert"  # post-LN bidirectional encoder, GeLU MLP, learned positions, MLM head


ACTIVATIONS = ("", "gelu", "relu", "swiglu")
"""MLP activations a ``ModelSpec`` may name; "" keeps the family's own."""

DECODER_FAMILIES = frozenset({Family.GPT2, Family.LLAMA, Family.QWEN2, Family.QWEN3,
                              Family.GPT_NEOX})
LLAMA_LAYOUT = frozenset({Family.LLAMA, Family.QWEN2, Family.QWEN3})
"""Families with the llama layer: pre-RMSNorm, SwiGLU MLP, rotary, GQA."""

FAMILY_ALIASES: dict[str, Family] = {
    "mistral": Family.LLAMA, "phi3": Family.LLAMA, "roberta": Family.BERT,
    "xlm-roberta": Family.BERT,
}
"""Other names a ``family`` may be given by: architectures whose layers are exactly a known
family's, with the same defaults (untied llama-style heads; bert's encoder and MLM head)."""

_FAMILY_HINTS = {
    "opt": "OPT is the gpt2 layout with a ReLU MLP: give family gpt2 with activation: "
           "\"relu\" (ffn_hidden_size: its ffn_dim)",
    "gemma": "Gemma is the llama layout with tied embeddings: give family llama with "
             "tie_embeddings: true and head_dim (256)",
}
"""Families that are a known one with other defaults: what to give instead."""


class Precision(StrEnum):
    FP32 = "fp32"  # everything in fp32
    FP16 = "fp16"  # fp16 params/activations, fp32 master weights, grads and optimizer states
    BF16 = "bf16"  # as fp16, in bfloat16


class Optimizer(StrEnum):
    ADAM = "adam"
    ADAMW = "adamw"
    SGD = "sgd"  # with momentum (one fp32 state per parameter)
    # bitsandbytes 8-bit block-wise Adam / AdamW (m and v in 1 byte each), and their paged
    # variants (large states in CUDA unified memory); transformers' Adafactor (factored
    # second moment, no first moment: beta1=None). Sizes: predictor.memory._optimizer_states
    ADAM8BIT = "adam8bit"
    ADAMW8BIT = "adamw8bit"
    PAGED_ADAM8BIT = "paged_adam8bit"
    PAGED_ADAMW8BIT = "paged_adamw8bit"
    ADAFACTOR = "adafactor"

    @property
    def eight_bit(self) -> bool:
        """A bitsandbytes 8-bit optimizer (paged or not)."""
        return self.value.endswith("8bit")

    @property
    def paged(self) -> bool:
        return self.value.startswith("paged_")


class Recompute(StrEnum):
    NONE = "none"
    SELECTIVE = "selective"  # recompute the attention core (Korthikanti et al. 2022)
    FULL = "full"  # keep only each layer's input; recompute the layer in backward


def _positive_int(field_name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecError(field_name, f"must be a positive integer, got {value!r}")
    if value <= 0:
        raise SpecError(field_name, f"must be a positive integer, got {value}")
    return value


@dataclass(frozen=True)
class ModelSpec:
    """A transformer's dimensions and architecture traits.

    ``num_kv_heads`` defaults to ``num_heads`` (multi-head attention) and ``ffn_hidden_size``
    to 4·hidden for GeLU families; llama-style families must give it.
    ``explicit_head_dim`` is the width of one attention head when it is not
    ``hidden_size / num_heads`` (Qwen3, Mistral-Nemo: Q is ``num_heads · head_dim`` wide, not
    ``hidden_size``; llama-layout families only); 0 keeps ``hidden_size / num_heads``, which
    then must divide. A value
    equal to that is stored as 0, so the same model is one spec either way. ``head_dim`` is
    the effective width; ``from_dict`` takes it under that name.
    """

    name: str
    family: Family
    num_layers: int
    hidden_size: int
    num_heads: int
    vocab_size: int
    max_seq_len: int
    num_kv_heads: int = 0
    ffn_hidden_size: int = 0
    tie_embeddings: bool = True
    type_vocab_size: int = 0  # bert token-type embeddings
    activation: str = ""  # MLP activation: "" = the family's (gelu / swiglu), or one of ACTIVATIONS
    explicit_head_dim: int = 0  # one head's width; 0: hidden_size / num_heads
    # the dropouts a Hugging Face config.json sets, as its model code applies them (None:
    # not from a config): residual-branch / embedding dropout and attention-probability
    # dropout. A runtime that runs the model's own code keeps masks only where they are > 0
    # (``RuntimeProfile.for_model``, which carries them into the profile, so the model's
    # identity, equality and hash, stays its architecture)
    config_hidden_dropout: float | None = field(default=None, compare=False)
    config_attention_dropout: float | None = field(default=None, compare=False)
    # the config's MLP activation is transformers' NewGELUActivation (gpt2's "gelu_new"),
    # a chain of element-wise ops rather than one fused GeLU kernel
    config_gelu_composite: bool = field(default=False, compare=False)

    def __hash__(self) -> int:
        # cached (outside the fields, so asdict/replace never see it): the predictor's lookup
        # tables are keyed by the model thousands of times per plan search
        return self.__dict__["_hash"]

    def __post_init__(self) -> None:
        try:
            family = Family(self.family)
        except ValueError:
            family = FAMILY_ALIASES.get(self.family) if isinstance(self.family, str) else None
            if family is None:
                raise SpecError("family", _unknown_family(self.family)) from None
        object.__setattr__(self, "family", family)
        for name in ("num_layers", "hidden_size", "num_heads", "vocab_size", "max_seq_len"):
            _positive_int(name, getattr(self, name))
        if not self.num_kv_heads:
            object.__setattr__(self, "num_kv_heads", self.num_heads)
        if not self.ffn_hidden_size:
            if family in LLAMA_LAYOUT:
                raise SpecError("ffn_hidden_size", "llama-style models must give it (SwiGLU)")
            object.__setattr__(self, "ffn_hidden_size", 4 * self.hidden_size)
        _positive_int("num_kv_heads", self.num_kv_heads)
        _positive_int("ffn_hidden_size", self.ffn_hidden_size)
        hd = self.explicit_head_dim
        if hd:
            _positive_int("head_dim", hd)
            if hd * self.num_heads == self.hidden_size:
                object.__setattr__(self, "explicit_head_dim", 0)  # the implicit width
            elif family not in LLAMA_LAYOUT:  # (their HF layouts have no head_dim to export)
                raise SpecError("head_dim", f"{family.value} heads are hidden_size / num_heads "
                                "wide; only llama, qwen2 and qwen3 models set their own")
        elif isinstance(hd, bool) or not isinstance(hd, int):
            raise SpecError("head_dim", f"must be a positive integer, got {hd!r}")
        if not self.explicit_head_dim and self.hidden_size % self.num_heads:
            raise SpecError(
                "hidden_size",
                f"{self.hidden_size} is not divisible by num_heads={self.num_heads} (give "
                "head_dim when the heads are not hidden_size / num_heads wide)",
            )
        if self.num_kv_heads > self.num_heads or self.num_heads % self.num_kv_heads:
            raise SpecError(
                "num_kv_heads",
                f"{self.num_kv_heads} must divide num_heads={self.num_heads}",
            )
        if self.activation not in ACTIVATIONS:
            raise SpecError("activation", f"unknown activation {self.activation!r}; one of "
                            f"{', '.join(a for a in ACTIVATIONS if a)} (or omit it)")
        if family is Family.BERT and self.type_vocab_size < 0:
            raise SpecError("type_vocab_size", "must be >= 0")
        key = (self.name, family, self.num_layers, self.hidden_size, self.num_heads,
               self.vocab_size, self.max_seq_len, self.num_kv_heads, self.ffn_hidden_size,
               self.tie_embeddings, self.type_vocab_size, self.activation)
        if self.explicit_head_dim:  # (implicit widths hash as they always have)
            key += (self.explicit_head_dim,)
        object.__setattr__(self, "_hash", hash(key))  # an instance attribute, not a field

    # -- architecture traits -------------------------------------------------------------
    @property
    def head_dim(self) -> int:
        """Width of one attention head: the explicit one, else hidden_size / num_heads."""
        return self.explicit_head_dim or self.hidden_size // self.num_heads

    @property
    def attn_hidden(self) -> int:
        """Width of the Q projection and of the attention output: heads · head_dim
        (``hidden_size`` unless the head width is explicit)."""
        return self.num_heads * self.head_dim

    @property
    def kv_hidden(self) -> int:
        """Width of the K (and of the V) projection: kv_heads · head_dim."""
        return self.num_kv_heads * self.head_dim

    @property
    def qk_norm(self) -> bool:
        """Per-head RMSNorm (a ``head_dim``-wide weight each) on Q and on K before rotary
        (Qwen3's ``q_norm`` / ``k_norm``)."""
        return self.family is Family.QWEN3

    @property
    def own_activation(self) -> str:
        """The family's own MLP activation (what ``activation`` "" means): SwiGLU for the
        llama layout, GeLU otherwise."""
        return "swiglu" if self.family in LLAMA_LAYOUT else "gelu"

    @property
    def swiglu(self) -> bool:
        return (self.activation or self.own_activation) == "swiglu"

    @property
    def mlp_kept(self) -> int:
        """f-wide tensors one MLP keeps for backward: ReLU 1 (its output serves its own
        backward and the next matmul's), GeLU 2 (input and output), SwiGLU 3 (gate, up,
        product)."""
        if self.swiglu:
            return 3
        return 1 if self.activation == "relu" else 2

    @property
    def rmsnorm(self) -> bool:
        return self.family in LLAMA_LAYOUT

    @property
    def linear_bias(self) -> bool:
        """Do the attention-output and MLP linears carry biases?"""
        return self.family in (Family.GPT2, Family.GPT_NEOX, Family.BERT)

    @property
    def qkv_bias(self) -> bool:
        return self.family in (Family.GPT2, Family.GPT_NEOX, Family.BERT, Family.QWEN2)

    def op_sac_linears(self) -> tuple[tuple[str, bool], ...]:
        """The layer's linears in the order it runs them, each with whether torchtitan's
        per-op selective checkpointing saves its output: the policy saves every ``aten.mm``
        but the 2nd, 4th, ...; a linear with a bias runs as ``addmm``, which it neither
        counts nor saves. Names: q, k, v (or qkv), o, gate, up (SwiGLU; else up alone), down."""
        attn = ("q", "k", "v") if self.family in LLAMA_LAYOUT else ("qkv",)
        mlp = ("gate", "up") if self.swiglu else ("up",)
        out, count = [], 0
        for name in (*attn, "o", *mlp, "down"):
            is_mm = not (self.qkv_bias if name in ("q", "k", "v", "qkv") else self.linear_bias)
            count += is_mm
            out.append((name, is_mm and count % 2 == 1))
        return tuple(out)

    @property
    def learned_positions(self) -> bool:
        return self.family in (Family.GPT2, Family.BERT)

    @property
    def causal(self) -> bool:
        return self.family in DECODER_FAMILIES

    # -- parameter counts (exactly those of predictor.measure's PyTorch build) -------------
    def layer_params(self) -> int:
        """Parameters of one transformer layer."""
        h, f, kv, q = self.hidden_size, self.ffn_hidden_size, self.kv_hidden, self.attn_hidden
        norm = h if self.rmsnorm else 2 * h
        attn = h * (q + 2 * kv) + q * h
        if self.qkv_bias:
            attn += q + 2 * kv
        if self.linear_bias:
            attn += h
        if self.qk_norm:
            attn += 2 * self.head_dim
        if self.swiglu:
            mlp = 3 * h * f
        else:
            mlp = 2 * h * f + (f + h if self.linear_bias else 0)
        return attn + mlp + 2 * norm

    def embedding_params(self) -> int:
        """Input-side parameters: token (+ position, + token-type, + embedding LN)."""
        h = self.hidden_size
        n = self.vocab_size * h
        if self.learned_positions:
            n += self.max_seq_len * h
        if self.family is Family.BERT:
            n += self.type_vocab_size * h + 2 * h
        return n

    def head_params(self) -> int:
        """Output-side parameters: final norm, (untied) output projection, bert's MLM head."""
        h = self.hidden_size
        if self.family is Family.BERT:
            # MLM transform (dense + LN) and the output bias; decoder weight tied to embeddings
            return h * h + h + 2 * h + self.vocab_size
        n = h if self.rmsnorm else 2 * h
        if not self.tie_embeddings:
            n += self.vocab_size * h
        return n

    def num_params(self) -> int:
        return self.embedding_params() + self.num_layers * self.layer_params() + self.head_params()

    def frenzy_params(self) -> int:
        """The Frenzy paper's approximation W = V·h + l·(12h² + 13h)."""
        h = self.hidden_size
        return self.vocab_size * h + self.num_layers * (12 * h * h + 13 * h)

    # -- constructors ----------------------------------------------------------------------
    @staticmethod
    def from_name(name: str) -> ModelSpec:
        key = name.strip().lower()
        if key not in MODEL_CATALOG:
            close = difflib.get_close_matches(key, MODEL_CATALOG, n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise SpecError(
                "model",
                f"unknown model {name!r}{hint} Known: {', '.join(sorted(MODEL_CATALOG))}",
            )
        return MODEL_CATALOG[key]

    @staticmethod
    def from_hf_config(config: dict[str, Any], name: str | None = None) -> ModelSpec:
        """Build from a Hugging Face ``config.json`` whose ``model_type`` is one of
        ``HF_MODEL_TYPES``: gpt2, llama, mistral, qwen2, qwen3, gpt_neox, bert, and the
        types whose layers are exactly a known family's: opt (gpt2 with a ReLU MLP), gemma
        and phi3 (llama), roberta and xlm-roberta (bert). An explicit ``head_dim`` is kept;
        other types (mixture-of-experts, gemma2/3, phi, ...) are a ``SpecError`` naming
        ``config.model_type``."""
        model = _from_hf_config(config, name)
        hidden, attention = _config_dropout(config)
        composite = (config.get("model_type") == "gpt2"
                     and config.get("activation_function", "gelu_new") in COMPOSITE_GELUS)
        return replace(model, config_hidden_dropout=hidden, config_attention_dropout=attention,
                       config_gelu_composite=composite)

    def with_(self, **changes: Any) -> ModelSpec:
        return replace(self, **changes)

    @staticmethod
    def from_dict(data: dict[str, Any]) -> ModelSpec:
        """Build from a dict of fields, where the head width may be given as ``head_dim`` (the
        name users and ``config.json`` know it by) or as ``explicit_head_dim`` (the field,
        as ``asdict`` stores it)."""
        body = dict(data)
        if "head_dim" in body:
            if "explicit_head_dim" in body:
                raise SpecError("head_dim", "give head_dim or explicit_head_dim, not both")
            body["explicit_head_dim"] = body.pop("head_dim")
        return ModelSpec(**body)


def _need(config: dict[str, Any], *keys: str) -> Any:
    for k in keys:
        if k in config and config[k] is not None:
            return config[k]
    raise SpecError(
        f"config.{keys[0]}", f"missing from config.json (looked for {', '.join(keys)})"
    )


def _head_dim(config: dict[str, Any]) -> int:
    """A config's explicit ``head_dim`` (0 when absent: hidden_size / heads). Mistral-Nemo
    and the Qwen3 models set one other than that (Q is heads · head_dim wide)."""
    head_dim = config.get("head_dim")
    if head_dim is None:
        return 0
    if isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim <= 0:
        raise SpecError("config.head_dim", f"must be a positive integer, got {head_dim!r}")
    return head_dim


HF_MODEL_TYPES = ("gpt2", "llama", "mistral", "qwen2", "qwen3", "gpt_neox", "bert", "opt",
                  "gemma", "phi3", "roberta", "xlm-roberta")
"""The ``config.json`` ``model_type`` values ``ModelSpec.from_hf_config`` reads, each onto a
family: opt → gpt2 (ReLU MLP), gemma and phi3 → llama, roberta and xlm-roberta → bert."""

TRAINER_MODEL_TYPES = ("gpt2", "llama", "mistral", "qwen2", "qwen3", "gpt_neox", "bert")
"""The ``model_type`` values whose architecture the built-in trainer builds and whose weights
it loads and exports as that type; the other ``HF_MODEL_TYPES`` are priced with the family
whose tensors they share, but training one on the built-in trainer would train that family's
model (a ReLU OPT as a GeLU gpt2, a GeGLU Gemma as a SwiGLU llama), so a job needs its own
entrypoint for them."""

_MOE_MODEL_TYPES = frozenset({
    "mixtral", "qwen2_moe", "qwen3_moe", "qwen3_next", "deepseek_v2", "deepseek_v3",
    "phimoe", "dbrx", "jamba", "olmoe", "granitemoe", "granitemoeshared", "jetmoe",
    "switch_transformers", "nllb-moe", "gpt_oss", "llama4", "llama4_text", "minimax",
    "ernie4_5_moe", "glm4_moe", "hunyuan_v1_moe", "dots1", "bailing_moe",
})
_EXPERT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts")

_NOT_MODELLED = {
    **dict.fromkeys(
        ("gemma2", "gemma3", "gemma3_text"),
        "Gemma 2 and 3 layers are not modelled: sandwich norms (an RMSNorm before and after "
        "both attention and MLP, four a layer), logit soft-capping (Gemma 2: a second "
        "logits-sized tensor kept for backward), Gemma 3's Q/K norms and local/global "
        "attention. Only Gemma 1 (model_type gemma) is"),
    "phi": "phi (phi-1, phi-1.5, phi-2) is not modelled: attention and MLP run in parallel "
           "from one LayerNorm, with biased q/k/v and a biased output head (phi3 is)",
}
"""Common model types that look like a supported one but are not exactly it: why."""


def _unknown_family(family: Any) -> str:
    known = ", ".join(f.value for f in Family)
    aliases = ", ".join(f"{a} → {f.value}" for a, f in FAMILY_ALIASES.items())
    reason = f"unknown family {family!r}; known: {known} (aliases: {aliases})"
    hint = _FAMILY_HINTS.get(family) if isinstance(family, str) else None
    if hint:
        reason += f". {hint}, or pass its config.json as hf_config"
    return reason


def _unsupported_type(model_type: Any, config: dict[str, Any]) -> SpecError:
    kind = model_type if isinstance(model_type, str) else ""
    reason = _NOT_MODELLED.get(kind)
    experts = any(isinstance(config.get(k), int) and not isinstance(config.get(k), bool)
                  and config[k] > 1 for k in _EXPERT_KEYS)
    if reason is None and (kind in _MOE_MODEL_TYPES or "moe" in kind or experts):
        reason = ("a mixture-of-experts model, and mixture-of-experts layers (a router "
                  "and several expert MLPs a layer) are not modelled")
    return SpecError(
        "config.model_type",
        f"unsupported model_type {model_type!r}{f': {reason}' if reason else ''}; "
        f"supported: {', '.join(HF_MODEL_TYPES)}",
    )


def _opt_activation(config: dict[str, Any]) -> str:
    """OPT's ``activation_function`` (OPTConfig's default: relu) as a ``ModelSpec`` one."""
    act = config.get("activation_function", "relu")
    known = {"relu": "relu", "gelu": "gelu", "gelu_new": "gelu"}
    if not isinstance(act, str) or act not in known:
        raise SpecError("config.activation_function",
                        f"{act!r} is not modelled for opt; one of relu (the default), gelu, "
                        "gelu_new")
    return known[act]


COMPOSITE_GELUS = ("gelu_new",)
"""transformers' ``activation_function`` names built from element-wise ops (``ACT2FN``:
NewGELUActivation), not one fused kernel as ``gelu`` and ``gelu_pytorch_tanh`` are."""

# Per model_type, the config fields of the dropouts its modeling code applies, each with the
# config class's default (transformers 5): residual-branch and embedding dropouts, then the
# attention-probability dropout. Llama-layout models have no hidden dropout at all.
_Fields = tuple[tuple[str, float], ...]
_HF_DROPOUT_FIELDS: dict[str, tuple[_Fields, _Fields]] = {
    "gpt2": ((("resid_pdrop", 0.1), ("embd_pdrop", 0.1)), (("attn_pdrop", 0.1),)),
    "opt": ((("dropout", 0.1),), (("attention_dropout", 0.0),)),
    "gpt_neox": ((("hidden_dropout", 0.0),), (("attention_dropout", 0.0),)),
    "bert": ((("hidden_dropout_prob", 0.1),), (("attention_probs_dropout_prob", 0.1),)),
    "phi3": ((("resid_pdrop", 0.0), ("embd_pdrop", 0.0)), (("attention_dropout", 0.0),)),
    **{t: ((), (("attention_dropout", 0.0),))
       for t in ("llama", "mistral", "qwen2", "qwen3", "gemma")},
}
_HF_DROPOUT_FIELDS["roberta"] = _HF_DROPOUT_FIELDS["xlm-roberta"] = _HF_DROPOUT_FIELDS["bert"]


def _config_dropout(config: dict[str, Any]) -> tuple[float | None, float | None]:
    """The largest hidden and attention dropout probability ``config`` sets (the config
    class's default where a field is absent), or None for a type not listed."""
    fields_ = _HF_DROPOUT_FIELDS.get(config.get("model_type", ""))
    if fields_ is None:
        return None, None
    out: list[float] = []
    for group in fields_:
        p = 0.0
        for key, default in group:
            value = config.get(key, default)
            if isinstance(value, bool) or not isinstance(value, int | float) \
                    or not 0 <= value < 1:
                raise SpecError(f"config.{key}", f"a dropout probability in [0, 1), got "
                                f"{value!r}")
            p = max(p, float(value))
        out.append(p)
    return out[0], out[1]


def _from_hf_config(config: dict[str, Any], name: str | None) -> ModelSpec:
    if not isinstance(config, dict):
        raise SpecError("config", f"must be a JSON object, got {type(config).__name__}")
    model_type = config.get("model_type")
    if model_type is None:
        raise SpecError(
            "config.model_type",
            f"missing; one of {', '.join(HF_MODEL_TYPES)} is needed",
        )
    label = name or config.get("_name_or_path") or f"hf-{model_type}"
    if model_type == "gpt2":
        n_embd = _need(config, "n_embd", "hidden_size")
        return ModelSpec(
            name=label,
            family=Family.GPT2,
            num_layers=_need(config, "n_layer", "num_hidden_layers"),
            hidden_size=n_embd,
            num_heads=_need(config, "n_head", "num_attention_heads"),
            vocab_size=_need(config, "vocab_size"),
            max_seq_len=_need(config, "n_positions", "n_ctx", "max_position_embeddings"),
            ffn_hidden_size=config.get("n_inner") or 4 * n_embd,
            tie_embeddings=bool(config.get("tie_word_embeddings", True)),
        )
    if model_type == "opt":
        # OPTDecoder: learned positions (2 more rows than max_position_embeddings, the
        # fairseq offset), pre-LN layers with biased q/k/v/out_proj and fc1/fc2, a final
        # LayerNorm, lm_head tied to embed_tokens (PretrainedConfig's default): gpt2's layout
        hidden = _need(config, "hidden_size")
        proj = config.get("word_embed_proj_dim")  # OPTConfig: None -> hidden_size
        if proj is not None and proj != hidden:
            raise SpecError("config.word_embed_proj_dim",
                            f"{proj!r} != hidden_size {hidden}: the embeddings are {proj!r} "
                            "wide with project_in / project_out linears (opt-350m), which "
                            "is not modelled")
        if not config.get("do_layer_norm_before", True):
            raise SpecError("config.do_layer_norm_before",
                            "false (post-LN layers, opt-350m) is not modelled; only pre-LN "
                            "OPT (true, the default) is")
        if not config.get("enable_bias", True):
            raise SpecError("config.enable_bias",
                            "false (linears without biases) is not modelled; OPT's linears "
                            "carry biases (true, the default)")
        return ModelSpec(
            name=label,
            family=Family.GPT2,
            num_layers=_need(config, "num_hidden_layers"),
            hidden_size=hidden,
            num_heads=_need(config, "num_attention_heads"),
            vocab_size=_need(config, "vocab_size"),
            max_seq_len=_need(config, "max_position_embeddings"),
            ffn_hidden_size=_need(config, "ffn_dim"),
            tie_embeddings=bool(config.get("tie_word_embeddings", True)),
            activation=_opt_activation(config),
        )
    if model_type in ("llama", "mistral", "qwen2", "qwen3", "phi3"):
        # phi3: fused qkv_proj and gate_up_proj hold llama's q/k/v and gate/up parameters,
        # no biases; Phi3Config: num_key_value_heads None -> heads, tie_word_embeddings
        # False; partial_rotary_factor < 1 rotates fewer dims, which have no parameters
        heads = _need(config, "num_attention_heads")
        if model_type == "qwen3" and config.get("attention_bias"):
            raise SpecError("config.attention_bias", "true is not supported for qwen3 (biases "
                            "on q/k/v and o); only the published bias-free layout is")
        return ModelSpec(
            name=label,
            family={"qwen2": Family.QWEN2, "qwen3": Family.QWEN3}.get(model_type, Family.LLAMA),
            num_layers=_need(config, "num_hidden_layers"),
            hidden_size=_need(config, "hidden_size"),
            num_heads=heads,
            num_kv_heads=config.get("num_key_value_heads") or heads,
            ffn_hidden_size=_need(config, "intermediate_size"),
            vocab_size=_need(config, "vocab_size"),
            max_seq_len=_need(config, "max_position_embeddings"),
            tie_embeddings=bool(config.get("tie_word_embeddings", False)),
            explicit_head_dim=_head_dim(config),
        )
    if model_type == "gemma":
        # Gemma 1: llama's tensors (its GeGLU MLP has SwiGLU's gate/up/down and keeps the
        # same three f-wide tensors; RMSNorm's 1 + weight is one weight). GemmaConfig's
        # defaults: head_dim 256, num_key_value_heads 16, tie_word_embeddings True
        if config.get("attention_bias"):
            raise SpecError("config.attention_bias", "true is not supported for gemma (biases "
                            "on q/k/v and o); only the published bias-free layout is")
        if config.get("use_bidirectional_attention"):
            raise SpecError("config.use_bidirectional_attention", "true (a bidirectional "
                            "encoder) is not modelled for gemma; only the causal decoder is")
        return ModelSpec(
            name=label,
            family=Family.LLAMA,
            num_layers=_need(config, "num_hidden_layers"),
            hidden_size=_need(config, "hidden_size"),
            num_heads=_need(config, "num_attention_heads"),
            num_kv_heads=config.get("num_key_value_heads") or 16,
            ffn_hidden_size=_need(config, "intermediate_size"),
            vocab_size=_need(config, "vocab_size"),
            max_seq_len=_need(config, "max_position_embeddings"),
            tie_embeddings=bool(config.get("tie_word_embeddings", True)),
            explicit_head_dim=_head_dim({"head_dim": 256, **config}),
        )
    if model_type == "gpt_neox":
        return ModelSpec(
            name=label,
            family=Family.GPT_NEOX,
            num_layers=_need(config, "num_hidden_layers"),
            hidden_size=_need(config, "hidden_size"),
            num_heads=_need(config, "num_attention_heads"),
            ffn_hidden_size=_need(config, "intermediate_size"),
            vocab_size=_need(config, "vocab_size"),
            max_seq_len=_need(config, "max_position_embeddings"),
            tie_embeddings=bool(config.get("tie_word_embeddings", False)),
        )
    if model_type in ("bert", "roberta", "xlm-roberta"):
        # roberta / xlm-roberta: bert's embeddings (token, position, token-type, LayerNorm),
        # post-LN encoder and MLM head (dense + LayerNorm, decoder tied, output bias);
        # RobertaConfig keeps BertConfig's type_vocab_size default 2 (published configs: 1)
        if model_type != "bert":
            position = config.get("position_embedding_type", "absolute")
            if position != "absolute":
                raise SpecError("config.position_embedding_type",
                                f"{position!r} (per-layer distance embeddings) is not "
                                f"modelled for {model_type}; only 'absolute' (the default) is")
            if config.get("add_cross_attention"):
                raise SpecError("config.add_cross_attention",
                                f"true (a cross-attention block a layer) is not modelled for "
                                f"{model_type}")
        return ModelSpec(
            name=label,
            family=Family.BERT,
            num_layers=_need(config, "num_hidden_layers"),
            hidden_size=_need(config, "hidden_size"),
            num_heads=_need(config, "num_attention_heads"),
            ffn_hidden_size=_need(config, "intermediate_size"),
            vocab_size=_need(config, "vocab_size"),
            max_seq_len=_need(config, "max_position_embeddings"),
            type_vocab_size=config.get("type_vocab_size", 2),
            tie_embeddings=True,
        )
    raise _unsupported_type(model_type, config)


def _gpt2(name: str, layers: int, hidden: int, heads: int, seq: int = 1024) -> ModelSpec:
    return ModelSpec(name, Family.GPT2, layers, hidden, heads, vocab_size=50257, max_seq_len=seq)


def _llama(
    name: str, layers: int, hidden: int, heads: int, kv: int, ffn: int, vocab: int, seq: int
) -> ModelSpec:
    return ModelSpec(
        name, Family.LLAMA, layers, hidden, heads, vocab_size=vocab, max_seq_len=seq,
        num_kv_heads=kv, ffn_hidden_size=ffn, tie_embeddings=False,
    )


def _bert(name: str, layers: int, hidden: int, heads: int) -> ModelSpec:
    return ModelSpec(
        name, Family.BERT, layers, hidden, heads, vocab_size=30522, max_seq_len=512,
        type_vocab_size=2,
    )


# Dimensions from each model's published config.json (Hugging Face hub) or paper.
MODEL_CATALOG: dict[str, ModelSpec] = {
    m.name: m
    for m in (
        _gpt2("gpt2", 12, 768, 12),
        _gpt2("gpt2-medium", 24, 1024, 16),
        _gpt2("gpt2-large", 36, 1280, 20),
        _gpt2("gpt2-xl", 48, 1600, 25),
        # The Frenzy paper's real-testbed models. GPT2-350M is Megatron-LM's GPT-345M
        # (24 × 1024, 16 heads); GPT2-7B follows the GPT-3 6.7B shape (32 × 4096, 32 heads).
        _gpt2("gpt2-350m", 24, 1024, 16),
        _gpt2("gpt2-7b", 32, 4096, 32, seq=2048),
        _bert("bert-base", 12, 768, 12),
        _bert("bert-large", 24, 1024, 16),
        _llama("llama-2-7b", 32, 4096, 32, 32, 11008, 32000, 4096),
        _llama("llama-2-13b", 40, 5120, 40, 40, 13824, 32000, 4096),
        _llama("llama-2-70b", 80, 8192, 64, 8, 28672, 32000, 4096),
        _llama("llama-3-8b", 32, 4096, 32, 8, 14336, 128256, 8192),
        _llama("llama-3-70b", 80, 8192, 64, 8, 28672, 128256, 8192),
        _llama("mistral-7b", 32, 4096, 32, 8, 14336, 32000, 32768),
        ModelSpec(
            "qwen2-7b", Family.QWEN2, 28, 3584, 28, vocab_size=152064, max_seq_len=32768,
            num_kv_heads=4, ffn_hidden_size=18944, tie_embeddings=False,
        ),
        # Qwen3 (config.json on the hub): q/k per-head RMSNorm; the small ones have heads of
        # 128 over a narrower hidden size (0.6B: 16 x 128 = 2048 > 1024) and tie embeddings
        ModelSpec(
            "qwen3-0.6b", Family.QWEN3, 28, 1024, 16, vocab_size=151936, max_seq_len=40960,
            num_kv_heads=8, ffn_hidden_size=3072, tie_embeddings=True, explicit_head_dim=128,
        ),
        ModelSpec(
            "qwen3-8b", Family.QWEN3, 36, 4096, 32, vocab_size=151936, max_seq_len=40960,
            num_kv_heads=8, ffn_hidden_size=12288, tie_embeddings=False,
        ),
        # Mistral-Nemo-Base-2407: 32 heads of 128 over hidden 5120 (Q is 4096 wide)
        ModelSpec(
            "mistral-nemo-12b", Family.LLAMA, 40, 5120, 32, vocab_size=131072,
            max_seq_len=1024000, num_kv_heads=8, ffn_hidden_size=14336, tie_embeddings=False,
            explicit_head_dim=128,
        ),
        ModelSpec(
            "pythia-1.4b", Family.GPT_NEOX, 24, 2048, 16, vocab_size=50304, max_seq_len=2048,
            tie_embeddings=False,
        ),
        ModelSpec(
            "gpt-neox-20b", Family.GPT_NEOX, 44, 6144, 64, vocab_size=50432, max_seq_len=2048,
            tie_embeddings=False,
        ),
    )
}


PRECISION_ALIASES: dict[str, str] = {
    "bfloat16": "bf16", "bf16-mixed": "bf16", "float16": "fp16", "half": "fp16",
    "fp16-mixed": "fp16", "16-mixed": "fp16", "16": "fp16", "float32": "fp32",
    "float": "fp32", "32": "fp32", "32-true": "fp32", "fp32-true": "fp32",
}
"""Precisions as frameworks write them (torch dtypes, Lightning's ``bf16-mixed``): the mixed
modes; Lightning's ``bf16-true`` / ``16-true`` (no fp32 master) are not one of them."""

OPTIMIZER_ALIASES: dict[str, str] = {
    "adamw-torch": "adamw", "adamw-torch-fused": "adamw", "adamw-hf": "adamw",
    "adamw-apex-fused": "adamw", "fusedadam": "adamw", "hybridadam": "adamw",
    "adamw-bnb-8bit": "adamw8bit", "adamw-8bit": "adamw8bit", "adam-8bit": "adam8bit",
    "paged-adamw-8bit": "paged_adamw8bit", "paged-adam-8bit": "paged_adam8bit",
}
"""Optimizers as transformers' ``optim`` names and the frameworks' classes spell them
(``torch.optim.AdamW``, DeepSpeed's ``FusedAdam`` and ColossalAI's ``HybridAdam``, both in
their default decoupled-weight-decay mode; bitsandbytes' 8-bit ones)."""

RECOMPUTE_ALIASES: dict[str, str] = {
    "true": "full", "false": "none", "off": "none", "no": "none",
    "gradient-checkpointing": "full", "activation-checkpointing": "full", "full-ac": "full",
    "selective-ac": "selective", "sac": "selective",
}
"""Recomputation as users write it: ``true`` / gradient checkpointing is every layer's
(``full``)."""

_PURE_HINT = ("; Lightning's *-true precisions keep no fp32 master: give bf16 or fp16 with "
              "runtime_options {\"pure_low_precision\": true}")
_ENUM_VALUES = frozenset(e.value for enum in (Precision, Optimizer, Recompute) for e in enum)


def _alias(value: Any, aliases: dict[str, str]) -> Any:
    """``value`` through ``aliases`` (case-insensitive; ``_``, spaces and a module prefix
    such as ``torch.optim.`` ignored), or its own enum spelling; unchanged otherwise."""
    if isinstance(value, (bool, int)):  # JSON true / Lightning's precision=16
        value = str(value)
    if not isinstance(value, str):
        return value
    key = "-".join(value.strip().lower().rsplit(".", 1)[-1].replace("_", " ").split())
    if key in aliases:
        return aliases[key]
    own = key.replace("-", "_")
    return own if own in _ENUM_VALUES else value


@dataclass(frozen=True, slots=True)
class TrainingSpec:
    """How the user wants the model trained.

    ``global_batch`` sequences of ``seq_len`` tokens per optimizer step. Work is ``steps``
    optimizer steps, or ``tokens`` (converted to steps, rounded up). ``deadline_s`` is a
    wall-clock budget from submission (used by deadline-aware scheduling).
    """

    global_batch: int
    seq_len: int
    precision: Precision = Precision.BF16
    optimizer: Optimizer = Optimizer.ADAMW
    steps: int | None = None
    tokens: int | None = None
    deadline_s: float | None = None
    flash_attention: bool = True
    sequence_parallel: bool = True  # used whenever tp > 1

    def __post_init__(self) -> None:
        _positive_int("global_batch", self.global_batch)
        _positive_int("seq_len", self.seq_len)
        for attr, enum, aliases in (("precision", Precision, PRECISION_ALIASES),
                                    ("optimizer", Optimizer, OPTIMIZER_ALIASES)):
            value = getattr(self, attr)
            try:
                object.__setattr__(self, attr, enum(_alias(value, aliases)))
            except ValueError:
                hint = _PURE_HINT if attr == "precision" and str(value).lower().endswith(
                    "-true") else ""
                raise SpecError(
                    attr, f"unknown {attr} {value!r}; one of "
                    f"{', '.join(e.value for e in enum)}{hint}"
                ) from None
        if self.steps is not None:
            _positive_int("steps", self.steps)
        if self.tokens is not None:
            _positive_int("tokens", self.tokens)
        if self.steps is not None and self.tokens is not None:
            raise SpecError("tokens", "give steps or tokens, not both")
        if self.deadline_s is not None and not self.deadline_s > 0:
            raise SpecError("deadline_s", f"must be > 0 seconds, got {self.deadline_s}")

    @property
    def num_steps(self) -> int:
        """Optimizer steps of the job (1,000 when neither steps nor tokens is given)."""
        if self.steps is not None:
            return self.steps
        if self.tokens is not None:
            per_step = self.global_batch * self.seq_len
            return -(-self.tokens // per_step)
        return 1000

    def check_against(self, model: ModelSpec) -> None:
        """Reject a sequence length the model cannot take (learned position tables)."""
        if model.learned_positions and self.seq_len > model.max_seq_len:
            raise SpecError(
                "seq_len",
                f"{self.seq_len} exceeds {model.name}'s learned position table "
                f"({model.max_seq_len}); use seq_len <= {model.max_seq_len}",
            )


@dataclass(frozen=True, slots=True)
class ParallelConfig:
    """One parallel plan's knobs, independent of the GPU type.

    tp·pp·dp GPUs; each data-parallel replica processes ``global_batch / dp`` sequences as
    ``micro_batches`` micro-batches of ``micro_batch`` sequences.
    """

    tp: int = 1
    pp: int = 1
    dp: int = 1
    micro_batch: int = 1
    recompute: Recompute = Recompute.NONE
    zero_stage: int = 0
    sequence_parallel: bool = False
    flash_attention: bool = True
    extra: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        for name in ("tp", "pp", "dp", "micro_batch"):
            _positive_int(name, getattr(self, name))
        try:
            object.__setattr__(self, "recompute", Recompute(_alias(self.recompute,
                                                                   RECOMPUTE_ALIASES)))
        except ValueError:
            raise SpecError(
                "recompute",
                f"unknown mode {self.recompute!r}; one of none, selective, full",
            ) from None
        if self.zero_stage not in (0, 1, 2, 3):
            raise SpecError("zero_stage", f"must be 0, 1, 2 or 3, got {self.zero_stage!r}")
        if self.sequence_parallel and self.tp == 1:
            object.__setattr__(self, "sequence_parallel", False)

    @property
    def num_gpus(self) -> int:
        return self.tp * self.pp * self.dp

    @classmethod
    def trusted(cls, tp: int, pp: int, dp: int, micro_batch: int, recompute: Recompute,
                zero_stage: int, sequence_parallel: bool, flash_attention: bool
                ) -> ParallelConfig:
        """Build without validation, for the planner's inner loop, which only produces
        valid values (its search space is made of checked divisors and enum members)."""
        self = object.__new__(cls)
        for name, value in (("tp", tp), ("pp", pp), ("dp", dp), ("micro_batch", micro_batch),
                            ("recompute", recompute), ("zero_stage", zero_stage),
                            ("sequence_parallel", sequence_parallel and tp > 1),
                            ("flash_attention", flash_attention), ("extra", {})):
            object.__setattr__(self, name, value)
        return self

    def micro_batches(self, global_batch: int) -> int:
        """Micro-batches per replica per optimizer step (gradient-accumulation count)."""
        return global_batch // (self.dp * self.micro_batch)

    def check(self, model: ModelSpec, train: TrainingSpec, *, explicit_split: bool = False
              ) -> None:
        """Raise ``SpecError`` unless this plan can run ``model`` with ``train``
        (``explicit_split``: the layers per stage are given, so pp need not divide them)."""
        if model.num_heads % self.tp:
            raise SpecError("tp", f"{self.tp} does not divide num_heads={model.num_heads}")
        if model.num_kv_heads % self.tp and self.tp % model.num_kv_heads:
            raise SpecError(
                "tp", f"{self.tp} and num_kv_heads={model.num_kv_heads} do not divide each other"
            )
        if model.ffn_hidden_size % self.tp:
            raise SpecError(
                "tp", f"{self.tp} does not divide ffn_hidden_size={model.ffn_hidden_size}"
            )
        if model.num_layers % self.pp and not explicit_split:
            raise SpecError("pp", f"{self.pp} does not divide num_layers={model.num_layers}")
        if train.global_batch % (self.dp * self.micro_batch):
            raise SpecError(
                "micro_batch",
                f"dp·micro_batch = {self.dp * self.micro_batch} does not divide "
                f"global_batch={train.global_batch}",
            )
        if self.sequence_parallel and train.seq_len % self.tp:
            raise SpecError("tp", f"{self.tp} does not divide seq_len={train.seq_len} (SP)")
