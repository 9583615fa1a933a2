"""SQLAlchemy 2.0 models: jobs (with their ranked plans), allocations, events, nodes, tokens.

The schema itself is created only by Alembic (``migrations/versions``); these classes must
match it, which ``tests/service/test_migrations.py`` checks with ``compare_metadata``.

A job's ranked plans are one JSON document on its row (revision 0002), written once at
submission and read whole.

What restart safety needs is here: the job's state is an enum column with the reason for it,
``updated_at`` on every mutable row, one allocation row per (job, node) with ``released_at``
NULL while held, an append-only event log, and the idempotency key unique per owner.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship
from sqlalchemy.types import TypeDecorator

from orchestrator.states import JobState

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def utcnow() -> datetime:
    """Timezone-aware now in UTC (the only clock the models use by default)."""
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator[datetime]):
    """A timezone-aware UTC timestamp on every backend.

    SQLite stores no offset and hands back naive values; this type stores UTC and always
    returns aware datetimes, so arithmetic is the same on SQLite and PostgreSQL.
    """

    impl = sa.DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: sa.Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to a UTC column")
        return value.astimezone(UTC)

    def process_result_value(
        self, value: datetime | None, dialect: sa.Dialect
    ) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)


JOB_STATE_TYPE = sa.Enum(
    JobState,
    name="state",
    native_enum=False,
    create_constraint=True,
    length=16,
    values_callable=lambda enum: [member.value for member in enum],
    validate_strings=True,
)

BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
"""64-bit surrogate keys; SQLite only auto-increments an INTEGER PRIMARY KEY."""


class Base(DeclarativeBase):
    metadata = sa.MetaData(naming_convention=NAMING_CONVENTION)


class Token(Base):
    """An API token. Only its SHA-256 is stored; the token itself is shown once at creation."""

    __tablename__ = "tokens"

    id: Mapped[int] = mapped_column(BIG_ID, primary_key=True, autoincrement=True)
    owner: Mapped[str] = mapped_column(sa.String(64), index=True)
    token_hash: Mapped[str] = mapped_column(sa.String(64), unique=True)
    is_admin: Mapped[bool] = mapped_column(sa.Boolean, default=False)
    label: Mapped[str | None] = mapped_column(sa.String(128))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    """The token stops working at this instant (None: never; revision 0003)."""


def _set_only(column: str) -> dict[str, Any]:
    """A partial index's options: only the rows where ``column`` is set."""
    where = sa.text(f"{column} IS NOT NULL")
    return {"sqlite_where": where, "postgresql_where": where}


class Job(Base):
    """One submitted training job and where it stands."""

    __tablename__ = "jobs"
    __table_args__ = (
        sa.UniqueConstraint("owner", "idempotency_key"),
        sa.Index("ix_jobs_owner_created_at", "owner", "created_at"),
        sa.Index("ix_jobs_state_created_at", "state", "created_at"),
        sa.Index("ix_jobs_owner_state", "owner", "state"),
        sa.Index("ix_jobs_placed_at", "placed_at", **_set_only("placed_at")),
        sa.Index("ix_jobs_finished_at", "finished_at", **_set_only("finished_at")),
    )

    id: Mapped[str] = mapped_column(sa.String(32), primary_key=True)
    owner: Mapped[str] = mapped_column(sa.String(64))
    name: Mapped[str | None] = mapped_column(sa.String(128))
    state: Mapped[JobState] = mapped_column(JOB_STATE_TYPE, default=JobState.PENDING)
    state_reason: Mapped[str] = mapped_column(sa.Text, default="")
    model_name: Mapped[str] = mapped_column(sa.String(128))
    model_spec: Mapped[dict[str, Any]] = mapped_column(sa.JSON)
    training: Mapped[dict[str, Any]] = mapped_column(sa.JSON)
    request: Mapped[dict[str, Any]] = mapped_column(sa.JSON)
    request_hash: Mapped[str] = mapped_column(sa.String(64))
    idempotency_key: Mapped[str | None] = mapped_column(sa.String(128))
    priority: Mapped[int] = mapped_column(sa.Integer, default=0)
    deadline_s: Mapped[float | None] = mapped_column(sa.Float)
    deadline_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    entrypoint: Mapped[str | None] = mapped_column(sa.String(1024))
    max_runtime_s: Mapped[float | None] = mapped_column(sa.Float)
    """The most seconds the job may spend RUNNING (asked for, or the operator's default;
    revision 0006); None: no limit."""
    running_s: Mapped[float] = mapped_column(sa.Float, default=0.0,
                                             server_default=sa.text("0"))
    """Seconds the job has spent RUNNING, as the control loop last reported (kept for jobs
    with a run-time limit, so a restarted service goes on counting; revision 0006)."""
    total_steps: Mapped[int] = mapped_column(sa.BigInteger)
    steps_done: Mapped[float] = mapped_column(sa.Float, default=0.0)
    chosen_plan_rank: Mapped[int | None] = mapped_column(sa.Integer)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, onupdate=utcnow)
    placed_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)

    plans: Mapped[list[dict[str, Any]]] = mapped_column(
        sa.JSON, deferred=True, server_default=sa.text("'[]'")
    )
    """The ranked plans, best first: ``Plan.to_dict()`` forms with their ``rank`` (one
    document, loaded only when asked for: ``repositories.get_job(with_plans=True)``)."""
    plan_count: Mapped[int] = mapped_column(sa.Integer, server_default=sa.text("0"))
    metrics: Mapped[list[dict[str, Any]] | None] = mapped_column(sa.JSON, nullable=True)
    """The most recent step windows, oldest first (``service.runner.metric_window``; at most
    ``METRIC_WINDOWS``; revision 0004); None before the first progress report."""
    policy_state: Mapped[dict[str, Any] | None] = mapped_column(sa.JSON, nullable=True)
    """The policy's note about the job (``scheduler.policy.PolicyNote.data``: e.g. admitted
    with a deadline guarantee), handed back to the policy after a restart (revision 0005);
    None when the policy keeps nothing about it."""
    memory: Mapped[dict[str, Any] | None] = mapped_column(sa.JSON, nullable=True)
    """Measured peak memory beside the prediction of the plan that ran, and the correction
    of the job's predicted tensors after an out-of-memory run (``service.job_memory``;
    revision 0007); None before the first report."""
    allocations: Mapped[list[AllocationRow]] = relationship(
        back_populates="job", order_by="AllocationRow.id", cascade="all, delete-orphan",
        passive_deletes=True,
    )


