"""Predicted vs measured step time on the shared measurement data sets.

    python -m benchmarks.step_time_accuracy [--json] [--plot PATH] [--write-docs]

Reads ../shared (relative to the repository root); a missing data set is skipped with a
message. Prints a table per data set (n, MAPE, worst, median predicted/measured); with
``--json`` the last line is one JSON object with the headline numbers. ``--write-docs`` also
writes docs/step_time_accuracy.json and the predicted-vs-measured PNG.

Calibration and validation splits (``CALIBRATION`` below; every row not in it is
validation): the GPU-independent constants (host dispatch floor per layer pass, runtime work
per micro-batch) and the A100 fp16 efficiency were fitted on vTrain single-node; the A100 and
H100 bf16 efficiencies on the llm-foundry rows of the MPT sizes 125m, 350m, 1b, 7b and 30b.
Every other row — vTrain multi-node, Korthikanti, the Megatron papers, llm-foundry 760m, 3b,
13b and 70b, Sia gpt_pmp, AMP — is validation. The JSON reports each set's MAPE over all its
rows and over its validation rows, and ``worst_set_mape`` over all sets.
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import sys
from collections.abc import Callable
from pathlib import Path

from predictor.gpus import load_gpu_catalog
from predictor.spec import Precision
from predictor.validation import (
    Case,
    ErrorStats,
    amp_cases,
    error_stats,
    gpt_pmp_cases,
    gpt_pmp_forward_per_stage,
    korthikanti_cases,
    llm_foundry_cases,
    megatron_paper_cases,
    predict,
    torchtitan_cases,
    vtrain_cases,
)
from simulator.error import LogError, fit_step_error

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"
MEASUREMENTS = SHARED / "measurements"
GPT_PMP = SHARED / "traces" / "sia-sosp23" / "traces" / "gpt_pmp"
DOCS = REPO / "docs"


def read_rows(path: Path) -> list[dict[str, str]]:
    with open(path, encoding="utf-8-sig", newline="") as fh:
        return list(csv.DictReader(fh))


def load_cases(gpt_pmp_precision: Precision = Precision.FP32) -> tuple[list[Case], list[str]]:
    """All validation cases that can be read, and messages about the skipped data sets."""
    cases: list[Case] = []
    skipped: list[str] = []

    def need(path: Path, what: str) -> bool:
        if path.exists():
            return True
        skipped.append(f"skipped {what}: {path} not found")
        return False

    if need(GPT_PMP / "placements-rtx.csv", "gpt_pmp rtx"):
        cases += gpt_pmp_cases(read_rows(GPT_PMP / "placements-rtx.csv"), "rtx",
                               gpt_pmp_precision)
    if need(GPT_PMP / "placements-dgx-ext.csv", "gpt_pmp dgx-ext"):
        cases += gpt_pmp_cases(read_rows(GPT_PMP / "placements-dgx-ext.csv"), "dgx-ext",
                               gpt_pmp_precision)
    vt = MEASUREMENTS / "vtrain"
    if need(vt / "ground_truth_single.csv", "vtrain single"):
        cases += vtrain_cases(read_rows(vt / "ground_truth_single.csv"), "vtrain_single")
    if need(vt / "ground_truth_multi.csv", "vtrain multi"):
        cases += vtrain_cases(read_rows(vt / "ground_truth_multi.csv"), "vtrain_multi")
    k = MEASUREMENTS / "korthikanti2022" / "iteration_time_table5.csv"
    if need(k, "korthikanti2022"):
        cases += korthikanti_cases(read_rows(k))
    f = MEASUREMENTS / "llm_foundry" / "mpt_throughput_benchmarks.csv"
    if need(f, "llm_foundry"):
        cases += llm_foundry_cases(read_rows(f))
    tt = REPO / "benchmarks" / "data" / "step_time" / "torchtitan_tps.csv"
    if need(tt, "torchtitan"):
        cases += torchtitan_cases(read_rows(tt))
    amp = MEASUREMENTS / "amp" / "amp_real_trials.csv"
    if need(amp, "amp"):
        cases += amp_cases(read_rows(amp))
    mp = MEASUREMENTS / "megatron_papers" / "paper_reported_throughput.csv"
    if need(mp, "megatron_papers"):
        cases += megatron_paper_cases(read_rows(mp))
    return cases, skipped


# The declared calibration split: data set -> predicate on a case (True: calibration row).
LLM_FOUNDRY_CALIBRATION_SIZES = frozenset({"125m", "350m", "1b", "7b", "30b"})
CALIBRATION: dict[str, Callable[[Case], bool]] = {
    "vtrain_single": lambda case: True,
    "llm_foundry": lambda case: case.model.name.removeprefix("mpt-")
    in LLM_FOUNDRY_CALIBRATION_SIZES,
    # the 8-GPU row fixes the 500 W H100-96G's bf16 efficiency; the 128-GPU row (same work
    # per GPU, FSDP across 16 hosts) is validation
    "torchtitan": lambda case: case.par.dp == 8,
}


def is_calibration(case: Case) -> bool:
    """Whether ``case`` belongs to the calibration split (``CALIBRATION``)."""
    rule = CALIBRATION.get(case.dataset)
    return bool(rule and rule(case))


def is_validation(case: Case) -> bool:
    """The validation split: every row the calibration split does not name."""
    return not is_calibration(case)


def split_stats(pairs: list[tuple[Case, float]]) -> dict[str, dict[str, ErrorStats]]:
    """Per data set: stats over all rows, the calibration rows and the validation rows."""
    out: dict[str, dict[str, tuple[list[float], list[float]]]] = {}
    for case, pred in pairs:
        role = "validation" if is_validation(case) else "calibration"
        for part in ("all", role):
            p, m = out.setdefault(case.dataset, {}).setdefault(part, ([], []))
            p.append(pred)
            m.append(case.measured_s)
    return {ds: {part: error_stats(p, m) for part, (p, m) in parts.items()}
            for ds, parts in sorted(out.items())}


def _group_key(case: Case) -> str:
    return f"{case.dataset} [{case.group}]" if case.group else case.dataset


def evaluate(cases: list[Case]) -> tuple[dict[str, ErrorStats], list[tuple[Case, float]]]:
    gpus = load_gpu_catalog()
    pairs = [(c, predict(c, gpus).total_s) for c in cases]
    stats: dict[str, ErrorStats] = {}
    buckets: dict[str, tuple[list[float], list[float]]] = {}
    for case, pred in pairs:
        for key in {case.dataset, _group_key(case)}:
            p, m = buckets.setdefault(key, ([], []))
            p.append(pred)
            m.append(case.measured_s)
    for key, (p, m) in sorted(buckets.items()):
        stats[key] = error_stats(p, m)
    return stats, pairs


def error_model(pairs: list[tuple[Case, float]]) -> dict[str, LogError]:
    """The simulator's step-time error model (``simulator.error.fit_step_error``) fitted on
    the signed residuals of every (case, prediction) pair, keyed by the case's GPU type."""
    return fit_step_error((c.gpu, c.dataset, pred, c.measured_s) for c, pred in pairs)


