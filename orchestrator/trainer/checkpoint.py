"""Checkpoints in canonical, unsharded form: resumable on any tp/dp/pp layout.

A checkpoint holds every parameter and optimizer-state tensor under its canonical name with its
full shape (tp shards gathered, ZeRO's dp chunks gathered: optimizer states, and under ZeRO-3
the layers' weights; pipeline stages' tensors collected on rank 0, layers under their global
index, a tied embedding once), plus the step — so it resumes at any tp, dp and pp. Saving
gathers ZeRO's optimizer-state chunks over each dp group, the tp shards inside data parallel
replica 0, and global rank 0 writes one file; loading reads that file on every rank and keeps
each rank's slice for the *new* layout. This is what an elastic resize needs (checkpoint at
tp=2·dp=1, resume at tp=1·dp=2) and what ``torch.distributed.checkpoint``'s sharded format
would need DTensor metadata for. Files are written to a temporary name and renamed, so a crash
mid-write never leaves a corrupt "latest". The directory must be shared by all nodes (a local
disk in the emulated cluster; NFS or a mounted bucket on a real one).

Layout: ``<root>/<job_id>/step-00000012.pt``; the newest ``keep`` files are kept.

Trust. The service reads only checkpoints it wrote: the job's folder is created ``0700`` by
the trainer's own uid (user entrypoints run under other uids, ``orchestrator.sandbox``, and
cannot enter it), and a file counts as a checkpoint only when its name is exactly
``step-<8 digits>.pt``, it is a regular file (not a symlink) and it belongs to the trainer's
uid, in a folder that is no symlink and belongs to it too. Anything else is ignored with a
warning. Pruning after a save at step s deletes only trusted files up to s older than the
kept ones: a newer file, trusted or not, never pushes the real checkpoints out.
"""

from __future__ import annotations

import logging
import os
import re
import stat
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from orchestrator.trainer.model import shard
from orchestrator.trainer.parallel import Layout, full_shapes, shard_dims, split_sizes
from orchestrator.trainer.zero import ZeroOptimizer

log = logging.getLogger(__name__)

FORMAT = "frenzy-ckpt-v1"
_NAME = re.compile(r"^step-(\d{8})\.pt$")
_CORE_KEYS = frozenset({"format", "step", "model", "optim", "tp", "dp", "pp"})


def job_dir(root: str | Path, job_id: str) -> Path:
    return Path(root) / job_id


def _own_dir(d: Path) -> bool:
    """``d`` is a real folder (no symlink) that belongs to this process's uid."""
    try:
        st = d.lstat()
    except FileNotFoundError:
        return False
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        log.warning("checkpoint folder %s is not one this trainer wrote (a symlink, or "
                    "owned by uid %d): ignored", d, st.st_uid)
        return False
    return True


def _trusted(d: Path) -> dict[int, Path]:
    """The checkpoints in ``d`` this trainer wrote, by step (see "Trust" above)."""
    found: dict[int, Path] = {}
    if not _own_dir(d):
        return found
    me = os.geteuid()
    for f in d.iterdir():
        m = _NAME.match(f.name)
        if not m:
            continue
        st = f.lstat()
        if stat.S_ISREG(st.st_mode) and st.st_uid == me:
            found[int(m.group(1))] = f
        else:
            log.warning("%s is not a checkpoint this trainer wrote: ignored", f)
    return found


def latest_step(root: str | Path, job_id: str) -> int:
    """Step of the newest complete checkpoint of ``job_id`` (0 when there is none)."""
    return max(_trusted(job_dir(root, job_id)), default=0)


def _gather(t: torch.Tensor, dim: int | None, layout: Layout, full: int = 0) -> torch.Tensor:
    """The unsharded tensor of ``t``'s tp shards along ``dim`` (``full`` rows there; 0: tp
    times ``t``'s). Uneven shards (a vocabulary tp does not divide) travel padded to the
    longest and are cut back, so no padding reaches the checkpoint."""
    if dim is None or layout.tp == 1:
        return t.detach().cpu().clone()
    sizes = split_sizes(full or t.shape[dim] * layout.tp, layout.tp)
    local = t.detach()
    if local.shape[dim] < sizes[0]:
        pad = list(local.shape)
        pad[dim] = sizes[0] - local.shape[dim]
        local = torch.cat([local, local.new_zeros(pad)], dim=dim)
    parts = [torch.empty_like(local) for _ in range(layout.tp)]
    dist.all_gather(parts, local.contiguous(), group=layout.tp_group)
    return torch.cat([p.narrow(dim, 0, n) for p, n in zip(parts, sizes, strict=True)],
                     dim=dim).cpu()


