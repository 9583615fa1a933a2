"""JCT of ``has`` against the honest ``sia`` and ``opportunistic`` on the validation split
(``benchmarks.splits``), on two clusters, side by side in one run.

Each validation set contributes its first workload file, cut to its first ``--max-jobs`` jobs
(the machine this runs on has two shared cores); every (workload, cluster, policy) triple is
one replay through the production control loop (``simulator.replay``). A margin is
``1 - avg JCT of has / avg JCT of the other``, in percent (positive: ``has`` is faster).

``--json`` prints one JSON object on the last line: per cluster ``has_vs_sia_median_pct``,
``has_vs_sia_min_pct``, ``has_vs_sia_max_pct``, ``has_vs_opportunistic_median_pct``,
``workloads_has_worse_than_sia_by_5pct``, and ``policy_crashes`` (replays that raised), plus
every workload's figures.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time
from typing import Any

from benchmarks.jct import _config
from benchmarks.splits import VALIDATION, first_files
from simulator.error import ERROR_MODES
from simulator.metrics import combine, json_ready
from simulator.replay import Task, run_tasks

log = logging.getLogger("benchmarks.validation")

CLUSTERS = ("phoebe", "hetero-128")
POLICIES = ("has", "sia", "opportunistic")
QUICK_SETS = ("sia-rate_10", "pollux-0.5", "sia-phoebe")


def margin_pct(has: float, other: float) -> float:
    """``1 - has / other`` in percent: how much lower ``has``'s average JCT is."""
    return 100.0 * (1.0 - has / other)


def run(sets: tuple[str, ...], *, max_jobs: int, workers: int, error: str = "none"
        ) -> dict[str, Any]:
    workloads = first_files(sets)
    tasks = [Task(w, 0, cl, None, pol, config=_config(pol, error), max_jobs=max_jobs)
             for cl in CLUSTERS for w in workloads for pol in POLICIES]
    t0 = time.perf_counter()
    crashes: list[str] = []
    results = []
    try:
        results = run_tasks(tasks, workers=workers)
    except Exception as exc:  # one replay raised: report it, run the rest one by one
        log.warning("a replay raised (%s); running the tasks one at a time", exc)
        for t in tasks:
            try:
                results.extend(run_tasks([t], workers=1))
            except Exception as e:
                crashes.append(f"{t.workload} {t.cluster} {t.policy}: {e}")
    got: dict[tuple[str, str, str], Any] = {}
    for task, _, m in results:
        got[(task.cluster, task.workload, task.policy)] = combine([m])
    out: dict[str, Any] = {"max_jobs": max_jobs, "error": error, "policy_crashes": len(crashes),
                           "crashes": crashes, "clusters": {}}
    for cl in CLUSTERS:
        rows = []
        for w in workloads:
            figs = {p: got.get((cl, w, p)) for p in POLICIES}
            if any(f is None for f in figs.values()):
                continue
            rows.append({
                "workload": w,
                **{f"{p}_avg_jct_s": figs[p]["avg_jct_s"] for p in POLICIES},
                **{f"{p}_unfinished": figs[p]["unfinished"] for p in POLICIES},
                **{f"{p}_restarts_per_job": figs[p]["restarts_per_job"] for p in POLICIES},
                "has_vs_sia_pct": margin_pct(figs["has"]["avg_jct_s"], figs["sia"]["avg_jct_s"]),
                "has_vs_opportunistic_pct": margin_pct(figs["has"]["avg_jct_s"],
                                                       figs["opportunistic"]["avg_jct_s"]),
            })
        vs_sia = [r["has_vs_sia_pct"] for r in rows]
        vs_opp = [r["has_vs_opportunistic_pct"] for r in rows]
        out["clusters"][cl] = {
            "workloads": rows,
            "has_vs_sia_median_pct": statistics.median(vs_sia) if rows else None,
            "has_vs_sia_min_pct": min(vs_sia) if rows else None,
            "has_vs_sia_max_pct": max(vs_sia) if rows else None,
            "has_vs_opportunistic_median_pct": statistics.median(vs_opp) if rows else None,
            "workloads_has_worse_than_sia_by_5pct": sum(v < -5.0 for v in vs_sia),
        }
    out["wall_s"] = round(time.perf_counter() - t0, 1)
    return out


def table(out: dict[str, Any]) -> str:
    lines = [f"validation split, first {out['max_jobs']} jobs of each set's first workload; "
             f"error={out['error']}; avg JCT in hours; margin = 1 - has/other"]
    for cl, res in out["clusters"].items():
        lines += ["", f"{cl}:",
                  f"{'workload':<22}{'has':>8}{'sia':>8}{'opp':>8}{'vs sia':>9}{'vs opp':>9}"
                  f"{'unfin h/s/o':>13}{'restarts/job h/s':>18}"]
        for r in res["workloads"]:
            lines.append(
                f"{r['workload']:<22}{r['has_avg_jct_s'] / 3600:8.2f}"
                f"{r['sia_avg_jct_s'] / 3600:8.2f}{r['opportunistic_avg_jct_s'] / 3600:8.2f}"
                f"{r['has_vs_sia_pct']:+8.1f}%{r['has_vs_opportunistic_pct']:+8.1f}%"
                f"{r['has_unfinished']:>5}/{r['sia_unfinished']}/{r['opportunistic_unfinished']}"
                f"{r['has_restarts_per_job']:>10.2f}/{r['sia_restarts_per_job']:.2f}")
        if res["workloads"]:
            lines.append(f"median has vs sia {res['has_vs_sia_median_pct']:+.1f}% "
                         f"(min {res['has_vs_sia_min_pct']:+.1f}%, max "
                         f"{res['has_vs_sia_max_pct']:+.1f}%); vs opportunistic "
                         f"{res['has_vs_opportunistic_median_pct']:+.1f}%; has > 5% worse than "
                         f"sia on {res['workloads_has_worse_than_sia_by_5pct']} of "
                         f"{len(res['workloads'])}")
    lines.append(f"policy crashes: {out['policy_crashes']}; wall {out['wall_s']} s")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-jobs", type=int, default=150,
                    help="first N jobs of each workload (default 150)")
    ap.add_argument("--quick", action="store_true",
                    help=f"three small sets ({', '.join(QUICK_SETS)}), first 20 jobs")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--error", choices=ERROR_MODES, default="none")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    sets = QUICK_SETS if args.quick else VALIDATION
    out = run(sets, max_jobs=20 if args.quick else args.max_jobs, workers=args.workers,
              error=args.error)
    print(table(out))
    if args.json:
        print(json.dumps(json_ready(out, 4), sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
