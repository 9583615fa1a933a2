"""Plan choice against measured data: does the planner's top plan match the measured-fastest?

    python -m benchmarks.plan_regret [--json] [--write-docs]

A *decision* is a set of measured runs of the same model, global batch and GPU count that
differ only in the plan (tp, pp, dp, micro-batch): vTrain's single-node and multi-node sets
(Megatron-DeepSpeed on A100) and AMP's homogeneous T4 experiment (DeepSpeed, incl. its runs
that ran out of memory). For each decision the planner ranks the measured candidate plans as
it ranks its own (same GPU count: by predicted step time, ``predictor.step_time`` with the
set's runtime profile) among those the memory model accepts (``predictor.memory`` at the
planner's default margin), and its top plan is compared with the measured-fastest run:

    regret = measured time of the chosen plan / measured time of the fastest run − 1

A chosen plan that ran out of memory has infinite regret. ``oom_accepted`` counts runs that
failed for memory while the memory model says they fit; ``ran_rejected`` counts runs that ran
while the memory model rejects them (every run of every set, AMP's heterogeneous-cluster
experiment included: its V100s and T4s both have 16 GB). The baseline picks the plan with the
most data parallelism (then the largest micro-batch the memory model accepts), as plain DDP
would. Reads ../shared; a missing data set is skipped with a message. ``--json`` prints one
JSON object last; ``--write-docs`` writes docs/plan_regret.json.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import math
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from benchmarks.step_time_accuracy import DOCS, MEASUREMENTS, read_rows
from predictor.gpus import GpuType, load_gpu_catalog
from predictor.memory import estimate_memory
from predictor.overhead import NON_TENSOR
from predictor.planner import DEFAULT_MARGIN
from predictor.runtimes import get_runtime
from predictor.spec import ModelSpec, ParallelConfig, TrainingSpec
from predictor.step_time import Topology, estimate_step_time
from predictor.validation import AMP_MODEL, amp_plan, vtrain_cases

log = logging.getLogger(__name__)

WITHIN = 0.05  # "within 5 % of the measured best"
AMP_PARAMLESS = frozenset({1, 26, 29})  # AMP's pipeline "layers" without parameters:
# the transposes around the transformer layers and the loss (../shared/measurements/amp)


@dataclass(frozen=True, slots=True)
class Run:
    """One measured run of a plan: its inputs, and its time (None: it ran out of memory)."""

    dataset: str
    key: tuple
    model: ModelSpec
    train: TrainingSpec
    par: ParallelConfig
    gpu: str
    topology: Topology
    runtime: str
    measured_s: float | None
    memory_gpu: str = ""  # the GPU whose capacity bounds the run (default: ``gpu``)

    @property
    def label(self) -> str:
        p = self.par
        return f"t{p.tp}d{p.dp}p{p.pp} mb{p.micro_batch}"


@dataclass(frozen=True, slots=True)
class Decision:
    """The outcome of one decision: chosen and baseline plans against the measured best."""

    dataset: str
    key: tuple
    candidates: int
    chosen: str
    best: str
    regret: float
    baseline: str
    baseline_regret: float


def vtrain_runs(rows: Sequence[dict[str, str]], dataset: str,
                memory_gpu: str = "A100-80G") -> list[Run]:
    """vTrain's runs. Its A100s' memory size is not stated (the step-time reading uses the
    40 GB part's lower HBM bandwidth); every run ran, so the capacity check reads the 80 GB
    part by default, and the benchmark also reports what the 40 GB reading rejects."""
    runs = []
    for c in vtrain_cases(rows, dataset):
        key = (c.model.num_layers, c.model.hidden_size, c.train.seq_len,
               c.train.global_batch, c.par.num_gpus)
        runs.append(Run(dataset, key, c.model, c.train, c.par, c.gpu, c.topology, c.runtime,
                        c.measured_s, memory_gpu))
    return runs


def not_memory_failures(rows: Sequence[dict[str, str]]) -> set[int]:
    """Indices of AMP's failed trials that cannot have failed for memory: the same
    experiment ran the same plan (tp, dp, pp and DeepSpeed layer partition) with a larger
    micro-batch, which needs at least as much memory on every stage; or one of its pipeline
    stages holds no parameters (see ``empty_stage``). AMP labels a trial
    "cannot run", mostly but not only out of memory (../shared/measurements/amp/SOURCE.md)."""
    def plan(row: dict[str, str]) -> tuple[str, ...]:
        return (row["experiment"], row["tp"], row["dp"], row["pp"], row["layer_partition"])

    def empty_stage(row: dict[str, str]) -> bool:
        # a stage over AMP's parameterless pseudo-layers only (index 1, the transpose after
        # the embedding): DeepSpeed builds each stage's optimizer over its own parameters,
        # and an empty parameter list is an error whatever the micro-batch
        bounds = [int(x) for x in row["layer_partition"].split(",")]
        return any(set(range(a, b)) <= AMP_PARAMLESS for a, b in itertools.pairwise(bounds))

    ran: dict[tuple[str, ...], int] = {}
    for row in rows:
        if row["measured_iter_time_s"]:
            ran[plan(row)] = max(ran.get(plan(row), 0), int(row["micro_batch"]))
    return {i for i, row in enumerate(rows)
            if not row["measured_iter_time_s"]
            and (int(row["micro_batch"]) < ran.get(plan(row), 0) or empty_stage(row))}


def amp_runs(rows: Sequence[dict[str, str]]) -> list[Run]:
    """AMP's GPT runs (homogeneous and heterogeneous cluster), OOM ones included; the
    TransGAN experiment is skipped (not a model the predictor expresses), and so are the
    failed trials that cannot have failed for memory (``not_memory_failures``)."""
    runs = []
    skip = not_memory_failures(rows)
    for i, row in enumerate(rows):
        if row["experiment"] not in ("homogeneous", "het_cluster") or i in skip:
            continue
        train, par, topo = amp_plan(row)
        measured = float(row["measured_iter_time_s"]) if row["measured_iter_time_s"] else None
        if measured is None and row["oom_or_failed"] != "1":
            continue
        runs.append(Run(f"amp_{row['experiment']}", (row["experiment"], train.global_batch),
                        AMP_MODEL, train, par, "T4", topo, "deepspeed", measured))
    return runs


def device_bytes(run: Run, gpu: GpuType) -> int:
    """The planner's device figure (nvidia-smi reading) of ``run``'s plan on ``gpu``: the
    counted tensors under the run's runtime profile and its measured stage split, plus the
    workspace, allocator slack and memory outside the allocator (``predictor.overhead``)."""
    layers = run.par.extra.get("stage_layers") if run.par.extra else None
    mem = estimate_memory(run.model, run.train, run.par, None,
                          runtime=get_runtime(run.runtime), layers=layers)
    return NON_TENSOR.fill(mem, gpu, run.par.num_gpus).device


def memory_fits(run: Run, gpu: GpuType, margin: float = DEFAULT_MARGIN) -> bool:
    """Whether the planner's memory check accepts ``run``'s plan on ``gpu``: the device
    figure within ``1 − margin`` of the GPU's memory, as ``plan_job`` requires
    (``margin=0``: whether the model predicts the plan fits at all)."""
    return device_bytes(run, gpu) <= gpu.memory_bytes * (1.0 - margin)


def predicted_s(run: Run, gpu: GpuType) -> float:
    return estimate_step_time(run.model, run.train, run.par, gpu, run.topology,
                              run.runtime).total_s


def _regret(run: Run, best_s: float) -> float:
    return math.inf if run.measured_s is None else run.measured_s / best_s - 1.0


def max_dp_choice(runs: Sequence[Run], fits: Callable[[Run], bool]) -> Run:
    """The baseline: most data parallelism, then the largest micro-batch the memory model
    accepts (then less tp, less pp); the largest-dp run with the smallest micro-batch when
    none is accepted."""
    dp = max(r.par.dp for r in runs)
    top = [r for r in runs if r.par.dp == dp]
    ok = [r for r in top if fits(r)]
    if ok:
        return max(ok, key=lambda r: (r.par.micro_batch, -r.par.tp, -r.par.pp))
    return min(top, key=lambda r: (r.par.micro_batch, r.par.tp, r.par.pp))


def decide(runs: Sequence[Run], gpus: dict[str, GpuType]
           ) -> tuple[list[Decision], list[Run], list[Run]]:
    """All decisions (data sets with a single GPU type), and the runs the memory model
    gets wrong: (decisions, OOM runs it accepts, runs that ran which it rejects)."""
    fit_cache: dict[int, bool] = {}

    def fits(run: Run) -> bool:
        if id(run) not in fit_cache:
            fit_cache[id(run)] = memory_fits(run, gpus[run.memory_gpu or run.gpu])
        return fit_cache[id(run)]

    oom_accepted = [r for r in runs if r.measured_s is None and fits(r)]
    # a run that ran is a model error only where its device figure exceeds the GPU's memory;
    # rejecting it for the margin alone is the margin's price (``margin_rejected``)
    ran_rejected = [r for r in runs if r.measured_s is not None
                    and not memory_fits(r, gpus[r.memory_gpu or r.gpu], margin=0.0)]
    groups: dict[tuple, list[Run]] = {}
    for r in runs:
        if r.dataset == "amp_het_cluster":
            continue  # one pipeline over V100s and T4s: not a single-GPU-type decision
        groups.setdefault((r.dataset, r.key), []).append(r)
    decisions = []
    for (dataset, key), group in groups.items():
        ran = [r for r in group if r.measured_s is not None]
        if len(group) < 2 or not ran:
            continue
        best = min(ran, key=lambda r: r.measured_s or 0.0)
        best_s = best.measured_s or 0.0
        accepted = [r for r in group if fits(r)] or group
        chosen = min(accepted, key=lambda r: predicted_s(r, gpus[r.gpu]))
        base = max_dp_choice(group, fits)
        decisions.append(Decision(dataset, key, len(group), chosen.label, best.label,
                                  _regret(chosen, best_s), base.label, _regret(base, best_s)))
    return decisions, oom_accepted, ran_rejected


def cell_oracle_share(runs: Sequence[Run], gpus: dict[str, GpuType],
                      cell: Callable[[Run], tuple] = lambda r: (
                          r.model.hidden_size, r.par.tp, r.par.micro_batch)) -> float:
    """A diagnostic bound: the share of decisions within 5 % if every prediction were
    scaled by its cell's median measured/predicted ratio (default cell: hidden size, tp,
    micro-batch — what a per-shape kernel profile would correct). Every run must have run;
    the factors are read off the same runs, so this says what exact per-cell layer times
    would buy, not what a model achieves."""
    pred = {id(r): predicted_s(r, gpus[r.gpu]) for r in runs}
    ratios: dict[tuple, list[float]] = {}
    for r in runs:
        ratios.setdefault(cell(r), []).append((r.measured_s or 0.0) / pred[id(r)])
    factor = {k: statistics.median(v) for k, v in ratios.items()}
    groups: dict[tuple, list[Run]] = {}
    for r in runs:
        groups.setdefault(r.key, []).append(r)
    hits = total = 0
    for group in groups.values():
        if len(group) < 2:
            continue
        best_s = min(r.measured_s or 0.0 for r in group)
        chosen = min(group, key=lambda r: pred[id(r)] * factor[cell(r)])
        total += 1
        hits += _regret(chosen, best_s) <= WITHIN
    return round(hits / total, 4) if total else 0.0


def margin_rejected(runs: Sequence[Run], gpus: dict[str, GpuType]) -> list[Run]:
    """Runs that ran and that the model says fit, but not within the planner's margin."""
    return [r for r in runs if r.measured_s is not None
            and memory_fits(r, gpus[r.memory_gpu or r.gpu], margin=0.0)
            and not memory_fits(r, gpus[r.memory_gpu or r.gpu])]


