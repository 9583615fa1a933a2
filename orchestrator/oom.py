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
last checkpoint.

When none of its stored plans fits any more, the job is planned again (``fresh_plans``) from
its model and training config with the corrected tensors, on the cluster's GPU types: the
planner stored only the fastest plan per (GPU type, count), and a leaner one it passed over
(more recomputation, a higher ZeRO stage, a deeper pipeline) may well fit where the fastest
no longer does. Only with no plan left then does the job fail, and the reason says what was
measured.

The correction is cumulative (``memory_factor`` in ``JobView.extra``: the product of every
correction since submission), so a service that restarts can apply it to the stored plans
again.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

from orchestrator.backend import OutOfMemory
from predictor.errors import SpecError
from predictor.gpus import get_gpu
from predictor.plan import Plan
from predictor.planner import DEFAULT_MAX_GPUS, RANKINGS, plan_job
from scheduler.cluster import ClusterState
from scheduler.job import JobView

OOM_MARGIN = 0.10
"""Room added above the measured ratio: the failing rank was still allocating."""
MEMORY_FACTOR = "memory_factor"
"""``JobView.extra`` key of the cumulative correction of the job's predicted tensors."""
PLAN_MAX_GPUS = "plan_max_gpus"
"""``JobView.extra`` key: the most GPUs a plan of the job may use, as at its submission (the
user's ``max_gpus`` under the operator's caps); a job planned again keeps to it."""
PLAN_RANKING = "plan_ranking"
"""``JobView.extra`` key: the ranking the job's plans were ranked by at submission
(``predictor.planner.RANKINGS``); a job planned again is ranked the same way."""
GIB = 1 << 30
OOM_NOTE = ": measured after an out-of-memory run"
"""What every note of an out-of-memory correction on a plan says."""

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Replan:
    """The outcome: the job with corrected plans (None: none fits), why, and the factor."""

    view: JobView | None
    reason: str
    factor: float  # this correction
    memory_factor: float  # cumulative since submission
    replanned: bool = False
    """The plans are new (``fresh_plans``), not the stored ones scaled: a service stores them
    (``stored_plans``) so that a restart applies ``memory_factor`` to them."""


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
    note = (f"memory x{total:.2f}{OOM_NOTE} ({measured}; "
            f"+{OOM_MARGIN:.0%} margin)")
    largest = _largest_gpu(state)
    kept = tuple(p for p in scale_plans(view.plans, factor, note)
                 if p.required_bytes <= largest.get(p.gpu_type, 0))
    fits = f"{len(kept)} of {len(view.plans)} plans still fit"
    replanned = not kept
    if replanned:
        # the plan that ran carries every correction of its tensors: a residual the planner
        # applied at submission (``predictor.residual``) and the out-of-memory ones so far
        kept = fresh_plans(view, ran, ran.memory_factor * factor, note, state)
        fits = (f"none of its {len(view.plans)} plans fits any more; planned again: "
                f"{len(kept)} plans fit")
    if not kept:
        return Replan(None, f"out of memory: {measured}; with the tensors x{total:.2f} no "
                            f"plan of this job fits a GPU of this cluster", factor, total)
    extra = {**view.extra, MEMORY_FACTOR: total}
    best = kept[0]
    reason = (f"out of memory, re-planned: {measured}; tensors x{total:.2f}, "
              f"{fits} (best: {best.num_gpus}x"
              f"{best.gpu_type} tp{best.parallel.tp} dp{best.parallel.dp}); resuming from "
              f"step {int(event.steps_done)}")
    return Replan(replace(view, plans=kept, extra=extra), reason, factor, total, replanned)


def _largest_gpu(state: ClusterState) -> dict[str, int]:
    """Per GPU type, the most memory one GPU of it has in ``state``."""
    largest: dict[str, int] = {}
    for node in state.nodes:
        largest[node.gpu_type] = max(largest.get(node.gpu_type, 0), node.gpu_memory)
    return largest


def fresh_plans(view: JobView, ran: Plan, total: float, note: str,
                state: ClusterState) -> tuple[Plan, ...]:
    """``view``'s job planned again with its tensors × ``total`` (every correction of the
    model's prediction) for ``ran``'s runtime, on the GPU types of ``state`` and at most as
    many GPUs of a type as it holds, nor more than its submission allowed
    (``PLAN_MAX_GPUS``); only plans that fit a GPU of their type there, ranked as at its
    submission (``PLAN_RANKING``, else ``gpu_seconds``), each noting ``note``. Empty when the
    job has no model and training config (hand-made plans) or the planner refuses it."""
    if view.model is None or view.train is None:
        return ()
    cap = view.extra.get(PLAN_MAX_GPUS)
    ranking = view.extra.get(PLAN_RANKING)
    if ranking not in RANKINGS:
        if ranking is not None:
            log.warning("%s: ranking %r is not one of %s; planned again by gpu_seconds",
                        view.id, ranking, ", ".join(RANKINGS))
        ranking = "gpu_seconds"
    totals = state.total_by_type()
    gpus = []
    for name in sorted(totals):
        try:
            gpus.append(get_gpu(name))
        except SpecError:
            log.info("%s: GPU type %s is not in the catalog; not planned for", view.id, name)
    if not gpus:
        return ()
    try:
        result = plan_job(view.model, view.train, gpus,
                          max_gpus=min(cap if isinstance(cap, int) and cap > 0
                                       else DEFAULT_MAX_GPUS, max(totals.values())),
                          ranking=ranking, runtime=ran.runtime,
                          memory_factors={g.name: (total, note) for g in gpus},
                          inter_node_bw_gbs=state.inter_node_bw_gbs)
    except SpecError as exc:
        log.info("%s: not planned again after running out of memory: %s", view.id, exc)
        return ()
    largest = _largest_gpu(state)
    kept = [p for p in result.plans if p.num_gpus <= totals.get(p.gpu_type, 0)
            and p.required_bytes <= largest.get(p.gpu_type, 0)]
    return tuple(replace(p, rank=i, num_steps=ran.num_steps)
                 for i, p in enumerate(kept, start=1))


def stored_plans(plans: tuple[Plan, ...], total: float) -> list[dict[str, object]]:
    """``plans``, corrected by ``total`` (``memory_factor``: the out-of-memory corrections
    since submission), as a job's stored plans hold them: that correction divided out (a
    restart multiplies it in again, ``scale_plans``), a residual applied at submission kept."""
    return [replace(p.with_tensors_scaled(1.0 / total, ""), memory_factor=p.memory_factor / total,
                    notes=tuple(n for n in p.notes if OOM_NOTE not in n)).to_dict()
            for p in plans]
