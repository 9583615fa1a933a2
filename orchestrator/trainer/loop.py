"""The built-in training loop: one rank of a tp × dp × pp job (ZeRO-1/2/3 over dp when the plan
says so: ``orchestrator.trainer.zero``; pipeline stages under the 1F1B schedule:
``orchestrator.trainer.pipeline``), with checkpoints and progress.

``train`` runs inside a Ray worker actor (``orchestrator.trainer.worker``) or, in unit tests,
inside a plain ``torch.multiprocessing`` process: it only needs ``RunConfig`` and a
``Control`` (stop flag + progress callback). Every step ends with one small all-reduce over
the world that carries the loss, "stop requested" and "non-finite gradients", so all ranks
agree on when to stop (checkpoint first) and on skipping an fp16 overflow step (under
pipeline parallelism only the last stage has a loss; the all-reduce gives it to every rank).

Data is the job's (``orchestrator.trainer.data``: token shards, or text with a tokenizer) or,
by default, synthetic but learnable: sequences of an affine recurrence ``t[i+1] = (a·t[i] +
b) mod V`` from random starts, so the loss falls within a few steps. Either way the global
batch of a step is a function of the step's sample position and the seed, sliced by dp rank,
so it is the same for any dp — which, with the canonical initialisation, makes tp/dp layouts
numerically equivalent; the position is saved with each checkpoint, so a resumed run reads
the batches an uninterrupted one would.

The optimizer's learning rate follows ``lr_at`` (linear warmup, then cosine or linear decay
to ``min_lr_ratio``·lr, or constant); weight decay applies to matrices only (not to biases
and norm weights); gradients are clipped to ``grad_clip`` by their global norm (tp shards
summed, replicated tensors counted once). ``init_from`` starts a new job from a Hugging Face
model folder's weights (``orchestrator.trainer.hf``).
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from orchestrator.trainer import checkpoint as ckpt
from orchestrator.trainer.data import DataConfig, TokenData
from orchestrator.trainer.memory import PeakMeter, live_tensors, rank_oom
from orchestrator.trainer.model import (
    Numerics,
    ParallelTransformer,
    check_supported,
    init_canonical,
)
from orchestrator.trainer.parallel import (
    Layout,
    allreduce_grads,
    build_layout,
    clip_global_norm,
    full_shapes,
    shard_dims,
)
from orchestrator.trainer.pipeline import P2P, one_f_one_b
from orchestrator.trainer.zero import ZeroOptimizer, check_zero_stage
from predictor.spec import Family, ModelSpec, Optimizer, Precision, Recompute

log = logging.getLogger(__name__)

FP16_LOSS_SCALE = 1024.0
DIST_BACKEND_ENV = "FRENZY_DIST_BACKEND"


@dataclass(frozen=True)
class RunConfig:
    """Everything one launch of one job needs, identical on every rank (picklable)."""

    job_id: str
    model: ModelSpec | None
    global_batch: int
    seq_len: int
    total_steps: int
    tp: int = 1
    dp: int = 1
    pp: int = 1
    micro_batch: int = 1
    recompute: Recompute = Recompute.NONE
    zero_stage: int = 0  # ZeRO over dp: 1 optimizer states, 2 gradients, 3 layer weights
    precision: Precision = Precision.FP32
    optimizer: Optimizer = Optimizer.ADAMW
    lr: float = 3e-3
    lr_schedule: str = "constant"  # constant | cosine | linear
    warmup_steps: int = 0
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.01
    grad_clip: float = 0.0  # 0: no clipping
    seed: int = 0
    data: DataConfig = field(default_factory=DataConfig)
    init_from: str | None = None  # a Hugging Face model folder (config.json + safetensors)
    numerics: Numerics | None = None  # None: init_from's config.json, else the defaults
    checkpoint_dir: str = "checkpoints"
    checkpoint_every: int = 50
    master_addr: str = "127.0.0.1"
    master_port: int = 29500
    entrypoint: tuple[str, ...] | None = None
    working_dir: str | None = None  # entrypoint mode: the folder it starts in (copied)
    env: dict[str, str] = field(default_factory=dict)
    dist_timeout_s: float = 120.0
    memory_cap_bytes: int = 0  # CPU ranks: tensor bytes the plan's GPU holds (0: no cap)

    @property
    def world_size(self) -> int:
        return self.tp * self.dp * self.pp


@dataclass
class Control:
    """Shared between the training thread and whoever watches it (the actor's other
    thread): a stop request in, the latest progress out."""

    stop: threading.Event = field(default_factory=threading.Event)
    status: dict[str, Any] = field(default_factory=dict)
    on_step: Callable[[dict[str, Any]], None] | None = None

    def report(self, **status: Any) -> None:
        self.status = {**self.status, **status}
        if self.on_step is not None:
            self.on_step(dict(self.status))


@dataclass(frozen=True)
class RunResult:
    """How one rank's run ended."""

    steps_done: int  # steps completed (and checkpointed unless the job crashed)
    checkpoint_step: int
    finished: bool  # all steps done
    stopped: bool  # stopped on request, after a checkpoint
    first_step: int  # the step this launch resumed from
    losses: tuple[float, ...] = ()
    peak_tensors_bytes: int | None = None  # measured peak (see orchestrator.trainer.memory)
    peak_reserved_bytes: int | None = None