class AllocationRow(Base):
    """GPUs of one node held by a job; ``released_at`` is NULL while they are held.

    Released rows stay as history (utilisation over time is computed from them). ``node_id``
    is deliberately not a foreign key: nodes come from Ray and may vanish while history stays.
    """

    __tablename__ = "allocations"
    __table_args__ = (
        sa.Index("ix_allocations_job_id", "job_id"),
        sa.Index("ix_allocations_node_id", "node_id"),
        sa.Index("ix_allocations_released_at", "released_at"),
    )

    id: Mapped[int] = mapped_column(BIG_ID, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(sa.ForeignKey("jobs.id", ondelete="CASCADE"))
    node_id: Mapped[str] = mapped_column(sa.String(128))
    gpu_type: Mapped[str] = mapped_column(sa.String(64))
    gpus: Mapped[int] = mapped_column(sa.Integer)
    plan_rank: Mapped[int | None] = mapped_column(sa.Integer)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    released_at: Mapped[datetime | None] = mapped_column(UTCDateTime)

    job: Mapped[Job] = relationship(back_populates="allocations")


class Event(Base):
    """Append-only log of what happened to a job (submitted, placed, progress, cancelled...)."""

    __tablename__ = "events"
    __table_args__ = (sa.Index("ix_events_job_id_id", "job_id", "id"),)

    id: Mapped[int] = mapped_column(BIG_ID, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(sa.ForeignKey("jobs.id", ondelete="CASCADE"))
    at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    kind: Mapped[str] = mapped_column(sa.String(32))
    state: Mapped[str | None] = mapped_column(sa.String(16))
    message: Mapped[str] = mapped_column(sa.Text, default="")
    data: Mapped[dict[str, Any] | None] = mapped_column(sa.JSON)


class NodeRow(Base):
    """A machine of the cluster as last seen (the Controller refreshes it from Ray)."""

    __tablename__ = "nodes"

    id: Mapped[str] = mapped_column(sa.String(128), primary_key=True)
    gpu_type: Mapped[str] = mapped_column(sa.String(64))
    gpu_memory: Mapped[int] = mapped_column(sa.BigInteger)
    total_gpus: Mapped[int] = mapped_column(sa.Integer)
    interconnect: Mapped[str] = mapped_column(sa.String(16), default="pcie")
    intra_bw_gbs: Mapped[float | None] = mapped_column(sa.Float)
    labels: Mapped[dict[str, Any] | None] = mapped_column(sa.JSON)
    alive: Mapped[bool] = mapped_column(sa.Boolean, default=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, onupdate=utcnow)
