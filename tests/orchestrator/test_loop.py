"""ControlLoop over SimBackend on a virtual clock: the fail-safe (a policy that raises), nodes
joining and leaving, cancellations from the source, the end of a replay whose waiting jobs
no round will place. Times worked by hand from the
simulator's model: finish = start + launch delay (+ restore delay when resuming) +
remaining steps x step time."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence

import pytest
from orch_fakes import GIB, FifoPolicy, IdentityPerf, cluster, job

from orchestrator.backend import VirtualClock
from orchestrator.backends.sim import SimBackend
from orchestrator.controller import PolicyAlert
from orchestrator.loop import ControlLoop, ListJobSource
from orchestrator.states import JobEvent, JobState
from scheduler.cluster import ClusterState, Node
from scheduler.decision import Decision
from scheduler.job import JobView, RunningJob


class RaisingPolicy(FifoPolicy):
    """FIFO, except that it raises whenever job ``bad`` is in the queue."""

    name = "raising"

    def __init__(self, bad: str = "b") -> None:
        self.bad = bad
        self.calls = 0

    def decide(self, state: ClusterState, pending: Sequence[JobView],
               running: Sequence[RunningJob], now: float) -> list[Decision]:
        self.calls += 1
        if any(j.id == self.bad for j in pending):
            raise ValueError(f"cannot handle {self.bad} at {now:g}")
        return super().decide(state, pending, running, now)


def make(jobs: Sequence[JobView], state: ClusterState, policy: object = None, *,
         tick_s: float | None = None,
         **kw: object) -> tuple[ControlLoop, SimBackend, VirtualClock, list[JobEvent],
                                list[PolicyAlert]]:
    clock = VirtualClock()
    be = SimBackend(clock, IdentityPerf(), state, launch_delay_s=10, restart_delay_s=60)
    events: list[JobEvent] = []
    alerts: list[PolicyAlert] = []
    loop = ControlLoop(policy or FifoPolicy(), be, ListJobSource(jobs), clock,  # type: ignore[arg-type]
                       listeners=[events.append], alert_listeners=[alerts.append],
                       tick_s=tick_s, **kw)  # type: ignore[arg-type]
    return loop, be, clock, events, alerts


def test_a_raising_policy_drops_its_round_alerts_and_has_paper_decides(
        caplog: pytest.LogCaptureFixture) -> None:
    policy = RaisingPolicy()
    jobs = [job("a", t=0, steps=100, step_s=2.0), job("b", t=50, steps=100, step_s=2.0)]
    loop, _be, _clock, events, alerts = make(jobs, cluster(4), policy)
    with caplog.at_level(logging.ERROR, logger="orchestrator.controller"):
        loop.run_virtual()
    ctl = loop.controller
    # a: placed at 0, runs from 10, 100 x 2 s -> 210. b: its round (t=50) failed and the
    # fallback placed it then: runs from 60 -> 260. The loop went on to the end.
    assert ctl.job("a").end_time == 210.0 and ctl.job("b").end_time == 260.0
    assert ctl.job("b").first_start == 50.0
    assert all(r.state is JobState.SUCCEEDED for r in ctl.jobs.values())
    assert len(alerts) == 1 and ctl.policy_failures == 1 and list(ctl.alerts) == alerts
    alert = alerts[0]
    assert (alert.time, alert.policy, alert.fallback) == (50.0, "raising", "has-paper")
    assert alert.error == "ValueError: cannot handle b at 50"
    assert alert.job_ids == ("b", "a")  # the queue, then the running jobs
    assert "raising failed" in alert.message and "has-paper" in alert.message
    placed_b = next(e for e in events if e.job_id == "b" and e.to_state is JobState.PLACED)
    assert placed_b.time == 50.0
    # the rounds after it went back to the configured policy (t=60 Started b, 210, 260)
    assert policy.calls >= 4
    # the log holds the round's inputs as one JSON line, enough to rebuild the call
    line = next(r.getMessage() for r in caplog.records if "replay inputs" in r.getMessage())
    record = json.loads(line.split(": ", 1)[1])
    assert record["now"] == 50.0
    assert [j["id"] for j in record["pending"]] == ["b"]
    assert [j["id"] for j in record["running"]] == ["a"]
    assert record["running"][0]["allocation"]["placement"] == [["n0", 1]]
    assert [(n["id"], n["free_gpus"]) for n in record["nodes"]] == [("n0", 3)]
    assert record["pending"][0]["plans"][0]["num_gpus"] == 1
    # ... and the kept alert replays the very call
    with pytest.raises(ValueError, match="cannot handle b at 50"):
        alert.replay(RaisingPolicy())
    assert [d.job_id for d in alert.replay(FifoPolicy())] == ["b"]


def test_when_the_fallback_fails_too_the_round_is_dropped_and_the_loop_goes_on() -> None:
    jobs = [job("b", t=0, steps=10, step_s=1.0)]
    loop, _be, _clock, _events, alerts = make(jobs, cluster(4), RaisingPolicy(),
                                              fallback=RaisingPolicy())
    loop.run_virtual()  # returns: nothing can happen any more
    assert loop.controller.job("b").state is JobState.PENDING
    assert alerts and all(a.fallback is None for a in alerts)
    assert "dropped" in alerts[0].message


def test_a_node_of_a_new_gpu_type_joins_and_the_queued_job_starts_on_it() -> None:
    big = job("big", t=0, steps=100, step_s=2.0, gpu_type="A100-80G")
    loop, be, clock, _events, _ = make([big], cluster(2))
    loop.step(0.0)
    assert loop.controller.job("big").state is JobState.PENDING  # no A100-80G yet
    clock.advance_to(5.0)
    be.add_node(Node("n-80g", "A100-80G", 80 * GIB, 4, 4, "nvlink"))
    loop.step()  # the turn reads the inventory: nobody tells the loop
    rec = loop.controller.job("big")
    assert rec.state is JobState.STARTING and rec.allocation is not None
    assert rec.allocation.placement == (("n-80g", 1),)
    assert loop.stats.inventory_changes == 1
    loop.run_virtual()
    assert loop.controller.job("big").end_time == 5.0 + 10 + 100 * 2.0


def test_a_node_leaves_under_a_running_job_which_resumes_elsewhere() -> None:
    a = job("a", t=0, steps=100, step_s=2.0, gpus=2)
    loop, be, clock, events, _ = make([a], cluster(2, 2))
    loop.step(0.0)
    assert loop.controller.job("a").allocation.placement == (("n0", 2),)  # type: ignore[union-attr]
    clock.advance_to(110.0)  # (110 - 10) / 2 = 50 steps made
    be.remove_node("n0")
    loop.step()
    requeued = next(e for e in events if e.job_id == "a" and e.to_state is JobState.PENDING
                    and e.from_state is not None)
    assert requeued.time == 110.0 and requeued.reason == "preempted: node n0 left the cluster"
    assert requeued.data["steps_done"] == pytest.approx(50.0)
    rec = loop.controller.job("a")
    assert rec.allocation is not None and rec.allocation.placement == (("n1", 2),)
    assert set(loop.controller.cluster.by_id) == {"n1"}
    loop.run_virtual()
    # relaunched at 110: + 10 launch + 60 restore = 180, then 50 steps x 2 s -> 280
    rec = loop.controller.job("a")
    assert rec.state is JobState.SUCCEEDED and rec.end_time == 280.0 and rec.view.restarts == 1
    assert loop.controller.cluster.free_gpus == 2


def test_cancellations_from_the_source_free_the_gpus() -> None:
    source_jobs = [job("a", t=0, steps=100, step_s=2.0, gpus=4), job("b", t=0, gpus=4)]
    loop, _be, clock, _events, _ = make(source_jobs, cluster(4))
    loop.step(0.0)
    assert loop.controller.job("b").state is JobState.PENDING
    clock.advance_to(30.0)
    loop.source.cancel("a", "user changed their mind")  # type: ignore[attr-defined]
    loop.step()
    assert loop.controller.job("a").state is JobState.CANCELLED
    assert loop.controller.job("b").state is JobState.STARTING  # took the freed GPUs at 30
    assert loop.stats.cancelled == 1


class BookedLate(FifoPolicy):
    """FIFO from ``at`` on; before that it keeps every job waiting for its booked start
    (``holds_until``), as a deadline policy booking a late start does."""

    name = "booked-late"

    def __init__(self, at: float) -> None:
        self.at = at
        self.holds_until: float | None = None
        self.calls: list[float] = []

    def decide(self, state: ClusterState, pending: Sequence[JobView],
               running: Sequence[RunningJob], now: float) -> list[Decision]:
        self.calls.append(now)
        if now < self.at:
            self.holds_until = self.at
            return []
        self.holds_until = None
        return super().decide(state, pending, running, now)


def test_with_ticks_a_job_no_round_places_on_the_idle_cluster_ends_the_loop() -> None:
    # FIFO on the first plan: 8 GPUs, the cluster has 4. Called at the arrival (t = 30) and
    # at the next tick (t = 600); both rounds see an idle cluster with nothing to come.
    loop, _be, clock, _events, _ = make([job("big", t=30, gpus=8)], cluster(4), tick_s=600.0)
    loop.run_virtual()
    assert clock.now() == 600.0 and loop.controller.policy_call_count == 2
    assert loop.controller.job("big").state is JobState.PENDING
    assert loop.stuck == {"big": (
        "never placed: at t=600s the cluster was idle with nothing more to arrive or happen "
        "and fifo placed it in no round; 1 plan(s), its smallest plan needs 8xA100-40G "
        f"({job('big', gpus=8).plans[0].required_bytes / GIB:.3g} GiB each)")}


def test_a_job_waiting_for_its_booked_start_is_not_stuck() -> None:
    # booked from t = 2000: the ticks at 600, 1200, 1800 place nothing, 2400 starts it;
    # done at 2400 + 10 launch + 100 steps x 2 s = 2610
    policy = BookedLate(at=2_000.0)
    loop, _be, _clock, _events, _ = make([job("a", t=0)], cluster(4), policy, tick_s=600.0)
    loop.run_virtual()
    assert policy.calls[:5] == [0.0, 600.0, 1200.0, 1800.0, 2400.0]
    rec = loop.controller.job("a")
    assert rec.state is JobState.SUCCEEDED and rec.end_time == 2610.0
    assert loop.stuck == {}
