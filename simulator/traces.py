"""Loaders for the job traces under ``shared/traces`` (see its INDEX.md).

Two formats:

* **workload** (Sia SOSP'23 ``workloads/**`` and ``physical/phoebe_workload.csv``, Pollux OSDI'21
  ``workloads*/``): ``name,time,application,num_replicas,batch_size``. No durations: the
  job's size is implied by its application (the artifacts chose the application from the job's
  GPU-time class; see ``simulator.mapping``).
* **elasticflow** (ElasticFlow ASPLOS'23 ``philly_103959.csv``):
  ``job_id,submit_time,real_iteration,model_name,ddl,batch_size,num_gpu,real_duration,
  duration,iteration``. GPU-time = ``num_gpu × duration``; ``ddl`` is an absolute deadline.
* **openb** (Alibaba GPU cluster trace v2023, ``openb_pod_list_*.csv``): ``name,cpu_milli,
  memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,
  scheduled_time``, one row per pod, mostly inference and GPU-sharing pods. Read as a
  training trace (the trace's own caveats): only pods holding whole GPUs (``num_gpu >= 1``,
  ``gpu_milli == 1000``) are jobs; arrival = ``creation_time``, GPU-time = ``num_gpu ×
  (deletion_time - scheduled_time)``. Pods that never ran (``Pending``) have no run time;
  ``Running`` pods deleted at the trace's end (its latest ``deletion_time``) were cut off, so
  their run time is unknown; pods created before the last gap of more than a day between pod
  creations predate the collection (only pods long-lived enough to still exist reached the
  trace): all three are left out and counted (``Trace.dropped``). ``Failed`` pods are kept:
  they held their GPUs for the run time recorded, and a scheduler has to place them the same.

A malformed row raises ``TraceFormatError`` naming the file, the line, the column and what
was expected. Named trace sets (``sia-philly``, ``pollux``, ``elasticflow`` …) resolve to the
files of ``shared/traces`` (override the folder with ``FRENZY_TRACES_DIR``). A trace too long
to replay whole is a *windowed* set (``TRACE_WINDOWS``): consecutive windows of a fixed number
of jobs, each a workload of its own whose first arrival is at time 0; ``<set>:<k>`` names the
k-th (``load_traces``).
"""

from __future__ import annotations

import csv
import itertools
import os
import re
from dataclasses import dataclass, field, replace
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
    dropped: dict[str, int] = field(default_factory=dict, compare=False)
    """Rows that are not jobs, by reason (only formats that filter: openb)."""


WORKLOAD_COLUMNS = ("name", "time", "application", "num_replicas", "batch_size")
ELASTICFLOW_COLUMNS = ("job_id", "submit_time", "model_name", "ddl", "batch_size", "num_gpu",
                       "duration")
OPENB_COLUMNS = ("name", "num_gpu", "gpu_milli", "pod_phase", "creation_time", "deletion_time",
                 "scheduled_time")
OPENB_PHASES = ("Running", "Succeeded", "Failed", "Pending")
OPENB_COLLECTION_GAP_S = 86_400.0
"""A gap between consecutive pod creations longer than this (one day) ends a stretch before
the collection began: the openb trace has 26 pods in its first 114.9 days, then 46 to 741
a day with no gap above 5 h; the early pods are those that outlived the start of collection."""
OPENB_APPLICATION = "openb"


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
    dropped: dict[str, int] = {}
    if set(WORKLOAD_COLUMNS) <= set(header):
        jobs = [_workload_row(path, line, row) for line, row in rows]
        fmt = "workload"
    elif set(ELASTICFLOW_COLUMNS) <= set(header):
        jobs = [_elasticflow_row(path, line, row) for line, row in rows]
        fmt = "elasticflow"
    elif set(OPENB_COLUMNS) <= set(header):
        jobs, dropped = _openb_jobs(path, rows)
        fmt = "openb"
    else:
        raise TraceFormatError(
            f"{path}:1: unknown header {','.join(header)}; expected a workload trace "
            f"({','.join(WORKLOAD_COLUMNS)}), an ElasticFlow trace "
            f"({','.join(ELASTICFLOW_COLUMNS)}, ...) or an Alibaba openb pod list "
            f"({','.join(OPENB_COLUMNS)}, ...)"
        )
    names = [j.name for j in jobs]
    if len(set(names)) != len(names):
        seen: set[str] = set()
        for j in jobs:
            if j.name in seen:
                raise TraceFormatError(f"{j.origin}: duplicate job name {j.name!r}")
            seen.add(j.name)
    jobs.sort(key=lambda j: (j.submit_time, j.name))
    return Trace(name=path.stem, path=path, format=fmt, jobs=tuple(jobs),
                 dropped=dropped)


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


@dataclass(frozen=True, slots=True)
class _Pod:
    line: int
    row: dict[str, str]
    name: str
    num_gpu: int
    gpu_milli: int
    phase: str
    created: float
    deleted: float


def _openb_pod(path: Path, line: int, row: dict[str, str]) -> _Pod:
    name = row["name"].strip()
    if not name:
        raise TraceFormatError(f"{path}:{line}: column 'name': empty; expected a pod name")
    milli = int(_num(path, line, row, "gpu_milli", int, nonneg=True))
    if milli > 1000:
        raise TraceFormatError(f"{path}:{line}: column 'gpu_milli': {row['gpu_milli']!r}; "
                               "expected an integer in 0..1000 (thousandths of one GPU)")
    phase = row["pod_phase"].strip()
    if phase not in OPENB_PHASES:
        raise TraceFormatError(f"{path}:{line}: column 'pod_phase': {phase!r}; expected one "
                               f"of {', '.join(OPENB_PHASES)}")
    return _Pod(line, row, name, int(_num(path, line, row, "num_gpu", int, nonneg=True)), milli,
                phase, float(_num(path, line, row, "creation_time", float, nonneg=True)),
                float(_num(path, line, row, "deletion_time", float, nonneg=True)))


