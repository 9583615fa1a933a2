"""Why a queued job waits, with numbers: what it needs, what is free, who is ahead, and
about when it could start.

Computed in the service from the cluster state and the queue, not inside the scheduling
policies (they decide; this explains, approximately). The estimate is a plain list
schedule by the plans' predicted times: the queue in order (priority, then submission),
each job on its best plan that fits the cluster, no job of a GPU type starting before one
ahead of it of that type, GPUs coming free when running jobs end at their predicted
remaining time. A policy that backfills, resizes or picks other plans may do better (or,
with new arrivals of higher priority, worse): the figure is labelled "≈" for that reason.

A job whose owner is at ``quota_max_gpus`` is held back by the control loop before the
policy sees it (``orchestrator.quotas``); ``service.queue_view`` finds those jobs with the
same rule and gives them ``USER_GPU_QUOTA`` (``quota_waiting``) instead of a place in the
estimate.

Pure: no I/O, no clock; ``service.queue_view`` gathers the inputs.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from orchestrator.quotas import QuotaHold


class WaitKind(StrEnum):
    """The typed reason a job is queued."""

    NO_PLAN = "no_plan"
    """No plan of the job fits any GPU type of this cluster."""
    LARGER_THAN_CLUSTER = "larger_than_cluster"
    """Its best plan needs more GPUs of a type than the cluster has at all."""
    WAITING_FOR_GPUS = "waiting_for_gpus"
    """Fewer GPUs of its type are free than it needs; running jobs must end first."""
    BEHIND_QUEUE = "behind_queue"
    """Enough GPUs are free, but jobs ahead of it in the queue take them first."""
    NEXT_ROUND = "next_round"
    """Its GPUs are free even after the jobs ahead took theirs: it starts at the
    scheduler's next round."""
    USER_GPU_QUOTA = "user_gpu_quota"
    """Its owner's jobs hold (or, queued ahead of it, may take) as many GPUs as
    ``quota_max_gpus`` allows: it is not placed until some of them end."""


@dataclass(frozen=True, slots=True)
class Need:
    """A job's GPUs on its plan: ``gpus`` × ``gpu_type`` for ``run_s`` seconds."""

    gpu_type: str
    gpus: int
    run_s: float


@dataclass(frozen=True, slots=True)
class Queued:
    """A waiting job in queue order; ``need`` None: no plan fits the cluster."""

    job_id: str
    need: Need | None


@dataclass(frozen=True, slots=True)
class Holding:
    """GPUs a job holds now and the predicted seconds until it releases them."""

    gpu_type: str
    gpus: int
    remaining_s: float


@dataclass(frozen=True, slots=True)
class Waiting:
    """Why one queued job waits."""

    kind: WaitKind
    message: str
    gpu_type: str | None = None
    gpus_needed: int | None = None
    gpus_free: int | None = None
    gpus_total: int | None = None
    jobs_ahead: int = 0
    earliest_start_s: float | None = None
    """Seconds from now by the predicted times; None when it cannot be estimated."""


def quota_waiting(hold: QuotaHold) -> Waiting:
    """The ``USER_GPU_QUOTA`` reason of a job the control loop holds back
    (``orchestrator.quotas.owner_room``)."""
    parts = [f"your jobs hold {hold.held_gpus} GPUs; quota_max_gpus is {hold.quota}"]
    if hold.reserved_gpus:
        parts.append(f"your jobs queued ahead of this one may take {hold.reserved_gpus} more")
    parts.append(f"this job needs at least {hold.smallest_gpus}; it waits until some of "
                 "your GPUs are released")
    return Waiting(WaitKind.USER_GPU_QUOTA, "; ".join(parts), gpus_needed=hold.smallest_gpus)


def _minutes(s: float) -> str:
    if s < 60:
        return f"{s:.0f} s"
    if s < 3600:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h"


def explain_queue(queue: Sequence[Queued], free: Mapping[str, int],
                  total: Mapping[str, int], holding: Sequence[Holding]) -> dict[str, Waiting]:
    """A ``Waiting`` for every job of ``queue`` (in queue order), given the free and total
    GPUs per type and the jobs holding GPUs now (see the module docstring)."""
    avail = dict(free)
    releases: dict[str, list[tuple[float, int]]] = {}
    for h in holding:
        heapq.heappush(releases.setdefault(h.gpu_type, []), (max(0.0, h.remaining_s), h.gpus))
    cursor: dict[str, float] = {}  # latest start of a job of each type so far (FIFO per type)
    ahead: dict[str, int] = {}
    out: dict[str, Waiting] = {}
    for q in queue:
        n = q.need
        if n is None:
            out[q.job_id] = Waiting(WaitKind.NO_PLAN, "no plan of this job fits the GPU types "
                                    "of this cluster")
            continue
        have, cap = free.get(n.gpu_type, 0), total.get(n.gpu_type, 0)
        before = ahead.get(n.gpu_type, 0)
        common = dict(gpu_type=n.gpu_type, gpus_needed=n.gpus, gpus_free=have, gpus_total=cap,
                      jobs_ahead=before)
        if n.gpus > cap:
            out[q.job_id] = Waiting(WaitKind.LARGER_THAN_CLUSTER,
                                    f"needs {n.gpus}×{n.gpu_type}; the cluster has {cap}",
                                    **common)  # type: ignore[arg-type]
            continue
        ahead[n.gpu_type] = before + 1
        t = cursor.get(n.gpu_type, 0.0)
        heap = releases.setdefault(n.gpu_type, [])
        while avail.get(n.gpu_type, 0) < n.gpus and heap:
            when, gpus = heapq.heappop(heap)
            t = max(t, when)
            avail[n.gpu_type] = avail.get(n.gpu_type, 0) + gpus
        start = t if avail.get(n.gpu_type, 0) >= n.gpus else math.inf
        if math.isfinite(start):
            avail[n.gpu_type] -= n.gpus
            heapq.heappush(heap, (start + n.run_s, n.gpus))
            cursor[n.gpu_type] = start
        if have < n.gpus:
            kind, what = WaitKind.WAITING_FOR_GPUS, f"needs {n.gpus}×{n.gpu_type}, {have} free"
        elif start > 0:
            kind, what = WaitKind.BEHIND_QUEUE, (f"needs {n.gpus}×{n.gpu_type}, {have} free "
                                                 "but wanted by jobs ahead")
        else:
            kind, what = WaitKind.NEXT_ROUND, (f"needs {n.gpus}×{n.gpu_type}, {have} free; "
                                               "starts at the scheduler's next round")
        parts = [what]
        if before:
            parts.append(f"{before} job{'s' if before > 1 else ''} ahead")
        if kind is not WaitKind.NEXT_ROUND and math.isfinite(start):
            parts.append(f"earliest start ≈ {_minutes(start)} by the plans' predicted times")
        out[q.job_id] = Waiting(kind, "; ".join(parts),
                                earliest_start_s=start if math.isfinite(start) else None,
                                **common)  # type: ignore[arg-type]
    return out
