"""Where two policies' average JCTs part, job by job, on one workload and cluster.

Replays the workload under each policy (``simulator.replay``, the benchmarks' configuration:
``sia`` in 60 s rounds, the others event-driven) with every decision recorded, then sums per
model: the JCT, the queueing, the checkpoint-restarts and the bound (every job alone on its
fastest plan from its arrival, plus the launch). Lists the jobs with the largest JCT
difference and the plans each policy ran them on, and the GPU utilisation per type. This is
how docs/validation.md found why ``has`` trails ``sia`` on a workload.

    python -m benchmarks.jobdiff sia-philly:1 --cluster hetero-128 [--max-jobs 150]
        [--policies has,sia] [--jobs 5] [--error none|measured|2x] [--error-seed N] [--json]
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from benchmarks.jct import _config
from orchestrator.clusters import load_cluster
from orchestrator.states import JobEvent, JobState
from simulator.error import ERROR_MODES
from simulator.metrics import json_ready
from simulator.replay import PlanCache, SimConfig, job_view, load_workloads, replay


@dataclass(slots=True)
class JobTrace:
    """One job under one policy: times in seconds, and each allocation it got."""

    model: str
    submit: float
    start: float
    end: float
    restarts: int
    fastest_s: float  # job time on its fastest plan
    moves: list[tuple[float, str]] = field(default_factory=list)  # (time, "8xA100-40G 0.04s")

    @property
    def jct_s(self) -> float:
        return self.end - self.submit


def trace_jobs(workload: str, cluster: str, policy: str, max_jobs: int | None,
               error: str = "none", error_seed: int = 0
               ) -> tuple[dict[str, JobTrace], dict[str, float]]:
    """Replay ``workload`` on ``cluster`` under ``policy`` (with the simulator's prediction
    error mode ``error``): each finished job's trace, and the GPU utilisation per type."""
    state = load_cluster(cluster).state
    cache = PlanCache(state)
    mapped = load_workloads(workload)[0][1]  # ``set:k`` names one file; a set, its first
    if max_jobs is not None:
        mapped = mapped[:max_jobs]
    views = {v.id: v for v in (job_view(m, cache) for m in mapped)}
    moves: dict[str, list[tuple[float, str]]] = defaultdict(list)

    def recording(ev: JobEvent) -> None:
        a = ev.allocation
        if ev.to_state in (JobState.PLACED, JobState.RESIZING) and a is not None:
            moves[ev.job_id].append((ev.time, f"{a.num_gpus}x{a.plan.gpu_type} "
                                              f"{a.plan.step_time_s:.3g}s"))
        elif ev.to_state is JobState.PENDING and ev.from_state is not None:
            moves[ev.job_id].append((ev.time, "stop"))

    # the policy by name, as the benchmarks build it (under error: planning on corrected
    # step times); the plans listed are the predictions the controller keeps
    res = replay(list(views.values()), state, policy, config=_config(policy, error, error_seed),
                 listeners=[recording])
    out: dict[str, JobTrace] = {}
    for job_id, rec in res.collector.jobs.items():
        if rec.end is None or rec.first_start is None:
            continue
        v = views[job_id]
        out[job_id] = JobTrace(v.model.name if v.model else "?", rec.submit, rec.first_start,
                               rec.end, rec.restarts,
                               min((p.job_time_s for p in v.plans), default=float("nan")),
                               moves[job_id])
    return out, dict(res.metrics.gpu_util)


