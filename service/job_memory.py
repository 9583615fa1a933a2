"""A job's memory as measured by its workers, beside the prediction (``jobs.memory``).

The document holds the latest plan's measured per-rank peak (``tensors_bytes``: what
``torch.cuda.max_memory_allocated`` or the CPU storage tracker saw; ``reserved_bytes``: the
caching allocator's reserve, CUDA only) and that plan's predicted figures, the signed error
of the prediction, and — after an out-of-memory run — the cumulative correction of the job's
predicted tensors (``orchestrator.oom``), which ``service.app_runtime.stored_view`` applies to
the stored plans again after a restart.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from predictor.plan import Plan
from service.schemas import MemoryPublic


def predicted_tensors(plan: Plan, *, cuda: bool) -> int:
    """The plan's predicted tensor peak in a measurement's terms: a CUDA rank's allocator
    holds the cuBLAS workspaces, a CPU rank has none (``Plan.model_tensors_bytes``)."""
    return plan.memory.tensors if cuda else plan.model_tensors_bytes


def with_peak(doc: Mapping[str, Any] | None, *, plan: Plan | None, tensors_bytes: int,
              reserved_bytes: int | None, at: str, family: str | None = None
              ) -> dict[str, Any]:
    """``doc`` after a progress report with a measured peak on ``plan`` (a new plan starts
    a new measurement; the same plan keeps the largest peak seen). With the job's model
    ``family`` the document also keeps what the online residual pools (``kind``: runtime,
    GPU type, family; ``raw_predicted_bytes``: the model's own prediction, before any
    correction)."""
    out = dict(doc or {})
    label = plan.label() if plan is not None else None
    old = out.get("measured") or {}
    if old.get("plan") == label:
        tensors_bytes = max(tensors_bytes, int(old.get("tensors_bytes") or 0))
        if old.get("reserved_bytes") is not None:
            reserved_bytes = max(reserved_bytes or 0, int(old["reserved_bytes"]))
    out["measured"] = {"tensors_bytes": tensors_bytes, "reserved_bytes": reserved_bytes,
                       "source": "cpu-tracker" if reserved_bytes is None else "cuda",
                       "plan": label, "gpu_type": plan.gpu_type if plan else None, "at": at}
    if plan is not None:
        mem = plan.memory
        same = predicted_tensors(plan, cuda=reserved_bytes is not None)
        out["predicted"] = {"tensors_bytes": same, "reserved_bytes": mem.reserved,
                            "device_bytes": mem.device}
        out["error_pct"] = 100.0 * (tensors_bytes - same) / same if same else None
        if family:
            out["kind"] = [plan.runtime, plan.gpu_type, family]
            out["raw_predicted_bytes"] = round(same / plan.memory_factor)
    return out


def with_oom(doc: Mapping[str, Any] | None, *, held_bytes: int, cap_bytes: int,
             memory_factor: float, at: str) -> dict[str, Any]:
    """``doc`` after an out-of-memory run and the correction it led to."""
    out = dict(doc or {})
    count = int((out.get("out_of_memory") or {}).get("count", 0)) + 1
    out["out_of_memory"] = {"held_bytes": held_bytes, "cap_bytes": cap_bytes, "at": at,
                            "count": count}
    out["memory_factor"] = memory_factor
    return out


def residual_sample(doc: Mapping[str, Any] | None) -> tuple[tuple[str, str, str], int, int] | None:
    """(kind, measured, predicted) of a stored document for ``predictor.residual``; None
    when it holds no complete measurement."""
    if not doc:
        return None
    kind = doc.get("kind")
    measured = (doc.get("measured") or {}).get("tensors_bytes")
    raw = doc.get("raw_predicted_bytes")
    if (not isinstance(kind, list) or len(kind) != 3 or not isinstance(measured, int)
            or not isinstance(raw, int)):
        return None
    return (str(kind[0]), str(kind[1]), str(kind[2])), measured, raw


def stored_factor(doc: Mapping[str, Any] | None) -> float:
    """The cumulative tensor correction recorded for the job (1.0: none)."""
    value = (doc or {}).get("memory_factor", 1.0)
    return float(value) if isinstance(value, int | float) and value > 0 else 1.0


def memory_public(doc: Mapping[str, Any] | str | None) -> MemoryPublic | None:
    """The API's ``memory`` block of a stored document (a dict, or its JSON text)."""
    if isinstance(doc, str):
        doc = json.loads(doc)
    if not doc:
        return None
    measured = doc.get("measured") or {}
    predicted = doc.get("predicted") or {}
    oom = doc.get("out_of_memory") or {}
    last = None
    if oom:
        last = (f"{oom.get('at')}: a rank held {int(oom.get('held_bytes', 0)):,} bytes of "
                f"tensors, its capacity was {int(oom.get('cap_bytes', 0)):,}")
    return MemoryPublic(
        measured_tensors_bytes=measured.get("tensors_bytes"),
        measured_reserved_bytes=measured.get("reserved_bytes"),
        source=measured.get("source"), plan=measured.get("plan"),
        predicted_tensors_bytes=predicted.get("tensors_bytes"),
        predicted_reserved_bytes=predicted.get("reserved_bytes"),
        predicted_device_bytes=predicted.get("device_bytes"),
        error_pct=doc.get("error_pct"), memory_factor=stored_factor(doc),
        out_of_memory_runs=int(oom.get("count", 0)), last_out_of_memory=last)
