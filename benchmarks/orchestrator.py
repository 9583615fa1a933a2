"""Orchestrator figures on the emulated Frenzy paper testbed (5 nodes, 3 GPU types, 11 GPUs).

Starts the emulated Ray cluster of the packaged ``frenzy-testbed`` description, then submits a
burst of ``--jobs`` tiny-GPT-2 jobs (1, 2 or 4 GPUs requested, cycling) at once to the
Controller over the RayBackend with the HAS policy, and measures:

* submit → first training step (the job's ``Started`` event), p50 / p95 over all jobs;
* placement-group create latency (created → ready, seen by the 50 ms poll), created → all
  worker actors up and answering (process start + imports), and remove latency;
* where a job's time before its first step goes: queued (submit → placed), placement group
  create → ready, → workers up (fresh actors: process start + imports; warm pool: the reset),
  rank 0's rendezvous (process group init) and its set-up to the first step done;
* with the warm pool (the default, as in ``frenzy serve``; ``--no-warm-pool`` for fresh
  actors per launch): the pool's warm-up before the burst (not in the jobs' figures: a
  service warms its pool when it starts) and how many ranks ran on a reused worker;
* leaked GPUs once the burst is done: GPUs Ray still holds plus live Frenzy placement groups
  plus GPUs the controller still counts as used (all must be 0);
* jobs finished.

Usage: ``python -m benchmarks.orchestrator [--jobs 20] [--steps 8] [--cluster NAME]
[--no-warm-pool] [--json]``.
Workers are CPU processes (gloo), so the figures measure orchestration, not GPU speed.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import tempfile
import time
from typing import Any

from orchestrator.backend import WallClock
from orchestrator.emulated import start_emulated
from orchestrator.loop import ControlLoop, ListJobSource
from orchestrator.ray_backend import (
    RayBackend,
    RayBackendConfig,
    gpus_in_use,
    live_placement_groups,
    wait_released,
)
from orchestrator.states import JobEvent, JobState
from predictor.gpus import get_gpu
from predictor.planner import plan_job
from predictor.spec import Family, ModelSpec, TrainingSpec
from scheduler.job import JobView
from scheduler.policy import make_policy

TINY = ModelSpec("tiny-gpt2", Family.GPT2, num_layers=2, hidden_size=64, num_heads=4,
                 vocab_size=256, max_seq_len=32)


def _pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    k = (len(xs) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def run(jobs: int, steps: int, cluster: str, policy: str, timeout_s: float,
        warm_pool: bool = False) -> dict[str, Any]:
    os.environ.pop("RAY_ADDRESS", None)
    t0 = time.monotonic()
    c = start_emulated(cluster)
    startup = time.monotonic() - t0
    try:
        with tempfile.TemporaryDirectory(prefix="frz-ckpt-") as ckdir:
            backend = RayBackend(RayBackendConfig(checkpoint_dir=ckdir, checkpoint_every=4,
                                                  warm_pool=warm_pool))
            t_pool = time.monotonic()
            pool_warm = backend.wait_warm(180)
            pool_warmup = time.monotonic() - t_pool
            state = backend.inventory()
            events: list[JobEvent] = []
            source = ListJobSource()
            loop = ControlLoop(make_policy(policy), backend, source, WallClock(),
                               listeners=[events.append])
            ctl = loop.controller
            train = TrainingSpec(global_batch=8, seq_len=32, precision="fp32", steps=steps)
            gpu_types = [get_gpu(t) for t in state.gpu_types()]
            plans = tuple(p for p in plan_job(TINY, train, gpu_types, max_gpus=4,
                                              keep_all=False).plans if p.parallel.pp == 1)
            sizes = (1, 2, 4)
            with loop:
                now = time.time()
                burst = [JobView(id=f"job-{i:02d}", submit_time=now, plans=plans,
                                 total_steps=steps, model=TINY, train=train,
                                 requested_gpus=sizes[i % len(sizes)]) for i in range(jobs)]
                t_burst = time.monotonic()
                source.submit(*burst)
                loop.wake()
                done = loop.wait_until(lambda c: len(c.jobs) == len(burst) and not c.active(),
                                       timeout_s)
                burst_s = time.monotonic() - t_burst
            released = wait_released(15)
            submit = {e.job_id: e.time for e in events if e.from_state is None}
            first = {}
            for e in events:
                if e.to_state is JobState.RUNNING and e.from_state is JobState.STARTING:
                    first.setdefault(e.job_id, e.time)
            s2f = [first[j] - submit[j] for j in first]
            # Time from placement to first step, which excludes queueing behind other jobs.
            placed = {}
            for e in events:
                if e.to_state is JobState.PLACED:
                    placed.setdefault(e.job_id, e.time)
            p2f = [first[j] - placed[j] for j in first]
            s2p = [placed[j] - submit[j] for j in placed]
            cstate = ctl.cluster
            leaked = (gpus_in_use() + sum(len(pg.get("bundles", {}))
                                          for pg in live_placement_groups())
                      + (cstate.total_gpus - cstate.free_gpus))
            finished = sum(1 for r in ctl.jobs.values() if r.state is JobState.SUCCEEDED)
            backend.shutdown()
            return {
                "cluster": c.spec.name if c.spec else cluster,
                "nodes": len(state.nodes),
                "gpus": state.total_gpus,
                "policy": policy,
                "jobs": jobs,
                "steps_per_job": steps,
                "cluster_startup_s": round(startup, 2),
                "submit_to_first_step_p50_s": round(_pct(s2f, 0.5), 3),
                "submit_to_first_step_p95_s": round(_pct(s2f, 0.95), 3),
                "placed_to_first_step_p50_s": round(_pct(p2f, 0.5), 3),
                "placed_to_first_step_p95_s": round(_pct(p2f, 0.95), 3),
                "warm_pool": warm_pool,
                "pool_warmup_s": round(pool_warmup, 2) if warm_pool else None,
                "pool_warm": pool_warm if warm_pool else None,
                "pool_workers_started": backend.pool.started if backend.pool else None,
                "pool_ranks_reused": backend.pool.reused if backend.pool else None,
                "submit_to_placed_p50_s": round(_pct(s2p, 0.5), 3),
                "submit_to_placed_p95_s": round(_pct(s2p, 0.95), 3),
                "pg_create_to_first_step_p50_s": round(
                    _pct(list(backend.launch_to_first_step_s), 0.5), 3),
                "rendezvous_p50_s": round(_pct(list(backend.rendezvous_s), 0.5), 3),
                "rendezvous_p95_s": round(_pct(list(backend.rendezvous_s), 0.95), 3),
                "run_to_first_step_p50_s": round(_pct(list(backend.run_to_first_step_s), 0.5), 3),
                "run_to_first_step_p95_s": round(_pct(list(backend.run_to_first_step_s), 0.95),
                                                 3),
                "pg_create_to_ready_p50_s": round(_pct(backend.pg_ready_s, 0.5), 3),
                "pg_create_to_ready_p95_s": round(_pct(backend.pg_ready_s, 0.95), 3),
                "pg_create_to_workers_up_p50_s": round(_pct(backend.workers_up_s, 0.5), 3),
                "pg_create_to_workers_up_p95_s": round(_pct(backend.workers_up_s, 0.95), 3),
                "pg_remove_p50_ms": round(1000 * _pct(backend.pg_remove_s, 0.5), 2),
                "pg_remove_p95_ms": round(1000 * _pct(backend.pg_remove_s, 0.95), 2),
                "burst_wall_s": round(burst_s, 2),
                "all_done_in_time": bool(done),
                "released": bool(released),
                "leaked_gpus": int(leaked),
                "jobs_done": finished,
                "jobs_failed": sum(1 for r in ctl.jobs.values()
                                   if r.state is JobState.FAILED),
                "mean_first_loss": round(statistics.mean(
                    v[0] for v in backend.losses.values() if v), 4),
                "mean_last_loss": round(statistics.mean(
                    v[-1] for v in backend.losses.values() if v), 4),
            }
    finally:
        c.shutdown()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=20)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--cluster", default="frenzy-testbed")
    ap.add_argument("--policy", default="has")
    ap.add_argument("--timeout", type=float, default=480.0)
    ap.add_argument("--warm-pool", action=argparse.BooleanOptionalAction, default=True,
                    help="run on the RayBackend's warm worker pool, as frenzy serve does "
                         "(RayBackendConfig.warm_pool; --no-warm-pool: a fresh actor per "
                         "rank and launch)")
    ap.add_argument("--json", action="store_true", help="one JSON object on the last line")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    out = run(args.jobs, args.steps, args.cluster, args.policy, args.timeout, args.warm_pool)
    width = max(len(k) for k in out)
    for k, v in out.items():
        print(f"{k:<{width}}  {v}")
    if args.json:
        print(json.dumps(out))


if __name__ == "__main__":
    main()
