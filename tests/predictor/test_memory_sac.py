"""torchtitan's per-op selective activation checkpointing (the ``fsdp2`` profile's
``selective``): what a layer keeps is measured on a real torch block under the same policy."""

from __future__ import annotations

import weakref
from collections import defaultdict

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
)

from predictor.memory import _op_sac_layer, estimate_memory
from predictor.runtimes import get_runtime
from predictor.spec import ModelSpec, ParallelConfig, TrainingSpec

H, HEADS, KV, FFN, S, B = 128, 4, 2, 256, 32, 2
HD = H // HEADS


class _Block(nn.Module):
    """A llama block as torchtitan writes it (wq, wk, wv, wo, then w2(silu(w1) * w3))."""

    def __init__(self, qkv_bias: bool) -> None:
        super().__init__()
        self.wq = nn.Linear(H, HEADS * HD, bias=qkv_bias)
        self.wk = nn.Linear(H, KV * HD, bias=qkv_bias)
        self.wv = nn.Linear(H, KV * HD, bias=qkv_bias)
        self.wo = nn.Linear(HEADS * HD, H, bias=False)
        self.w1 = nn.Linear(H, FFN, bias=False)
        self.w3 = nn.Linear(H, FFN, bias=False)
        self.w2 = nn.Linear(FFN, H, bias=False)
        self.n1, self.n2 = nn.RMSNorm(H), nn.RMSNorm(H)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.n1(x)
        q = self.wq(y).view(B, S, HEADS, HD).transpose(1, 2)
        k = self.wk(y).view(B, S, KV, HD).transpose(1, 2).repeat_interleave(HEADS // KV, 1)
        v = self.wv(y).view(B, S, KV, HD).transpose(1, 2).repeat_interleave(HEADS // KV, 1)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.wo(o.transpose(1, 2).reshape(B, S, H))
        z = self.n2(x)
        return x + self.w2(F.silu(self.w1(z)) * self.w3(z))


# torchtitan's _save_list (parallelize_llama.py), with the CPU's SDPA kernel standing in for
# the CUDA flash / efficient kernels it names
_SAVE = {torch.ops.aten.mm.default,
         torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
         torch.ops.aten._scaled_dot_product_flash_attention.default,
         torch.ops.aten._scaled_dot_product_efficient_attention.default}


def _context():
    meta: defaultdict[str, int] = defaultdict(int)

    def policy(ctx, func, *args, **kwargs):  # torchtitan's _custom_policy
        mode = "recompute" if ctx.is_recompute else "forward"
        if func == torch.ops.aten.mm.default:
            meta[mode] += 1
        keep = func in _SAVE and not (func == torch.ops.aten.mm.default and meta[mode] % 2 == 0)
        return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


class _Outputs(TorchDispatchMode):
    """Weak references to every tensor an op returns inside the mode."""

    def __init__(self) -> None:
        super().__init__()
        self.refs: list[weakref.ref] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor):
                self.refs.append(weakref.ref(t))
        return out


@pytest.mark.parametrize("qkv_bias", [False, True])
def test_op_sac_layer_is_what_torch_keeps(qkv_bias: bool) -> None:
    torch.manual_seed(0)
    block = _Block(qkv_bias).to(torch.bfloat16)
    x = torch.randn(B, S, H, dtype=torch.bfloat16, requires_grad=True)
    with _Outputs() as mode:
        y = checkpoint(block, x, use_reentrant=False, context_fn=_context)
    alive = {}
    for ref in mode.refs:
        t = ref()
        if t is not None and t.untyped_storage().data_ptr() != y.untyped_storage().data_ptr():
            alive[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    kept = sum(alive.values())
    family = "qwen2" if qkv_bias else "llama"  # qwen2: the llama layout with q/k/v biases
    m = ModelSpec(name="b", family=family, num_layers=1, hidden_size=H, num_heads=HEADS,
                  num_kv_heads=KV, ffn_hidden_size=FFN, vocab_size=64, max_seq_len=S)
    T = B * S
    # the block's input is the caller's tensor (counted by the formula, not made inside)
    assert _op_sac_layer(m, H, HEADS * HD, KV * HD, FFN, HEADS, T, T, 2) - H * T * 2 == kept
    # by hand: without biases Q, V, the gate and the MLP output (mm 1, 3, 5, 7) are saved;
    # with q/k/v biases those run as addmm, so wo and w3 are mm 1 and 3
    mm = (HEADS * HD + KV * HD + FFN + H) if not qkv_bias else (H + FFN)
    assert kept == (mm + HEADS * HD) * T * 2 + 4 * HEADS * T


def test_fsdp2_selective_layer_and_loss_bytes() -> None:
    m = ModelSpec(name="l", family="llama", num_layers=2, hidden_size=64, num_heads=4,
                  num_kv_heads=2, ffn_hidden_size=128, vocab_size=4096, max_seq_len=32,
                  tie_embeddings=False)
    train = TrainingSpec(global_batch=2, seq_len=32)
    par = ParallelConfig(micro_batch=2, recompute="selective")
    rt = get_runtime("fsdp2")
    two = estimate_memory(m, train, par, runtime=rt)
    three = estimate_memory(m.with_(num_layers=3), train, par, runtime=rt)
    T = 2 * 32
    # one more layer keeps its input, Q (64), V (32), the gate (128), the MLP output (64),
    # the attention output (64) in bf16 and the fp32 logsumexp of 4 heads
    assert three.activations - two.activations == (64 + 64 + 32 + 128 + 64 + 64) * T * 2 + 16 * T
    # the peak is the loss's backward: log_softmax's saved fp32 output, its incoming
    # gradient and the input gradient, 12 bytes per logit (torchtitan drops its bf16 logits,
    # ``del pred``, before backward)
    assert two.logits == 12 * T * 4096
