"""Run ``frenzy serve`` as a real subprocess for end-to-end tests (restart, browser, fuzz)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import sqlalchemy as sa

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Served:
    """A running ``frenzy serve`` and an authenticated client for it."""

    proc: subprocess.Popen[bytes]
    url: str
    token: str
    log_path: Path
    client: httpx.Client = field(init=False)

    def __post_init__(self) -> None:
        self.client = httpx.Client(base_url=self.url, timeout=30.0,
                                   headers={"Authorization": f"Bearer {self.token}"})

    def submit(self, body: dict[str, Any]) -> dict[str, Any]:
        r = self.client.post("/v1/jobs", json=body)
        assert r.status_code == 201, r.text
        return r.json()

    def job(self, job_id: str) -> dict[str, Any]:
        r = self.client.get(f"/v1/jobs/{job_id}")
        assert r.status_code == 200, r.text
        return r.json()

    def wait_for(self, pred: Any, timeout_s: float = 30.0, what: str = "condition") -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if pred():
                return
            time.sleep(0.2)
        raise AssertionError(f"timed out waiting for {what}; server log:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs (what a crash looks like)."""
        self.client.close()
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        self.client.close()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def serve(tmp: Path, db_url: str, *, port: int | None = None, backend: str = "sim",
          extra: list[str] | None = None, timeout_s: float = 90.0,
          env_extra: dict[str, str] | None = None) -> Served:
    """Start ``frenzy serve`` on a free loopback port and wait until it answers
    (``env_extra``: more environment variables for it, e.g. ``FRENZY_CHECKPOINT_DIR``)."""
    port = port or free_port()
    token_file = tmp / "admin-token"
    log_path = tmp / f"serve-{port}-{time.monotonic_ns()}.log"
    env = {**os.environ, "FRENZY_TOKEN_FILE": str(token_file), "PYTHONUNBUFFERED": "1",
           "FRENZY_HOME": str(tmp / "frenzy-home"), **(env_extra or {})}
    env.pop("DATABASE_URL", None)
    with log_path.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "service.cli", "serve", "--port", str(port),
             "--database-url", db_url, "--backend", backend, *(extra or [])],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"frenzy serve exited ({proc.returncode}):\n"
                                 f"{log_path.read_text(errors='replace')[-4000:]}")
        try:
            if httpx.get(f"{url}/healthz", timeout=1.0).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    else:
        proc.kill()
        raise AssertionError("frenzy serve did not come up:\n" + log_path.read_text())
    return Served(proc=proc, url=url, token=token_file.read_text().strip(), log_path=log_path)


def db_rows(url: str, sql: str) -> list[tuple]:
    """The rows of ``sql`` run on the database at ``url`` (a fresh engine, disposed after),
    to check what the service wrote independently of its API."""
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return [tuple(r) for r in conn.execute(sa.text(sql))]
    finally:
        engine.dispose()
