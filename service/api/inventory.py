"""Where the API learns the cluster: a ``ClusterProvider`` returning a ``ClusterView``.

The default reads the ``nodes`` and ``allocations`` tables (what the Controller writes);
the lead can pass a provider that asks the Controller directly. Submissions only need the
GPU types and pool sizes, which ``InventoryCache`` keeps for a second or so to keep
``POST /v1/jobs`` cheap.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from sqlalchemy.orm import Session, sessionmaker

from scheduler.cluster import ClusterState, Node, Placement
from service.db import repositories as repo

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ClusterView:
    """Nodes with their free GPUs, and which job holds which GPUs (job id → placement)."""

    state: ClusterState
    allocations: Mapping[str, Placement] = field(default_factory=dict)


ClusterProvider = Callable[[], "ClusterView | tuple[ClusterState, Mapping[str, Placement]]"]


def as_view(value: ClusterView | tuple[ClusterState, Mapping[str, Placement]]) -> ClusterView:
    """Accept a ``ClusterView`` or a ``(ClusterState, allocations)`` pair."""
    if isinstance(value, ClusterView):
        return value
    state, allocations = value
    return ClusterView(state=state, allocations=allocations)


class DbClusterProvider:
    """The cluster as recorded in the database: live nodes, minus active allocations."""

    def __init__(self, session_factory: sessionmaker[Session]) -> None:
        self._factory = session_factory

    def __call__(self) -> ClusterView:
        with self._factory() as session:
            nodes = repo.list_nodes(session=session)
            allocs = repo.active_allocations(session=session)
        held: dict[str, int] = {}
        by_job: dict[str, list[tuple[str, int]]] = {}
        for a in allocs:
            held[a.node_id] = held.get(a.node_id, 0) + a.gpus
            by_job.setdefault(a.job_id, []).append((a.node_id, a.gpus))
        out = []
        for n in nodes:
            used = held.get(n.id, 0)
            if used > n.total_gpus:
                log.warning("node %s: %d GPUs allocated of %d", n.id, used, n.total_gpus)
            out.append(
                Node(
                    id=n.id, gpu_type=n.gpu_type, gpu_memory=n.gpu_memory,
                    total_gpus=n.total_gpus, free_gpus=max(0, n.total_gpus - used),
                    interconnect=n.interconnect, intra_bw_gbs=n.intra_bw_gbs,
                )
            )
        return ClusterView(
            state=ClusterState(nodes=tuple(out)),
            allocations={j: tuple(p) for j, p in by_job.items()},
        )


@dataclass(frozen=True, slots=True)
class Inventory:
    """GPU types in the cluster and how many GPUs of each (empty: no nodes known yet)."""

    total_by_type: Mapping[str, int]

    @property
    def gpu_types(self) -> list[str]:
        return sorted(self.total_by_type)

    @property
    def largest_pool(self) -> int:
        return max(self.total_by_type.values(), default=0)


class InventoryCache:
    """The provider's GPU types and pool sizes, refreshed at most every ``ttl_s`` seconds;
    ``extra`` pools (types the cluster may gain) are added, or enlarge a live pool."""

    def __init__(self, provider: ClusterProvider, ttl_s: float,
                 extra: Mapping[str, int] | None = None) -> None:
        self._provider = provider
        self._extra = dict(extra or {})
        self._ttl = ttl_s
        self._lock = threading.Lock()
        self._value: Inventory | None = None
        self._at = 0.0

    def peek(self) -> Inventory | None:
        """The cached value while it is fresh, else None (call ``get``, which reads the
        provider: the async routes do that in the thread pool)."""
        with self._lock:
            if self._value is not None and time.monotonic() - self._at < self._ttl:
                return self._value
        return None

    def get(self) -> Inventory:
        now = time.monotonic()
        with self._lock:
            if self._value is not None and now - self._at < self._ttl:
                return self._value
        view = as_view(self._provider())
        pools = view.state.total_by_type()
        for gpu_type, count in self._extra.items():
            pools[gpu_type] = max(count, pools.get(gpu_type, 0))
        value = Inventory(total_by_type=pools)
        with self._lock:
            self._value, self._at = value, now
        return value
