"""A job's training metrics per step window, as stored on its row (``jobs.metrics``).

Each progress report of a running job (about every 2 s, ``orchestrator.loop``) becomes one
window: the step reached, the loss, the measured throughput turned into tokens/s and step
time, and the chosen plan's predictions beside them, so predicted vs measured can be read
off directly. Only the last ``METRIC_WINDOWS`` are kept: the row stays small however long
the job runs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

METRIC_WINDOWS = 240
"""Windows kept per job (at one report every 2 s: the last 8 minutes)."""


def _finite(x: Any) -> float | None:
    return float(x) if isinstance(x, int | float) and math.isfinite(x) else None


def metric_window(*, at: str, data: Mapping[str, Any], training: Mapping[str, Any],
                  predicted_step_time_s: float | None = None,
                  predicted_memory_bytes: float | None = None) -> dict[str, Any] | None:
    """One window from a progress report's ``data`` (steps_done, loss, samples_per_s and,
    where the workers measured it, peak_tensors_bytes: a rank's tensor peak) and the job's
    ``training`` (global_batch, seq_len); ``predicted_memory_bytes`` is the plan's tensor
    figure, the same quantity. None when the report carries no measurement."""
    loss = _finite(data.get("loss"))
    sps = _finite(data.get("samples_per_s"))
    if loss is None and sps is None:
        return None
    batch = _finite(training.get("global_batch"))
    seq = _finite(training.get("seq_len"))
    step_time = batch / sps if sps and batch else None
    return {
        "at": at, "step": _finite(data.get("steps_done")), "loss": loss,
        "tokens_per_s": sps * seq if sps is not None and seq else None,
        "step_time_s": step_time,
        "predicted_step_time_s": _finite(predicted_step_time_s),
        "memory_bytes": _finite(data.get("peak_tensors_bytes")),
        "predicted_memory_bytes": _finite(predicted_memory_bytes),
    }


def appended(windows: Sequence[Mapping[str, Any]] | None, window: Mapping[str, Any],
             keep: int = METRIC_WINDOWS) -> list[dict[str, Any]]:
    """``windows`` plus ``window``, only the last ``keep`` (a new list: JSON columns are
    written when the attribute is assigned, not when a list is changed in place)."""
    out = [dict(w) for w in (windows or [])]
    out.append(dict(window))
    return out[-keep:]
