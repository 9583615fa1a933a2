"""The training worker: one per GPU of an allocation, run as a threaded Ray actor.

The RayBackend creates it inside the job's placement group (``num_cpus=0, num_gpus=1``,
``max_concurrency=2``): ``run`` occupies one thread for the whole launch (built-in trainer or
the user's entrypoint), while ``status`` / ``request_stop`` / ``where`` answer on the other.
The class itself does not import Ray at module level, so it can be unit-tested directly.
"""

from __future__ import annotations

import os
import socket
from typing import Any

from orchestrator.trainer.loop import Control, RunConfig, RunResult


class TrainingWorker:
    """Rank ``rank`` of a job: reports where it runs, trains, reports progress, stops."""

    def __init__(self, rank: int, torch_threads: int = 1) -> None:
        import torch

        torch.set_num_threads(torch_threads)
        self.rank = rank
        self.control = Control()
        self._proc: Any = None

    def where(self) -> dict[str, Any]:
        """Facts from inside the actor: Ray node id, node labels, GPU ids, host, pid."""
        import ray

        ctx = ray.get_runtime_context()
        node_id = ctx.get_node_id()
        labels: dict[str, str] = {}
        for n in ray.nodes():
            if n.get("NodeID") == node_id:
                labels = dict(n.get("Labels") or {})
        return {"rank": self.rank, "ray_node_id": node_id, "labels": labels,
                "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
                "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
                "host": socket.gethostname(), "pid": os.getpid()}

    def address(self) -> tuple[str, int]:
        """(IP, free port) for the job's rendezvous; asked of rank 0 only."""
        import ray

        from orchestrator.trainer.local import free_port

        return ray.util.get_node_ip_address(), free_port()

    def run(self, cfg: RunConfig) -> RunResult:
        """Run this rank to the end of the job or to a stop request."""
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
