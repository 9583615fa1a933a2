"""A training rank's measured peak memory, and the memory cap of an emulated GPU.

On CUDA the peak is the allocator's own (``torch.cuda.max_memory_allocated`` and
``max_memory_reserved``) and the device enforces its capacity. On the CPU, where the
emulated cluster runs, ``predictor.measure``'s ``StorageTracker`` counts the live tensor
storages for the first ``MEASURED_STEPS`` steps of each launch — every step after the first
optimizer step allocates the same tensors, so those steps hold the run's peak — and, when
the launch carries a cap (the tensor memory the plan's GPU leaves after what lives outside
the allocator), raises ``RankOutOfMemory`` the moment the live tensors pass it, as a
GPU's allocator would.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from predictor.measure.tracker import StorageTracker

log = logging.getLogger(__name__)

MEASURED_STEPS = 2
"""Steps measured per launch on the CPU: the first (optimizer states are created in it) and
one steady-state step."""


class RankOutOfMemory(torch.OutOfMemoryError):
    """A rank ran out of memory: its live tensors passed the emulated GPU's cap (CPU), or
    CUDA's allocator failed (``cuda``). ``held_bytes`` is what the rank held when it failed
    (a lower bound of what the plan needs; on CUDA the allocator's reserve, cuBLAS
    workspaces included), ``cap_bytes`` what it could hold. It survives pickling, so the
    Ray backend reads both from the failed task."""

    def __init__(self, held_bytes: int, cap_bytes: int, cuda: bool = False) -> None:
        held = ("the caching allocator had reserved" if cuda else "live tensors reached")
        where = "CUDA" if cuda else "emulated GPU"
        super().__init__(f"out of memory ({where}): {held} {held_bytes:,} bytes, the cap is "
                         f"{cap_bytes:,} bytes")
        self.held_bytes = held_bytes
        self.cap_bytes = cap_bytes
        self.cuda = cuda

    def __reduce__(self) -> tuple[Any, tuple[int, int, bool]]:
        return (type(self), (self.held_bytes, self.cap_bytes, self.cuda))


def rank_oom(error: torch.OutOfMemoryError, device: torch.device) -> RankOutOfMemory:
    """``error`` as a ``RankOutOfMemory`` (CUDA: the allocator's reserve when it failed and
    the device's capacity)."""
    if isinstance(error, RankOutOfMemory):
        return error
    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        return RankOutOfMemory(int(torch.cuda.max_memory_reserved(device)), int(total), True)
    return RankOutOfMemory(0, 0)


class CappedTracker(StorageTracker):
    """A ``StorageTracker`` that raises ``RankOutOfMemory`` above ``cap_bytes`` (0: no cap)."""

    def __init__(self, cap_bytes: int = 0) -> None:
        super().__init__()
        self.cap_bytes = cap_bytes

    def _add(self, t: torch.Tensor, op: str) -> None:
        super()._add(t, op)
        if self.cap_bytes and self.current > self.cap_bytes:
            raise RankOutOfMemory(self.current, self.cap_bytes)


@dataclass(frozen=True, slots=True)
class PeakMemory:
    """A rank's measured peak: ``tensors_bytes`` is what ``max_memory_allocated`` (or the CPU
    tracker) saw, ``reserved_bytes`` the caching allocator's reserve (CUDA only)."""

    tensors_bytes: int
    reserved_bytes: int | None
    source: str  # "cuda" | "cpu-tracker"

    def as_status(self) -> dict[str, Any]:
        return {"peak_tensors_bytes": self.tensors_bytes,
                "peak_reserved_bytes": self.reserved_bytes, "peak_source": self.source}


class PeakMeter:
    """Measures one rank's peak over a launch (see the module docstring).

    ``step(existing)`` wraps one training step; ``existing()`` gives the tensors alive before
    it (parameters, gradients, optimizer states, the batch), counted on entry so the CPU
    figure is the rank's whole tensor memory, not only what the step made; it is called only
    for the steps measured.
    """

    def __init__(self, device: torch.device, cap_bytes: int = 0) -> None:
        self.device = device
        self.cap_bytes = cap_bytes if device.type == "cpu" else 0
        self._steps = 0
        self._cpu_peak = 0
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)

    @contextlib.contextmanager
    def step(self, existing: Callable[[], Iterable[torch.Tensor]]) -> Iterator[None]:
        if self.device.type != "cpu" or self._steps >= MEASURED_STEPS:
            yield
            return
        self._steps += 1
        tracker = CappedTracker(self.cap_bytes)
        tracker.track(existing())
        if self.cap_bytes and tracker.current > self.cap_bytes:
            raise RankOutOfMemory(tracker.current, self.cap_bytes)
        with tracker:
            yield
        self._cpu_peak = max(self._cpu_peak, tracker.peak)

    def peak(self) -> PeakMemory | None:
        """The peak so far (None on the CPU before a measured step has ended)."""
        if self.device.type == "cuda":
            return PeakMemory(int(torch.cuda.max_memory_allocated(self.device)),
                              int(torch.cuda.max_memory_reserved(self.device)), "cuda")
        if self._cpu_peak == 0:
            return None
        return PeakMemory(self._cpu_peak, None, "cpu-tracker")


def live_tensors(model: torch.nn.Module, opt: torch.optim.Optimizer,
                 *batch: torch.Tensor) -> list[torch.Tensor]:
    """The tensors a rank holds between steps: parameters (under ZeRO their owned chunks
    too: views of the parameters, or ZeRO-3's own tensors), gradients, optimizer states and
    the batch."""
    out: list[torch.Tensor] = list(batch)
    for p in model.parameters():
        out.append(p)
        if p.grad is not None:
            out.append(p.grad)
    for state in opt.state.values():
        out.extend(v for v in state.values() if isinstance(v, torch.Tensor))
    out.extend(getattr(opt, "chunks", {}).values())  # ZeRO-3: the layers' weight chunks
    return out
