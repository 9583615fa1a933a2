"""Where a plan's GPUs go: a per-call working index of free GPUs, and node-selection rules.

``FreeGpus`` is built once per policy call from the immutable ``ClusterState`` and updated as the
policy places jobs, so each placement sees what the previous ones left. Nodes are grouped by GPU
type (a plan for type X runs only on type-X nodes: its step time and memory were predicted for
X) and kept in the state's node order, which makes every tie-break deterministic.

Rules:

* ``best_fit`` — Frenzy's Algorithm 1 (HAS): the node whose free GPUs of an adequate type
  (``gpu_memory >= required_bytes``) fit the request exactly or most tightly; if no single node
  can, take the node with the most free GPUs and repeat for the remainder (fewest nodes, and the
  last, partial node again chosen by best fit).
* ``first_fit`` — the opportunistic baseline's greedy: the first node (in cluster order) that
  holds the whole request, else the same fewest-nodes spread.

Both keep tensor-parallel groups inside nodes when they can: they first try taking GPUs in
multiples of ``align`` (the plan's ``tp``) per node, and only when that cannot reach the count
fall back to any split (the performance model then charges the split group's slower links).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from scheduler.cluster import ClusterState, Placement


@dataclass(slots=True)
class _TypeNodes:
    """The nodes of one GPU type, in cluster order, with their free GPU counts (mutable)."""

    ids: list[str]
    memory: list[int]
    total: list[int]
    free: list[int]
    free_sum: int
    uniform_memory: int | None  # every node's GPU memory when they agree, else None
    gpu_type: str = ""


class FreeGpus:
    """Free GPUs by GPU type and node, updated in place as a policy places jobs."""

    __slots__ = ("_types", "_where", "free_by_type", "total_free")

    def __init__(self, types: dict[str, _TypeNodes]) -> None:
        self._types = types
        self._where: dict[str, tuple[_TypeNodes, int]] = {
            node_id: (t, i) for t in types.values() for i, node_id in enumerate(t.ids)
        }
        self.free_by_type: dict[str, int] = {k: t.free_sum for k, t in types.items()}
        """Free GPUs per type, kept current by ``take``/``give`` (read-only for callers)."""
        self.total_free = sum(self.free_by_type.values())

    @classmethod
    def from_state(cls, state: ClusterState) -> FreeGpus:
        """Index ``state``'s nodes by GPU type (cluster order kept)."""
        types: dict[str, _TypeNodes] = {}
        for node in state.nodes:
            t = types.get(node.gpu_type)
            if t is None:
                t = types[node.gpu_type] = _TypeNodes([], [], [], [], 0, node.gpu_memory,
                                                      node.gpu_type)
            t.ids.append(node.id)
            t.memory.append(node.gpu_memory)
            t.total.append(node.total_gpus)
            t.free.append(node.free_gpus)
            t.free_sum += node.free_gpus
            if t.uniform_memory != node.gpu_memory:
                t.uniform_memory = None
        return cls(types)

    # -- queries ---------------------------------------------------------------------------
    def gpu_types(self) -> list[str]:
        """GPU types present, in order of first appearance in the cluster."""
        return list(self._types)

    def has_type(self, gpu_type: str) -> bool:
        return gpu_type in self._types

    def free(self, gpu_type: str, min_memory: int = 0) -> int:
        """Free GPUs of ``gpu_type`` on nodes whose GPUs have at least ``min_memory`` bytes
        (Algorithm 1 line 5, ``ava``)."""
        t = self._types.get(gpu_type)
        if t is None:
            return 0
        if t.uniform_memory is not None:
            return t.free_sum if t.uniform_memory >= min_memory else 0
        return sum(f for f, m in zip(t.free, t.memory, strict=True) if m >= min_memory)

    def free_on(self, node_id: str) -> int:
        t, i = self._where[node_id]
        return t.free[i]

    def node_size(self, gpu_type: str) -> int:
        """The largest node of ``gpu_type`` (GPUs), 0 if the type is absent."""
        t = self._types.get(gpu_type)
        return max(t.total) if t else 0

    def node_ids(self, gpu_type: str) -> list[str]:
        t = self._types.get(gpu_type)
        return list(t.ids) if t else []

    def max_memory(self, gpu_type: str) -> int:
        """The most memory a GPU of ``gpu_type`` has in this cluster (bytes; 0 if absent)."""
        t = self._types.get(gpu_type)
        return max(t.memory) if t else 0

    def capacity(self, gpu_type: str) -> int:
        t = self._types.get(gpu_type)
        return sum(t.total) if t else 0

    def packed(self, gpu_type: str, num_gpus: int) -> Placement | None:
        """The placement ``num_gpus`` GPUs of ``gpu_type`` would get on an empty cluster: the
        largest nodes first (cluster order among equals), each filled before the next — the
        shape a policy assumes when it values a configuration before placing it (Sia)."""
        t = self._types.get(gpu_type)
        if t is None or num_gpus <= 0 or num_gpus > sum(t.total):
            return None
        out: list[tuple[str, int]] = []
        remaining = num_gpus
        for i in sorted(range(len(t.ids)), key=lambda i: (-t.total[i], i)):
            if remaining <= 0:
                break
            k = min(t.total[i], remaining)
            out.append((t.ids[i], k))
            remaining -= k
        return tuple(out)

    # -- updates ---------------------------------------------------------------------------
    def take(self, placement: Iterable[tuple[str, int]]) -> None:
        """Mark ``placement``'s GPUs used; raises ``ValueError`` if a node lacks them."""
        for node_id, n in placement:
            t, i = self._where[node_id]
            if n <= 0 or n > t.free[i]:
                raise ValueError(f"node {node_id}: cannot take {n} GPUs, {t.free[i]} free")
            t.free[i] -= n
            t.free_sum -= n
            self.free_by_type[t.gpu_type] -= n
            self.total_free -= n

    def give(self, placement: Iterable[tuple[str, int]]) -> None:
        """Return ``placement``'s GPUs (a job stopped or moved within this call)."""
        for node_id, n in placement:
            t, i = self._where[node_id]
            if n <= 0 or t.free[i] + n > t.total[i]:
                raise ValueError(f"node {node_id}: cannot return {n} GPUs")
            t.free[i] += n
            t.free_sum += n
            self.free_by_type[t.gpu_type] += n
            self.total_free += n

    # -- placement rules -------------------------------------------------------------------
    def best_fit(
        self, gpu_type: str, num_gpus: int, min_memory: int = 0, align: int = 1
    ) -> Placement | None:
        """Frenzy's Algorithm 1 placement of ``num_gpus`` GPUs of ``gpu_type`` (each with at
        least ``min_memory`` bytes), or ``None`` if there are not enough. Does not take them."""
        return self._place(gpu_type, num_gpus, min_memory, align, tightest=True)

    def first_fit(
        self, gpu_type: str, num_gpus: int, min_memory: int = 0, align: int = 1
    ) -> Placement | None:
        """The first node in cluster order holding all ``num_gpus``, else the fewest-nodes
        spread (most free first). Does not take them."""
        return self._place(gpu_type, num_gpus, min_memory, align, tightest=False)

    def _place(
        self, gpu_type: str, num_gpus: int, min_memory: int, align: int, tightest: bool
    ) -> Placement | None:
        t = self._types.get(gpu_type)
        if t is None or num_gpus <= 0:
            return None
        if t.uniform_memory is not None:
            if t.uniform_memory < min_memory or t.free_sum < num_gpus:
                return None
            idx = [i for i, f in enumerate(t.free) if f]
        else:
            idx = [i for i, f in enumerate(t.free) if f and t.memory[i] >= min_memory]
            if sum(t.free[i] for i in idx) < num_gpus:
                return None
        aligns = (align, 1) if align > 1 and num_gpus % align == 0 else (1,)
        for a in aligns:
            usable = [(i, t.free[i] - t.free[i] % a) for i in idx]
            usable = [(i, u) for i, u in usable if u]
            if sum(u for _, u in usable) >= num_gpus:
                return _algorithm1(t, usable, num_gpus, tightest)
        return None  # pragma: no cover  (align=1 always reaches a sufficient total)


