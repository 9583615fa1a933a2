"""Pool ``benchmarks.validation --error measured`` runs over error seeds.

One ``--error measured`` run is one draw of every job's true step time: on the light
validation workloads a few long jobs carry most of the average JCT, so one draw moves a
workload's ``has`` vs ``sia`` margin by ±10 points. This reads several runs (their ``--json``
last lines, one per ``--error-seed``) of the same split and clusters and reports, per cluster
and workload, each seed's margin, their median, and the pooled margin 1 − mean ``has`` avg
JCT / mean ``sia`` avg JCT over the seeds (the expected JCTs' ratio), then the cluster's
medians and the workloads more than 5 % behind ``sia``.

    python -m benchmarks.seed_pool docs/validation_measured.json \
        docs/validation_measured_seed*.json [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from benchmarks.validation import margin_pct

WORSE_PCT = -5.0
"""A workload counts as behind ``sia`` when its margin is below this (the issue's 5 %)."""


def pool(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per cluster: every workload's per-seed margins, their median, the pooled margin, and the
    cluster's medians of both and the workloads behind ``sia`` by more than 5 % by each.

    ``ValueError`` when the runs are not of one split, cluster set and job cut, or two share
    a seed."""
    if not runs:
        raise ValueError("no runs to pool")
    keys = {(r.get("split"), r.get("max_jobs"), r.get("error"), r.get("correct", False),
             tuple(sorted(r["clusters"]))) for r in runs}
    if len(keys) != 1:
        raise ValueError("runs differ in split / max_jobs / error / correction / clusters: "
                         f"{sorted(keys)}")
    seeds = [r.get("error_seed", 0) for r in runs]
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"two runs share an error seed: {seeds}")
    out: dict[str, Any] = {"seeds": seeds, "error": runs[0].get("error"),
                           "correct": runs[0].get("correct", False), "clusters": {}}
    for cl in sorted(runs[0]["clusters"]):
        rows: dict[str, list[dict[str, Any]]] = {}
        for r in runs:
            for w in r["clusters"][cl]["workloads"]:
                rows.setdefault(w["workload"], []).append(w)
        table = []
        for name, ws in rows.items():
            if len(ws) != len(runs):
                raise ValueError(f"{cl} {name}: in {len(ws)} of {len(runs)} runs")
            margins = [w["has_vs_sia_pct"] for w in ws]
            has = statistics.fmean(w["has_avg_jct_s"] for w in ws)
            sia = statistics.fmean(w["sia_avg_jct_s"] for w in ws)
            opp = statistics.fmean(w["opportunistic_avg_jct_s"] for w in ws)
            table.append({"workload": name, "has_vs_sia_pct_by_seed": margins,
                          "has_vs_sia_median_pct": statistics.median(margins),
                          "has_vs_sia_pooled_pct": margin_pct(has, sia),
                          "has_vs_opportunistic_pooled_pct": margin_pct(has, opp)})
        med = [t["has_vs_sia_median_pct"] for t in table]
        pooled = [t["has_vs_sia_pooled_pct"] for t in table]
        out["clusters"][cl] = {
            "workloads": table,
            "has_vs_sia_median_of_medians_pct": statistics.median(med),
            "has_vs_sia_median_of_pooled_pct": statistics.median(pooled),
            "has_vs_opportunistic_median_of_pooled_pct": statistics.median(
                t["has_vs_opportunistic_pooled_pct"] for t in table),
            "per_seed_median_pct": [r["clusters"][cl]["has_vs_sia_median_pct"] for r in runs],
            "per_seed_worse_than_sia_by_5pct": [
                r["clusters"][cl]["workloads_has_worse_than_sia_by_5pct"] for r in runs],
            "worse_than_sia_by_5pct_median": sum(m < WORSE_PCT for m in med),
            "worse_than_sia_by_5pct_pooled": sum(p < WORSE_PCT for p in pooled),
        }
    return out


def table(out: dict[str, Any]) -> str:
    seeds = out["seeds"]
    lines = [f"error={out['error']}, seeds {', '.join(map(str, seeds))}; has vs sia, % "
             "(positive: has faster); pooled = 1 - mean has JCT / mean sia JCT"]
    for cl, res in out["clusters"].items():
        lines += ["", f"{cl}:", f"{'workload':22s}" + "".join(f"{'s' + str(s):>8s}" for s in seeds)
                  + f"{'median':>9s}{'pooled':>9s}"]
        for t in res["workloads"]:
            lines.append(f"{t['workload']:22s}"
                         + "".join(f"{m:+8.1f}" for m in t["has_vs_sia_pct_by_seed"])
                         + f"{t['has_vs_sia_median_pct']:+9.1f}{t['has_vs_sia_pooled_pct']:+9.1f}")
        lines.append(
            f"median over workloads: of medians {res['has_vs_sia_median_of_medians_pct']:+.1f} %, "
            f"of pooled {res['has_vs_sia_median_of_pooled_pct']:+.1f} % (per seed: "
            + ", ".join(f"{m:+.1f}" for m in res["per_seed_median_pct"]) + "); > 5 % behind sia: "
            f"{res['worse_than_sia_by_5pct_median']} by median, "
            f"{res['worse_than_sia_by_5pct_pooled']} pooled (per seed: "
            + ", ".join(map(str, res["per_seed_worse_than_sia_by_5pct"])) + "); vs opportunistic "
            f"pooled median {res['has_vs_opportunistic_median_of_pooled_pct']:+.1f} %")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path,
                    help="benchmarks.validation --json outputs (a file whose last line is it)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    runs = []
    for p in args.runs:
        try:
            runs.append(json.loads(p.read_text().strip().splitlines()[-1]))
        except (OSError, IndexError, json.JSONDecodeError) as exc:
            ap.error(f"{p}: not a benchmarks.validation --json output ({exc})")
    try:
        out = pool(runs)
    except (ValueError, KeyError) as exc:
        ap.error(str(exc))
    print(table(out))
    if args.json:
        print(json.dumps(out, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
