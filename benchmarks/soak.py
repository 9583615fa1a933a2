"""Soak: does a long-lived ``frenzy serve`` keep its memory and its loop turn time flat?

The script starts the real service (``frenzy serve --backend sim`` on a fresh SQLite file,
one process: the API and the control loop) as a subprocess, then submits ``--jobs`` short
jobs over HTTP at ``--rate`` jobs/s from ``--clients`` concurrent connections. Each job is
GPT-2 on one GPU for ``--steps`` steps, so on the simulated backend it "runs" for about its
launch delay (1 s). While they flow through, the script follows the jobs ended (read from the
database) and, at fixed points, the service's resident memory (``/proc/PID/status``) and the
loop's turn-duration histogram (``frenzy_loop_turn_seconds`` on ``/metrics``).

Figures (``--json``: one JSON object on the last line):

- ``rss_growth_mib``: RSS when every job has ended minus RSS when the first ``--window``
  jobs had ended (target <= 50 MiB over 20,000 jobs);
- ``tick_p99_ratio``: p99 of the loop's turn duration over the turns made while the last
  ``--window`` jobs ended, over the same for the first ``--window`` jobs (target <= 1.2).
  The p99s are read from the difference of two scrapes of the histogram (buckets 10 %
  apart, linear inside a bucket, as Prometheus' ``histogram_quantile``).

Usage::

    python -m benchmarks.soak --json                 # 20,000 jobs
    python -m benchmarks.soak --jobs 300 --json      # a quick check (CI)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.api_load import _free_port, _make_token, _stop_server, _wait_healthy

log = logging.getLogger("benchmarks.soak")

ROOT = Path(__file__).resolve().parents[1]
TURN_METRIC = "frenzy_loop_turn_seconds"


def job_body(i: int, steps: int) -> dict[str, Any]:
    """A short one-GPU job (two distinct bodies in turn: the API's plan cache is used)."""
    return {"model": "gpt2", "name": f"soak-{i}", "max_gpus": 1,
            "training": {"global_batch": 8 * (1 + i % 2), "seq_len": 512, "steps": steps}}


# -- reading the service ----------------------------------------------------------------------
def rss_mib(pid: int) -> float:
    """Resident memory of process ``pid`` in MiB (Linux ``/proc``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024.0
    raise RuntimeError(f"no VmRSS for process {pid}")


def parse_histogram(text: str, name: str) -> list[tuple[float, int]]:
    """The cumulative buckets (upper bound, count) of histogram ``name`` in a Prometheus
    exposition, in order, +Inf last."""
    out = []
    prefix = f'{name}_bucket{{le="'
    for line in text.splitlines():
        if line.startswith(prefix):
            le, value = line[len(prefix):].split('"} ')
            out.append((float("inf") if le == "+Inf" else float(le), int(float(value))))
    if not out:
        raise RuntimeError(f"{name} not in /metrics (is the control loop in this process?)")
    return out


def window_quantile(before: list[tuple[float, int]], after: list[tuple[float, int]],
                    q: float) -> float:
    """Quantile ``q`` of the observations made between two scrapes of a cumulative
    histogram: linear inside the bucket it falls in; NaN when nothing was observed."""
    diff = [(b, a - c) for (b, a), (_, c) in zip(after, before, strict=True)]
    total = diff[-1][1]
    if total <= 0:
        return float("nan")
    rank = q * total
    lower, below = 0.0, 0
    for upper, cum in diff:
        if cum >= rank:
            if upper == float("inf"):
                return lower
            inside = cum - below
            return lower + (upper - lower) * ((rank - below) / inside if inside else 1.0)
        lower, below = upper, cum
    return lower


def turns(hist: list[tuple[float, int]]) -> int:
    return hist[-1][1]


def ended_jobs(db_path: Path) -> tuple[int, int]:
    """(jobs ended, of which succeeded), read from the database file (read-only)."""
    conn = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, timeout=10)
    try:
        rows = conn.execute("SELECT state, count(*) FROM jobs WHERE finished_at IS NOT NULL "
                            "GROUP BY state").fetchall()
    finally:
        conn.close()
    ended = sum(n for _, n in rows)
    ok = sum(n for s, n in rows if str(s).lower() == "succeeded")
    return ended, ok


# -- submitting -----------------------------------------------------------------------------
@dataclass
class Submitted:
    accepted: int = 0
    errors: list[str] = field(default_factory=list)
    done: bool = False


async def _submit_all(url: str, token: str, jobs: int, rate: float, clients: int,
                      steps: int, out: Submitted) -> None:
    import httpx

    t0 = time.monotonic()
    nxt = iter(range(jobs))
    lock = asyncio.Lock()

    async def client() -> None:
        async with httpx.AsyncClient(base_url=url, timeout=60.0,
                                     headers={"Authorization": f"Bearer {token}"}) as http:
            while True:
                async with lock:
                    i = next(nxt, None)
                if i is None:
                    return
                delay = t0 + i / rate - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                try:
                    r = await http.post("/v1/jobs", json=job_body(i, steps))
                    if r.status_code == 201:
                        out.accepted += 1
                    else:
                        out.errors.append(f"{r.status_code}: {r.text[:200]}")
                except httpx.HTTPError as exc:
                    out.errors.append(repr(exc))

    await asyncio.gather(*(client() for _ in range(clients)))


def _submit_thread(url: str, token: str, args: argparse.Namespace, out: Submitted) -> None:
    try:
        asyncio.run(_submit_all(url, token, args.jobs, args.rate, args.clients, args.steps,
                                out))
    finally:
        out.done = True


# -- the run ----------------------------------------------------------------------------------
@dataclass
class Mark:
    """The service at one point of the run."""

    label: str
    ended: int
    elapsed_s: float
    rss_mib: float
    hist: list[tuple[float, int]]
    live_jobs: int


def _scrape(url: str, admin_token: str) -> tuple[list[tuple[float, int]], int]:
    """The loop's turn histogram and live-job gauge from ``/metrics`` (an admin endpoint)."""
    import httpx

    r = httpx.get(f"{url}/metrics", timeout=60.0,
                  headers={"Authorization": f"Bearer {admin_token}"})
    r.raise_for_status()
    text = r.text
    live = 0
    for line in text.splitlines():
        if line.startswith("frenzy_loop_live_jobs "):
            live = int(float(line.split()[1]))
    return parse_histogram(text, TURN_METRIC), live


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Serve, submit ``args.jobs`` jobs, follow them to the end; the figures."""
    window = min(args.window, max(1, args.jobs // 3))
    with tempfile.TemporaryDirectory(prefix="frenzy-soak-") as tmpdir:
        tmp = Path(tmpdir)
        db_path = tmp / "frenzy.db"
        db_url = f"sqlite:///{db_path}"
        token = _make_token(db_url)
        port = _free_port()
        url = f"http://127.0.0.1:{port}"
        env = {**os.environ, "FRENZY_TOKEN_FILE": str(tmp / "admin-token"),
               "PYTHONUNBUFFERED": "1"}
        server_log = (tmp / "server.log").open("wb")
        server = subprocess.Popen(
            [sys.executable, "-m", "service.cli", "serve", "--backend", "sim",
             "--cluster", args.cluster, "--port", str(port), "--database-url", db_url,
             "--log-level", "warning"],
            cwd=ROOT, env=env, stdout=server_log, stderr=subprocess.STDOUT,
        )
        marks: list[Mark] = []
        sub = Submitted()
        try:
            _wait_healthy(url, server)
            admin_token = (tmp / "admin-token").read_text().strip()  # written by serve
            t0 = time.monotonic()

            def mark(label: str, ended: int) -> None:
                hist, live = _scrape(url, admin_token)
                marks.append(Mark(label, ended, time.monotonic() - t0, rss_mib(server.pid),
                                  hist, live))
                log.info("%s: %d ended, %.0f s, RSS %.1f MiB, %d live", label, ended,
                         marks[-1].elapsed_s, marks[-1].rss_mib, live)

            mark("start", 0)
            thread = threading.Thread(target=_submit_thread, args=(url, token, args, sub),
                                      daemon=True)
            thread.start()
            targets = [(window, f"first {window} ended")]
            step = max(window, args.jobs // 10)
            targets += [(k, f"{k} ended") for k in range(step, args.jobs - window, step)
                        if k > window]
            targets += [(args.jobs - window, f"last {window} begin"),
                        (args.jobs, "all ended")]
            deadline = time.monotonic() + args.timeout
            ended = ok = 0
            while targets:
                if server.poll() is not None:
                    raise RuntimeError(f"the service exited with code {server.returncode}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"timed out after {args.timeout:.0f} s with {ended} of "
                                       f"{args.jobs} jobs ended ({len(sub.errors)} errors)")
                if sub.done and sub.accepted + len(sub.errors) >= args.jobs and sub.errors \
                        and ended >= sub.accepted:
                    raise RuntimeError(f"{len(sub.errors)} submissions failed, first: "
                                       f"{sub.errors[0]}")
                ended, ok = ended_jobs(db_path)
                while targets and ended >= targets[0][0]:
                    mark(targets.pop(0)[1], ended)
                time.sleep(args.poll_s)
            thread.join(timeout=30)
        finally:
            _stop_server(server)
            server_log.close()
    by = {m.label: m for m in marks}
    first, last_begin, end = by[f"first {window} ended"], by[f"last {window} begin"], \
        by["all ended"]
    p99_first = window_quantile(marks[0].hist, first.hist, 0.99)
    p99_last = window_quantile(last_begin.hist, end.hist, 0.99)
    rows = []
    prev = marks[0]
    for m in marks[1:]:
        rows.append({"point": m.label, "ended": m.ended, "elapsed_s": round(m.elapsed_s, 1),
                     "rss_mib": round(m.rss_mib, 1), "live_jobs": m.live_jobs,
                     "turns": turns(m.hist) - turns(prev.hist),
                     "turn_p50_ms": round(1e3 * window_quantile(prev.hist, m.hist, 0.5), 3),
                     "turn_p99_ms": round(1e3 * window_quantile(prev.hist, m.hist, 0.99), 3)})
        prev = m
    return {
        "jobs": args.jobs,
        "succeeded": ok,
        "submit_errors": len(sub.errors),
        "rss_growth_mib": round(end.rss_mib - first.rss_mib, 1),
        "tick_p99_ratio": round(p99_last / p99_first, 3),
        "tick_p99_first_ms": round(1e3 * p99_first, 3),
        "tick_p99_last_ms": round(1e3 * p99_last, 3),
        "turns_first": turns(first.hist) - turns(marks[0].hist),
        "turns_last": turns(end.hist) - turns(last_begin.hist),
        "rss_start_mib": round(marks[0].rss_mib, 1),
        "rss_first_mib": round(first.rss_mib, 1),
        "rss_end_mib": round(end.rss_mib, 1),
        "window": window,
        "rate": args.rate,
        "steps": args.steps,
        "cluster": args.cluster,
        "wall_s": round(end.elapsed_s, 1),
        "points": rows,
    }


def format_table(res: dict[str, Any]) -> str:
    cols = ("point", "ended", "elapsed_s", "rss_mib", "live_jobs", "turns", "turn_p50_ms",
            "turn_p99_ms")
    lines = ["  ".join(f"{c:>18}" if i == 0 else f"{c:>11}" for i, c in enumerate(cols))]
    for r in res["points"]:
        lines.append("  ".join(f"{r[c]!s:>18}" if i == 0 else f"{r[c]!s:>11}"
                               for i, c in enumerate(cols)))
    lines.append(f"jobs {res['jobs']} (succeeded {res['succeeded']}, submit errors "
                 f"{res['submit_errors']}); RSS growth {res['rss_growth_mib']} MiB "
                 f"(target <= 50); turn p99 last/first {res['tick_p99_ratio']} "
                 f"({res['tick_p99_last_ms']} / {res['tick_p99_first_ms']} ms; target <= 1.2)")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.soak", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", type=int, default=20_000, help="jobs to push through (>= 3)")
    p.add_argument("--rate", type=float, default=40.0, help="submissions per second")
    p.add_argument("--clients", type=int, default=8, help="concurrent HTTP connections")
    p.add_argument("--steps", type=int, default=10, help="training steps per job")
    p.add_argument("--cluster", default="hetero-128", help="cluster the service runs")
    p.add_argument("--window", type=int, default=1000,
                   help="jobs at the start and at the end compared (at most a third of --jobs)")
    p.add_argument("--poll-s", type=float, default=0.5, help="how often to count ended jobs")
    p.add_argument("--timeout", type=float, default=3600.0, help="give up after (s)")
    p.add_argument("--json", action="store_true", help="one JSON object on the last line")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    for name in ("jobs", "clients", "steps", "window"):
        value = getattr(args, name)
        if value < (3 if name == "jobs" else 1):
            raise SystemExit(f"--{name} must be >= {3 if name == 'jobs' else 1}, got {value}")
    if args.rate <= 0:
        raise SystemExit(f"--rate must be > 0 jobs/s, got {args.rate}")
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    res = run(args)
    print(format_table(res))
    if args.json:
        print(json.dumps(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
