"""Loaders for the job traces under ``shared/traces`` (see its INDEX.md).

Two formats:

* **workload** (Sia SOSP'23 ``workloads/**`` and ``physical/phoebe_workload.csv``, Pollux OSDI'21
  ``workloads*/``): ``name,time,application,num_replicas,batch_size``. No durations: the
  job's size is implied by its application (the artifacts chose the application from the job's
  GPU-time class; see ``simulator.mapping``).
* **elasticflow** (ElasticFlow ASPLOS'23 ``philly_103959.csv``):
  ``job_id,submit_time,real_iteration,model_name,ddl,batch_size,num_gpu,real_duration,
  duration,iteration``. GPU-time = ``num_gpu × duration``; ``ddl`` is an absolute deadline.

A malformed row raises ``TraceFormatError`` naming the file, the line, the column and what
was expected. Named trace sets (``sia-philly``, ``pollux``, ``elasticflow`` …) resolve to the
files of ``shared/traces`` (override the folder with ``FRENZY_TRACES_DIR``).
"""

from __future__ import annotations

import csv
import os
import re
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def traces_dir() -> Path:
    """``$FRENZY_TRACES_DIR``, else ``../shared/traces`` beside the repository."""
    env = os.environ.get("FRENZY_TRACES_DIR")
    return Path(env) if env else REPO_ROOT.parent / "shared" / "traces"


class TraceFormatError(ValueError):
    """A trace file that does not parse: file, line, column, what was expected."""


@dataclass(frozen=True, slots=True)
class TraceJob:
    """One job as a trace describes it (before mapping to an LLM job)."""

    name: str
    submit_time: float  # seconds from the trace's start
    application: str  # the trace's model name (cifar10, bert, vgg16, ...)
    num_gpus: int  # GPUs the user asked for
    batch_size: int | None = None
    gpu_time_s: float | None = None  # known GPU-seconds (ElasticFlow); None: by application
    deadline: float | None = None  # absolute, seconds from the trace's start
    origin: str = ""  # "file:line", for messages


@dataclass(frozen=True, slots=True)
class Trace:
    """The jobs of one trace file, in submission order."""

    name: str
    path: Path | None
    format: str
    jobs: tuple[TraceJob, ...]


WORKLOAD_COLUMNS = ("name", "time", "application", "num_replicas", "batch_size")
ELASTICFLOW_COLUMNS = ("job_id", "submit_time", "model_name", "ddl", "batch_size", "num_gpu",
                       "duration")


def _num(path: Path, line: int, row: dict[str, str], col: str, kind: type, *,
         positive: bool = False, nonneg: bool = False) -> float | int:
    raw = row.get(col)
    what = {int: "an integer", float: "a number"}[kind]
    if positive:
        what = f"a positive {'integer' if kind is int else 'number'}"
    elif nonneg:
        what = f"{what} >= 0"
    if raw is None or raw.strip() == "":
        raise TraceFormatError(f"{path}:{line}: column '{col}': empty; expected {what}")
    try:
        value = int(raw) if kind is int else float(raw)
    except ValueError:
        raise TraceFormatError(
            f"{path}:{line}: column '{col}': {raw!r} is not {what}"
        ) from None
    if value != value or value in (float("inf"), float("-inf")):  # NaN / inf
        raise TraceFormatError(f"{path}:{line}: column '{col}': {raw!r} is not {what}")
    if (positive and value <= 0) or (nonneg and value < 0):
        raise TraceFormatError(f"{path}:{line}: column '{col}': {raw!r}; expected {what}")
    return value


def _reader(path: Path) -> tuple[list[str], list[tuple[int, dict[str, str]]]]:
    if not path.exists():
        raise TraceFormatError(f"{path}: no such trace file")
    with path.open(newline="") as f:
        reader = csv.reader(f)
        try:
            header = [h.strip() for h in next(reader)]
        except StopIteration:
            raise TraceFormatError(f"{path}:1: empty file; expected a CSV header") from None
        rows = []
        for values in reader:
            line = reader.line_num
            if not values or all(not v.strip() for v in values):
                continue
            if len(values) != len(header):
                raise TraceFormatError(
                    f"{path}:{line}: {len(values)} fields; expected {len(header)} "
                    f"({','.join(header)})"
                )
            rows.append((line, dict(zip(header, values, strict=True))))
    return header, rows