def numbered_losses(losses: Sequence[float], last_step: int,
                    last: int | None = None) -> tuple[tuple[int, float], ...]:
    """``(step, loss)`` pairs of ``losses``, the losses of the steps up to ``last_step`` (the
    final one is that step's); only the ``last`` ones when given."""
    tail = losses[-last:] if last is not None else losses
    return tuple(zip(range(last_step - len(tail) + 1, last_step + 1), tail, strict=True))


def _mlm_mask(cfg: RunConfig, step: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(cfg.seed * 7_919 + step + 1_000_000_007)
    return torch.rand(cfg.global_batch, cfg.seq_len, generator=g) < 0.15


def _to_batch(cfg: RunConfig, seq: torch.Tensor, mask: torch.Tensor, mask_id: int,
              device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    assert cfg.model is not None
    seq = seq.long()
    if cfg.model.family is Family.BERT:  # masked LM: predict the 15% masked tokens
        inputs = seq[:, :-1].clone()
        targets = torch.where(mask, inputs, torch.full_like(inputs, -100))
        inputs[mask] = mask_id
    else:
        inputs, targets = seq[:, :-1], seq[:, 1:]
    return inputs.to(device), targets.to(device)


def synthetic_batch(cfg: RunConfig, step: int, dp_rank: int,
                    device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, targets) of this dp rank's share of the global batch of ``step``."""
    assert cfg.model is not None
    v = cfg.model.vocab_size
    g = torch.Generator().manual_seed(cfg.seed * 7_919 + step)
    a, b = 5, 3
    starts = torch.randint(0, v, (cfg.global_batch,), generator=g)
    seq = torch.empty(cfg.global_batch, cfg.seq_len + 1, dtype=torch.long)
    seq[:, 0] = starts
    for i in range(cfg.seq_len):
        seq[:, i + 1] = (a * seq[:, i] + b) % v
    mask = torch.rand(cfg.global_batch, cfg.seq_len, generator=g) < 0.15
    share = cfg.global_batch // cfg.dp
    rows = slice(dp_rank * share, (dp_rank + 1) * share)
    return _to_batch(cfg, seq[rows], mask[rows], 0, device)


def data_batch(cfg: RunConfig, data: TokenData, step: int, position: int, dp_rank: int,
               device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, targets) of this dp rank's rows of the global batch at sample ``position``
    (``step`` seeds BERT's mask)."""
    assert cfg.model is not None
    seq = data.batch(position, cfg.global_batch, cfg.dp, dp_rank, cfg.seq_len, cfg.seed)
    top = int(seq.max()) if seq.numel() else 0
    if top >= cfg.model.vocab_size:
        raise ValueError(f"data: token id {top} is outside the model's vocabulary "
                         f"({cfg.model.vocab_size}); use the model's tokenizer")
    share = cfg.global_batch // cfg.dp
    mask = _mlm_mask(cfg, step)[dp_rank * share:(dp_rank + 1) * share]
    return _to_batch(cfg, seq, mask, data.mask_id, device)


def lr_at(cfg: RunConfig, step: int) -> float:
    """Learning rate of optimizer step ``step`` (0-based): linear warmup over
    ``warmup_steps``, then ``lr_schedule`` down to ``min_lr_ratio``·lr at the last step."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    if cfg.lr_schedule == "constant":
        return cfg.lr
    span = max(1, cfg.total_steps - cfg.warmup_steps - 1)
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    low = cfg.lr * cfg.min_lr_ratio
    if cfg.lr_schedule == "linear":
        return cfg.lr - (cfg.lr - low) * progress
    if cfg.lr_schedule == "cosine":
        return low + (cfg.lr - low) * 0.5 * (1.0 + math.cos(math.pi * progress))
    raise ValueError(f"lr_schedule {cfg.lr_schedule!r}; one of constant, cosine, linear")


def tied_copy_params(model: torch.nn.Module) -> set[torch.nn.Parameter]:
    """The last stage's copy of a tied embedding (pp > 1), which the global gradient norm
    leaves out: the first stage's counts it."""
    if getattr(model, "tied_copy", False):
        return {model.embed.weight}
    return set()


def sync_tied_grads(model: ParallelTransformer, opt: torch.optim.Optimizer | ZeroOptimizer,
                    layout: Layout) -> None:
    """Sum a tied embedding's gradient between the first stage (the lookup's) and the last
    (the output layer's copy), after the dp averaging (under ZeRO this rank's chunk of it),
    so both copies take the same step (Megatron-LM's embedding group)."""
    if layout.pp == 1 or not model.tied:
        return
    if not (layout.first_stage or layout.last_stage):
        return
    assert model.embed is not None
    p = model.embed.weight
    if isinstance(opt, ZeroOptimizer):
        chunk = opt.chunks.get(p)
        g = chunk.grad if chunk is not None else None
    else:
        g = p.grad
    if g is None:  # (the same on both ends: the same shapes and dp ranks)
        return
    dist.all_reduce(g, group=layout.tied_group)


def clip_grads(model: torch.nn.Module, layout: Layout, max_norm: float) -> float:
    """Scale gradients so their global norm is at most ``max_norm``; returns the norm before.
    Tensor-parallel shards are summed over the tp group, pipeline stages added up;
    replicated tensors (and a tied embedding's two copies) count once."""
    dims = shard_dims(model)
    skip = tied_copy_params(model)
    grads = [(p.grad, name in dims) for name, p in model.named_parameters()
             if p.grad is not None and p not in skip]
    also = [p.grad for p in skip if p.grad is not None]
    device = grads[0][0].device if grads else torch.device("cpu")
    return clip_global_norm(grads, layout, max_norm, device, also=also)


def _autocast(precision: Precision, device: torch.device) -> Any:
    if precision is Precision.FP32:
        return torch.autocast(device.type, enabled=False)
    dtype = torch.bfloat16 if precision is Precision.BF16 else torch.float16
    return torch.autocast(device.type, dtype=dtype)


def _decays(p: torch.Tensor) -> bool:
    """Weight decay applies to matrices only (not to biases and norm weights)."""
    return p.dim() >= 2


def _make_optimizer(cfg: RunConfig, groups: list[dict[str, Any]]) -> torch.optim.Optimizer:
    """The trainer's optimizer over ``groups`` (dicts of ``params`` and ``decay``)."""
    groups = [{"params": g["params"], "weight_decay": cfg.weight_decay if g["decay"] else 0.0}
              for g in groups if g["params"]]
    # fused kernels on every device: the step makes no temporaries (CUDA's default foreach
    # path takes a sqrt(v), or a decayed-gradient copy, of every parameter at once), so the
    # emulated cluster's CPU step holds what a GPU's does (predictor.runtimes)
    if cfg.optimizer is Optimizer.SGD:
        return torch.optim.SGD(groups, lr=cfg.lr, momentum=0.9, fused=True)
    if cfg.optimizer is Optimizer.ADAM:  # L2 decay, as torch.optim.Adam applies it
        return torch.optim.Adam(groups, lr=cfg.lr, fused=True)
    return torch.optim.AdamW(groups, lr=cfg.lr, fused=True)


def _optimizer(cfg: RunConfig, params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    """The unsharded optimizer over every parameter (ZeRO-0)."""
    return _make_optimizer(cfg, [{"params": [p for p in params if _decays(p)], "decay": True},
                                 {"params": [p for p in params if not _decays(p)],
                                  "decay": False}])


def build_optimizer(cfg: RunConfig, params: list[torch.nn.Parameter], layout: Layout,
                    blocks: Sequence[torch.nn.Module] = ()
                    ) -> torch.optim.Optimizer | ZeroOptimizer:
    """The optimizer the plan asks for: ZeRO-``cfg.zero_stage`` over the dp group
    (``orchestrator.trainer.zero``; at dp = 1 there is nothing to shard), else unsharded.
    ``blocks``: the modules whose parameters ZeRO-3 shards (the model's layers); after
    loading the weights, ``ZeroOptimizer.shard_blocks`` frees their full tensors."""
    check_zero_stage(cfg.zero_stage)
    if cfg.zero_stage and layout.dp > 1:
        return ZeroOptimizer(params, layout, cfg.zero_stage, partial(_make_optimizer, cfg),
                             _decays, blocks)
    return _optimizer(cfg, params)


def init_distributed(cfg: RunConfig, rank: int, device: torch.device) -> None:
    """Join the job's process group (gloo on CPU, NCCL on GPU; ``FRENZY_DIST_BACKEND=gloo``
    lets several ranks share one GPU, which NCCL refuses, for measuring a rank's memory)."""
    if cfg.world_size == 1 or dist.is_initialized():
        return
    backend = os.environ.get(DIST_BACKEND_ENV) or ("nccl" if device.type == "cuda" else "gloo")
    dist.init_process_group(backend, init_method=f"tcp://{cfg.master_addr}:{cfg.master_port}",
                            rank=rank, world_size=cfg.world_size,
                            timeout=timedelta(seconds=cfg.dist_timeout_s))


def pick_device() -> torch.device:
    return torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")


def train(cfg: RunConfig, rank: int, control: Control | None = None) -> RunResult:
    """Train ``cfg.model`` as rank ``rank`` of ``cfg.world_size`` until ``total_steps`` or a
    stop request; resume from the newest checkpoint in ``cfg.checkpoint_dir``."""
    control = control or Control()
    if cfg.pp < 1:
        raise ValueError(f"pp={cfg.pp}: at least one pipeline stage")
    if cfg.model is None:
        raise ValueError("RunConfig.model is required by the built-in trainer")
    check_supported(cfg.model, cfg.tp, cfg.pp)  # before the rendezvous: no rank waits
    check_zero_stage(cfg.zero_stage)
    if cfg.global_batch % (cfg.dp * cfg.micro_batch):
        raise ValueError(f"dp·micro_batch = {cfg.dp * cfg.micro_batch} does not divide "
                         f"global_batch={cfg.global_batch}")
    device = pick_device()
    t_run = time.perf_counter()
    init_distributed(cfg, rank, device)
    rendezvous_s = time.perf_counter() - t_run
    layout = build_layout(rank, cfg.world_size, cfg.tp, cfg.dp, cfg.pp)
    torch.manual_seed(cfg.seed)
    numerics = resolve_numerics(cfg)
    model = ParallelTransformer(cfg.model, layout, cfg.recompute, numerics).to(device)
    init_canonical(model, layout, cfg.seed)
    params = list(model.parameters())
    opt = build_optimizer(cfg, params, layout, model.layers)
    saved: dict[str, Any] = {}
    step = ckpt.load(cfg.checkpoint_dir, cfg.job_id, model, opt, layout, extra_out=saved)
    if step == 0 and cfg.init_from:
        init_from_folder(cfg, model, layout)
    if isinstance(opt, ZeroOptimizer):
        opt.shard_blocks(model)  # ZeRO-3: from here on the layers' weights live as chunks
    data = None
    if not cfg.data.synthetic:
        data = TokenData(cfg.data, cache_dir=ckpt.job_dir(cfg.checkpoint_dir, cfg.job_id))
        if saved.get("data_fingerprint") not in (None, data.fingerprint):
            log.warning("job %s: the data changed since the checkpoint (fingerprint %s, now "
                        "%s); resuming at the saved sample position", cfg.job_id,
                        saved["data_fingerprint"], data.fingerprint)
    position = int(saved.get("data_position", step * cfg.global_batch))
    first = step
    last_ckpt = step
    losses: list[float] = []
    meter = PeakMeter(device, cfg.memory_cap_bytes)
    control.report(steps_done=step, checkpoint_step=last_ckpt, first_step=first, loss=None,
                   samples_per_s=None, rank=rank, tp=cfg.tp, dp=cfg.dp, pp=cfg.pp,
                   rendezvous_s=rendezvous_s)
    stopped = False
    model.train()
    try:
        while step < cfg.total_steps:
            t0 = time.perf_counter()
            if data is None:
                inputs, targets = synthetic_batch(cfg, step, layout.dp_rank, device)
            else:
                inputs, targets = data_batch(cfg, data, step, position, layout.dp_rank, device)
            lr = lr_at(cfg, step)
            for g in opt.param_groups:
                g["lr"] = lr
            with meter.step(partial(live_tensors, model, opt, inputs, targets)):
                mean_loss, stop_now, grad_norm = _step(cfg, model, params, opt, layout,
                                                       inputs, targets,
                                                       control.stop.is_set(), step)
            step += 1
            position += cfg.global_batch
            losses.append(mean_loss)
            if step == cfg.total_steps or stop_now or step % cfg.checkpoint_every == 0:
                ckpt.save(cfg.checkpoint_dir, cfg.job_id, step, model, opt, layout,
                          extra=checkpoint_extra(cfg, numerics, position, data))
                last_ckpt = step
            dt = time.perf_counter() - t0
            peak = meter.peak()
            # the launch's set-up and first step, for the cold-start figures
            setup = {"setup_s": time.perf_counter() - t_run} if step == first + 1 else {}
            control.report(**(peak.as_status() if peak else {}), **setup,
                           steps_done=step, checkpoint_step=last_ckpt, loss=mean_loss,
                           samples_per_s=cfg.global_batch / dt if dt > 0 else math.inf,
                           lr=lr, grad_norm=grad_norm,
                           recent_losses=numbered_losses(losses, step, last=64))
            if stop_now:
                stopped = True
                break
    except torch.OutOfMemoryError as e:
        raise rank_oom(e, device) from e
    if dist.is_initialized():
        dist.destroy_process_group()
    peak = meter.peak()
    return RunResult(steps_done=step, checkpoint_step=last_ckpt,
                     finished=step >= cfg.total_steps, stopped=stopped, first_step=first,
                     losses=tuple(losses),
                     peak_tensors_bytes=peak.tensors_bytes if peak else None,
                     peak_reserved_bytes=peak.reserved_bytes if peak else None)


def average_grads(opt: torch.optim.Optimizer | ZeroOptimizer,
                  params: list[torch.nn.Parameter], layout: Layout, scale: float) -> None:
    """After the micro-batches' backward: average the gradients over the dp group and undo
    the loss ``scale`` — under ZeRO this rank's chunks (``ZeroOptimizer.reduce_grads``),
    else every gradient in one flat all-reduce."""
    if isinstance(opt, ZeroOptimizer):
        opt.reduce_grads(scale)
        return
    allreduce_grads(params, layout)
    if scale != 1.0:
        for p in params:
            if p.grad is not None:
                p.grad.div_(scale)


def _step(cfg: RunConfig, model: ParallelTransformer, params: list[torch.nn.Parameter],
          opt: torch.optim.Optimizer | ZeroOptimizer, layout: Layout, inputs: torch.Tensor,
          targets: torch.Tensor, stop: bool, step: int) -> tuple[float, bool, float | None]:
    """One optimizer step over this rank's rows (micro-batches, the dp all-reduce, the
    world's agreement on loss / stop / overflow, clipping, the update) of ``model`` and its
    ``params``; returns the mean loss, whether any rank asked to stop, and the gradient norm
    when clipped."""
    device = inputs.device
    micro = cfg.global_batch // (cfg.dp * cfg.micro_batch)
    scale = FP16_LOSS_SCALE if cfg.precision is Precision.FP16 else 1.0
    if layout.pp > 1:
        total = pipeline_backward(cfg, model, layout, inputs, targets, micro, scale)
    else:
        total = torch.zeros((), device=device)
        for mb in range(micro):
            x = inputs[mb * cfg.micro_batch:(mb + 1) * cfg.micro_batch]
            y = targets[mb * cfg.micro_batch:(mb + 1) * cfg.micro_batch]
            with _autocast(cfg.precision, device):
                logits = model(x)
            loss = model.loss(logits, y) / micro
            (loss * scale).backward()
            total += loss.detach()
            del logits, loss  # else the last logits live through the all-reduce and the update
    average_grads(opt, params, layout, scale)
    sync_tied_grads(model, opt, layout)
    nonfinite = float(opt.nonfinite() if isinstance(opt, ZeroOptimizer) else any(
        p.grad is not None and not torch.isfinite(p.grad).all() for p in params))
    flags = torch.tensor([float(total), float(stop), nonfinite], device=device)
    if dist.is_initialized():
        dist.all_reduce(flags)
    grad_norm = None
    if flags[2] == 0:
        if cfg.grad_clip > 0:
            if isinstance(opt, ZeroOptimizer):
                skip = tied_copy_params(model)
                names = {p: n for n, p in model.named_parameters() if p not in skip}
                grad_norm = opt.clip(names, set(shard_dims(model)), cfg.grad_clip)
            else:
                grad_norm = clip_grads(model, layout, cfg.grad_clip)
        opt.step()
    else:
        log.warning("job %s step %d: non-finite gradients, step skipped", cfg.job_id, step)
    opt.zero_grad(set_to_none=True)
    # only the last stage's tp·dp ranks add a loss (each tp rank the same one)
    return float(flags[0]) / (layout.tp * layout.dp), bool(flags[1] > 0), grad_norm


def pipeline_backward(cfg: RunConfig, model: ParallelTransformer, layout: Layout,
                      inputs: torch.Tensor, targets: torch.Tensor, micro: int,
                      scale: float, p2p_type: type[P2P] = P2P) -> torch.Tensor:
    """This stage's forwards and backwards of the step's ``micro`` micro-batches under 1F1B
    (``orchestrator.trainer.pipeline``); returns the loss sum (last stage; 0 elsewhere).
    ``p2p_type``: the exchange with the neighbouring stages (the memory measurement's
    fakes it in one process)."""
    assert cfg.model is not None
    device = inputs.device
    b = cfg.micro_batch
    p2p = p2p_type(layout, (b, inputs.shape[1], cfg.model.hidden_size), device)

    def forward(i: int, x: torch.Tensor | None) -> tuple[torch.Tensor, Any]:
        with _autocast(cfg.precision, device):
            out = model(inputs[i * b:(i + 1) * b] if x is None else x)
        if not layout.last_stage:
            return out, None
        # the logits held to the end of the backward, as the one-stage loop holds them
        return model.loss(out, targets[i * b:(i + 1) * b]) / micro, out

    return one_f_one_b(layout, micro, forward, p2p, scale)


TRAINER_OPTIONS = ("lr", "lr_schedule", "warmup_steps", "min_lr_ratio", "weight_decay",
                   "grad_clip", "seed", "init_from")


def apply_options(cfg: RunConfig, options: dict[str, Any] | None) -> RunConfig:
    """``cfg`` with a job's trainer options (JSON: ``TRAINER_OPTIONS`` and ``data``, as
    ``service.api.job_inputs.trainer_options`` makes them); absent keys keep ``cfg``'s."""
    if not options:
        return cfg
    changes: dict[str, Any] = {k: options[k] for k in TRAINER_OPTIONS
                               if options.get(k) is not None}
    if options.get("data"):
        changes["data"] = DataConfig(**options["data"])
    return replace(cfg, **changes)


def resolve_numerics(cfg: RunConfig) -> Numerics:
    """The layer constants: ``cfg.numerics``, else ``init_from``'s config.json, else the
    defaults."""
    if cfg.numerics is not None:
        return cfg.numerics
    if cfg.init_from:
        from orchestrator.trainer.hf import numerics_from_config, read_config

        assert cfg.model is not None
        return numerics_from_config(read_config(cfg.init_from), cfg.model)
    return Numerics()


def init_from_folder(cfg: RunConfig, model: ParallelTransformer, layout: Layout) -> None:
    """Overwrite the fresh model with ``cfg.init_from``'s weights (this rank's shards)."""
    from orchestrator.trainer.hf import check_matches, load_folder

    assert cfg.init_from and cfg.model is not None
    full = load_folder(cfg.init_from, cfg.model)
    check_matches(full, full_shapes(model, layout.tp), f"init_from {cfg.init_from}")
    ckpt.copy_full_params(model, full, layout)
    log.info("job %s: initialised from %s", cfg.job_id, cfg.init_from)


def checkpoint_extra(cfg: RunConfig, numerics: Numerics, position: int,
                     data: TokenData | None) -> dict[str, Any]:
    """What a checkpoint records beside the tensors: the sample position (exact resume) and
    what export needs (the model, its numerics, the tokenizer)."""
    assert cfg.model is not None
    tokenizer = cfg.data.tokenizer
    if tokenizer is None and cfg.init_from and (Path(cfg.init_from) / "tokenizer.json").is_file():
        tokenizer = cfg.init_from
    return {"data_position": position,
            "data_fingerprint": data.fingerprint if data is not None else None,
            "model_spec": json.loads(json.dumps(asdict(cfg.model), default=str)),
            "numerics": asdict(numerics), "tokenizer": tokenizer,
            "init_from": cfg.init_from}


def full_state(cfg: RunConfig) -> dict[str, torch.Tensor]:
    """The newest checkpoint's unsharded parameters (for tests and inspection)."""
    step = ckpt.latest_step(cfg.checkpoint_dir, cfg.job_id)
    path = ckpt.job_dir(cfg.checkpoint_dir, cfg.job_id) / f"step-{step:08d}.pt"
    return torch.load(path, map_location="cpu", weights_only=True)["model"]

