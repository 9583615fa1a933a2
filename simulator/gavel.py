"""Gavel's synthetic workloads (Narayanan et al., OSDI'20), regenerated from a seed.

Gavel publishes no job trace: its simulations generate jobs on the fly. This module
reproduces that generator, the one ``Scheduler.simulate`` calls when it runs without a trace
(``stanford-futuredata/gavel``, ``scheduler/scheduler.py`` at commit ``c4fa4009``, the commit
``shared/traces/gavel`` was taken from, with ``utils.generate_job`` and its
``_generate_scale_factor`` / ``_generate_duration`` from ``scheduler/utils.py``):

* **arrivals**: a Poisson process, the first job at time 0, each next one an exponential gap
  ``-ln(1 - U) × lam`` later (``lam`` = mean seconds between jobs = 3600 / jobs per hour);
* **GPU count** ("scale factor", multi-GPU runs): U ~ U[0, 1]; 2 GPUs if 0.7 <= U <= 0.8, 4 if
  0.8 < U <= 0.95, 8 if U > 0.95, else 1 (70 / 10 / 15 / 5 %);
* **duration** on one of Gavel's reference V100s at that GPU count: ``60 × 10^x`` seconds, x ~
  U[3, 4] with probability 0.2, else x ~ U[1.5, 3] (log-uniform, 31.6 min to 6.9 days);
* **job type**: uniform over Gavel's job types, drawn again until it is one that runs
  distributed when more than one GPU was drawn.

The job types are the keys of ``gavel/simulation_throughputs.json`` (26: ResNet-18/50,
Transformer, LM and Recommendation at several batch sizes, A3C, CycleGAN, in the file's
order); a type runs distributed when the file has a throughput for it on more than one GPU.
Draws are made in Gavel's order with Python's ``random.Random``, the job generator seeded with
``seed + 2`` and the arrival generator with ``seed + 3``, as Gavel's scheduler seeds them.

Each job becomes a ``TraceJob`` whose GPU-time is ``GPU count × duration`` on a V100, which is
the simulator's reference GPU; ``simulator.mapping`` turns it into an LLM job by that
GPU-time, as it does for every trace. A spec ``gavel-<jobs per hour>[@seed]`` names a
workload of ``GAVEL_JOBS`` jobs (``simulator.replay.load_workloads``).
"""

from __future__ import annotations

import ast
import json
import math
import random
import re
from dataclasses import dataclass
from pathlib import Path

from simulator.traces import TraceFormatError, TraceJob, traces_dir

GAVEL_JOBS = 150
"""Jobs per generated workload: what the validation benchmark replays of every workload."""

GAVEL_SETS: tuple[str, ...] = ("gavel-1", "gavel-2")
"""The Gavel workloads the benchmarks replay: 1 and 2 jobs an hour. A job averages 1.9 GPUs ×
16.8 h = 31.9 V100 GPU-hours, so these offer about 32 and 64 V100s of work: below and above
what phoebe's 44 GPUs hold, below hetero-128's."""

SPEC_RE = re.compile(r"^gavel-(\d+(?:\.\d+)?)(?:@(\d+))?$")
THROUGHPUTS = "gavel/simulation_throughputs.json"
REFERENCE_WORKER = "v100"


@dataclass(frozen=True, slots=True)
class JobType:
    """One of Gavel's job types: its name (``'ResNet-50 (batch size 64)'``) and whether it
    runs on more than one GPU."""

    name: str
    distributed: bool

    @property
    def family(self) -> str:
        """``resnet-50``: the name without its batch size, lower case."""
        return self.name.split(" (")[0].lower()

    @property
    def batch_size(self) -> int | None:
        m = re.search(r"batch size (\d+)", self.name)
        return int(m.group(1)) if m else None


def job_types(path: Path | None = None) -> tuple[JobType, ...]:
    """Gavel's job types from its throughput file (``shared/traces/gavel`` by default)."""
    path = path or traces_dir() / THROUGHPUTS
    if not path.exists():
        raise TraceFormatError(f"{path}: no such file (Gavel's throughput table; set "
                               "FRENZY_TRACES_DIR to the shared/traces folder)")
    table = json.loads(path.read_text())
    if REFERENCE_WORKER not in table:
        raise TraceFormatError(f"{path}: no {REFERENCE_WORKER!r} worker type; has "
                               f"{', '.join(table)}")
    keys = []
    for raw in table[REFERENCE_WORKER]:
        try:
            name, scale = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            raise TraceFormatError(f"{path}: key {raw!r} under {REFERENCE_WORKER!r}; expected "
                                   "\"('<job type>', <GPU count>)\"") from None
        keys.append((str(name), int(scale)))
    multi = {name for name, scale in keys if scale > 1}
    return tuple(JobType(name, name in multi) for name, scale in keys if scale == 1)


def scale_factor(rng: random.Random) -> int:
    """Gavel's GPU-count draw (``utils._generate_scale_factor``)."""
    r = rng.uniform(0, 1)
    if 0.7 <= r <= 0.8:
        return 2
    if 0.8 <= r <= 0.95:
        return 4
    if r >= 0.95:
        return 8
    return 1


def duration_s(rng: random.Random) -> float:
    """Gavel's duration draw in seconds (``utils._generate_duration``)."""
    if rng.random() >= 0.8:
        return 60 * (10 ** rng.uniform(3, 4))
    return 60 * (10 ** rng.uniform(1.5, 3))


def gavel_jobs(num_jobs: int, jobs_per_hour: float, *, seed: int = 0, multi_gpu: bool = True,
               types: tuple[JobType, ...] | None = None) -> list[TraceJob]:
    """``num_jobs`` jobs as Gavel's simulator generates them at ``jobs_per_hour``."""
    if num_jobs < 1:
        raise ValueError(f"num_jobs must be >= 1, got {num_jobs}")
    if not jobs_per_hour > 0:
        raise ValueError(f"jobs_per_hour must be > 0, got {jobs_per_hour}")
    types = types or job_types()
    if multi_gpu and not any(t.distributed for t in types):
        raise ValueError("multi_gpu needs a job type that runs on more than one GPU")
    job_rng = random.Random(seed + 2)
    arrival_rng = random.Random(seed + 3)
    lam = 3600.0 / jobs_per_hour
    jobs = []
    t = 0.0
    for i in range(num_jobs):
        gpus = scale_factor(job_rng)
        run_s = duration_s(job_rng)
        if not multi_gpu:
            gpus = 1
        while True:
            jt = job_rng.choice(types)
            if gpus == 1 or jt.distributed:
                break
        jobs.append(TraceJob(
            name=f"gavel-{i}", submit_time=t, application=jt.family, num_gpus=gpus,
            batch_size=jt.batch_size, gpu_time_s=gpus * run_s,
            origin=f"gavel(jobs_per_hour={jobs_per_hour:g}, seed={seed})#{i} {jt.name}",
        ))
        t += -math.log(1.0 - arrival_rng.random()) * lam
    return jobs


def parse_spec(spec: str) -> tuple[float, int] | None:
    """(jobs per hour, seed) of a ``gavel-<rate>[@seed]`` spec, else None."""
    m = SPEC_RE.match(spec)
    if not m:
        return None
    return float(m.group(1)), int(m.group(2) or 0)
