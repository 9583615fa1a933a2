"""Jobs: submit (model-only), list, get, events, cancel, artifacts (checkpoints)."""

from __future__ import annotations

import json
import logging
import uuid
from datetime import UTC, datetime
from pathlib import Path as FsPath
from typing import Annotated, Any

from fastapi import APIRouter, Body, Header, Path, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import StreamingResponse
from pydantic import AfterValidator
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from orchestrator.states import JobState
from service.api.deadlines import check_deadline
from service.api.deps import AppContext, ContextDep, CurrentUser, SessionDep
from service.api.entrypoint_check import check_entrypoint
from service.api.errors import ApiError
from service.api.job_inputs import check_inputs
from service.api.planning import canonical_hash
from service.api.quotas import Usage, read_usage
from service.api.views import (
    accounting,
    job_public,
    job_summary,
    stored_job_public,
    submitted_public,
)
from service.auth import Principal
from service.db import repositories as repo
from service.db.engine import write_connection, write_session
from service.db.models import Job
from service.job_logs import follow_log
from service.limits import check_text
from service.queue_view import waiting_for
from service.runner import SubmittedJob
from service.schemas import (
    RETIRED_FIELDS,
    ArtifactPublic,
    ArtifactsPublic,
    CancelRequest,
    DataCreate,
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
        401: {"model": ErrorPublic}, 403: {"model": ErrorPublic}, 404: {"model": ErrorPublic},
        422: {"model": ErrorPublic}, 429: {"model": ErrorPublic},
    },
)

PlansParam = Annotated[
    str | None,
    Query(
        pattern=r"^(all|[0-9]{1,4})$",
        description="ranked plans to return: a count or 'all' (default: the service's "
                    "plans_shown, 5)",
    ),
]


class JsonResponse(Response):
    """A body already serialised by pydantic: the route validated its model once, so
    FastAPI's response-model pass (a second validation and encoding) is skipped."""

    media_type = "application/json"


def _respond(model: JobPublic, status_code: int = 200,
             headers: dict[str, str] | None = None) -> JsonResponse:
    return JsonResponse(model.model_dump_json().encode(), status_code=status_code,
                        headers=headers)


def _shown(ctx: ContextDep, plans: str | None) -> int | None:
    if plans is None:
        return ctx.settings.plans_shown
    return None if plans == "all" else max(int(plans), 0)


MAX_DB_INT = 2**62
"""Bound on integer query parameters: larger values do not fit the database's 64-bit
integers (a 422, not a driver overflow)."""

JobId = Annotated[
    str, Path(max_length=128, description="the job's id"), AfterValidator(check_text)]
"""A job id in the path: any text the databases can store (a NUL is a 422, not a 500)."""

IdempotencyKey = Annotated[
    str | None,
    AfterValidator(check_text),
    Header(
        alias="Idempotency-Key", min_length=1, max_length=128,
        description="a retried submission with the same key returns the same job",
    ),
]


def _owned_job(
    session: Session, job_id: str, user: Principal, *, lock: bool = False,
    with_plans: bool = False,
) -> Job:
    job = repo.get_job(session=session, job_id=job_id, for_update=lock, with_plans=with_plans)
    if job is None or not user.can_see(job.owner):
        raise _no_job(job_id)
    return job


def _no_job(job_id: str) -> ApiError:
    """The answer for an unknown job and for another user's job alike (a 403 would tell
    the caller that the id exists)."""
    return ApiError(404, "job_id", f"no job {job_id!r} of yours")


def _full(session: Session, job: Job, shown: int | None) -> JobPublic:
    """The job in full; its plans document is loaded here if it was not yet."""
    return job_public(
        job, list(job.plans or []),
        repo.active_allocations(session=session, job_id=job.id) if job.state.holds_gpus
        else [],
        shown,
    )


def _replay(ctx: ContextDep, job: Job, request_hash: str, shown: int | None) -> Response:
    if job.request_hash != request_hash:
        raise ApiError(
            422, "Idempotency-Key",
            f"already used for a different submission (job {job.id}); "
            "send a new key for a new job",
        )
    with ctx.session_factory() as session:
        row = repo.get_job(session=session, job_id=job.id, with_plans=True)
        assert row is not None
        return _respond(_full(session, row, shown), 201, {"Idempotent-Replayed": "true"})


