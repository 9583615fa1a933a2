"""Re-planning a job that ran out of memory, from the plans it was submitted with.

A rank that runs out of memory reports what it held (``OutOfMemory.held_bytes``: a lower
bound of the plan's real need). The plan that ran predicted the model's tensors for the same
rank (``Plan.model_tensors_bytes``: without the cuBLAS workspaces, which a CPU rank does not
have and which a CUDA figure has subtracted), so ``held / predicted`` is how far the
prediction fell short for this job; every stored plan of
the job gets its tensor terms multiplied by that ratio plus ``OOM_MARGIN`` (the need is at
least what was held, and the rank died on its way up). Plans that then fit no GPU of their
type in the cluster drop out, the plan that failed with them; the rest keep their ranking,
and the policy places the best that fits as for any queued job. The job resumes from its
last checkpoint. With no plan left, the job fails and the reason says what was measured.

The correction is cumulative (``memory_factor`` in ``JobView.extra``: the product of every
correction since submission), so a service that restarts can apply it to the stored plans
again.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from orchestrator.backend import OutOfMemory
from predictor.plan import Plan
from scheduler.cluster import ClusterState
from scheduler.job import JobView

OOM_MARGIN = 0.10
"""Room added above the measured ratio: the failing rank was still allocating."""
MEMORY_FACTOR = "memory_factor"
"""``JobView.extra`` key of the cumulative correction of the job's predicted tensors."""
GIB = 1 << 30


@dataclass(frozen=True, slots=True)
class Replan:
    """The outcome: the job with corrected plans (None: none fits), why, and the factor."""

    view: JobView | None
    reason: str
    factor: float  # this correction
    memory_factor: float  # cumulative since submission


def memory_factor(view: JobView) -> float:
    """The cumulative tensor correction already applied to ``view``'s plans (1.0: none)."""
    value = view.extra.get(MEMORY_FACTOR, 1.0)
    return float(value) if isinstance(value, int | float) else 1.0


def scale_plans(plans: tuple[Plan, ...], factor: float, note: str) -> tuple[Plan, ...]:
    """``plans`` with their tensor terms scaled by ``factor`` (ranks kept)."""
    return tuple(p.with_tensors_scaled(factor, note) for p in plans)


def replan_after_oom(view: JobView, ran: Plan, event: OutOfMemory,
                     state: ClusterState) -> Replan:
    """``view`` re-planned after ``ran`` ran out of memory (see the module docstring)."""
    predicted = ran.model_tensors_bytes
    held = event.held_bytes - (ran.memory.workspace if event.cuda else 0)
    ratio = held / predicted if predicted > 0 else 1.0
    factor = max(ratio, 1.0) * (1.0 + OOM_MARGIN)
    total = memory_factor(view) * factor
    measured = (f"a rank of {ran.num_gpus}x{ran.gpu_type} tp{ran.parallel.tp} "
                f"dp{ran.parallel.dp} held {held / GIB:.3g} GiB of tensors, "
                f"{ratio:.2f}x the {predicted / GIB:.3g} GiB predicted")
    note = (f"memory x{total:.2f}: measured after an out-of-memory run ({measured}; "
            f"+{OOM_MARGIN:.0%} margin)")
    largest: dict[str, int] = {}
    for node in state.nodes:
        largest[node.gpu_type] = max(largest.get(node.gpu_type, 0), node.gpu_memory)
    kept = tuple(p for p in scale_plans(view.plans, factor, note)
                 if p.required_bytes <= largest.get(p.gpu_type, 0))
    if not kept:
        return Replan(None, f"out of memory: {measured}; with the tensors x{total:.2f} no "
                            f"plan of this job fits a GPU of this cluster", factor, total)
    extra = {**view.extra, MEMORY_FACTOR: total}
    best = kept[0]
    reason = (f"out of memory, re-planned: {measured}; tensors x{total:.2f}, "
              f"{len(kept)} of {len(view.plans)} plans still fit (best: {best.num_gpus}x"
              f"{best.gpu_type} tp{best.parallel.tp} dp{best.parallel.dp}); resuming from "
              f"step {int(event.steps_done)}")
    return Replan(replace(view, plans=kept, extra=extra), reason, factor, total)
