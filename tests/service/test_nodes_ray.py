"""Nodes come and go under the running service (its control loop over the Ray backend, on an
emulated Ray cluster; the API in-process): nobody tells the service, it reads Ray.

1. A node of a GPU type the cluster did not have joins (a Ray node started with Frenzy's
   labels) while a job waits for GPUs (the only node is busy; the job was planned at
   submission for that type too, an expected pool): the job is placed on the new node within
   10 s of the node being up.
2. That node is then killed with the job running on it: Ray reports the node dead, the job is
   requeued from its newest checkpoint on disk with an event naming the node, and resumes
   (on the node left) from that checkpoint.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.ray

CLUSTER = """name: one-a40
inter_node_bw_gbs: 12.5
nodes:
  - {id: a40, gpu_type: A100-40G, count: 1, interconnect: pcie}
"""
CKPT_EVERY = 10


def _job(name: str, steps: int) -> dict[str, Any]:
    return {"dimensions": {"name": name, "family": "gpt2", "num_layers": 2, "hidden_size": 64,
                           "num_heads": 4, "vocab_size": 512, "max_seq_len": 128},
            "training": {"global_batch": 8, "seq_len": 64, "steps": steps,
                         "precision": "fp32"},
            "max_gpus": 1}


def _latest_checkpoint(ckpt: Path, job_id: str) -> int:
    steps = [int(m.group(1)) for f in (ckpt / job_id).glob("step-*.pt")
             if (m := re.fullmatch(r"step-(\d{8})\.pt", f.name))]
    return max(steps, default=0)


def _wait(pred: Callable[[], Any], timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")


class Service:
    def __init__(self, tmp: Path) -> None:
        from fastapi.testclient import TestClient

        from orchestrator.clusters import load_cluster
        from service.api import create_app
        from service.app_runtime import Runtime
        from service.auth import create_token
        from service.db.engine import make_engine, make_session_factory, migrate, write_session
        from service.ray_driver import ray_driver_factory
        from service.settings import Settings

        (tmp / "cluster.yaml").write_text(CLUSTER)
        self.ckpt = tmp / "ckpt"
        os.environ["FRENZY_CHECKPOINT_DIR"] = str(self.ckpt)
        os.environ["FRENZY_CHECKPOINT_EVERY"] = str(CKPT_EVERY)
        os.environ.pop("RAY_ADDRESS", None)
        url = f"sqlite:///{tmp / 'frenzy.db'}"
        migrate(url)
        self.settings = Settings(database_url=url, extra_gpu_pools={"A100-80G": 1})
        self.engine = make_engine(url)
        factory = make_session_factory(self.engine)
        with write_session(factory) as s:
            token = create_token(session=s, owner="alice")
        self.runtime = Runtime(self.settings, factory, load_cluster(tmp / "cluster.yaml"),
                               policy="has", driver_factory=ray_driver_factory, poll_s=0.1,
                               schedule_every_s=0.5)
        self.runtime.start()
        self.client = TestClient(create_app(settings=self.settings,
                                            runner=self.runtime.runner))
        self.client.headers["Authorization"] = f"Bearer {token}"

    def submit(self, body: dict[str, Any]) -> str:
        r = self.client.post("/v1/jobs", json=body)
        assert r.status_code == 201, r.text
        return str(r.json()["id"])

    def job(self, job_id: str) -> dict[str, Any]:
        return dict(self.client.get(f"/v1/jobs/{job_id}").json())

    def events(self, job_id: str) -> list[dict[str, Any]]:
        return list(self.client.get(f"/v1/jobs/{job_id}/events",
                                    params={"limit": 500}).json()["data"])

    def on(self, job_id: str) -> set[str]:
        """The nodes the job holds GPUs on, as the database says."""
        return {a["node_id"] for a in self.job(job_id)["allocation"]}

    def close(self) -> None:
        self.client.close()
        self.runtime.stop()
        self.engine.dispose()


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    s = Service(tmp_path_factory.mktemp("nodes"))
    try:
        yield s
    finally:
        s.close()


def test_new_gpu_type_joins_then_dies_under_a_running_job(service: Service) -> None:
    from predictor.gpus import get_gpu
    from scheduler.cluster import Node

    # the emulated cluster's CPU workers are no measure of a GPU: no step-time correction
    assert service.runtime.driver is not None
    assert not service.runtime.driver.measures_step_times
    assert service.runtime.estimator is None
    busy = service.submit(_job("busy", 1_000_000))
    _wait(lambda: service.job(busy)["state"] == "running", 90, "the first job to run")
    waiting = service.submit(_job("waiting", 1_000_000))
    plans = {p["gpu_type"] for p in service.client.get(
        f"/v1/jobs/{waiting}", params={"plans": "all"}).json()["plans"]}
    assert plans == {"A100-40G", "A100-80G"}  # planned once, for the expected pool too
    time.sleep(2.0)  # a few loop turns: it waits, the only node is taken
    assert service.job(waiting)["state"] == "pending"

    # -- a machine with a GPU type the cluster did not have joins ------------------------------
    ray_cluster = service.runtime.driver.ray_cluster  # type: ignore[union-attr]
    node = Node("n80", "A100-80G", get_gpu("A100-80G").memory_bytes, 1, 1)
    asked = time.monotonic()
    handle = ray_cluster.add_node(node)  # returns once Ray has the node
    up = time.monotonic()
    _wait(lambda: "n80" in service.on(waiting), 10, "the waiting job on the new node")
    placed_after = time.monotonic() - up
    assert placed_after <= 10
    with service.runtime.locked() as ctl:
        assert "n80" in ctl.cluster.by_id
    nodes = {n["id"]: n for n in service.client.get("/v1/cluster").json()["nodes"]}
    assert nodes["n80"]["gpu_type"] == "A100-80G"  # the API sees it too

    # -- the busy job ends; then the new machine dies under the waiting job ---------------------
    assert service.client.post(f"/v1/jobs/{busy}/cancel").status_code == 200
    _wait(lambda: service.job(waiting)["progress"]["steps_done"] >= 3 * CKPT_EVERY, 120,
          "a few checkpoints of the job on the new node")
    at_kill = _latest_checkpoint(service.ckpt, waiting)
    ray_cluster.remove_node(handle)
    killed = time.monotonic()

    def requeued() -> dict[str, Any] | None:
        return next((e for e in service.events(waiting)
                     if e["kind"] == "pending" and "n80" in e["message"]), None)

    event = _wait(requeued, 60, "the job requeued because its node died")
    detected_after = time.monotonic() - killed
    checkpoint = _latest_checkpoint(service.ckpt, waiting)  # its workers are gone now
    assert checkpoint >= max(at_kill, CKPT_EVERY)
    assert "died" in event["message"] and "Ray reports it dead" in event["message"]
    assert event["data"]["steps_done"] == checkpoint  # from its newest checkpoint
    # the first (and only) requeue is the node's death: no other reason came before it
    requeues = [e for e in service.events(waiting) if e["kind"] == "pending"]
    assert requeues == [event]
    # it resumes on the node left, from that checkpoint
    _wait(lambda: service.on(waiting) == {"a40"} and service.job(waiting)["state"] == "running",
          90, "the job running again on a40")
    progress = service.job(waiting)["progress"]["steps_done"]
    assert progress > checkpoint
    with service.runtime.locked() as ctl:
        assert "n80" not in ctl.cluster.by_id
        assert ctl.job(waiting).view.restarts == 1
    alive = {n["id"] for n in service.client.get("/v1/cluster").json()["nodes"]}
    assert alive == {"a40"}
    print(f"node started in {up - asked:.1f} s; the job was placed on it {placed_after:.1f} s "
          f"after; node death "
          f"seen {detected_after:.1f} s after the kill")
    assert service.client.post(f"/v1/jobs/{waiting}/cancel").status_code == 200
