"""Deadline satisfaction of the elastic deadline-aware policy against ElasticFlow, HAS and
opportunistic FCFS, in one simulator run (the production Controller over SimBackend).

Workloads: ElasticFlow's Philly trace with its own deadlines (``elasticflow``), and Sia's
Philly and Helios-Saturn workloads with deadlines generated as ElasticFlow does
(``submit + λ·duration``, λ ~ U[0.5, 1.5], seeded; ``simulator.deadlines``), each on Sia's
phoebe cluster (44 GPUs) and on ``hetero-128`` (128 GPUs, four GPU types).
``has`` and ``opportunistic`` see the deadlines but do not act on them. A rejected job counts
as a missed deadline; average JCT is over the jobs that finished (rejected jobs have none), so
every row also says how many jobs were neither finished nor rejected when the replay ended
(``unfinished``) and how many checkpoint-restarts each job took on average
(``restarts_per_job``).

Prints a table; ``--json`` adds one JSON object on the last line with, per
``<workload>@<cluster>`` and policy: deadline_ratio, avg_jct_s, makespan_s, resizes
(checkpoint-restarts of running jobs: resizes and preemptions), restarts_per_job, rejected,
unfinished, jobs, and for
``elastic`` ratio_vs_elasticflow and jct_vs_has. Writes ``docs/deadlines.md``,
``docs/deadlines.json`` and ``docs/deadlines_ratio.png`` on a full run.

The two deadline policies run with the safety margin ``--slack`` (default 0.05, their
default for a real cluster: the fraction of the time to a deadline held back for prediction
and placement error). The simulator's step times are the performance model's, so in
simulation a margin only costs deadlines; ``--slack 0`` shows by how much (both policies get
the same margin either way).

``--seeds N`` (N > 1) adds a sweep: ``elastic`` and ``elasticflow`` on the Sia workloads
again under N deadline draws (seeds 0, 1000, …), printing per workload the median, lowest and
highest ratio of deadlines met (JSON ``seed_sweep``): one draw can favour either policy, and
the target is about the policy, not one draw.

    python -m benchmarks.deadlines [--quick] [--json] [--workers 2] [--docs docs] [--slack S]
                                   [--seeds N] [--error none|measured|2x] [--no-estimator]
                                   [--no-correction] [--split paper|validation] [--max-jobs N]
                                   [--elastic-arg KEY=VALUE ...]

``--error measured|2x`` replays with prediction error (``simulator.error``: each job's true
step time is the prediction × a per-GPU-type bias and per-job noise calibrated on the measured
step times); ``elastic`` then gets the online step-time estimator (``--no-estimator``: no
policy gets one), the others plan on step times corrected by it (``scheduler.corrected``;
``--no-correction``: on the predictions alone), and every row reports ``over_memory``
(jobs whose true peak memory exceeded their GPU's).

``--split validation`` replays instead the first workload of every validation-split set
(``benchmarks.splits``: the sets no threshold was chosen on), its first ``--max-jobs`` jobs,
and adds per cluster the median, lowest and highest ratio (JSON ``split``); it writes no docs
unless ``--docs`` names a folder. ``--sets`` (comma-separated sets or ``<set>:<k>``
workloads) replaces the chosen split's sets, e.g. every validation window of a windowed set.

``--elastic-arg`` passes a keyword argument to ``elastic`` only (an ablation or a parameter
sweep in the same run as the baselines).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import statistics
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from simulator.error import ERROR_MODES
from simulator.metrics import json_ready

POLICIES = ("elastic", "elasticflow", "has", "opportunistic")
CLUSTERS = ("phoebe", "hetero-128")
FULL_SETS = ("elasticflow", "sia-philly", "sia-saturn")
QUICK_SETS = ("elasticflow", "sia-philly:1")
QUICK_MAX_JOBS = 40
TICK_S = 600.0
SEED = 0
SLACK = 0.05
DEADLINE_POLICIES = ("elastic", "elasticflow")
TARGETS = {"ratio_vs_elasticflow": 1.3, "jct_vs_has": 1.0}


@dataclass(frozen=True, slots=True)
class DTask:
    """One replay: workload spec and file index, cluster, policy."""

    workload: str
    index: int
    cluster: str
    policy: str
    max_jobs: int | None = None
    slack: float = SLACK
    seed: int = SEED
    elastic_kw: tuple[tuple[str, Any], ...] = ()
    error: str = "none"
    estimator: bool = True
    error_seed: int = 0
    correct: bool = True


def run_one(t: DTask) -> tuple[DTask, dict[str, float]]:
    """Replay one task with deadlines; return its figures."""
    from orchestrator.clusters import load_cluster
    from simulator.deadlines import deadline_metrics, with_deadlines
    from simulator.replay import PlanCache, SimConfig, job_view, load_workloads, replay

    state = load_cluster(t.cluster).state
    cache = _cache(t.cluster, state, PlanCache)
    _, mapped = load_workloads(t.workload)[t.index]
    if t.max_jobs is not None:
        mapped = mapped[: t.max_jobs]
    views = [job_view(mj, cache) for mj in mapped]
    if not t.workload.startswith("elasticflow"):
        views = with_deadlines(views, seed=t.seed + t.index)
    kw = {"slack": t.slack} if t.policy in DEADLINE_POLICIES else None
    if t.policy == "elastic":
        kw = {**(kw or {}), **dict(t.elastic_kw)}
    config = SimConfig(tick_s=TICK_S, error=t.error, estimator=t.estimator,
                       error_seed=t.error_seed, correct=t.correct)
    res = replay(views, state, t.policy, config=config, policy_kwargs=kw)
    dm = deadline_metrics(res.records.values())
    m = res.metrics
    out = {"deadline_jobs": dm.deadline_jobs, "met": dm.met, "rejected": dm.rejected,
           "resizes": dm.resizes, "avg_jct_s": m.avg_jct_s, "makespan_s": m.makespan_s,
           "finished": m.finished, "sched_p95_ms": m.sched_p95_ms, "jobs": m.jobs,
           "unfinished": m.unfinished - dm.rejected}
    if t.error != "none":
        out["over_memory"] = len(res.backend.over_memory)
    return t, out


_CACHES: dict[str, Any] = {}


def _cache(name: str, state: Any, cls: Any) -> Any:
    if name not in _CACHES:
        _CACHES[name] = cls(state)
    return _CACHES[name]


def _map(tasks: list[DTask], workers: int) -> list[tuple[DTask, dict[str, float]]]:
    if workers > 1:
        import multiprocessing as mp

        with mp.get_context("fork").Pool(workers) as pool:
            return pool.map(run_one, tasks, chunksize=1)
    return [run_one(t) for t in tasks]


def run(sets: tuple[str, ...], policies: tuple[str, ...], clusters: tuple[str, ...], *,
        workers: int, max_jobs: int | None, slack: float = SLACK,
        elastic_kw: tuple[tuple[str, Any], ...] = (), error: str = "none",
        estimator: bool = True, error_seed: int = 0, correct: bool = True) -> dict[str, Any]:
    from simulator.replay import load_workloads

    tasks = [DTask(spec, k, cl, pol, max_jobs, slack, SEED, elastic_kw, error, estimator,
                   error_seed, correct)
             for cl in clusters
             for spec in sets for k in range(len(load_workloads(spec))) for pol in policies]
    t0 = time.perf_counter()
    results = _map(tasks, workers)
    by: dict[str, dict[str, list[dict[str, float]]]] = defaultdict(lambda: defaultdict(list))
    for t, r in results:
        by[f"{t.workload}@{t.cluster}"][t.policy].append(r)
    out: dict[str, Any] = {"tick_s": TICK_S, "seed": SEED, "slack": slack, "results": {},
                           "wall_s": round(time.perf_counter() - t0, 1)}
    if elastic_kw:
        out["elastic_kwargs"] = dict(elastic_kw)
    if error != "none":  # absent under 'none': the error-free output stays as it was
        out["error"] = error
        out["estimator"] = estimator
        out["error_seed"] = error_seed
        out["correct"] = correct
    for key, per in by.items():
        res: dict[str, Any] = {}
        for pol, rs in per.items():
            n = sum(r["deadline_jobs"] for r in rs)
            jcts = [r["avg_jct_s"] for r in rs if not math.isnan(r["avg_jct_s"])]
            res[pol] = {
                "deadline_ratio": sum(r["met"] for r in rs) / n if n else math.nan,
                "avg_jct_s": sum(jcts) / len(jcts) if jcts else math.nan,
                "makespan_s": sum(r["makespan_s"] for r in rs) / len(rs),
                "resizes": int(sum(r["resizes"] for r in rs)),
                "rejected": int(sum(r["rejected"] for r in rs)),
                "unfinished": int(sum(r["unfinished"] for r in rs)),
                "jobs": int(sum(r["jobs"] for r in rs)),
                "restarts_per_job": (sum(r["resizes"] for r in rs)
                                     / max(1, sum(r["jobs"] for r in rs))),
                "deadline_jobs": int(n),
                "files": len(rs),
            }
            if error != "none":
                res[pol]["over_memory"] = int(sum(r["over_memory"] for r in rs))
        if "elastic" in res:
            ef = res.get("elasticflow", {}).get("deadline_ratio")
            if ef:
                res["elastic"]["ratio_vs_elasticflow"] = res["elastic"]["deadline_ratio"] / ef
            has = res.get("has", {}).get("avg_jct_s")
            if has:
                res["elastic"]["jct_vs_has"] = res["elastic"]["avg_jct_s"] / has
        out["results"][key] = res
    return out


def split_summary(out: dict[str, Any], clusters: tuple[str, ...]) -> dict[str, Any]:
    """Per cluster, over the workloads of a split: the median, lowest and highest of
    ``elastic``'s deadline ratio against ElasticFlow's and of its average JCT against
    ``has``'s (the issue's headline figures), and how many workloads fall below 1.0x."""
    summ: dict[str, Any] = {}
    for cl in clusters:
        rows = [res["elastic"] for key, res in out["results"].items()
                if key.endswith(f"@{cl}") and "elastic" in res]
        ratios = [r["ratio_vs_elasticflow"] for r in rows if "ratio_vs_elasticflow" in r]
        jcts = [r["jct_vs_has"] for r in rows
                if "jct_vs_has" in r and not math.isnan(r["jct_vs_has"])]
        summ[cl] = {
            "workloads": len(rows),
            "median_ratio_vs_elasticflow": statistics.median(ratios) if ratios else math.nan,
            "min_ratio_vs_elasticflow": min(ratios, default=math.nan),
            "max_ratio_vs_elasticflow": max(ratios, default=math.nan),
            "below_1x": sum(r < 1.0 for r in ratios),
            "median_jct_vs_has": statistics.median(jcts) if jcts else math.nan,
            "jct_above_has": sum(j > 1.0 for j in jcts),
        }
    return summ


def seed_sweep(sets: tuple[str, ...], clusters: tuple[str, ...], seeds: int, *, workers: int,
               max_jobs: int | None, slack: float = SLACK,
               elastic_kw: tuple[tuple[str, Any], ...] = (), error: str = "none",
               estimator: bool = True, correct: bool = True, error_seed: int = 0
               ) -> dict[str, Any]:
    """``elastic`` against ``elasticflow`` on the generated-deadline workloads of ``sets``
    under ``seeds`` deadline draws (seeds ``SEED + 1000·i``): per workload and draw, the
    deadlines each met and their ratio; the median, lowest and highest ratio."""
    from simulator.replay import load_workloads

    draws = [SEED + 1000 * i for i in range(seeds)]
    gen = [spec for spec in sets if not spec.startswith("elasticflow")]
    tasks = [DTask(spec, k, cl, pol, max_jobs, slack, sd, elastic_kw, error, estimator,
                   error_seed, correct)
             for sd in draws
             for cl in clusters
             for spec in gen for k in range(len(load_workloads(spec)))
             for pol in DEADLINE_POLICIES]
    t0 = time.perf_counter()
    met: dict[str, dict[int, dict[str, int]]] = defaultdict(lambda: defaultdict(dict))
    for t, r in _map(tasks, workers):
        per = met[f"{t.workload}@{t.cluster}"][t.seed]
        per[t.policy] = per.get(t.policy, 0) + int(r["met"])
    out: dict[str, Any] = {"seeds": draws, "slack": slack, "results": {},
                           "wall_s": round(time.perf_counter() - t0, 1)}
    for key, by_seed in met.items():
        ours = [by_seed[sd]["elastic"] for sd in draws]
        theirs = [by_seed[sd]["elasticflow"] for sd in draws]
        ratios = [a / b if b else math.nan for a, b in zip(ours, theirs, strict=True)]
        out["results"][key] = {"met_elastic": ours, "met_elasticflow": theirs,
                               "ratios": ratios, "median_ratio": statistics.median(ratios),
                               "min_ratio": min(ratios), "max_ratio": max(ratios),
                               "draws_at_target": sum(r >= TARGETS["ratio_vs_elasticflow"]
                                                      for r in ratios)}
    return out


def sweep_table(sw: dict[str, Any]) -> str:
    head = (f"{'workload@cluster':<26}{'median':>8}{'lowest':>8}{'highest':>8}"
            f"{'draws >= 1.3x':>15}")
    lines = [f"elastic / ElasticFlow deadlines met over {len(sw['seeds'])} deadline draws "
             f"(seeds {sw['seeds'][0]}..{sw['seeds'][-1]}); {sw['wall_s']} s wall", head,
             "-" * len(head)]
    for key, r in sw["results"].items():
        lines.append(f"{key:<26}{r['median_ratio']:>7.3f}x{r['min_ratio']:>7.3f}x"
                     f"{r['max_ratio']:>7.3f}x{r['draws_at_target']:>9} of {len(sw['seeds'])}")
    return "\n".join(lines)


def table(out: dict[str, Any]) -> str:
    head = (f"{'workload@cluster':<26}{'policy':<14}{'ddl ratio':>10}{'avg JCT h':>10}"
            f"{'makespan h':>11}{'resizes':>8}{'restarts/job':>13}{'rejected':>9}{'unfin':>6}"
            f"{'vs EF':>7}")
    kw = "".join(f", elastic {k}={v}" for k, v in out.get("elastic_kwargs", {}).items())
    lines = [f"tick {out['tick_s']:.0f}s, seed {out['seed']}, deadline policies' slack "
             f"{out.get('slack', SLACK):g}{kw}; {out['wall_s']} s wall", head,
             "-" * len(head)]
    for key, res in out["results"].items():
        for pol, r in res.items():
            vs = r.get("ratio_vs_elasticflow")
            lines.append(
                f"{key:<26}{pol:<14}{r['deadline_ratio']:>10.3f}{r['avg_jct_s'] / 3600:>10.2f}"
                f"{r['makespan_s'] / 3600:>11.1f}{r['resizes']:>8}"
                f"{r['restarts_per_job']:>13.2f}{r['rejected']:>9}{r['unfinished']:>6}"
                f"{'' if vs is None else f'{vs:.2f}x':>7}")
    return "\n".join(lines)


def plot(out: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = list(out["results"])
    pols = [p for p in POLICIES if any(p in out["results"][k] for k in keys)]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    width = 0.8 / max(1, len(pols))
    for i, pol in enumerate(pols):
        xs = [k + (i - (len(pols) - 1) / 2) * width for k in range(len(keys))]
        ratio = [out["results"][k].get(pol, {}).get("deadline_ratio", 0.0) for k in keys]
        jct = [out["results"][k].get(pol, {}).get("avg_jct_s", 0.0) / 3600 for k in keys]
        axes[0].bar(xs, ratio, width, label=pol)
        axes[1].bar(xs, jct, width, label=pol)
    for ax, title in zip(axes, ("deadline satisfactory ratio", "average JCT (h, finished jobs)"),
                         strict=True):
        ax.set_xticks(range(len(keys)))
        ax.set_xticklabels(keys, rotation=20, ha="right", fontsize=8)
        ax.set_title(title)
        ax.grid(axis="y", alpha=0.3)
    axes[1].set_yscale("log")
    axes[0].legend(fontsize=8)
    fig.suptitle("Deadline-aware elastic scheduling (simulated; Controller + SimBackend)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_doc(out: dict[str, Any], docs: Path, command: str) -> None:
    """Refresh the results block of docs/deadlines.md (the prose around it is hand-written)."""
    doc = docs / "deadlines.md"
    block = "\n".join([
        "<!-- results:begin (written by python -m benchmarks.deadlines) -->",
        f"Command: `{command}` ({out['wall_s']} s wall on the 2-core dev machine).",
        "",
        "```",
        table(out),
        *(["", sweep_table(out["seed_sweep"])] if "seed_sweep" in out else []),
        "```",
        "<!-- results:end -->",
    ])
    text = doc.read_text() if doc.exists() else "# Deadline benchmark\n\n"
    begin, end = "<!-- results:begin", "<!-- results:end -->"
    if begin in text and end in text:
        i, j = text.index(begin), text.index(end) + len(end)
        text = text[:i] + block + text[j:]
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    doc.write_text(text)



def _elastic_kwargs(pairs: list[str]) -> tuple[tuple[str, Any], ...]:
    """``KEY=VALUE`` pairs (VALUE parsed as JSON, else kept as a string) checked against the
    elastic policy's keyword arguments."""
    import inspect

    from scheduler.policies.elastic import ElasticPolicy

    known = [p for p in inspect.signature(ElasticPolicy.__init__).parameters
             if p not in ("self", "perf", "slack")]
    out: list[tuple[str, Any]] = []
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or key not in known:
            raise ValueError(f"--elastic-arg {pair!r}: expected KEY=VALUE with KEY one of "
                             f"{', '.join(known)} (the margin is --slack)")
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        out.append((key, value))
    return tuple(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true",
                    help=f"first {QUICK_MAX_JOBS} jobs of ElasticFlow's trace and of one Sia "
                         "file, phoebe only")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--docs", default=None,
                    help="folder for deadlines.md/.json/_ratio.png (default: docs/ for the full "
                         "run, none for --quick)")
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--seeds", type=int, default=1,
                    help="deadline draws for the elastic-vs-ElasticFlow sweep on the "
                         "generated-deadline workloads (1: no sweep)")
    ap.add_argument("--slack", type=float, default=SLACK,
                    help="safety margin of both deadline policies (fraction of the time to the "
                         "deadline; default %(default)s)")
    ap.add_argument("--error", choices=ERROR_MODES, default="none",
                    help="prediction error in the simulator (simulator.error): none, measured "
                         "(calibrated on the measured step times) or 2x (default none)")
    ap.add_argument("--error-seed", type=int, default=0,
                    help="seed of the per-job error draws (default 0)")
    ap.add_argument("--no-estimator", action="store_true",
                    help="under --error, do not give elastic the online step-time estimator "
                         "(ablation)")
    ap.add_argument("--no-correction", action="store_true",
                    help="under --error, the policies without an estimator of their own plan on "
                         "the predictions alone, not on corrected step times "
                         "(scheduler.corrected; ablation)")
    ap.add_argument("--split", choices=("paper", "validation"), default="paper",
                    help="paper: ElasticFlow's trace and Sia's philly / saturn (the latter two "
                         "are the tuning split); validation: the first workload of every "
                         "validation-split set (benchmarks.splits), its first --max-jobs jobs, "
                         "with medians per cluster (default paper)")
    ap.add_argument("--max-jobs", type=int, default=150,
                    help="with --split validation: first N jobs of each workload (default 150)")
    ap.add_argument("--sets", default=None,
                    help="comma-separated trace sets or <set>:<k> workloads replacing the "
                         "sets of the chosen split, e.g. alibaba-openb:1,alibaba-openb:3")
    ap.add_argument("--elastic-arg", action="append", default=[], metavar="KEY=VALUE",
                    help="a keyword argument for the elastic policy only (VALUE as JSON, e.g. "
                         "opportunity_cost=1 or replan=false); repeatable")
    args = ap.parse_args(argv)
    if args.seeds < 1:
        ap.error(f"--seeds must be at least 1, got {args.seeds}")
    try:
        elastic_kw = _elastic_kwargs(args.elastic_arg)
    except ValueError as e:
        ap.error(str(e))
    logging.basicConfig(level=logging.ERROR)
    sets = QUICK_SETS if args.quick else FULL_SETS
    clusters = CLUSTERS[:1] if args.quick else CLUSTERS
    policies = tuple(p for p in args.policies.split(",") if p)
    max_jobs = QUICK_MAX_JOBS if args.quick else None
    if args.split == "validation":
        from benchmarks.splits import VALIDATION, first_files

        sets = first_files(VALIDATION)
        max_jobs = QUICK_MAX_JOBS if args.quick else args.max_jobs
    if args.sets is not None:
        sets = tuple(s for s in args.sets.split(",") if s)
        if not sets:
            ap.error("--sets: expected at least one trace set")
    out = run(sets, policies, clusters, workers=args.workers, max_jobs=max_jobs,
              slack=args.slack, elastic_kw=elastic_kw, error=args.error,
              estimator=not args.no_estimator, error_seed=args.error_seed,
              correct=not args.no_correction)
    if args.split == "validation":
        out["split"] = {"name": "validation", "max_jobs": max_jobs, "workloads": list(sets),
                        "clusters": split_summary(out, clusters)}
    print(table(out))
    if "split" in out:
        for cl, sm in out["split"]["clusters"].items():
            print(f"validation split @ {cl}: {sm['workloads']} workloads, elastic vs "
                  f"ElasticFlow deadlines met median {sm['median_ratio_vs_elasticflow']:.2f}x "
                  f"(min {sm['min_ratio_vs_elasticflow']:.2f}x, {sm['below_1x']} below 1.0x), "
                  f"avg JCT vs has median {sm['median_jct_vs_has']:.2f}x "
                  f"({sm['jct_above_has']} above)")
    if args.seeds > 1:
        out["seed_sweep"] = seed_sweep(sets, clusters, args.seeds, workers=args.workers,
                                       max_jobs=max_jobs, slack=args.slack,
                                       elastic_kw=elastic_kw, error=args.error,
                                       estimator=not args.no_estimator,
                                       correct=not args.no_correction,
                                       error_seed=args.error_seed)
        print(sweep_table(out["seed_sweep"]))
    docs = args.docs or (None if args.quick or args.split != "paper" else "docs")
    if docs:
        d = Path(docs)
        plot(out, d / "deadlines_ratio.png")
        cmd = "python -m benchmarks.deadlines" + (" --quick" if args.quick else "") + (
            f" --slack {args.slack:g}" if args.slack != SLACK else "") + (
            f" --seeds {args.seeds}" if args.seeds > 1 else "") + (
            f" --error {args.error}" if args.error != "none" else "") + (
            f" --error-seed {args.error_seed}" if args.error_seed else "") + (
            " --no-estimator" if args.no_estimator else "") + (
            " --no-correction" if args.no_correction else "") + "".join(
            f" --elastic-arg {a}" for a in args.elastic_arg)
        write_doc(out, d, cmd)
        (d / "deadlines.json").write_text(json.dumps(json_ready(out, 4), sort_keys=True, indent=1)
                                          + "\n")
    if args.json:
        print(json.dumps(json_ready(out, 4), sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