@router.post(
    "", status_code=201, response_model=JobPublic,
    summary="Submit a job: a model and its training config; get its ranked plans",
    description=(
        "Submit a training job: name the model (`model` from the catalog, a Hugging Face "
        "`hf_config`, `dimensions`, or `init_from` a model folder to fine-tune) and how to "
        "train it (`training`), optionally with your `data`, a `name`, a `deadline_s`. The "
        "service plans the job for this cluster's GPU types and answers with the job and "
        "its best ranked plans (`?plans=N`, or `?plans=all`); the scheduler starts it on "
        "one of them as soon as GPUs are free. A `deadline_s` that no plan can meet is "
        "refused with the earliest feasible completion, unless you send `best_effort: "
        "true`. Retrying with the same `Idempotency-Key` header returns the same job."),
)
async def submit_job(
    body: JobCreate,
    user: CurrentUser,
    request: Request,
    idempotency_key: IdempotencyKey = None,
    plans: PlansParam = None,
) -> Response:
    """Plan the job against the cluster's GPU types (cached for identical bodies), store it
    PENDING with its ranked plans (one transaction), then hand it to the runner. The answer
    carries the best ``plans`` plans (default 5; ``?plans=all``).

    ``async``: the cached path runs on the event loop and the row is written by the
    process's group-commit writer (``service.db.writer``; on PostgreSQL
    ``service.db.pg_async``, on the event loop too); planning a new body, the
    idempotency lookups and a blocking runner run in the thread pool. (The context comes
    from the request rather than ``ContextDep``: one dependency less on the hot path.)"""
    ctx: AppContext = request.app.state.ctx
    shown = _shown(ctx, plans)
    request = body.model_dump(mode="json", exclude_none=True)
    request_hash = canonical_hash(request)
    if idempotency_key:
        replay = await run_in_threadpool(_replay_by_key, ctx, user, idempotency_key,
                                         request_hash, shown)
        if replay is not None:
            return replay
    if body.entrypoint or body.working_dir:  # the script must exist: files, off the loop
        await run_in_threadpool(check_entrypoint, body.entrypoint, body.working_dir)

    inventory = ctx.inventory.peek()
    if inventory is None:  # stale (once per TTL): the refresh reads the database
        inventory = await run_in_threadpool(ctx.inventory.get)
    planned = ctx.planning.cached_request(inventory, request_hash)
    if planned is None:
        planned = await run_in_threadpool(ctx.planning.plan_request, body, inventory,
                                          request_hash)
    t = body.training
    max_runtime_s = ctx.quotas.runtime_limit(body.max_runtime_s)
    ctx.quotas.check_job(planned, steps_field="training.tokens"
                         if t.steps is None and t.tokens is not None else "training.steps")
    if ctx.quotas.needs_usage:
        usage = await run_in_threadpool(_usage, ctx, user.owner)
        ctx.quotas.check_usage(user.owner, usage, planned)
    late = check_deadline(planned.plans, body.deadline_s, best_effort=bool(body.best_effort),
                          gpu_types=planned.gpu_types)
    notes: list[str] = []
    if body.init_from or isinstance(body.data, DataCreate):  # files to check: off the loop
        notes = await run_in_threadpool(check_inputs, body, planned.model, planned.train)
    now = ctx.clock()
    job_id = uuid.uuid4().hex
    model_json, training_json, plans_json = planned.stored_json
    job = dict(
        job_id=job_id, owner=user.owner, name=body.name, model_name=planned.model.name,
        model_spec_json=model_json, training_json=training_json,
        request_json=json.dumps(request), request_hash=request_hash,
        idempotency_key=idempotency_key, total_steps=planned.train.num_steps,
        plans_json=plans_json, plan_count=len(planned.plan_dicts), now=now,
        deadline_s=body.deadline_s, entrypoint=body.entrypoint, max_runtime_s=max_runtime_s,
        **({"reason": late} if late else {}),
    )
    if late:
        notes = [late, *notes]
    try:
        # One short transaction, two Core INSERTs (the job with its plans, its first
        # event), shared with the submissions queued at the same moment.
        if ctx.writer is not None:
            row = await ctx.writer.insert_job(**job)
        else:
            row = await run_in_threadpool(_insert_one, ctx, job)
    except IntegrityError:
        if not idempotency_key:
            raise
        # A concurrent retry with the same key won the race: answer with its job.
        replay = await run_in_threadpool(_replay_by_key, ctx, user, idempotency_key,
                                         request_hash, shown)
        if replay is None:
            raise
        return replay

    submitted = SubmittedJob(
        id=job_id, owner=user.owner, model=planned.model, train=planned.train,
        plans=planned.plans, submitted_at=now, name=body.name,
        deadline_at=row["deadline_at"], entrypoint=body.entrypoint,
    )
    try:
        if getattr(ctx.runner, "nonblocking", False):
            ctx.runner.submit(submitted)
        else:
            await run_in_threadpool(ctx.runner.submit, submitted)
    except Exception as exc:
        log.exception("runner refused job %s", job_id)
        reason = f"the scheduler did not accept the job: {exc}"
        await run_in_threadpool(_fail_refused, ctx, job_id, reason)
        raise ApiError(503, "runner", f"{reason} (job {job_id} recorded as FAILED)") from exc
    public = submitted_public(row, planned, shown)
    return _respond(public.model_copy(update={"notes": notes}) if notes else public, 201)