def gpt_pmp_shape(cases: list[Case]) -> dict[str, float]:
    """Shape checks on gpt_pmp: step time vs local batch (b=2 / b=1 at the same placement) and
    sync growth per added node, measured vs predicted."""
    gpus = load_gpu_catalog()
    out: dict[str, float] = {}
    for cluster in ("rtx", "dgx-ext"):
        sub = [c for c in cases if c.dataset == f"gpt_pmp_{cluster}"]
        if not sub:
            continue
        one = {c.topology.gpus_per_node: c for c in sub if c.par.micro_batch == 1}
        two = {c.topology.gpus_per_node: c for c in sub if c.par.micro_batch == 2}
        pl = min(one, key=len)
        out[f"{cluster}_fwd_b1_pred_s"] = gpt_pmp_forward_per_stage(one[pl], gpus)
        out[f"{cluster}_fwd_b2_over_b1_pred"] = (
            gpt_pmp_forward_per_stage(two[pl], gpus) / gpt_pmp_forward_per_stage(one[pl], gpus)
        )
        out[f"{cluster}_step_b2_over_b1_meas"] = two[pl].measured_s / one[pl].measured_s
        out[f"{cluster}_step_b2_over_b1_pred"] = (
            predict(two[pl], gpus).total_s / predict(one[pl], gpus).total_s
        )
        multi = sorted((p for p in one if len(p) >= 2), key=len)
        if len(multi) >= 2:
            a, b = one[multi[0]], one[multi[1]]
            out[f"{cluster}_per_node_increment_meas_s"] = b.measured_s - a.measured_s
            out[f"{cluster}_per_node_increment_pred_s"] = (
                predict(b, gpus).total_s - predict(a, gpus).total_s
            )
    return out


