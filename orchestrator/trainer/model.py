"""A tensor-parallel transformer built from a ``ModelSpec``'s traits (every family).

One generic layer covers the families: pre-LN (gpt2, llama, qwen2), parallel residual
(gpt_neox) and post-LN (bert); LayerNorm or RMSNorm; GeLU MLP or SwiGLU; learned positions or
rotary; GQA. Q, K, V, the MLP input projections are column-parallel and the attention output
and MLP output projections row-parallel, so each layer costs two tp all-reduces forward and
two backward (Megatron's layout). Embeddings, norms and the output head are replicated on the
tp ranks (no vocab-parallel split: the test models are tiny; noted in docs/orchestrator.md).

Parameter names are the *canonical* names of the unsharded model; ``parallel.shard_dims``
says which are split and along which dimension, which is all a checkpoint needs to gather and
reshard them (see ``checkpoint``). Initialisation draws each full tensor from a generator
seeded by (seed, name) and keeps this rank's slice, so any tp/dp layout starts from the same
weights.
"""

from __future__ import annotations

import math
import zlib

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from orchestrator.trainer.parallel import (
    ColumnParallelLinear,
    Layout,
    RowParallelLinear,
    shard_dims,
)
from predictor.spec import Family, ModelSpec, Recompute


def check_supported(spec: ModelSpec, tp: int) -> None:
    """Raise ``ValueError`` with the reason when this trainer cannot split ``spec`` over tp."""
    for what, n in (("num_heads", spec.num_heads), ("num_kv_heads", spec.num_kv_heads),
                    ("ffn_hidden_size", spec.ffn_hidden_size)):
        if n % tp:
            raise ValueError(f"tp={tp} does not divide {what}={n} (the built-in trainer splits "
                             "whole heads and whole MLP columns)")


def _rms_norm(h: int) -> nn.Module:
    return nn.RMSNorm(h, eps=1e-6)


