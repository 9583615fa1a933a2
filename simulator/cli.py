"""``frenzy simulate``: replay traces over a cluster with one or more policies and print the
metric table (``--json``: one JSON object on the last line).

Wired into the ``frenzy`` console script by ``service.cli`` through ``add_simulate_parser`` and
``run_simulate``.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
from collections import defaultdict
from typing import Any

from orchestrator.backends.sim import DEFAULT_LAUNCH_DELAY_S, DEFAULT_RESTART_DELAY_S
from orchestrator.clusters import ClusterConfigError, load_cluster
from simulator.error import ERROR_MODES
from simulator.mapping import MappingError
from simulator.metrics import RunMetrics, combine, json_ready
from simulator.replay import ProgressBar, SimConfig, Task, load_workloads, run_tasks
from simulator.traces import TraceFormatError

log = logging.getLogger(__name__)


def add_simulate_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``simulate`` sub-command to an argparse sub-parser set."""
    p = subparsers.add_parser(
        "simulate", help="replay a trace over a simulated cluster with scheduling policies",
        description="Replay job traces over a cluster with the production controller on a "
                    "virtual clock; print JCT, queueing, makespan, utilisation and scheduling "
                    "overhead per policy.",
    )
    add_simulate_arguments(p)
    p.set_defaults(handler=run_simulate)
    return p


def add_simulate_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cluster", default="phoebe",
                   help="cluster YAML file or packaged name (default: phoebe; see "
                        "orchestrator/data/clusters)")
    p.add_argument("--scale", type=int, default=None,
                   help="replicate every node group N times (overrides the file's scale)")
    p.add_argument("--trace", action="append", required=True,
                   help="trace file, folder, named set (sia-philly, sia-saturn, pollux, "
                        "elasticflow, alibaba-openb, ...; <set>:<k> for one file or window), "
                        "newworkload-<n>[@seed] or gavel-<jobs/h>[@seed]; repeatable")
    p.add_argument("--policy", default="has,opportunistic,sia",
                   help="comma-separated policy names (default: has,opportunistic,sia)")
    p.add_argument("--tick", type=float, default=None,
                   help="also schedule every TICK virtual seconds (default: on events only)")
    p.add_argument("--launch-delay", type=float, default=DEFAULT_LAUNCH_DELAY_S,
                   help="seconds from start to first step (default %(default)s)")
    p.add_argument("--restart-delay", type=float, default=DEFAULT_RESTART_DELAY_S,
                   help="extra seconds of a checkpoint-restart (default %(default)s)")
    p.add_argument("--max-jobs", type=int, default=None,
                   help="only the first N jobs of each workload (quick looks)")
    p.add_argument("--error", choices=ERROR_MODES, default="none",
                   help="prediction error: none (every job runs at its predicted step time), "
                        "measured (true step time = prediction x a per-GPU-type bias and "
                        "per-job noise calibrated on measured step times) or 2x (default none)")
    p.add_argument("--error-seed", type=int, default=0,
                   help="seed of the per-job error draws (default 0)")
    p.add_argument("--no-correction", action="store_true",
                   help="under --error, policies plan on the predictions alone instead of on "
                        "step times corrected from the progress jobs report")
    p.add_argument("--workers", type=int, default=1, help="parallel processes (default 1)")
    p.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")


def _fmt_s(x: float) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{x / 3600:.2f}h" if x >= 3600 else f"{x:.0f}s"


class SimulateInputError(ValueError):
    """A ``frenzy simulate`` argument that cannot be used (exit status 2)."""


INPUT_ERRORS = (ClusterConfigError, TraceFormatError, MappingError, SimulateInputError)
"""What bad input raises, all before any replay runs. Anything raised later is a fault of the
simulator or a policy and is reported as an internal error (exit status 1), never as input."""


