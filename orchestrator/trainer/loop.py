"""The built-in training loop: one rank of a tp × dp job, with checkpoints and progress.

``train`` runs inside a Ray worker actor (``orchestrator.trainer.worker``) or, in unit tests,
inside a plain ``torch.multiprocessing`` process: it only needs ``RunConfig`` and a
``Control`` (stop flag + progress callback). Every step ends with one small all-reduce over
the world that carries the loss, "stop requested" and "non-finite gradients", so all ranks
agree on when to stop (checkpoint first) and on skipping an fp16 overflow step.

Data is synthetic but learnable: sequences of an affine recurrence ``t[i+1] = (a·t[i] + b)
mod V`` from random starts, so the loss falls within a few steps. The global batch of step s
is drawn from a generator seeded by (seed, s) and sliced by dp rank, so it is the same for any
dp — which, with the canonical initialisation, makes tp/dp layouts numerically equivalent.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from orchestrator.trainer import checkpoint as ckpt
from orchestrator.trainer.model import ParallelTransformer, init_canonical
from orchestrator.trainer.parallel import allreduce_grads, build_layout
from predictor.spec import Family, ModelSpec, Optimizer, Precision, Recompute

log = logging.getLogger(__name__)

FP16_LOSS_SCALE = 1024.0


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
    precision: Precision = Precision.FP32
    optimizer: Optimizer = Optimizer.ADAMW
    lr: float = 3e-3
    seed: int = 0
    checkpoint_dir: str = "checkpoints"
    checkpoint_every: int = 50
    master_addr: str = "127.0.0.1"
    master_port: int = 29500
    entrypoint: tuple[str, ...] | None = None
    env: dict[str, str] = field(default_factory=dict)
    dist_timeout_s: float = 120.0

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


def numbered_losses(losses: Sequence[float], last_step: int,
                    last: int | None = None) -> tuple[tuple[int, float], ...]:
    """``(step, loss)`` pairs of ``losses``, the losses of the steps up to ``last_step`` (the
    final one is that step's); only the ``last`` ones when given."""
    tail = losses[-last:] if last is not None else losses
    return tuple(zip(range(last_step - len(tail) + 1, last_step + 1), tail, strict=True))


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
    seq, mask = seq[rows], mask[rows]
    if cfg.model.family is Family.BERT:  # masked LM: predict the 15% masked tokens
        inputs = seq[:, :-1].clone()
        targets = torch.where(mask, inputs, torch.full_like(inputs, -100))
        inputs[mask] = 0
    else:
        inputs, targets = seq[:, :-1], seq[:, 1:]
    return inputs.to(device), targets.to(device)


def _autocast(precision: Precision, device: torch.device) -> Any:
    if precision is Precision.FP32:
        return torch.autocast(device.type, enabled=False)
    dtype = torch.bfloat16 if precision is Precision.BF16 else torch.float16
    return torch.autocast(device.type, dtype=dtype)


def _optimizer(cfg: RunConfig, params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    if cfg.optimizer is Optimizer.SGD:
        return torch.optim.SGD(params, lr=cfg.lr, momentum=0.9)
    if cfg.optimizer is Optimizer.ADAM:
        return torch.optim.Adam(params, lr=cfg.lr)
    return torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.01)


def init_distributed(cfg: RunConfig, rank: int, device: torch.device) -> None:
    """Join the job's process group (gloo on CPU, NCCL on GPU)."""
    if cfg.world_size == 1 or dist.is_initialized():
        return
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, init_method=f"tcp://{cfg.master_addr}:{cfg.master_port}",
                            rank=rank, world_size=cfg.world_size,
                            timeout=timedelta(seconds=cfg.dist_timeout_s))


def pick_device() -> torch.device:
    return torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")


