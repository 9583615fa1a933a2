"""A tensor-parallel transformer built from a ``ModelSpec``'s traits (every family).

One generic layer covers the families: pre-LN (gpt2, llama, qwen2, qwen3), parallel residual
(gpt_neox) and post-LN (bert); LayerNorm or RMSNorm; GeLU MLP or SwiGLU; learned positions or
rotary; GQA; heads of any width (Q and the attention output are heads · head_dim wide, which
need not be the hidden size); Qwen3's per-head RMSNorm of Q and K (``q_norm``, ``k_norm``:
one head_dim-wide weight each, replicated over the tp ranks, whose gradients are summed over
the tp group since each rank normalises its own heads only). Q, K, V, the MLP input
projections are column-parallel and the attention output and MLP output projections
row-parallel, so each layer costs two tp all-reduces forward and two backward (Megatron's
layout). The token embedding, the output head (tied or not) and
BERT's output bias are split over the tp ranks by vocabulary rows (``parallel.vocab_range``),
so each rank computes the logits of its rows only and ``ParallelTransformer.loss`` is the
vocab-parallel cross entropy; positions, token types and norms are replicated. At tp = 1 the
model is the plain one: ``F.embedding``, ``F.linear`` and ``F.cross_entropy`` on
``logits.float()``.

Parameter names are the *canonical* names of the unsharded model; ``parallel.shard_dims``
says which are split and along which dimension, which is all a checkpoint needs to gather and
reshard them (see ``checkpoint``). Initialisation draws each full tensor from a generator
seeded by (seed, name) and keeps this rank's slice, so any tp/dp layout starts from the same
weights.

``Numerics`` holds the few constants a Hugging Face checkpoint may set differently from the
trainer's defaults (norm epsilon, rotary base and fraction, exact or tanh GeLU), so a model
imported with ``init_from`` computes the same logits as in ``transformers``.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from orchestrator.trainer.parallel import (
    IGNORE_INDEX,
    ColumnParallelLinear,
    Layout,
    RowParallelLinear,
    VocabParallelEmbedding,
    VocabParallelHead,
    copy_to_tp,
    full_shapes,
    shard_dims,
    vocab_parallel_cross_entropy,
    vocab_range,
)
from predictor.memory import stage_layer_counts
from predictor.runtimes import FRENZY
from predictor.spec import Family, ModelSpec, Recompute


def check_supported(spec: ModelSpec, tp: int, pp: int = 1) -> None:
    """Raise ``ValueError`` with the reason when this trainer cannot split ``spec`` over tp
    and pp."""
    if spec.num_layers < pp:
        raise ValueError(f"pp={pp} exceeds num_layers={spec.num_layers} (each pipeline stage "
                         "holds at least one layer)")
    if spec.activation not in ("", spec.own_activation):
        raise ValueError(f"activation={spec.activation}: the built-in trainer runs the "
                         f"{spec.family.value} MLP ({spec.own_activation}) only")
    for what, n in (("num_heads", spec.num_heads), ("num_kv_heads", spec.num_kv_heads),
                    ("ffn_hidden_size", spec.ffn_hidden_size)):
        if n % tp:
            raise ValueError(f"tp={tp} does not divide {what}={n} (the built-in trainer splits "
                             "whole heads and whole MLP columns)")
    if spec.vocab_size < tp:
        raise ValueError(f"tp={tp} exceeds vocab_size={spec.vocab_size} (each tp rank holds "
                         "at least one vocabulary row)")


def stage_layer_range(num_layers: int, pp: int, stage: int) -> range:
    """Global indices of the layers pipeline stage ``stage`` of ``pp`` holds: the ``frenzy``
    profile's split rule (``FRENZY.stage_split`` through ``predictor.memory``'s
    ``stage_layer_counts``), so the trainer builds the stages the predictor prices."""
    counts = stage_layer_counts(num_layers, pp, FRENZY.stage_split)
    lo = sum(counts[:stage])
    return range(lo, lo + counts[stage])


class StageLayers(nn.ModuleDict):
    """A pipeline stage's transformer layers under their global indices (``layers.<i>``, the
    canonical names at every pp); iterating yields the layers in order, as a ModuleList's
    does, and ``layers[i]`` is global layer ``i`` (on the stage that holds it)."""

    def __iter__(self):  # type: ignore[override]
        return iter(self.values())

    def __getitem__(self, key: int | str) -> nn.Module:  # type: ignore[override]
        return self._modules[str(key)]  # type: ignore[return-value]


class BlockParams(Protocol):
    """Parameter sharding around each layer (ZeRO-3, ``orchestrator.trainer.zero``):
    ``enter`` before a layer's forward, ``leave`` after it, each returning its input
    unchanged; they gather and free the layer's weights, forward and backward."""

    def enter(self, block: nn.Module, x: torch.Tensor) -> torch.Tensor: ...

    def leave(self, block: nn.Module, x: torch.Tensor) -> torch.Tensor: ...


