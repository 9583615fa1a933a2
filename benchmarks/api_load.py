"""API load: sustained submissions/s and p50/p99 latency of ``POST /v1/jobs`` and
``GET /v1/jobs/{id}`` at 50 concurrent clients, on SQLite and on PostgreSQL.

For each database the script starts the real service (``frenzy serve --backend sim``: the
Controller schedules every job, nothing trains) as a subprocess on a loopback port, then a
*separate* load-generator process (``--generate``) with ``--clients`` concurrent keep-alive
HTTP/1.1 connections. Each client repeatedly submits a job and reads it back, paced so that
all clients together aim at ``--rate`` submissions/s (an open-loop target: the latency is
the service's, not a queue the generator builds); the run is bounded by ``--duration`` and
``--max-submits``. Afterwards the script checks every accepted job id is in the database.

Usage::

    python -m benchmarks.api_load                      # SQLite (+ PostgreSQL if configured)
    python -m benchmarks.api_load --backends postgresql --postgres-url postgresql://...
    python -m benchmarks.api_load --json               # one JSON object on the last line

PostgreSQL comes from ``--postgres-url`` or ``$FRENZY_TEST_POSTGRES_URL`` (e.g. from
``scripts/start_postgres.sh``); a fresh database is created and dropped for the run.
JSON keys per backend: backend, submit_rps, submit_p50_ms, submit_p99_ms, get_p50_ms,
get_p99_ms, errors, lost_jobs, accepted, plus the run's parameters and the machine's 1-minute
load average before and after the load (``loadavg_1m``: the other work on a shared machine
moves the tail latencies).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

log = logging.getLogger("benchmarks.api_load")

ROOT = Path(__file__).resolve().parents[1]

BODIES: list[dict[str, Any]] = [
    {"model": "gpt2", "name": f"load-{b}", "training": {"global_batch": b, "seq_len": 1024,
                                                        "steps": 100}}
    for b in (8, 16, 32, 64)
]
"""What the clients submit, in turn: four distinct small jobs (so the plan cache is used the
way identical resubmissions use it, after one miss each)."""


# -- the load generator (its own process) -------------------------------------------------------
class _Conn:
    """One keep-alive HTTP/1.1 connection: minimal, so the generator spends little CPU."""

    def __init__(self, host: str, port: int, token: str) -> None:
        self.host, self.port = host, port
        self.auth = f"Authorization: Bearer {token}\r\n"
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def open(self) -> None:
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port)

    async def request(self, method: str, path: str, body: bytes | None = None) -> tuple[int,
                                                                                        bytes]:
        if self.writer is None:
            await self.open()
        assert self.reader is not None and self.writer is not None
        head = f"{method} {path} HTTP/1.1\r\nHost: {self.host}\r\n{self.auth}"
        if body is not None:
            head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        self.writer.write(head.encode() + b"\r\n" + (body or b""))
        await self.writer.drain()
        status_line = await self.reader.readline()
        if not status_line:
            raise ConnectionError("connection closed by the server")
        status = int(status_line.split()[1])
        length = 0
        close = False
        while True:
            line = await self.reader.readline()
            if line in (b"\r\n", b""):
                break
            name, _, value = line.partition(b":")
            lname = name.strip().lower()
            if lname == b"content-length":
                length = int(value.strip())
            elif lname == b"connection" and value.strip().lower() == b"close":
                close = True
        data = await self.reader.readexactly(length) if length else b""
        if close:
            await self.close()
        return status, data

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            with contextlib.suppress(OSError):
                await self.writer.wait_closed()
        self.reader = self.writer = None


async def _client(
    i: int, host: str, port: int, token: str, interval: float, t0: float, stop_at: float,
    budget: list[int], out: dict[str, Any],
) -> None:
    conn = _Conn(host, port, token)
    k = 0
    next_at = t0 + (i / max(1, out["clients"])) * interval
    try:
        while True:
            now = time.perf_counter()
            if now >= stop_at or budget[0] <= 0:
                return
            if next_at > now:
                await asyncio.sleep(next_at - now)
            next_at += interval
            budget[0] -= 1
            body = json.dumps(BODIES[(i + k) % len(BODIES)]).encode()
            k += 1
            t = time.perf_counter()
            try:
                status, data = await conn.request("POST", "/v1/jobs", body)
            except (OSError, ConnectionError, asyncio.IncompleteReadError, ValueError) as exc:
                out["errors"].append(f"POST: {type(exc).__name__}: {exc}")
                await conn.close()
                continue
            out["submit_ms"].append(1000 * (time.perf_counter() - t))
            if status != 201:
                out["errors"].append(f"POST {status}: {data[:200]!r}")
                continue
            job_id = json.loads(data)["id"]
            out["accepted"].append(job_id)
            t = time.perf_counter()
            try:
                status, data = await conn.request("GET", f"/v1/jobs/{job_id}")
            except (OSError, ConnectionError, asyncio.IncompleteReadError, ValueError) as exc:
                out["errors"].append(f"GET: {type(exc).__name__}: {exc}")
                await conn.close()
                continue
            out["get_ms"].append(1000 * (time.perf_counter() - t))
            if status != 200:
                out["errors"].append(f"GET {status}: {data[:200]!r}")
    finally:
        await conn.close()


async def generate(url: str, token: str, clients: int, rate: float, duration_s: float,
                   max_submits: int) -> dict[str, Any]:
    """Run the paced clients against ``url``; latencies in ms, accepted ids, errors."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    out: dict[str, Any] = {"clients": clients, "submit_ms": [], "get_ms": [], "accepted": [],
                           "errors": []}
    interval = clients / rate  # each client's period between submissions
    t0 = time.perf_counter()
    budget = [max_submits]
    await asyncio.gather(*(
        _client(i, host, port, token, interval, t0, t0 + duration_s, budget, out)
        for i in range(clients)
    ))
    out["elapsed_s"] = time.perf_counter() - t0
    return out