def train(cfg: RunConfig, rank: int, control: Control | None = None) -> RunResult:
    """Train ``cfg.model`` as rank ``rank`` of ``cfg.world_size`` until ``total_steps`` or a
    stop request; resume from the newest checkpoint in ``cfg.checkpoint_dir``."""
    control = control or Control()
    if cfg.pp != 1:
        raise ValueError(f"pipeline parallelism (pp={cfg.pp}) is not supported by the built-in "
                         "trainer; plan with pp=1")
    if cfg.model is None:
        raise ValueError("RunConfig.model is required by the built-in trainer")
    if cfg.global_batch % (cfg.dp * cfg.micro_batch):
        raise ValueError(f"dp·micro_batch = {cfg.dp * cfg.micro_batch} does not divide "
                         f"global_batch={cfg.global_batch}")
    device = pick_device()
    init_distributed(cfg, rank, device)
    layout = build_layout(rank, cfg.world_size, cfg.tp, cfg.dp)
    torch.manual_seed(cfg.seed)
    model = ParallelTransformer(cfg.model, layout, cfg.recompute).to(device)
    init_canonical(model, layout, cfg.seed)
    params = list(model.parameters())
    opt = _optimizer(cfg, params)
    step = ckpt.load(cfg.checkpoint_dir, cfg.job_id, model, opt, layout)
    first = step
    micro = cfg.global_batch // (cfg.dp * cfg.micro_batch)
    scale = FP16_LOSS_SCALE if cfg.precision is Precision.FP16 else 1.0
    last_ckpt = step
    losses: list[float] = []
    control.report(steps_done=step, checkpoint_step=last_ckpt, first_step=first, loss=None,
                   samples_per_s=None, rank=rank, tp=cfg.tp, dp=cfg.dp)
    stopped = False
    model.train()
    while step < cfg.total_steps:
        t0 = time.perf_counter()
        inputs, targets = synthetic_batch(cfg, step, layout.dp_rank, device)
        total = torch.zeros((), device=device)
        for mb in range(micro):
            x = inputs[mb * cfg.micro_batch:(mb + 1) * cfg.micro_batch]
            y = targets[mb * cfg.micro_batch:(mb + 1) * cfg.micro_batch]
            with _autocast(cfg.precision, device):
                logits = model(x)
            loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1),
                                   ignore_index=-100) / micro
            (loss * scale).backward()
            total += loss.detach()
        allreduce_grads(params, layout)
        if scale != 1.0:
            for p in params:
                if p.grad is not None:
                    p.grad.div_(scale)
        nonfinite = float(any(p.grad is not None and not torch.isfinite(p.grad).all()
                              for p in params))
        flags = torch.tensor([float(total), float(control.stop.is_set()), nonfinite],
                             device=device)
        if dist.is_initialized():
            dist.all_reduce(flags)
        mean_loss = float(flags[0]) / cfg.world_size
        if flags[2] == 0:
            opt.step()
        else:
            log.warning("job %s step %d: non-finite gradients, step skipped", cfg.job_id, step)
        opt.zero_grad(set_to_none=True)
        step += 1
        stop_now = bool(flags[1] > 0)
        losses.append(mean_loss)
        if step == cfg.total_steps or stop_now or step % cfg.checkpoint_every == 0:
            ckpt.save(cfg.checkpoint_dir, cfg.job_id, step, model, opt, layout)
            last_ckpt = step
        dt = time.perf_counter() - t0
        control.report(steps_done=step, checkpoint_step=last_ckpt, loss=mean_loss,
                       samples_per_s=cfg.global_batch / dt if dt > 0 else math.inf,
                       recent_losses=numbered_losses(losses, step, last=64))
        if stop_now:
            stopped = True
            break
    if dist.is_initialized():
        dist.destroy_process_group()
    return RunResult(steps_done=step, checkpoint_step=last_ckpt,
                     finished=step >= cfg.total_steps, stopped=stopped, first_step=first,
                     losses=tuple(losses))


def full_state(cfg: RunConfig) -> dict[str, torch.Tensor]:
    """The newest checkpoint's unsharded parameters (for tests and inspection)."""
    step = ckpt.latest_step(cfg.checkpoint_dir, cfg.job_id)
    path = ckpt.job_dir(cfg.checkpoint_dir, cfg.job_id) / f"step-{step:08d}.pt"
    return torch.load(path, map_location="cpu", weights_only=True)["model"]