class _Attention(nn.Module):
    def __init__(self, spec: ModelSpec, layout: Layout, recompute: Recompute) -> None:
        super().__init__()
        h, hd = spec.hidden_size, spec.head_dim
        self.heads = spec.num_heads // layout.tp
        self.kv_heads = spec.num_kv_heads // layout.tp
        self.head_dim = hd
        self.rotary = not spec.learned_positions
        self.causal = spec.causal
        self.selective = recompute is Recompute.SELECTIVE
        self.q = ColumnParallelLinear(h, h, spec.qkv_bias, layout)
        self.k = ColumnParallelLinear(h, spec.kv_hidden, spec.qkv_bias, layout)
        self.v = ColumnParallelLinear(h, spec.kv_hidden, spec.qkv_bias, layout)
        self.o = RowParallelLinear(h, h, spec.linear_bias, layout)

    def _core(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if self.kv_heads != self.heads:
            rep = self.heads // self.kv_heads
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
        return F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.q(x).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k = self.k(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        if self.rotary:
            q, k = _rotate(q), _rotate(k)
        if self.selective and self.training:
            out = checkpoint(self._core, q, k, v, use_reentrant=False)
        else:
            out = self._core(q, k, v)
        return self.o(out.transpose(1, 2).reshape(b, s, self.heads * self.head_dim))


def _rotate(x: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding (half-split form) over the last dim of [b, heads, s, d]."""
    d = x.shape[-1]
    half = d // 2
    inv = 1.0 / (10000 ** (torch.arange(half, dtype=torch.float32, device=x.device) / half))
    t = torch.arange(x.shape[-2], dtype=torch.float32, device=x.device)
    ang = torch.outer(t, inv)
    cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
    x1, x2 = x[..., :half], x[..., half:2 * half]
    rot = torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)
    return torch.cat([rot, x[..., 2 * half:]], dim=-1) if d % 2 else rot


class _MLP(nn.Module):
    def __init__(self, spec: ModelSpec, layout: Layout) -> None:
        super().__init__()
        h, f = spec.hidden_size, spec.ffn_hidden_size
        self.swiglu = spec.swiglu
        self.up = ColumnParallelLinear(h, f, spec.linear_bias, layout)
        if self.swiglu:
            self.gate = ColumnParallelLinear(h, f, spec.linear_bias, layout)
        self.down = RowParallelLinear(f, h, spec.linear_bias, layout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.swiglu:
            return self.down(F.silu(self.gate(x)) * self.up(x))
        return self.down(F.gelu(self.up(x), approximate="tanh"))


class _Layer(nn.Module):
    def __init__(self, spec: ModelSpec, layout: Layout, recompute: Recompute) -> None:
        super().__init__()
        norm = _rms_norm if spec.rmsnorm else nn.LayerNorm
        self.family = spec.family
        self.norm1 = norm(spec.hidden_size)
        self.norm2 = norm(spec.hidden_size)
        self.attn = _Attention(spec, layout, recompute)
        self.mlp = _MLP(spec, layout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.family is Family.BERT:  # post-LN
            x = self.norm1(x + self.attn(x))
            return self.norm2(x + self.mlp(x))
        if self.family is Family.GPT_NEOX:  # parallel residual
            return x + self.attn(self.norm1(x)) + self.mlp(self.norm2(x))
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class ParallelTransformer(nn.Module):
    """The model of ``spec`` split over ``layout.tp`` ranks; ``forward`` returns logits."""

    def __init__(self, spec: ModelSpec, layout: Layout,
                 recompute: Recompute = Recompute.NONE) -> None:
        super().__init__()
        check_supported(spec, layout.tp)
        h = spec.hidden_size
        self.spec = spec
        self.full_recompute = recompute is Recompute.FULL
        self.embed = nn.Embedding(spec.vocab_size, h)
        self.pos = nn.Embedding(spec.max_seq_len, h) if spec.learned_positions else None
        self.token_type = (nn.Embedding(spec.type_vocab_size, h)
                           if spec.family is Family.BERT and spec.type_vocab_size else None)
        self.embed_norm = nn.LayerNorm(h) if spec.family is Family.BERT else None
        self.layers = nn.ModuleList(_Layer(spec, layout, recompute)
                                    for _ in range(spec.num_layers))
        if spec.family is Family.BERT:
            self.final_norm = None
            self.mlm_dense = nn.Linear(h, h)
            self.mlm_norm = nn.LayerNorm(h)
            self.out_bias = nn.Parameter(torch.zeros(spec.vocab_size))
        else:
            self.final_norm = _rms_norm(h) if spec.rmsnorm else nn.LayerNorm(h)
        self.head = (None if spec.tie_embeddings or spec.family is Family.BERT
                     else nn.Linear(h, spec.vocab_size, bias=False))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        if self.pos is not None:
            x = x + self.pos(torch.arange(tokens.shape[1], device=tokens.device))
        if self.token_type is not None:
            x = x + self.token_type.weight[0]
        if self.embed_norm is not None:
            x = self.embed_norm(x)
        for layer in self.layers:
            if self.full_recompute and self.training:
                x = checkpoint(layer, x, use_reentrant=False)
            else:
                x = layer(x)
        if self.final_norm is not None:
            x = self.final_norm(x)
        else:
            x = self.mlm_norm(F.gelu(self.mlm_dense(x)))
        weight = self.head.weight if self.head is not None else self.embed.weight
        logits = F.linear(x, weight)
        return logits + self.out_bias if self.spec.family is Family.BERT else logits


def _seed_for(seed: int, name: str) -> int:
    return (seed * 1_000_003 + zlib.crc32(name.encode())) % (2**63)


@torch.no_grad()
def init_canonical(model: nn.Module, layout: Layout, seed: int) -> None:
    """Initialise every parameter from its full (unsharded) tensor, keeping this rank's
    slice: the same weights whatever the tp/dp layout."""
    dims = shard_dims(model)
    for name, p in model.named_parameters():
        dim = dims.get(name)
        shape = list(p.shape)
        if dim is not None:
            shape[dim] *= layout.tp
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
    """This tp rank's slice of ``full`` along ``dim``."""
    return full.chunk(layout.tp, dim=dim)[layout.tp_rank].contiguous()
