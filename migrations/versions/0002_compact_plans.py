"""Plans stored compactly: one JSON list per job (``jobs.plans``) instead of a row per plan.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22

A submission used to insert one ``plans`` row per ranked plan (up to 64) and a read joined
them back; every consumer reads a job's plans whole and in rank order, so one JSON document
per job does the same with one write and no join. ``plan_count`` keeps the number so
listings need not load the document. Existing rows are copied into the document (and back
on downgrade).

Frozen: explicit ``op.*`` calls and table stubs, never the live models.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
_PLAN_COLUMNS = (
    "gpu_type", "num_gpus", "tp", "pp", "dp", "micro_batch", "recompute", "zero_stage",
    "peak_memory_bytes", "required_bytes", "step_time_s", "job_time_s", "gpu_seconds",
)

_jobs = sa.table(
    "jobs", sa.column("id", sa.String(32)), sa.column("plans", sa.JSON()),
    sa.column("plan_count", sa.Integer()),
)
_plans = sa.table(
    "plans", sa.column("job_id", sa.String(32)), sa.column("rank", sa.Integer()),
    sa.column("detail", sa.JSON()), *(sa.column(c) for c in _PLAN_COLUMNS),
)


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("plans", sa.JSON(), nullable=False,
                                   server_default=sa.text("'[]'")))
        batch.add_column(sa.Column("plan_count", sa.Integer(), nullable=False,
                                   server_default=sa.text("0")))
    conn = op.get_bind()
    by_job: dict[str, list[dict]] = {}
    for job_id, rank, detail in conn.execute(
        sa.select(_plans.c.job_id, _plans.c.rank, _plans.c.detail)
        .order_by(_plans.c.job_id, _plans.c.rank)
    ):
        by_job.setdefault(job_id, []).append({**dict(detail or {}), "rank": rank})
    for job_id, plans in by_job.items():
        conn.execute(sa.update(_jobs).where(_jobs.c.id == job_id)
                     .values(plans=plans, plan_count=len(plans)))
    op.drop_table("plans")


def downgrade() -> None:
    op.create_table(
        "plans",
        sa.Column("id", BIG_ID, autoincrement=True, nullable=False),
        sa.Column("job_id", sa.String(32), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.Column("gpu_type", sa.String(64), nullable=False),
        sa.Column("num_gpus", sa.Integer(), nullable=False),
        sa.Column("tp", sa.Integer(), nullable=False),
        sa.Column("pp", sa.Integer(), nullable=False),
        sa.Column("dp", sa.Integer(), nullable=False),
        sa.Column("micro_batch", sa.Integer(), nullable=False),
        sa.Column("recompute", sa.String(16), nullable=False),
        sa.Column("zero_stage", sa.Integer(), nullable=False),
        sa.Column("peak_memory_bytes", sa.BigInteger(), nullable=False),
        sa.Column("required_bytes", sa.BigInteger(), nullable=False),
        sa.Column("step_time_s", sa.Float(), nullable=False),
        sa.Column("job_time_s", sa.Float(), nullable=False),
        sa.Column("gpu_seconds", sa.Float(), nullable=False),
        sa.Column("detail", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name="fk_plans_job_id_jobs", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name="pk_plans"),
        sa.UniqueConstraint("job_id", "rank", name="uq_plans_job_id_rank"),
    )
    conn = op.get_bind()
    for job_id, plans in conn.execute(sa.select(_jobs.c.id, _jobs.c.plans)):
        rows = [
            {"job_id": job_id, "rank": i, "detail": p, **{c: p[c] for c in _PLAN_COLUMNS}}
            for i, p in enumerate(plans or [], start=1)
        ]
        if rows:
            conn.execute(sa.insert(_plans), rows)
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("plan_count")
        batch.drop_column("plans")
