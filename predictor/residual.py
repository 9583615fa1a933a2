"""The online memory residual: measured peaks correct later predictions of the same kind.

Training ranks report their measured tensor peak; set beside the model's own prediction for
the plan that ran (``Plan.model_tensors_bytes / Plan.memory_factor``: without any correction
already applied) it gives a ratio. Ratios are pooled per (runtime profile, GPU type, model
family) over the latest ``WINDOW`` runs, and later jobs of that kind are planned with their
tensors multiplied by the largest pooled ratio — the correction must keep the top plan from
running out of memory, so the worst recent run counts, not the mean — bounded to
``[LOW, HIGH]``: it never lowers a prediction (a run that needed less says little about the
next), and a ratio beyond ``HIGH`` is a model error to fix, not to learn. A ratio of a
single run can be noise, so ``MIN_RUNS`` runs are needed before any correction.

Pure: the service feeds it measurements and asks it for factors; nothing here does I/O.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass

WINDOW = 20
"""Runs pooled per (runtime, GPU type, family): the latest ones."""
LOW, HIGH = 1.0, 1.5
"""Bounds of a correction."""
MIN_RUNS = 2
"""Runs of a kind needed before its correction applies."""
MAX_KINDS = 1024
"""Kinds kept (the least recently measured go first)."""

Kind = tuple[str, str, str]  # runtime, GPU type, model family


@dataclass(frozen=True, slots=True)
class Correction:
    """A kind's factor on the predicted tensors, and why."""

    factor: float
    runs: int
    worst: float  # the largest measured / predicted ratio pooled, before the bounds

    def note(self, kind: Kind) -> str:
        runtime, gpu, family = kind
        bounded = "" if LOW <= self.worst <= HIGH else f", bounded from {self.worst:.2f}"
        return (f"memory x{self.factor:.2f}: online residual, the largest measured/predicted "
                f"tensor peak of the last {self.runs} {runtime} {family} run(s) on {gpu}"
                f"{bounded} (bounds {LOW:g}-{HIGH:g})")


class MemoryResidual:
    """Measured / predicted ratios per kind, and the corrections they give."""

    def __init__(self, window: int = WINDOW, max_kinds: int = MAX_KINDS) -> None:
        self._window = window
        self._max_kinds = max_kinds
        self._ratios: OrderedDict[Kind, deque[float]] = OrderedDict()

    def observe(self, kind: Kind, measured_bytes: int, predicted_bytes: int) -> None:
        """One run's measured tensor peak against the model's own prediction for it."""
        if measured_bytes <= 0 or predicted_bytes <= 0:
            return
        ratios = self._ratios.get(kind)
        if ratios is None:
            ratios = self._ratios[kind] = deque(maxlen=self._window)
            while len(self._ratios) > self._max_kinds:
                self._ratios.popitem(last=False)
        else:
            self._ratios.move_to_end(kind)
        ratios.append(measured_bytes / predicted_bytes)

    def snapshot(self) -> tuple[tuple[Kind, tuple[float, ...]], ...]:
        """Every kind's pooled ratios (equal snapshots give equal corrections)."""
        return tuple((k, tuple(v)) for k, v in sorted(self._ratios.items()))

    def correction(self, kind: Kind) -> Correction | None:
        """The kind's correction, or None while fewer than ``MIN_RUNS`` runs are pooled or
        none was under-predicted."""
        ratios = self._ratios.get(kind)
        if ratios is None or len(ratios) < MIN_RUNS:
            return None
        worst = max(ratios)
        factor = min(max(worst, LOW), HIGH)
        if factor <= LOW:
            return None
        return Correction(factor, len(ratios), worst)

    def factors(self, runtime: str, family: str,
                gpu_types: list[str] | tuple[str, ...]) -> dict[str, tuple[float, str]]:
        """``plan_job``'s ``memory_factors`` for a job of ``runtime`` and ``family`` on
        ``gpu_types``: only the types with a correction."""
        out: dict[str, tuple[float, str]] = {}
        for gpu in gpu_types:
            kind = (runtime, gpu, family)
            c = self.correction(kind)
            if c is not None:
                out[gpu] = (c.factor, c.note(kind))
        return out
