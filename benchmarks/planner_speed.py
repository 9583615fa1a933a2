"""Planner speed: wall time to rank every plan of a job against all catalog GPU types.

    python -m benchmarks.planner_speed [--jobs 200] [--runtime frenzy] [--json]

Jobs are drawn (seeded) from the model catalog with varied global batch, sequence length,
precision and optimizer. Reports p50 / p99 milliseconds per job (target: p99 <= 50 ms), wall
time and the planning thread's CPU time, and the host's 1-minute load average. Plans are
priced for ``--runtime`` (default: the built-in trainer's, which the service plans for jobs
that name none; ``reference`` searches every pipeline depth and ZeRO stage).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import statistics
import sys
import time

from predictor.gpus import load_gpu_catalog
from predictor.planner import plan_job
from predictor.runtimes import DEFAULT_RUNTIME
from predictor.spec import MODEL_CATALOG, TrainingSpec

log = logging.getLogger("benchmarks.planner_speed")


def make_jobs(n: int, seed: int = 0) -> list[tuple[str, TrainingSpec]]:
    """``n`` (model name, training spec) pairs covering the whole catalog."""
    rng = random.Random(seed)
    names = sorted(MODEL_CATALOG)
    jobs = []
    for i in range(n):
        name = names[i % len(names)]
        model = MODEL_CATALOG[name]
        seqs = [s for s in (512, 1024, 2048, 4096, 8192) if s <= model.max_seq_len]
        jobs.append((name, TrainingSpec(
            global_batch=rng.choice([8, 16, 32, 64, 128, 256, 512]),
            seq_len=rng.choice(seqs),
            precision=rng.choice(["bf16", "fp16", "bf16", "fp32"]),
            optimizer=rng.choice(["adamw", "adam", "sgd"]),
            steps=rng.choice([100, 1000, 10000]),
        )))
    return jobs


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 100])."""
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, round(q / 100 * len(ordered) + 0.5) - 1))
    return ordered[k]


def run(n_jobs: int, seed: int = 0, runtime: str = DEFAULT_RUNTIME) -> dict:
    load_before = os.getloadavg()[0]
    gpus = list(load_gpu_catalog().values())
    jobs = make_jobs(n_jobs, seed)
    plan_job(MODEL_CATALOG["gpt2"], jobs[0][1], gpus, runtime=runtime)  # warm caches/imports
    times, cpu_times, feasible, counts = [], [], 0, []
    for i, (name, train) in enumerate(jobs, start=1):
        t0, c0 = time.perf_counter(), time.thread_time()
        result = plan_job(MODEL_CATALOG[name], train, gpus, runtime=runtime)
        times.append((time.perf_counter() - t0) * 1e3)
        cpu_times.append((time.thread_time() - c0) * 1e3)
        feasible += bool(result.plans)
        counts.append(result.considered)
        if i % 50 == 0:
            log.info("%d/%d jobs planned", i, len(jobs))
    return {
        "jobs": len(jobs),
        "runtime": runtime,
        "gpu_types": len(gpus),
        "ms_per_job_p50": round(statistics.median(times), 3),
        "ms_per_job_p99": round(percentile(times, 99), 3),
        "ms_per_job_max": round(max(times), 3),
        # CPU time of the planning thread: what the job costs when the host's cores are
        # oversubscribed (wall time then includes waiting for a core)
        "cpu_ms_per_job_p50": round(statistics.median(cpu_times), 3),
        "cpu_ms_per_job_p99": round(percentile(cpu_times, 99), 3),
        "feasible_jobs": feasible,
        "fitting_plans_evaluated_p50": statistics.median(counts),
        "target_p99_ms": 50,
        # 1-minute load average before and after: the figures are wall time on a shared host
        "load_avg_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--runtime", default=DEFAULT_RUNTIME)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
    res = run(args.jobs, args.seed, args.runtime)
    print(f"planner speed over {res['jobs']} jobs x {res['gpu_types']} GPU types")
    print(f"{'p50 ms/job':>12} {'p99 ms/job':>12} {'max ms':>10} {'feasible':>9}")
    print(f"{res['ms_per_job_p50']:>12.2f} {res['ms_per_job_p99']:>12.2f} "
          f"{res['ms_per_job_max']:>10.2f} {res['feasible_jobs']:>9}")
    print(f"CPU time p50 / p99 ms/job: {res['cpu_ms_per_job_p50']:.2f} / "
          f"{res['cpu_ms_per_job_p99']:.2f}")
    print(f"load average (1 min) before / after: {res['load_avg_1m'][0]:.2f} / "
          f"{res['load_avg_1m'][1]:.2f}")
    if args.json:
        print(json.dumps(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