def load_trace(path: str | Path) -> Trace:
    """Load one trace file, detecting its format from the header."""
    path = Path(path)
    header, rows = _reader(path)
    if set(WORKLOAD_COLUMNS) <= set(header):
        jobs = [_workload_row(path, line, row) for line, row in rows]
        fmt = "workload"
    elif set(ELASTICFLOW_COLUMNS) <= set(header):
        jobs = [_elasticflow_row(path, line, row) for line, row in rows]
        fmt = "elasticflow"
    else:
        raise TraceFormatError(
            f"{path}:1: unknown header {','.join(header)}; expected a workload trace "
            f"({','.join(WORKLOAD_COLUMNS)}) or an ElasticFlow trace "
            f"({','.join(ELASTICFLOW_COLUMNS)}, ...)"
        )
    names = [j.name for j in jobs]
    if len(set(names)) != len(names):
        seen: set[str] = set()
        for j in jobs:
            if j.name in seen:
                raise TraceFormatError(f"{j.origin}: duplicate job name {j.name!r}")
            seen.add(j.name)
    jobs.sort(key=lambda j: (j.submit_time, j.name))
    return Trace(name=path.stem, path=path, format=fmt, jobs=tuple(jobs))


def _workload_row(path: Path, line: int, row: dict[str, str]) -> TraceJob:
    name = row["name"].strip()
    if not name:
        raise TraceFormatError(f"{path}:{line}: column 'name': empty; expected a job name")
    app = row["application"].strip().lower()
    if not app:
        raise TraceFormatError(f"{path}:{line}: column 'application': empty; expected a model "
                               "name such as cifar10, bert, imagenet")
    return TraceJob(
        name=name,
        submit_time=float(_num(path, line, row, "time", float, nonneg=True)),
        application=app,
        num_gpus=int(_num(path, line, row, "num_replicas", int, positive=True)),
        batch_size=int(_num(path, line, row, "batch_size", int, positive=True)),
        origin=f"{path}:{line}",
    )


def _elasticflow_row(path: Path, line: int, row: dict[str, str]) -> TraceJob:
    submit = float(_num(path, line, row, "submit_time", float, nonneg=True))
    ddl = float(_num(path, line, row, "ddl", float, nonneg=True))
    gpus = int(_num(path, line, row, "num_gpu", int, positive=True))
    duration = float(_num(path, line, row, "duration", float, positive=True))
    app = row["model_name"].strip().lower()
    if not app:
        raise TraceFormatError(f"{path}:{line}: column 'model_name': empty; expected a model")
    return TraceJob(
        name=f"job-{row['job_id'].strip()}",
        submit_time=submit,
        application=app,
        num_gpus=gpus,
        batch_size=int(_num(path, line, row, "batch_size", int, positive=True)),
        gpu_time_s=gpus * duration,
        deadline=ddl if ddl > submit else None,
        origin=f"{path}:{line}",
    )


# -- named trace sets ------------------------------------------------------------------------

TRACE_SETS: dict[str, str] = {
    "sia-philly": "sia-sosp23/workloads/philly",
    "sia-saturn": "sia-sosp23/workloads/saturn",
    "sia-newtrace": "sia-sosp23/workloads/newtrace",
    "sia-phoebe": "sia-sosp23/physical/phoebe_workload.csv",
    **{f"sia-scale_{n}x": f"sia-sosp23/workloads/scale/scale_{n}x" for n in (2, 4, 8, 16, 32)},
    **{f"sia-rate_{n}": f"sia-sosp23/workloads/scale/rate_{n}" for n in (10, 20, 30, 40, 50)},
    "pollux": "pollux-osdi21/workloads",
    "pollux-realistic": "pollux-osdi21/workloads-realistic",
    "pollux-0.5": "pollux-osdi21/workloads-0.5",
    "pollux-1.5": "pollux-osdi21/workloads-1.5",
    "pollux-2.0": "pollux-osdi21/workloads-2.0",
    "elasticflow": "elasticflow-artifact/traces_for_ElasticFlow/philly_103959.csv",
}
"""Named sets: a folder of workload files, or one file. ``<set>:<k>`` picks workload-k."""


def _natural(p: Path) -> tuple[object, ...]:
    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", p.name))


def trace_files(spec: str | Path) -> list[Path]:
    """The files a trace spec names: a file, a folder of CSVs, a named set, or
    ``<set>:<k>`` (the set's ``workload-<k>.csv``)."""
    p = Path(spec)
    if p.is_file():
        return [p]
    if p.is_dir():
        files = sorted(p.glob("*.csv"), key=_natural)
        if not files:
            raise TraceFormatError(f"{p}: folder has no .csv trace files")
        return files
    name, _, pick = str(spec).partition(":")
    if name not in TRACE_SETS:
        raise TraceFormatError(
            f"trace {str(spec)!r}: not a file or folder, and not a named set; known sets: "
            f"{', '.join(sorted(TRACE_SETS))} (or <set>:<k> for one workload file)"
        )
    target = traces_dir() / TRACE_SETS[name]
    if not target.exists():
        raise TraceFormatError(f"trace set {name!r}: {target} does not exist (set "
                               "FRENZY_TRACES_DIR to the shared/traces folder)")
    files = trace_files(target)
    if pick:
        chosen = [f for f in files if f.stem == f"workload-{pick}"]
        if not chosen:
            raise TraceFormatError(f"trace set {name!r} has no workload-{pick}.csv; it has "
                                   f"{', '.join(f.stem for f in files)}")
        return chosen
    return files
