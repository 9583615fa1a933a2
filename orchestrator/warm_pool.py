"""Warm training workers: one long-lived ``TrainingWorker`` actor per GPU slot of every node,
started ahead of the jobs (its process has Ray and torch imported and has trained a tiny model
for a step: ``TrainingWorker.warm_up``) and reused by them.

Why outside the placement groups. An actor scheduled into a placement group is bound to it
and dies when the group is removed, so an actor that outlives its job cannot live in the
job's group. The pool's actors hold no Ray resource (``num_cpus=0, num_gpus=0``) and are
pinned to their node by a hard ``NodeAffinitySchedulingStrategy``; the job's placement group
is still created, one ``{"GPU": 1}`` bundle per GPU on the chosen nodes, so Ray's GPU
accounting (``gpus_in_use``, other Ray users) is exactly what it is without the pool.

GPU identity. Slot ``k`` of a node is that node's ``k``-th GPU for the life of its worker
(the worker selects it before CUDA is initialised: a process cannot change device after).
The pool hands out slots, a distinct one per rank, from the node's free slots; the
controller's ``ClusterState`` stays the one source of truth for *how many* GPUs a node has
free, and the pool only says *which*: a launch takes as many slots as the allocation has
GPUs on the node and gives them back when the launch is torn down, before the controller
hears of it. Every Frenzy launch on a pooled backend selects its GPU by slot, entrypoint
launches included (their fresh actors get the slot's device, not Ray's choice), so slots and
the GPUs in use never disagree. (Ray's own GPU ids inside a group's bundles are then unused:
Frenzy assumes, as its inventory does, that it owns the nodes' GPUs.)

Reuse. A worker goes back to its slot's idle list only when its launch ended cleanly (every
rank returned: finished, or stopped for a resize/preemption with a checkpoint); the next job's
``assign`` call resets its process state (see ``TrainingWorker.reset``). A worker of a launch
that ended any other way (cancelled, failed, killed, out of memory, node lost) is killed, as
without the pool, and a fresh one is started for the slot in the background. A worker that
dies while idle is noticed when a launch hands it a job (the backend then launches again on
the same slots: ``RayBackend._relaunch``).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.exceptions import RayError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

log = logging.getLogger(__name__)

RESPAWN_BACKOFF_S = 5.0
"""After a worker failed to start (its node going away, most often), how long its slot waits
before the next attempt."""


@dataclass
class Slot:
    """GPU slot ``index`` of ``node`` and its worker (None while the node has none)."""

    node: str
    index: int
    actor: Any = None
    ready_ref: Any = None
    """``warm_up`` of a worker being started; None once it answered (or failed)."""
    busy: bool = False
    pid: int | None = None
    uses: int = 0
    """Launches the current worker has been given."""
    started_at: float = field(default_factory=time.monotonic)
    retry_at: float = 0.0
    """When a slot whose worker failed to start may have another."""

    @property
    def warm(self) -> bool:
        return self.actor is not None and self.ready_ref is None and self.pid is not None


@dataclass(frozen=True)
class PoolNode:
    """What the pool needs of a live node: its Ray node id and its GPU count."""

    ray_node_id: str
    gpus: int


class WarmPool:
    """The per-node warm workers of one ``RayBackend``; see the module docstring."""

    def __init__(self, worker_cls: Any, torch_threads: int = 1) -> None:
        self._worker_cls = worker_cls
        self._torch_threads = torch_threads
        self._nodes: dict[str, PoolNode] = {}
        self._slots: dict[str, list[Slot]] = {}
        self.started = 0
        """Worker processes started so far (the initial ones and every replacement)."""
        self.reused = 0
        """Launches' ranks that ran on a worker an earlier launch had used."""

    # -- membership ------------------------------------------------------------------------
    def sync(self, nodes: Mapping[str, PoolNode]) -> None:
        """Follow the live nodes: workers for a new node (or one back with another Ray node id
        or GPU count), none for a node that is gone."""
        for name in list(self._nodes):
            if nodes.get(name) != self._nodes[name]:
                for slot in self._slots.pop(name, []):
                    self._kill(slot)
                del self._nodes[name]
        for name, node in nodes.items():
            if name not in self._nodes:
                self._nodes[name] = node
                self._slots[name] = [Slot(name, k) for k in range(node.gpus)]
                for slot in self._slots[name]:
                    self._spawn(slot)

    # -- launches --------------------------------------------------------------------------
    def take(self, node: str, n: int, prefer: Sequence[Slot] = ()) -> list[Slot] | None:
        """``n`` free slots of ``node`` (those in ``prefer`` first, then warm ones), marked
        busy; None when the node has fewer free (the controller's accounting and the pool's
        disagree)."""
        free = [s for s in self._slots.get(node, []) if not s.busy]
        if len(free) < n:
            return None
        first = {id(s) for s in prefer}
        chosen = sorted(free, key=lambda s: (id(s) not in first, not s.warm, s.index))[:n]
        for s in chosen:
            s.busy = True
            if s.actor is None:
                self._spawn(s)
        return chosen

    def use(self, slots: Sequence[Slot]) -> None:
        """The launch on ``slots`` runs on their workers (not on fresh actors of its own)."""
        for s in slots:
            self.reused += s.uses > 0
            s.uses += 1

    def give_back(self, slots: Sequence[Slot], reusable: Sequence[bool]) -> None:
        """The launch on ``slots`` is over: each slot's worker stays (``reusable``) or is
        killed and replaced."""
        for slot, keep in zip(slots, reusable, strict=True):
            slot.busy = False
            if slot.node not in self._nodes or self._slots[slot.node][slot.index] is not slot:
                self._kill(slot)  # the node left the pool meanwhile
                continue
            if keep and slot.actor is not None:
                continue
            self._kill(slot)
            self._spawn(slot)

    def poll(self) -> None:
        """Notice workers that came up; replace the ones that failed to (a node dying), at
        most once per ``RESPAWN_BACKOFF_S`` per slot."""
        now = time.monotonic()
        starting = {s.ready_ref: s for slots in self._slots.values() for s in slots
                    if s.ready_ref is not None}
        if starting:
            ready, _ = ray.wait(list(starting), num_returns=len(starting), timeout=0)
            for ref in ready:
                s = starting[ref]
                try:
                    s.pid = ray.get(ref)
                    s.ready_ref = None
                except RayError as e:
                    lines = str(e).strip().splitlines()
                    log.warning("warm worker for %s slot %d failed to start: %s",
                                s.node, s.index, lines[-1] if lines else type(e).__name__)
                    self._kill(s)
                    s.retry_at = now + RESPAWN_BACKOFF_S
        for slots in self._slots.values():
            for s in slots:
                if s.actor is None and not s.busy and now >= s.retry_at:
                    self._spawn(s)

    def warm(self) -> bool:
        """Whether every slot of every node has a worker up."""
        self.poll()
        return all(s.warm or s.busy for slots in self._slots.values() for s in slots)

    def wait_warm(self, timeout_s: float) -> bool:
        """Wait until ``warm`` (the first workers import torch: seconds per process)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.warm():
                return True
            time.sleep(0.1)
        return self.warm()

    def slots(self, node: str) -> list[Slot]:
        return list(self._slots.get(node, []))

    def shutdown(self) -> None:
        """Kill every worker (the backend is going away)."""
        for slots in self._slots.values():
            for s in slots:
                self._kill(s)
        self._slots.clear()
        self._nodes.clear()

    # -- internals -------------------------------------------------------------------------
    def _spawn(self, slot: Slot) -> None:
        node = self._nodes[slot.node]
        slot.actor = self._worker_cls.options(
            num_cpus=0, num_gpus=0, max_concurrency=2, max_restarts=0,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node.ray_node_id, soft=False),
        ).remote(-1, self._torch_threads, slot.index)
        slot.ready_ref = slot.actor.warm_up.remote()
        slot.actor.where.remote()  # reads the node's labels once, ahead of the first job
        slot.pid = None
        slot.uses = 0
        slot.started_at = time.monotonic()
        self.started += 1

    @staticmethod
    def _kill(slot: Slot) -> None:
        if slot.actor is not None:
            with contextlib.suppress(RayError, ValueError):
                ray.kill(slot.actor, no_restart=True)
        slot.actor = slot.ready_ref = None
        slot.pid = None


def pool_nodes() -> dict[str, PoolNode]:
    """The live GPU nodes of the connected Ray cluster by Frenzy name (as ``read_inventory``
    names them), with their Ray node ids and GPU counts."""
    from orchestrator.ray_backend import NODE_ID_LABEL

    out: dict[str, PoolNode] = {}
    for raw in ray.nodes():
        gpus = int(raw.get("Resources", {}).get("GPU", 0))
        if not raw.get("Alive") or gpus <= 0:
            continue
        labels = raw.get("Labels") or {}
        name = labels.get(NODE_ID_LABEL) or str(raw["NodeID"])[:12]
        out[name] = PoolNode(str(raw["NodeID"]), gpus)
    return out
