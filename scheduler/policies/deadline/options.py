"""What a deadline job can run on: its options (GPU type, count, plan) and where they go.

``PlanSpace`` is the strategy: ``elastic`` takes every plan the predictor gave on any GPU type
and places them best-fit; ``elasticflow`` takes data-parallel scaling of one plan in powers of
two, buddy placement, and keeps a job on one GPU type."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from predictor.plan import Plan
from scheduler.cluster import ClusterState, Placement
from scheduler.job import JobView
from scheduler.placement import FreeGpus
from scheduler.policy import PerfModel


@dataclass(frozen=True, slots=True)
class Option:
    """One way to run a job now: ``num_gpus`` GPUs of ``gpu_type`` with ``plan``."""

    gpu_type: str
    num_gpus: int
    plan: Plan

    @property
    def step_s(self) -> float:
        return self.plan.step_time_s

    def same_shape(self, other: Option | None) -> bool:
        return other is not None and (self.gpu_type, self.num_gpus) == (other.gpu_type,
                                                                        other.num_gpus)

    def label(self) -> str:
        return self.plan.label()


OptionsFn = Callable[[JobView, ClusterState, PerfModel], Mapping[str, tuple[Option, ...]]]
"""A job's options per GPU type, fewest GPUs first, each strictly faster than the previous
(steps timed with the engine's performance model)."""

PlaceFn = Callable[[FreeGpus, Option], Placement | None]
"""Where an option's GPUs go (does not take them)."""


@dataclass(frozen=True, slots=True)
class PlanSpace:
    """Decides what a job may run on: its options per GPU type (``options``), where an
    option's GPUs go (``place``), and whether a job stays on the one GPU type it was admitted
    to or first started on (``pin_type``: ElasticFlow's homogeneous pools)."""

    options: OptionsFn
    place: PlaceFn
    pin_type: bool = False


def pareto(options: Sequence[Option]) -> tuple[Option, ...]:
    """Options sorted by GPU count, keeping only those faster than every smaller one (a larger
    allocation that is not faster is never worth its GPUs)."""
    out: list[Option] = []
    for o in sorted(options, key=lambda o: (o.num_gpus, o.step_s)):
        if out and o.num_gpus == out[-1].num_gpus:
            continue
        if not out or o.step_s < out[-1].step_s:
            out.append(o)
    return tuple(out)


def best_plan_options(job: JobView, state: ClusterState,
                      perf: PerfModel) -> dict[str, tuple[Option, ...]]:
    """Every plan the predictor gave, fastest per (type, count): tp/dp/pp all allowed. Each is
    re-timed by ``perf`` on the packed placement of this cluster (the planner timed it on the
    GPU type's default servers, whose network may be faster than this cluster's)."""
    free = FreeGpus.from_state(state)
    best: dict[tuple[str, int], Plan] = {}
    for p in job.plans:
        packed = free.packed(p.gpu_type, p.num_gpus)
        if packed is None:
            continue
        p = perf.placed_plan(job, p, packed, state)
        k = (p.gpu_type, p.num_gpus)
        if k not in best or p.step_time_s < best[k].step_time_s:
            best[k] = p
    by_type: dict[str, list[Option]] = {}
    for (t, n), p in best.items():
        by_type.setdefault(t, []).append(Option(t, n, p))
    return {t: pareto(opts) for t, opts in by_type.items()}


def best_fit_place(free: FreeGpus, o: Option) -> Placement | None:
    """Frenzy's best-fit placement, tensor-parallel groups kept inside nodes when possible."""
    return free.best_fit(o.gpu_type, o.num_gpus, o.plan.required_bytes, o.plan.parallel.tp)
