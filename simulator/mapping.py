"""Trace job → LLM training job, keeping the trace's arrivals and load.

The traces name the DL models of their day (cifar10, bert, yolov3, imagenet, vgg16, ...). Each
job becomes an LLM training job in three steps (documented, with the numbers, in
``docs/simulator.md``):

1. **Size class from GPU-time.** Sia and Pollux built their workloads by sampling Philly jobs
   and choosing the application from the job's GPU-time: < 1 GPU-h → cifar10 (Pollux also ncf),
   1–10 → deepspeech2 / bert, 10–100 → yolov3, > 100 → imagenet. We invert that: the
   application gives the class, and the class's *median* GPU-time among the 82,247 jobs of
   ``sia-sosp23/traces/philly.csv`` is the job's GPU-time (0.158, 1.70, 24.7, 275 GPU-h).
   ElasticFlow's trace has real durations, so there GPU-time = num_gpu × duration and the
   class follows from it.
2. **LLM by class.** tiny → GPT-2 124M / BERT-base, small → GPT-2 medium / BERT-large,
   medium → GPT-2 large / BERT-large (larger batch), large → Llama-2-7B. Encoder-style trace
   models (bert, ncf) map to BERT, the others to GPT-2. Batch size grows with the class.
3. **Work from GPU-time.** The job's steps are chosen so that its best plan (by GPU-seconds)
   on the reference GPU (V100-32G, a Philly-era datacenter GPU) consumes the trace job's
   GPU-time: ``steps = round(gpu_time / (step_time × num_gpus))``, at least 1.

The user's request (``requested_gpus``) stays the trace's GPU count, and deadlines carry over.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, replace

from predictor.gpus import get_gpu
from predictor.plan import Plan
from predictor.planner import plan_job
from predictor.runtimes import DEFAULT_RUNTIME, get_runtime
from predictor.spec import ModelSpec, TrainingSpec
from simulator.traces import TraceJob

REFERENCE_GPU = "V100-32G"
REFERENCE_MAX_GPUS = 64
TRACE_RUNTIME = get_runtime(DEFAULT_RUNTIME).unrestricted().with_overrides(
    grads_set_to_none=False, logits_head_bwd_bytes=0, logits_bwd_bytes_fp32=0,
    fp32_stream=False, eager_blocks=False, optimizer_fused=False)
"""Trace jobs are hypothetical (no trainer runs them): priced with the built-in trainer's
memory terms over the planner's whole space, every pipeline depth and ZeRO stage, without the
terms of the trainer's step order (gradients freed between steps, the loss's buffers gone
before the head's backward), of its fp32 residual stream, eager blocks and fused optimizer:
the golden traces' pricing, which those terms would move."""
HOUR = 3600.0

SIZE_CLASSES: tuple[tuple[str, float], ...] = (
    ("tiny", 1.0), ("small", 10.0), ("medium", 100.0), ("large", float("inf")),
)
"""(class, upper bound in GPU-hours), Sia's / Pollux's GPU-time bins."""

CLASS_GPU_HOURS: dict[str, float] = {"tiny": 0.158, "small": 1.70, "medium": 24.7, "large": 275.0}
"""Median GPU-hours of the Philly jobs in each class (sia-sosp23/traces/philly.csv;
counts 63,162 / 13,807 / 3,575 / 1,703). Recompute with ``philly_class_medians``."""

APP_CLASS: dict[str, str] = {
    "cifar10": "tiny", "ncf": "tiny",
    "deepspeech2": "small", "bert": "small",
    "yolov3": "medium",
    "imagenet": "large",
}
"""Sia/Pollux applications → the GPU-time class they were chosen for."""

ENCODER_APPS = frozenset({"bert", "ncf"})


@dataclass(frozen=True, slots=True)
class LlmChoice:
    model: str
    global_batch: int
    seq_len: int