def p90(values: Sequence[float]) -> float:
    """Nearest-rank 90th percentile."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.9 * len(ordered)) - 1)]


def summarize(decisions: Sequence[Decision]) -> dict[str, float | int | None]:
    def fin(x: float) -> float | None:
        return None if math.isinf(x) else round(x, 4)

    n = len(decisions)
    if not n:
        return {"decisions": 0}
    regs = [d.regret for d in decisions]
    base = [d.baseline_regret for d in decisions]
    return {
        "decisions": n,
        "share_within_5pct": round(sum(r <= WITHIN for r in regs) / n, 4),
        "p90_regret": fin(p90(regs)),
        "worst_regret": fin(max(regs)),
        "mean_regret": fin(sum(regs) / n),
        "chose_oom": sum(math.isinf(r) for r in regs),
        "baseline_share_within_5pct": round(sum(r <= WITHIN for r in base) / n, 4),
        "baseline_p90_regret": fin(p90(base)),
        "baseline_worst_regret": fin(max(base)),
        "baseline_chose_oom": sum(math.isinf(r) for r in base),
    }


def load_runs() -> tuple[list[Run], list[str]]:
    runs: list[Run] = []
    skipped: list[str] = []
    for name, path, build in (
        ("vtrain_single", MEASUREMENTS / "vtrain" / "ground_truth_single.csv",
         lambda rows: vtrain_runs(rows, "vtrain_single")),
        ("vtrain_multi", MEASUREMENTS / "vtrain" / "ground_truth_multi.csv",
         lambda rows: vtrain_runs(rows, "vtrain_multi")),
        ("amp", MEASUREMENTS / "amp" / "amp_real_trials.csv", amp_runs),
    ):
        if Path(path).exists():
            runs += build(read_rows(path))
        else:
            skipped.append(f"skipped {name}: {path} not found")
    return runs, skipped


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object last")
    ap.add_argument("--write-docs", action="store_true", help="write docs/plan_regret.json")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    runs, skipped = load_runs()
    for msg in skipped:
        print(msg)
    if not runs:
        print("no measured data found under", MEASUREMENTS)
        return 1
    gpus = load_gpu_catalog()
    decisions, oom_accepted, ran_rejected = decide(runs, gpus)

    result: dict = summarize(decisions)
    result["oom_accepted"] = len(oom_accepted)
    result["ran_rejected"] = len(ran_rejected)
    within_margin = margin_rejected(runs, gpus)
    result["ran_rejected_by_margin"] = len(within_margin)
    result["margin"] = DEFAULT_MARGIN
    vt40 = [replace(r, memory_gpu="A100-40G") for r in runs if r.dataset.startswith("vtrain")]
    result["ran_rejected_vtrain_as_a100_40g"] = len(decide(vt40, gpus)[2])
    result["runs"] = len(runs)
    single = [r for r in runs if r.dataset == "vtrain_single"]
    if single:
        result["vtrain_single_cell_oracle_share"] = cell_oracle_share(single, gpus)
        result["vtrain_single_cell_pp_oracle_share"] = cell_oracle_share(
            single, gpus, lambda r: (r.model.hidden_size, r.par.tp, r.par.micro_batch,
                                     r.par.pp))
    result["oom_runs"] = sum(r.measured_s is None for r in runs)
    per_set = {ds: summarize([d for d in decisions if d.dataset == ds])
               for ds in sorted({d.dataset for d in decisions})}

    print(f"{'set':16s} {'n':>4s} {'within 5%':>10s} {'p90':>7s} {'worst':>7s} "
          f"{'max-dp within 5%':>17s} {'max-dp p90':>11s}")
    for name, s in [*per_set.items(), ("all", result)]:
        def pct(x: float | None) -> str:
            return "OOM" if x is None else f"{100 * x:.1f}%"

        print(f"{name:16s} {s['decisions']:4d} {100 * s['share_within_5pct']:9.1f}% "
              f"{pct(s['p90_regret']):>7s} {pct(s['worst_regret']):>7s} "
              f"{100 * s['baseline_share_within_5pct']:16.1f}% "
              f"{pct(s['baseline_p90_regret']):>11s}")
    print(f"memory check over {len(runs)} runs ({result['oom_runs']} out of memory): "
          f"oom_accepted {len(oom_accepted)}, ran_rejected {len(ran_rejected)}")
    for r in oom_accepted:
        print(f"  OOM but accepted: {r.dataset} {r.label}")
    for r in ran_rejected:
        print(f"  ran but rejected: {r.dataset} {r.label} {r.key}")
    print(f"ran, fit by the model, but within the {DEFAULT_MARGIN:.0%} margin: "
          f"{len(within_margin)}")
    for r in within_margin:
        print(f"  within margin: {r.dataset} {r.label} {r.key}")
    misses = sorted((d for d in decisions if d.regret > WITHIN), key=lambda d: -d.regret)
    for d in misses[:10]:
        print(f"  miss {d.dataset} {d.key}: chose {d.chosen}, best {d.best}, "
              f"regret {d.regret:.1%}")

    if args.write_docs:
        full = {"headline": result, "per_set": per_set,
                "misses": [{"set": d.dataset, "key": list(d.key), "chosen": d.chosen,
                            "best": d.best, "regret": round(d.regret, 4)} for d in misses]}
        (DOCS / "plan_regret.json").write_text(json.dumps(full, indent=2) + "\n")
        print("wrote", DOCS / "plan_regret.json")
    if args.json:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
