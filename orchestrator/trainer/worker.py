"""The training worker: one per GPU of an allocation, run as a threaded Ray actor.

The RayBackend creates it either inside the job's placement group (``num_cpus=0,
num_gpus=1``: Ray picks its GPU and sets ``CUDA_VISIBLE_DEVICES``) or, with the warm pool
(``orchestrator.warm_pool``), once per GPU slot of a node and reuses it across jobs
(``num_gpus=0``, pinned to its node; it is told its slot and selects that GPU itself, before
CUDA is ever initialised, and keeps it for life; ``warm_up`` then trains a tiny model for one
step so that a job's first step pays none of a fresh process's lazy loading). Either way
``max_concurrency=2``: ``run`` occupies one thread for the whole launch (built-in trainer or
the user's entrypoint), while ``status`` / ``request_stop`` / ``where`` answer on the other.

A reused worker starts every job from the state it had when it was created: ``assign``
tears down a leftover process group, restores the environment variables and working
directory captured at start-up, the torch thread count and default dtype, and gives the job a
fresh ``Control``. The class itself does not import Ray at module level, so it can be
unit-tested directly.
"""

from __future__ import annotations

import gc
import os
import socket
import threading
from typing import Any

from orchestrator.trainer.loop import Control, RunConfig, RunResult

ASSIGN_WAIT_S = 600.0
"""How long ``assign`` waits for the worker to finish what it is doing (its warm-up, seconds
on a loaded machine); the backend's launch timeout gives up on the launch sooner."""


def slot_device(slot: int, inherited: str | None) -> str:
    """The ``CUDA_VISIBLE_DEVICES`` value of GPU slot ``slot`` of a node whose Ray worker
    processes inherit ``inherited`` (the raylet's own list, when it was started with one):
    Ray numbers a node's GPUs the same way (the n-th id of that list, else ``n``)."""
    ids = [d.strip() for d in inherited.split(",") if d.strip()] if inherited else []
    if ids:
        if slot >= len(ids):
            raise ValueError(f"GPU slot {slot} but the node lists {len(ids)} devices: {inherited}")
        return ids[slot]
    return str(slot)


class TrainingWorker:
    """Rank ``rank`` of a job: reports where it runs, trains, reports progress, stops."""

    def __init__(self, rank: int, torch_threads: int = 1, slot: int | None = None) -> None:
        import torch
        import torch.distributed  # imported here, not in the job's time

        self.device: str | None = None
        if slot is not None:  # before anything initialises CUDA: this process's GPU for life
            self.device = slot_device(slot, os.environ.get("CUDA_VISIBLE_DEVICES"))
            os.environ["CUDA_VISIBLE_DEVICES"] = self.device
        self.torch_threads = torch_threads
        torch.set_num_threads(torch_threads)
        self.rank = rank
        self.control = Control()
        self.jobs_run = 0
        self._proc: Any = None
        self._busy = threading.Lock()
        self._env = dict(os.environ)
        self._labels: dict[str, str] | None = None
        self._cwd = os.getcwd()

    def where(self) -> dict[str, Any]:
        """Facts from inside the actor: Ray node id, node labels, GPU ids, host, pid."""
        import ray

        ctx = ray.get_runtime_context()
        node_id = ctx.get_node_id()
        labels = self._labels
        if labels is None:  # a node's labels are set when it starts: read them once
            labels = next((dict(n.get("Labels") or {}) for n in ray.nodes()
                           if n.get("NodeID") == node_id), {})
            self._labels = labels  # one assignment: a concurrent call sees None or all
        labels = dict(labels)
        gpu_ids = [self.device] if self.device is not None else [str(g) for g in ray.get_gpu_ids()]
        return {"rank": self.rank, "ray_node_id": node_id, "labels": labels,
                "gpu_ids": gpu_ids,
                "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
                "host": socket.gethostname(), "pid": os.getpid(), "jobs_run": self.jobs_run}

    def ping(self) -> int:
        """The process id, once the worker is up (torch imported)."""
        return os.getpid()

    def warm_up(self) -> int:
        """Train a tiny model for one step in a scratch folder, so that what the first step
        of a process loads lazily (``torch._dynamo`` under the optimizers, autograd's engine,
        the memory tracker) is loaded before a job's first step; the process id."""
        import tempfile

        from orchestrator.trainer.loop import train
        from predictor.spec import Family, ModelSpec

        tiny = ModelSpec("warm-up", Family.GPT2, num_layers=1, hidden_size=16, num_heads=2,
                         vocab_size=32, max_seq_len=8)
        with self._busy, tempfile.TemporaryDirectory(prefix="frenzy-warm-") as scratch:
            train(RunConfig(job_id="warm-up", model=tiny, global_batch=2, seq_len=8,
                            total_steps=1, checkpoint_dir=scratch), 0, Control())
            self.reset()
            gc.freeze()  # what is loaded now stays: the collection in ``reset`` skips it
        return os.getpid()

    def assign(self, rank: int) -> dict[str, Any]:
        """Make this worker rank ``rank`` of a new job, in a clean state; ``where()``. Waits
        for a ``warm_up`` in progress (the pool hands out workers still warming up)."""
        if not self._busy.acquire(timeout=ASSIGN_WAIT_S):
            raise RuntimeError(f"worker still busy after {ASSIGN_WAIT_S:.0f} s")
        try:
            self.reset()
        finally:
            self._busy.release()
        self.rank = rank
        return self.where()

    def reset(self) -> None:
        """Back to the state of a fresh worker: no process group, the start-up environment
        and working directory, the start-up torch settings, a new ``Control``."""
        import torch
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
        if dict(os.environ) != self._env:
            os.environ.clear()
            os.environ.update(self._env)
        if os.getcwd() != self._cwd:
            os.chdir(self._cwd)
        torch.set_num_threads(self.torch_threads)
        torch.set_default_dtype(torch.float32)
        self.control = Control()
        self._proc = None
        gc.collect()  # the previous job's model and optimizer, should a cycle hold them
        if torch.cuda.is_initialized():
            torch.cuda.empty_cache()

    def address(self) -> tuple[str, int]:
        """(IP, free port) for the job's rendezvous; asked of rank 0 only."""
        import ray

        from orchestrator.trainer.local import free_port

        return ray.util.get_node_ip_address(), free_port()

    def run(self, cfg: RunConfig) -> RunResult:
        """Run this rank to the end of the job or to a stop request."""
        with self._busy:
            self.jobs_run += 1
            if cfg.entrypoint:
                from dataclasses import replace

                from orchestrator.trainer.entrypoint import run_entrypoint

                if cfg.working_dir:  # Ray unpacked the job's runtime_env working_dir here
                    cfg = replace(cfg, working_dir=os.getcwd())
                return run_entrypoint(cfg, self.rank, self.control)
            from orchestrator.trainer.rank_log import train_logged

            return train_logged(cfg, self.rank, self.control)

    def status(self) -> dict[str, Any]:
        """The latest progress (steps_done, checkpoint_step, loss, samples_per_s)."""
        return dict(self.control.status)

    def request_stop(self) -> None:
        """Checkpoint at the end of the current step and return from ``run``."""
        self.control.stop.set()
