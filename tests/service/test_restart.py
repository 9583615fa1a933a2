"""Restart safety: SIGKILL ``frenzy serve`` with jobs queued and running, start it again on
the same SQLite file; nothing is lost or duplicated, the running job runs again, the queued
ones are still queued (or placed), and the GPUs the database says are held are exactly the
ones the new Controller holds."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from serve_helpers import Served, db_rows, serve

LONG = {"dimensions": {"name": "tiny-long", "family": "gpt2", "num_layers": 2, "hidden_size": 64,
                       "num_heads": 4, "vocab_size": 512, "max_seq_len": 128},
        "training": {"global_batch": 8, "seq_len": 64, "steps": 50_000_000, "precision": "fp32"},
        "max_gpus": 1}
BIG = {"model": "llama-2-7b", "training": {"global_batch": 64, "seq_len": 4096, "steps": 1000}}


def _states(s: Served) -> dict[str, str]:
    page = s.client.get("/v1/jobs", params={"limit": 500}).json()
    return {j["id"]: j["state"] for j in page["data"]}


def test_sigkill_and_restart_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'frenzy.db'}"
    s = serve(tmp_path, url)
    try:
        running = s.submit(LONG)["id"]
        s.wait_for(lambda: s.job(running)["state"] == "running", what="the long job running")
        big = [s.submit(BIG)["id"] for _ in range(4)]  # 11 GPUs: not all of them fit
        s.wait_for(lambda: any(_states(s)[j] == "pending" for j in big), what="a queue")
        s.wait_for(lambda: s.job(running)["progress"]["steps_done"] > 0, what="progress")
        before = _states(s)
    finally:
        s.kill()
    assert before[running] == "running" and "pending" in {before[j] for j in big}

    s2 = serve(tmp_path, url)
    try:
        s2.wait_for(lambda: _states(s2)[running] == "running", what="the job running again")
        after = _states(s2)
        assert set(after) == set(before)  # nothing lost, nothing new
        for j in big:  # queued jobs are queued or placed, never failed or duplicated
            assert after[j] in ("pending", "placed", "starting", "running"), after[j]
        job = s2.job(running)
        assert job["progress"]["steps_done"] > 0  # resumed, not restarted from zero
        events = s2.client.get(f"/v1/jobs/{running}/events").json()["data"]
        assert [e["kind"] for e in events].count("requeued") == 1
        cluster = s2.client.get("/v1/cluster").json()
        metrics = s2.client.get("/metrics").text
    finally:
        s2.stop()

    submitted = Counter(j for (j,) in db_rows(url, "SELECT job_id FROM events "
                                                   "WHERE kind='submitted'"))
    assert set(submitted) == set(before) and set(submitted.values()) == {1}
    assert len(db_rows(url, "SELECT id FROM jobs")) == len(before)
    # GPU accounting: held rows never exceed a node, and agree with the cluster view.
    held = dict(db_rows(url, "SELECT node_id, SUM(gpus) FROM allocations WHERE released_at IS NULL "
                             "GROUP BY node_id"))
    totals = {n["id"]: n["total_gpus"] for n in cluster["nodes"]}
    assert all(held[n] <= totals[n] for n in held)
    per_job = Counter(j for (j,) in db_rows(url, "SELECT DISTINCT job_id FROM allocations WHERE "
                                                 "released_at IS NULL"))
    assert running in per_job
    assert "frenzy_jobs{state=\"running\"}" in metrics
