"""A lower bound on a workload's average JCT that counts contention between long jobs.

``benchmarks.validation``'s bound lets every job run alone on its fastest plan from its
arrival: no policy can beat it, but it ignores that long jobs which overlap in time compete
for the same fast GPUs (three 5-hour ImageNet jobs that each want all 32 A100-80G of
hetero-128 cannot all have them). This bound keeps that competition, as a relaxation that is
still valid for every policy the simulator can run:

* Each job's plans become, per GPU type, the upper concave hull of its (GPUs, rate) points
  with (0, 0): running a plan for a while is never better than a time-share of hull
  vertices (same time, no more GPUs, no less progress), so nothing is lost by keeping only
  those. Rates are the packed plans' (a placement only slows a plan down).
* The *group* problem: a few long jobs that overlap, alone on the cluster, scheduled as a
  fluid over a time grid. In each interval a job time-shares its modes (at most the
  interval's length in all), the GPUs of a type are shared up to the type's capacity, a job
  works only from its arrival plus the launch delay, preemption is free and placement is
  ignored. A job that works in interval ``k`` (binary ``u``) ends no sooner than
  ``a_k + y_k / R`` (the interval's start plus its work there at the job's fastest rate).
  Every real schedule, restricted to the group, is a feasible point of this mixed-integer
  program with the same completion times, so its optimum — and the solver's dual bound when
  it stops at a time limit — is a lower bound on the group's total completion time.
* Groups are disjoint; every job outside a group keeps the alone bound. The sum of the
  group bounds and the alone bounds is a lower bound on the total JCT of any schedule of the
  whole workload (restricting a schedule to a group only frees capacity).

``python -m benchmarks.jct_bound --json`` computes it for every workload of a
``benchmarks.validation --json`` output (``--from``, default docs/validation.json, error-free)
and reports the most any policy could gain over ``sia`` there (``room_vs_sia_pct``); the
median of those rooms bounds the median margin any policy can reach.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_matrix

log = logging.getLogger("benchmarks.jct_bound")

DEFAULT_FROM = Path(__file__).resolve().parent.parent / "docs" / "validation.json"


@dataclass(frozen=True, slots=True)
class Mode:
    """One hull vertex of a job's plans: ``gpus`` GPUs of ``gpu_type`` finish the whole job
    at ``rate`` (fraction of the job per second)."""

    gpu_type: str
    gpus: int
    rate: float


@dataclass(frozen=True, slots=True)
class BoundJob:
    """A job as the bound sees it: when it was submitted, when it can first make progress
    (submission plus the launch delay), and its modes."""

    id: str
    submit: float
    release: float
    modes: tuple[Mode, ...]

    @property
    def max_rate(self) -> float:
        return max(m.rate for m in self.modes)

    @property
    def alone_jct(self) -> float:
        """Its JCT alone on the cluster on its fastest plan: the bound without contention."""
        return self.release - self.submit + 1.0 / self.max_rate


def hull_modes(gpu_type: str, points: Sequence[tuple[int, float]]) -> list[Mode]:
    """The vertices of the upper concave hull of ``(gpus, rate)`` points and (0, 0) on which
    the rate still rises: every other point is dominated by a time-share of these."""
    best: dict[int, float] = {0: 0.0}
    for n, r in points:
        best[n] = max(best.get(n, 0.0), r)
    hull: list[tuple[int, float]] = []
    for p in sorted(best.items()):
        while len(hull) >= 2:
            (x1, y1), (x2, y2) = hull[-2], hull[-1]
            if (y2 - y1) * (p[0] - x1) <= (p[1] - y1) * (x2 - x1):  # hull[-1] not above
                hull.pop()
            else:
                break
        hull.append(p)
    out: list[Mode] = []
    for n, r in hull[1:]:
        if out and r <= out[-1].rate:
            break
        out.append(Mode(gpu_type, n, r))
    return out


def bound_job(view: Any, launch_s: float) -> BoundJob:
    """A ``JobView``'s plans (error-free, packed) as hull modes per GPU type."""
    by_type: dict[str, list[tuple[int, float]]] = {}
    for p in view.plans:
        by_type.setdefault(p.gpu_type, []).append((p.num_gpus, 1.0 / p.job_time_s))
    modes = tuple(m for t in sorted(by_type) for m in hull_modes(t, by_type[t]))
    if not modes:
        raise ValueError(f"job {view.id}: no plan, so no bound")
    return BoundJob(view.id, view.submit_time, view.submit_time + launch_s, modes)


