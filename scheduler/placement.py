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

from bisect import bisect_left, insort
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from scheduler.cluster import ClusterState, Placement


@dataclass(frozen=True, slots=True)
class _Layout:
    """The fixed part of one GPU type's nodes (shared by every state with the same nodes):
    ids, memory and sizes in cluster order, and the distinct memory sizes ("tiers")."""

    gpu_type: str
    ids: tuple[str, ...]
    memory: tuple[int, ...]
    total: tuple[int, ...]
    uniform_memory: int | None  # every node's GPU memory when they agree, else None
    tiers: tuple[int, ...]  # distinct GPU memory sizes, ascending
    tier_of: tuple[int, ...]  # per node: its position in ``tiers``
    max_total: int  # the largest node's GPUs


class _TypeFree:
    """One GPU type's free GPUs (mutable): per node, per memory tier, and the nodes bucketed
    by (tier, free GPUs), each bucket sorted by cluster order — so best fit reads the first
    node of the first non-empty bucket instead of scanning every node.

    ``take``/``give`` only note which nodes changed (``dirty``); the buckets are brought up
    to date before the next placement query (``sync``), because a policy often gives a job's
    GPUs back and takes them again without placing anything in between."""

    __slots__ = ("buckets", "dirty", "filed", "free", "free_sum", "layout", "tier_free")

    def __init__(self, layout: _Layout, free: list[int], free_sum: int, tier_free: list[int],
                 buckets: list[list[list[int]]], filed: list[int]) -> None:
        self.layout = layout
        self.free = free
        self.free_sum = free_sum
        self.tier_free = tier_free
        self.buckets = buckets  # [tier][free GPUs] -> node indices, ascending
        self.filed = filed  # per node: the free count it is filed under in ``buckets``
        self.dirty: list[int] = []

    @classmethod
    def build(cls, layout: _Layout, free: list[int]) -> _TypeFree:
        tier_free = [0] * len(layout.tiers)
        buckets = [[[] for _ in range(layout.max_total + 1)] for _ in layout.tiers]
        for i, f in enumerate(free):
            if f:
                tier_free[layout.tier_of[i]] += f
                buckets[layout.tier_of[i]][f].append(i)
        return cls(layout, free, sum(free), tier_free, buckets, list(free))

    def copy(self) -> _TypeFree:
        self.sync()
        return _TypeFree(self.layout, list(self.free), self.free_sum, list(self.tier_free),
                         [[list(b) for b in tier] for tier in self.buckets], list(self.filed))

    def sync(self) -> None:
        """File every node changed since the last sync under its current free count."""
        if not self.dirty:
            return
        free, filed, buckets, tier_of = self.free, self.filed, self.buckets, self.layout.tier_of
        for i in self.dirty:
            f, old = free[i], filed[i]
            if f == old:
                continue
            tier = buckets[tier_of[i]]
            if old:
                b = tier[old]
                del b[bisect_left(b, i)]
            if f:
                insort(tier[f], i)
            filed[i] = f
        self.dirty.clear()


@dataclass(frozen=True, slots=True)
class _Index:
    """An immutable free-GPU index of one cluster state (kept in ``ClusterState.memo``);
    ``FreeGpus`` works on a copy."""

    types: dict[str, _TypeFree]
    where: Mapping[str, tuple[str, int]]  # node id -> (GPU type, position among its nodes)

    @classmethod
    def build(cls, state: ClusterState) -> _Index:
        groups: dict[str, list[int]] = {}
        nodes = state.nodes
        for k, node in enumerate(nodes):
            groups.setdefault(node.gpu_type, []).append(k)
        types: dict[str, _TypeFree] = {}
        where: dict[str, tuple[str, int]] = {}
        for t, ks in groups.items():
            memory = tuple(nodes[k].gpu_memory for k in ks)
            tiers = tuple(sorted(set(memory)))
            layout = _Layout(
                gpu_type=t, ids=tuple(nodes[k].id for k in ks), memory=memory,
                total=tuple(nodes[k].total_gpus for k in ks),
                uniform_memory=memory[0] if len(tiers) == 1 else None, tiers=tiers,
                tier_of=tuple(tiers.index(m) for m in memory),
                max_total=max(nodes[k].total_gpus for k in ks))
            types[t] = _TypeFree.build(layout, [nodes[k].free_gpus for k in ks])
            for i, node_id in enumerate(layout.ids):
                where[node_id] = (t, i)
        return cls(types, where)

    def updated(self, delta: Mapping[str, int]) -> _Index:
        """This index after each node's free GPUs changed by ``delta[node]``."""
        types = dict(self.types)
        copied: set[str] = set()
        for node_id, d in delta.items():
            if not d:
                continue
            t, i = self.where[node_id]
            if t not in copied:
                types[t] = types[t].copy()
                copied.add(t)
            tf = types[t]
            tf.free[i] += d
            tf.free_sum += d
            tf.tier_free[tf.layout.tier_of[i]] += d
            tf.dirty.append(i)
        for t in copied:
            types[t].sync()
        return _Index(types, self.where)

    @classmethod
    def of(cls, state: ClusterState) -> _Index:
        """``state``'s index: cached on the state, else derived from the nearest ancestor's
        (``ClusterState.allocate``/``release`` record the change), else built."""
        memo = state.memo
        index = memo.get("free_index")
        if index is None:
            pending = memo.pop("free_index_base", None)
            index = pending[0].updated(pending[1]) if pending is not None else cls.build(state)
            memo["free_index"] = index
        return index


