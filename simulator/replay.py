"""Replay a workload over a cluster with a policy: the production ``ControlLoop`` over a
``SimBackend`` on a virtual clock, its jobs from the trace (a ``ListJobSource``).

``ControlLoop.run_virtual`` moves time and hands over inputs: at the next instant at which
something happens (an arrival from the trace, a backend event, a periodic tick) it advances
the clock, submits the arrivals and delivers the backend's due events in one turn
(simultaneous events, one policy call), and repeats until every job has ended, or nothing can
happen any more, or the jobs still queued can never be placed (an idle cluster, nothing more
to come, a round that placed none of them); those are reported unfinished, each with its
reason (``ReplayResult.unfinished``).

Planning is done once per distinct (model, training shape) and cluster, and reused for every
job of that shape (only the step count differs; plans are re-stamped with it).
"""

from __future__ import annotations

import logging
import re
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TextIO

from orchestrator.backend import VirtualClock
from orchestrator.backends.sim import DEFAULT_LAUNCH_DELAY_S, DEFAULT_RESTART_DELAY_S, SimBackend
from orchestrator.controller import Controller, JobRecord
from orchestrator.estimation import EstimatorFeed, estimating_policy
from orchestrator.loop import ControlLoop, ListJobSource
from orchestrator.states import JobEvent, JobState
from predictor.gpus import get_gpu
from predictor.plan import Plan
from predictor.planner import DEFAULT_MAX_GPUS, plan_job
from predictor.spec import ModelSpec, TrainingSpec
from scheduler.cluster import ClusterState
from scheduler.estimator import StepTimeEstimator
from scheduler.job import JobView
from scheduler.policy import PerfModel, Policy
from simulator.error import ERROR_MODES, ErrorModel
from simulator.gavel import GAVEL_JOBS, gavel_jobs, parse_spec
from simulator.mapping import TRACE_RUNTIME, MappedJob, map_jobs
from simulator.metrics import MetricsCollector, RunMetrics, summarize
from simulator.traces import load_traces
from simulator.workloads import new_workload

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class SimConfig:
    """Knobs of a replay. ``tick_s``: periodic scheduling rounds (None: event-driven only);
    ``until_s``: stop at this virtual time; ``max_policy_calls``: stop after that many calls
    (overhead measurements). ``error``: prediction error, one of ``ERROR_MODES`` ('none':
    every job runs at its predicted step time; 'measured' / '2x': see ``simulator.error``),
    drawn with ``error_seed``; under error the backend reports progress every
    ``progress_every_s`` and, with ``estimator``, a ``StepTimeEstimator`` fed from those
    reports goes to the policies that take one; with ``correct`` as well, every other
    policy plans on step times it corrects (``scheduler.corrected``), as Pollux and Sia
    re-fit throughput from what jobs report."""

    launch_delay_s: float = DEFAULT_LAUNCH_DELAY_S
    restart_delay_s: float = DEFAULT_RESTART_DELAY_S
    tick_s: float | None = None
    until_s: float | None = None
    max_policy_calls: int | None = None
    max_gpus: int = DEFAULT_MAX_GPUS
    error: str = "none"
    error_seed: int = 0
    progress_every_s: float = 300.0
    estimator: bool = True
    correct: bool = True

    def __post_init__(self) -> None:
        if self.error not in ERROR_MODES:
            raise ValueError(f"SimConfig.error must be one of {', '.join(ERROR_MODES)}, "
                             f"got {self.error!r}")


# -- planning, cached -----------------------------------------------------------------------


