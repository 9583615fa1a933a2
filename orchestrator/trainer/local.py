"""Run the built-in trainer as a local multi-process job (no Ray): tests and quick checks.

``run_local`` spawns ``cfg.world_size`` processes that rendezvous over TCP on localhost with
gloo, exactly as the Ray worker actors do, and returns every rank's ``RunResult``.
"""

from __future__ import annotations

import multiprocessing as mp
import queue as queue_mod
import socket
import time
from dataclasses import replace
from typing import Any

from orchestrator.trainer.loop import RunConfig, RunResult, train


def free_port() -> int:
    """A TCP port free on this host right now (the rendezvous port of rank 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def _entry(cfg: RunConfig, rank: int, queue: Any, fn: Any) -> None:
    import torch

    torch.set_num_threads(1)
    try:
        queue.put((rank, fn(cfg, rank), None))
    except BaseException as e:  # report, never hang the parent
        queue.put((rank, None, f"{type(e).__name__}: {e}"))


def run_local(cfg: RunConfig, fn: Any = train, timeout_s: float = 120.0) -> list[Any]:
    """Run ``fn(cfg, rank)`` (default: ``train``) on ``cfg.world_size`` local processes;
    results by rank. ``fn`` must be importable (a module-level function)."""
    if cfg.world_size == 1:
        return [fn(cfg, 0)]
    cfg = replace(cfg, master_addr="127.0.0.1", master_port=free_port())
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_entry, args=(cfg, r, queue, fn), daemon=True)
             for r in range(cfg.world_size)]
    for p in procs:
        p.start()
    out: dict[int, Any] = {}
    errors: list[str] = []
    try:
        deadline = time.monotonic() + timeout_s
        while len(out) < len(procs):
            try:
                rank, result, err = queue.get(timeout=0.5)
            except queue_mod.Empty:
                dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
                if dead and queue.empty():
                    raise RuntimeError(f"a rank exited with code {dead[0]} before "
                                       "reporting") from None
                if time.monotonic() > deadline:
                    raise TimeoutError(f"ranks did not finish in {timeout_s:.0f} s") from None
                continue
            if err:
                errors.append(f"rank {rank}: {err}")
            out[rank] = result
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    if errors:
        raise RuntimeError("; ".join(errors))
    return [out[r] for r in range(cfg.world_size)]


__all__ = ["RunResult", "free_port", "run_local"]
