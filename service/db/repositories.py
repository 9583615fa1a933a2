"""Repository functions: every read and write of the service tables, keyword-only.

Used by the API routes and by the Controller's event listener (``service.runner``). They
add and flush but never commit: the caller owns the transaction, so a submission (job, its
plans, its first event) is written whole or not at all. Time is passed in (``now``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session, undefer

from orchestrator.states import HOLDING, TERMINAL, JobState, check_transition
from service.db.models import AllocationRow, Event, Job, NodeRow, Token, UTCDateTime, utcnow

log = logging.getLogger(__name__)


# -- tokens -------------------------------------------------------------------------------
def add_token(
    *,
    session: Session,
    owner: str,
    token_hash: str,
    is_admin: bool,
    label: str | None = None,
    now: datetime | None = None,
    expires_at: datetime | None = None,
) -> Token:
    """Store a token's hash (never the token itself)."""
    row = Token(
        owner=owner, token_hash=token_hash, is_admin=is_admin, label=label,
        created_at=now or utcnow(), expires_at=expires_at,
    )
    session.add(row)
    session.flush()
    return row


ACTIVE_TOKEN = (
    sa.select(Token.id, Token.owner, Token.is_admin)
    .where(Token.token_hash == sa.bindparam("token_hash"), Token.revoked_at.is_(None),
           sa.or_(Token.expires_at.is_(None), Token.expires_at > sa.bindparam("now")))
)
"""The live token with a hash (neither revoked nor expired at ``now``): the one query
every authenticated request makes (``service.db.pg_async`` runs the same statement)."""


def get_active_token(
    *, session: Session, token_hash: str, now: datetime | None = None
) -> sa.Row[Any] | None:
    """(id, owner, is_admin) of the token with this hash if it is live at ``now``."""
    return session.execute(
        ACTIVE_TOKEN, {"token_hash": token_hash, "now": now or utcnow()}).first()


def list_tokens(*, session: Session, owner: str | None = None) -> list[Token]:
    """Every token (or an owner's), oldest first: what ``frenzy token list`` shows."""
    stmt = sa.select(Token).order_by(Token.id)
    if owner is not None:
        stmt = stmt.where(Token.owner == owner)
    return list(session.scalars(stmt))


def revoke_token(*, session: Session, token_id: int, now: datetime | None = None) -> Token | None:
    """Revoke one token by its id (a no-op if it already is); None if there is no such id."""
    row = session.get(Token, token_id)
    if row is not None and row.revoked_at is None:
        row.revoked_at = now or utcnow()
        session.flush()
    return row


def revoke_tokens(*, session: Session, owner: str, now: datetime | None = None) -> int:
    """Revoke every live token of ``owner``; returns how many."""
    result = session.execute(
        sa.update(Token)
        .where(Token.owner == owner, Token.revoked_at.is_(None))
        .values(revoked_at=now or utcnow())
    )
    return int(result.rowcount or 0)


# -- jobs ---------------------------------------------------------------------------------


def create_job(
    *,
    session: Session,
    job_id: str,
    owner: str,
    model_name: str,
    model_spec: Mapping[str, Any],
    training: Mapping[str, Any],
    request: Mapping[str, Any],
    request_hash: str,
    total_steps: int,
    plans: Sequence[Mapping[str, Any]],
    now: datetime,
    name: str | None = None,
    idempotency_key: str | None = None,
    priority: int = 0,
    deadline_s: float | None = None,
    entrypoint: str | None = None,
    reason: str = "queued: waiting for the scheduler",
    max_runtime_s: float | None = None,
) -> Job:
    """Insert a PENDING job with its ranked plans (``Plan.to_dict()`` shapes, stored as one
    document with ranks 1..n) and a ``submitted`` event. Raises ``IntegrityError`` at flush
    if the idempotency key is taken."""
    ranked = [p if p.get("rank") == i else {**p, "rank": i} for i, p in enumerate(plans, 1)]
    job = Job(
        id=job_id, owner=owner, name=name, state=JobState.PENDING, state_reason=reason,
        model_name=model_name, model_spec=dict(model_spec), training=dict(training),
        request=dict(request), request_hash=request_hash, idempotency_key=idempotency_key,
        priority=priority, deadline_s=deadline_s,
        deadline_at=now + timedelta(seconds=deadline_s) if deadline_s else None,
        entrypoint=entrypoint, total_steps=total_steps, steps_done=0.0,
        max_runtime_s=max_runtime_s, running_s=0.0, created_at=now, updated_at=now,
        plans=ranked, plan_count=len(ranked),
    )
    session.add(job)
    session.flush()  # the job row first: its event references it
    session.add(
        Event(
            job_id=job_id, at=now, kind="submitted", state=JobState.PENDING.value,
            message=f"submitted {model_name} with {len(plans)} ranked plan(s); {reason}",
        )
    )
    session.flush()
    return job


