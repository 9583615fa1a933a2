"""JCT of ``has`` against the honest ``sia`` and ``opportunistic`` on the validation split
(``benchmarks.splits``), on two clusters, side by side in one run.

Each validation set contributes its first workload file, cut to its first ``--max-jobs`` jobs
(the machine this runs on has two shared cores); every (workload, cluster, policy) triple is
one replay through the production control loop (``simulator.replay``). A margin is
``1 - avg JCT of has / avg JCT of the other``, in percent (positive: ``has`` is faster).

``--json`` prints one JSON object on the last line: per cluster ``has_vs_sia_median_pct``,
``has_vs_sia_min_pct``, ``has_vs_sia_max_pct``, ``has_vs_opportunistic_median_pct``,
``workloads_has_worse_than_sia_by_5pct``, and ``policy_crashes`` (replays that raised), plus
every workload's figures. Without prediction error each row also has ``bound_avg_jct_s``,
the average JCT no policy can beat (every job alone on its fastest plan from its arrival),
and ``bound_vs_sia_pct``, the most any policy could gain over ``sia`` there.

``--split tuning`` replays every file of the tuning sets and the tuning windows of the
windowed sets instead (full length unless ``--max-jobs`` is given): the workloads on which
thresholds may be chosen. ``--clusters``
picks clusters; ``--sets`` (comma-separated trace sets, or ``<set>:<k>`` workloads) replaces
the split's sets, e.g. ``--sets alibaba-openb:1,alibaba-openb:2``. ``--has-variant
NAME=JSON`` (repeatable) adds ``has`` built with those keyword arguments as one more column,
with its own margins (``NAME_vs_sia_pct`` ...), so that a change to ``has`` is measured
before and after in one run: e.g. ``--has-variant 'before={"exchange_gain": null}'``.

    python -m benchmarks.validation --split tuning --clusters hetero-128 --json
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import statistics
import sys
import time
from typing import Any

from benchmarks.jct import _config
from benchmarks.splits import VALIDATION, first_files, tuning_workloads
from orchestrator.clusters import load_cluster
from scheduler.cluster import ClusterState
from scheduler.job import JobView
from simulator.error import ERROR_MODES
from simulator.metrics import combine, json_ready
from simulator.replay import PlanCache, SimConfig, Task, job_view, load_workloads, run_tasks

log = logging.getLogger("benchmarks.validation")

CLUSTERS = ("phoebe", "hetero-128")
POLICIES = ("has", "sia", "opportunistic")
QUICK_SETS = ("sia-rate_10", "pollux-0.5", "sia-phoebe")


def margin_pct(has: float, other: float) -> float:
    """``1 - has / other`` in percent: how much lower ``has``'s average JCT is."""
    return 100.0 * (1.0 - has / other)


def workload_views(spec: str, index: int, cluster: str, max_jobs: int | None
                   ) -> tuple[list[JobView], ClusterState]:
    """A workload's jobs as a replay submits them on ``cluster`` (error-free plans, cut to
    ``max_jobs``), and the cluster; the plans are cached per cluster across workloads."""
    got = _BOUND_CACHES.get(cluster)
    if got is None:
        state = load_cluster(cluster).state
        got = _BOUND_CACHES[cluster] = (state, PlanCache(state))
    state, cache = got
    mapped = load_workloads(spec)[index][1]
    if max_jobs is not None:
        mapped = mapped[:max_jobs]
    return [job_view(m, cache) for m in mapped], state


def bound_avg_jct_s(spec: str, index: int, cluster: str, max_jobs: int | None) -> float:
    """The average JCT no policy can beat on a workload (error-free replay): every job
    started on arrival on its fastest plan, alone, paying only the launch delay. Each plan
    is timed packed on the cluster's network, and a placement only slows a plan down, so no
    job can end sooner. Where ``sia`` is within a few percent of this bound, no policy can
    beat it by more."""
    views, _ = workload_views(spec, index, cluster, max_jobs)
    if not views:
        return math.nan
    launch = SimConfig().launch_delay_s
    return sum(min((p.job_time_s for p in v.plans), default=math.inf) + launch
               for v in views) / len(views)


_BOUND_CACHES: dict[str, tuple[ClusterState, PlanCache]] = {}
"""Per cluster: its state and plans (the plans do not depend on the cut)."""


def workloads_of(split: str, sets: tuple[str, ...]) -> list[tuple[str, str, int]]:
    """(label, spec, index) of each workload a split replays: the first file of each set
    (validation) or every file of each set (tuning, labelled ``<set>:<k>``)."""
    if split == "validation":
        return [(w, w, 0) for w in first_files(sets)]
    out = []
    for s in sets:
        n = len(load_workloads(s))
        out.extend((f"{s}:{k + 1}" if n > 1 else s, s, k) for k in range(n))
    return out