def alone_fits(jobs: Sequence[BoundJob], capacity: Mapping[str, int]) -> bool:
    """Whether every job can run its fastest plan from its release to its end at once:
    at each release, the jobs then running alone need no more GPUs of a type than it has."""
    fastest = [(j.release, j.release + 1.0 / j.max_rate, max(j.modes, key=lambda m: m.rate))
               for j in jobs]
    for t, _, _ in fastest:
        need: dict[str, int] = {}
        for start, end, m in fastest:
            if start <= t < end:
                need[m.gpu_type] = need.get(m.gpu_type, 0) + m.gpus
        if any(n > capacity.get(g, 0) for g, n in need.items()):
            return False
    return True


def group_bound(jobs: Sequence[BoundJob], capacity: Mapping[str, int], *,
                intervals: int = 120, time_limit_s: float = 20.0) -> float:
    """A lower bound on the total completion time (absolute, seconds) of ``jobs`` alone on
    a cluster with ``capacity`` GPUs per type (see the module docstring). ``intervals``
    sets the grid (finer: tighter and slower); where the solver stops at ``time_limit_s``
    its dual bound is used, which is still a lower bound."""
    if not jobs:
        return 0.0
    alone = sum(j.release + 1.0 / j.max_rate for j in jobs)
    if alone_fits(jobs, capacity):
        return alone  # every job alone on its fastest plan is a schedule: the optimum
    rel = np.array([j.release for j in jobs])
    rmax = np.array([j.max_rate for j in jobs])
    safe = float(rel.max() + (1.0 / rmax).sum() + 1.0)  # one after another: always feasible
    dense_end = min(safe, float(rel.max() + 3.0 / rmax.min()))
    step = max((dense_end - rel.min()) / intervals, 1e-6)
    pts = set(rel.tolist()) | {dense_end, safe}
    pts.update(rel.min() + step * np.arange(intervals))
    a = np.array(sorted(p for p in pts if p <= safe))
    dt = np.diff(a)
    first = np.searchsorted(a, rel)
    cols = 0
    z: dict[tuple[int, int, int], int] = {}
    u: dict[tuple[int, int], int] = {}
    done: list[int] = []
    for j, job in enumerate(jobs):
        for k in range(first[j], len(dt)):
            for m in range(len(job.modes)):
                z[j, m, k] = cols
                cols += 1
            u[j, k] = cols
            cols += 1
        done.append(cols)
        cols += 1
    rows: list[int] = []
    cidx: list[int] = []
    vals: list[float] = []
    lo: list[float] = []
    hi: list[float] = []

    def row(entries: Sequence[tuple[int, float]], low: float, high: float) -> None:
        r = len(lo)
        for c, v in entries:
            rows.append(r)
            cidx.append(c)
            vals.append(v)
        lo.append(low)
        hi.append(high)

    shared: dict[tuple[str, int], list[tuple[int, float]]] = {}
    for j, job in enumerate(jobs):
        work: list[tuple[int, float]] = []
        for k in range(first[j], len(dt)):
            here = [(z[j, m, k], md.rate) for m, md in enumerate(job.modes)]
            work += here
            # time-shares its modes within the interval, only where it works at all
            row([(z[j, m, k], 1.0) for m in range(len(job.modes))] + [(u[j, k], -dt[k])],
                -math.inf, 0.0)
            # working in interval k: done no sooner than a_k + (work there) / fastest rate
            row([(u[j, k], a[k])] + [(c, r / rmax[j]) for c, r in here] + [(done[j], -1.0)],
                -math.inf, 0.0)
            for m, md in enumerate(job.modes):
                shared.setdefault((md.gpu_type, k), []).append((z[j, m, k], float(md.gpus)))
        row(work, 1.0, 1.0)
        row([(done[j], 1.0)], job.release + 1.0 / rmax[j], math.inf)
    for (gpu_type, k), entries in shared.items():
        row(entries, -math.inf, capacity.get(gpu_type, 0) * dt[k])
    matrix = coo_matrix((vals, (rows, cidx)), shape=(len(lo), cols)).tocsr()
    cost = np.zeros(cols)
    cost[done] = 1.0
    integrality = np.zeros(cols)
    upper = np.full(cols, np.inf)
    for c in u.values():
        integrality[c] = 1
        upper[c] = 1.0
    res = milp(cost, constraints=LinearConstraint(matrix, lo, hi), integrality=integrality,
               bounds=Bounds(np.zeros(cols), upper),
               options={"time_limit": time_limit_s, "disp": False})
    dual = getattr(res, "mip_dual_bound", None)
    if res.status == 0 and res.fun is not None:
        value = float(res.fun) if dual is None or not math.isfinite(dual) else float(dual)
    elif dual is not None and math.isfinite(dual):
        value = float(dual)  # time limit: the proven bound so far
    else:
        raise RuntimeError(f"group bound over {len(jobs)} jobs: {res.message}")
    return max(value, alone)  # never below the alone bound (the solver's tolerance)