def artifacts_public(job_id: str, checkpoint_dir: str) -> ArtifactsPublic:
    """The checkpoint files of ``job_id`` under ``checkpoint_dir`` (the job is known to
    exist: its id is a database key, not a path a user chose)."""
    from orchestrator.trainer.export import artifacts  # torch: imported on first use

    root = FsPath(checkpoint_dir).resolve()
    return ArtifactsPublic(
        job_id=job_id, checkpoint_dir=str(root / job_id),
        data=[ArtifactPublic(step=a.step, path=str(a.path), size_bytes=a.size_bytes,
                             modified_at=datetime.fromtimestamp(a.modified_at, UTC))
              for a in artifacts(root, job_id)],
        export=f"frenzy export {job_id} --format hf OUT/ [--step N]",
    )


def _read_job(ctx: AppContext, job_id: str) -> tuple[Any, list[Any]]:
    """The job's row and its held allocations; on PostgreSQL in autocommit (two reads need
    no BEGIN/ROLLBACK round trips)."""
    with ctx.engine.connect() as conn:
        if conn.dialect.name == "postgresql":
            conn = conn.execution_options(isolation_level="AUTOCOMMIT")
        row = repo.get_job_row(conn=conn, job_id=job_id)
        if row is None or not row.state.holds_gpus:
            return row, []
        return row, repo.held_allocation_rows(conn=conn, job_id=job_id)


def _gpu_seconds(ctx: AppContext, job_id: str) -> float | None:
    with ctx.session_factory() as session:
        return repo.gpu_seconds_by_job(session=session, job_ids=[job_id],
                                       now=ctx.clock()).get(job_id)


def _usage(ctx: AppContext, owner: str) -> Usage:
    with ctx.session_factory() as session:
        return read_usage(session, owner)


def _insert_one(ctx: AppContext, job: dict[str, object]) -> dict[str, object]:
    with write_connection(ctx.engine) as conn:
        return repo.insert_jobs(conn=conn, jobs=[job])[0]


def _replay_by_key(ctx: AppContext, user: Principal, key: str, request_hash: str,
                   shown: int | None) -> Response | None:
    with ctx.session_factory() as session:
        existing = repo.get_job_by_idempotency_key(session=session, owner=user.owner, key=key)
    return None if existing is None else _replay(ctx, existing, request_hash, shown)


def _fail_refused(ctx: AppContext, job_id: str, reason: str) -> None:
    with write_session(ctx.session_factory) as session:
        stored = repo.get_job(session=session, job_id=job_id, for_update=True)
        if stored is not None and not stored.state.terminal:
            repo.transition_job(
                session=session, job=stored, to=JobState.FAILED, reason=reason,
                now=ctx.clock(),
            )


@router.get("", response_model=JobsPublic, summary="List jobs (yours; admins: anyone's)",
            description=(
                "Your jobs, newest first; admins see everyone's (or one user's with "
                "`owner`). Filter with `state` (repeat it for several) and page with "
                "`limit` and `offset`. Each job shows its owner, state and progress, the "
                "GPU-hours it has used and, once finished, how long it ran."))
