"""A job none of whose stored plans fits after an out-of-memory run is planned again, and the
new plans are what the database keeps: a service restart resumes it on them.

The simulated backend runs every job at 1.6 x its predicted peak memory, on one A100-40G
(``virtual_service``: launches take 10 s)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from virtual_service import Service

ONE_A100 = """name: one-a100
inter_node_bw_gbs: 12.5
nodes:
  - {id: n0, gpu_type: A100-40G, count: 1, interconnect: nvlink}
"""
GPT2_LARGE = {"model": "gpt2-large", "training": {"global_batch": 16, "seq_len": 1024,
                                                  "steps": 10_000_000}}


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Service]:
    s = Service(tmp_path, cluster=ONE_A100, memory_factor=lambda job_id: 1.6)
    yield s
    s.close()


def _plans(s: Service, jid: str) -> list[dict[str, Any]]:
    got = s.client.get(f"/v1/jobs/{jid}", params={"plans": "all"}, headers=s.headers("alice"))
    return list(got.json()["plans"])


def test_planned_again_after_oom_and_the_new_plans_survive_a_restart(service: Service) -> None:
    s = service
    jid = s.submit(GPT2_LARGE)["id"]
    (stored,) = _plans(s, jid)  # one GPU of one type: the fastest plan, no recomputation
    assert stored["recompute"] == "none"
    s.at(0)  # placed; its first step at 10 s needs 1.6 x the predicted peak: out of memory
    s.at(10)
    (replan,) = [e for e in s.events(jid) if e["message"].startswith("out of memory")]
    assert replan["kind"] == "pending"
    assert "none of its 1 plans fits any more; planned again" in replan["message"]
    assert "replanned_plans" not in (replan["data"] or {})  # stored with the job, not here
    # the database keeps the new plans: the model's own figures, the correction divided out
    plans = _plans(s, jid)
    assert plans[0]["recompute"] == "full"
    assert all(p["memory_factor"] == pytest.approx(1.0) for p in plans)
    factor = s.job(jid)["memory"]["memory_factor"]
    assert factor == pytest.approx(1.6 * 1.1, rel=1e-3)  # measured ratio + 10 % margin

    s.restart()  # the restored view multiplies the stored plans by the factor again
    view = s.runtime.controller.live[jid].view
    assert view.plans[0].parallel.recompute.value == "full"
    assert view.plans[0].memory_factor == pytest.approx(factor)
    assert view.plans[0].required_bytes <= 40 * 2**30
    s.at(20)
    s.at(30)  # 1.6 x the model's own peak of the recomputing plan fits: it runs
    got = s.job(jid)
    assert got["state"] == "running" and got["chosen_plan"]["recompute"] == "full"
