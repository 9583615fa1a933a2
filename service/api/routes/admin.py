"""Admin statistics: utilisation by GPU type over time, queue, JCT, deadlines, states."""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated

from fastapi import APIRouter, Query

from service.api.deps import AdminUser, ContextDep, SessionDep
from service.db import repositories as repo
from service.schemas import (
    DeadlinePublic,
    ErrorPublic,
    StatsPublic,
    UsersPublic,
    UserUsagePublic,
    UtilisationPoint,
    UtilisationPublic,
)

router = APIRouter(
    prefix="/admin", tags=["admin"],
    responses={401: {"model": ErrorPublic}, 403: {"model": ErrorPublic}},
)


@router.get("/stats", response_model=StatsPublic, summary="Cluster and queue statistics",
            description=(
                "For admins: GPU utilisation by type over the last `window_s` seconds (in "
                "`buckets` points), the queue's length, average completion and queueing "
                "times, deadlines met, and jobs by state."))
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


@router.get("/users", response_model=UsersPublic,
            summary="Per-user usage: running and queued jobs, GPUs held, GPU-hours")
def users(
    session: SessionDep,
    ctx: ContextDep,
    _admin: AdminUser,
    window_s: Annotated[float | None, Query(
        ge=1, le=10 * 365 * 86400,
        description="count GPU-hours over the last window_s seconds (default: all time)")
    ] = None,
) -> UsersPublic:
    """Every user who has submitted a job: how many of their jobs run and wait now, the
    GPUs they hold, and the GPU-hours their jobs have used. Admin tokens only."""
    now = ctx.clock()
    since = now - timedelta(seconds=window_s) if window_s is not None else None
    rows = repo.user_usage(session=session, now=now, since=since)
    return UsersPublic(now=now, window_s=window_s, data=[
        UserUsagePublic(owner=u.owner, jobs=u.jobs, running=u.running, queued=u.queued,
                        gpus_held=u.gpus_held, gpu_hours=u.gpu_seconds / 3600.0)
        for u in rows])
