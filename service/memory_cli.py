"""``frenzy memory --spec FILE.json``: one plan's memory (tensors, reserved, device) from a
JSON spec (fields: README.md, "Memory estimate"; ``predictor.memory_spec``)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from predictor.errors import SpecError
from predictor.gpus import GIB
from predictor.memory_spec import memory_report


def add_memory_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "memory", help="one plan's per-GPU memory for a runtime and GPU type",
        description="Predict the tensors / reserved / device memory of one plan from a JSON "
                    "spec (see README.md, 'Memory estimate').")
    p.add_argument("--spec", required=True, help="a JSON file with one object ('-': stdin)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(handler=run_memory)


def _read(path: str) -> object:
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise SpecError("spec", f"cannot read {path}: {exc.strerror}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise SpecError("spec", f"{path} is not valid JSON: {exc}") from None


def run_memory(args: argparse.Namespace) -> int:
    report = memory_report(_read(args.spec))
    if args.json:
        print(json.dumps(report))
        return 0
    print(f"runtime {report['runtime']}, GPU {report['gpu'] or '(none)'}, "
          f"stage {report['breakdown']['stage']}")
    for key in ("tensors_bytes", "reserved_bytes", "device_bytes"):
        print(f"  {key[:-6]:<9} {report[key] / GIB:9.3f} GiB")
    for key, value in report["breakdown"].items():
        if key != "stage":
            print(f"    {key:<18} {value / GIB:9.3f} GiB")
    if "fits" in report:
        print(f"  fits {report['gpu']} ({report['gpu_memory_bytes'] / GIB:.1f} GiB): "
              f"{'yes' if report['fits'] else 'no'}")
    return 0
