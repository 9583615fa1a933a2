"""Hugging Face weights in and out: the trainer's canonical names ↔ each family's names.

``to_hf`` turns a canonical, unsharded state (what a checkpoint holds) into the state dict of
the family's ``transformers`` class (``GPT2LMHeadModel``, ``LlamaForCausalLM``,
``Qwen2ForCausalLM``, ``Qwen3ForCausalLM``, ``GPTNeoXForCausalLM``, ``BertForMaskedLM``) and
``hf_config`` writes the ``config.json`` that rebuilds it (an explicit ``head_dim`` and
Qwen3's ``q_norm`` / ``k_norm`` weights included); ``from_hf`` is the inverse, used by
``init_from``. The layouts that differ are GPT-2's ``Conv1D`` (transposed weights, fused
q|k|v ``c_attn``) and GPT-NeoX's fused ``query_key_value`` (per head: q, k, v).
``spec_from_folder`` reads a model folder (``config.json`` + ``*.safetensors``) into a
``ModelSpec`` and the ``Numerics`` the trainer needs to compute the same logits; features it
cannot reproduce (rope scaling, sliding windows, other activations) are refused with the
config key that sets them.

The BERT objective of the trainer is masked LM with a bidirectional encoder, which is
``BertForMaskedLM``; ``AutoModelForCausalLM`` maps the same weights to ``BertLMHeadModel``
(the same head), bidirectional while ``is_decoder`` stays false.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any

import torch

from orchestrator.trainer.model import Numerics
from predictor.spec import LLAMA_LAYOUT, TRAINER_MODEL_TYPES, Family, ModelSpec

log = logging.getLogger(__name__)

State = dict[str, torch.Tensor]
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "vocab.json", "merges.txt", "vocab.txt")

# -- names ---------------------------------------------------------------------------------

# (canonical suffix inside layer i, HF suffix inside the family's layer i) for plain copies.
_LLAMA_LAYER = (
    ("norm1.weight", "input_layernorm.weight"),
    ("norm2.weight", "post_attention_layernorm.weight"),
    ("attn.q.weight", "self_attn.q_proj.weight"), ("attn.q.bias", "self_attn.q_proj.bias"),
    ("attn.k.weight", "self_attn.k_proj.weight"), ("attn.k.bias", "self_attn.k_proj.bias"),
    ("attn.v.weight", "self_attn.v_proj.weight"), ("attn.v.bias", "self_attn.v_proj.bias"),
    ("attn.o.weight", "self_attn.o_proj.weight"),
    ("mlp.gate.weight", "mlp.gate_proj.weight"), ("mlp.up.weight", "mlp.up_proj.weight"),
    ("mlp.down.weight", "mlp.down_proj.weight"),
)
_QWEN3_LAYER = (*_LLAMA_LAYER,
                ("attn.q_norm.weight", "self_attn.q_norm.weight"),
                ("attn.k_norm.weight", "self_attn.k_norm.weight"))
_NEOX_LAYER = (
    ("norm1.weight", "input_layernorm.weight"), ("norm1.bias", "input_layernorm.bias"),
    ("norm2.weight", "post_attention_layernorm.weight"),
    ("norm2.bias", "post_attention_layernorm.bias"),
    ("attn.o.weight", "attention.dense.weight"), ("attn.o.bias", "attention.dense.bias"),
    ("mlp.up.weight", "mlp.dense_h_to_4h.weight"), ("mlp.up.bias", "mlp.dense_h_to_4h.bias"),
    ("mlp.down.weight", "mlp.dense_4h_to_h.weight"), ("mlp.down.bias", "mlp.dense_4h_to_h.bias"),
)
_BERT_LAYER = (
    ("attn.q.weight", "attention.self.query.weight"), ("attn.q.bias", "attention.self.query.bias"),
    ("attn.k.weight", "attention.self.key.weight"), ("attn.k.bias", "attention.self.key.bias"),
    ("attn.v.weight", "attention.self.value.weight"), ("attn.v.bias", "attention.self.value.bias"),
    ("attn.o.weight", "attention.output.dense.weight"),
    ("attn.o.bias", "attention.output.dense.bias"),
    ("norm1.weight", "attention.output.LayerNorm.weight"),
    ("norm1.bias", "attention.output.LayerNorm.bias"),
    ("mlp.up.weight", "intermediate.dense.weight"), ("mlp.up.bias", "intermediate.dense.bias"),
    ("mlp.down.weight", "output.dense.weight"), ("mlp.down.bias", "output.dense.bias"),
    ("norm2.weight", "output.LayerNorm.weight"), ("norm2.bias", "output.LayerNorm.bias"),
)
_GPT2_LAYER = (
    ("norm1.weight", "ln_1.weight"), ("norm1.bias", "ln_1.bias"),
    ("norm2.weight", "ln_2.weight"), ("norm2.bias", "ln_2.bias"),
    ("attn.o.bias", "attn.c_proj.bias"), ("mlp.up.bias", "mlp.c_fc.bias"),
    ("mlp.down.bias", "mlp.c_proj.bias"),
)
_GPT2_TRANSPOSED = (
    ("attn.o.weight", "attn.c_proj.weight"), ("mlp.up.weight", "mlp.c_fc.weight"),
    ("mlp.down.weight", "mlp.c_proj.weight"),
)

# (canonical name, HF name) outside the layers, per family.
_GLOBAL: dict[Family, tuple[tuple[str, str], ...]] = {
    Family.GPT2: (("embed.weight", "transformer.wte.weight"),
                  ("pos.weight", "transformer.wpe.weight"),
                  ("final_norm.weight", "transformer.ln_f.weight"),
                  ("final_norm.bias", "transformer.ln_f.bias"),
                  ("head.weight", "lm_head.weight")),
    Family.LLAMA: (("embed.weight", "model.embed_tokens.weight"),
                   ("final_norm.weight", "model.norm.weight"), ("head.weight", "lm_head.weight")),
    Family.GPT_NEOX: (("embed.weight", "gpt_neox.embed_in.weight"),
                      ("final_norm.weight", "gpt_neox.final_layer_norm.weight"),
                      ("final_norm.bias", "gpt_neox.final_layer_norm.bias"),
                      ("head.weight", "embed_out.weight")),
    Family.BERT: (("embed.weight", "bert.embeddings.word_embeddings.weight"),
                  ("pos.weight", "bert.embeddings.position_embeddings.weight"),
                  ("token_type.weight", "bert.embeddings.token_type_embeddings.weight"),
                  ("embed_norm.weight", "bert.embeddings.LayerNorm.weight"),
                  ("embed_norm.bias", "bert.embeddings.LayerNorm.bias"),
                  ("mlm_dense.weight", "cls.predictions.transform.dense.weight"),
                  ("mlm_dense.bias", "cls.predictions.transform.dense.bias"),
                  ("mlm_norm.weight", "cls.predictions.transform.LayerNorm.weight"),
                  ("mlm_norm.bias", "cls.predictions.transform.LayerNorm.bias"),
                  ("out_bias", "cls.predictions.bias")),
}
_GLOBAL[Family.QWEN2] = _GLOBAL[Family.QWEN3] = _GLOBAL[Family.LLAMA]

_LAYER_PREFIX = {Family.GPT2: "transformer.h.", Family.LLAMA: "model.layers.",
                 Family.QWEN2: "model.layers.", Family.QWEN3: "model.layers.",
                 Family.GPT_NEOX: "gpt_neox.layers.", Family.BERT: "bert.encoder.layer."}
_PLAIN_LAYER = {Family.GPT2: _GPT2_LAYER, Family.LLAMA: _LLAMA_LAYER,
                Family.QWEN2: _LLAMA_LAYER, Family.QWEN3: _QWEN3_LAYER,
                Family.GPT_NEOX: _NEOX_LAYER, Family.BERT: _BERT_LAYER}


def _neox_fuse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads: int) -> torch.Tensor:
    """GPT-NeoX's ``query_key_value`` rows: for each head, its q, k and v rows."""
    parts = [t.reshape(heads, -1, *t.shape[1:]) for t in (q, k, v)]
    return torch.cat(parts, dim=1).reshape(-1, *q.shape[1:])


