"""Jobs: submit (model-only), list, get, events, cancel."""

from __future__ import annotations

import logging
import uuid
from typing import Annotated

from fastapi import APIRouter, Body, Header, Query, Response
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from orchestrator.states import JobState
from service.api.deps import ContextDep, CurrentUser, SessionDep
from service.api.errors import ApiError
from service.api.planning import canonical_hash, spec_dict
from service.api.views import job_public, job_summary
from service.auth import Principal
from service.db import repositories as repo
from service.db.engine import write_session
from service.db.models import Job
from service.runner import SubmittedJob
from service.schemas import (
    CancelRequest,
    ErrorPublic,
    EventPublic,
    EventsPublic,
    JobCreate,
    JobPublic,
    JobsPublic,
)

log = logging.getLogger(__name__)

router = APIRouter(
    prefix="/jobs",
    tags=["jobs"],
    responses={
        401: {"model": ErrorPublic}, 403: {"model": ErrorPublic}, 422: {"model": ErrorPublic},
    },
)

IdempotencyKey = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key", min_length=1, max_length=128,
        description="a retried submission with the same key returns the same job",
    ),
]


def _owned_job(session: Session, job_id: str, user: Principal, *, lock: bool = False) -> Job:
    job = repo.get_job(session=session, job_id=job_id, for_update=lock)
    if job is None:
        raise ApiError(404, "job_id", f"no job {job_id!r}")
    if not user.can_see(job.owner):
        raise ApiError(403, "job_id", f"job {job_id!r} belongs to another user")
    return job


def _full(session: Session, job: Job) -> JobPublic:
    return job_public(
        job, repo.list_plans(session=session, job_id=job.id),
        repo.active_allocations(session=session, job_id=job.id),
    )


def _replay(ctx: ContextDep, job: Job, request_hash: str, response: Response) -> JobPublic:
    if job.request_hash != request_hash:
        raise ApiError(
            422, "Idempotency-Key",
            f"already used for a different submission (job {job.id}); "
            "send a new key for a new job",
        )
    response.headers["Idempotent-Replayed"] = "true"
    with ctx.session_factory() as session:
        return _full(session, job)


@router.post(
    "", status_code=201, response_model=JobPublic,
    summary="Submit a job: a model and its training config; get its ranked plans",
)
def submit_job(
    body: JobCreate,
    user: CurrentUser,
    ctx: ContextDep,
    response: Response,
    idempotency_key: IdempotencyKey = None,
) -> JobPublic:
    """Plan the job against the cluster's GPU types, store it PENDING with its ranked plans
    (all in one transaction), then hand it to the runner."""
    request = body.model_dump(mode="json", exclude_none=True)
    request_hash = canonical_hash(request)
    if idempotency_key:
        with ctx.session_factory() as session:
            existing = repo.get_job_by_idempotency_key(
                session=session, owner=user.owner, key=idempotency_key
            )
        if existing is not None:
            return _replay(ctx, existing, request_hash, response)

    planned = ctx.planning.plan(body, ctx.inventory.get())
    now = ctx.clock()
    job_id = uuid.uuid4().hex
    try:
        with write_session(ctx.session_factory) as session:
            job = repo.create_job(
                session=session, job_id=job_id, owner=user.owner, name=body.name,
                model_name=planned.model.name, model_spec=spec_dict(planned.model),
                training=spec_dict(planned.train), request=request,
                request_hash=request_hash, idempotency_key=idempotency_key,
                total_steps=planned.train.num_steps, plans=planned.plan_dicts, now=now,
                priority=body.priority, deadline_s=body.deadline_s,
                entrypoint=body.entrypoint,
            )
    except IntegrityError:
        if not idempotency_key:
            raise
        # A concurrent retry with the same key won the race: answer with its job.
        with ctx.session_factory() as session:
            existing = repo.get_job_by_idempotency_key(
                session=session, owner=user.owner, key=idempotency_key
            )
        if existing is None:
            raise
        return _replay(ctx, existing, request_hash, response)

    try:
        ctx.runner.submit(
            SubmittedJob(
                id=job.id, owner=job.owner, model=planned.model, train=planned.train,
                plans=planned.plans, submitted_at=now, name=job.name, priority=job.priority,
                deadline_at=job.deadline_at, entrypoint=job.entrypoint,
            )
        )
    except Exception as exc:
        log.exception("runner refused job %s", job.id)
        reason = f"the scheduler did not accept the job: {exc}"
        with write_session(ctx.session_factory) as session:
            row = repo.get_job(session=session, job_id=job.id, for_update=True)
            if row is not None and not row.state.terminal:
                repo.transition_job(
                    session=session, job=row, to=JobState.FAILED, reason=reason, now=ctx.clock()
                )
        raise ApiError(503, "runner", f"{reason} (job {job.id} recorded as FAILED)") from exc
    return job_public(job, planned.plan_dicts, [])


