"""The policies' margins with and without prediction error in the simulator, side by side.

    python -m benchmarks.sim_error [--json] [--seeds 3] [--max-jobs-jct 20] [--max-jobs-ddl 40]

For each workload and cluster, replays ``has`` / ``sia`` / ``opportunistic`` (JCT, as in
``benchmarks.jct``) and ``elastic`` / ``elasticflow`` (deadlines, as in
``benchmarks.deadlines``) under ``--error none`` and under ``--error measured`` with error
seeds 0 … ``seeds`` − 1 (the error model: ``simulator.error``), and reports

* ``has`` avg-JCT reduction vs ``sia`` and vs ``opportunistic`` (points), none vs the mean over
  the error seeds, and the shrink (positive: the margin got smaller);
* ``elastic`` / ``elasticflow`` deadlines-met ratio, none vs the mean over the error seeds,
  and the relative shrink;
* the same for ``elastic`` without the online estimator (``estimator`` off) as an ablation.

Workloads: ``TUNING`` (the quick sets of the two benchmarks, on which the estimator's margin
quantile was chosen) and ``VALIDATION`` (other files of the same trace families, on both
clusters for deadlines); only the first ``--max-jobs-*`` jobs of each (2 shared cores).
The last line of ``--json`` is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
from typing import Any

from simulator.metrics import json_ready

TUNING_JCT = ("sia-philly:1", "sia-saturn:1", "newworkload-30")
VALIDATION_JCT = ("sia-philly:3", "sia-saturn:2", "sia-saturn:4")
TUNING_DDL = (("sia-philly:1", "phoebe"), ("elasticflow", "phoebe"))
VALIDATION_DDL = (("sia-philly:3", "phoebe"), ("sia-saturn:2", "phoebe"),
                  ("sia-philly:3", "hetero-128"), ("sia-saturn:2", "hetero-128"))


def _jct(spec: str, error: str, seed: int, max_jobs: int) -> dict[str, float]:
    from benchmarks import jct

    out = jct.run((spec,), ("has", "sia", "opportunistic"), workers=1, max_jobs=max_jobs,
                  progress=False, error=error, error_seed=seed)
    has = out["results"][spec]["has"]
    return {"vs_sia": 100.0 * has.get("jct_reduction_vs_sia", float("nan")),
            "vs_opp": 100.0 * has.get("jct_reduction_vs_opportunistic", float("nan"))}


def _ddl(spec: str, cluster: str, error: str, seed: int, max_jobs: int,
         estimator: bool) -> dict[str, float]:
    from benchmarks import deadlines

    out = deadlines.run((spec,), ("elastic", "elasticflow"), (cluster,), workers=1,
                        max_jobs=max_jobs, error=error, error_seed=seed, estimator=estimator)
    r = out["results"][f"{spec}@{cluster}"]
    return {"elastic": r["elastic"]["deadline_ratio"],
            "elasticflow": r["elasticflow"]["deadline_ratio"],
            "ratio": r["elastic"].get("ratio_vs_elasticflow", float("nan"))}


def run(seeds: int, max_jobs_jct: int, max_jobs_ddl: int) -> dict[str, Any]:
    out: dict[str, Any] = {"seeds": seeds, "max_jobs_jct": max_jobs_jct,
                           "max_jobs_ddl": max_jobs_ddl, "jct": {}, "deadlines": {}}
    for split, specs in (("tuning", TUNING_JCT), ("validation", VALIDATION_JCT)):
        for spec in specs:
            base = _jct(spec, "none", 0, max_jobs_jct)
            err = [_jct(spec, "measured", s, max_jobs_jct) for s in range(seeds)]
            row: dict[str, Any] = {"split": split}
            for k in ("vs_sia", "vs_opp"):
                m = statistics.fmean(e[k] for e in err)
                row[k] = {"none": base[k], "measured": m, "measured_each": [e[k] for e in err],
                          "shrink_points": base[k] - m}
            out["jct"][spec] = row
    for split, pairs in (("tuning", TUNING_DDL), ("validation", VALIDATION_DDL)):
        for spec, cluster in pairs:
            base = _ddl(spec, cluster, "none", 0, max_jobs_ddl, True)
            row = {"split": split, "none": base}
            for label, est in (("measured", True), ("measured_no_estimator", False)):
                err = [_ddl(spec, cluster, "measured", s, max_jobs_ddl, est)
                       for s in range(seeds)]
                ratio = statistics.fmean(e["ratio"] for e in err)
                row[label] = {"ratio": ratio, "ratio_each": [e["ratio"] for e in err],
                              "elastic_each": [e["elastic"] for e in err],
                              "elasticflow_each": [e["elasticflow"] for e in err],
                              "shrink_pct": 100.0 * (1.0 - ratio / base["ratio"])
                              if base["ratio"] else float("nan")}
            out["deadlines"][f"{spec}@{cluster}"] = row
    return out


def table(out: dict[str, Any]) -> str:
    lines = [f"has avg-JCT reduction (points), none vs measured (mean of {out['seeds']} error "
             f"seeds; first {out['max_jobs_jct']} jobs, phoebe)",
             f"{'workload':16s} {'split':11s} {'vs sia none':>11s} {'measured':>9s} "
             f"{'shrink':>7s} {'vs opp none':>11s} {'measured':>9s} {'shrink':>7s}"]
    for spec, r in out["jct"].items():
        s, o = r["vs_sia"], r["vs_opp"]
        lines.append(f"{spec:16s} {r['split']:11s} {s['none']:+11.1f} {s['measured']:+9.1f} "
                     f"{s['shrink_points']:+7.1f} {o['none']:+11.1f} {o['measured']:+9.1f} "
                     f"{o['shrink_points']:+7.1f}")
    lines += ["", f"elastic / elasticflow deadlines met, none vs measured (first "
              f"{out['max_jobs_ddl']} jobs)",
              f"{'workload@cluster':28s} {'split':11s} {'none':>6s} {'measured':>9s} "
              f"{'shrink %':>9s} {'no-est':>7s} {'shrink %':>9s}"]
    for key, r in out["deadlines"].items():
        m, n = r["measured"], r["measured_no_estimator"]
        lines.append(f"{key:28s} {r['split']:11s} {r['none']['ratio']:6.3f} {m['ratio']:9.3f} "
                     f"{m['shrink_pct']:+9.1f} {n['ratio']:7.3f} {n['shrink_pct']:+9.1f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--seeds", type=int, default=3, help="error seeds (default 3)")
    ap.add_argument("--max-jobs-jct", type=int, default=20)
    ap.add_argument("--max-jobs-ddl", type=int, default=40)
    args = ap.parse_args(argv)
    if args.seeds < 1:
        ap.error(f"--seeds must be at least 1, got {args.seeds}")
    logging.basicConfig(level=logging.ERROR)
    out = run(args.seeds, args.max_jobs_jct, args.max_jobs_ddl)
    print(table(out))
    if args.json:
        print(json.dumps(json_ready(out, 4), sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
