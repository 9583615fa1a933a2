"""Run real training steps of a rank-local shard and record its peak memory.

On the CPU (``device="cpu"``) the step runs under ``FakeTensorMode`` with a
``StorageTracker``: exact tensor bytes, no allocation, so a 70B shard takes seconds. On a GPU
(``device="cuda"``) the same code runs with real tensors and the peak comes from
``torch.cuda.max_memory_allocated`` / ``max_memory_reserved``.

A step is the 1F1B pattern of the measured stage: the rank holds ``min(m, pp - stage)``
micro-batches in flight, so that many forwards run before the first backward (later
micro-batches repeat the same pattern and cannot raise the peak: the gradient buffers are
persistent). Then the optimizer step. The steady state is the last of ``steps`` steps.
"""

from __future__ import annotations

import contextlib
import logging
from collections import deque
from dataclasses import dataclass, field

import torch

from predictor.measure.builder import build
from predictor.measure.tracker import StorageTracker
from predictor.spec import ModelSpec, ParallelConfig, Precision, TrainingSpec

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class MeasuredPeak:
    """Peak tensor bytes of one rank (the worst measured stage), steady state and first step."""

    peak_bytes: int
    peak_reserved_bytes: int | None
    first_step_peak: int
    stage: int
    device: str
    breakdown_at_peak: dict[str, int] = field(default_factory=dict)


def in_flight(par: ParallelConfig, train: TrainingSpec, stage: int) -> int:
    """Micro-batches whose activations stage ``stage`` holds at once under 1F1B."""
    m = max(1, par.micro_batches(train.global_batch))
    return min(m, par.pp - stage)


def _one_step(net: torch.nn.Module, opt: object, model: ModelSpec, train: TrainingSpec,
              par: ParallelConfig, stage: int, device: str, tracker: StorageTracker | None
              ) -> None:
    b, s = par.micro_batch, train.seq_len
    first, last = stage == 0, stage == par.pp - 1
    plan = net.plan
    s_local = s // plan.tp if plan.sp else s
    pending: deque[torch.Tensor] = deque()
    for _ in range(in_flight(par, train, stage)):
        if tracker:
            tracker.set_phase("forward")
        if first:
            ids = torch.randint(0, model.vocab_size, (b, s), device=device)
            x = net.embed(ids)
        else:  # the p2p receive buffer
            x = torch.randn((b, s_local, model.hidden_size), dtype=plan.dtype, device=device,
                            requires_grad=True)
        y = net(x)
        if last:
            labels = torch.randint(0, model.vocab_size, (b, s), device=device)
            y = net.head_loss(y, labels)
        pending.append(y)
        del x, y
    while pending:
        if tracker:
            tracker.set_phase("backward")
        y = pending.popleft()
        if last:
            y.backward()
        else:
            y.backward(torch.ones_like(y))
        del y
    if tracker:
        tracker.set_phase("optimizer")
    opt.step()


def _measure_stage(model: ModelSpec, train: TrainingSpec, par: ParallelConfig, stage: int,
                   device: str, steps: int) -> MeasuredPeak:
    fake = device == "cpu"
    if fake:
        from torch._subclasses.fake_tensor import FakeTensorMode

        mode: contextlib.AbstractContextManager = FakeTensorMode()
        tracker: StorageTracker | None = StorageTracker(record_peak_contents=True)
    else:
        if not torch.cuda.is_available():
            raise RuntimeError(f"device {device!r} requested but CUDA is not available")
        mode = contextlib.nullcontext()
        tracker = None
        torch.cuda.empty_cache()
    peaks: list[int] = []
    reserved: int | None = None
    with mode, (tracker or contextlib.nullcontext()):
        net, opt = build(model, train, par, stage, device)
        if tracker:
            tracker.label(net.parameters(), "parameters")
            tracker.label(opt.main_grad, "gradients")
            if train.precision is not Precision.FP32:
                tracker.label(opt.master, "master_weights")
            tracker.label([t for st in opt.states for t in st], "optimizer_states")
        for _ in range(steps):
            if tracker:
                tracker.reset_peak()
            else:
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            _one_step(net, opt, model, train, par, stage, device, tracker)
            if tracker:
                peaks.append(tracker.peak)
            else:
                torch.cuda.synchronize()
                peaks.append(torch.cuda.max_memory_allocated())
                reserved = torch.cuda.max_memory_reserved()
        breakdown = tracker.peak_breakdown() if tracker else {}
        del net, opt
    log.debug("stage %d: peaks per step %s", stage, peaks)
    return MeasuredPeak(peak_bytes=peaks[-1], peak_reserved_bytes=reserved,
                        first_step_peak=peaks[0], stage=stage,
                        device="cpu-fake" if fake else device, breakdown_at_peak=breakdown)


def measure_peak(model: ModelSpec, train: TrainingSpec, par: ParallelConfig,
                 stage: int | None = None, device: str = "cpu", steps: int = 2) -> MeasuredPeak:
    """Peak tensor memory of one rank over ``steps`` (>= 2) training steps.

    ``stage`` None measures the first and the last pipeline stage (the middle ones hold the
    same layers with fewer micro-batches in flight and no embedding, so never more) and
    returns the worse. ``device`` "cpu" runs under fake tensors with exact storage tracking;
    "cuda" (or "cuda:N") runs for real and reads the CUDA allocator's peak.
    """
    if steps < 2:
        raise ValueError("steps must be >= 2: the optimizer states exist from step 1 on")
    stages = [stage] if stage is not None else sorted({0, par.pp - 1})
    results = [_measure_stage(model, train, par, st, device, steps) for st in stages]
    return max(results, key=lambda r: r.peak_bytes)