class PlanCache:
    """Ranked plans per (model, training shape) for one cluster's GPU types.

    Plans needing more GPUs of a type than the cluster has are dropped (ranks renumbered).
    Multi-node plans are timed on the network the cluster declares
    (``ClusterState.inter_node_bw_gbs``), the one the jobs run on, not on each GPU type's
    usual servers: a plan is chosen for the step time it will have here.
    """

    def __init__(self, cluster: ClusterState, *, max_gpus: int = DEFAULT_MAX_GPUS) -> None:
        self._total = cluster.total_by_type()
        self._gpus = [get_gpu(t) for t in sorted(self._total)]
        self._max_gpus = min(max_gpus, max(self._total.values()))
        self._inter_bw = cluster.inter_node_bw_gbs
        self._cache: dict[tuple[ModelSpec, TrainingSpec], tuple[Plan, ...]] = {}
        self.misses = 0

    def plans(self, model: ModelSpec, train: TrainingSpec) -> tuple[Plan, ...]:
        """The ranked plans of ``model`` trained as ``train`` (num_steps = train's)."""
        shape = replace(train, steps=1, tokens=None, deadline_s=None)
        key = (model, shape)
        base = self._cache.get(key)
        if base is None:
            self.misses += 1
            result = plan_job(model, shape, self._gpus, max_gpus=self._max_gpus,
                              runtime=TRACE_RUNTIME, inter_node_bw_gbs=self._inter_bw)
            kept = [p for p in result.plans if p.num_gpus <= self._total[p.gpu_type]]
            base = tuple(replace(p, rank=i) for i, p in enumerate(kept, start=1))
            self._cache[key] = base
            if not base:
                log.warning("%s: no plan fits this cluster (%s)", model.name,
                            result.infeasible or "needs more GPUs of a type than exist")
        steps = train.num_steps
        return tuple(replace(p, num_steps=steps) for p in base)


def job_view(mj: MappedJob, cache: PlanCache) -> JobView:
    """The ``JobView`` a mapped job is submitted as."""
    t = mj.trace
    deadline = t.submit_time + mj.train.deadline_s if mj.train.deadline_s else None
    return JobView(
        id=t.name, submit_time=t.submit_time, plans=cache.plans(mj.model, mj.train),
        total_steps=mj.train.num_steps, model=mj.model, train=mj.train,
        requested_gpus=t.num_gpus, deadline=deadline,
        extra={"size_class": mj.size_class, "application": t.application,
               "gpu_time_s": mj.gpu_time_s},
    )


# -- progress bar -----------------------------------------------------------------------------


class ProgressBar:
    """A one-line progress bar on stderr (only when it is a terminal, unless forced)."""

    def __init__(self, total: int, label: str = "", *, stream: TextIO | None = None,
                 enabled: bool | None = None, width: int = 30) -> None:
        self.total = max(1, total)
        self.label = label
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.width = width
        self._last = -1.0
        self.done = 0

    def update(self, done: int) -> None:
        self.done = done
        if not self.enabled:
            return
        frac = min(1.0, done / self.total)
        if frac - self._last < 0.01 and done < self.total:
            return
        self._last = frac
        fill = int(frac * self.width)
        bar = "#" * fill + "." * (self.width - fill)
        self.stream.write(f"\r{self.label} [{bar}] {frac:4.0%} {done}/{self.total} jobs")
        self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self.stream.write("\n")
            self.stream.flush()


# -- the replay loop ---------------------------------------------------------------------------


@dataclass(slots=True)
class ReplayResult:
    policy: str
    metrics: RunMetrics
    controller: Controller
    collector: MetricsCollector
    backend: SimBackend
    loop: ControlLoop
    records: dict[str, JobRecord]
    """Every job's final record: the ended ones as the Controller retired them (its own table
    keeps only the latest), then those still live when the replay stopped."""
    unfinished: dict[str, str] = field(default_factory=dict)
    """Why each job that did not succeed did not: the reason of its failure or cancellation
    (a rejection, an out-of-memory run no plan survives), or why it was still live when the
    replay ended (never placed: ``ControlLoop.stuck``; or the replay was cut short)."""


def _default_perf() -> PerfModel:
    from scheduler.perf import AnalyticalPerfModel

    return AnalyticalPerfModel()


