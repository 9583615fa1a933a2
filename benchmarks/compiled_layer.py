"""What a torchtune-style llama layer saves for its backward, eager and under inductor.

    python -m benchmarks.compiled_layer [--seq 1024] [--json]

Builds one layer as torchtune writes it (RMSNorm computed in fp32, rotary embedding in fp32,
K and V expanded to every query head before ``scaled_dot_product_attention``, SwiGLU MLP) in
bf16 on the CPU, runs a forward and backward eagerly and under ``torch.compile`` (inductor),
and counts the distinct storages the autograd graph saves (``saved_tensors_hooks``), less
the parameters and buffers. The per-token figure under inductor is what
``RuntimeProfile.compiled`` prices (``predictor.memory._layer_counts``); the dimensions keep
Llama-3.2-3B's ratios (head 128, 3 query heads per K/V head, ffn 8/3·h) at a quarter of its
width. The partition is AOTAutograd's (device-independent); the attention op is the CPU
flash kernel, which saves the same tensors as the CUDA one (Q, K, V, output, logsumexp).
It takes a few minutes on two cores (inductor compiles C++).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

H, HEADS, KV_HEADS, HEAD_DIM, FFN = 768, 6, 2, 128, 2048


class _RMSNorm(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        normed = (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + 1e-6)).type_as(x)
        return normed * self.scale


def _rope(x: torch.Tensor, cache: torch.Tensor) -> torch.Tensor:
    xs = x.float().reshape(*x.shape[:-1], -1, 2)
    c = cache[: x.shape[1]].view(1, x.shape[1], 1, xs.size(3), 2)
    out = torch.stack([xs[..., 0] * c[..., 0] - xs[..., 1] * c[..., 1],
                       xs[..., 1] * c[..., 0] + xs[..., 0] * c[..., 1]], -1)
    return out.flatten(3).type_as(x)


class LlamaLayer(nn.Module):
    """torchtune's ``TransformerSelfAttentionLayer`` with its attention and MLP, unbiased."""

    def __init__(self, seq: int) -> None:
        super().__init__()
        self.sa_norm, self.mlp_norm = _RMSNorm(H), _RMSNorm(H)
        self.q = nn.Linear(H, HEADS * HEAD_DIM, bias=False)
        self.k = nn.Linear(H, KV_HEADS * HEAD_DIM, bias=False)
        self.v = nn.Linear(H, KV_HEADS * HEAD_DIM, bias=False)
        self.o = nn.Linear(HEADS * HEAD_DIM, H, bias=False)
        self.w1 = nn.Linear(H, FFN, bias=False)
        self.w3 = nn.Linear(H, FFN, bias=False)
        self.w2 = nn.Linear(FFN, H, bias=False)
        theta = 1.0 / (500000 ** (torch.arange(0, HEAD_DIM, 2).float() / HEAD_DIM))
        freqs = torch.outer(torch.arange(seq).float(), theta)
        self.register_buffer("cache", torch.stack([freqs.cos(), freqs.sin()], -1),
                             persistent=False)

    def _attention(self, x: torch.Tensor) -> torch.Tensor:
        b, n, _ = x.shape
        q = _rope(self.q(x).view(b, n, HEADS, HEAD_DIM), self.cache).transpose(1, 2)
        k = _rope(self.k(x).view(b, n, KV_HEADS, HEAD_DIM), self.cache).transpose(1, 2)
        v = self.v(x).view(b, n, KV_HEADS, HEAD_DIM).transpose(1, 2)
        shape = (b, KV_HEADS, HEADS // KV_HEADS, n, HEAD_DIM)
        k = k.unsqueeze(2).expand(shape).flatten(1, 2)
        v = v.unsqueeze(2).expand(shape).flatten(1, 2)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(out.transpose(1, 2).contiguous().view(b, n, -1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self._attention(self.sa_norm(x)) + x
        m = self.mlp_norm(h)
        return h + self.w2(F.silu(self.w1(m)) * self.w3(m))


def saved_bytes(fn: Any, x: torch.Tensor, skip: set[int]) -> int:
    """Bytes of the distinct storages ``fn(x)`` saves for its backward, less ``skip``'s."""
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in skip:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = fn(x)
    y.float().sum().backward()
    return sum(seen.values())


def formula_per_token(h: int = H, q: int = HEADS * HEAD_DIM, f: int = FFN,
                      a: int = HEADS, d: int = 2) -> int:
    """``RuntimeProfile.compiled``'s count per token (predictor.runtimes)."""
    return 4 * h * d + 2 * 4 + 4 * q * d + 4 * a + 3 * f * d


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    layer = LlamaLayer(args.seq).to(torch.bfloat16)
    skip = {p.untyped_storage().data_ptr() for p in layer.parameters()}
    skip |= {b.untyped_storage().data_ptr() for b in layer.buffers()}
    x = torch.randn(1, args.seq, H, dtype=torch.bfloat16, requires_grad=True)
    out: dict[str, Any] = {"seq": args.seq, "formula_per_token": formula_per_token()}
    for name, fn in (("eager", layer), ("inductor", torch.compile(layer))):
        saved_bytes(fn, x, skip)  # compiles (inductor) and creates the lazy state
        out[f"{name}_per_token"] = saved_bytes(fn, x, skip) / args.seq
    print(json.dumps(out) if args.json else
          "\n".join(f"{k}: {v}" for k, v in out.items()))
    return out


if __name__ == "__main__":
    main()
