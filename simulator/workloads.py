"""The Frenzy paper's "NewWorkload": queues of GPT-2 and BERT training jobs of several sizes
and batch sizes (section V-A; 30- and 60-job queues), generated from a seed.

Each job draws a model (GPT-2 124M / 345M / 774M / 1.5B, BERT base / large), a global batch
(8–64 sequences), an amount of work (GPU-hours on the reference GPU, log-uniform in
[``min_gpu_hours``, ``max_gpu_hours``]) turned into steps exactly as trace jobs are (see
``simulator.mapping``), and a user GPU request (1, 2, 4 or 8, at least the reference plan's
count). By default every job is queued at time 0 (a task queue, as in the paper); with
``arrivals_per_hour`` they arrive as a Poisson process instead.
"""

from __future__ import annotations

import random
from dataclasses import replace

from predictor.spec import ModelSpec, TrainingSpec
from simulator.mapping import HOUR, MappedJob, reference_plan, size_class
from simulator.traces import TraceJob

NEW_WORKLOAD_MODELS: tuple[tuple[str, int], ...] = (
    ("gpt2", 1024), ("gpt2-medium", 1024), ("gpt2-large", 1024), ("gpt2-xl", 1024),
    ("bert-base", 512), ("bert-large", 512),
)
"""(catalog model, sequence length)."""

NEW_WORKLOAD_BATCHES: tuple[int, ...] = (8, 16, 32, 64)
USER_GPU_REQUESTS: tuple[int, ...] = (1, 2, 4, 8)


def new_workload(
    num_jobs: int,
    *,
    seed: int = 0,
    min_gpu_hours: float = 0.25,
    max_gpu_hours: float = 8.0,
    arrivals_per_hour: float | None = None,
) -> list[MappedJob]:
    """``num_jobs`` NewWorkload jobs, deterministic for a given ``seed``."""
    if num_jobs < 1:
        raise ValueError(f"num_jobs must be >= 1, got {num_jobs}")
    if not 0 < min_gpu_hours <= max_gpu_hours:
        raise ValueError("need 0 < min_gpu_hours <= max_gpu_hours")
    rng = random.Random(seed)
    jobs: list[MappedJob] = []
    t = 0.0
    for i in range(num_jobs):
        model_name, seq = rng.choice(NEW_WORKLOAD_MODELS)
        batch = rng.choice(NEW_WORKLOAD_BATCHES)
        lo, hi = min_gpu_hours, max_gpu_hours
        gpu_hours = lo * (hi / lo) ** rng.random()
        request = rng.choice(USER_GPU_REQUESTS)
        if arrivals_per_hour:
            t += rng.expovariate(arrivals_per_hour / HOUR)
        ref = reference_plan(model_name, batch, seq)
        steps = max(1, round(gpu_hours * HOUR / (ref.step_time_s * ref.num_gpus)))
        request = max(request, ref.num_gpus)
        name = f"{model_name}-b{batch}-{i}"
        trace = TraceJob(name=name, submit_time=round(t, 3), application=model_name,
                         num_gpus=request, batch_size=batch, gpu_time_s=gpu_hours * HOUR,
                         origin=f"newworkload(seed={seed})#{i}")
        jobs.append(MappedJob(
            trace=trace, size_class=size_class(gpu_hours), gpu_time_s=gpu_hours * HOUR,
            model=ModelSpec.from_name(model_name),
            train=TrainingSpec(global_batch=batch, seq_len=seq, steps=steps),
            reference_plan=replace(ref, num_steps=steps),
        ))
    return jobs