def compare(workload: str, cluster: str, policies: tuple[str, ...], max_jobs: int | None,
            error: str = "none", error_seed: int = 0) -> dict[str, Any]:
    """Per-model sums and per-type utilisation of each policy on one workload. Under a
    prediction error the bound still reads the predicted fastest plan (what the policies
    see), not the drawn true time."""
    traces: dict[str, dict[str, JobTrace]] = {}
    util: dict[str, dict[str, float]] = {}
    for p in policies:
        traces[p], util[p] = trace_jobs(workload, cluster, p, max_jobs, error,
                                          error_seed)
    common = set.intersection(*(set(t) for t in traces.values()))
    launch = SimConfig().launch_delay_s
    models: dict[str, dict[str, Any]] = {}
    for job_id in sorted(common):
        first = traces[policies[0]][job_id]
        m = models.setdefault(first.model, {"jobs": 0, "bound_s": 0.0,
                                            **{p: {"jct_s": 0.0, "queue_s": 0.0,
                                                   "restarts": 0} for p in policies}})
        m["jobs"] += 1
        m["bound_s"] += first.fastest_s + launch
        for p in policies:
            t = traces[p][job_id]
            m[p]["jct_s"] += t.jct_s
            m[p]["queue_s"] += t.start - t.submit
            m[p]["restarts"] += t.restarts
    a, b = policies[0], policies[-1]
    apart = sorted(common, key=lambda j: traces[b][j].jct_s - traces[a][j].jct_s)
    return {"workload": workload, "cluster": cluster, "error": error,
            "policies": list(policies),
            "jobs": len(common), "models": models, "gpu_util": util,
            "traces": traces, "order": apart}


def table(out: dict[str, Any], jobs: int) -> str:
    pols = out["policies"]
    a, b = pols[0], pols[-1]
    lines = [f"{out['workload']} on {out['cluster']}: {out['jobs']} jobs finished under "
             f"every policy; JCT and queue sums in hours",
             f"{'model':<16}{'jobs':>6}" + "".join(f"{p + ' JCT':>12}{p + ' queue':>12}"
                                                  f"{p + ' rs':>8}" for p in pols)
             + f"{'bound':>9}"]
    rows = sorted(out["models"].items(), key=lambda kv: -(kv[1][a]["jct_s"] - kv[1][b]["jct_s"]))
    total = {p: 0.0 for p in pols}
    for model, m in rows:
        lines.append(f"{model:<16}{m['jobs']:>6}" + "".join(
            f"{m[p]['jct_s'] / 3600:>12.2f}{m[p]['queue_s'] / 3600:>12.2f}{m[p]['restarts']:>8}"
            for p in pols) + f"{m['bound_s'] / 3600:>9.2f}")
        for p in pols:
            total[p] += m[p]["jct_s"]
    lines.append("total JCT h: " + ", ".join(f"{p} {total[p] / 3600:.2f}" for p in pols))
    for p in pols:
        lines.append(f"GPU utilisation {p}: " + ", ".join(
            f"{t} {u:.2f}" for t, u in sorted(out["gpu_util"][p].items())))
    tr = out["traces"]
    # ``order``: by JCT under b minus under a, so the first are those a trails most
    for title, ids in ((f"{a} furthest behind {b}", out["order"][:jobs]),
                       (f"{a} furthest ahead of {b}", out["order"][::-1][:jobs])):
        lines.append(f"-- {title}")
        for j in ids:
            lines.append(f"{j} ({tr[a][j].model}, fastest {tr[a][j].fastest_s:.0f} s): "
                         + "; ".join(f"{p} JCT {tr[p][j].jct_s:.0f} s" for p in pols))
            for p in pols:
                t = tr[p][j]
                lines.append(f"    {p}: " + ", ".join(f"@{at - t.submit:.0f}s {what}"
                                                      for at, what in t.moves[:8]))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("workload", help="a trace set's file (sia-philly:1), a set, or "
                                     "newworkload-N")
    ap.add_argument("--cluster", default="hetero-128")
    ap.add_argument("--policies", default="has,sia")
    ap.add_argument("--max-jobs", type=int, default=None)
    ap.add_argument("--jobs", type=int, default=5, help="jobs listed each way (default 5)")
    ap.add_argument("--error", choices=ERROR_MODES, default="none",
                    help="prediction error in the simulator (simulator.error)")
    ap.add_argument("--error-seed", type=int, default=0,
                    help="seed of the per-job error draws (default 0)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    policies = tuple(p for p in args.policies.split(",") if p)
    if len(policies) < 2:
        ap.error("--policies needs at least two policies")
    out = compare(args.workload, args.cluster, policies, args.max_jobs, args.error,
                  args.error_seed)
    print(table(out, args.jobs))
    if args.json:
        print(json.dumps(json_ready({k: v for k, v in out.items()
                                     if k not in ("traces", "order")}, 4), sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
