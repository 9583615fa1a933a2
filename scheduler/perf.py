"""The default performance model: a plan's step time re-estimated for where it really runs.

The planner times every plan on its default topology (GPUs packed onto full nodes of 8, the GPU
type's usual link, its usual network). A policy that places the plan somewhere else — a
tensor-parallel group split over two nodes, a PCIe-only node, a slower network — gets a
different step time, and the simulator must run the job at *that* speed, or placement quality
would not matter. ``AnalyticalPerfModel`` rebuilds the ``Topology`` from the placement and asks
``predictor.step_time`` again.

It is on every policy's hot path, so results are cached by (plan, placement shape): the shape is
what the step-time model can see (GPUs per node in rank order, the nodes' links, the network),
not the node names.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import replace

from predictor.errors import SpecError
from predictor.gpus import GpuType, get_gpu
from predictor.plan import Plan
from predictor.step_time import StepTime, Topology, estimate_step_time
from scheduler.cluster import ClusterState, Node, Placement
from scheduler.job import JobView

log = logging.getLogger(__name__)

Shape = tuple[tuple[int, ...], str, float | None, float]
"""(GPUs per node in rank order, intra-node link, intra-node GB/s or None, network GB/s)."""


def placement_topology(placement: Placement, state: ClusterState) -> Topology:
    """The ``Topology`` the step-time model needs for ``placement`` on ``state``'s nodes.

    A placement over nodes with different links is timed with the slowest one (a collective
    runs at the pace of its slowest member): PCIe if any node lacks NVLink, and the smallest
    explicit bandwidth when every node gives one.
    """
    return _topology(_shape(placement, state.by_id, state.inter_node_bw_gbs))


def _shape(placement: Placement, by_id: Mapping[str, Node], inter_bw: float) -> Shape:
    counts = tuple(n for _, n in placement)
    nodes = [by_id[node_id] for node_id, _ in placement]
    link = "pcie" if any(n.interconnect != "nvlink" for n in nodes) else "nvlink"
    bws = [n.intra_bw_gbs for n in nodes]
    bw = None if any(b is None for b in bws) else min(b for b in bws if b is not None)
    return counts, link, bw, inter_bw


def _topology(shape: Shape) -> Topology:
    counts, link, bw, inter_bw = shape
    return Topology(
        num_nodes=len(counts), intra_link=link, intra_bw_gbs=bw, inter_bw_gbs=inter_bw,
        gpus_per_node=counts,
    )


class AnalyticalPerfModel:
    """``PerfModel`` backed by ``predictor.step_time``: ``placed_plan`` returns the plan with its
    step time for the actual placement.

    Jobs without ``model``/``train`` (e.g. synthetic trace jobs that only carry plans) keep the
    plan's own step time. ``gpu_lookup`` resolves a plan's GPU type (default: the catalog).

    Two caches, bounded differently because they grow differently:

    * placed plans by (plan object, shape): one entry per job and placement, so it grows with
      every job ever placed. It keeps two generations of ``plan_cache`` entries: when the
      young one is full it becomes the old one and the old one is dropped; a hit in the old one
      moves up. Live jobs are asked about every round and stay; ended jobs' plans age out, so a
      service that runs for weeks holds at most ``2 * plan_cache`` of them.
    * step times by what they depend on (model, training shape, GPU type, parallel plan,
      placement shape): shared by every job of the same shape, so a miss above costs a dict
      lookup and a ``Plan.with_step``. At most ``max_cache`` entries, cleared when full.
    """

    def __init__(
        self,
        gpu_lookup: Callable[[str], GpuType] = get_gpu,
        *,
        max_cache: int = 200_000,
        plan_cache: int = 1024,
    ) -> None:
        self._gpu_lookup = gpu_lookup
        self._max_cache = max_cache
        self._plan_cache = plan_cache
        # key (id(plan), shape) -> (plan, placed plan); the plan is kept so its id stays unique
        self._cache: dict[tuple[int, Shape], tuple[Plan, Plan]] = {}
        self._old: dict[tuple[int, Shape], tuple[Plan, Plan]] = {}
        self._steps: dict[tuple[object, ...], StepTime] = {}
        self._gpus: dict[str, GpuType] = {}
        self._state: ClusterState | None = None
        self._by_id: Mapping[str, Node] = {}
        self.hits = 0
        self.misses = 0

    def placed_plan(
        self, job: JobView, plan: Plan, placement: Placement, state: ClusterState
    ) -> Plan:
        """``plan`` with its step time re-estimated for ``placement`` on ``state``."""
        if job.model is None or job.train is None or not placement:
            return plan
        if state is not self._state:  # one dict per state, not per call
            self._state, self._by_id = state, state.by_id
        shape = _shape(placement, self._by_id, state.inter_node_bw_gbs)
        key = (id(plan), shape)
        hit = self._cache.get(key)
        if hit is not None and hit[0] is plan:
            self.hits += 1
            return hit[1]
        hit = self._old.pop(key, None)
        if hit is not None and hit[0] is plan:
            self.hits += 1
            self._remember(key, hit)
            return hit[1]
        self.misses += 1
        placed = self._estimate(job, plan, shape)
        self._remember(key, (plan, placed))
        return placed

    def _remember(self, key: tuple[int, Shape], entry: tuple[Plan, Plan]) -> None:
        if len(self._cache) >= self._plan_cache:
            self._old, self._cache = self._cache, {}
        self._cache[key] = entry

    def _estimate(self, job: JobView, plan: Plan, shape: Shape) -> Plan:
        assert job.model is not None and job.train is not None
        train = job.train
        # jobs of the same model and training shape share step times (only their step counts
        # differ), so the estimate is cached by what it depends on, not by the job's plan
        skey = (job.model, train.seq_len, train.global_batch, plan.precision, train.optimizer,
                train.flash_attention, train.sequence_parallel, plan.gpu_type, plan.parallel,
                shape)
        step = self._steps.get(skey)
        if step is None:
            if train.precision is not plan.precision:  # bf16 planned as fp16 on a 2080Ti
                train = replace(train, precision=plan.precision)
            try:
                gpu = self._gpus.get(plan.gpu_type) or self._gpus.setdefault(
                    plan.gpu_type, self._gpu_lookup(plan.gpu_type))
                step = estimate_step_time(job.model, train, plan.parallel, gpu,
                                          _topology(shape))
            except (SpecError, ValueError, KeyError) as exc:
                log.warning("job %s: cannot re-time %s for %s (%s); keeping the planned step "
                            "time", job.id, plan.label(), shape, exc)
                return plan
            if len(self._steps) >= self._max_cache:
                self._steps.clear()
            self._steps[skey] = step
        return plan.with_step(step)