def _neox_split(qkv: torch.Tensor, heads: int) -> tuple[torch.Tensor, ...]:
    per = qkv.reshape(heads, 3, -1, *qkv.shape[1:])
    return tuple(per[:, i].reshape(-1, *qkv.shape[1:]).contiguous() for i in range(3))


def to_hf(state: State, spec: ModelSpec) -> State:
    """The family's ``transformers`` state dict of a canonical state (tied output dropped,
    as ``save_pretrained`` does; BERT's decoder is tied to the word embeddings)."""
    fam = spec.family
    out: State = {}
    for canon, name in _GLOBAL[fam]:
        if canon in state:
            out[name] = state[canon]
    if fam is Family.BERT and "token_type.weight" not in state:  # HF always has the table
        out["bert.embeddings.token_type_embeddings.weight"] = torch.zeros(
            1, spec.hidden_size, dtype=state["embed.weight"].dtype)
    pre = _LAYER_PREFIX[fam]
    for i in range(spec.num_layers):
        c, h = f"layers.{i}.", f"{pre}{i}."
        for canon, name in _PLAIN_LAYER[fam]:
            if c + canon in state:
                out[h + name] = state[c + canon]
        if fam is Family.GPT2:
            for canon, name in _GPT2_TRANSPOSED:
                out[h + name] = state[c + canon].t()
            out[h + "attn.c_attn.weight"] = torch.cat(
                [state[c + f"attn.{x}.weight"] for x in "qkv"], dim=0).t()
            out[h + "attn.c_attn.bias"] = torch.cat([state[c + f"attn.{x}.bias"] for x in "qkv"])
        elif fam is Family.GPT_NEOX:
            for kind in ("weight", "bias"):
                out[h + f"attention.query_key_value.{kind}"] = _neox_fuse(
                    *(state[c + f"attn.{x}.{kind}"] for x in "qkv"), heads=spec.num_heads)
    return {k: v.detach().contiguous().clone() for k, v in out.items()}


