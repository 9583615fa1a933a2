"""Deadline guarantees survive a crash: ``frenzy serve --policy elastic`` (sim backend) with
admitted deadline jobs running and queued is SIGKILLed and started again on the same SQLite
file. The policy's notes (``jobs.policy_state``) give it back its admitted set, so no admitted
job goes through admission again, none is rejected or loses its booking, and every one ends
by its deadline.

Sizes: the tiny model's step is predicted at ~6.9 ms on one GPU (A100/A800 alike), so 2,200
steps are ~15 s; 14 one-GPU jobs on the 11 GPUs of ``frenzy-testbed`` leave 3 admitted ones
queued behind the first wave. The elastic policy charges a 10 s launch and keeps 5 % slack,
so a queued job needs ~15 + 10 + 15 s: a 180 s deadline leaves room for the restart."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

from serve_helpers import Served, db_rows, serve

JOBS = 14
DEADLINE_S = 180.0
BODY = {"dimensions": {"name": "tiny", "family": "gpt2", "num_layers": 2, "hidden_size": 64,
                       "num_heads": 4, "vocab_size": 512, "max_seq_len": 128},
        "training": {"global_batch": 8, "seq_len": 64, "steps": 2200, "precision": "fp32"},
        "max_gpus": 1, "deadline_s": DEADLINE_S}


def _states(s: Served) -> dict[str, str]:
    page = s.client.get("/v1/jobs", params={"limit": 500}).json()
    return {j["id"]: j["state"] for j in page["data"]}


def _notes(url: str) -> dict[str, dict]:
    """The policy's stored notes, read from the database itself."""
    return {i: json.loads(d) if isinstance(d, str) else d
            for i, d in db_rows(url, "SELECT id, policy_state FROM jobs "
                                     "WHERE policy_state IS NOT NULL")}


def _messages(s: Served, job_id: str) -> list[str]:
    return [e["message"] for e in
            s.client.get(f"/v1/jobs/{job_id}/events").json()["data"]]


def test_admitted_deadline_jobs_survive_sigkill(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'frenzy.db'}"
    s = serve(tmp_path, url, extra=["--policy", "elastic"])
    try:
        ids = [s.submit(BODY)["id"] for _ in range(JOBS)]
        s.wait_for(lambda: sum(n.get("status") == "admitted" for n in _notes(url).values())
                   == JOBS, what="every job admitted and its note stored")
        s.wait_for(lambda: sum(v == "running" for v in _states(s).values()) >= 8,
                   what="the first wave running")
        before = _states(s)
        admitted_msgs = {j: _messages(s, j) for j in ids}
    finally:
        s.kill()
    running = [j for j in ids if before[j] == "running"]
    queued = [j for j in ids if before[j] in ("pending", "placed")]
    assert running and queued, before  # admitted jobs both running and queued at the crash
    assert all(any("admitted: minimum satisfactory share" in m for m in admitted_msgs[j])
               for j in running)
    # the queued ones were admitted too (their notes say so) but have no event yet: after
    # the restart they must start without going through admission again
    assert not any("admitted" in m for j in queued for m in admitted_msgs[j])

    s2 = serve(tmp_path, url, extra=["--policy", "elastic"])
    try:
        s2.wait_for(lambda: all(v == "succeeded" for v in _states(s2).values()),
                    timeout_s=150, what="every job done")
        after = {j: s2.job(j) for j in ids}
        msgs = {j: _messages(s2, j) for j in ids}
    finally:
        s2.stop()
    for j in ids:
        assert after[j]["state"] == "succeeded", (j, after[j]["state_reason"])
        done = datetime.fromisoformat(after[j]["finished_at"])
        due = datetime.fromisoformat(after[j]["deadline_at"])
        assert done <= due, (j, done, due)
        # never rejected, never dropped to best-effort, never admitted a second time
        assert not any("rejected" in m for m in msgs[j]), msgs[j]
        assert not any("deadline can no longer be met" in m for m in msgs[j]), msgs[j]
        assert not any("best-effort" in m for m in msgs[j]), msgs[j]
        assert sum("admitted" in m for m in msgs[j]) == sum(
            "admitted" in m for m in admitted_msgs[j]), msgs[j]
    # every job still carries its admission in the database
    assert {j for j, n in _notes(url).items() if n.get("status") == "admitted"} == set(ids)
