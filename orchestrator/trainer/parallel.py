"""Process groups and the Megatron-style tensor-parallel building blocks.

Ranks are laid out tp-innermost: ``rank = dp_index · tp + tp_index``, so a tensor-parallel
group is a run of consecutive ranks — the ranks the placement puts on one node first, where
the fast link is. ``f`` (``copy_to_tp``) and ``g`` (``reduce_from_tp``) are the two conjugate
autograd functions of Megatron-LM (Shoeybi et al. 2019, §3): identity forward / all-reduce
backward, and all-reduce forward / identity backward. Column- and row-parallel linears built
on them need only ``dist.all_reduce``, which gloo (CPU) and NCCL (GPU) both provide — unlike
``torch.distributed.tensor.parallel``, whose DTensor redistributions are not all implemented
for gloo.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.distributed as dist
from torch import nn


@dataclass(frozen=True)
class Layout:
    """Where this rank sits: its tp and dp index, and the groups it belongs to."""

    rank: int
    world_size: int
    tp: int
    dp: int
    tp_group: Any = None  # dist.ProcessGroup | None (None: single process)
    dp_group: Any = None

    @property
    def tp_rank(self) -> int:
        return self.rank % self.tp

    @property
    def dp_rank(self) -> int:
        return self.rank // self.tp


def build_layout(rank: int, world_size: int, tp: int, dp: int) -> Layout:
    """Create the tp and dp groups (every rank must call this, in the same order)."""
    if tp * dp != world_size:
        raise ValueError(f"tp·dp = {tp}·{dp} does not match world size {world_size}")
    if not dist.is_initialized():
        return Layout(rank, world_size, tp, dp)
    tp_group = dp_group = None
    for d in range(dp):
        ranks = [d * tp + t for t in range(tp)]
        g = dist.new_group(ranks)
        if rank in ranks:
            tp_group = g
    for t in range(tp):
        ranks = [d * tp + t for d in range(dp)]
        g = dist.new_group(ranks)
        if rank in ranks:
            dp_group = g
    return Layout(rank, world_size, tp, dp, tp_group, dp_group)


class _CopyToTP(torch.autograd.Function):
    """Megatron's ``f``: identity forward, all-reduce of the gradient over the tp group."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _ReduceFromTP(torch.autograd.Function):
    """Megatron's ``g``: all-reduce forward over the tp group, identity backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        x = x.contiguous()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


def copy_to_tp(x: torch.Tensor, layout: Layout) -> torch.Tensor:
    return _CopyToTP.apply(x, layout.tp_group) if layout.tp > 1 else x


def reduce_from_tp(x: torch.Tensor, layout: Layout) -> torch.Tensor:
    return _ReduceFromTP.apply(x, layout.tp_group) if layout.tp > 1 else x


class ColumnParallelLinear(nn.Module):
    """``y = x Wᵀ + b`` with W's output rows split over the tp ranks (shard dim 0)."""

    shard_dims: ClassVar[dict[str, int]] = {"weight": 0, "bias": 0}

    def __init__(self, in_f: int, out_f: int, bias: bool, layout: Layout) -> None:
        super().__init__()
        if out_f % layout.tp:
            raise ValueError(f"tp={layout.tp} does not divide output width {out_f}")
        self.layout = layout
        self.weight = nn.Parameter(torch.empty(out_f // layout.tp, in_f))
        self.bias = nn.Parameter(torch.empty(out_f // layout.tp)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(copy_to_tp(x, self.layout), self.weight, self.bias)


class RowParallelLinear(nn.Module):
    """``y = Σ_tp x_r W_rᵀ + b`` with W's input columns split (shard dim 1); b replicated."""

    shard_dims: ClassVar[dict[str, int]] = {"weight": 1}

    def __init__(self, in_f: int, out_f: int, bias: bool, layout: Layout) -> None:
        super().__init__()
        if in_f % layout.tp:
            raise ValueError(f"tp={layout.tp} does not divide input width {in_f}")
        self.layout = layout
        self.weight = nn.Parameter(torch.empty(out_f, in_f // layout.tp))
        self.bias = nn.Parameter(torch.empty(out_f)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = reduce_from_tp(nn.functional.linear(x, self.weight), self.layout)
        return y + self.bias if self.bias is not None else y


def shard_dims(model: nn.Module) -> dict[str, int]:
    """Canonical parameter name → the dimension split over tp ranks (absent: replicated)."""
    out: dict[str, int] = {}
    for mod_name, mod in model.named_modules():
        dims = getattr(mod, "shard_dims", None)
        if not dims:
            continue
        for pname, dim in dims.items():
            if getattr(mod, pname, None) is not None:
                out[f"{mod_name}.{pname}" if mod_name else pname] = dim
    return out


def allreduce_grads(params: list[nn.Parameter], layout: Layout) -> None:
    """Average gradients over the dp group in one flattened all-reduce."""
    if layout.dp == 1:
        return
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, group=layout.dp_group)
    flat /= layout.dp
    off = 0
    for g in grads:
        n = g.numel()
        g.copy_(flat[off:off + n].view_as(g))
        off += n