def _rows(shape: torch.Size, dim: int | None) -> int:
    return shape[dim] if dim is not None else 0


def _local_optim_state(optimizer: Any, p: nn.Parameter) -> dict[str, Any]:
    """``p``'s optimizer state at its tp-local shape: a ZeRO optimizer's chunks gathered over
    the dp group (a collective every rank joins), else the optimizer's own entry."""
    if isinstance(optimizer, ZeroOptimizer):
        return optimizer.full_state(p)
    return dict(optimizer.state.get(p, {}))


def save(root: str | Path, job_id: str, step: int, model: nn.Module,
         optimizer: torch.optim.Optimizer | ZeroOptimizer, layout: Layout, *, keep: int = 2,
         extra: dict[str, Any] | None = None) -> Path | None:
    """Collective over the world: gather ZeRO chunks over the dp group, tp shards in dp
    replica 0, every pipeline stage's tensors on rank 0 (the first stage's copy of a tied
    embedding kept), and write on rank 0. Returns the file written (on rank 0), else
    None."""
    path: Path | None = None
    full_model: dict[str, torch.Tensor] = {}
    full_optim: dict[str, dict[str, Any]] = {}
    zero = isinstance(optimizer, ZeroOptimizer)
    if layout.dp_rank == 0 or zero:
        dims = shard_dims(model)
        shapes = full_shapes(model, layout.tp)
        params = dict(model.named_parameters())
        # ZeRO: every dp rank joins each parameter's chunk gather (dp group) below; only dp
        # replica 0 joins the tp gathers, in the same parameter order on all its tp ranks.
        # ZeRO-3: each layer weight is first gathered from its dp chunks (every dp rank)
        for n, p in params.items():
            local = optimizer.full_param(p) if zero else p
            if layout.dp_rank == 0:
                full_model[n] = _gather(local, dims.get(n), layout,
                                        _rows(shapes[n], dims.get(n)))
            del local
        for n, p in params.items():
            state = _local_optim_state(optimizer, p)
            if layout.dp_rank != 0:
                continue  # joined the ZeRO gather only
            entry: dict[str, Any] = {}
            for k, v in sorted(state.items()):
                if isinstance(v, torch.Tensor) and v.shape == p.shape:
                    entry[k] = _gather(v, dims.get(n), layout, _rows(shapes[n], dims.get(n)))
                elif isinstance(v, torch.Tensor):
                    entry[k] = v.detach().cpu().clone()
                else:
                    entry[k] = v
            full_optim[n] = entry
    if layout.pp > 1:
        full_model, full_optim = _collect_stages(full_model, full_optim, layout)
    if layout.rank == 0:
        d = job_dir(root, job_id)
        d.mkdir(mode=0o700, parents=True, exist_ok=True)
        if not _own_dir(d):
            raise PermissionError(f"{d}: checkpoint folder not owned by this trainer")
        os.chmod(d, 0o700)
        path = d / f"step-{step:08d}.pt"
        tmp = d / f".tmp-{step:08d}-{os.getpid()}.pt"
        torch.save({"format": FORMAT, "step": step, "model": full_model,
                    "optim": full_optim, "tp": layout.tp, "dp": layout.dp,
                    "pp": layout.pp, **(extra or {})}, tmp)
        os.replace(tmp, path)
        _prune(d, keep, step)
        log.info("job %s: checkpoint at step %d -> %s", job_id, step, path)
    if dist.is_initialized():
        dist.barrier()  # nobody reports the step before the file exists
    return path


def _collect_stages(full_model: dict[str, torch.Tensor], full_optim: dict[str, dict[str, Any]],
                    layout: Layout) -> tuple[dict[str, torch.Tensor], dict[str, dict[str, Any]]]:
    """Every stage's gathered tensors on rank 0 (one sender per stage: its dp replica 0, tp
    rank 0), the first stage's first where two hold a name (a tied embedding's copy)."""
    sender = layout.dp_rank == 0 and layout.tp_rank == 0
    mine = (full_model, full_optim) if sender else None
    got: list[Any] = [None] * layout.world_size if layout.rank == 0 else []
    dist.gather_object(mine, got if layout.rank == 0 else None, dst=0)
    model: dict[str, torch.Tensor] = {}
    optim: dict[str, dict[str, Any]] = {}
    for part in got:  # ranks in order: stage 0's sender first
        if part is None:
            continue
        for n, t in part[0].items():
            model.setdefault(n, t)
        for n, e in part[1].items():
            optim.setdefault(n, e)
    return model, optim


