"""What the job history costs the read-only endpoints: ``/metrics`` and ``/v1/admin/stats``
on a database holding ``--jobs`` finished jobs (each placed once, one released allocation)
and a few live ones.

The database is filled with Core ``INSERT``s (no API), then the app (``create_app``) is
called in-process through a ``TestClient``: the first ``/metrics`` scrape, the median of
``--repeat`` later scrapes, and ``/v1/admin/stats`` over a one-hour window and over the
whole history (``window_s`` 86,400: the jobs are spread over the last 24 h).

Usage::

    python -m benchmarks.history_cost                      # SQLite, 200,000 jobs
    python -m benchmarks.history_cost --jobs 20000 --json  # quick; JSON on the last line
    python -m benchmarks.history_cost --database-url postgresql+psycopg://...

(``--database-url``: an empty, migrated database is expected to be created for the run; a
SQLite file is made in a temporary folder by default.)
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import statistics
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import sqlalchemy as sa

log = logging.getLogger(__name__)

NOW = datetime(2026, 11, 24, 12, 0, tzinfo=UTC)


def fill(url: str, jobs: int, live: int, seed: int = 1) -> str:
    """Insert ``jobs`` finished and ``live`` running jobs; returns an admin token."""
    from service.auth import create_token
    from service.db.engine import make_engine, make_session_factory, write_session
    from service.db.models import AllocationRow, Event, Job, NodeRow

    rng = random.Random(seed)
    engine = make_engine(url)
    try:
        factory = make_session_factory(engine)
        with write_session(factory) as s:
            token = create_token(session=s, owner="root", is_admin=True)
        with engine.begin() as conn:
            conn.execute(sa.insert(NodeRow), [{
                "id": f"n{i}", "gpu_type": "A100-80G", "gpu_memory": 80 << 30,
                "total_gpus": 8, "interconnect": "nvlink", "alive": True,
                "created_at": NOW, "updated_at": NOW} for i in range(16)])
        batch = 5000
        for start in range(0, jobs + live, batch):
            rows, allocs, events = [], [], []
            for i in range(start, min(start + batch, jobs + live)):
                job_id = uuid.UUID(int=rng.getrandbits(128)).hex
                created = NOW - timedelta(seconds=rng.uniform(60, 86_400))
                placed = created + timedelta(seconds=rng.expovariate(1 / 30))
                done = i < jobs
                finished = placed + timedelta(seconds=rng.uniform(10, 600)) if done else None
                state = "succeeded" if done else "running"
                rows.append({
                    "id": job_id, "owner": f"user{i % 50}", "name": None, "state": state,
                    "state_reason": "", "model_name": "gpt2", "model_spec": {},
                    "training": {}, "request": {}, "request_hash": "0" * 64,
                    "idempotency_key": None, "priority": 0, "deadline_s": 3600.0,
                    "deadline_at": created + timedelta(hours=1), "entrypoint": None,
                    "total_steps": 100, "steps_done": 100.0 if done else 10.0,
                    "chosen_plan_rank": 1, "created_at": created,
                    "updated_at": finished or placed, "placed_at": placed,
                    "started_at": placed, "finished_at": finished, "plans": [],
                    "plan_count": 0})
                allocs.append({"job_id": job_id, "node_id": f"n{i % 16}",
                               "gpu_type": "A100-80G", "gpus": 1, "plan_rank": 1,
                               "created_at": placed, "released_at": finished})
                events.append({"job_id": job_id, "at": created, "kind": "submitted",
                               "state": "pending", "message": ""})
            with engine.begin() as conn:
                conn.execute(sa.insert(Job), rows)
                conn.execute(sa.insert(AllocationRow), allocs)
                conn.execute(sa.insert(Event), events)
        return token
    finally:
        engine.dispose()


def _timed(client: Any, path: str, headers: dict[str, str]) -> float:
    t0 = time.perf_counter()
    r = client.get(path, headers=headers)
    elapsed = time.perf_counter() - t0
    if r.status_code != 200:
        raise SystemExit(f"{path}: {r.status_code} {r.text[:200]}")
    return elapsed


def measure(url: str, token: str, repeat: int) -> dict[str, float]:
    from fastapi.testclient import TestClient

    from service.api import create_app
    from service.settings import Settings

    app = create_app(settings=Settings(database_url=url), clock=lambda: NOW)
    h = {"Authorization": f"Bearer {token}"}
    with TestClient(app) as client:
        first = _timed(client, "/metrics", h)
        later = [_timed(client, "/metrics", h) for _ in range(repeat)]
        stats_1h = [_timed(client, "/v1/admin/stats?window_s=3600", h) for _ in range(3)]
        stats_24h = [_timed(client, "/v1/admin/stats?window_s=86400", h) for _ in range(3)]
    return {
        "metrics_first_s": first,
        "metrics_median_s": statistics.median(later),
        "stats_1h_median_s": statistics.median(stats_1h),
        "stats_24h_median_s": statistics.median(stats_24h),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", type=int, default=200_000, help="finished jobs in the history")
    p.add_argument("--live", type=int, default=50, help="running jobs")
    p.add_argument("--repeat", type=int, default=10, help="later scrapes timed")
    p.add_argument("--database-url", default=None, help="default: a temporary SQLite file")
    p.add_argument("--json", action="store_true", help="one JSON object on the last line")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)

    from service.db.engine import migrate

    with tempfile.TemporaryDirectory() as tmp:
        url = args.database_url or f"sqlite:///{Path(tmp) / 'history.db'}"
        migrate(url)
        t0 = time.perf_counter()
        token = fill(url, args.jobs, args.live)
        fill_s = time.perf_counter() - t0
        result = measure(url, token, args.repeat)
    backend = url.split(":", 1)[0].split("+", 1)[0]
    print(f"history: {args.jobs:,} finished + {args.live} running jobs on {backend} "
          f"(filled in {fill_s:.1f} s)")
    print(f"{'endpoint':38s} {'seconds':>9s}")
    for key, label in (("metrics_first_s", "/metrics, first scrape of a process"),
                       ("metrics_median_s", f"/metrics, median of {args.repeat} later"),
                       ("stats_1h_median_s", "/v1/admin/stats window 1 h (median of 3)"),
                       ("stats_24h_median_s", "/v1/admin/stats window 24 h (median of 3)")):
        print(f"{label:38s} {result[key]:9.4f}")
    if args.json:
        print(json.dumps({"backend": backend, "jobs": args.jobs, "live": args.live,
                          **{k: round(v, 5) for k, v in result.items()}}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