class FreeGpus:
    """Free GPUs by GPU type and node, updated in place as a policy places jobs."""

    __slots__ = ("_own", "_types", "_where", "free_by_type", "total_free")

    def __init__(self, types: dict[str, _TypeFree], where: Mapping[str, tuple[str, int]]) -> None:
        self._types = types  # a type's entry is the state's own until first changed here
        self._own: set[str] = set()  # the types copied for this working view
        self._where = where
        self.free_by_type: dict[str, int] = {k: t.free_sum for k, t in types.items()}
        """Free GPUs per type, kept current by ``take``/``give`` (read-only for callers)."""
        self.total_free = sum(self.free_by_type.values())

    @classmethod
    def from_state(cls, state: ClusterState) -> FreeGpus:
        """A working copy of ``state``'s free GPUs, indexed by GPU type (cluster order kept).
        The index is built once per state (or updated from the previous state's) and cached
        on it; each call only copies it."""
        index = _Index.of(state)
        return cls(dict(index.types), index.where)

    def _mutable(self, gpu_type: str) -> _TypeFree:
        """``gpu_type``'s entry, copied from the state's index on the first change (copy on
        write: most calls change one or two types, or none)."""
        if gpu_type not in self._own:
            self._types[gpu_type] = self._types[gpu_type].copy()
            self._own.add(gpu_type)
        return self._types[gpu_type]

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
        lay = t.layout
        if lay.uniform_memory is not None:
            return t.free_sum if lay.uniform_memory >= min_memory else 0
        return sum(f for f, m in zip(t.tier_free, lay.tiers, strict=True) if m >= min_memory)

    def free_on(self, node_id: str) -> int:
        t, i = self._where[node_id]
        return self._types[t].free[i]

    def node_size(self, gpu_type: str) -> int:
        """The largest node of ``gpu_type`` (GPUs), 0 if the type is absent."""
        t = self._types.get(gpu_type)
        return t.layout.max_total if t else 0

    def node_ids(self, gpu_type: str) -> list[str]:
        t = self._types.get(gpu_type)
        return list(t.layout.ids) if t else []

    def max_memory(self, gpu_type: str) -> int:
        """The most memory a GPU of ``gpu_type`` has in this cluster (bytes; 0 if absent)."""
        t = self._types.get(gpu_type)
        return t.layout.tiers[-1] if t else 0

    def capacity(self, gpu_type: str) -> int:
        t = self._types.get(gpu_type)
        return sum(t.layout.total) if t else 0

    def packed(self, gpu_type: str, num_gpus: int) -> Placement | None:
        """The placement ``num_gpus`` GPUs of ``gpu_type`` would get on an empty cluster: the
        largest nodes first (cluster order among equals), each filled before the next — the
        shape a policy assumes when it values a configuration before placing it (Sia)."""
        t = self._types.get(gpu_type)
        if t is None or num_gpus <= 0:
            return None
        lay = t.layout
        order = _largest_first(lay)
        if num_gpus > order[-1][2]:
            return None
        out: list[tuple[str, int]] = []
        remaining = num_gpus
        for node_id, size, _ in order:
            if remaining <= 0:
                break
            k = min(size, remaining)
            out.append((node_id, k))
            remaining -= k
        return tuple(out)

    # -- updates ---------------------------------------------------------------------------
    def take(self, placement: Iterable[tuple[str, int]]) -> None:
        """Mark ``placement``'s GPUs used; raises ``ValueError`` if a node lacks them."""
        where, by_type, own = self._where, self.free_by_type, self._own
        for node_id, n in placement:
            name, i = where[node_id]
            t = self._types[name] if name in own else self._mutable(name)
            if n <= 0 or n > t.free[i]:
                raise ValueError(f"node {node_id}: cannot take {n} GPUs, {t.free[i]} free")
            t.free[i] -= n
            t.free_sum -= n
            t.tier_free[t.layout.tier_of[i]] -= n
            t.dirty.append(i)
            by_type[name] -= n
            self.total_free -= n

    def give(self, placement: Iterable[tuple[str, int]]) -> None:
        """Return ``placement``'s GPUs (a job stopped or moved within this call)."""
        where, by_type, own = self._where, self.free_by_type, self._own
        for node_id, n in placement:
            name, i = where[node_id]
            t = self._types[name] if name in own else self._mutable(name)
            if n <= 0 or t.free[i] + n > t.layout.total[i]:
                raise ValueError(f"node {node_id}: cannot return {n} GPUs")
            t.free[i] += n
            t.free_sum += n
            t.tier_free[t.layout.tier_of[i]] += n
            t.dirty.append(i)
            by_type[name] += n
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
        lay = t.layout
        tiers = [k for k, m in enumerate(lay.tiers) if m >= min_memory]
        if sum(t.tier_free[k] for k in tiers) < num_gpus:
            return None
        t.sync()
        aligns = (align, 1) if align > 1 and num_gpus % align == 0 else (1,)
        for a in aligns:
            # GPUs the eligible nodes may give in multiples of ``a``
            usable = sum(len(t.buckets[k][f]) * (f - f % a)
                         for k in tiers for f in range(a, lay.max_total + 1))
            if usable >= num_gpus:
                return _algorithm1(t, tiers, a, num_gpus, tightest)
        return None  # pragma: no cover  (align=1 always reaches a sufficient total)


