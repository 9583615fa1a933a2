"""Metrics of one replay, computed from the controller's ``JobEvent`` stream.

``MetricsCollector`` is a controller listener: it sees every state change and keeps, per job,
its submission, first grant of GPUs (end of queueing), finish, and the GPU-seconds it held per
GPU type, and how often it was restarted. ``RunMetrics`` summarises a run: average and p99 JCT
over the jobs that finished, how many did not (a policy that never starts a job must not look
faster for it), average queueing time, makespan, GPU utilisation by type, samples/s per job,
checkpoint-restarts per job, scheduling overhead (wall time per policy call: median, p95,
max).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from orchestrator.states import JobEvent, JobState


@dataclass(slots=True)
class JobRecordM:
    """What the collector knows of one job."""

    submit: float
    first_start: float | None = None
    end: float | None = None
    state: JobState = JobState.PENDING
    samples: float = 0.0  # global batch × total steps (set by the replay)
    held_since: float | None = None
    held_gpus: dict[str, int] = field(default_factory=dict)
    restarts: int = 0  # checkpoint-restarts: stops and preemptions of a holder, resizes


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default), q in [0, 100]; NaN when empty."""
    if not values:
        return math.nan
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def json_ready(x: Any, digits: int | None = None) -> Any:
    """``x`` with NaN floats as None (standard JSON), floats rounded to ``digits`` when given,
    tuples as lists; dicts and lists recursively."""
    if isinstance(x, float):
        if math.isnan(x):
            return None
        return x if digits is None else round(x, digits)
    if isinstance(x, dict):
        return {k: json_ready(v, digits) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [json_ready(v, digits) for v in x]
    return x


def is_restart(ev: JobEvent) -> bool:
    """Does ``ev`` cost its job a checkpoint-restart? A holder sent back to the queue
    (stopped or preempted), a running job resized, or a launching one re-targeted (the
    controller counts the same moves in ``JobView.restarts``)."""
    if ev.from_state is None:
        return False
    if ev.from_state == ev.to_state:
        return (ev.to_state.holds_gpus and ev.allocation is not None
                and ev.reason != "progress")
    if ev.to_state is JobState.PENDING:
        return ev.from_state.holds_gpus
    return ev.to_state is JobState.RESIZING


class MetricsCollector:
    """Controller listener accumulating per-job times and per-type GPU-seconds."""

    def __init__(self, gpu_type_of: Mapping[str, str]) -> None:
        self._type_of = dict(gpu_type_of)  # node id -> GPU type
        self.jobs: dict[str, JobRecordM] = {}
        self.busy_gpu_s: dict[str, float] = {}

    def set_samples(self, job_id: str, samples: float) -> None:
        self.jobs[job_id].samples = samples

    def __call__(self, ev: JobEvent) -> None:
        if ev.from_state is None:
            self.jobs[ev.job_id] = JobRecordM(submit=ev.time)
            return
        rec = self.jobs[ev.job_id]
        if ev.from_state == ev.to_state and ev.reason == "progress":
            return
        if is_restart(ev):
            rec.restarts += 1
        self._close(rec, ev.time)
        rec.state = ev.to_state
        if ev.allocation is not None and ev.to_state.holds_gpus:
            if rec.first_start is None:
                rec.first_start = ev.time
            rec.held_since = ev.time
            rec.held_gpus = {}
            for node, n in ev.allocation.placement:
                t = self._type_of[node]
                rec.held_gpus[t] = rec.held_gpus.get(t, 0) + n
        if ev.to_state.terminal:
            rec.end = ev.time

    @property
    def restarts(self) -> int:
        return sum(r.restarts for r in self.jobs.values())

    def _close(self, rec: JobRecordM, now: float) -> None:
        if rec.held_since is None:
            return
        dt = now - rec.held_since
        for t, n in rec.held_gpus.items():
            self.busy_gpu_s[t] = self.busy_gpu_s.get(t, 0.0) + n * dt
        rec.held_since = None
        rec.held_gpus = {}


@dataclass(frozen=True, slots=True)
class RunMetrics:
    """Summary of one replay (times in seconds)."""

    jobs: int
    finished: int
    unfinished: int
    avg_jct_s: float
    p99_jct_s: float
    avg_queue_s: float
    makespan_s: float
    avg_samples_per_s: float
    gpu_util: dict[str, float]
    policy_calls: int
    sched_p50_ms: float
    sched_p95_ms: float
    sched_max_ms: float
    jcts_s: tuple[float, ...] = ()
    restarts: int = 0

    @property
    def restarts_per_job(self) -> float:
        return self.restarts / self.jobs if self.jobs else 0.0

    def as_dict(self, *, with_jcts: bool = False) -> dict[str, Any]:
        d = asdict(self)
        if not with_jcts:
            d.pop("jcts_s")
        return d


def summarize(collector: MetricsCollector, total_by_type: Mapping[str, int],
              policy_wall_s: Sequence[float]) -> RunMetrics:
    """Reduce a finished run to ``RunMetrics``."""
    recs = list(collector.jobs.values())
    done = [r for r in recs if r.state is JobState.SUCCEEDED and r.end is not None]
    jcts = [r.end - r.submit for r in done]  # type: ignore[operator]
    queues = [r.first_start - r.submit for r in done if r.first_start is not None]
    rates = [r.samples / (r.end - r.first_start) for r in done  # type: ignore[operator]
             if r.first_start is not None and r.end is not None and r.end > r.first_start]
    if recs and done:
        start = min(r.submit for r in recs)
        makespan = max(r.end for r in done) - start  # type: ignore[type-var]
    else:
        makespan = 0.0
    util = {
        t: (collector.busy_gpu_s.get(t, 0.0) / (n * makespan) if makespan > 0 else 0.0)
        for t, n in sorted(total_by_type.items())
    }
    ms = [w * 1e3 for w in policy_wall_s]
    return RunMetrics(
        jobs=len(recs),
        finished=len(done),
        unfinished=len(recs) - len(done),
        avg_jct_s=sum(jcts) / len(jcts) if jcts else math.nan,
        p99_jct_s=percentile(jcts, 99),
        avg_queue_s=sum(queues) / len(queues) if queues else math.nan,
        makespan_s=makespan,
        avg_samples_per_s=sum(rates) / len(rates) if rates else math.nan,
        gpu_util=util,
        policy_calls=len(ms),
        sched_p50_ms=percentile(ms, 50),
        sched_p95_ms=percentile(ms, 95),
        sched_max_ms=max(ms) if ms else math.nan,
        jcts_s=tuple(jcts),
        restarts=collector.restarts,
    )


def combine(runs: Sequence[RunMetrics]) -> dict[str, float]:
    """Figures over several workload files of one set: the mean of per-file averages (how
    Sia and Pollux report), p99 over all jobs pooled, the mean makespan; the jobs left
    unfinished and the restarts per job over all files."""
    pooled = [j for r in runs for j in r.jcts_s]
    calls = [r for r in runs if r.policy_calls]

    def mean(xs: list[float]) -> float:
        xs = [x for x in xs if not math.isnan(x)]
        return sum(xs) / len(xs) if xs else math.nan

    return {
        "avg_jct_s": mean([r.avg_jct_s for r in runs]),
        "p99_jct_s": percentile(pooled, 99),
        "avg_queue_s": mean([r.avg_queue_s for r in runs]),
        "makespan_s": mean([r.makespan_s for r in runs]),
        "avg_samples_per_s": mean([r.avg_samples_per_s for r in runs]),
        "unfinished": float(sum(r.unfinished for r in runs)),
        "restarts_per_job": (sum(r.restarts for r in runs) / jobs if (jobs := sum(
            r.jobs for r in runs)) else 0.0),
        "sched_p50_ms": mean([r.sched_p50_ms for r in calls]),
        "sched_p95_ms": mean([r.sched_p95_ms for r in calls]),
    }