def _generate_main(args: argparse.Namespace) -> int:
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    out = asyncio.run(generate(args.url, args.token, args.clients, args.rate, args.duration,
                               args.max_submits))
    Path(args.out).write_text(json.dumps(out))
    return 0


# -- the orchestration -----------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    idx = min(len(s) - 1, max(0, round(q * (len(s) - 1))))
    return s[idx]


def _wait_healthy(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 90.0) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the service exited with code {proc.returncode}")
        try:
            if httpx.get(f"{url}/healthz", timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"the service did not answer /healthz within {timeout_s:.0f} s")


def _stop_server(proc: subprocess.Popen[bytes]) -> None:
    """Stop ``frenzy serve`` as Ctrl-C would (SIGINT), killing it if it takes over 30 s."""
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class _Database:
    """A fresh database for one run: a SQLite file, or a PostgreSQL database made and
    dropped on the server at ``base``."""

    def __init__(self, backend: str, tmp: Path, pg_base: str | None) -> None:
        self.backend = backend
        self._admin: Any = None
        if backend == "sqlite":
            self.url = f"sqlite:///{tmp / 'frenzy.db'}"
            return
        if not pg_base:
            raise SystemExit("postgresql: give --postgres-url or set FRENZY_TEST_POSTGRES_URL "
                             "(scripts/start_postgres.sh prints one)")
        import sqlalchemy as sa
        from sqlalchemy.engine import make_url

        from service.settings import Settings

        base = Settings(database_url=pg_base).database_url
        self._name = f"frenzy_load_{uuid.uuid4().hex[:10]}"
        self._admin = sa.create_engine(base, isolation_level="AUTOCOMMIT")
        with self._admin.connect() as conn:
            conn.exec_driver_sql(f'CREATE DATABASE "{self._name}"')
        self.url = make_url(base).set(database=self._name).render_as_string(hide_password=False)

    def drop(self) -> None:
        if self._admin is not None:
            with self._admin.connect() as conn:
                conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{self._name}" WITH (FORCE)')
            self._admin.dispose()


def _make_token(url: str) -> str:
    from service.auth import create_token
    from service.db.engine import make_engine, make_session_factory, migrate, write_session

    migrate(url)
    engine = make_engine(url)
    try:
        with write_session(make_session_factory(engine)) as session:
            return create_token(session=session, owner="load")
    finally:
        engine.dispose()


def _present(url: str, ids: list[str]) -> int:
    import sqlalchemy as sa

    from service.db.engine import make_engine
    from service.db.models import Job

    engine = make_engine(url)
    try:
        found = 0
        with engine.connect() as conn:
            for i in range(0, len(ids), 500):
                chunk = ids[i:i + 500]
                found += conn.execute(
                    sa.select(sa.func.count()).select_from(Job).where(Job.id.in_(chunk))
                ).scalar_one()
        return int(found)
    finally:
        engine.dispose()


