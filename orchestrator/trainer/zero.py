"""ZeRO data parallelism for the built-in trainer: optimizer states (stage 1), gradients
(stage 2) and the transformer blocks' parameters (stage 3) sharded over the data-parallel
group.

Every parameter (this rank's tensor-parallel slice of it) is sharded on its own: flattened,
split into ``dp`` chunks of ``c = ceil(n / dp)`` elements, dp rank ``r`` owning elements
``[r·c, min((r+1)·c, n))`` — the shard arithmetic ``predictor.memory`` prices
(``ceil(n/dp)`` per tensor). The inner optimizer (the trainer's fused Adam/AdamW/SGD, weight
decay on the matrices' chunks only) steps over *views* of the owned chunks, so it updates the
fp32 weights in place (they are the master: no copy) and keeps states for the chunk only.
After the step each parameter is all-gathered into itself from a copy of the owned chunk,
which is the only temporary (one parameter's chunk at a time).

* Stage 1: after the backward each full gradient is all-reduced in place (no flat copy), and
  only the owned chunk's view is divided and given to the optimizer.
* Stage 2: a post-accumulate-grad hook reduce-scatters each parameter's gradient the moment
  the backward has produced it (every micro-batch), adds the owned chunk to a persistent
  chunk-sized gradient, and frees the full one, so a rank keeps 1/dp of the gradients.
* Stage 3: as stage 2, and every parameter of a transformer block lives as its owned chunk
  only (a tensor of its own, the optimizer's master): the block's parameters are gathered
  to full just before its forward and freed right after it, and gathered again just before
  its backward and freed after it (``ParameterSharding``: two autograd functions around each
  block, so the order holds under full recomputation too, whose replay runs between them).
  Freeing swaps ``p.data`` for a placeholder, so what autograd saved of the parameter
  itself sees the regathered data at the backward. In an fp32 run without full
  recomputation the matmuls save views of their weights (``weight.t()``), which keep the
  forward's gathered tensors alive until the backward anyway (as autocast's weight copies
  are in a mixed run): there the layer's gathered tensors are kept for its backward
  instead of gathered twice. The embedding, positions, the final norm and the head stay
  whole (the "root", as FSDP2 keeps it): their weights, states and gradients are handled
  as stage 2's, and only they are gathered after the step (a block's are before its next
  forward).

On NCCL the reduction is ``reduce_scatter_tensor`` and the gather an in-place
``all_gather_into_tensor``. gloo (CPU: the emulated cluster, tests) implements both through
a full-size copy, so there the trainer keeps to in-place collectives that hold the same
tensors: an all-reduce of the gradient and a copy of the owned chunk, and one broadcast per
chunk from its owner (``_in_place_only``). The loss curve is
the unsharded run's (Adam's update is elementwise); clipping sums the chunks' squared norms
over the dp group (and the tp-sharded tensors' over the tp group). Checkpoints stay
dp-independent: ``full_state`` gathers a parameter's states back to its full (tp-local)
shape, ``load_full_state`` keeps this rank's chunk (``orchestrator.trainer.checkpoint``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from orchestrator.trainer.parallel import Layout, clip_global_norm
from predictor.runtimes import FRENZY

log = logging.getLogger(__name__)

TRAINER_ZERO_STAGES = FRENZY.zero_stages
"""The ZeRO stages the built-in trainer executes: the ``frenzy`` profile states them, so the
planner offers exactly the stages this module runs."""


def check_zero_stage(stage: int) -> None:
    """``ValueError`` naming the field when the trainer cannot run ZeRO stage ``stage``."""
    if stage not in TRAINER_ZERO_STAGES:
        raise ValueError(f"zero_stage={stage}: the built-in trainer executes ZeRO stages "
                         f"{', '.join(map(str, TRAINER_ZERO_STAGES))}; plan with one of those")


def _reduce_scatter(out: torch.Tensor, inp: torch.Tensor, group: Any) -> None:
    fn = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    fn(out, inp, group=group)


def _all_gather(out: torch.Tensor, inp: torch.Tensor, group: Any) -> None:
    fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    fn(out, inp, group=group)


def _broadcast_chunks(flat: torch.Tensor, c: int, layout: Layout) -> None:
    """Fill ``flat`` from every dp rank's chunk of ``c`` elements in place: one broadcast per
    chunk from its owner (the in-place all-gather, ``_in_place_only``)."""
    n = flat.numel()
    for r in range(layout.dp):
        if r * c < n:
            dist.broadcast(flat[r * c:min((r + 1) * c, n)], src=layout.dp_peer(r),
                           group=layout.dp_group)


def _in_place_only(group: Any) -> bool:
    """Whether to keep to in-place collectives (all-reduce, broadcast): gloo implements
    reduce-scatter and all-gather into a tensor through a full-size copy of the input /
    output that NCCL does not make (the CPU tracker sees it), so on gloo — and in the
    single-process measurement, which fakes the collectives — ZeRO uses in-place ones that
    hold the same tensors as NCCL's."""
    return not dist.is_initialized() or dist.get_backend(group) != "nccl"