def list_jobs(
    session: SessionDep,
    user: CurrentUser,
    ctx: ContextDep,
    state: Annotated[list[JobState] | None, Query(description="repeat to OR states")] = None,
    owner: Annotated[str | None, Query(max_length=64, description="admins only"),
                     AfterValidator(check_text)] = None,
    limit: Annotated[int | None, Query(ge=1, le=MAX_DB_INT)] = None,
    offset: Annotated[int, Query(ge=0, le=MAX_DB_INT)] = 0,
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
    used = repo.gpu_seconds_by_job(session=session, job_ids=[j.id for j in rows],
                                   now=ctx.clock())
    return JobsPublic(
        data=[job_summary(j).model_copy(update=accounting(j, used.get(j.id))) for j in rows],
        count=total, limit=limit, offset=offset)


@router.get("/{job_id}", response_model=JobPublic, summary="A job: plans, allocation, progress",
            description=(
                "One of your jobs in full: its state and why, progress, its ranked plans "
                "(`?plans=N` or `?plans=all`), the plan chosen and the GPUs it holds, loss "
                "and speed as measured, GPU-hours and duration, and while it is queued, why "
                "it waits (`waiting`, with numbers)."))
async def get_job(
    job_id: JobId, user: CurrentUser, request: Request,
    plans: PlansParam = None,
) -> Response:
    """The job with its best ``plans`` ranked plans (default 5; ``?plans=all``).

    ``async``: one or two reads by key, on the event loop for SQLite (no thread-pool round
    trip) and for PostgreSQL (async psycopg, ``service.db.pg_async``); the parts of the
    answer shared between jobs come from caches (``stored_job_public``)."""
    ctx: AppContext = request.app.state.ctx
    if ctx.pg is not None:  # PostgreSQL: async, on this event loop (one round trip)
        row, held = await ctx.pg.read_job(job_id)
    elif ctx.sqlite is not None:  # a local file read: microseconds
        row, held = ctx.sqlite.read_job(job_id)
    else:  # another server database: keep the event loop free
        row, held = await run_in_threadpool(_read_job, ctx, job_id)
    if row is None or not user.can_see(row.owner):
        raise _no_job(job_id)
    public = stored_job_public(row, held, _shown(ctx, plans))
    if row.placed_at is not None:  # it held GPUs: its GPU-hours (one grouped read)
        used = await run_in_threadpool(_gpu_seconds, ctx, job_id)
        public = public.model_copy(update=accounting(row, used))
    if row.state is JobState.PENDING:  # why it waits: reads the queue, so only then
        quota = ctx.settings.quota_max_gpus
        queue = ctx.queue.peek(quota)  # shared and fresh: no thread-pool round trip
        if queue is None:
            queue = await run_in_threadpool(ctx.queue.get, quota)
        waiting = waiting_for(queue, job_id)
        public = public.model_copy(update={"waiting": waiting})
    return _respond(public)


@router.get("/{job_id}/events", response_model=EventsPublic, summary="A job's event log",
            description=(
                "What happened to your job, oldest first: submission, placement, start, "
                "resizes and restarts, the end and its reason, and notes such as a "
                "best-effort deadline or a ranking the scheduler did not follow. Page with "
                "`after` (the previous page's `next_after`)."))
def list_events(
    job_id: JobId,
    session: SessionDep,
    user: CurrentUser,
    after: Annotated[int, Query(ge=0, le=MAX_DB_INT, description="events with id > after")] = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> EventsPublic:
    _owned_job(session, job_id, user)
    rows = repo.list_events(session=session, job_id=job_id, after_id=after, limit=limit)
    return EventsPublic(
        data=[EventPublic.model_validate(r) for r in rows],
        next_after=rows[-1].id if len(rows) == limit else None,
    )


@router.post("/{job_id}/cancel", response_model=JobPublic, summary="Cancel a live job",
             description=(
                 "Stop your queued or running job and free its GPUs; an optional `reason` "
                 "is recorded with it. A job that has already finished gives 409."))
def cancel_job(
    job_id: JobId,
    ctx: ContextDep,
    user: CurrentUser,
    body: Annotated[CancelRequest | None, Body()] = None,
    plans: PlansParam = None,
) -> Response:
    """Record CANCELLED (releasing its GPUs) with the reason, then tell the runner."""
    why = body.reason if body and body.reason else None
    reason = f"cancelled by {user.owner}" + (f": {why}" if why else "")
    with write_session(ctx.session_factory) as session:
        job = _owned_job(session, job_id, user, lock=True, with_plans=True)
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
        public = _full(session, job, _shown(ctx, plans))
    try:
        ctx.runner.cancel(job_id, reason)
    except Exception:  # the cancellation is recorded; the runner catches up on restart
        log.exception("runner failed to cancel job %s", job_id)
    return _respond(public)


@router.post(
    "/{job_id}/resubmit", status_code=201, response_model=JobPublic,
    summary="Run a finished job again: a new job with the same request",
)
async def resubmit_job(job_id: JobId, user: CurrentUser, request: Request,
                       plans: PlansParam = None) -> Response:
    """Submit the request of your finished job (succeeded, failed or cancelled) again, as a
    new job planned for the cluster as it is now; the answer is the new job. Only the
    job's owner can resubmit it (anyone else gets 404); a job still queued or running is a
    409."""
    ctx: AppContext = request.app.state.ctx
    body = await run_in_threadpool(_resubmit_body, ctx, job_id, user)
    answer = await submit_job(body, user, request, None, plans)
    new_id = json.loads(bytes(answer.body))["id"]
    await run_in_threadpool(_note_resubmission, ctx, new_id, job_id)
    return answer


def _resubmit_body(ctx: AppContext, job_id: str, user: Principal) -> JobCreate:
    """The stored request of ``user``'s own finished job, as a submission body."""
    with ctx.session_factory() as session:
        job = repo.get_job(session=session, job_id=job_id)
        if job is None or job.owner != user.owner:
            raise _no_job(job_id)
        if not job.state.terminal:
            raise ApiError(409, "state", f"job is {job.state.value}; only finished jobs "
                                         "(succeeded, failed, cancelled) can be resubmitted")
        stored = {k: v for k, v in (job.request or {}).items() if k not in RETIRED_FIELDS}
    try:
        return JobCreate.model_validate(stored)
    except ValueError as exc:  # a request stored by an older version of the schema
        raise ApiError(422, "job_id", f"job {job_id}'s request no longer validates ({exc}); "
                                      "submit it afresh") from None


def _note_resubmission(ctx: AppContext, new_id: str, old_id: str) -> None:
    with write_session(ctx.session_factory) as session:
        repo.append_event(session=session, job_id=new_id, kind="resubmitted",
                          message=f"resubmission of job {old_id}",
                          data={"from": old_id}, now=ctx.clock())


@router.get("/{job_id}/artifacts", response_model=ArtifactsPublic,
            summary="A job's checkpoints: steps and files, and how to export them",
            description=(
                "The checkpoints your job has written (oldest first; the newest are kept): "
                "step, file and size of each, and the `frenzy export` command that turns "
                "one into a Hugging Face model folder."))
def list_artifacts(job_id: str, session: SessionDep, user: CurrentUser,
                   ctx: ContextDep) -> ArtifactsPublic:
    """The built-in trainer's checkpoints of the job (oldest first; the newest are kept),
    each exportable as a Hugging Face model folder with ``frenzy export``."""
    _owned_job(session, job_id, user)
    return artifacts_public(job_id, ctx.settings.checkpoint_dir)


@router.get("/{job_id}/logs", response_class=StreamingResponse,
            summary="A rank's output, streamed (follow=true: until the job ends)",
            description=(
                "What one rank (`rank`, default 0) of your job printed in its current "
                "launch, as plain text, from byte `offset`. With `follow=true` new output "
                "is sent as it is written, until the job ends or the server's "
                "`logs_follow_max_s` (default an hour) has passed: then reconnect with "
                "`offset` = the bytes received so far."),
            responses={200: {"content": {"text/plain": {}}}})
def get_logs(job_id: JobId, session: SessionDep, user: CurrentUser, ctx: ContextDep,
             rank: Annotated[int, Query(ge=0, le=65535, description="which rank")] = 0,
             follow: Annotated[bool, Query(description="keep streaming new lines until "
                                                       "the job ends")] = False,
             offset: Annotated[int, Query(ge=0, le=2**62, description="start at this byte "
                                          "of the log (a new launch starts it again)")] = 0,
             ) -> StreamingResponse:
    """What rank ``rank`` of your job printed (its current launch), as plain text, from
    byte ``offset``. With ``follow=true`` new output is sent as it is written, until the job
    ends or ``logs_follow_max_s`` has passed."""
    _owned_job(session, job_id, user)

    def finished() -> bool:
        with ctx.session_factory() as s:
            job = repo.get_job(session=s, job_id=job_id)
            return job is None or job.state.terminal

    return StreamingResponse(
        follow_log(ctx.settings.checkpoint_dir, job_id, rank, finished if follow else None,
                   offset=offset, max_s=ctx.settings.logs_follow_max_s),
        media_type="text/plain; charset=utf-8")