def run_backend(backend: str, args: argparse.Namespace) -> dict[str, Any]:
    """Serve on ``backend``, load it from a separate process, check nothing was lost."""
    with tempfile.TemporaryDirectory(prefix="frenzy-load-") as tmpdir:
        tmp = Path(tmpdir)
        db = _Database(backend, tmp, args.postgres_url)
        try:
            token = _make_token(db.url)
            port = _free_port()
            url = f"http://127.0.0.1:{port}"
            env = {**os.environ, "FRENZY_TOKEN_FILE": str(tmp / "admin-token"),
                   "PYTHONUNBUFFERED": "1"}
            server_log = (tmp / "server.log").open("wb")
            server = subprocess.Popen(
                [sys.executable, "-m", "service.cli", "serve", "--backend", "sim",
                 "--port", str(port), "--database-url", db.url, "--workers",
                 str(args.workers), "--log-level", "warning"],
                cwd=ROOT, env=env, stdout=server_log, stderr=subprocess.STDOUT,
            )
            try:
                _wait_healthy(url, server)
                load_before = os.getloadavg()[0]
                gen_out = tmp / "gen.json"
                subprocess.run(
                    [sys.executable, "-m", "benchmarks.api_load", "--generate", "--url", url,
                     "--token", token, "--clients", str(args.clients), "--rate",
                     str(args.rate), "--duration", str(args.duration), "--max-submits",
                     str(args.max_submits), "--out", str(gen_out)],
                    cwd=ROOT, check=True, timeout=args.duration + 120,
                )
                res = json.loads(gen_out.read_text())
                load_after = os.getloadavg()[0]
            finally:
                _stop_server(server)
                server_log.close()
            if res["errors"]:
                log.warning("%s: %d errors, first: %s", backend, len(res["errors"]),
                            res["errors"][0])
            accepted = res["accepted"]
            lost = len(set(accepted)) - _present(db.url, sorted(set(accepted)))
        finally:
            db.drop()
    return {
        "backend": backend,
        "submit_rps": round(len(accepted) / res["elapsed_s"], 1),
        "submit_p50_ms": round(_pct(res["submit_ms"], 0.50), 2),
        "submit_p99_ms": round(_pct(res["submit_ms"], 0.99), 2),
        "get_p50_ms": round(_pct(res["get_ms"], 0.50), 2),
        "get_p99_ms": round(_pct(res["get_ms"], 0.99), 2),
        "errors": len(res["errors"]),
        "lost_jobs": lost,
        "accepted": len(accepted),
        "gets": len(res["get_ms"]),
        "duplicates": len(accepted) - len(set(accepted)),
        "clients": args.clients,
        "target_rate": args.rate,
        "duration_s": round(res["elapsed_s"], 2),
        "workers": args.workers,
        "loadavg_1m": [round(load_before, 2), round(load_after, 2)],
    }


def format_table(rows: list[dict[str, Any]]) -> str:
    cols = ("backend", "submit_rps", "submit_p50_ms", "submit_p99_ms", "get_p50_ms",
            "get_p99_ms", "errors", "lost_jobs", "accepted")
    lines = ["  ".join(f"{c:>13s}" for c in cols)]
    for r in rows:
        lines.append("  ".join(f"{r[c]!s:>13s}" for c in cols))
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.api_load",
                                description=__doc__.splitlines()[0])
    p.add_argument("--backends", default=None,
                   help="comma list of sqlite,postgresql (default: sqlite, plus postgresql "
                        "when a PostgreSQL URL is configured)")
    p.add_argument("--postgres-url", default=os.environ.get("FRENZY_TEST_POSTGRES_URL"))
    p.add_argument("--clients", type=int, default=50)
    p.add_argument("--rate", type=float, default=400.0, help="target submissions/s in all")
    p.add_argument("--duration", type=float, default=15.0, help="seconds of load")
    p.add_argument("--max-submits", type=int, default=20_000, help="cap on submissions")
    p.add_argument("--workers", type=int, default=2, help="uvicorn API worker processes")
    p.add_argument("--json", action="store_true", help="one JSON object on the last line")
    p.add_argument("--generate", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--url", help=argparse.SUPPRESS)
    p.add_argument("--token", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.generate:
        return _generate_main(args)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if args.backends:
        backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    else:
        backends = ["sqlite"] + (["postgresql"] if args.postgres_url else [])
    rows = [run_backend(b, args) for b in backends]
    print(format_table(rows))
    if args.json:
        print(json.dumps({"results": rows}))
    return 0 if all(r["errors"] == 0 and r["lost_jobs"] == 0 for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
