"""The runtime's driver for the Ray backend: the emulated (or a real) Ray cluster.

``ray_driver_factory`` connects to ``RAY_ADDRESS`` when it is set (production: a Ray head
whose GPU nodes carry the ``frenzy.io/*`` labels) and otherwise starts the emulated
heterogeneous cluster described by the cluster file (``orchestrator.emulated``). The nodes
the service schedules on are then read from Ray, not from the file. Training runs for real in
Ray actors (``orchestrator.trainer``), the built-in trainer's on the backend's warm worker
pool (``orchestrator.warm_pool``; ``FRENZY_WARM_POOL=0`` turns it off); checkpoints go under
``$FRENZY_CHECKPOINT_DIR`` (default: ``checkpoints`` in the per-user state directory,
``service.settings.state_dir``), which every node must see.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING

from orchestrator.backend import WallClock
from orchestrator.emulated import RayCluster, connect
from orchestrator.ray_backend import RayBackend, RayBackendConfig
from orchestrator.trainer.checkpoint import latest_step
from predictor.runtimes import FRENZY
from service.settings import default_checkpoint_dir

if TYPE_CHECKING:
    from orchestrator.clusters import ClusterSpec

log = logging.getLogger(__name__)


class RayDriver:
    """``RayBackend`` on a connected cluster (the loop polls it and reads its inventory)."""

    max_pipeline = FRENZY.max_pp  # the built-in trainer's deepest pipeline (0: any)

    def __init__(self, spec: ClusterSpec, checkpoint_dir: str, checkpoint_every: int,
                 warm_pool: bool = True) -> None:
        self.clock = WallClock()
        self.ray_cluster: RayCluster = connect(spec.path)
        # an emulated cluster's workers are CPU processes standing in for GPUs
        self.measures_step_times = not self.ray_cluster.emulated
        try:
            self.backend = RayBackend(
                RayBackendConfig(checkpoint_dir=checkpoint_dir, checkpoint_every=checkpoint_every,
                                 inter_node_bw_gbs=spec.state.inter_node_bw_gbs,
                                 warm_pool=warm_pool),
                self.clock,
            )
        except Exception:
            self.ray_cluster.shutdown()
            raise

    def resume_step(self, job_id: str, steps_done: float, *, entrypoint: bool) -> float:
        """The built-in trainer resumes from its newest checkpoint, whatever progress was
        recorded after it; an entrypoint keeps its own checkpoints, unknown here, and is told
        the progress recorded (``FRENZY_RESUME_STEP``)."""
        if entrypoint:
            return steps_done
        return float(latest_step(self.backend.config.checkpoint_dir, job_id))

    def close(self) -> None:
        try:
            self.backend.shutdown()
        finally:
            self.ray_cluster.shutdown()


def ray_driver_factory(spec: ClusterSpec) -> RayDriver:
    """The Ray driver with checkpoints under ``$FRENZY_CHECKPOINT_DIR``, and the warm worker
    pool unless ``FRENZY_WARM_POOL=0``."""
    ckpt = os.path.abspath(os.environ.get("FRENZY_CHECKPOINT_DIR")
                           or default_checkpoint_dir())
    os.makedirs(ckpt, exist_ok=True)
    every = int(os.environ.get("FRENZY_CHECKPOINT_EVERY", "20"))
    warm = os.environ.get("FRENZY_WARM_POOL", "1").strip().lower() not in ("0", "false", "no",
                                                                          "off")
    log.info("starting the Ray backend (checkpoints in %s every %d steps; warm pool %s)",
             ckpt, every, "on" if warm else "off")
    return RayDriver(spec, ckpt, every, warm)