class ZeroOptimizer:
    """The trainer's optimizer over this dp rank's chunks (see the module docstring).

    ``make(groups)`` builds the inner optimizer from parameter groups of chunk views (each
    group a dict with ``params`` and ``decay``, a bool); ``decays(p)`` says whether weight
    decay applies to parameter ``p``. ``param_groups`` and ``state`` are the inner
    optimizer's (the loop sets the learning rate through them; the memory meter reads the
    states)."""

    def __init__(self, params: Iterable[nn.Parameter], layout: Layout, stage: int,
                 make: Callable[[list[dict[str, Any]]], torch.optim.Optimizer],
                 decays: Callable[[nn.Parameter], bool],
                 blocks: Sequence[nn.Module] = ()) -> None:
        if stage not in (1, 2, 3):
            raise ValueError(f"ZeroOptimizer shards states: stage 1, 2 or 3, got {stage}")
        if stage == 3 and not blocks:
            raise ValueError("ZeRO-3 shards the parameters of blocks: none given")
        self.layout = layout
        self.stage = stage
        self.params = list(params)
        self._index = {id(p): i for i, p in enumerate(self.params)}
        # stage 3: the blocks whose parameters live as chunks, and those parameters
        self.blocks = list(blocks) if stage == 3 else []
        self.sharded: set[int] = {id(p) for b in self.blocks for p in b.parameters()}
        self._shapes: dict[int, torch.Size] = {}  # stage 3: a sharded parameter's full shape
        self._full: set[int] = set(self.sharded)  # stage 3: the ones holding full tensors now
        self._placeholders: dict[torch.dtype, torch.Tensor] = {}  # what a released one views
        self._kept: dict[int, torch.Tensor] = {}  # forward's tensors autograd holds a view of
        dp, r = layout.dp, layout.dp_rank
        self.ranges: list[tuple[int, int, int]] = []  # (lo, hi, chunk) per parameter
        # p -> its owned chunk: a view into p, or under stage 3 a block parameter's own tensor
        self.chunks: dict[nn.Parameter, torch.Tensor] = {}
        for p in self.params:
            if not p.is_contiguous():
                raise ValueError("ZeRO shards contiguous parameters only")
            n = p.numel()
            c = -(-n // dp)
            lo, hi = min(r * c, n), min((r + 1) * c, n)
            self.ranges.append((lo, hi, c))
            if id(p) in self.sharded:
                self._shapes[id(p)] = p.shape
            if hi > lo:
                view = p.detach().view(-1)[lo:hi]
                self.chunks[p] = view.clone() if id(p) in self.sharded else view
        groups = [{"params": [v for p, v in self.chunks.items() if decays(p)], "decay": True},
                  {"params": [v for p, v in self.chunks.items() if not decays(p)],
                   "decay": False}]
        self.optimizer = make([g for g in groups if g["params"]])
        self._in_place = _in_place_only(layout.dp_group)
        self._grads: dict[nn.Parameter, torch.Tensor] = {}  # stage 2: owned gradient chunks
        self._hooks = []
        if stage >= 2 and dp > 1:
            for p, rng in zip(self.params, self.ranges, strict=True):
                self._hooks.append(p.register_post_accumulate_grad_hook(
                    self._make_hook(rng)))

    # -- stage 3: the blocks' parameters as chunks, gathered around each block ---------------
    @torch.no_grad()
    def shard_blocks(self, model: nn.Module) -> None:
        """Keep only the owned chunk of every block parameter (copied from the parameter as
        it is now: initialised or loaded from a checkpoint), free the full tensors, and make
        ``model`` gather each block around its forward and backward
        (``model.block_params``). No-op below stage 3."""
        if self.stage < 3:
            return
        for p in self._block_params():
            chunk = self.chunks.get(p)
            lo, hi, _ = self.ranges[self._index[id(p)]]
            if chunk is not None:
                chunk.copy_(p.detach().view(-1)[lo:hi])
        for block in self.blocks:
            self.release(block)
        model.block_params = ParameterSharding(self, bool(getattr(model, "full_recompute",
                                                                   False)))

    def _block_params(self) -> list[nn.Parameter]:
        return [p for p in self.params if id(p) in self.sharded]

    @torch.no_grad()
    def gather(self, block: nn.Module, reuse: bool = False) -> None:
        """Give every parameter of ``block`` its full (tp-local) tensor from the dp ranks'
        chunks (collective over the dp group). ``reuse`` (the backward's gather): where
        autograd still holds the tensor the forward gathered (an fp32 matmul saves a view
        of its weight), take that instead: the same values, no second copy."""
        for p in block.parameters():
            kept = self._kept.pop(id(p), None)
            p.data = kept if kept is not None and reuse else self._gathered(p)
            self._full.add(id(p))

    @torch.no_grad()
    def release(self, block: nn.Module, keep: bool = False) -> None:
        """Free the full tensors of ``block``'s parameters (their chunks stay); ``keep``
        (the forward's end of a layer whose matmuls saved views of their weights): keep
        the tensors for the backward's gather. A released parameter
        keeps its shape as a stride-0 view of one shared element, so shape-reading code
        (checkpoints, optimizer states) works and an in-place write fails loudly."""
        for p in block.parameters():
            self._kept.pop(id(p), None)
            if keep and id(p) in self._full:
                self._kept[id(p)] = p.detach()
            self._full.discard(id(p))
            one = self._placeholders.get(p.dtype)
            if one is None:
                one = self._placeholders[p.dtype] = torch.zeros(1, dtype=p.dtype,
                                                                device=p.device)
            p.data = one.expand(self._shapes[id(p)])

    def _gathered(self, p: nn.Parameter) -> torch.Tensor:
        """A new full (tp-local) tensor of block parameter ``p`` from the dp ranks' chunks:
        gloo, the owned chunk copied in and one in-place broadcast per chunk; NCCL, an
        in-place all-gather into a buffer of ``dp`` chunks (cut to the parameter's size)."""
        layout = self.layout
        lo, hi, c = self.ranges[self._index[id(p)]]
        shape = self._shapes[id(p)]
        n = shape.numel()
        mine = self.chunks.get(p)
        if self._in_place:
            full = torch.empty(n, dtype=p.dtype, device=p.device)
            if mine is not None:
                full[lo:hi].copy_(mine)
            if dist.is_initialized():  # (measuring: the other ranks' chunks are not needed)
                _broadcast_chunks(full, c, layout)
        else:
            out = torch.empty(c * layout.dp, dtype=p.dtype, device=p.device)
            slot = out[layout.dp_rank * c:(layout.dp_rank + 1) * c]
            if mine is not None:
                slot[:hi - lo].copy_(mine)
            _all_gather(out, slot, layout.dp_group)
            full = out[:n]
        return full.view(shape)

    @torch.no_grad()
    def full_param(self, p: nn.Parameter) -> torch.Tensor:
        """``p``'s full (tp-local) tensor: a stage-3 block parameter's gathered from the dp
        chunks into a new tensor (collective: every dp rank calls it for the same parameters
        in the same order); otherwise ``p`` itself."""
        if id(p) not in self.sharded or id(p) in self._full:
            return p.detach()
        return self._gathered(p)

    @torch.no_grad()
    def load_full_param(self, p: nn.Parameter, full: torch.Tensor) -> None:
        """Keep this rank's chunk of ``p``'s full (tp-local) tensor ``full`` (stage 3 block
        parameters; the others are copied into ``p`` as they are)."""
        if id(p) not in self.sharded or id(p) in self._full:
            p.copy_(full.to(p.device, p.dtype))
            return
        chunk = self.chunks.get(p)
        if chunk is not None:
            lo, hi, _ = self.ranges[self._index[id(p)]]
            chunk.copy_(full.reshape(-1)[lo:hi].to(p.device, p.dtype))

    # -- the inner optimizer's face ---------------------------------------------------------
    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.optimizer.param_groups

    @property
    def state(self) -> Any:
        return self.optimizer.state

    # -- stage 2: reduce-scatter as the backward produces each gradient ---------------------
    def _make_hook(self, rng: tuple[int, int, int]) -> Callable[[torch.Tensor], None]:
        lo, hi, c = rng
        layout = self.layout

        def hook(p: torch.Tensor) -> None:
            g = p.grad
            assert g is not None
            flat = g.view(-1)
            if self._in_place:  # all-reduce in place, keep a copy of the owned chunk
                dist.all_reduce(flat, group=layout.dp_group)
                out = flat[lo:hi].clone()
            else:
                if flat.numel() != c * layout.dp:
                    padded = torch.zeros(c * layout.dp, dtype=g.dtype, device=g.device)
                    padded[:flat.numel()] = flat
                    flat = padded
                out = torch.empty(c, dtype=g.dtype, device=g.device)
                _reduce_scatter(out, flat, layout.dp_group)
            del flat
            p.grad = None
            owned = out[:hi - lo]
            prev = self._grads.get(p)  # type: ignore[call-overload]
            if prev is None:
                if hi > lo:
                    self._grads[p] = owned  # type: ignore[index]
            else:
                prev.add_(owned)

        return hook

    # -- after the backward -----------------------------------------------------------------
    def reduce_grads(self, scale: float = 1.0) -> None:
        """Average the gradients over the dp group (stage 1: in-place all-reduce of each;
        stage 2: the hooks did the reduction) and give the optimizer this rank's chunks,
        divided by ``scale`` (fp16's loss scale) as well."""
        dp = self.layout.dp
        for p, (lo, hi, _) in zip(self.params, self.ranges, strict=True):
            chunk = self.chunks.get(p)
            if self.stage >= 2 and dp > 1:
                g = self._grads.get(p)
            else:
                if p.grad is None:
                    continue
                if dp > 1:
                    dist.all_reduce(p.grad, group=self.layout.dp_group)
                g = p.grad.view(-1)[lo:hi] if chunk is not None else None
            if chunk is None or g is None:
                continue
            if dp * scale != 1.0:
                g.div_(dp * scale)
            chunk.grad = g

    def grads(self) -> list[torch.Tensor]:
        """This rank's gradient chunks (after ``reduce_grads``)."""
        return [v.grad for v in self.chunks.values() if v.grad is not None]

    def nonfinite(self) -> bool:
        """Whether a gradient chunk holds an inf or NaN (its sum does: no temporary the size
        of the chunk; only a finite sum beyond fp32's range, 3e38, would be a false alarm)."""
        return any(not bool(torch.isfinite(g.sum())) for g in self.grads())

    def clip(self, names: dict[nn.Parameter, str], tp_sharded: set[str],
             max_norm: float) -> float:
        """Scale the gradient chunks so the global norm is at most ``max_norm``; returns the
        norm before. Chunks are summed over the dp group; tp-sharded tensors over the tp
        group too, tp-replicated ones counted once; pipeline stages added up. A parameter
        missing from ``names`` (a tied embedding's copy on the last stage) is scaled but
        not counted."""
        grads = [(v.grad, names[p] in tp_sharded) for p, v in self.chunks.items()
                 if v.grad is not None and p in names]
        others = [v.grad for p, v in self.chunks.items() if v.grad is not None
                  and p not in names]
        dev = next(iter(self.chunks)).device if self.chunks else torch.device("cpu")
        return clip_global_norm(grads, self.layout, max_norm, dev, dp_chunks=True,
                                also=others)

    def step(self) -> None:
        """Update the owned chunks, free every gradient, then all-gather each parameter from
        the dp ranks' chunks."""
        self.optimizer.step()
        self.zero_grad(set_to_none=True)
        self._gather_params()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for v in self.chunks.values():
            v.grad = None
        for p in self.params:
            p.grad = None
        self._grads = {}

    @torch.no_grad()
    def _gather_params(self) -> None:
        """Every dp rank's updated chunks into every parameter: NCCL's in-place all-gather
        (the owned chunk already sits at its place in the output), else one in-place
        broadcast per chunk from its owner; only a parameter whose size ``dp`` does not
        divide goes through a padded copy (NCCL)."""
        layout = self.layout
        if layout.dp == 1:
            return
        for p, (lo, hi, c) in zip(self.params, self.ranges, strict=True):
            if id(p) in self.sharded:
                continue  # gathered before the block's next forward
            flat = p.detach().view(-1)
            n = flat.numel()
            if self._in_place:
                _broadcast_chunks(flat, c, layout)
            elif n == c * layout.dp:
                _all_gather(flat, flat[lo:hi], layout.dp_group)
            else:
                mine = torch.zeros(c, dtype=p.dtype, device=p.device)
                mine[:hi - lo] = flat[lo:hi]
                out = torch.empty(c * layout.dp, dtype=p.dtype, device=p.device)
                _all_gather(out, mine, layout.dp_group)
                flat.copy_(out[:n])
                del out, mine

    # -- checkpoints: full (tp-local) shapes, independent of dp ------------------------------
    def _state_keys(self) -> tuple[list[str], dict[str, Any]]:
        """(per-element state keys, per-parameter scalars) of this rank's states: every chunk
        steps together, so any chunk's state tells (none before the first step)."""
        for v in self.chunks.values():
            st = self.optimizer.state.get(v)
            if st:
                shaped = [k for k, x in sorted(st.items())
                          if isinstance(x, torch.Tensor) and x.shape == v.shape]
                scalars = {k: x for k, x in st.items() if k not in shaped}
                return shaped, scalars
        return [], {}

    @torch.no_grad()
    def full_state(self, p: nn.Parameter) -> dict[str, Any]:
        """``p``'s optimizer state at its full (tp-local) shape, gathered over the dp group
        (collective: every dp rank calls it for the same parameters in the same order)."""
        shaped, scalars = self._state_keys()
        i = self._index[id(p)]
        lo, hi, c = self.ranges[i]
        v = self.chunks.get(p)
        st = self.optimizer.state.get(v, {}) if v is not None else {}
        out: dict[str, Any] = {}
        for k in shaped:
            mine = torch.zeros(c, dtype=p.dtype, device=p.device)
            if k in st:
                mine[:hi - lo] = st[k]
            if self.layout.dp > 1:
                full = torch.empty(c * self.layout.dp, dtype=p.dtype, device=p.device)
                _all_gather(full, mine, self.layout.dp_group)
            else:
                full = mine
            out[k] = full[:p.numel()].view_as(p).cpu()
        for k, x in scalars.items():
            val = st.get(k, x)
            out[k] = val.detach().cpu().clone() if isinstance(val, torch.Tensor) else val
        return out

    @torch.no_grad()
    def load_full_state(self, p: nn.Parameter, entry: dict[str, Any]) -> None:
        """Keep this rank's chunk of ``p``'s full (tp-local) state ``entry``."""
        v = self.chunks.get(p)
        if v is None or not entry:
            return
        lo, hi, _ = self.ranges[self._index[id(p)]]
        self.optimizer.state[v] = {
            k: (x.reshape(-1)[lo:hi].to(p.device, p.dtype).clone()
                if isinstance(x, torch.Tensor) and x.shape == p.shape
                else (x.to(p.device) if isinstance(x, torch.Tensor) else x))
            for k, x in entry.items()}


class _Enter(torch.autograd.Function):
    """Before a block: forward gathers its parameters; backward (after the block's backward
    has made every gradient of it) frees them."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, owner: ZeroOptimizer, block: nn.Module
                ) -> torch.Tensor:
        owner.gather(block)
        ctx.owner, ctx.block = owner, block
        return x

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        ctx.owner.release(ctx.block)
        return grad, None, None


class _Leave(torch.autograd.Function):
    """After a block: forward frees its parameters; backward (before the block's backward,
    and before full recomputation replays its forward) gathers them again."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, owner: ZeroOptimizer, block: nn.Module,
                keep: bool) -> torch.Tensor:
        owner.release(block, keep)
        ctx.owner, ctx.block = owner, block
        return x

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        ctx.owner.gather(ctx.block, reuse=True)
        return grad, None, None, None


class ParameterSharding:
    """What the model calls around each block under ZeRO-3 (``ParallelTransformer``'s
    ``block_params``): ``enter`` before the block, ``leave`` after it."""

    def __init__(self, owner: ZeroOptimizer, full_recompute: bool) -> None:
        self.owner = owner
        self.full_recompute = full_recompute

    def enter(self, block: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return _Enter.apply(x, self.owner, block)

    def leave(self, block: nn.Module, x: torch.Tensor) -> torch.Tensor:
        # an fp32 forward with a backward to come, its activations kept (no full
        # recomputation): its matmuls saved views of the weights (weight.t()), which keep
        # the gathered tensors alive anyway, so the backward takes them instead of a second
        # gather (the same on every rank: no collective depends on it)
        keep = (torch.is_grad_enabled() and block.training and not self.full_recompute
                and not torch.is_autocast_enabled(x.device.type))
        return _Leave.apply(x, self.owner, block, keep)
