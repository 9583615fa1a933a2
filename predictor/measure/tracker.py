"""Exact tensor-memory accounting on the CPU: a ``TorchDispatchMode`` that tracks live storages.

Every tensor an ATen op returns is looked at; a storage seen for the first time is counted with
its ``nbytes`` and a ``weakref.finalize`` on the storage object takes it off when it is freed.
Views share their base's storage and are counted once, like the CUDA caching allocator's
``memory_allocated`` (which counts blocks, not tensors) — minus the allocator's rounding.

Used under ``FakeTensorMode`` the storages are meta-sized fakes, so the memory of a
billion-parameter shard is accounted exactly without allocating it.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class LiveStorage:
    """One storage alive at the peak: its size, the op that made it and a label if tagged."""

    nbytes: int
    op: str
    label: str
    shape: tuple[int, ...]
    dtype: str


class StorageTracker(TorchDispatchMode):
    """Counts the bytes of live tensor storages and records the peak (and what made it).

    ``current`` is the bytes alive now, ``peak`` the maximum since the last ``reset_peak``.
    ``snapshot_at_peak`` (when ``record_peak_contents``) lists the storages alive at the peak,
    for finding out which tensors a memory model forgot.
    """

    def __init__(self, record_peak_contents: bool = False) -> None:
        super().__init__()
        self._live: dict[int, tuple[int, str, tuple[int, ...], str]] = {}
        self._labels: dict[int, str] = {}
        self.current = 0
        self.peak = 0
        self.record_peak_contents = record_peak_contents
        self.snapshot_at_peak: list[LiveStorage] = []
        self._phase = ""

    # -- bookkeeping -------------------------------------------------------------------------
    def _add(self, t: torch.Tensor, op: str) -> None:
        st = t.untyped_storage()
        key = id(st)
        if key in self._live:
            return
        n = int(st.nbytes())
        tag = f"{self._phase}/{op}" if self._phase else op
        self._live[key] = (n, tag, tuple(t.shape), str(t.dtype).removeprefix("torch."))
        self.current += n
        weakref.finalize(st, self._free, key)
        if self.current > self.peak:
            self.peak = self.current
            if self.record_peak_contents:
                self._snapshot()

    def _free(self, key: int) -> None:
        entry = self._live.pop(key, None)
        self._labels.pop(key, None)
        if entry is not None:
            self.current -= entry[0]

    def _snapshot(self) -> None:
        self.snapshot_at_peak = [
            LiveStorage(n, op, self._labels.get(k, ""), shape, dtype)
            for k, (n, op, shape, dtype) in self._live.items()
        ]

    def track(self, tensors: Iterable[torch.Tensor], label: str = "") -> None:
        """Count tensors made outside the mode (e.g. before it was entered)."""
        for t in tensors:
            self._add(t, "external")
            if label:
                self._labels[id(t.untyped_storage())] = label

    def label(self, tensors: Iterable[torch.Tensor], label: str) -> None:
        """Name the storages of ``tensors`` in peak snapshots (e.g. 'param', 'adam.m')."""
        for t in tensors:
            self._labels[id(t.untyped_storage())] = label

    def set_phase(self, phase: str) -> None:
        """Unlabelled storages made from now on show as 'phase/op' in peak snapshots."""
        self._phase = phase

    def reset_peak(self) -> None:
        """Start a new peak window at the current live bytes."""
        self.peak = self.current
        if self.record_peak_contents:
            self._snapshot()

    def peak_breakdown(self) -> dict[str, int]:
        """Bytes alive at the peak, grouped by label (or by the op that made them)."""
        out: dict[str, int] = {}
        for s in self.snapshot_at_peak:
            key = s.label or s.op
            out[key] = out.get(key, 0) + s.nbytes
        return dict(sorted(out.items(), key=lambda kv: -kv[1]))

    # -- dispatch ----------------------------------------------------------------------------
    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        op = str(func.overloadpacket.__name__) if hasattr(func, "overloadpacket") else str(func)
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self._add(t, op)
        return out
