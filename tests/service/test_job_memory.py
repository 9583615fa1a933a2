"""Predicted vs measured memory on a job: a progress report's measured peak and an
out-of-memory re-plan are stored on the job's row, shown in GET /v1/jobs/{id}, and the
correction survives a restart (``stored_view`` applies it to the stored plans again)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from service_builders import Env, job_body

from orchestrator.oom import MEMORY_FACTOR
from orchestrator.states import JobEvent, JobState
from predictor.plan import Plan
from service.app_runtime import stored_view
from service.db import repositories as repo
from service.db.engine import write_session
from service.runner import EventRecorder
from service.settings import Settings


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


@pytest.fixture
def settings(migrated_url: str) -> Settings:
    """Corrections reread on every submission (the default rereads every 30 s)."""
    return Settings(database_url=migrated_url, inventory_ttl_s=0, memory_residual_ttl_s=0)


def test_measured_peaks_correct_later_plans_of_the_same_kind(env: Env) -> None:
    recorder = EventRecorder(env.factory)
    first = None
    for k in range(2):  # two runs measured 20 % above the prediction (MIN_RUNS = 2)
        job = _running(env)
        plan = Plan.from_dict(job["plans"][0])
        first = first or plan
        peak = plan.model_tensors_bytes * 6 // 5
        recorder(JobEvent(job["id"], 1000.0 + k, JobState.RUNNING, JobState.RUNNING,
                          "progress", SimpleNamespace(plan=plan, placement=()),  # type: ignore[arg-type]
                          {"steps_done": 1, "loss": 3.0, "samples_per_s": 16.0,
                           "peak_tensors_bytes": peak, "peak_reserved_bytes": None}))
    assert first is not None
    later = env.client.post("/v1/jobs", json=job_body(), headers=env.headers("alice")).json()
    plans = [Plan.from_dict(p) for p in later["plans"]]
    same = [p for p in plans if p.gpu_type == first.gpu_type]
    other = [p for p in plans if p.gpu_type != first.gpu_type]
    assert same and other
    ratio = (first.model_tensors_bytes * 6 // 5) / first.model_tensors_bytes
    for p in same:
        assert p.memory_factor == pytest.approx(ratio)
        assert "online residual" in p.notes[-1] and "gpt2" in p.notes[-1]
    again = next(p for p in same if p.label() == first.label())
    assert again.memory.activations == round(first.memory.activations * ratio)
    assert again.required_bytes > first.required_bytes
    assert all(p.memory_factor == 1.0 for p in other)  # measured on one GPU type only
