"""A policy that raises inside the service's loop: the round falls back to ``has-paper`` (the
job is still placed), an ``alert`` event naming the policy, the error and the fallback is
stored on the round's jobs, and the loop goes on with the configured policy."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from service_builders import T0, Env, job_body

from orchestrator.backend import VirtualClock
from orchestrator.backends.sim import SimBackend
from orchestrator.loop import ControlLoop
from scheduler.cluster import ClusterState
from scheduler.decision import Decision
from scheduler.job import JobView, RunningJob
from scheduler.perf import AnalyticalPerfModel
from scheduler.policy import make_policy
from service.api.inventory import DbClusterProvider
from service.app_runtime import AlertRecorder, DbJobSource, WakeRunner
from service.runner import EventRecorder


class FailsOnce:
    """``has``, except that its first call raises."""

    name = "fails-once"

    def __init__(self) -> None:
        self.inner = make_policy("has")
        self.calls = 0

    def decide(self, state: ClusterState, pending: Sequence[JobView],
               running: Sequence[RunningJob], now: float) -> list[Decision]:
        self.calls += 1
        if self.calls == 1:
            raise RuntimeError("bookings out of order")
        return self.inner.decide(state, pending, running, now)


def test_policy_failure_is_recorded_as_an_alert_event(make_env: Callable[..., Env]) -> None:
    env = make_env(runner=WakeRunner())
    clock = VirtualClock(T0.timestamp())
    state = DbClusterProvider(env.factory)().state
    backend = SimBackend(clock, AnalyticalPerfModel(), state, launch_delay_s=0,
                         restart_delay_s=0)
    recorder = EventRecorder(env.factory)
    policy = FailsOnce()
    loop = ControlLoop(policy, backend, DbJobSource(env.factory), clock,  # type: ignore[arg-type]
                       listeners=[recorder], alert_listeners=[AlertRecorder(env.factory)],
                       around_turn=recorder.batched, tick_s=None)
    h = env.headers("alice")
    job_id = env.client.post("/v1/jobs", json=job_body(), headers=h).json()["id"]
    loop.step()
    assert env.client.get(f"/v1/jobs/{job_id}", headers=h).json()["state"] == "starting"
    events = env.client.get(f"/v1/jobs/{job_id}/events", headers=h).json()["data"]
    alert = next(e for e in events if e["kind"] == "alert")
    assert alert["data"] == {"policy": "fails-once", "error": "RuntimeError: bookings out of "
                             "order", "fallback": "has-paper", "jobs_in_round": 1}
    assert "fails-once failed" in alert["message"] and "has-paper" in alert["message"]
    assert alert["state"] == "pending"  # the job's state when the round failed
    loop.run_virtual()  # later rounds: the configured policy again, no more alerts
    assert policy.calls >= 2 and loop.controller.policy_failures == 1
    job = env.client.get(f"/v1/jobs/{job_id}", headers=h).json()
    assert job["state"] == "succeeded"
    events = env.client.get(f"/v1/jobs/{job_id}/events", headers=h).json()["data"]
    assert [e["kind"] for e in events].count("alert") == 1