@router.get("", response_model=JobsPublic, summary="List jobs (yours; admins: anyone's)")
def list_jobs(
    session: SessionDep,
    user: CurrentUser,
    ctx: ContextDep,
    state: Annotated[list[JobState] | None, Query(description="repeat to OR states")] = None,
    owner: Annotated[str | None, Query(max_length=64, description="admins only")] = None,
    limit: Annotated[int | None, Query(ge=1)] = None,
    offset: Annotated[int, Query(ge=0)] = 0,
) -> JobsPublic:
    settings = ctx.settings
    limit = limit or settings.default_page_size
    if limit > settings.max_page_size:
        raise ApiError(422, "limit", f"at most {settings.max_page_size} per page, got {limit}")
    if owner is not None and owner != user.owner and not user.is_admin:
        raise ApiError(403, "owner", "only admins can list other users' jobs")
    who = owner if user.is_admin else user.owner
    rows, total = repo.list_jobs(
        session=session, owner=who, states=state, limit=limit, offset=offset
    )
    return JobsPublic(data=[job_summary(j) for j in rows], count=total, limit=limit,
                      offset=offset)


@router.get("/{job_id}", response_model=JobPublic, summary="A job: plans, allocation, progress")
def get_job(job_id: str, session: SessionDep, user: CurrentUser) -> JobPublic:
    return _full(session, _owned_job(session, job_id, user))


@router.get("/{job_id}/events", response_model=EventsPublic, summary="A job's event log")
def list_events(
    job_id: str,
    session: SessionDep,
    user: CurrentUser,
    after: Annotated[int, Query(ge=0, description="events with id > after")] = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> EventsPublic:
    _owned_job(session, job_id, user)
    rows = repo.list_events(session=session, job_id=job_id, after_id=after, limit=limit)
    return EventsPublic(
        data=[EventPublic.model_validate(r) for r in rows],
        next_after=rows[-1].id if len(rows) == limit else None,
    )


@router.post("/{job_id}/cancel", response_model=JobPublic, summary="Cancel a live job")
def cancel_job(
    job_id: str,
    ctx: ContextDep,
    user: CurrentUser,
    body: Annotated[CancelRequest | None, Body()] = None,
) -> JobPublic:
    """Record CANCELLED (releasing its GPUs) with the reason, then tell the runner."""
    why = body.reason if body and body.reason else None
    reason = f"cancelled by {user.owner}" + (f": {why}" if why else "")
    with write_session(ctx.session_factory) as session:
        job = _owned_job(session, job_id, user, lock=True)
        if job.state.terminal:
            raise ApiError(
                409, "state",
                f"job is already {job.state.value} ({job.state_reason}); only live jobs "
                "can be cancelled",
            )
        repo.transition_job(
            session=session, job=job, to=JobState.CANCELLED, reason=reason, now=ctx.clock()
        )
        session.flush()
        public = _full(session, job)
    try:
        ctx.runner.cancel(job_id, reason)
    except Exception:  # the cancellation is recorded; the runner catches up on restart
        log.exception("runner failed to cancel job %s", job_id)
    return public