@dataclass(frozen=True)
class Numerics:
    """Constants of the layers that are not dimensions: what ``config.json`` also records.

    ``norm_eps`` None means the family default (1e-6 RMSNorm, 1e-5 LayerNorm);
    ``rotary_fraction`` is the share of each head's dimensions rotated (GPT-NeoX's
    ``rotary_pct``); ``gelu`` is ``"tanh"`` (GPT-2's approximation) or ``"exact"`` (erf).
    """

    norm_eps: float | None = None
    rope_theta: float = 10000.0
    rotary_fraction: float = 1.0
    gelu: str = "tanh"

    def __post_init__(self) -> None:
        if self.gelu not in ("tanh", "exact"):
            raise ValueError(f"gelu must be 'tanh' or 'exact', got {self.gelu!r}")
        if not 0.0 < self.rotary_fraction <= 1.0:
            raise ValueError(f"rotary_fraction must be in (0, 1], got {self.rotary_fraction}")

    def eps(self, spec: ModelSpec) -> float:
        if self.norm_eps is not None:
            return self.norm_eps
        return 1e-6 if spec.rmsnorm else 1e-5

    def norm(self, spec: ModelSpec, h: int) -> nn.Module:
        """The family's norm over width ``h`` with this epsilon."""
        if spec.rmsnorm:
            return nn.RMSNorm(h, eps=self.eps(spec))
        return nn.LayerNorm(h, eps=self.eps(spec))

    def act(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(x, approximate="tanh" if self.gelu == "tanh" else "none")


DEFAULT_NUMERICS = Numerics()


class _Attention(nn.Module):
    def __init__(self, spec: ModelSpec, layout: Layout, recompute: Recompute,
                 numerics: Numerics = DEFAULT_NUMERICS) -> None:
        super().__init__()
        self.rope_theta = numerics.rope_theta
        self.rotary_dims = int(spec.head_dim * numerics.rotary_fraction)
        h, hd = spec.hidden_size, spec.head_dim
        self.heads = spec.num_heads // layout.tp
        self.kv_heads = spec.num_kv_heads // layout.tp
        self.head_dim = hd
        self.rotary = not spec.learned_positions
        self.causal = spec.causal
        self.selective = recompute is Recompute.SELECTIVE
        self.q = ColumnParallelLinear(h, spec.attn_hidden, spec.qkv_bias, layout)
        self.k = ColumnParallelLinear(h, spec.kv_hidden, spec.qkv_bias, layout)
        self.v = ColumnParallelLinear(h, spec.kv_hidden, spec.qkv_bias, layout)
        self.o = RowParallelLinear(spec.attn_hidden, h, spec.linear_bias, layout)
        self.q_norm = _HeadNorm(hd, numerics.eps(spec), layout) if spec.qk_norm else None
        self.k_norm = _HeadNorm(hd, numerics.eps(spec), layout) if spec.qk_norm else None

    def _core(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if self.kv_heads != self.heads:
            rep = self.heads // self.kv_heads
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
        return F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.q(x).view(b, s, self.heads, self.head_dim)
        k = self.k(x).view(b, s, self.kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        v = self.v(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        if self.rotary:
            q = _rotate(q, self.rotary_dims, self.rope_theta)
            k = _rotate(k, self.rotary_dims, self.rope_theta)
        if self.selective and self.training:
            out = checkpoint(self._core, q, k, v, use_reentrant=False)
        else:
            out = self._core(q, k, v)
        return self.o(out.transpose(1, 2).reshape(b, s, self.heads * self.head_dim))


class _HeadNorm(nn.Module):
    """RMSNorm over each head's ``head_dim`` values (Qwen3's ``q_norm`` / ``k_norm``). The
    weight is replicated over the tp ranks, but each rank normalises only its own heads, so
    its gradient is summed over the tp group (``copy_to_tp`` on the weight), as the other
    replicated weights' are equal on every rank by construction. The weight is cast to the
    input's dtype (autocast's bf16 Q and K), as in a bf16 ``transformers`` model: with the
    dtypes equal torch runs its fused kernel on CUDA (input and 1/rms kept for backward)
    instead of the composite ops (fp32 input and fp32 normalised input)."""

    def __init__(self, head_dim: int, eps: float, layout: Layout) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(head_dim))
        self.eps = eps
        self.layout = layout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = copy_to_tp(self.weight, self.layout)
        return F.rms_norm(x, (x.shape[-1],), w.to(x.dtype), self.eps)


def _rotate(x: torch.Tensor, dims: int | None = None, theta: float = 10000.0) -> torch.Tensor:
    """Rotary position embedding (half-split form, as in ``transformers``) over the first
    ``dims`` (default: all) of the last dim of [b, heads, s, d]; the rest pass through."""
    d = x.shape[-1]
    half = (d if dims is None else dims) // 2
    inv = 1.0 / (theta ** (torch.arange(half, dtype=torch.float32, device=x.device) / half))
    t = torch.arange(x.shape[-2], dtype=torch.float32, device=x.device)
    ang = torch.outer(t, inv)
    cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
    x1, x2 = x[..., :half], x[..., half:2 * half]
    rot = torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)
    return torch.cat([rot, x[..., 2 * half:]], dim=-1) if 2 * half < d else rot


class _MLP(nn.Module):
    def __init__(self, spec: ModelSpec, layout: Layout,
                 numerics: Numerics = DEFAULT_NUMERICS) -> None:
        super().__init__()
        self.act = numerics.act
        h, f = spec.hidden_size, spec.ffn_hidden_size
        self.swiglu = spec.swiglu
        self.up = ColumnParallelLinear(h, f, spec.linear_bias, layout)
        if self.swiglu:
            self.gate = ColumnParallelLinear(h, f, spec.linear_bias, layout)
        self.down = RowParallelLinear(f, h, spec.linear_bias, layout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.swiglu:
            return self.down(F.silu(self.gate(x)) * self.up(x))
        return self.down(self.act(self.up(x)))


class _Layer(nn.Module):
    def __init__(self, spec: ModelSpec, layout: Layout, recompute: Recompute,
                 numerics: Numerics = DEFAULT_NUMERICS) -> None:
        super().__init__()
        self.family = spec.family
        self.norm1 = numerics.norm(spec, spec.hidden_size)
        self.norm2 = numerics.norm(spec, spec.hidden_size)
        self.attn = _Attention(spec, layout, recompute, numerics)
        self.mlp = _MLP(spec, layout, numerics)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.family is Family.BERT:  # post-LN
            x = self.norm1(x + self.attn(x))
            return self.norm2(x + self.mlp(x))
        if self.family is Family.GPT_NEOX:  # parallel residual
            return x + self.attn(self.norm1(x)) + self.mlp(self.norm2(x))
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class ParallelTransformer(nn.Module):
    """The model of ``spec`` split over ``layout.tp`` ranks, and over ``layout.pp`` pipeline
    stages: stage ``layout.pp_rank`` holds its layers (``stage_layer_range``), the first
    stage the embeddings, the last the final norm, the head and the loss. ``forward`` maps
    token ids (first stage) or the previous stage's hidden states to logits (last stage) or
    this stage's hidden states.

    A tied output layer (tied embeddings, BERT's decoder) on a last stage that is not the
    first holds its own copy of ``embed.weight`` (initialised, loaded and stepped like the
    first stage's; ``tied_copy``), whose gradient the loop sums with the first stage's over
    ``layout.tied_group`` (as Megatron-LM does), so both copies stay equal."""

    def __init__(self, spec: ModelSpec, layout: Layout,
                 recompute: Recompute = Recompute.NONE,
                 numerics: Numerics = DEFAULT_NUMERICS) -> None:
        super().__init__()
        check_supported(spec, layout.tp, layout.pp)
        h = spec.hidden_size
        self.spec = spec
        self.numerics = numerics
        self.layout = layout
        self.full_recompute = recompute is Recompute.FULL
        first, last = layout.first_stage, layout.last_stage
        bert = spec.family is Family.BERT
        # the output layer is the embedding's weight (tied embeddings, BERT's decoder)
        self.tied = tied = spec.tie_embeddings or bert
        self.tied_copy = tied and last and not first
        self.vocab_start, vocab_end = vocab_range(spec.vocab_size, layout)
        self.embed = (VocabParallelEmbedding(spec.vocab_size, h, layout)
                      if first or self.tied_copy else None)
        self.pos = (nn.Embedding(spec.max_seq_len, h)
                    if first and spec.learned_positions else None)
        self.token_type = (nn.Embedding(spec.type_vocab_size, h)
                           if first and bert and spec.type_vocab_size else None)
        self.embed_norm = numerics.norm(spec, h) if first and bert else None
        self.layers = StageLayers({
            str(i): _Layer(spec, layout, recompute, numerics)
            for i in stage_layer_range(spec.num_layers, layout.pp, layout.pp_rank)})
        self.final_norm = None
        self.head = None
        if last and bert:
            self.mlm_dense = nn.Linear(h, h)
            self.mlm_norm = numerics.norm(spec, h)
            self.out_bias = nn.Parameter(torch.zeros(vocab_end - self.vocab_start))
            if layout.tp > 1:  # the bias of this rank's vocabulary rows
                self.shard_dims = {"out_bias": 0}
                self.full_sizes = {"out_bias": spec.vocab_size}
        elif last:
            self.final_norm = numerics.norm(spec, h)
            if not tied:
                self.head = VocabParallelHead(h, spec.vocab_size, layout)
        self.block_params: BlockParams | None = None  # ZeRO-3: gathers each layer's weights

    def forward(self, inp: torch.Tensor) -> torch.Tensor:
        """Logits of this rank's vocabulary rows (all of them at tp = 1) on the last stage,
        else this stage's output hidden states; ``inp``: token ids on the first stage, else
        the previous stage's output."""
        layout = self.layout
        if layout.first_stage:
            assert self.embed is not None
            tokens = inp
            x = self.embed(tokens)
            if self.pos is not None:
                x = x + self.pos(torch.arange(tokens.shape[1], device=tokens.device))
            if self.token_type is not None:
                x = x + self.token_type.weight[0]
            if self.embed_norm is not None:
                x = self.embed_norm(x)
        else:
            x = inp
        sharding = self.block_params
        for layer in self.layers:
            if sharding is not None:
                x = sharding.enter(layer, x)
            if self.full_recompute and self.training:
                x = checkpoint(layer, x, use_reentrant=False)
            else:
                x = layer(x)
            if sharding is not None:
                x = sharding.leave(layer, x)
        if not layout.last_stage:
            return x
        if self.final_norm is not None:
            x = self.final_norm(x)
        else:
            x = self.mlm_norm(self.numerics.act(self.mlm_dense(x)))
        weight = self.head.weight if self.head is not None else self.embed.weight
        logits = F.linear(copy_to_tp(x, self.layout), weight)  # column-parallel over V
        return logits + self.out_bias if self.spec.family is Family.BERT else logits

    def loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean cross entropy of ``forward``'s logits against ``targets`` (token ids;
        ``IGNORE_INDEX`` skipped): over the vocabulary shards at tp > 1."""
        if self.layout.tp == 1:
            return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]),
                                   targets.reshape(-1), ignore_index=IGNORE_INDEX)
        return vocab_parallel_cross_entropy(logits, targets, self.vocab_start, self.layout)


def _seed_for(seed: int, name: str) -> int:
    return (seed * 1_000_003 + zlib.crc32(name.encode())) % (2**63)


@torch.no_grad()
def init_canonical(model: nn.Module, layout: Layout, seed: int) -> None:
    """Initialise every parameter from its full (unsharded) tensor, keeping this rank's
    slice: the same weights whatever the tp/dp layout."""
    dims = shard_dims(model)
    shapes = full_shapes(model, layout.tp)
    for name, p in model.named_parameters():
        dim = dims.get(name)
        shape = list(shapes[name])
        g = torch.Generator().manual_seed(_seed_for(seed, name))
        if name.endswith("bias") or "out_bias" in name:
            full = torch.zeros(shape)
        elif p.dim() == 1:  # norm weights
            full = torch.ones(shape)
        else:
            std = 0.02
            if name.endswith(("o.weight", "down.weight")):  # GPT-2's scaled residual init
                std /= math.sqrt(2 * max(1, model.spec.num_layers))
            full = torch.randn(shape, generator=g) * std
        p.copy_(shard(full, dim, layout) if dim is not None else full)


def shard(full: torch.Tensor, dim: int, layout: Layout) -> torch.Tensor:
    """This tp rank's slice of ``full`` along ``dim``: the rows ``parallel.vocab_range``
    gives it (equal slices when tp divides the dimension, else the first ones a row
    longer)."""
    start, stop = vocab_range(full.shape[dim], layout)
    return full.narrow(dim, start, stop - start).contiguous()
