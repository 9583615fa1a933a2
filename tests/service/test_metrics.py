"""``/metrics``: Prometheus text with the queue, GPUs in use by type and placement latency."""

from __future__ import annotations

from datetime import timedelta

from service_builders import T0, Env, job_body

from orchestrator.states import JobState
from service.db import repositories as repo
from service.db.engine import write_session
from service.metrics import histogram_lines


def _values(text: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def test_histogram_is_cumulative() -> None:
    lines = histogram_lines("x", [0.2, 3.0, 0.05], (0.1, 1.0, 10.0))
    assert lines == ['x_bucket{le="0.1"} 1', 'x_bucket{le="1"} 2', 'x_bucket{le="10"} 3',
                     'x_bucket{le="+Inf"} 3', "x_sum 3.250000", "x_count 3"]


def test_metrics_reflect_queue_allocations_and_latency(env: Env) -> None:
    ids = [env.client.post("/v1/jobs", json=job_body(), headers=env.headers("alice")).json()["id"]
           for _ in range(3)]
    with write_session(env.factory) as s:
        job = repo.get_job(session=s, job_id=ids[0], for_update=True)
        assert job is not None
        placed = T0 + timedelta(seconds=2)
        repo.set_allocation(session=s, job=job, placement=[("a100-0", 4)], gpu_type="A100-80G",
                            plan_rank=1, now=placed)
        repo.transition_job(session=s, job=job, to=JobState.PLACED, reason="t", now=placed)
    assert env.client.get("/metrics").status_code == 401
    assert env.client.get("/metrics", headers=env.headers("alice")).status_code == 403
    r = env.client.get("/metrics", headers=env.headers("admin"))
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    v = _values(r.text)
    assert v["frenzy_queue_length"] == 2
    assert v['frenzy_jobs{state="placed"}'] == 1
    assert v['frenzy_gpus_in_use{gpu_type="A100-80G"}'] == 4
    assert v['frenzy_gpus_in_use{gpu_type="L40S"}'] == 0
    assert v['frenzy_gpus_total{gpu_type="A100-80G"}'] == 16
    assert v["frenzy_placement_latency_seconds_count"] == 1
    assert v["frenzy_placement_latency_seconds_sum"] == 2.0
    assert v['frenzy_placement_latency_seconds_bucket{le="1"}'] == 0
    assert v['frenzy_placement_latency_seconds_bucket{le="2.5"}'] == 1
    assert "# TYPE frenzy_placement_latency_seconds histogram" in r.text