class _RawJSON(sa.types.UserDefinedType[str]):
    """A JSON column written from text already serialised (no cast, no re-encoding)."""

    cache_ok = True

    def get_col_spec(self, **kw: Any) -> str:
        return "JSON"


def _raw_json_table(table: sa.Table) -> sa.TableClause:
    return sa.table(table.name, *(
        sa.column(c.name, _RawJSON() if isinstance(c.type, sa.JSON) else c.type)
        for c in table.columns
    ))


_JOBS_RAW = _raw_json_table(Job.__table__)  # type: ignore[arg-type]
INSERT_JOB = sa.insert(_JOBS_RAW)
INSERT_EVENT = sa.insert(Event.__table__)
JOB_INSERT_KEYS = (
    "id", "owner", "name", "state", "state_reason", "model_name", "model_spec", "training",
    "request", "request_hash", "idempotency_key", "priority", "deadline_s", "deadline_at",
    "entrypoint", "total_steps", "steps_done", "chosen_plan_rank", "created_at", "updated_at",
    "placed_at", "started_at", "finished_at", "plans", "plan_count", "max_runtime_s",
    "running_s",
)
"""The columns a submission writes (the keys of ``job_insert_rows``' job rows)."""
EVENT_INSERT_KEYS = ("job_id", "at", "kind", "state", "message")


def insert_job(
    *,
    conn: sa.Connection,
    job_id: str,
    owner: str,
    model_name: str,
    model_spec_json: str,
    training_json: str,
    request_json: str,
    request_hash: str,
    total_steps: int,
    plans_json: str,
    plan_count: int,
    now: datetime,
    name: str | None = None,
    idempotency_key: str | None = None,
    priority: int = 0,
    deadline_s: float | None = None,
    entrypoint: str | None = None,
    reason: str = "queued: waiting for the scheduler",
    max_runtime_s: float | None = None,
) -> dict[str, Any]:
    """``create_job`` as two Core INSERTs (the job row with its ranked plans, already as
    JSON text with ranks 1..n, and its ``submitted`` event) on the caller's connection and
    transaction: what the submit path runs. Returns the job row's values. Raises
    ``IntegrityError`` if the idempotency key is taken."""
    return insert_jobs(conn=conn, jobs=[{
        "job_id": job_id, "owner": owner, "model_name": model_name,
        "model_spec_json": model_spec_json, "training_json": training_json,
        "request_json": request_json, "request_hash": request_hash,
        "total_steps": total_steps, "plans_json": plans_json, "plan_count": plan_count,
        "now": now, "name": name, "idempotency_key": idempotency_key, "priority": priority,
        "deadline_s": deadline_s, "entrypoint": entrypoint, "reason": reason,
        "max_runtime_s": max_runtime_s,
    }])[0]