def from_hf(hf: State, spec: ModelSpec) -> State:
    """The canonical state of a family's ``transformers`` state dict (inverse of ``to_hf``);
    a tied output head is taken from the embeddings."""
    fam = spec.family
    out: State = {}
    for canon, name in _GLOBAL[fam]:
        if name in hf:
            out[canon] = hf[name]
    if fam is Family.BERT and not spec.type_vocab_size:
        out.pop("token_type.weight", None)
    pre = _LAYER_PREFIX[fam]
    for i in range(spec.num_layers):
        c, h = f"layers.{i}.", f"{pre}{i}."
        for canon, name in _PLAIN_LAYER[fam]:
            if h + name in hf:
                out[c + canon] = hf[h + name]
        if fam is Family.GPT2:
            for canon, name in _GPT2_TRANSPOSED:
                out[c + canon] = hf[h + name].t()
            w = hf[h + "attn.c_attn.weight"].t()
            b = hf[h + "attn.c_attn.bias"]
            for j, x in enumerate("qkv"):
                out[c + f"attn.{x}.weight"] = w.chunk(3, dim=0)[j]
                out[c + f"attn.{x}.bias"] = b.chunk(3)[j]
        elif fam is Family.GPT_NEOX:
            for kind in ("weight", "bias"):
                q, k, v = _neox_split(hf[h + f"attention.query_key_value.{kind}"],
                                      spec.num_heads)
                out[c + f"attn.q.{kind}"], out[c + f"attn.k.{kind}"] = q, k
                out[c + f"attn.v.{kind}"] = v
    return {k: v.detach().contiguous().clone() for k, v in out.items()}


# -- config.json -----------------------------------------------------------------------------

_ACT = {"tanh": "gelu_new", "exact": "gelu"}