def _collection_start(created: list[float]) -> float:
    """The first creation time after the last gap longer than ``OPENB_COLLECTION_GAP_S``."""
    times = sorted(created)
    start = times[0] if times else 0.0
    for a, b in itertools.pairwise(times):
        if b - a > OPENB_COLLECTION_GAP_S:
            start = b
    return start


def _openb_jobs(path: Path, rows: list[tuple[int, dict[str, str]]]
                ) -> tuple[list[TraceJob], dict[str, int]]:
    """The whole-GPU pods that ran and whose run time is known, as jobs; the other rows
    counted by reason (see the module docstring)."""
    pods = [_openb_pod(path, line, row) for line, row in rows]
    end = max((p.deleted for p in pods), default=0.0)
    start = _collection_start([p.created for p in pods])
    dropped = {"no_gpu": 0, "gpu_sharing": 0, "never_ran": 0, "before_collection": 0,
               "cut_off_at_end": 0}
    jobs = []
    for p in pods:
        if p.num_gpu == 0:
            dropped["no_gpu"] += 1
            continue
        if p.gpu_milli != 1000:
            dropped["gpu_sharing"] += 1
            continue
        if p.phase == "Pending":
            dropped["never_ran"] += 1
            continue
        sched = float(_num(path, p.line, p.row, "scheduled_time", float, nonneg=True))
        if sched < p.created:
            raise TraceFormatError(
                f"{path}:{p.line}: column 'scheduled_time': {p.row['scheduled_time']!r}; "
                f"expected a time >= creation_time ({p.row['creation_time']})")
        if p.deleted <= sched:
            raise TraceFormatError(
                f"{path}:{p.line}: column 'deletion_time': {p.row['deletion_time']!r}; "
                f"expected a time > scheduled_time ({p.row['scheduled_time']}) for a "
                f"{p.phase} pod")
        if p.created < start:
            dropped["before_collection"] += 1
            continue
        if p.phase == "Running" and p.deleted == end:
            dropped["cut_off_at_end"] += 1
            continue
        jobs.append(TraceJob(
            name=p.name, submit_time=p.created, application=OPENB_APPLICATION,
            num_gpus=p.num_gpu, gpu_time_s=p.num_gpu * (p.deleted - sched),
            origin=f"{path}:{p.line}",
        ))
    return jobs, dropped


def windows(trace: Trace, size: int) -> list[Trace]:
    """Consecutive windows of ``size`` jobs in submission order, each shifted so that its first
    arrival is at time 0 (deadlines with it); the last ``len % size`` jobs make no window."""
    if size < 1:
        raise ValueError(f"window size must be at least 1, got {size}")
    out = []
    for k in range(len(trace.jobs) // size):
        chunk = trace.jobs[k * size:(k + 1) * size]
        t0 = chunk[0].submit_time
        jobs = tuple(replace(j, submit_time=j.submit_time - t0,
                             deadline=None if j.deadline is None else j.deadline - t0)
                     for j in chunk)
        out.append(Trace(name=f"{trace.name}:{k + 1}", path=trace.path, format=trace.format,
                         jobs=jobs))
    return out


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
    "alibaba-openb": "alibaba-gpu-v2023/openb_pod_list_default.csv",
}
"""Named sets: a folder of workload files, or one file. ``<set>:<k>`` picks workload-k (of a
windowed set: its k-th window)."""

TRACE_WINDOWS: dict[str, int] = {"alibaba-openb": 150}
"""Sets replayed as consecutive windows of this many jobs. openb's 3,602 jobs span 34 days;
150 jobs (5 to 59 hours of its arrivals) is what the validation benchmark
replays of every workload, so each window is replayed whole there."""


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
    if pick and name not in TRACE_WINDOWS:  # a window is picked by ``load_traces``
        chosen = [f for f in files if f.stem == f"workload-{pick}"]
        if not chosen:
            raise TraceFormatError(f"trace set {name!r} has no workload-{pick}.csv; it has "
                                   f"{', '.join(f.stem for f in files)}")
        return chosen
    return files


def load_traces(spec: str | Path) -> list[tuple[str, Trace]]:
    """(label, trace) per workload a spec names: one per file (labelled ``folder/stem``), or
    for a windowed set (``TRACE_WINDOWS``) one per window (``<set>:<k>``), only the k-th for
    ``<set>:<k>``."""
    name, _, pick = str(spec).partition(":")
    if name not in TRACE_WINDOWS or Path(spec).exists():
        return [(f"{p.parent.name}/{p.stem}", load_trace(p)) for p in trace_files(spec)]
    (path,) = trace_files(name)
    whole = load_trace(path)
    size = TRACE_WINDOWS[name]
    labelled = [(f"{name}:{k}", w) for k, w in enumerate(windows(whole, size), start=1)]
    if not labelled:
        raise TraceFormatError(f"trace set {name!r}: {path} has {len(whole.jobs)} jobs, fewer "
                               f"than one window of {size}")
    if not pick:
        return labelled
    if not pick.isdigit() or not 1 <= int(pick) <= len(labelled):
        raise TraceFormatError(f"trace set {name!r} has windows 1..{len(labelled)} of {size} "
                               f"jobs; got {pick!r}")
    return [labelled[int(pick) - 1]]
