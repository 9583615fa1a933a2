"""A service (API + ``Runtime``) on the simulated backend and a virtual clock, turned by hand
(no thread): launches take 10 s, progress is reported every 5 s, a plan runs at its predicted
step time times ``step_factor`` (1: exactly the prediction) and peaks at its predicted
memory times ``memory_factor``. Imported by name by the tests that drive the control loop
through the API."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from orchestrator.backend import VirtualClock
from orchestrator.backends.sim import SimBackend
from orchestrator.clusters import ClusterSpec, load_cluster
from predictor.plan import Plan
from scheduler.cluster import ClusterState, Placement
from scheduler.job import JobView
from service.api import create_app
from service.app_runtime import Runtime
from service.auth import create_token
from service.db.engine import make_engine, make_session_factory, migrate, write_session
from service.settings import Settings

T0 = 1_800_000_000.0
SMALL = {"model": "gpt2", "training": {"global_batch": 32, "seq_len": 1024,
                                       "steps": 10_000_000}}
"""A one-GPU job that runs until something stops it."""
CLUSTER = """name: one-node
inter_node_bw_gbs: 12.5
nodes:
  - {id: n0, gpu_type: A100-80G, count: 8, interconnect: nvlink}
"""
class PlannedSpeed:
    """Perf model: a plan runs at its predicted speed wherever it is placed."""

    def placed_plan(self, job: JobView, plan: Plan, placement: Placement,
                    state: ClusterState) -> Plan:
        return plan


class VirtualDriver:
    """The simulated backend on the test's virtual clock; ``step_factor``: true / predicted
    step time per (job id, GPU type), ``memory_factor``: true / predicted peak memory per job
    id, as ``SimBackend`` takes them."""

    max_pipeline: int | None = None
    measures_step_times = False

    def __init__(self, spec: ClusterSpec, clock: VirtualClock,
                 step_factor: Callable[[str, str], float] | None = None,
                 memory_factor: Callable[[str], float] | None = None) -> None:
        self.clock = clock
        self.backend = SimBackend(clock, PlannedSpeed(), spec.state, launch_delay_s=10,
                                  restart_delay_s=0, progress_every_s=5,
                                  step_factor=step_factor, memory_factor=memory_factor)

    def resume_step(self, job_id: str, steps_done: float, *, entrypoint: bool) -> float:
        return steps_done

    def close(self) -> None:
        return None


class Service:
    """API + a Runtime turned by hand on a virtual clock; ``restart`` builds a new Runtime
    on the same database, as ``frenzy serve`` does after a crash."""

    def __init__(self, tmp: Path, *, policy: str = "has-paper", cluster: str = CLUSTER,
                 step_factor: Callable[[str, str], float] | None = None,
                 memory_factor: Callable[[str], float] | None = None,
                 **settings: Any) -> None:
        self.policy = policy
        self.step_factor = step_factor
        self.memory_factor = memory_factor
        url = f"sqlite:///{tmp / 'frenzy.db'}"
        migrate(url)
        (tmp / "cluster.yaml").write_text(cluster)
        self.spec = load_cluster(tmp / "cluster.yaml")
        self.settings = Settings(database_url=url, inventory_ttl_s=0, **settings)
        self.engine = make_engine(url)
        self.factory = make_session_factory(self.engine)
        self.clock = VirtualClock(T0)
        with write_session(self.factory) as s:
            self.tokens = {who: create_token(session=s, owner=who) for who in ("alice", "bob")}
        self.runtime = self._runtime()
        self.client = TestClient(create_app(
            settings=self.settings, runner=self.runtime.runner,
            clock=lambda: datetime.fromtimestamp(self.clock.now(), UTC)))

    def _runtime(self) -> Runtime:
        rt = Runtime(self.settings, self.factory, self.spec, policy=self.policy,
                     driver_factory=lambda spec: VirtualDriver(
                         spec, self.clock, self.step_factor, self.memory_factor),
                     poll_s=3600.0, schedule_every_s=1.0)
        rt.start()
        assert rt.loop is not None
        rt.loop.stop()  # turned by hand from here on
        return rt

    def restart(self) -> None:
        self.runtime.stop()
        self.runtime = self._runtime()

    def at(self, t: float) -> None:
        """Advance the clock to ``T0 + t`` and turn the loop once."""
        self.clock.advance_to(T0 + t)
        self.runtime.step()

    def submit(self, body: dict[str, Any], who: str = "alice") -> dict[str, Any]:
        r = self.client.post("/v1/jobs", json=body, headers=self.headers(who))
        assert r.status_code == 201, r.text
        return dict(r.json())

    def job(self, job_id: str, who: str = "alice") -> dict[str, Any]:
        return dict(self.client.get(f"/v1/jobs/{job_id}", headers=self.headers(who)).json())

    def events(self, job_id: str) -> list[dict[str, Any]]:
        return list(self.client.get(f"/v1/jobs/{job_id}/events", params={"limit": 500},
                                    headers=self.headers("alice")).json()["data"])

    def headers(self, who: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[who]}"}

    def close(self) -> None:
        self.client.close()
        self.runtime.stop()
        self.engine.dispose()


@contextmanager
def services(tmp: Path, **defaults: Any) -> Iterator[Callable[..., Service]]:
    """Makes ``Service``s on ``tmp`` (each call's keywords over ``defaults``) and closes
    every one it made on exit: a test fixture yields it."""
    made: list[Service] = []

    def make(**kw: Any) -> Service:
        made.append(Service(tmp, **{**defaults, **kw}))
        return made[-1]

    try:
        yield make
    finally:
        for s in made:
            s.close()