def replay(
    jobs: Sequence[JobView],
    cluster: ClusterState,
    policy: Policy | str,
    *,
    perf: PerfModel | None = None,
    config: SimConfig = SimConfig(),
    progress: ProgressBar | None = None,
    policy_kwargs: dict[str, Any] | None = None,
    listeners: Sequence[Callable[[JobEvent], None]] = (),
) -> ReplayResult:
    """Run ``jobs`` (submitted at their ``submit_time``) on ``cluster`` under ``policy``;
    ``listeners`` see every job event, after the replay's own."""
    perf = perf or _default_perf()
    err = ErrorModel(config.error, config.error_seed)
    estimator = StepTimeEstimator() if err.active and config.estimator else None
    if isinstance(policy, str):
        kwargs = dict(policy_kwargs or {})
        pol = estimating_policy(policy, kwargs.pop("perf", perf), estimator,
                                correct=config.correct, **kwargs)
    else:
        pol = policy
    clock = VirtualClock(0.0)
    if err.active:
        backend = SimBackend(clock, perf, cluster, launch_delay_s=config.launch_delay_s,
                             restart_delay_s=config.restart_delay_s,
                             progress_every_s=config.progress_every_s,
                             step_factor=err.step_factor, memory_factor=err.memory_factor)
    else:
        backend = SimBackend(clock, perf, cluster, launch_delay_s=config.launch_delay_s,
                             restart_delay_s=config.restart_delay_s)
    collector = MetricsCollector({n.id: n.gpu_type for n in cluster.nodes})
    samples = {j.id: float(j.train.global_batch * j.total_steps) if j.train else 0.0
               for j in jobs}

    def on_submitted(ev: JobEvent) -> None:
        if ev.from_state is None:
            collector.set_samples(ev.job_id, samples[ev.job_id])

    records: dict[str, JobRecord] = {}
    why_not: dict[str, str] = {}

    def on_retired(rec: JobRecord) -> None:
        records[rec.view.id] = rec

    def on_ended(ev: JobEvent) -> None:
        if ev.to_state.terminal and ev.to_state is not JobState.SUCCEEDED:
            why_not[ev.job_id] = f"{ev.to_state.value}: {ev.reason}"

    # Every policy call's timing is kept: the scheduling-overhead figures use all of them.
    sinks: list[Any] = [collector, on_submitted, on_ended]
    if estimator is not None:
        by_id = {j.id: j for j in jobs}
        sinks.append(EstimatorFeed(estimator, perf, by_id.get, backend.inventory))
    sinks.extend(listeners)
    loop = ControlLoop(pol, backend, ListJobSource(jobs), clock, tick_s=config.tick_s,
                       listeners=sinks, retire_listeners=[on_retired],
                       keep_policy_calls=None)
    ctl = loop.controller
    ended = 0

    def on_turn(_loop: ControlLoop) -> None:
        nonlocal ended
        now_ended = ctl.ended.total()
        if progress is not None and now_ended != ended:
            ended = now_ended
            progress.update(ended)

    loop.run_virtual(until_s=config.until_s, max_policy_calls=config.max_policy_calls,
                     on_turn=on_turn if progress is not None else None)
    if progress is not None:
        progress.close()
    records.update((r.view.id, r) for r in ctl.live.values())
    for r in ctl.live.values():
        why_not[r.view.id] = loop.stuck.get(r.view.id) or (
            f"{r.state.value} when the replay stopped at t={clock.now():.0f}s "
            f"(until_s={config.until_s}, max_policy_calls={config.max_policy_calls})")
    metrics = summarize(collector, cluster.total_by_type(), ctl.policy_wall_s)
    return ReplayResult(pol.name, metrics, ctl, collector, backend, loop, records, why_not)


# -- workloads by name ------------------------------------------------------------------------

_NEW_RE = re.compile(r"^newworkload-(\d+)(?:@(\d+))?$")