def long_groups(jobs: Sequence[BoundJob], *, long_jobs: int = 12,
                group_size: int = 4) -> list[list[BoundJob]]:
    """The ``long_jobs`` jobs with the longest alone time, longest first, cut into
    consecutive groups of ``group_size``: jobs of about the same length want about the same
    fast GPUs for about as long, so they are the ones whose competition the bound should
    count. Any partition gives a valid bound; this one is where contention is."""
    longest = sorted(jobs, key=lambda j: (-j.alone_jct, j.release, j.id))[:long_jobs]
    return [longest[i:i + group_size] for i in range(0, len(longest), group_size)]


def contention_bound(jobs: Sequence[BoundJob], capacity: Mapping[str, int], *,
                     long_jobs: int = 12, group_size: int = 4, intervals: int = 120,
                     time_limit_s: float = 20.0) -> float:
    """A lower bound on the average JCT of ``jobs`` on a cluster with ``capacity``."""
    if not jobs:
        return math.nan
    groups = long_groups(jobs, long_jobs=long_jobs, group_size=group_size)
    grouped = {j.id for g in groups for j in g}
    total = sum(j.alone_jct for j in jobs if j.id not in grouped)
    for g in groups:
        total += group_bound(g, capacity, intervals=intervals,
                             time_limit_s=time_limit_s) - sum(j.submit for j in g)
    return total / len(jobs)


def workload_jobs(spec: str, index: int, cluster: str, max_jobs: int | None
                  ) -> tuple[list[BoundJob], dict[str, int]]:
    """A workload's jobs as the simulator submits them on ``cluster``, and the cluster's
    GPUs per type."""
    from benchmarks.validation import workload_views
    from simulator.replay import SimConfig

    views, state = workload_views(spec, index, cluster, max_jobs)
    launch = SimConfig().launch_delay_s
    return [bound_job(v, launch) for v in views], dict(state.total_by_type())


def workload_spec(label: str, split: str) -> tuple[str, int]:
    """The (spec, index) that ``benchmarks.validation`` replayed for a row's label: a
    validation row names its workload file itself; a tuning row is ``<set>:<k>``, the
    set's k-th file (``benchmarks.validation.workloads_of``)."""
    if split == "tuning" and ":" in label:
        name, k = label.rsplit(":", 1)
        if k.isdigit() and int(k) >= 1:
            return name, int(k) - 1
    return label, 0


def run(source: dict[str, Any], *, clusters: Sequence[str] | None = None,
        long_jobs: int = 12, group_size: int = 4, intervals: int = 120,
        time_limit_s: float = 20.0) -> dict[str, Any]:
    """The contention bound of every workload of a ``benchmarks.validation`` output, and the
    room it leaves any policy against ``sia`` (and against ``has``'s figure there)."""
    from benchmarks.validation import margin_pct

    if source.get("error") != "none":
        raise ValueError("the bound is for error-free replays: pass a "
                         "benchmarks.validation --json output run with --error none")
    split = source.get("split", "validation")
    out: dict[str, Any] = {"split": split, "max_jobs": source.get("max_jobs"),
                           "long_jobs": long_jobs, "group_size": group_size,
                           "intervals": intervals, "time_limit_s": time_limit_s,
                           "clusters": {}}
    t0 = time.perf_counter()
    for cl, res in source["clusters"].items():
        if clusters and cl not in clusters:
            continue
        rows = []
        for r in res["workloads"]:
            w = r["workload"]
            spec, k = workload_spec(w, split)
            t1 = time.perf_counter()
            jobs, capacity = workload_jobs(spec, k, cl, source.get("max_jobs"))
            alone = sum(j.alone_jct for j in jobs) / len(jobs)
            bound = contention_bound(jobs, capacity, long_jobs=long_jobs,
                                     group_size=group_size, intervals=intervals,
                                     time_limit_s=time_limit_s)
            policies = {p: r[f"{p}_avg_jct_s"] for p in ("has", "sia", "opportunistic")
                        if f"{p}_avg_jct_s" in r}
            row = {"workload": w, "alone_bound_avg_jct_s": alone,
                   "contention_bound_avg_jct_s": bound,
                   **{f"{p}_avg_jct_s": v for p, v in policies.items()},
                   "room_vs_sia_pct": margin_pct(bound, policies["sia"]),
                   "alone_room_vs_sia_pct": margin_pct(alone, policies["sia"]),
                   "has_vs_sia_pct": margin_pct(policies["has"], policies["sia"]),
                   "below_every_policy": all(bound <= v * (1 + 1e-9)
                                             for v in policies.values()),
                   "wall_s": round(time.perf_counter() - t1, 1)}
            log.info("%s %s: alone %.1f, contention %.1f s (sia %.1f)", cl, w, alone, bound,
                     policies["sia"])
            rows.append(row)
        room = [r["room_vs_sia_pct"] for r in rows]
        out["clusters"][cl] = {
            "workloads": rows,
            "room_vs_sia_median_pct": statistics.median(room) if rows else None,
            "alone_room_vs_sia_median_pct": statistics.median(
                [r["alone_room_vs_sia_pct"] for r in rows]) if rows else None,
            "workloads_room_below_12pct": sum(v < 12.0 for v in room),
            "has_vs_sia_median_pct": statistics.median(
                [r["has_vs_sia_pct"] for r in rows]) if rows else None,
            "bound_above_a_policy": sum(not r["below_every_policy"] for r in rows),
        }
    out["wall_s"] = round(time.perf_counter() - t0, 1)
    return out


