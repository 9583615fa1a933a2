"""Test doubles for the orchestrator: a FIFO policy, a recording backend, plan builders."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import replace

from orchestrator.backend import BackendEvent, EventSink
from predictor.gpus import get_gpu
from predictor.plan import Plan
from predictor.planner import plan_job
from predictor.spec import ModelSpec, TrainingSpec
from scheduler.cluster import Allocation, ClusterState, Node, Placement
from scheduler.decision import Decision, start
from scheduler.job import JobView, RunningJob

GIB = 1 << 30


@functools.lru_cache(maxsize=8)
def _base_plan(gpu_type: str) -> Plan:
    res = plan_job(ModelSpec.from_name("gpt2"), TrainingSpec(global_batch=8, seq_len=256, steps=1),
                   [get_gpu(gpu_type)], max_gpus=4)
    return next(p for p in res.plans if p.num_gpus == 1)


def plan(gpu_type: str = "A100-40G", gpus: int = 1, step_s: float = 2.0, steps: int = 100) -> Plan:
    """A plan of ``gpus`` GPUs with an exact step time (the parallel layout is only a label)."""
    base = _base_plan(gpu_type)
    par = replace(base.parallel, dp=gpus)
    return replace(base, parallel=par, step=replace(base.step, total_s=step_s), num_steps=steps)


def job(job_id: str, *, t: float = 0.0, steps: int = 100, step_s: float = 2.0, gpus: int = 1,
        gpu_type: str = "A100-40G") -> JobView:
    return JobView(id=job_id, submit_time=t, plans=(plan(gpu_type, gpus, step_s, steps),),
                   total_steps=steps)


def cluster(*sizes: int, gpu_type: str = "A100-40G") -> ClusterState:
    return ClusterState(tuple(
        Node(f"n{i}", gpu_type, 40 * GIB, s, s, "nvlink") for i, s in enumerate(sizes)))


class IdentityPerf:
    """PerfModel stub: a plan runs at its planned speed wherever it is placed."""

    def placed_plan(self, job: JobView, plan: Plan, placement: Placement,
                    state: ClusterState) -> Plan:
        return plan


class FifoPolicy:
    """First come, first served: the first plan whose GPU count fits one node, no backfill."""

    name = "fifo"

    def decide(self, state: ClusterState, pending: Sequence[JobView],
               running: Sequence[RunningJob], now: float) -> list[Decision]:
        free = {n.id: n.free_gpus for n in state.nodes}
        out = []
        for j in pending:
            p = j.plans[0]
            node = next((n for n in state.nodes if n.gpu_type == p.gpu_type
                         and free[n.id] >= p.num_gpus), None)
            if node is None:
                break
            free[node.id] -= p.num_gpus
            out.append(start(Allocation(j.id, p, ((node.id, p.num_gpus),)), "fifo: fits"))
        return out


class ScriptedPolicy:
    """Returns pre-set decisions once each call (then nothing)."""

    name = "scripted"

    def __init__(self) -> None:
        self.next: list[Decision] = []
        self.calls = 0

    def decide(self, state, pending, running, now):  # type: ignore[no-untyped-def]
        self.calls += 1
        out, self.next = self.next, []
        return out


class RecordingBackend:
    """Backend that records commands; tests push events by hand through ``sink``."""

    def __init__(self) -> None:
        self.sink: EventSink | None = None
        self.commands: list[tuple[str, str]] = []
        self.progress: dict[str, float] = {}

    def connect(self, sink: EventSink) -> None:
        self.sink = sink

    def emit(self, ev: BackendEvent) -> None:
        assert self.sink is not None
        self.sink(ev)

    def start(self, job: JobView, allocation: Allocation) -> None:
        self.commands.append(("start", job.id))

    def stop(self, job_id: str, reason: str) -> float:
        self.commands.append(("stop", job_id))
        return self.progress.get(job_id, 0.0)

    def resize(self, job: JobView, allocation: Allocation) -> float:
        self.commands.append(("resize", job.id))
        return self.progress.get(job.id, 0.0)

    def cancel(self, job_id: str) -> None:
        self.commands.append(("cancel", job_id))

    def steps_done(self, job_id: str) -> float:
        return self.progress.get(job_id, 0.0)