def hf_config(spec: ModelSpec, numerics: Numerics) -> dict[str, Any]:
    """A ``config.json`` that makes ``transformers`` build the model of ``spec``."""
    eps = numerics.eps(spec)
    act = _ACT[numerics.gelu]
    common = {"vocab_size": spec.vocab_size, "tie_word_embeddings": spec.tie_embeddings,
              "torch_dtype": "float32", "dtype": "float32", "bos_token_id": None,
              "eos_token_id": None, "pad_token_id": None}
    rope = {"rope_type": "default", "rope_theta": numerics.rope_theta}
    if spec.family is Family.GPT2:
        return {**common, "model_type": "gpt2", "architectures": ["GPT2LMHeadModel"],
                "n_layer": spec.num_layers, "n_embd": spec.hidden_size, "n_head": spec.num_heads,
                "n_inner": spec.ffn_hidden_size, "n_positions": spec.max_seq_len,
                "activation_function": act, "layer_norm_epsilon": eps, "resid_pdrop": 0.0,
                "embd_pdrop": 0.0, "attn_pdrop": 0.0}
    if spec.family in LLAMA_LAYOUT:
        model_type = {Family.QWEN2: "qwen2", Family.QWEN3: "qwen3"}.get(spec.family, "llama")
        arch = {"qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}.get(
            model_type, "LlamaForCausalLM")
        return {**common, "model_type": model_type, "architectures": [arch],
                "num_hidden_layers": spec.num_layers, "hidden_size": spec.hidden_size,
                "num_attention_heads": spec.num_heads,
                "num_key_value_heads": spec.num_kv_heads, "head_dim": spec.head_dim,
                "intermediate_size": spec.ffn_hidden_size,
                "max_position_embeddings": spec.max_seq_len, "rms_norm_eps": eps,
                "hidden_act": "silu", "rope_theta": numerics.rope_theta, "rope_parameters": rope,
                "attention_bias": False, "mlp_bias": False, "use_sliding_window": False,
                "attention_dropout": 0.0}
    if spec.family is Family.GPT_NEOX:
        return {**common, "model_type": "gpt_neox", "architectures": ["GPTNeoXForCausalLM"],
                "num_hidden_layers": spec.num_layers, "hidden_size": spec.hidden_size,
                "num_attention_heads": spec.num_heads,
                "intermediate_size": spec.ffn_hidden_size,
                "max_position_embeddings": spec.max_seq_len, "layer_norm_eps": eps,
                "hidden_act": act, "use_parallel_residual": True, "attention_bias": True,
                "rotary_pct": numerics.rotary_fraction, "rotary_emb_base": numerics.rope_theta,
                "rope_parameters": {**rope,
                                    "partial_rotary_factor": numerics.rotary_fraction},
                "attention_dropout": 0.0, "hidden_dropout": 0.0}
    return {**common, "model_type": "bert", "architectures": ["BertForMaskedLM"],
            "tie_word_embeddings": True,
            "num_hidden_layers": spec.num_layers, "hidden_size": spec.hidden_size,
            "num_attention_heads": spec.num_heads, "intermediate_size": spec.ffn_hidden_size,
            "max_position_embeddings": spec.max_seq_len,
            "type_vocab_size": max(1, spec.type_vocab_size), "layer_norm_eps": eps,
            "hidden_act": act, "hidden_dropout_prob": 0.0,
            "attention_probs_dropout_prob": 0.0, "position_embedding_type": "absolute",
            "is_decoder": False}


def _rope(config: dict[str, Any]) -> dict[str, Any]:
    params = config.get("rope_parameters") or config.get("rope_scaling") or {}
    return params if isinstance(params, dict) else {}


def numerics_from_config(config: dict[str, Any], spec: ModelSpec) -> Numerics:
    """The ``Numerics`` of a ``config.json``; ``ValueError`` naming the key the trainer
    cannot reproduce."""
    rope = _rope(config)
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind not in ("default", None):
        raise ValueError(f"config.rope_parameters.rope_type={kind!r}: the built-in trainer "
                         "implements plain rotary embeddings only ('default')")
    if config.get("use_sliding_window"):
        raise ValueError("config.use_sliding_window=true: sliding-window attention is not "
                         "implemented by the built-in trainer")
    fam = spec.family
    act_key = "activation_function" if fam is Family.GPT2 else "hidden_act"
    act = config.get(act_key, "gelu_new" if fam is Family.GPT2 else
                     "silu" if spec.swiglu else "gelu")
    if spec.swiglu:
        if act != "silu":
            raise ValueError(f"config.{act_key}={act!r}: SwiGLU models need 'silu'")
        gelu = "tanh"
    elif act in ("gelu_new", "gelu_pytorch_tanh", "gelu_fast"):
        gelu = "tanh"
    elif act == "gelu":
        gelu = "exact"
    else:
        raise ValueError(f"config.{act_key}={act!r}: the built-in trainer implements gelu, "
                         "gelu_new (tanh) and silu (SwiGLU)")
    if fam is Family.GPT_NEOX and config.get("use_parallel_residual") is False:
        raise ValueError("config.use_parallel_residual=false is not implemented by the "
                         "built-in trainer (GPT-NeoX layers are parallel-residual)")
    eps_key = "rms_norm_eps" if spec.rmsnorm else {
        Family.GPT2: "layer_norm_epsilon"}.get(fam, "layer_norm_eps")
    defaults = {Family.GPT2: 1e-5, Family.LLAMA: 1e-6, Family.QWEN2: 1e-6, Family.QWEN3: 1e-6,
                Family.GPT_NEOX: 1e-5, Family.BERT: 1e-12}
    theta = rope.get("rope_theta", config.get("rope_theta", config.get("rotary_emb_base",
                                                                        10000.0)))
    fraction = 1.0
    if fam is Family.GPT_NEOX:
        fraction = rope.get("partial_rotary_factor", config.get("rotary_pct", 0.25))
    return Numerics(norm_eps=float(config.get(eps_key, defaults[fam])),
                    rope_theta=float(theta), rotary_fraction=float(fraction), gelu=gelu)


