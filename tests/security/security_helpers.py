"""Builders of the security tests (imported by name, like tests/service's builders)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import sqlalchemy as sa
from fastapi.testclient import TestClient

from predictor.gpus import get_gpu
from service.auth import create_token
from service.db import repositories as repo
from service.db.engine import make_engine, make_session_factory, write_session

ROOT = Path(__file__).resolve().parents[2]
T0 = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


@dataclass
class Clock:
    """A settable clock for the app (time is passed in)."""

    now: datetime = T0

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


@dataclass
class Env:
    client: TestClient
    factory: sa.orm.sessionmaker
    clock: Clock
    tokens: dict[str, str]
    engine: sa.Engine

    def headers(self, who: str, **extra: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[who]}", **extra}

    def submit(self, who: str = "alice", **overrides: Any) -> str:
        r = self.client.post("/v1/jobs", json=job_body(**overrides), headers=self.headers(who))
        assert r.status_code == 201, r.text
        return str(r.json()["id"])


def job_body(**overrides: Any) -> dict[str, Any]:
    """A small valid submission (gpt2, batch 32 × 1024 tokens, 100 steps)."""
    body: dict[str, Any] = {
        "model": "gpt2",
        "training": {"global_batch": 32, "seq_len": 1024, "steps": 100},
    }
    body.update(overrides)
    return body


def add_nodes(factory: sa.orm.sessionmaker, spec: dict[str, tuple[str, int]]) -> None:
    """Nodes {id: (gpu_type, gpus)} with the catalog's memory for the type."""
    with write_session(factory) as s:
        for node_id, (gpu_type, gpus) in spec.items():
            gpu = get_gpu(gpu_type)
            repo.upsert_node(session=s, node_id=node_id, gpu_type=gpu_type,
                             gpu_memory=gpu.memory_bytes, total_gpus=gpus, now=T0,
                             interconnect=gpu.link)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rss_bytes(pid: int) -> int:
    """Resident memory of a process (Linux /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@dataclass
class Server:
    """The API (``create_app`` with settings from the environment) under uvicorn."""

    proc: subprocess.Popen[bytes]
    port: int
    token: str
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_server(db_url: str, tmp: Path, **env_extra: str) -> Server:
    """uvicorn with ``security_app:app`` (one process, httptools) on a free loopback port;
    ``env_extra``: ``FRENZY_*`` settings. Returns once ``/healthz`` answers."""
    engine = make_engine(db_url)
    try:
        factory = make_session_factory(engine)
        add_nodes(factory, {"a100-0": ("A100-80G", 8)})
        with write_session(factory) as s:
            token = create_token(session=s, owner="root", is_admin=True)
    finally:
        engine.dispose()
    port = free_port()
    log_path = tmp / f"uvicorn-{port}.log"
    env = {**os.environ, "DATABASE_URL": db_url, "PYTHONUNBUFFERED": "1", **env_extra,
           "PYTHONPATH": os.pathsep.join([str(ROOT), str(Path(__file__).parent)])}
    with log_path.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "--factory", "security_app:app", "--host",
             "127.0.0.1", "--port", str(port), "--log-level", "warning"],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    server = Server(proc=proc, port=port, token=token, log_path=log_path)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"uvicorn exited ({proc.returncode}):\n{server.log()}")
        try:
            if httpx.get(f"{server.url}/healthz", timeout=1.0).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    server.stop()
    raise AssertionError("uvicorn did not come up:\n" + server.log())