def collect(args: argparse.Namespace) -> dict[str, Any]:
    """Run the replays the arguments ask for; return the JSON-ready result. Input is checked
    first (``INPUT_ERRORS``); an exception while replaying is not wrapped."""
    policies = [p.strip() for p in args.policy.split(",") if p.strip()]
    from scheduler.policy import policy_names

    unknown = [p for p in policies if p not in policy_names()]
    if unknown:
        raise SimulateInputError(f"--policy: unknown policy {', '.join(unknown)}; known: "
                                 f"{', '.join(policy_names())}")
    try:
        cluster = load_cluster(args.cluster, scale=args.scale)
    except ValueError as e:
        if isinstance(e, INPUT_ERRORS):
            raise
        raise SimulateInputError(f"--cluster/--scale: {e}") from e
    config = SimConfig(launch_delay_s=args.launch_delay, restart_delay_s=args.restart_delay,
                       tick_s=args.tick, error=args.error, error_seed=args.error_seed,
                       correct=not args.no_correction)
    tasks: list[Task] = []
    sets: dict[str, list[str]] = {}
    for spec in args.trace:
        try:
            workloads = load_workloads(spec)  # validates the spec before anything runs
        except ValueError as e:
            if isinstance(e, INPUT_ERRORS):
                raise
            raise SimulateInputError(f"--trace {spec}: {e}") from e
        sets[spec] = [label for label, _ in workloads]
        for k in range(len(workloads)):
            for pol in policies:
                tasks.append(Task(spec, k, str(cluster.path), args.scale, pol, config,
                                  max_jobs=args.max_jobs))
    bar = ProgressBar(len(tasks), "simulate", enabled=None if not args.no_progress else False)
    results = run_tasks(tasks, workers=args.workers,
                        on_done=lambda done, total: bar.update(done))
    bar.close()
    runs: dict[str, dict[str, list[RunMetrics]]] = defaultdict(lambda: defaultdict(list))
    for task, _label, metrics in results:
        runs[task.workload][task.policy].append(metrics)
    out: dict[str, Any] = {"cluster": cluster.name, "gpus": cluster.total_gpus,
                           "results": {}}
    if args.error != "none":  # absent under 'none': the error-free output stays as it was
        out["error"] = args.error
        out["correct"] = not args.no_correction
    for spec in sets:
        out["results"][spec] = {}
        for pol in policies:
            rs = runs[spec][pol]
            c = combine(rs)
            util: dict[str, float] = defaultdict(float)
            for r in rs:
                for t, u in r.gpu_util.items():
                    util[t] += u / len(rs)
            c["gpu_util"] = dict(util)
            c["files"] = len(rs)
            c["jobs"] = sum(r.jobs for r in rs)
            c["finished"] = sum(r.finished for r in rs)
            c["sched_max_ms"] = max((r.sched_max_ms for r in rs if r.policy_calls), default=0.0)
            out["results"][spec][pol] = c
    return out


def format_table(out: dict[str, Any]) -> str:
    """The human-readable table of ``collect``'s result."""
    head = (f"{'workload':<22}{'policy':<15}{'jobs':>6}{'unfin':>6}{'avg JCT':>10}{'p99 JCT':>10}"
            f"{'avg queue':>11}{'makespan':>10}{'samples/s':>11}{'restarts/job':>13}"
            f"{'sched p50/p95/max ms':>23}  util by GPU type")
    lines = [f"cluster {out['cluster']} ({out['gpus']} GPUs); JCT and queue over finished "
             "jobs only: see 'unfin'", head, "-" * len(head)]
    for spec, by_pol in out["results"].items():
        for pol, c in by_pol.items():
            util = " ".join(f"{t}={u:.0%}" for t, u in sorted(c["gpu_util"].items()))
            sched = f"{c['sched_p50_ms']:.2f}/{c['sched_p95_ms']:.2f}/{c['sched_max_ms']:.1f}"
            lines.append(
                f"{spec:<22}{pol:<15}{c['jobs']:>6}{int(c['unfinished']):>6}"
                f"{_fmt_s(c['avg_jct_s']):>10}"
                f"{_fmt_s(c['p99_jct_s']):>10}{_fmt_s(c['avg_queue_s']):>11}"
                f"{_fmt_s(c['makespan_s']):>10}{c['avg_samples_per_s']:>11.1f}"
                f"{c['restarts_per_job']:>13.2f}{sched:>23}  {util}"
            )
    return "\n".join(lines)



def run_simulate(args: argparse.Namespace) -> int:
    """Entry point of ``frenzy simulate``; returns the exit status."""
    try:
        out = collect(args)
    except INPUT_ERRORS as e:
        print(f"frenzy simulate: error: {e}", file=sys.stderr)
        return 2
    except Exception as e:
        log.error("internal error while replaying", exc_info=True)
        print(f"frenzy simulate: internal error (not a problem with your input): "
              f"{type(e).__name__}: {e}", file=sys.stderr)
        return 1
    print(format_table(out))
    if args.json:
        print(json.dumps(json_ready(out), sort_keys=True))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Stand-alone entry point: ``python -m simulator.cli --trace ...``."""
    parser = argparse.ArgumentParser(prog="frenzy simulate")
    add_simulate_arguments(parser)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    return run_simulate(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