# -- folders ---------------------------------------------------------------------------------


def read_config(folder: str | Path) -> dict[str, Any]:
    """``config.json`` of a model folder; ``ValueError`` saying what is missing."""
    path = Path(folder) / "config.json"
    if not path.is_file():
        raise ValueError(f"{folder}: no config.json (a Hugging Face model folder has "
                         "config.json and model.safetensors)")
    try:
        config = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: not readable JSON ({exc})") from None
    if not isinstance(config, dict):
        raise ValueError(f"{path}: must be a JSON object")
    return config


def weight_files(folder: str | Path) -> list[Path]:
    """The ``*.safetensors`` files of a model folder (``ValueError`` when there are none)."""
    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        raise ValueError(f"{folder}: no *.safetensors weights (save the model with "
                         "save_pretrained(..., safe_serialization=True))")
    return files


def spec_from_folder(folder: str | Path) -> tuple[ModelSpec, Numerics]:
    """The model of a Hugging Face folder as the trainer builds it."""
    config = read_config(folder)
    spec = ModelSpec.from_hf_config(config, name=Path(folder).name or None)
    if config.get("model_type") not in TRAINER_MODEL_TYPES:
        raise ValueError(f"config.model_type={config.get('model_type')!r}: the built-in "
                         f"trainer loads {', '.join(TRAINER_MODEL_TYPES)} checkpoints only")
    return spec, numerics_from_config(config, spec)


def load_folder(folder: str | Path, spec: ModelSpec) -> State:
    """Canonical full-shape parameters from a folder's safetensors files."""
    from safetensors.torch import load_file

    hf: State = {}
    for f in weight_files(folder):
        hf.update(load_file(str(f)))
    # Some checkpoints prefix the base model name differently (e.g. a bare GPT2Model).
    if spec.family is Family.GPT2 and not any(k.startswith("transformer.") for k in hf):
        hf = {("transformer." + k if not k.startswith("lm_head") else k): v
              for k, v in hf.items()}
    return from_hf(hf, spec)


def check_matches(state: State, shapes: dict[str, torch.Size], where: str) -> None:
    """Every parameter the model needs is in ``state`` with its full shape."""
    missing = sorted(set(shapes) - set(state))
    if missing:
        raise ValueError(f"{where}: weights lack {', '.join(missing[:5])}"
                         + (f" and {len(missing) - 5} more" if len(missing) > 5 else ""))
    for name, shape in shapes.items():
        if tuple(state[name].shape) != tuple(shape):
            raise ValueError(f"{where}: {name} has shape {tuple(state[name].shape)}, the "
                             f"model needs {tuple(shape)}")


def save_folder(out: str | Path, state: State, spec: ModelSpec, numerics: Numerics,
                tokenizer: str | Path | None = None) -> list[Path]:
    """Write ``config.json`` + ``model.safetensors`` (+ the tokenizer files found next to
    ``tokenizer``) into ``out``; returns the files written."""
    from safetensors.torch import save_file

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    written = [out / "config.json", out / "model.safetensors"]
    config = hf_config(spec, numerics)
    written[0].write_text(json.dumps(config, indent=2) + "\n")
    weights = {k: v.float().contiguous() for k, v in to_hf(state, spec).items()}
    save_file(weights, str(written[1]), metadata={"format": "pt"})
    if tokenizer:
        src = Path(tokenizer)
        folder = src if src.is_dir() else src.parent
        copies = {folder / n: out / n for n in TOKENIZER_FILES if (folder / n).is_file()}
        if src.is_file():
            copies[src] = out / "tokenizer.json"
        for f, dest in copies.items():
            shutil.copyfile(f, dest)
            written.append(dest)
    return written