def table(out: dict[str, Any]) -> str:
    lines = []
    for cl, res in out["clusters"].items():
        lines.append(f"{cl}: average JCT, h (bound: no policy can do better)")
        lines.append(f"{'workload':20s}{'alone':>8s}{'conten.':>9s}{'has':>8s}{'sia':>8s}"
                     f"{'room alone':>12s}{'room':>8s}{'has vs sia':>12s}")
        for r in res["workloads"]:
            flag = "" if r["below_every_policy"] else "  BOUND ABOVE A POLICY"
            lines.append(
                f"{r['workload']:20s}{r['alone_bound_avg_jct_s'] / 3600:8.3f}"
                f"{r['contention_bound_avg_jct_s'] / 3600:9.3f}{r['has_avg_jct_s'] / 3600:8.3f}"
                f"{r['sia_avg_jct_s'] / 3600:8.3f}{r['alone_room_vs_sia_pct']:+11.1f}%"
                f"{r['room_vs_sia_pct']:+7.1f}%{r['has_vs_sia_pct']:+11.1f}%{flag}")
        lines.append(
            f"  room vs sia, median: {res['room_vs_sia_median_pct']:+.1f}% (alone bound "
            f"{res['alone_room_vs_sia_median_pct']:+.1f}%); below +12% on "
            f"{res['workloads_room_below_12pct']} of {len(res['workloads'])}; has vs sia "
            f"median {res['has_vs_sia_median_pct']:+.1f}%")
    lines.append(f"wall {out['wall_s']} s")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--from", dest="source", type=Path, default=DEFAULT_FROM,
                    help="a benchmarks.validation --json output, error-free "
                         "(its last line is read; default %(default)s)")
    ap.add_argument("--clusters", default="", help="comma-separated; default: all in --from")
    ap.add_argument("--long-jobs", type=int, default=12)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--intervals", type=int, default=120)
    ap.add_argument("--time-limit", type=float, default=20.0,
                    help="seconds per group; the solver's proven bound is used past it")
    ap.add_argument("--json", action="store_true", help="print one JSON object last")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    for name in ("long_jobs", "group_size", "intervals"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    try:
        text = args.source.read_text().strip().splitlines()
        source = json.loads(text[-1])
    except (OSError, IndexError, json.JSONDecodeError) as e:
        ap.error(f"--from {args.source}: not a benchmarks.validation --json output ({e})")
    if not isinstance(source, dict) or "clusters" not in source:
        ap.error(f"--from {args.source}: not a benchmarks.validation --json output "
                 "(no 'clusters')")
    clusters = tuple(c for c in args.clusters.split(",") if c)
    try:
        out = run(source, clusters=clusters, long_jobs=args.long_jobs,
                  group_size=args.group_size, intervals=args.intervals,
                  time_limit_s=args.time_limit)
    except ValueError as e:
        ap.error(str(e))
    print(table(out))
    if args.json:
        print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
