"""The rank-local PyTorch model and optimizer of one (ModelSpec, TrainingSpec, ParallelConfig).

What is built is the memory of *one rank*: the stage's layers of a pipeline plan, each weight
as its Megatron tensor-parallel shard (column split of Q/K/V and MLP-in, row split of the
attention output and MLP-out, vocab-parallel embedding and output), and — for ZeRO — the
rank's 1/dp of the optimizer states, gradients and (stage 3) parameters. Collectives are
emulated locally with the buffer sizes they have on a real rank: an all-reduce is the
identity, a sequence-parallel all-gather allocates the gathered tensor, a reduce-scatter
allocates the 1/t slice. Values are exact for tp = dp = 1; for larger groups only the memory
(shapes, dtypes, lifetimes) is that of a real rank — the other ranks' data is not there.

Every tensor that autograd keeps for backward is decided here, mostly by small custom
``autograd.Function``s, so ``predictor.memory`` can count them (see its docstring for the
tally per layer). Dropout is not used (p = 0, as in current LLM recipes).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from predictor.memory import effective_flags, kv_heads_per_rank, stage_layers
from predictor.spec import Family, ModelSpec, Optimizer, ParallelConfig, Precision, TrainingSpec

DTYPES = {Precision.FP32: torch.float32, Precision.BF16: torch.bfloat16,
          Precision.FP16: torch.float16}


@dataclass(frozen=True, slots=True)
class RankPlan:
    """What the rank-local build needs to know about the plan."""

    tp: int
    dp: int
    sp: bool
    flash: bool
    recompute: str
    zero_stage: int
    dtype: torch.dtype
    device: str


# -- ZeRO-3 parameter shards ---------------------------------------------------------------
def _param(shape: tuple[int, ...], plan: RankPlan, std: float = 0.02) -> nn.Parameter:
    """A parameter of ``shape``; under ZeRO-3 only the rank's flat 1/dp shard is stored."""
    numel = math.prod(shape)
    if plan.zero_stage >= 3:
        shard = -(-numel // plan.dp)
        p = nn.Parameter(torch.empty(shard, dtype=plan.dtype, device=plan.device))
        p.full_shape = shape  # type: ignore[attr-defined]
    else:
        p = nn.Parameter(torch.empty(shape, dtype=plan.dtype, device=plan.device))
    with torch.no_grad():
        if len(shape) == 1:
            p.fill_(1.0 if std < 0 else 0.0)
        else:
            p.normal_(0.0, std)
    return p


def _gather_w(p: torch.Tensor, shape: tuple[int, ...] | None = None) -> torch.Tensor:
    """ZeRO-3 all-gather of a sharded weight: allocates the full tensor (identity otherwise).
    ``shape`` is passed when ``p`` comes back from autograd's saved tensors, which (under
    checkpointing) need not be the Parameter object carrying ``full_shape``."""
    shape = shape or getattr(p, "full_shape", None)
    if shape is None:
        return p
    numel = math.prod(shape)
    dp = -(-numel // p.numel())
    return p.detach().repeat(dp)[:numel].view(shape)


def _scatter_grad(g: torch.Tensor, p: torch.Tensor, sharded: bool | None = None
                  ) -> torch.Tensor:
    """ZeRO-3 reduce-scatter of a full weight gradient to the rank's shard."""
    if sharded is None:
        sharded = getattr(p, "full_shape", None) is not None
    if not sharded:
        return g
    return g.reshape(-1)[: p.numel()].clone()


class _Gather(torch.autograd.Function):
    """Differentiable ZeRO-3 gather for small weights used by stock ops (norms, positions)."""

    @staticmethod
    def forward(ctx: Any, p: torch.Tensor) -> torch.Tensor:
        ctx.p = p
        return _gather_w(p)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return _scatter_grad(g, ctx.p)


def full(p: torch.Tensor) -> torch.Tensor:
    return _Gather.apply(p) if getattr(p, "full_shape", None) is not None else p


# -- sequence-parallel collectives (emulated) -----------------------------------------------
def _sp_gather(x: torch.Tensor, t: int) -> torch.Tensor:
    """All-gather along the sequence: allocates the (b, s, h) tensor."""
    return x.repeat(1, t, 1)


def _sp_scatter(x: torch.Tensor, t: int) -> torch.Tensor:
    """Reduce-scatter along the sequence: allocates the (b, s/t, h) slice."""
    return x[:, : x.shape[1] // t].clone()


class _ColumnLinear(torch.autograd.Function):
    """Column-parallel linear. Saves its input (the sequence shard under SP, gathered again in
    backward, as Megatron does) and the weight (the shard under ZeRO-3)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None,
                sp_t: int) -> torch.Tensor:
        ctx.sp_t = sp_t
        ctx.has_b = b is not None
        ctx.w_shape = getattr(w, "full_shape", None)
        xf = _sp_gather(x, sp_t) if sp_t > 1 else x
        wf = _gather_w(w)
        y = torch.matmul(xf, wf.t())
        if b is not None:
            y.add_(_gather_w(b))
        ctx.save_for_backward(x, w)
        ctx.b = b
        return y

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:
        x, w = ctx.saved_tensors
        xf = _sp_gather(x, ctx.sp_t) if ctx.sp_t > 1 else x
        wf = _gather_w(w, ctx.w_shape)
        gx = torch.matmul(g, wf)
        if ctx.sp_t > 1:
            gx = _sp_scatter(gx, ctx.sp_t)
        gw = _scatter_grad(torch.matmul(g.reshape(-1, g.shape[-1]).t(),
                                        xf.reshape(-1, xf.shape[-1])), w,
                           ctx.w_shape is not None)
        gb = _scatter_grad(g.reshape(-1, g.shape[-1]).sum(0), ctx.b) if ctx.has_b else None
        return gx, gw, gb, None


class _RowLinear(torch.autograd.Function):
    """Row-parallel linear: all-reduce (identity) or, under SP, reduce-scatter of the output.
    Saves its input and the weight; the replicated bias is added after the reduction."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None,
                sp_t: int) -> torch.Tensor:
        ctx.sp_t = sp_t
        ctx.has_b = b is not None
        ctx.w_shape = getattr(w, "full_shape", None)
        y = torch.matmul(x, _gather_w(w).t())
        if sp_t > 1:
            y = _sp_scatter(y, sp_t)
        if b is not None:
            y.add_(_gather_w(b))
        ctx.save_for_backward(x, w)
        ctx.b = b
        return y

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:
        x, w = ctx.saved_tensors
        gb = _scatter_grad(g.reshape(-1, g.shape[-1]).sum(0), ctx.b) if ctx.has_b else None
        gf = _sp_gather(g, ctx.sp_t) if ctx.sp_t > 1 else g
        gx = torch.matmul(gf, _gather_w(w, ctx.w_shape))
        gw = _scatter_grad(torch.matmul(gf.reshape(-1, gf.shape[-1]).t(),
                                        x.reshape(-1, x.shape[-1])), w,
                           ctx.w_shape is not None)
        return gx, gw, gb, None


class _VocabEmbedding(torch.autograd.Function):
    """Vocab-parallel embedding lookup (rows vocab/t); output all-reduced (identity) or, under
    SP, reduce-scattered. Saves the token ids only."""

    @staticmethod
    def forward(ctx: Any, ids: torch.Tensor, w: torch.Tensor, sp_t: int) -> torch.Tensor:
        wf = _gather_w(w)
        local = ids.remainder(wf.shape[0])
        y = F.embedding(local, wf)
        if sp_t > 1:
            y = _sp_scatter(y, sp_t)
        ctx.save_for_backward(ids, w)
        ctx.sp_t = sp_t
        ctx.rows = wf.shape[0]
        ctx.sharded = getattr(w, "full_shape", None) is not None
        return y

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:
        ids, w = ctx.saved_tensors
        gf = _sp_gather(g, ctx.sp_t) if ctx.sp_t > 1 else g
        gw = torch.zeros((ctx.rows, g.shape[-1]), dtype=g.dtype, device=g.device)
        gw.index_add_(0, ids.remainder(ctx.rows).reshape(-1), gf.reshape(-1, gf.shape[-1]))
        return None, _scatter_grad(gw, w, ctx.sharded), None


class _RMSNorm(torch.autograd.Function):
    """RMSNorm saving its input and the fp32 1/rms per token (as fused kernels do)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
        rstd = torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True).add_(eps))
        y = (x.float() * rstd).to(x.dtype).mul_(w)
        ctx.save_for_backward(x, w, rstd)
        return y

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:
        x, w, rstd = ctx.saved_tensors
        # three fp32 (T, h) temporaries at most: xhat, the fp32 gradient, one product
        xhat = x.float().mul_(rstd)
        gy = g.float()
        gw = (gy * xhat).reshape(-1, x.shape[-1]).sum(0).to(w.dtype)
        gy.mul_(w)
        dot = (gy * xhat).mean(-1, keepdim=True)
        gy.sub_(xhat.mul_(dot)).mul_(rstd)
        del xhat
        return gy.to(x.dtype), gw, None


class _SwiGLU(torch.autograd.Function):
    """silu(gate)·up saving gate and up only (silu recomputed in backward)."""

    @staticmethod
    def forward(ctx: Any, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(gate, up)
        return F.silu(gate).mul_(up)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:
        gate, up = ctx.saved_tensors
        sig = torch.sigmoid(gate)
        g_up = gate * sig
        g_up.mul_(g)  # d/d up = silu(gate)·g
        g_gate = torch.sub(1, sig).mul_(gate).add_(1).mul_(sig).mul_(g).mul_(up)
        return g_gate, g_up


class _Rotary(torch.autograd.Function):
    """Rotary embedding on (b, heads, s, d); saves nothing (cos/sin are module buffers)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        ctx.cs = (cos, sin)
        return x * cos + _rotate_half(x) * sin

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:
        cos, sin = ctx.cs
        return g * cos - _rotate_half(g * sin), None, None


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class _CrossEntropy(torch.autograd.Function):
    """Vocab-parallel cross-entropy in fp32: saves the fp32 softmax (s·b·V/t values); the
    gradient is formed in place in it, then cast to the logits' dtype."""

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        lf = logits.float()
        if lf is logits:
            lf = logits.detach()
        mx = lf.amax(-1, keepdim=True)
        lf.sub_(mx).exp_()
        denom = lf.sum(-1, keepdim=True)
        lf.div_(denom)
        local = labels.remainder(lf.shape[-1]).unsqueeze(-1)
        loss = -torch.log(torch.gather(lf, -1, local).clamp_min_(1e-30)).mean()
        ctx.save_for_backward(lf, labels)
        ctx.in_dtype = logits.dtype
        return loss

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:
        sm, labels = ctx.saved_tensors
        local = labels.remainder(sm.shape[-1]).unsqueeze(-1)
        sm.scatter_add_(-1, local, torch.full_like(local, -1, dtype=sm.dtype))
        sm.mul_(g / labels.numel())
        return sm.to(ctx.in_dtype), None


# -- modules -------------------------------------------------------------------------------
class Norm(nn.Module):
    def __init__(self, h: int, rms: bool, plan: RankPlan) -> None:
        super().__init__()
        self.rms = rms
        self.weight = _param((h,), plan, std=-1)
        self.bias = None if rms else _param((h,), plan, std=0)
        self.h = h

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.rms:
            return _RMSNorm.apply(x, full(self.weight), 1e-5)
        return F.layer_norm(x, (self.h,), full(self.weight), full(self.bias), 1e-5)


class Attention(nn.Module):
    """Self-attention of one rank: heads/t query heads, max(kv/t, 1) K/V heads, each
    ``head_dim`` wide; with ``qk_norm`` (qwen3) a per-head RMSNorm of Q and of K before
    rotary (each keeps its input and the fp32 1/rms per head and token)."""

    def __init__(self, m: ModelSpec, plan: RankPlan) -> None:
        super().__init__()
        self.plan = plan
        d = m.head_dim
        self.heads = m.num_heads // plan.tp
        self.kv = kv_heads_per_rank(m, plan.tp)
        self.d = d
        h = m.hidden_size
        self.wq = _param((self.heads * d, h), plan)
        self.wk = _param((self.kv * d, h), plan)
        self.wv = _param((self.kv * d, h), plan)
        qb = m.qkv_bias
        self.bq = _param((self.heads * d,), plan, 0) if qb else None
        self.bk = _param((self.kv * d,), plan, 0) if qb else None
        self.bv = _param((self.kv * d,), plan, 0) if qb else None
        self.wo = _param((h, self.heads * d), plan)
        self.bo = _param((h,), plan, 0) if m.linear_bias else None
        self.causal = m.causal
        self.rotary = not m.learned_positions
        self.q_norm = Norm(d, True, plan) if m.qk_norm else None
        self.k_norm = Norm(d, True, plan) if m.qk_norm else None

    def _core(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if self.plan.flash:
            return F.scaled_dot_product_attention(
                q, k, v, is_causal=self.causal, enable_gqa=self.kv != self.heads)
        if self.kv != self.heads:
            k = k.repeat_interleave(self.heads // self.kv, dim=1)
            v = v.repeat_interleave(self.heads // self.kv, dim=1)
        scores = torch.matmul(q, k.transpose(-1, -2))
        scores.mul_(1.0 / math.sqrt(self.d))
        if self.causal:
            s = q.shape[2]
            scores.add_(torch.full((s, s), float("-inf"), dtype=q.dtype, device=q.device)
                        .triu_(1))
        probs = torch.softmax(scores, dim=-1)
        return torch.matmul(probs, v)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None
                ) -> torch.Tensor:
        t = self.plan.tp if self.plan.sp else 1
        b = x.shape[0]
        q = _ColumnLinear.apply(x, self.wq, self.bq, t)
        k = _ColumnLinear.apply(x, self.wk, self.bk, t)
        v = _ColumnLinear.apply(x, self.wv, self.bv, t)
        s = q.shape[1]
        q = q.view(b, s, self.heads, self.d)
        k = k.view(b, s, self.kv, self.d)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q = q.transpose(1, 2).contiguous()
        k = k.transpose(1, 2).contiguous()
        v = v.view(b, s, self.kv, self.d).transpose(1, 2).contiguous()
        if self.rotary and rope is not None:
            q = _Rotary.apply(q, *rope)
            k = _Rotary.apply(k, *rope)
        if self.plan.recompute == "selective":
            o = checkpoint(self._core, q, k, v, use_reentrant=False, preserve_rng_state=False)
        else:
            o = self._core(q, k, v)
        o = o.transpose(1, 2).reshape(b, s, self.heads * self.d)
        return _RowLinear.apply(o, self.wo, self.bo, t)


class MLP(nn.Module):
    def __init__(self, m: ModelSpec, plan: RankPlan) -> None:
        super().__init__()
        self.plan = plan
        h, f = m.hidden_size, m.ffn_hidden_size // plan.tp
        self.swiglu = m.swiglu
        self.w1 = _param((f, h), plan)
        self.b1 = _param((f,), plan, 0) if m.linear_bias else None
        self.wg = _param((f, h), plan) if m.swiglu else None
        self.w2 = _param((h, f), plan)
        self.b2 = _param((h,), plan, 0) if m.linear_bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = self.plan.tp if self.plan.sp else 1
        if self.swiglu:
            y = _SwiGLU.apply(_ColumnLinear.apply(x, self.wg, None, t),
                              _ColumnLinear.apply(x, self.w1, None, t))
        else:
            y = F.gelu(_ColumnLinear.apply(x, self.w1, self.b1, t), approximate="tanh")
        return _RowLinear.apply(y, self.w2, self.b2, t)


class Layer(nn.Module):
    """One transformer layer: pre-norm (gpt2/llama/qwen2/qwen3), parallel residual (gpt_neox)
    or post-norm (bert)."""

    def __init__(self, m: ModelSpec, plan: RankPlan) -> None:
        super().__init__()
        self.kind = ("post" if m.family is Family.BERT
                     else "parallel" if m.family is Family.GPT_NEOX else "pre")
        self.norm1 = Norm(m.hidden_size, m.rmsnorm, plan)
        self.attn = Attention(m, plan)
        self.norm2 = Norm(m.hidden_size, m.rmsnorm, plan)
        self.mlp = MLP(m, plan)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None
                ) -> torch.Tensor:
        if self.kind == "pre":
            x = x + self.attn(self.norm1(x), rope)
            return x + self.mlp(self.norm2(x))
        if self.kind == "parallel":
            return x + self.attn(self.norm1(x), rope) + self.mlp(self.norm2(x))
        x = self.norm1(x + self.attn(x, rope))
        return self.norm2(x + self.mlp(x))


class Stage(nn.Module):
    """The layers (and embedding / head) that one pipeline stage of one tp rank holds."""

    def __init__(self, m: ModelSpec, plan: RankPlan, stage: int, pp: int, seq_len: int) -> None:
        super().__init__()
        self.m, self.plan, self.first, self.last = m, plan, stage == 0, stage == pp - 1
        h, t = m.hidden_size, plan.tp
        vocab_rows = -(-m.vocab_size // t)
        lo, hi = stage_layers(m.num_layers, pp, stage)
        self.layers = nn.ModuleList(Layer(m, plan) for _ in range(hi - lo))
        bert = m.family is Family.BERT
        if self.first:
            self.wte = _param((vocab_rows, h), plan)
            self.wpe = _param((m.max_seq_len, h), plan) if m.learned_positions else None
            self.tte = _param((m.type_vocab_size, h), plan) if bert and m.type_vocab_size else None
            self.emb_norm = Norm(h, False, plan) if bert else None
        if self.last:
            self.final_norm = None if bert else Norm(h, m.rmsnorm, plan)
            if bert:
                self.mlm_dense = _param((h, h), plan)
                self.mlm_bias = _param((h,), plan, 0)
                self.mlm_norm = Norm(h, False, plan)
                self.out_bias = _param((vocab_rows,), plan, 0)
            else:
                self.out_bias = None
            tied = m.tie_embeddings or bert
            if tied and self.first:
                self.wout = None  # uses self.wte
            else:
                # untied output, or the duplicate of a tied embedding on the last stage (pp > 1)
                self.wout = _param((vocab_rows, h), plan)
        if self.layers and not m.learned_positions:
            d = m.head_dim
            inv = 1.0 / (10000 ** (torch.arange(0, d, 2, device=plan.device).float() / d))
            ang = torch.outer(torch.arange(seq_len, device=plan.device).float(), inv)
            ang = torch.cat((ang, ang), dim=-1)
            self.register_buffer("cos", ang.cos().to(plan.dtype), persistent=False)
            self.register_buffer("sin", ang.sin().to(plan.dtype), persistent=False)
        else:
            self.cos = self.sin = None

    def _sp(self) -> int:
        return self.plan.tp if self.plan.sp else 1

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        t = self._sp()
        x = _VocabEmbedding.apply(ids, self.wte, t)
        s_local = x.shape[1]
        if self.wpe is not None:
            x = x + full(self.wpe)[:s_local]
        if self.tte is not None:
            x = x + full(self.tte)[0]
        if self.emb_norm is not None:
            x = self.emb_norm(x)
        return x

    def head_loss(self, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        t = self._sp()
        if self.m.family is Family.BERT:
            x = _ColumnLinear.apply(x, self.mlm_dense, self.mlm_bias, 1)
            x = self.mlm_norm(F.gelu(x, approximate="tanh"))
        else:
            x = self.final_norm(x)
        w = self.wout if self.wout is not None else self.wte
        logits = _ColumnLinear.apply(x, w, self.out_bias, t)
        return _CrossEntropy.apply(logits, labels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rope = (self.cos[: x.shape[1] * self._sp()], self.sin[: x.shape[1] * self._sp()]) \
            if self.cos is not None else None
        for layer in self.layers:
            if self.plan.recompute == "full":
                x = checkpoint(layer, x, rope, use_reentrant=False, preserve_rng_state=False)
            else:
                x = layer(x, rope)
        return x


class ShardedOptimizer:
    """Mixed-precision / ZeRO optimizer of one rank, written out so its memory is explicit.

    Per parameter: an fp32 ``main_grad`` (numel, or numel/dp under ZeRO >= 2) that backward
    hooks accumulate into (the low-precision ``.grad`` lives only until the hook runs); the
    rank's shard (numel/dp under ZeRO >= 1) of fp32 master weights (mixed precision only; fp32
    updates the parameter in place) and of the optimizer states (Adam m and v, or the SGD
    momentum). The step updates the shard and writes it back into the parameter (the ZeRO
    all-gather lands in the parameter buffer). Adam's only temporary is the denominator
    sqrt(v)+eps of one parameter's shard. fp16 runs without a loss scaler (memory-neutral).
    """

    def __init__(self, params: list[nn.Parameter], kind: Optimizer, mixed: bool, zero: int,
                 dp: int, lr: float = 1e-4) -> None:
        self.params, self.kind, self.mixed, self.zero, self.dp, self.lr = \
            params, kind, mixed, zero, dp, lr
        self.step_count = 0
        self.master: list[torch.Tensor] = []
        self.main_grad: list[torch.Tensor] = []
        self.states: list[list[torch.Tensor]] = []
        n_states = 1 if kind is Optimizer.SGD else 2
        for p in params:
            flat = p.detach().view(-1)
            shard = flat[: self._shard(p)]
            self.master.append(torch.empty_like(shard, dtype=torch.float32).copy_(shard)
                               if mixed else shard)
            gsize = self._shard(p) if zero >= 2 else p.numel()
            self.main_grad.append(torch.zeros(gsize, dtype=torch.float32, device=p.device))
            self.states.append([torch.zeros(shard.numel(), dtype=torch.float32,
                                            device=p.device) for _ in range(n_states)])
            p.register_post_accumulate_grad_hook(self._make_hook(len(self.main_grad) - 1))

    def _shard(self, p: torch.Tensor) -> int:
        if self.zero >= 3 or self.zero == 0:
            return p.numel()  # ZeRO-3 parameters are already the rank's shard
        return -(-p.numel() // self.dp)

    def _make_hook(self, i: int) -> Any:
        def hook(p: torch.Tensor) -> None:
            g = p.grad.view(-1)
            mg = self.main_grad[i]
            mg.add_(g[: mg.numel()])
            p.grad = None
        return hook

    @torch.no_grad()
    def step(self) -> None:
        self.step_count += 1
        b1, b2, eps, wd, mom = 0.9, 0.95, 1e-8, 0.01, 0.9
        for p, master, mg, st in zip(self.params, self.master, self.main_grad, self.states,
                                     strict=True):
            g = mg[: master.numel()]
            if self.kind is Optimizer.SGD:
                st[0].mul_(mom).add_(g)
                master.add_(st[0], alpha=-self.lr)
            else:
                m, v = st
                if self.kind is Optimizer.ADAMW:
                    master.mul_(1 - self.lr * wd)
                m.mul_(b1).add_(g, alpha=1 - b1)
                v.mul_(b2).addcmul_(g, g, value=1 - b2)
                bc1 = 1 - b1 ** self.step_count
                bc2 = 1 - b2 ** self.step_count
                denom = v.sqrt().div_(math.sqrt(bc2)).add_(eps)
                master.addcdiv_(m, denom, value=-self.lr / bc1)
                del denom
            if self.mixed:
                p.view(-1)[: master.numel()].copy_(master)
            mg.zero_()


def rank_plan(train: TrainingSpec, par: ParallelConfig, device: str) -> RankPlan:
    sp, flash = effective_flags(train, par)
    return RankPlan(tp=par.tp, dp=par.dp, sp=sp, flash=flash, recompute=str(par.recompute.value),
                    zero_stage=par.zero_stage, dtype=DTYPES[train.precision], device=device)


def build(model: ModelSpec, train: TrainingSpec, par: ParallelConfig, stage: int,
          device: str = "cpu") -> tuple[Stage, ShardedOptimizer]:
    """The stage's rank-local module and its optimizer (parameters allocated on ``device``)."""
    plan = rank_plan(train, par, device)
    net = Stage(model, plan, stage, par.pp, train.seq_len)
    opt = ShardedOptimizer(list(net.parameters()), train.optimizer,
                           mixed=train.precision is not Precision.FP32,
                           zero=par.zero_stage, dp=par.dp)
    return net, opt