def run(sets: tuple[str, ...], *, max_jobs: int | None, workers: int, error: str = "none",
        split: str = "validation", clusters: tuple[str, ...] = CLUSTERS,
        variants: dict[str, dict[str, Any]] | None = None, error_seed: int = 0,
        correct: bool = True) -> dict[str, Any]:
    variants = variants or {}
    policies = ("has", *variants, "sia", "opportunistic")
    mine = ("has", *variants)  # the columns whose margins are reported
    built = {p: (p if p in POLICIES else "has", tuple(sorted(variants.get(p, {}).items())))
             for p in policies}
    workloads = workloads_of(split, sets)
    cells = [(cl, label, p) for cl in clusters for label, _, _ in workloads for p in policies]
    spec_of = {label: (spec, k) for label, spec, k in workloads}
    tasks = [Task(spec_of[w][0], spec_of[w][1], cl, None, built[p][0],
                  config=_config(built[p][0], error, error_seed, correct), max_jobs=max_jobs,
                  policy_kwargs=built[p][1]) for cl, w, p in cells]
    t0 = time.perf_counter()
    crashes: list[str] = []
    got: dict[tuple[str, str, str], Any] = {}
    try:  # results come back in the order of ``tasks``
        for cell, (_, _, m) in zip(cells, run_tasks(tasks, workers=workers), strict=True):
            got[cell] = combine([m])
    except Exception as exc:  # one replay raised: report it, run the rest one by one
        log.warning("a replay raised (%s); running the tasks one at a time", exc)
        got = {}
        for cell, t in zip(cells, tasks, strict=True):
            try:
                (_, _, m), = run_tasks([t], workers=1)
                got[cell] = combine([m])
            except Exception as e:
                crashes.append(f"{cell[1]} {cell[0]} {cell[2]}: {e}")
    out: dict[str, Any] = {"split": split, "max_jobs": max_jobs, "error": error,
                           **({"error_seed": error_seed, "correct": correct}
                              if error != "none" else {}),
                           "policy_crashes": len(crashes), "crashes": crashes,
                           "variants": variants, "clusters": {}}
    for cl in clusters:
        rows = []
        for w, _, _ in workloads:
            figs = {p: got.get((cl, w, p)) for p in policies}
            if any(f is None for f in figs.values()):
                continue
            row: dict[str, Any] = {
                "workload": w,
                **{f"{p}_avg_jct_s": figs[p]["avg_jct_s"] for p in policies},
                **{f"{p}_unfinished": figs[p]["unfinished"] for p in policies},
                **{f"{p}_restarts_per_job": figs[p]["restarts_per_job"] for p in policies},
            }
            if error == "none":  # what the best policy could gain over sia at most
                spec, k = spec_of[w]
                row["bound_avg_jct_s"] = bound_avg_jct_s(spec, k, cl, max_jobs)
                row["bound_vs_sia_pct"] = margin_pct(row["bound_avg_jct_s"],
                                                     figs["sia"]["avg_jct_s"])
            for p in mine:
                row[f"{p}_vs_sia_pct"] = margin_pct(figs[p]["avg_jct_s"],
                                                    figs["sia"]["avg_jct_s"])
                row[f"{p}_vs_opportunistic_pct"] = margin_pct(
                    figs[p]["avg_jct_s"], figs["opportunistic"]["avg_jct_s"])
            rows.append(row)
        res: dict[str, Any] = {"workloads": rows}
        if rows and "bound_vs_sia_pct" in rows[0]:
            room = [r["bound_vs_sia_pct"] for r in rows]
            res["bound_vs_sia_median_pct"] = statistics.median(room)
            res["workloads_bound_below_12pct_of_sia"] = sum(v < 12.0 for v in room)
        for p in mine:
            vs_sia = [r[f"{p}_vs_sia_pct"] for r in rows]
            vs_opp = [r[f"{p}_vs_opportunistic_pct"] for r in rows]
            res.update({
                f"{p}_vs_sia_median_pct": statistics.median(vs_sia) if rows else None,
                f"{p}_vs_sia_min_pct": min(vs_sia) if rows else None,
                f"{p}_vs_sia_max_pct": max(vs_sia) if rows else None,
                f"{p}_vs_opportunistic_median_pct": statistics.median(vs_opp) if rows else None,
                f"workloads_{p}_worse_than_sia_by_5pct": sum(v < -5.0 for v in vs_sia),
            })
        out["clusters"][cl] = res
    out["wall_s"] = round(time.perf_counter() - t0, 1)
    return out