LLM_BY_CLASS: dict[str, dict[str, LlmChoice]] = {
    "tiny": {"decoder": LlmChoice("gpt2", 32, 1024), "encoder": LlmChoice("bert-base", 64, 512)},
    "small": {"decoder": LlmChoice("gpt2-medium", 64, 1024),
              "encoder": LlmChoice("bert-large", 64, 512)},
    "medium": {"decoder": LlmChoice("gpt2-large", 128, 1024),
               "encoder": LlmChoice("bert-large", 256, 512)},
    "large": {"decoder": LlmChoice("llama-2-7b", 128, 2048),
              "encoder": LlmChoice("llama-2-7b", 128, 2048)},
}


class MappingError(ValueError):
    """A trace job that cannot be mapped (unknown application without a GPU-time)."""


@dataclass(frozen=True, slots=True)
class MappedJob:
    """A trace job as an LLM training job."""

    trace: TraceJob
    size_class: str
    gpu_time_s: float  # the GPU-time the job reproduces on the reference GPU
    model: ModelSpec
    train: TrainingSpec  # with steps set
    reference_plan: Plan  # best plan on the reference GPU, with num_steps = steps

    @property
    def steps(self) -> int:
        return self.train.num_steps


def size_class(gpu_hours: float) -> str:
    for name, upper in SIZE_CLASSES:
        if gpu_hours < upper:
            return name
    return SIZE_CLASSES[-1][0]  # pragma: no cover


def _class_and_gpu_time(job: TraceJob) -> tuple[str, float]:
    if job.gpu_time_s is not None:
        return size_class(job.gpu_time_s / HOUR), job.gpu_time_s
    cls = APP_CLASS.get(job.application)
    if cls is None:
        raise MappingError(
            f"{job.origin}: application {job.application!r} has no GPU-time class and the trace "
            f"gives no duration; known applications: {', '.join(sorted(APP_CLASS))}"
        )
    return cls, CLASS_GPU_HOURS[cls] * HOUR


@functools.lru_cache(maxsize=64)
def reference_plan(model_name: str, global_batch: int, seq_len: int) -> Plan:
    """Best plan (by GPU-seconds) of one step on the reference GPU."""
    model = ModelSpec.from_name(model_name)
    train = TrainingSpec(global_batch=global_batch, seq_len=seq_len, steps=1)
    result = plan_job(model, train, [get_gpu(REFERENCE_GPU)], max_gpus=REFERENCE_MAX_GPUS,
                      runtime=TRACE_RUNTIME)
    return result.best


def map_job(job: TraceJob) -> MappedJob:
    """Map one trace job (see the module docstring)."""
    cls, gpu_time = _class_and_gpu_time(job)
    kind = "encoder" if job.application in ENCODER_APPS else "decoder"
    choice = LLM_BY_CLASS[cls][kind]
    ref = reference_plan(choice.model, choice.global_batch, choice.seq_len)
    per_step = ref.step_time_s * ref.num_gpus
    steps = max(1, round(gpu_time / per_step))
    deadline_s = None
    if job.deadline is not None and job.deadline > job.submit_time:
        deadline_s = job.deadline - job.submit_time
    train = TrainingSpec(global_batch=choice.global_batch, seq_len=choice.seq_len, steps=steps,
                         deadline_s=deadline_s)
    return MappedJob(
        trace=job, size_class=cls, gpu_time_s=gpu_time, model=ModelSpec.from_name(choice.model),
        train=train, reference_plan=replace(ref, num_steps=steps),
    )


def map_jobs(jobs: Sequence[TraceJob]) -> list[MappedJob]:
    return [map_job(j) for j in jobs]


def philly_class_medians(path: str) -> dict[str, float]:
    """Median GPU-hours per size class of a Philly job-level trace (``gpu_time`` column);
    how ``CLASS_GPU_HOURS`` was computed."""
    import csv
    import statistics

    by: dict[str, list[float]] = {name: [] for name, _ in SIZE_CLASSES}
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            h = float(row["gpu_time"]) / HOUR
            by[size_class(h)].append(h)
    return {k: statistics.median(v) for k, v in by.items() if v}