def job_insert_rows(
    jobs: Sequence[Mapping[str, Any]],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The job rows (``JOB_INSERT_KEYS``) and ``submitted`` event rows
    (``EVENT_INSERT_KEYS``) of ``insert_job`` keyword arguments, one mapping per job."""
    rows: list[dict[str, Any]] = []
    events: list[dict[str, Any]] = []
    for j in jobs:
        now = j["now"]
        deadline_s = j.get("deadline_s")
        reason = j.get("reason") or "queued: waiting for the scheduler"
        rows.append({
            "id": j["job_id"], "owner": j["owner"], "name": j.get("name"),
            "state": JobState.PENDING, "state_reason": reason,
            "model_name": j["model_name"], "model_spec": j["model_spec_json"],
            "training": j["training_json"], "request": j["request_json"],
            "request_hash": j["request_hash"], "idempotency_key": j.get("idempotency_key"),
            "priority": j.get("priority", 0), "deadline_s": deadline_s,
            "deadline_at": now + timedelta(seconds=deadline_s) if deadline_s else None,
            "entrypoint": j.get("entrypoint"), "total_steps": j["total_steps"],
            "steps_done": 0.0, "chosen_plan_rank": None, "created_at": now, "updated_at": now,
            "placed_at": None, "started_at": None, "finished_at": None,
            "plans": j["plans_json"], "plan_count": j["plan_count"],
            "max_runtime_s": j.get("max_runtime_s"), "running_s": 0.0,
        })
        events.append({
            "job_id": j["job_id"], "at": now, "kind": "submitted",
            "state": JobState.PENDING.value,
            "message": f"submitted {j['model_name']} with {j['plan_count']} ranked plan(s); "
                       f"{reason}",
        })
    return rows, events


def insert_jobs(*, conn: sa.Connection, jobs: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Many ``insert_job`` (its keyword arguments, one mapping per job) in two
    ``executemany`` INSERTs on the caller's transaction; the rows' values, in order."""
    rows, events = job_insert_rows(jobs)
    if rows:
        conn.execute(INSERT_JOB, rows)
        conn.execute(INSERT_EVENT, events)
    return rows


def get_job(
    *, session: Session, job_id: str, for_update: bool = False, with_plans: bool = False
) -> Job | None:
    """One job by id; ``for_update`` locks its row (PostgreSQL) for a read-modify-write;
    ``with_plans`` loads the plans document too (otherwise loaded on first access)."""
    stmt = sa.select(Job).where(Job.id == job_id)
    if with_plans:
        stmt = stmt.options(undefer(Job.plans))
    if for_update:
        stmt = stmt.with_for_update()
    return session.scalar(stmt)


_JSON_AS_TEXT = ("model_spec", "training", "plans", "metrics")
JOB_PUBLIC_COLUMNS = tuple(
    sa.cast(c, sa.Text).label(c.name) if c.name in _JSON_AS_TEXT else c
    for c in Job.__table__.columns if c.name not in ("request",)
)
"""A job row as the API shows it, its JSON documents as text (parsed, once per distinct
document, by ``service.api.views.stored_job_public``)."""
SELECT_JOB_ROW = sa.select(*JOB_PUBLIC_COLUMNS).where(Job.id == sa.bindparam("job_id"))
ALLOCATION_COLUMNS = tuple(AllocationRow.__table__.columns)
SELECT_HELD = (
    sa.select(*ALLOCATION_COLUMNS)
    .where(AllocationRow.job_id == sa.bindparam("job_id"), AllocationRow.released_at.is_(None))
    .order_by(AllocationRow.id)
)


def get_job_row(*, conn: sa.Connection, job_id: str) -> sa.Row[Any] | None:
    """One job as a Core row of ``JOB_PUBLIC_COLUMNS`` (no ORM objects: the GET path)."""
    return conn.execute(SELECT_JOB_ROW, {"job_id": job_id}).first()


def held_allocation_rows(*, conn: sa.Connection, job_id: str) -> list[sa.Row[Any]]:
    """``active_allocations`` of one job as Core rows."""
    return list(conn.execute(SELECT_HELD, {"job_id": job_id}))


def get_job_by_idempotency_key(*, session: Session, owner: str, key: str) -> Job | None:
    return session.scalar(sa.select(Job).where(Job.owner == owner, Job.idempotency_key == key))


def list_jobs(
    *,
    session: Session,
    owner: str | None = None,
    states: Iterable[JobState] | None = None,
    limit: int = 50,
    offset: int = 0,
) -> tuple[list[Job], int]:
    """A page of jobs, newest first, and the total count matching the filters."""
    conds: list[sa.ColumnElement[bool]] = []
    if owner is not None:
        conds.append(Job.owner == owner)
    state_list = list(states or ())
    if state_list:
        conds.append(Job.state.in_(state_list))
    total = session.scalar(sa.select(sa.func.count()).select_from(Job).where(*conds)) or 0
    rows = session.scalars(
        sa.select(Job).where(*conds).order_by(Job.created_at.desc(), Job.id.desc())
        .limit(limit).offset(offset)
    ).all()
    return list(rows), int(total)


def owned_job_ids(*, session: Session, owner: str, job_ids: Sequence[str]) -> set[str]:
    """Those of ``job_ids`` that belong to ``owner`` (one query by primary key)."""
    if not job_ids:
        return set()
    return set(session.scalars(
        sa.select(Job.id).where(Job.id.in_(list(job_ids)), Job.owner == owner)))


def live_jobs(*, session: Session, with_plans: bool = False) -> list[Job]:
    """Every job not yet finished, oldest first: what a restarted Controller must resume
    (``with_plans``: their stored plans loaded too)."""
    stmt = sa.select(Job).where(Job.state.not_in(TERMINAL)).order_by(Job.created_at)
    if with_plans:
        stmt = stmt.options(undefer(Job.plans))
    return list(session.scalars(stmt).all())


def count_jobs_by_state(*, session: Session, owner: str | None = None) -> dict[str, int]:
    stmt = sa.select(Job.state, sa.func.count()).group_by(Job.state)
    if owner is not None:
        stmt = stmt.where(Job.owner == owner)
    counts = {s.value: 0 for s in JobState}
    for state, n in session.execute(stmt):
        counts[JobState(state).value] = int(n)
    return counts


def list_plans(*, session: Session, job_id: str) -> list[dict[str, Any]]:
    """A job's ranked plans (``Plan.to_dict()`` forms with ``rank``), best first."""
    plans = session.scalar(sa.select(Job.plans).where(Job.id == job_id))
    return list(plans or [])


def transition_job(
    *,
    session: Session,
    job: Job,
    to: JobState,
    reason: str,
    now: datetime,
    kind: str | None = None,
    data: Mapping[str, Any] | None = None,
) -> Job:
    """Move ``job`` to ``to`` (``IllegalTransition`` if the state machine forbids it), stamp
    the matching timestamp, release its GPUs when it stops holding them, log an event."""
    check_transition(job.state, to)
    job.state = to
    job.state_reason = reason
    job.updated_at = now
    if to is JobState.PLACED and job.placed_at is None:
        job.placed_at = now
    if to is JobState.RUNNING and job.started_at is None:
        job.started_at = now
    if to in TERMINAL:
        job.finished_at = now
    if to is JobState.SUCCEEDED:
        job.steps_done = float(job.total_steps)
    if to not in HOLDING:
        release_allocations(session=session, job_id=job.id, now=now)
    append_event(
        session=session, job_id=job.id, kind=kind or to.value.lower(), state=to.value,
        message=reason, data=data, now=now,
    )
    return job


def record_progress(
    *, session: Session, job: Job, steps_done: float, now: datetime
) -> Job:
    """Update a job's finished-step count (not logged as an event: it changes often)."""
    job.steps_done = max(0.0, min(float(steps_done), float(job.total_steps)))
    job.updated_at = now
    return job


# -- allocations --------------------------------------------------------------------------
def set_allocation(
    *,
    session: Session,
    job: Job,
    placement: Sequence[tuple[str, int]],
    gpu_type: str,
    plan_rank: int | None,
    now: datetime,
) -> list[AllocationRow]:
    """Replace the job's held GPUs with ``placement`` ((node_id, gpus), ...): the old rows
    are released (kept as history), one new row per node is inserted."""
    release_allocations(session=session, job_id=job.id, now=now)
    rows = [
        AllocationRow(
            job_id=job.id, node_id=node_id, gpu_type=gpu_type, gpus=gpus,
            plan_rank=plan_rank, created_at=now,
        )
        for node_id, gpus in placement
    ]
    session.add_all(rows)
    job.chosen_plan_rank = plan_rank
    job.updated_at = now
    session.flush()
    return rows


def release_allocations(*, session: Session, job_id: str, now: datetime) -> int:
    """Mark the job's held GPUs as released; returns how many rows changed."""
    result = session.execute(
        sa.update(AllocationRow)
        .where(AllocationRow.job_id == job_id, AllocationRow.released_at.is_(None))
        .values(released_at=now)
        .execution_options(synchronize_session=False)
    )
    return int(result.rowcount or 0)


def active_allocations(*, session: Session, job_id: str | None = None) -> list[AllocationRow]:
    """Allocation rows still held (all jobs, or one)."""
    stmt = sa.select(AllocationRow).where(AllocationRow.released_at.is_(None))
    if job_id is not None:
        stmt = stmt.where(AllocationRow.job_id == job_id)
    return list(session.scalars(stmt.order_by(AllocationRow.id)))


# -- events -------------------------------------------------------------------------------
def append_event(
    *,
    session: Session,
    job_id: str,
    kind: str,
    message: str = "",
    state: str | None = None,
    data: Mapping[str, Any] | None = None,
    now: datetime | None = None,
) -> Event:
    row = Event(
        job_id=job_id, kind=kind, message=message, state=state,
        data=dict(data) if data is not None else None, at=now or utcnow(),
    )
    session.add(row)
    return row


def list_events(
    *, session: Session, job_id: str, after_id: int = 0, limit: int = 100
) -> list[Event]:
    """A job's events in order, those with id > ``after_id`` (cursor pagination)."""
    return list(
        session.scalars(
            sa.select(Event).where(Event.job_id == job_id, Event.id > after_id)
            .order_by(Event.id).limit(limit)
        )
    )


# -- nodes --------------------------------------------------------------------------------
def upsert_node(
    *,
    session: Session,
    node_id: str,
    gpu_type: str,
    gpu_memory: int,
    total_gpus: int,
    now: datetime,
    interconnect: str = "pcie",
    intra_bw_gbs: float | None = None,
    labels: Mapping[str, Any] | None = None,
    alive: bool = True,
) -> NodeRow:
    """Insert or refresh a node as the cluster reports it."""
    row = session.get(NodeRow, node_id)
    if row is None:
        row = NodeRow(id=node_id, created_at=now)
        session.add(row)
    row.gpu_type = gpu_type
    row.gpu_memory = gpu_memory
    row.total_gpus = total_gpus
    row.interconnect = interconnect
    row.intra_bw_gbs = intra_bw_gbs
    row.labels = dict(labels) if labels is not None else None
    row.alive = alive
    row.updated_at = now
    session.flush()
    return row


def list_nodes(*, session: Session, alive_only: bool = True) -> list[NodeRow]:
    stmt = sa.select(NodeRow).order_by(NodeRow.id)
    if alive_only:
        stmt = stmt.where(NodeRow.alive.is_(True))
    return list(session.scalars(stmt))


# -- statistics ---------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class UtilisationSeries:
    """Fraction of one GPU type's GPUs allocated, per time bucket."""

    gpu_type: str
    capacity_gpus: int
    bucket_starts: tuple[datetime, ...]
    used_fraction: tuple[float, ...]

    @property
    def mean(self) -> float:
        return sum(self.used_fraction) / len(self.used_fraction) if self.used_fraction else 0.0


@dataclass(frozen=True, slots=True)
class JobStats:
    """What the admin statistics endpoint reports, over ``[now - window, now]``."""

    now: datetime
    window_s: float
    bucket_s: float
    utilisation: tuple[UtilisationSeries, ...]
    jobs_by_state: dict[str, int]
    queue_length: int
    avg_jct_s: float | None
    avg_queueing_s: float | None
    deadline_jobs: int
    deadline_met: int
    finished_in_window: int
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def deadline_hit_rate(self) -> float | None:
        return self.deadline_met / self.deadline_jobs if self.deadline_jobs else None


def seconds_between(later: Any, earlier: Any, dialect: str) -> sa.ColumnElement[float]:
    """``later - earlier`` in seconds, in SQL. SQLite stores timestamps as text and its
    ``julianday`` is a double of ~2.46e6 days (resolution ~50 µs), so there the difference
    is rounded to the millisecond."""
    if dialect == "sqlite":
        return sa.func.round(
            (sa.func.julianday(later) - sa.func.julianday(earlier)) * 86400.0, 3)
    return sa.extract("epoch", later - earlier)


def _greatest(a: Any, b: Any, dialect: str) -> sa.ColumnElement[Any]:
    return sa.func.max(a, b) if dialect == "sqlite" else sa.func.greatest(a, b)


def _least(a: Any, b: Any, dialect: str) -> sa.ColumnElement[Any]:
    return sa.func.min(a, b) if dialect == "sqlite" else sa.func.least(a, b)


def _utilisation(
    session: Session, *, start: datetime, now: datetime, bucket_s: float, buckets: int,
) -> dict[str, list[float]]:
    """GPU-seconds allocated per (GPU type, bucket) over ``[start, now]``, summed in SQL:
    the allocations overlapping the window, clipped to it, joined with the bucket numbers
    (a recursive CTE) and their overlaps summed. The clipped spans are a materialised CTE:
    inlined into the join, SQLite recomputed them for every bucket."""
    dialect = session.get_bind().dialect.name
    a = AllocationRow
    lo = seconds_between(_greatest(a.created_at, sa.literal(start, UTCDateTime), dialect),
                         sa.literal(start, UTCDateTime), dialect)
    hi = seconds_between(
        _least(sa.func.coalesce(a.released_at, sa.literal(now, UTCDateTime)),
               sa.literal(now, UTCDateTime), dialect),
        sa.literal(start, UTCDateTime), dialect)
    spans = (
        sa.select(a.gpu_type.label("gpu_type"), a.gpus.label("gpus"), lo.label("lo"),
                  hi.label("hi"))
        .where(a.created_at < now, sa.or_(a.released_at.is_(None), a.released_at > start))
        .cte("spans").prefix_with("MATERIALIZED")  # computed once, not once per bucket
    )
    seq = sa.select(sa.literal(0).label("b")).cte("bucket_numbers", recursive=True)
    seq = seq.union_all(sa.select(seq.c.b + 1).where(seq.c.b < buckets - 1))
    b_lo = seq.c.b * bucket_s
    b_hi = b_lo + bucket_s
    overlap = _least(spans.c.hi, b_hi, dialect) - _greatest(spans.c.lo, b_lo, dialect)
    stmt = (
        sa.select(spans.c.gpu_type, seq.c.b, sa.func.sum(spans.c.gpus * overlap))
        .select_from(spans.join(seq, sa.and_(spans.c.lo < b_hi, spans.c.hi > b_lo)))
        .group_by(spans.c.gpu_type, seq.c.b)
    )
    used: dict[str, list[float]] = {}
    for gpu_type, b, gpu_s in session.execute(stmt):
        used.setdefault(gpu_type, [0.0] * buckets)[int(b)] = float(gpu_s or 0.0)
    return used


def job_stats(*, session: Session, now: datetime, window_s: float, buckets: int) -> JobStats:
    """Utilisation by GPU type (from allocation history against current node capacity),
    queue length, average JCT and queueing time of jobs finished/placed in the window,
    the deadline hit rate, and jobs by state.

    Every figure is an aggregate computed by the database (no job or allocation row is
    loaded into Python): the cost is the database's scan of the window, not the history
    shipped to the API process."""
    dialect = session.get_bind().dialect.name
    start = now - timedelta(seconds=window_s)
    bucket_s = window_s / buckets
    capacity: dict[str, int] = {}
    for node in list_nodes(session=session):
        capacity[node.gpu_type] = capacity.get(node.gpu_type, 0) + node.total_gpus
    used = {t: [0.0] * buckets for t in capacity}
    used.update(_utilisation(session, start=start, now=now, bucket_s=bucket_s,
                             buckets=buckets))
    starts = tuple(start + timedelta(seconds=b * bucket_s) for b in range(buckets))
    utilisation = tuple(
        UtilisationSeries(
            gpu_type=t,
            capacity_gpus=capacity.get(t, 0),
            bucket_starts=starts,
            used_fraction=tuple(
                (gs / (capacity[t] * bucket_s)) if capacity.get(t) else 0.0 for gs in used[t]
            ),
        )
        for t in sorted(used)
    )

    jct = seconds_between(Job.finished_at, Job.created_at, dialect)
    finished, avg_jct = session.execute(
        sa.select(sa.func.count(),
                  sa.func.avg(sa.case((Job.state == JobState.SUCCEEDED, jct), else_=None)))
        .where(Job.finished_at.is_not(None), Job.finished_at >= start)
    ).one()
    avg_wait = session.scalar(
        sa.select(sa.func.avg(seconds_between(Job.placed_at, Job.created_at, dialect)))
        .where(Job.placed_at.is_not(None), Job.placed_at >= start)
    )
    # A deadline counts once it is decided: the job ended (not by cancellation), or the
    # deadline passed while it was still live. It is met when the job succeeded in time.
    met_case = sa.case((sa.and_(Job.state == JobState.SUCCEEDED, Job.finished_at.is_not(None),
                                Job.finished_at <= Job.deadline_at), 1), else_=0)
    deadline_jobs, deadline_met = session.execute(
        sa.select(sa.func.count(), sa.func.coalesce(sa.func.sum(met_case), 0)).where(
            Job.deadline_at.is_not(None),
            Job.state != JobState.CANCELLED,
            sa.or_(
                sa.and_(Job.finished_at.is_not(None), Job.finished_at >= start),
                sa.and_(Job.finished_at.is_(None), Job.deadline_at >= start,
                        Job.deadline_at <= now),
            ),
        )
    ).one()
    by_state = count_jobs_by_state(session=session)
    return JobStats(
        now=now, window_s=window_s, bucket_s=bucket_s, utilisation=utilisation,
        jobs_by_state=by_state, queue_length=by_state[JobState.PENDING.value],
        avg_jct_s=None if avg_jct is None else float(avg_jct),
        avg_queueing_s=None if avg_wait is None else float(avg_wait),
        deadline_jobs=int(deadline_jobs), deadline_met=int(deadline_met),
        finished_in_window=int(finished),
    )


# -- accounting: GPU-hours per job and per user ---------------------------------------------
def _held_seconds(session: Session, now: datetime) -> sa.ColumnElement[float]:
    """An allocation row's GPU-seconds: its GPUs × (release, or ``now`` while held, −
    start), in SQL."""
    end = sa.func.coalesce(AllocationRow.released_at, sa.literal(now, UTCDateTime()))
    return AllocationRow.gpus * seconds_between(end, AllocationRow.created_at,
                                                session.get_bind().dialect.name)


def gpu_seconds_by_job(*, session: Session, job_ids: Sequence[str],
                       now: datetime) -> dict[str, float]:
    """GPU-seconds each of ``job_ids`` has held (released allocations, and the held ones up
    to ``now``), summed in SQL; jobs that never held a GPU are absent."""
    if not job_ids:
        return {}
    stmt = (sa.select(AllocationRow.job_id, sa.func.sum(_held_seconds(session, now)))
            .where(AllocationRow.job_id.in_(list(job_ids))).group_by(AllocationRow.job_id))
    return {job_id: float(s or 0.0) for job_id, s in session.execute(stmt)}


@dataclass(frozen=True, slots=True)
class UserUsage:
    """One user's jobs and GPU use (``user_usage``)."""

    owner: str
    jobs: int
    running: int
    """jobs holding GPUs (placed, starting, running, resizing)"""
    queued: int
    """pending jobs"""
    gpus_held: int
    gpu_seconds: float
    """all GPU-seconds the user's jobs have held (with ``since``: from then on)"""


def user_usage(*, session: Session, now: datetime,
               since: datetime | None = None) -> list[UserUsage]:
    """Per owner, busiest first (GPU-seconds, then name): job counts by state class and GPUs
    held now (grouped in SQL over ``jobs``), GPU-seconds (grouped in SQL over
    ``allocations`` joined with ``jobs``; with ``since``, clipped to ``[since, now]``)."""
    counts = session.execute(
        sa.select(Job.owner, sa.func.count(),
                  sa.func.sum(sa.case((Job.state.in_(HOLDING), 1), else_=0)),
                  sa.func.sum(sa.case((Job.state == JobState.PENDING, 1), else_=0)))
        .group_by(Job.owner)).all()
    dialect = session.get_bind().dialect.name
    held_now = sa.case((AllocationRow.released_at.is_(None), AllocationRow.gpus), else_=0)
    if since is None:
        used = _held_seconds(session, now)
    else:
        start = _greatest(AllocationRow.created_at, sa.literal(since, UTCDateTime()), dialect)
        end = sa.func.coalesce(AllocationRow.released_at, sa.literal(now, UTCDateTime()))
        span = seconds_between(end, start, dialect)
        used = AllocationRow.gpus * sa.case((span > 0, span), else_=0.0)
    gpu = {owner: (int(h or 0), float(s or 0.0)) for owner, h, s in session.execute(
        sa.select(Job.owner, sa.func.sum(held_now), sa.func.sum(used))
        .join(Job, Job.id == AllocationRow.job_id).group_by(Job.owner))}
    out = [UserUsage(owner=o, jobs=int(n), running=int(r or 0), queued=int(q or 0),
                     gpus_held=gpu.get(o, (0, 0.0))[0], gpu_seconds=gpu.get(o, (0, 0.0))[1])
           for o, n, r, q in counts]
    return sorted(out, key=lambda u: (-u.gpu_seconds, u.owner))