def _prune(d: Path, keep: int, saved: int) -> None:
    """Keep the newest ``keep`` trusted checkpoints up to ``saved`` (just written); files
    the trainer did not write, and any newer than ``saved``, are never a reason to delete."""
    files = _trusted(d)
    older = sorted(s for s in files if s <= saved)
    for step in older[:-keep]:
        files[step].unlink(missing_ok=True)


def copy_full_params(model: nn.Module, full: dict[str, torch.Tensor], layout: Layout) -> None:
    """Copy full-shape tensors (canonical names) into this rank's shards of ``model``."""
    dims = shard_dims(model)
    with torch.no_grad():
        for n, p in model.named_parameters():
            t = full[n]
            if n in dims:
                t = shard(t, dims[n], layout)
            p.copy_(t.to(p.device, p.dtype))


def read(path: str | Path) -> dict[str, Any]:
    """A checkpoint file's contents (tensors on the CPU); ``ValueError`` if not one."""
    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(ckpt, dict) or ckpt.get("format") != FORMAT:
        raise ValueError(f"{path}: not a {FORMAT} checkpoint")
    return ckpt


def list_steps(root: str | Path, job_id: str) -> list[int]:
    """Steps of the complete checkpoints of ``job_id`` this trainer wrote, oldest first."""
    return sorted(_trusted(job_dir(root, job_id)))


def step_path(root: str | Path, job_id: str, step: int) -> Path:
    return job_dir(root, job_id) / f"step-{step:08d}.pt"


def load(root: str | Path, job_id: str, model: nn.Module,
         optimizer: torch.optim.Optimizer | ZeroOptimizer, layout: Layout, *,
         extra_out: dict[str, Any] | None = None) -> int:
    """Load the newest checkpoint into this rank's shard of ``model`` and ``optimizer``,
    resharded to ``layout``; returns its step (0 and nothing loaded when there is none).
    ``extra_out`` receives the entries saved with ``save(extra=...)``."""
    step = latest_step(root, job_id)
    if step == 0:
        return 0
    path = step_path(root, job_id, step)
    ckpt = read(path)
    if extra_out is not None:
        extra_out.update({k: v for k, v in ckpt.items() if k not in _CORE_KEYS})
    dims = shard_dims(model)
    params = dict(model.named_parameters())
    missing = sorted(set(params) - set(ckpt["model"]))
    if missing:
        raise ValueError(f"{path}: checkpoint lacks parameters {', '.join(missing[:5])}")

    def local(name: str, full: torch.Tensor) -> torch.Tensor:
        dim = dims.get(name)
        return shard(full, dim, layout) if dim is not None else full

    with torch.no_grad():
        for n, p in params.items():
            if isinstance(optimizer, ZeroOptimizer):  # ZeRO-3: a sharded layer's chunk
                optimizer.load_full_param(p, local(n, ckpt["model"][n]))
            else:
                p.copy_(local(n, ckpt["model"][n]).to(p.device, p.dtype))
    for n, p in params.items():
        entry = ckpt["optim"].get(n) or {}
        if not entry:
            continue
        full_p = ckpt["model"][n]
        # every state tensor on the parameter's device, the step count too: the fused
        # optimizers keep it there, and refuse a CPU one beside CUDA parameters
        state = {k: ((local(n, v) if v.shape == full_p.shape else v).to(p.device)
                     if isinstance(v, torch.Tensor) else v)
                 for k, v in entry.items()}
        if isinstance(optimizer, ZeroOptimizer):
            optimizer.load_full_state(p, state)  # this dp rank's chunk
        else:
            optimizer.state[p] = state
    log.info("job %s: resumed from step %d (saved at tp=%s dp=%s pp=%s; now tp=%d dp=%d "
             "pp=%d)", job_id, step, ckpt.get("tp"), ckpt.get("dp"), ckpt.get("pp", 1),
             layout.tp, layout.dp, layout.pp)
    return step