def _largest_first(lay: _Layout) -> list[tuple[str, int, int]]:
    """(node id, GPUs, GPUs so far) of ``lay``'s nodes, largest first, cluster order among
    equals (cached per layout)."""
    order = _PACKED.get(lay)
    if order is None:
        order, acc = [], 0
        for i in sorted(range(len(lay.ids)), key=lambda i: (-lay.total[i], i)):
            acc += lay.total[i]
            order.append((lay.ids[i], lay.total[i], acc))
        if len(_PACKED) > 256:
            _PACKED.clear()
        _PACKED[lay] = order
    return order


_PACKED: dict[_Layout, list[tuple[str, int, int]]] = {}


def _algorithm1(t: _TypeFree, tiers: list[int], a: int, num_gpus: int,
                tightest: bool) -> Placement:
    """Algorithm 1 lines 13-36 over the nodes of memory tiers ``tiers`` that can give GPUs in
    multiples of ``a`` (``usable`` = free rounded down to a multiple of ``a``): while GPUs are
    still needed, give them all from the single node that fits best, else take everything the
    node with the most usable GPUs has and loop.

    "Fits best" (``tightest``) is our reading of lines 14-19: the smallest adequate GPU memory
    first (``fitSz``: a 40 GB card is not spent where an 80 GB one would be wasted, the paper's
    Job(2,32) example), then the fewest free GPUs (the tightest node), then cluster order. One
    node of a larger memory tier is still preferred to splitting over several smaller-tier
    nodes: the paper's Job(4,35) example puts avoiding cross-node communication first.
    Without ``tightest``, the first node in cluster order that fits. Spreading takes the node
    with the most usable GPUs (ties: smaller memory, then cluster order).

    Nodes are read from the (tier, free count) buckets, each in cluster order, so a step
    costs O(tiers × node size), not O(nodes); ``used`` are the nodes already spread over."""
    lay, buckets, top = t.layout, t.buckets, t.layout.max_total
    remaining = num_gpus
    out: list[tuple[str, int]] = []
    used: set[int] = set()

    def first(bucket: list[int]) -> int | None:
        for i in bucket:
            if i not in used:
                return i
        return None

    while True:
        lo = remaining + (-remaining) % a  # the fewest free GPUs whose usable part fits
        if tightest:  # smallest memory tier, then fewest free GPUs, then cluster order
            for k in tiers:
                tier = buckets[k]
                for f in range(lo, top + 1):
                    i = first(tier[f]) if tier[f] else None
                    if i is not None:
                        out.append((lay.ids[i], remaining))
                        return tuple(out)
        else:  # first in cluster order
            found = [i for k in tiers for f in range(lo, top + 1)
                     if buckets[k][f] and (i := first(buckets[k][f])) is not None]
            if found:
                out.append((lay.ids[min(found)], remaining))
                return tuple(out)
        # no node fits: the most usable GPUs, then the smaller memory, then cluster order
        best: tuple[int, int, int] | None = None
        for k in tiers:
            tier = buckets[k]
            for f in range(top, a - 1, -1):
                if not tier[f]:
                    continue
                i = first(tier[f])
                if i is None:
                    continue
                key = (f - f % a, -k, -i)  # several free counts share a usable count
                if best is None or key > best:
                    best = key
        assert best is not None  # the usable total was checked to suffice
        u, _, neg_i = best
        used.add(-neg_i)
        out.append((lay.ids[-neg_i], u))
        remaining -= u