def table(out: dict[str, Any]) -> str:
    mine = ("has", *out.get("variants", {}))
    policies = (*mine, "sia", "opportunistic")
    short = {"opportunistic": "opp"}
    what = (f"first {out['max_jobs']} jobs of each set's first workload"
            if out.get("split", "validation") == "validation" else
            "every file of each tuning set" + (f", first {out['max_jobs']} jobs"
                                               if out["max_jobs"] else ""))
    lines = [f"{out.get('split', 'validation')} split, {what}; error={out['error']}; "
             "avg JCT in hours; margin = 1 - has/other"]
    for cl, res in out["clusters"].items():
        head = f"{'workload':<22}" + "".join(f"{short.get(p, p)[:8]:>9}" for p in policies)
        for p in mine:
            tag = "" if p == "has" else f" {p[:6]}"
            head += f"{'vs sia' + tag:>14}{'vs opp' + tag:>14}"
        head += f"{'unfin h/s/o':>13}{'restarts/job h/s':>18}"
        bound = bool(res["workloads"]) and "bound_avg_jct_s" in res["workloads"][0]
        if bound:
            head += f"{'bound':>8}{'bound vs sia':>14}"
        lines += ["", f"{cl}:", head]
        for r in res["workloads"]:
            line = f"{r['workload']:<22}" + "".join(
                f"{r[f'{p}_avg_jct_s'] / 3600:9.2f}" for p in policies)
            for p in mine:
                line += (f"{r[f'{p}_vs_sia_pct']:+13.1f}%"
                         f"{r[f'{p}_vs_opportunistic_pct']:+13.1f}%")
            line += (f"{r['has_unfinished']:>5}/{r['sia_unfinished']}/"
                     f"{r['opportunistic_unfinished']}"
                     f"{r['has_restarts_per_job']:>10.2f}/{r['sia_restarts_per_job']:.2f}")
            if bound:
                line += f"{r['bound_avg_jct_s'] / 3600:8.2f}{r['bound_vs_sia_pct']:+13.1f}%"
            lines.append(line)
        if res["workloads"]:
            for p in mine:
                lines.append(
                    f"median {p} vs sia {res[f'{p}_vs_sia_median_pct']:+.1f}% "
                    f"(min {res[f'{p}_vs_sia_min_pct']:+.1f}%, max "
                    f"{res[f'{p}_vs_sia_max_pct']:+.1f}%); vs opportunistic "
                    f"{res[f'{p}_vs_opportunistic_median_pct']:+.1f}%; {p} > 5% worse than "
                    f"sia on {res[f'workloads_{p}_worse_than_sia_by_5pct']} of "
                    f"{len(res['workloads'])}")
            if "bound_vs_sia_median_pct" in res:
                lines.append(
                    f"bound (every job alone on its fastest plan) vs sia: median "
                    f"{res['bound_vs_sia_median_pct']:+.1f}%; below +12% on "
                    f"{res['workloads_bound_below_12pct_of_sia']} of {len(res['workloads'])}")
    lines.append(f"policy crashes: {out['policy_crashes']}; wall {out['wall_s']} s")
    return "\n".join(lines)


def _variant(text: str) -> tuple[str, dict[str, Any]]:
    name, sep, kwargs = text.partition("=")
    if not sep or not name.isidentifier() or name in POLICIES:
        raise argparse.ArgumentTypeError(f"expected NAME=JSON with a new NAME, got {text!r}")
    try:
        parsed = json.loads(kwargs)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"{name}: not JSON ({exc})") from exc
    if not isinstance(parsed, dict):
        raise argparse.ArgumentTypeError(f"{name}: expected a JSON object")
    return name, parsed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--split", choices=("validation", "tuning"), default="validation",
                    help="validation (default): each set's first file; tuning: every file of "
                         "the tuning sets, full length")
    ap.add_argument("--sets", default=None,
                    help="comma-separated trace sets or <set>:<k> workloads replayed instead of "
                         "the split's (first workload of each under --split validation)")
    ap.add_argument("--clusters", default=",".join(CLUSTERS),
                    help=f"comma-separated (default {','.join(CLUSTERS)})")
    ap.add_argument("--max-jobs", type=int, default=None,
                    help="first N jobs of each workload (default 150 on the validation split, "
                         "every job on the tuning split)")
    ap.add_argument("--quick", action="store_true",
                    help=f"three small sets ({', '.join(QUICK_SETS)}), first 20 jobs")
    ap.add_argument("--has-variant", type=_variant, action="append", default=[],
                    metavar="NAME=JSON", help="one more has column built with these keyword "
                                              "arguments (repeatable)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--error", choices=ERROR_MODES, default="none")
    ap.add_argument("--error-seed", type=int, default=0,
                    help="seed of the per-job error draws (default 0)")
    ap.add_argument("--no-correction", action="store_true",
                    help="under --error, policies plan on the predictions alone, not on step "
                         "times corrected from observed ones (scheduler.corrected)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    if args.quick:
        sets, max_jobs = QUICK_SETS, 20
    elif args.split == "tuning":
        sets, max_jobs = tuning_workloads(), args.max_jobs
    else:
        sets, max_jobs = VALIDATION, args.max_jobs or 150
    if args.sets is not None:
        sets = tuple(s for s in args.sets.split(",") if s)
        if not sets:
            ap.error("--sets: expected at least one trace set")
    clusters = tuple(c for c in args.clusters.split(",") if c)
    out = run(sets, max_jobs=max_jobs, workers=args.workers, error=args.error,
              split="validation" if args.quick else args.split, clusters=clusters,
              variants=dict(args.has_variant), error_seed=args.error_seed,
              correct=not args.no_correction)
    print(table(out))
    if args.json:
        print(json.dumps(json_ready(out, 4), sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
