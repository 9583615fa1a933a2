"""Scheduling overhead: wall time per policy call of ``has`` and ``sia`` as the cluster and the
queue grow (Frenzy paper Fig. 5a; Sia Fig. 9).

* Cluster size (Sia's scale_Nx method: the cluster AND the workload scale): Sia's 64-GPU
  heterogeneous cluster scaled N× (64 → 2,048 GPUs) replaying the matching ``scale_Nx``
  Saturn workload (every job issued N×) for the first ``--window`` hours of virtual time
  (default 4: the ramp-up and the busy hours with a full cluster, hundreds of running jobs
  and a standing queue; every call of that window, so the sample grows with the cluster —
  at 2,048 GPUs several hundred calls per policy). The percentiles are over the calls made
  while at least one job waits (the scheduling decisions proper); the calls with an empty
  queue are counted in the total policy time per replay, reported beside them, since
  neither policy is free then (HAS grows running jobs, Sia re-solves at round boundaries).

* Queue length (Frenzy's method): a NewWorkload queue of 10 → 1,000 jobs all submitted at
  time 0 on the 64-GPU cluster; the first ``--calls`` policy calls are timed (a short queue
  is served in one or a few calls, so its sample is that small).

Every call is the real ``Controller`` → ``policy.decide`` call of a replay (what a production
controller pays), caches warming up as they would. Prints a table; ``--json`` one JSON object
on the last line with has_p50_ms, has_p95_ms, sia_p50_ms, sia_p95_ms at the largest cluster,
speedup (sia / has medians) and the load average before and after. Writes
``docs/sched_overhead.png`` and ``docs/sched_overhead.md``.

    python -m benchmarks.sched_overhead [--quick] [--json]
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

from orchestrator.clusters import load_cluster
from simulator.metrics import json_ready, percentile
from simulator.replay import PlanCache, SimConfig, job_view, load_workloads, replay

POLICIES = ("has", "sia")
FULL_SCALES = (1, 2, 4, 8, 16, 32)
QUICK_SCALES = (1, 2)
FULL_QUEUES = (10, 30, 100, 300, 1000)
QUICK_QUEUES = (10,)


def _scale_workload(n: int) -> str:
    return "sia-saturn:1" if n == 1 else f"sia-scale_{n}x:1"


def measure(jobs_spec: str | None, queue: int | None, scale: int, policy: str, *,
            calls: int | None, window_s: float | None) -> tuple[list[float], list[float]]:
    """Wall seconds of each policy call of one bounded replay: (calls that had a job
    waiting, every call)."""
    cluster = load_cluster("sia-64", scale=scale).state
    cache = PlanCache(cluster)
    if queue is not None:
        mapped = load_workloads(f"newworkload-{queue}")[0][1]
    else:
        assert jobs_spec is not None
        mapped = load_workloads(jobs_spec)[0][1]
    views = [job_view(mj, cache) for mj in mapped]
    res = replay(views, cluster, policy,
                 config=SimConfig(max_policy_calls=calls, until_s=window_s))
    calls_made = res.controller.policy_calls
    return [w for pending, _, w in calls_made if pending], [w for _, _, w in calls_made]


def _stats(waiting: list[float], every: list[float]) -> dict[str, Any]:
    ms = [w * 1e3 for w in waiting]
    return {"p50_ms": percentile(ms, 50), "p95_ms": percentile(ms, 95),
            "max_ms": max(ms) if ms else math.nan, "calls": len(ms),
            "all_calls": len(every), "total_s": sum(every)}


def run(scales: tuple[int, ...], queues: tuple[int, ...], *, calls: int,
        window_h: float) -> dict[str, Any]:
    t0 = time.perf_counter()
    load_before = os.getloadavg()
    by_size: list[dict[str, Any]] = []
    for n in scales:
        row: dict[str, Any] = {"gpus": 64 * n, "scale": n}
        for pol in POLICIES:
            row[pol] = _stats(*measure(_scale_workload(n), None, n, pol, calls=None,
                                       window_s=window_h * 3600))
        by_size.append(row)
        logging.info("scale %dx done", n)
    by_queue: list[dict[str, Any]] = []
    for q in queues:
        row = {"queue": q, "gpus": 64}
        for pol in POLICIES:
            row[pol] = _stats(*measure(None, q, 1, pol, calls=calls, window_s=None))
        by_queue.append(row)
    last = by_size[-1]
    out = {
        "largest_gpus": last["gpus"],
        "has_p50_ms": last["has"]["p50_ms"], "has_p95_ms": last["has"]["p95_ms"],
        "sia_p50_ms": last["sia"]["p50_ms"], "sia_p95_ms": last["sia"]["p95_ms"],
        "speedup": last["sia"]["p50_ms"] / last["has"]["p50_ms"]
        if last["has"]["p50_ms"] else math.inf,
        "has_calls": last["has"]["calls"], "sia_calls": last["sia"]["calls"],
        "window_h": window_h, "queue_calls": calls,
        "by_size": by_size, "by_queue": by_queue,
        "wall_s": round(time.perf_counter() - t0, 1),
        "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in os.getloadavg()],
    }
    return out


def table(out: dict[str, Any]) -> str:
    lines = ["policy wall time per call with a job waiting (ms): median / p95 / max (calls)",
             f"cluster sweep: every call of the first {out['window_h']:g} virtual hours; "
             f"queue sweep: the first {out['queue_calls']} calls", ""]
    head = f"{'GPUs':>6}  " + "".join(f"{p:>35}" for p in POLICIES) + f"{'sia/has p50':>13}"
    lines += [head, "-" * len(head)]
    for row in out["by_size"]:
        cells = "".join(
            f"{row[p]['p50_ms']:>10.3f} /{row[p]['p95_ms']:>9.3f} /{row[p]['max_ms']:>8.1f}"
            f" ({row[p]['calls']:>4})" for p in POLICIES)
        ratio = row["sia"]["p50_ms"] / row["has"]["p50_ms"] if row["has"]["p50_ms"] else math.inf
        lines.append(f"{row['gpus']:>6}  {cells}{ratio:>12.0f}x")
    lines += ["", f"{'queue':>6}  " + "".join(f"{p:>35}" for p in POLICIES), "-" * len(head)]
    for row in out["by_queue"]:
        cells = "".join(
            f"{row[p]['p50_ms']:>10.3f} /{row[p]['p95_ms']:>9.3f} /{row[p]['max_ms']:>8.1f}"
            f" ({row[p]['calls']:>4})" for p in POLICIES)
        ratio = row["sia"]["p50_ms"] / row["has"]["p50_ms"] if row["has"]["p50_ms"] else math.inf
        lines.append(f"{row['queue']:>6}  {cells}{ratio:>12.0f}x")
    lines += ["", "every call of the cluster sweep (an empty queue included): calls / total "
              "policy time (ms)", "",
              f"{'GPUs':>6}  " + "".join(f"{p:>24}" for p in POLICIES) + f"{'sia/has total':>15}",
              "-" * 69]
    for row in out["by_size"]:
        cells = "".join(f"{row[p]['all_calls']:>10} /{row[p]['total_s'] * 1e3:>12.1f}"
                        for p in POLICIES)
        ratio = row["sia"]["total_s"] / row["has"]["total_s"] if row["has"]["total_s"] \
            else math.inf
        lines.append(f"{row['gpus']:>6}  {cells}{ratio:>14.0f}x")
    lb, la = out["load_before"], out["load_after"]
    lines += ["", f"at {out['largest_gpus']} GPUs: has p50 {out['has_p50_ms']:.3f} ms "
              f"({out['has_calls']} calls), sia p50 {out['sia_p50_ms']:.3f} ms "
              f"({out['sia_calls']} calls), speedup {out['speedup']:.0f}x "
              f"({out['wall_s']} s wall; load average {lb[0]:.2f} {lb[1]:.2f} {lb[2]:.2f} "
              f"before, {la[0]:.2f} {la[1]:.2f} {la[2]:.2f} after)"]
    return "\n".join(lines)


def plot(out: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.8))
    for pol in POLICIES:
        xs = [r["gpus"] for r in out["by_size"]]
        a.plot(xs, [r[pol]["p50_ms"] for r in out["by_size"]], "o-", label=f"{pol} median")
        a.plot(xs, [r[pol]["p95_ms"] for r in out["by_size"]], "x--", label=f"{pol} p95")
        qs = [r["queue"] for r in out["by_queue"]]
        b.plot(qs, [r[pol]["p50_ms"] for r in out["by_queue"]], "o-", label=f"{pol} median")
        b.plot(qs, [r[pol]["p95_ms"] for r in out["by_queue"]], "x--", label=f"{pol} p95")
    for ax, xl in ((a, "cluster GPUs (sia-64 × N, scale_Nx workload)"),
                   (b, "queued jobs (NewWorkload, 64 GPUs)")):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(xl)
        ax.set_ylabel("ms per policy call")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
    fig.suptitle("Scheduling overhead per policy call")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


NOTES = "## Notes"
"""The heading of the hand-written part of ``sched_overhead.md``, kept when it is rewritten."""


def write_doc(out: dict[str, Any], docs: Path, command: str) -> None:
    path = docs / "sched_overhead.md"
    old = path.read_text() if path.exists() else ""
    notes = old[old.index(NOTES):] if NOTES in old else ""
    text = "\n".join([
        "# Scheduling overhead benchmark",
        "",
        "Wall time of each `policy.decide` call made by the controller during bounded replays "
        "(see the module docstring of `benchmarks/sched_overhead.py` for the method).",
        "",
        f"Command: `{command}`.",
        "",
        "```",
        table(out),
        "```",
        "",
        "Targets: `has` ≤ 1 ms median at 2,048 GPUs and ≥ 100× faster than `sia`.",
        "",
        "![overhead](sched_overhead.png)",
        "",
    ]) + ("\n" + notes if notes else "")
    path.write_text(text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="64 and 128 GPUs; a 10-job queue")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--calls", type=int, default=None,
                    help="policy calls per queue-sweep point (default 40; quick 6)")
    ap.add_argument("--window", type=float, default=None,
                    help="virtual hours of the scale_Nx replays (default 4; quick 1)")
    ap.add_argument("--docs", default=None,
                    help="folder for the plot and the report (default docs/, nothing with "
                         "--quick); 'none' writes nothing")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    calls = args.calls or (6 if args.quick else 40)
    window = args.window or (1.0 if args.quick else 4.0)
    out = run(QUICK_SCALES if args.quick else FULL_SCALES,
              QUICK_QUEUES if args.quick else FULL_QUEUES, calls=calls, window_h=window)
    print(table(out))
    docs = args.docs or (None if args.quick else "docs")
    if docs == "none":
        docs = None
    if docs:
        plot(out, Path(docs) / "sched_overhead.png")
        write_doc(out, Path(docs), "python -m benchmarks.sched_overhead"
                  + (" --quick" if args.quick else ""))
    if args.json:
        print(json.dumps(json_ready(out, 4), sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