def plot(pairs: list[tuple[Case, float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 6))
    by_set: dict[str, tuple[list[float], list[float]]] = {}
    for case, pred in pairs:
        m, p = by_set.setdefault(case.dataset, ([], []))
        m.append(case.measured_s)
        p.append(pred)
    for name, (m, p) in sorted(by_set.items()):
        ax.scatter(m, p, s=8, alpha=0.6, label=name)
    lo = min(min(m) for m, _ in by_set.values()) * 0.8
    hi = max(max(m) for m, _ in by_set.values()) * 1.25
    ax.plot([lo, hi], [lo, hi], "k-", lw=0.8)
    for f in (0.8, 1.25):
        ax.plot([lo, hi], [lo * f, hi * f], "k:", lw=0.6)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("measured step time (s)")
    ax.set_ylabel("predicted step time (s)")
    ax.set_title("Frenzy step-time model: predicted vs measured (dotted: ±20/25%)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def headline(stats: dict[str, ErrorStats], shape: dict[str, float]) -> dict[str, float]:
    names = {
        "gpt_pmp_rtx": "gpt_pmp_mape_rtx",
        "gpt_pmp_dgx-ext": "gpt_pmp_mape_a100",
        "gpt_pmp_rtx [rtx]": "gpt_pmp_mape_rtx_profiled",
        "gpt_pmp_dgx-ext [dgx-ext]": "gpt_pmp_mape_a100_profiled",
        "vtrain_single": "vtrain_single_mape",
        "vtrain_multi": "vtrain_multi_mape",
        "korthikanti": "korthikanti_mape",
        "llm_foundry": "llm_foundry_mape",
        "llm_foundry [H100-80G]": "llm_foundry_h100_mape",
        "llm_foundry [A100-80G]": "llm_foundry_a100_80g_mape",
        "llm_foundry [A100-40G]": "llm_foundry_a100_40g_mape",
        "megatron_papers": "megatron_papers_mape",
        "amp_t4": "amp_t4_mape",
        "torchtitan": "torchtitan_h100_96g_mape",
    }
    out: dict[str, float] = {}
    for key, name in names.items():
        if key in stats:
            out[name] = round(stats[key].mape, 2)
            out[name.replace("_mape", "_worst")] = round(stats[key].worst, 2)
            out[name.replace("_mape", "_n")] = stats[key].n
    out.update({k: round(v, 4) for k, v in shape.items()})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object last")
    ap.add_argument("--plot", type=Path, default=None, help="write the scatter PNG here")
    ap.add_argument("--write-docs", action="store_true",
                    help="write docs/step_time_accuracy.json and .png")
    ap.add_argument("--error-model", action="store_true",
                    help="print the simulator's step-time error model fitted on these sets "
                         "(simulator.error.MEASURED_STEP_ERROR) and stop")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    cases, skipped = load_cases()
    for msg in skipped:
        print(msg)
    if not cases:
        print("no data sets found under", SHARED)
        return 1
    stats, pairs = evaluate(cases)
    if args.error_model:
        fitted = error_model(pairs)
        print(f"{'GPU type':10s} {'bias':>8s} {'sigma':>8s} {'rows':>5s} {'sets':>5s}")
        for gpu, e in fitted.items():
            print(f"{gpu:10s} {e.bias:8.4f} {e.sigma:8.4f} {e.n:5d} {e.sets:5d}")
        if args.json:
            print(json.dumps({g: {"bias": round(e.bias, 4), "sigma": round(e.sigma, 4),
                                  "n": e.n, "sets": e.sets} for g, e in fitted.items()}))
        return 0
    shape = gpt_pmp_shape(cases)

    print(f"{'data set':38s} {'n':>5s} {'MAPE %':>8s} {'worst %':>8s} {'median pred/meas':>17s}")
    for key, st in stats.items():
        print(f"{key:38s} {st.n:5d} {st.mape:8.1f} {st.worst:8.1f} {st.median_ratio:17.2f}")
    # the alternative fp16 reading of gpt_pmp, for the record
    alt, _ = load_cases(Precision.FP16)
    alt_stats, _ = evaluate([c for c in alt if c.dataset.startswith("gpt_pmp")])
    for key in ("gpt_pmp_rtx", "gpt_pmp_dgx-ext"):
        if key in alt_stats:
            st = alt_stats[key]
            print(f"{key + ' (fp16 reading)':38s} {st.n:5d} {st.mape:8.1f} {st.worst:8.1f} "
                  f"{st.median_ratio:17.2f}")
    print("gpt_pmp shape:", json.dumps({k: round(v, 4) for k, v in shape.items()}))

    splits = split_stats(pairs)
    print(f"\n{'data set':20s} {'rows':>5s} {'MAPE %':>7s} {'calib n':>8s} {'calib %':>8s} "
          f"{'valid n':>8s} {'valid %':>8s}")
    for ds, parts in splits.items():
        cal, val = parts.get("calibration"), parts.get("validation")
        print(f"{ds:20s} {parts['all'].n:5d} {parts['all'].mape:7.1f} "
              f"{cal.n if cal else 0:8d} {f'{cal.mape:.1f}' if cal else '-':>8s} "
              f"{val.n if val else 0:8d} {f'{val.mape:.1f}' if val else '-':>8s}")

    result = headline(stats, shape)
    result["per_set_mape"] = {ds: round(parts["all"].mape, 2) for ds, parts in splits.items()}
    result["per_set_validation_mape"] = {ds: round(parts["validation"].mape, 2)
                                         for ds, parts in splits.items()
                                         if "validation" in parts}
    worst = max(splits, key=lambda ds: splits[ds]["all"].mape)
    result["worst_set_mape"] = round(splits[worst]["all"].mape, 2)
    result["worst_set"] = worst
    result["calibration_sets"] = sorted(CALIBRATION)
    result["validation_sets"] = sorted(result["per_set_validation_mape"])
    for key in ("gpt_pmp_rtx", "gpt_pmp_dgx-ext"):
        if key in alt_stats:
            result[f"{key.replace('-', '_')}_fp16_reading_mape"] = round(alt_stats[key].mape, 2)
    if args.plot or args.write_docs:
        path = args.plot or DOCS / "step_time_accuracy.png"
        plot(pairs, path)
        print("wrote", path)
    if args.write_docs:
        full = {"headline": result, "per_set": {k: v.as_dict() for k, v in stats.items()}}
        (DOCS / "step_time_accuracy.json").write_text(json.dumps(full, indent=2) + "\n")
        print("wrote", DOCS / "step_time_accuracy.json")
    if args.json:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
