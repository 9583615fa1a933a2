"""Predicted vs measured memory on a job: a progress report's measured peak and an
out-of-memory re-plan are stored on the job's row, shown in GET /v1/jobs/{id}, and the
correction survives a restart (``stored_view`` applies it to the stored plans again)."""

from __future__ import annotations

from types import SimpleNamespace

from service_builders import Env, job_body

from orchestrator.oom import MEMORY_FACTOR
from orchestrator.states import JobEvent, JobState
from predictor.plan import Plan
from service.app_runtime import stored_view
from service.db import repositories as repo
from service.db.engine import write_session
from service.runner import EventRecorder


def _running(env: Env) -> dict:
    job = env.client.post("/v1/jobs", json=job_body(), headers=env.headers("alice")).json()
    with write_session(env.factory) as s:
        row = repo.get_job(session=s, job_id=job["id"], for_update=True)
        for to in (JobState.PLACED, JobState.STARTING, JobState.RUNNING):
            repo.transition_job(session=s, job=row, to=to, reason="test", now=env.clock())
    return job


def test_a_measured_peak_shows_beside_the_plans_prediction(env: Env) -> None:
    job = _running(env)
    plan = Plan.from_dict(job["plans"][0])
    alloc = SimpleNamespace(plan=plan, placement=())
    predicted = plan.model_tensors_bytes  # a CPU rank has no cuBLAS workspace
    recorder = EventRecorder(env.factory)
    # two reports of the same plan: the larger peak is kept; 25 % above the prediction
    for step, peak in ((5, predicted), (10, predicted * 5 // 4)):
        recorder(JobEvent(job["id"], 1000.0 + step, JobState.RUNNING, JobState.RUNNING,
                          "progress", alloc,  # type: ignore[arg-type]
                          {"steps_done": step, "loss": 3.0, "samples_per_s": 16.0,
                           "peak_tensors_bytes": peak, "peak_reserved_bytes": None}))
    got = env.client.get(f"/v1/jobs/{job['id']}", headers=env.headers("alice")).json()
    mem = got["memory"]
    assert mem["measured_tensors_bytes"] == predicted * 5 // 4
    assert mem["predicted_tensors_bytes"] == predicted
    assert mem["error_pct"] == 100.0 * (predicted * 5 // 4 - predicted) / predicted
    assert mem["source"] == "cpu-tracker" and mem["plan"] == plan.label()
    assert mem["memory_factor"] == 1.0 and mem["out_of_memory_runs"] == 0
    latest = got["metrics"]["latest"]
    assert latest["memory_bytes"] == predicted * 5 // 4
    assert latest["predicted_memory_bytes"] == predicted


def test_an_out_of_memory_correction_is_shown_and_restored_after_a_restart(env: Env) -> None:
    job = _running(env)
    recorder = EventRecorder(env.factory)
    recorder(JobEvent(job["id"], 1010.0, JobState.RUNNING, JobState.PENDING,
                      "out of memory, re-planned", None,
                      {"steps_done": 4, "held_bytes": 3_000_000, "cap_bytes": 2_900_000,
                       "memory_factor": 1.5}))
    got = env.client.get(f"/v1/jobs/{job['id']}", headers=env.headers("alice")).json()
    assert got["state"] == "pending" and got["progress"]["steps_done"] == 4
    mem = got["memory"]
    assert mem["memory_factor"] == 1.5 and mem["out_of_memory_runs"] == 1
    assert "3,000,000" in mem["last_out_of_memory"] and "2,900,000" in mem["last_out_of_memory"]
    with env.factory() as s:
        row = repo.get_job(session=s, job_id=job["id"], with_plans=True)
        view = stored_view(row)
        stored = [Plan.from_dict(p) for p in row.plans]
    assert not isinstance(view, str)
    assert view.extra[MEMORY_FACTOR] == 1.5
    for before, after in zip(stored, view.plans, strict=True):
        assert after.memory.activations == round(before.memory.activations * 1.5)
        assert after.memory.overhead == before.memory.overhead  # outside the allocator
        assert after.required_bytes > before.required_bytes
        assert "out-of-memory" in after.notes[-1]
