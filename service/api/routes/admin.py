"""Admin statistics: utilisation by GPU type over time, queue, JCT, deadlines, states."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from service.api.deps import AdminUser, ContextDep, SessionDep
from service.db import repositories as repo
from service.schemas import (
    DeadlinePublic,
    ErrorPublic,
    StatsPublic,
    UtilisationPoint,
    UtilisationPublic,
)

router = APIRouter(
    prefix="/admin", tags=["admin"],
    responses={401: {"model": ErrorPublic}, 403: {"model": ErrorPublic}},
)


@router.get("/stats", response_model=StatsPublic, summary="Cluster and queue statistics")
def stats(
    session: SessionDep,
    ctx: ContextDep,
    _admin: AdminUser,
    window_s: Annotated[float, Query(ge=1, le=90 * 86400, description="look-back (s)")] = 3600.0,
    buckets: Annotated[int, Query(ge=1, le=1000, description="utilisation points")] = 12,
) -> StatsPublic:
    s = repo.job_stats(session=session, now=ctx.clock(), window_s=window_s, buckets=buckets)
    return StatsPublic(
        now=s.now, window_s=s.window_s, bucket_s=s.bucket_s,
        utilisation=[
            UtilisationPublic(
                gpu_type=u.gpu_type, capacity_gpus=u.capacity_gpus, mean=u.mean,
                series=[
                    UtilisationPoint(start=t, used_fraction=f)
                    for t, f in zip(u.bucket_starts, u.used_fraction, strict=True)
                ],
            )
            for u in s.utilisation
        ],
        queue_length=s.queue_length, avg_jct_s=s.avg_jct_s, avg_queueing_s=s.avg_queueing_s,
        deadline=DeadlinePublic(jobs=s.deadline_jobs, met=s.deadline_met,
                                hit_rate=s.deadline_hit_rate),
        jobs_by_state=s.jobs_by_state, finished_in_window=s.finished_in_window,
    )