def _algorithm1(
    t: _TypeNodes, usable: Sequence[tuple[int, int]], num_gpus: int, tightest: bool
) -> Placement:
    """Algorithm 1 lines 13-36 over ``usable`` (node index, GPUs it may give): while GPUs are
    still needed, give them all from the single node that fits best, else take everything the
    node with the most usable GPUs has and loop.

    "Fits best" (``tightest``) is our reading of lines 14-19: the smallest adequate GPU memory
    first (``fitSz``: a 40 GB card is not spent where an 80 GB one would be wasted, the paper's
    Job(2,32) example), then the fewest free GPUs (the tightest node), then cluster order. One
    node of a larger memory tier is still preferred to splitting over several smaller-tier
    nodes: the paper's Job(4,35) example puts avoiding cross-node communication first.
    Without ``tightest``, the first node in cluster order that fits. Spreading takes the node
    with the most usable GPUs (ties: smaller memory, then cluster order)."""
    remaining = num_gpus
    out: list[tuple[str, int]] = []
    pool = list(usable)
    while remaining > 0:
        fits = [(i, u) for i, u in pool if u >= remaining]
        if fits:
            if tightest:
                i = min(fits, key=lambda iu: (t.memory[iu[0]], t.free[iu[0]], iu[0]))[0]
            else:
                i = fits[0][0]
            out.append((t.ids[i], remaining))
            break
        k = max(range(len(pool)), key=lambda j: (pool[j][1], -t.memory[pool[j][0]], -pool[j][0]))
        i, u = pool.pop(k)
        out.append((t.ids[i], u))
        remaining -= u
    return tuple(out)

