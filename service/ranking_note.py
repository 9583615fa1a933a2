"""Whether the scheduling policy honours a job's ``ranking`` preference, and if not, why.

At submission the job's plans are ranked by its ``ranking`` (``predictor.planner.RANKINGS``)
and stored in that order; the loop hands them to the policy unchanged. Only HAS with
``plan_order="ranked"`` walks them in that order (the first plan the free GPUs satisfy);
the other policies, and HAS's default ``knee`` order, choose among the plans by their own
rule. Such jobs get a ``ranking`` event saying so when the loop first takes them.
"""

from __future__ import annotations

from typing import Any

_WHY: dict[tuple[str, str | None], str] = {
    ("has", "knee"): (
        "it starts a job on the fastest plan near the knee of its cost curve (within 80% "
        "of the fewest GPU-seconds of that GPU type, and only when it saves at least a "
        "minute over the cheapest) that the free GPUs satisfy, falling back to the ranked "
        "order, or, when no other job waits, on a faster plan that idle GPUs hold, and may "
        "grow or shrink a running job onto other plans"),
    ("has", "share"): (
        "it starts a job on the fastest plan within an equal share of the free GPUs, "
        "falling back to the ranked order"),
    ("has", "knee-share"): (
        "it starts a job on the fastest efficient plan within an equal share of the free "
        "GPUs, falling back to the ranked order"),
}


def ranking_note(policy: Any) -> str | None:
    """None when ``policy`` places a job on its first-ranked plan that fits; otherwise why
    not, for the job's event (``policy`` is any ``scheduler.policy.Policy``)."""
    name = getattr(policy, "name", type(policy).__name__)
    order = getattr(policy, "plan_order", None)
    if name.startswith("has") and order == "ranked" and not getattr(policy, "grow", False):
        return None
    why = _WHY.get(("has", order)) if name.startswith("has") else None
    if why is None:
        why = "it orders the plans by its own rule (GPU count, speed or throughput)"
    if name.startswith("has") and order == "ranked":
        why = "it may grow or shrink a running job onto other plans"
    return f"the active policy {name!r} does not follow the ranked order: {why}"


def ranking_event(ranking: str, note: str) -> str:
    """The ``ranking`` event's message of a job that asked for ``ranking``."""
    return (f"ranking {ranking!r}: the stored plans are in that order (#1 first), but {note}; "
            "the job's chosen_plan shows the plan it runs")
