"""The caching allocator's reserve over the tensors, measured: by trainer, allocator setting
and recomputation, from the GPU rows committed under docs/gpu_runs (no GPU needed).

    python -m benchmarks.allocator_slack [--json]

Every measured row there holds ``torch.cuda.max_memory_allocated`` and
``max_memory_reserved`` of one run, so ``reserved / allocated`` is the allocator's own
overhead, free of any error of the tensor model. A candidate term for the predictor, the
reserve that full recomputation adds, is fitted on the built-in trainer's rows
(``trainer_cuda_h200*.jsonl``: the median ratio of its plans with full recomputation minus
that of its other plans, ``fit_recompute_slack``) and checked on the Hugging Face Trainer's
rows (``hf_trainer_h200*.jsonl``, ``hf_fragmentation_h200``), run under both the
allocator's default and ``expandable_segments``. (Whether the predictor takes it is decided
on the public rows of ``benchmarks.memory_accuracy``; docs/memory_accuracy.md.)
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path
from typing import Any

GPU_RUNS = Path(__file__).parents[1] / "docs" / "gpu_runs"
FIT_FILES = "trainer_cuda_h200*.jsonl"
CHECK_FILES = ("hf_trainer_h200*.jsonl", "hf_fragmentation_h200.jsonl")
SKIP = ("_contents",)  # a rerun of plans whose peaks another file already holds


def _recompute(row: dict[str, Any]) -> str:
    spec = row.get("spec")
    if isinstance(spec, dict) and "recompute" in spec:
        return str(spec["recompute"])
    found = re.search(r"rc=(\w+)", row.get("plan", ""))
    return found.group(1) if found else "none"


def load(patterns: tuple[str, ...] | str, directory: Path = GPU_RUNS) -> list[dict[str, Any]]:
    """One entry per measured row: source file, trainer, allocator setting, recomputation
    and ``reserved / allocated``."""
    out = []
    for pattern in (patterns,) if isinstance(patterns, str) else patterns:
        for path in sorted(directory.glob(pattern)):
            if any(s in path.name for s in SKIP):
                continue
            for line in path.read_text().splitlines():
                row = json.loads(line)
                m = row.get("measured") or {}
                if "error" in row or not m.get("alloc") or not m.get("reserved"):
                    continue
                trainer = "frenzy" if path.name.startswith("trainer_cuda") else (
                    "lightning" if "lightning" in row.get("plan", "") else "hf-trainer")
                out.append({"file": path.name, "trainer": trainer,
                            "allocator": "expandable" if "expandable" in
                            row.get("alloc_conf", "") else "default",
                            "recompute": _recompute(row),
                            "ratio": m["reserved"] / m["alloc"]})
    return out


def fit_recompute_slack(rows: list[dict[str, Any]]) -> float:
    """Median ``reserved / allocated`` of the full-recomputation rows minus that of the
    others (rounded to 0.01): the reserve full recomputation adds, as a fraction of the
    tensors."""
    full = [r["ratio"] for r in rows if r["recompute"] == "full"]
    other = [r["ratio"] for r in rows if r["recompute"] != "full"]
    if not full or not other:
        raise ValueError("needs rows with and without full recomputation")
    return round(statistics.median(full) - statistics.median(other), 2)


def groups(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """n, median, min and max of the ratio per (trainer, allocator, full recomputation)."""
    keyed: dict[tuple[str, str, bool], list[float]] = {}
    for r in rows:
        keyed.setdefault((r["trainer"], r["allocator"], r["recompute"] == "full"),
                         []).append(r["ratio"])
    return [{"trainer": t, "allocator": a, "full_recompute": f, "n": len(v),
             "median": round(statistics.median(v), 3), "min": round(min(v), 3),
             "max": round(max(v), 3)} for (t, a, f), v in sorted(keyed.items())]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="one JSON object on the last line")
    args = ap.parse_args(argv)
    fit_rows, check_rows = load(FIT_FILES), load(CHECK_FILES)
    table = groups(fit_rows + check_rows)
    print(f"{'trainer':<11} {'allocator':<11} {'full rc':<8} {'n':>3} {'median':>7} "
          f"{'min':>6} {'max':>6}   reserved / allocated")
    for g in table:
        print(f"{g['trainer']:<11} {g['allocator']:<11} {g['full_recompute']!s:<8} {g['n']:>3} "
              f"{g['median']:7.3f} {g['min']:6.3f} {g['max']:6.3f}")
    fitted = fit_recompute_slack(fit_rows)
    checks = {a: fit_recompute_slack([r for r in check_rows if r["allocator"] == a])
              for a in ("default", "expandable")}
    print(f"recompute_slack fitted on the built-in trainer's rows: {fitted:.2f}; the Hugging "
          f"Face rows (held out): {checks['default']:.2f} default allocator, "
          f"{checks['expandable']:.2f} expandable segments")
    if args.json:
        print(json.dumps({"recompute_slack": fitted, "check_default": checks["default"],
                          "check_expandable": checks["expandable"], "groups": table}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