def load_workloads(spec: str | Path) -> list[tuple[str, list[MappedJob]]]:
    """(label, mapped jobs) per workload a spec names: ``newworkload-<n>[@seed]``,
    ``gavel-<jobs per hour>[@seed]`` (``simulator.gavel``, ``GAVEL_JOBS`` jobs), a trace
    file, a folder, a named trace set or one window of a windowed set (see
    ``simulator.traces.TRACE_SETS`` and ``load_traces``)."""
    m = _NEW_RE.match(str(spec))
    if m:
        n, seed = int(m.group(1)), int(m.group(2) or 0)
        return [(f"newworkload-{n}", new_workload(n, seed=seed))]
    gavel = parse_spec(str(spec))
    if gavel is not None:
        rate, seed = gavel
        return [(str(spec), map_jobs(gavel_jobs(GAVEL_JOBS, rate, seed=seed)))]
    return [(label, map_jobs(trace.jobs)) for label, trace in load_traces(spec)]


# -- many runs, optionally in parallel -------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Task:
    """One replay to run: a workload file/spec (one entry of ``load_workloads``), a cluster,
    a policy."""

    workload: str
    index: int  # which of the spec's workloads
    cluster: str
    scale: int | None
    policy: str
    config: SimConfig = SimConfig()
    max_jobs: int | None = None  # only the first N jobs (quick runs)
    policy_kwargs: tuple[tuple[str, Any], ...] = ()
    """Keyword arguments for the policy's constructor (a variant of it), as pairs."""


_WORKLOADS: dict[str, list[tuple[str, list[MappedJob]]]] = {}


def _workload(spec: str, index: int) -> tuple[str, list[MappedJob]]:
    if spec not in _WORKLOADS:
        _WORKLOADS[spec] = load_workloads(spec)
    return _WORKLOADS[spec][index]


_CACHES: dict[tuple[str, int | None], tuple[ClusterState, PlanCache]] = {}


def run_task(task: Task) -> tuple[Task, str, RunMetrics]:
    """Run one ``Task`` (in this process; plan caches are kept per process and cluster)."""
    from orchestrator.clusters import load_cluster

    key = (task.cluster, task.scale)
    if key not in _CACHES:
        spec = load_cluster(task.cluster, scale=task.scale)
        _CACHES[key] = (spec.state, PlanCache(spec.state, max_gpus=task.config.max_gpus))
    state, cache = _CACHES[key]
    label, mapped = _workload(task.workload, task.index)
    if task.max_jobs is not None:
        mapped = mapped[: task.max_jobs]
    views = [job_view(mj, cache) for mj in mapped]
    t0 = time.perf_counter()
    res = replay(views, state, task.policy, config=task.config,
                 policy_kwargs=dict(task.policy_kwargs) or None)
    log.info("%s %s: %d jobs in %.1fs", label, task.policy, len(views), time.perf_counter() - t0)
    return task, label, res.metrics


def run_tasks(tasks: Sequence[Task], *, workers: int = 1,
              on_done: Callable[[int, int], None] | None = None
              ) -> list[tuple[Task, str, RunMetrics]]:
    """Run tasks, in ``workers`` processes when > 1; results in the order of ``tasks``."""
    results: list[tuple[Task, str, RunMetrics] | None] = [None] * len(tasks)
    if workers <= 1 or len(tasks) <= 1:
        for k, t in enumerate(tasks):
            results[k] = run_task(t)
            if on_done:
                on_done(k + 1, len(tasks))
    else:
        import multiprocessing as mp

        ctx = mp.get_context("fork" if sys.platform.startswith("linux") else "spawn")
        with ctx.Pool(workers) as pool:
            for done, (k, r) in enumerate(pool.imap_unordered(_indexed, list(enumerate(tasks))),
                                          start=1):
                results[k] = r
                if on_done:
                    on_done(done, len(tasks))
    return [r for r in results if r is not None]


def _indexed(item: tuple[int, Task]) -> tuple[int, tuple[Task, str, RunMetrics]]:
    k, t = item
    return k, run_task(t)
