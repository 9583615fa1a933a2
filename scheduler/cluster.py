"""Cluster state as immutable values: nodes with free GPUs, and allocations of them.

``ClusterState.allocate`` / ``release`` return new states and refuse anything that would
give a GPU twice or exceed a node's capacity, so every policy's output is checked by
construction.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from predictor.plan import Plan

Placement = tuple[tuple[str, int], ...]
"""GPUs per node: ((node_id, gpus), ...), in the order the ranks are laid out."""


class CapacityError(ValueError):
    """An allocation asks for GPUs a node does not have free."""


@dataclass(frozen=True, slots=True)
class Node:
    """One machine: ``total_gpus`` GPUs of one type, ``free_gpus`` of them unallocated."""

    id: str
    gpu_type: str
    gpu_memory: int  # bytes per GPU
    total_gpus: int
    free_gpus: int
    interconnect: str = "pcie"  # intra-node GPU link: "nvlink" | "pcie"
    intra_bw_gbs: float | None = None  # None: the GPU type's default for that link

    def __post_init__(self) -> None:
        if not 0 <= self.free_gpus <= self.total_gpus:
            raise CapacityError(
                f"node {self.id}: free_gpus={self.free_gpus} outside [0, {self.total_gpus}]"
            )

    @property
    def used_gpus(self) -> int:
        return self.total_gpus - self.free_gpus


@dataclass(frozen=True, slots=True)
class Allocation:
    """GPUs granted to a job for one plan, laid out over nodes."""

    job_id: str
    plan: Plan
    placement: Placement
    num_gpus: int = field(init=False, repr=False, compare=False, hash=False)
    """GPUs over all nodes of ``placement`` (computed once: policies sort by it per call)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "num_gpus", sum(n for _, n in self.placement))

    @property
    def num_nodes(self) -> int:
        return len(self.placement)

    def describe(self) -> str:
        where = " + ".join(f"{n}@{node}" for node, n in self.placement)
        return f"{self.plan.label()} on {where}"


@dataclass(frozen=True, slots=True)
class ClusterState:
    """Every node's free GPUs, and the network between nodes.

    Views derived from the nodes (``by_id``, the free-GPU totals, the placement index that
    ``scheduler.placement.FreeGpus`` builds) are computed once per state and kept in
    ``memo``: the state is immutable, and policies ask for them on every call. A state made by
    ``allocate``/``release`` also records the free-GPU change per node since the last state
    whose placement index was built, so that index is updated rather than rebuilt.
    """

    nodes: tuple[Node, ...]
    inter_node_bw_gbs: float = 12.5  # 100 Gb/s Ethernet/IB per node
    memo: dict[str, Any] = field(default_factory=dict, init=False, repr=False, compare=False,
                                 hash=False)
    """Views derived from this state (keys are private to the modules that fill them)."""

    def __post_init__(self) -> None:
        ids = [n.id for n in self.nodes]
        if len(set(ids)) != len(ids):
            dup = [i for i, c in Counter(ids).items() if c > 1]
            raise ValueError(f"duplicate node ids: {', '.join(dup)}")

    # -- queries ---------------------------------------------------------------------------
    def node(self, node_id: str) -> Node:
        n = self.by_id.get(node_id)
        if n is None:
            raise KeyError(node_id)
        return n

    @property
    def by_id(self) -> Mapping[str, Node]:
        """Nodes by id (built once per state; do not mutate)."""
        d = self.memo.get("by_id")
        if d is None:
            d = self.memo["by_id"] = {n.id: n for n in self.nodes}
        return d

    def gpu_types(self) -> list[str]:
        return sorted({n.gpu_type for n in self.nodes})

    def free_by_type(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for n in self.nodes:
            out[n.gpu_type] = out.get(n.gpu_type, 0) + n.free_gpus
        return out

    def total_by_type(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for n in self.nodes:
            out[n.gpu_type] = out.get(n.gpu_type, 0) + n.total_gpus
        return out

    @property
    def total_gpus(self) -> int:
        return sum(n.total_gpus for n in self.nodes)

    @property
    def free_gpus(self) -> int:
        f = self.memo.get("free_gpus")
        if f is None:
            f = self.memo["free_gpus"] = sum(n.free_gpus for n in self.nodes)
        return f

    # -- transitions -----------------------------------------------------------------------
    def _apply(self, placement: Iterable[tuple[str, int]], sign: int) -> ClusterState:
        delta: dict[str, int] = {}
        for node_id, n in placement:
            if n <= 0:
                raise CapacityError(f"node {node_id}: a placement needs a positive GPU count")
            delta[node_id] = delta.get(node_id, 0) + n
        by_id = self.by_id
        unknown = [i for i in delta if i not in by_id]
        if unknown:
            raise CapacityError(f"unknown node(s): {', '.join(unknown)}")
        nodes = []
        changed: list[Node] = []
        for node in self.nodes:
            d = delta.get(node.id, 0)
            if not d:
                nodes.append(node)
                continue
            free = node.free_gpus - sign * d
            if free < 0:
                raise CapacityError(
                    f"node {node.id}: asks {d} GPUs, {node.free_gpus} free"
                )
            if free > node.total_gpus:
                raise CapacityError(
                    f"node {node.id}: releasing {d} GPUs would exceed its {node.total_gpus}"
                )
            changed.append(replace(node, free_gpus=free))
            nodes.append(changed[-1])
        out = replace(self, nodes=tuple(nodes))
        _inherit_memo(self, out, delta, -sign, changed)
        return out

    def allocate(self, alloc: Allocation) -> ClusterState:
        """The state after granting ``alloc``; raises ``CapacityError`` if it does not fit."""
        return self._apply(alloc.placement, +1)

    def release(self, alloc: Allocation) -> ClusterState:
        """The state after ``alloc``'s GPUs are returned."""
        return self._apply(alloc.placement, -1)

    def with_node(self, node: Node) -> ClusterState:
        """Add or replace a node (nodes joining, or changing)."""
        rest = tuple(n for n in self.nodes if n.id != node.id)
        return replace(self, nodes=(*rest, node))

    def without_node(self, node_id: str) -> ClusterState:
        return replace(self, nodes=tuple(n for n in self.nodes if n.id != node_id))


def _inherit_memo(parent: ClusterState, child: ClusterState, delta: Mapping[str, int],
                  sign: int, changed: list[Node]) -> None:
    """Carry what stays valid from ``parent`` to ``child`` (same nodes; ``delta`` GPUs per
    node changed hands, ``sign`` +1 freed / -1 taken, ``changed`` the child's new nodes):
    ``by_id`` and the free total, updated; the placement index's base — the nearest
    ancestor's index, opaque here — and the free-GPU change per node since it."""
    memo = parent.memo
    by_id = memo.get("by_id")
    if by_id is not None:
        by_id = child.memo["by_id"] = dict(by_id)
        for node in changed:
            by_id[node.id] = node
    if "free_gpus" in memo:
        child.memo["free_gpus"] = memo["free_gpus"] + sign * sum(delta.values())
    base = memo.get("free_index")
    if base is not None:
        child.memo["free_index_base"] = (base, {k: sign * v for k, v in delta.items()})
        return
    pending = memo.get("free_index_base")
    if pending is not None:
        base, since = pending
        merged = dict(since)
        for k, v in delta.items():
            merged[k] = merged.get(k, 0) + sign * v
        child.memo["free_index_base"] = (base, merged)
