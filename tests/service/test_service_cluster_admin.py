"""Cluster occupancy, admin statistics, and the Controller's events persisted by
``EventRecorder`` (including a real Controller over the simulated backend)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import pytest
from service_builders import T0, Env, job_body

from orchestrator.backend import VirtualClock
from orchestrator.backends.sim import SimBackend
from orchestrator.loop import ControlLoop
from orchestrator.states import JobEvent, JobState
from predictor.gpus import get_gpu
from predictor.plan import Plan
from predictor.planner import plan_job
from predictor.spec import ModelSpec, TrainingSpec
from scheduler.cluster import Allocation
from scheduler.perf import AnalyticalPerfModel
from scheduler.policy import make_policy
from service.api.inventory import DbClusterProvider
from service.app_runtime import DbJobSource, WakeRunner
from service.db import repositories as repo
from service.db.engine import write_session
from service.runner import EventRecorder, resume_view


def _plan() -> Plan:
    result = plan_job(ModelSpec.from_name("gpt2"), TrainingSpec(global_batch=32, seq_len=1024),
                      [get_gpu("A100-80G")], max_gpus=4)
    return next(p for p in result.plans if p.num_gpus == 4)


def _recorder(env: Env) -> EventRecorder:
    return EventRecorder(env.factory, to_datetime=lambda s: T0 + timedelta(seconds=s))


def test_events_move_state_allocations_and_cluster(env: Env) -> None:
    job_id = env.client.post("/v1/jobs", json=job_body(), headers=env.headers("alice")).json()["id"]
    plan = _plan()
    alloc = Allocation(job_id, plan, (("a100-0", 2), ("a100-1", 2)))
    rec = _recorder(env)
    rec(JobEvent(job_id, 10, JobState.PENDING, JobState.PLACED, "best fit", alloc))
    rec(JobEvent(job_id, 11, JobState.PLACED, JobState.STARTING, "launch requested", alloc))
    rec(JobEvent(job_id, 20, JobState.STARTING, JobState.RUNNING, "workers running", alloc))
    rec(JobEvent(job_id, 50, JobState.RUNNING, JobState.RUNNING, "progress", alloc,
                 {"steps_done": 40.0}))

    h = env.headers("alice")
    job = env.client.get(f"/v1/jobs/{job_id}", headers=h).json()
    assert job["state"] == "running" and job["state_reason"] == "workers running"
    assert job["chosen_plan"]["rank"] == plan.rank and job["chosen_plan"]["num_gpus"] == 4
    assert sorted((a["node_id"], a["gpus"]) for a in job["allocation"]) == [
        ("a100-0", 2), ("a100-1", 2)]
    assert job["progress"]["steps_done"] == 40.0 and job["progress"]["fraction"] == 0.4
    assert job["placed_at"] is not None and job["started_at"] is not None

    cluster = env.client.get("/v1/cluster", headers=env.headers("admin")).json()
    nodes = {n["id"]: n for n in cluster["nodes"]}
    assert nodes["a100-0"]["free_gpus"] == 6 and nodes["a100-0"]["holders"] == [
        {"job_id": job_id, "gpus": 2}]
    assert nodes["l40s-0"]["free_gpus"] == 4 and nodes["l40s-0"]["holders"] == []
    types = {t["name"]: t for t in cluster["gpu_types"]}
    assert types["A100-80G"]["total_gpus"] == 16 and types["A100-80G"]["used_gpus"] == 4
    assert cluster["total_gpus"] == 20 and cluster["free_gpus"] == 16
    assert cluster["jobs"][0]["job_id"] == job_id

    # restart view: the running job and where it holds GPUs
    with env.factory() as s:
        [(row, held)] = resume_view(s)
    assert row.id == job_id and sorted(held) == [("a100-0", 2), ("a100-1", 2)]

    # the user cancels; a late "finished" report does not resurrect the job
    env.client.post(f"/v1/jobs/{job_id}/cancel", headers=h)
    rec(JobEvent(job_id, 90, JobState.RUNNING, JobState.SUCCEEDED, "all steps done"))
    job = env.client.get(f"/v1/jobs/{job_id}", headers=h).json()
    assert job["state"] == "cancelled" and job["allocation"] == []
    assert env.client.get("/v1/cluster", headers=h).json()["free_gpus"] == 20
    kinds = [e["kind"] for e in env.client.get(f"/v1/jobs/{job_id}/events", headers=h).json()[
        "data"]]
    assert kinds == ["submitted", "placed", "starting", "running", "cancelled", "succeeded"]
    last = env.client.get(f"/v1/jobs/{job_id}/events", headers=h).json()["data"][-1]
    assert last["state"] == "cancelled" and "ignored_transition" in last["data"]


def test_admin_stats(env: Env) -> None:
    h = env.headers("alice")
    done = env.client.post("/v1/jobs", json=job_body(deadline_s=600), headers=h).json()["id"]
    late = env.client.post("/v1/jobs", json=job_body(deadline_s=60), headers=h).json()["id"]
    env.client.post("/v1/jobs", json=job_body(), headers=h)  # stays queued
    plan = _plan()
    rec = _recorder(env)
    # both run on 4 A100s (of 16) from t=60 s to t=360 s
    for job_id, node in ((done, "a100-0"), (late, "a100-1")):
        alloc = Allocation(job_id, plan, ((node, 4),))
        rec(JobEvent(job_id, 60, JobState.PENDING, JobState.PLACED, "fit", alloc))
        rec(JobEvent(job_id, 61, JobState.PLACED, JobState.STARTING, "launch", alloc))
        rec(JobEvent(job_id, 62, JobState.STARTING, JobState.RUNNING, "running", alloc))
        rec(JobEvent(job_id, 360, JobState.RUNNING, JobState.SUCCEEDED, "all steps done"))
    env.clock.advance(600)

    assert env.client.get("/v1/admin/stats", headers=h).status_code == 403
    r = env.client.get("/v1/admin/stats?window_s=600&buckets=2", headers=env.headers("admin"))
    assert r.status_code == 200, r.text
    s = r.json()
    assert s["queue_length"] == 1
    assert s["jobs_by_state"]["succeeded"] == 2 and s["jobs_by_state"]["pending"] == 1
    assert abs(s["avg_jct_s"] - 360) < 1e-6 and abs(s["avg_queueing_s"] - 60) < 1e-6
    assert s["deadline"] == {"jobs": 2, "met": 1, "hit_rate": 0.5}
    a100 = next(u for u in s["utilisation"] if u["gpu_type"] == "A100-80G")
    # 8 of 16 GPUs busy for 240 s of the first 300 s bucket, 60 s of the second
    assert [round(p["used_fraction"], 6) for p in a100["series"]] == [0.4, 0.1]
    l40s = next(u for u in s["utilisation"] if u["gpu_type"] == "L40S")
    assert l40s["mean"] == 0.0


def test_control_loop_wired_to_the_database(make_env: Callable[..., Env]) -> None:
    """The service's wiring of the one loop: ``ControlLoop`` (HAS over the simulated
    backend) reading submissions from the database (``DbJobSource``, the plans the API
    stored) and its events persisted by ``EventRecorder``: a submission is placed on the
    plan the API ranked and runs to the end; a cancellation the API records is passed on."""
    env = make_env(runner=WakeRunner())
    clock = VirtualClock(T0.timestamp())
    state = DbClusterProvider(env.factory)().state
    backend = SimBackend(clock, AnalyticalPerfModel(), state, launch_delay_s=0,
                         restart_delay_s=0)
    recorder = EventRecorder(env.factory)
    loop = ControlLoop(make_policy("has"), backend, DbJobSource(env.factory), clock,
                       listeners=[recorder], around_turn=recorder.batched, tick_s=None)

    h = env.headers("alice")
    r = env.client.post("/v1/jobs", json=job_body(), headers=h)
    assert r.status_code == 201, r.text
    job_id = r.json()["id"]
    # every stored plan, not the response's first few: on an idle cluster HAS may start the
    # job wide, on a faster ranked plan further down the list
    stored = env.client.get(f"/v1/jobs/{job_id}?plans=all", headers=h).json()["plans"]
    loop.step()
    job = env.client.get(f"/v1/jobs/{job_id}", headers=h).json()
    assert job["state"] == "starting" and job["chosen_plan"] is not None
    chosen = job["chosen_plan"]
    assert any(p["rank"] == chosen["rank"] and p["gpu_type"] == chosen["gpu_type"]
               and p["num_gpus"] == chosen["num_gpus"] for p in stored)
    assert sum(a["gpus"] for a in job["allocation"]) == chosen["num_gpus"]
    loop.run_virtual()
    job = env.client.get(f"/v1/jobs/{job_id}", headers=h).json()
    assert job["state"] == "succeeded" and job["allocation"] == []
    assert job["progress"]["steps_done"] == 100
    with env.factory() as s:
        assert repo.live_jobs(session=s) == []

    # a cancellation recorded by the API reaches the loop, which frees the GPUs
    other = env.client.post("/v1/jobs", json=job_body(training={
        "global_batch": 32, "seq_len": 1024, "steps": 100_000}), headers=h).json()["id"]
    loop.step()
    assert loop.controller.job(other).state.holds_gpus
    assert env.client.post(f"/v1/jobs/{other}/cancel", headers=h).status_code == 200
    loop.step()
    assert loop.controller.job(other).state is JobState.CANCELLED
    assert loop.controller.cluster.free_gpus == loop.controller.cluster.total_gpus


def test_event_for_unknown_job_is_dropped(env: Env) -> None:
    _recorder(env)(JobEvent("ghost", 1, JobState.PENDING, JobState.PLACED, "x"))
    assert env.count("events") == 0
    with write_session(env.factory) as s:
        assert repo.active_allocations(session=s) == []


@pytest.mark.parametrize(("per_transaction", "hold_s", "transactions"),
                         [(1, 60.0, 9), (3, 60.0, 3), (100, 60.0, 1), (100, 1.0, 9),
                          (100, 2.0, 5), (3, 2.0, 5)])
def test_batched_events_of_several_jobs(env: Env, monkeypatch: pytest.MonkeyPatch,
                                        per_transaction: int, hold_s: float,
                                        transactions: int) -> None:
    """``EventRecorder.batched``: two jobs' whole lives written at the end of the block,
    ``per_transaction`` events per transaction (their rows read once per transaction),
    a transaction ending early once it ran ``hold_s`` (a stand-in clock: 1 s per event),
    end as the same rows and event logs as event-by-event writing. 9 events: in 9, 3
    (3+3+3), 1, 9 (1 s each: past 1 s after each), 5 (2+2+2+2+1) and 5 transactions."""
    import service.runner as runner_module

    h = env.headers("alice")
    ids = [env.client.post("/v1/jobs", json=job_body(), headers=h).json()["id"]
           for _ in range(2)]
    plan = _plan()
    opened = [0]
    real_write_session = runner_module.write_session

    def counting_write_session(factory):  # type: ignore[no-untyped-def]
        opened[0] += 1
        return real_write_session(factory)

    monkeypatch.setattr(runner_module, "write_session", counting_write_session)
    now = [0.0]
    real_apply = EventRecorder.apply

    def apply_taking_a_second(self, **kw):  # type: ignore[no-untyped-def]
        now[0] += 1.0
        return real_apply(self, **kw)

    monkeypatch.setattr(EventRecorder, "apply", apply_taking_a_second)
    rec = EventRecorder(env.factory, to_datetime=lambda s: T0 + timedelta(seconds=s),
                        max_events_per_transaction=per_transaction, max_hold_s=hold_s,
                        clock=lambda: now[0])
    with rec.batched():
        for job_id, node in zip(ids, ("a100-0", "a100-1"), strict=True):
            alloc = Allocation(job_id, plan, ((node, 4),))
            rec(JobEvent(job_id, 10, JobState.PENDING, JobState.PLACED, "fit", alloc))
            rec(JobEvent(job_id, 11, JobState.PLACED, JobState.STARTING, "launch", alloc))
            rec(JobEvent(job_id, 12, JobState.STARTING, JobState.RUNNING, "running", alloc))
            rec(JobEvent(job_id, 30, JobState.RUNNING, JobState.RUNNING, "progress", alloc,
                         {"steps_done": 25.0}))
        # nothing is written before the block ends
        assert env.client.get(f"/v1/jobs/{ids[0]}", headers=h).json()["state"] == "pending"
        rec(JobEvent(ids[0], 60, JobState.RUNNING, JobState.SUCCEEDED, "all steps done"))
    assert opened == [transactions]
    first, second = (env.client.get(f"/v1/jobs/{i}", headers=h).json() for i in ids)
    assert first["state"] == "succeeded" and first["allocation"] == []
    assert first["progress"]["steps_done"] == 100.0
    assert second["state"] == "running" and second["progress"]["steps_done"] == 25.0
    assert [(a["node_id"], a["gpus"]) for a in second["allocation"]] == [("a100-1", 4)]
    kinds = {i: [e["kind"] for e in env.client.get(f"/v1/jobs/{i}/events", headers=h).json()[
        "data"]] for i in ids}
    assert kinds[ids[0]] == ["submitted", "placed", "starting", "running", "succeeded"]
    assert kinds[ids[1]] == ["submitted", "placed", "starting", "running"]
    assert env.client.get("/v1/cluster", headers=h).json()["free_gpus"] == 16
