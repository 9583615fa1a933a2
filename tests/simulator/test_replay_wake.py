"""The replay honours a policy's ``wake_at``: with nothing else happening, the controller is
asked again at the time the policy named (as the service's periodic tick would)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from orchestrator.clusters import load_cluster
from scheduler.cluster import Allocation, ClusterState
from scheduler.decision import Decision, start
from scheduler.job import JobView, RunningJob
from scheduler.placement import FreeGpus
from simulator.mapping import map_jobs
from simulator.replay import PlanCache, job_view, replay
from simulator.traces import load_trace

DATA = Path(__file__).parent / "data"


class StartAt:
    """Starts every waiting job on its first-ranked plan, but not before ``at``; until then
    it asks to be woken at ``at``."""

    name = "start-at"

    def __init__(self, at: float) -> None:
        self.at = at
        self.wake_at: float | None = None
        self.calls: list[float] = []

    def decide(self, state: ClusterState, pending: Sequence[JobView],
               running: Sequence[RunningJob], now: float) -> list[Decision]:
        self.calls.append(now)
        if now < self.at:
            self.wake_at = self.at
            return []
        self.wake_at = None
        free = FreeGpus.from_state(state)
        out = []
        for job in pending:
            plan = job.plans[0]
            placement = free.best_fit(plan.gpu_type, plan.num_gpus, plan.required_bytes,
                                      plan.parallel.tp)
            if placement is not None:
                free.take(placement)
                out.append(start(Allocation(job.id, plan, placement), "test"))
        return out


def test_replay_calls_the_policy_again_when_it_asked() -> None:
    state = load_cluster("phoebe").state
    cache = PlanCache(state)
    mapped = map_jobs(load_trace(DATA / "golden_trace.csv").jobs)[:1]  # bert-0, t = 206.6 s
    view = job_view(mapped[0], cache)
    policy = StartAt(at=1_000.0)
    res = replay([view], state, policy)
    # called on the arrival, then at the wake-up (nothing else happens in between)
    assert policy.calls[:2] == [view.submit_time, 1_000.0]
    rec = res.collector.jobs[view.id]
    assert rec.first_start == 1_000.0 and res.metrics.finished == 1
