"""Initial schema: tokens, jobs, plans, allocations, events, nodes.

Revision ID: 0001
Revises:
Create Date: 2026-11-22

Frozen: written as explicit ``op.*`` calls and never imports the live models, so later
model changes cannot silently change what this revision creates.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
# orchestrator.states.JobState values, frozen here as they were at this revision.
JOB_STATES = (
    "pending", "placed", "starting", "running", "resizing", "succeeded", "failed", "cancelled",
)


def _ts(name: str, nullable: bool = False) -> sa.Column:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def upgrade() -> None:
    op.create_table(
        "tokens",
        sa.Column("id", BIG_ID, autoincrement=True, nullable=False),
        sa.Column("owner", sa.String(64), nullable=False),
        sa.Column("token_hash", sa.String(64), nullable=False),
        sa.Column("is_admin", sa.Boolean(), nullable=False),
        sa.Column("label", sa.String(128), nullable=True),
        _ts("created_at"),
        _ts("revoked_at", nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_tokens"),
        sa.UniqueConstraint("token_hash", name="uq_tokens_token_hash"),
    )
    op.create_index("ix_tokens_owner", "tokens", ["owner"])

    op.create_table(
        "jobs",
        sa.Column("id", sa.String(32), nullable=False),
        sa.Column("owner", sa.String(64), nullable=False),
        sa.Column("name", sa.String(128), nullable=True),
        sa.Column(
            "state",
            sa.Enum(
                *JOB_STATES,
                name="ck_jobs_state",
                native_enum=False,
                create_constraint=True,
                length=16,
            ),
            nullable=False,
        ),
        sa.Column("state_reason", sa.Text(), nullable=False),
        sa.Column("model_name", sa.String(128), nullable=False),
        sa.Column("model_spec", sa.JSON(), nullable=False),
        sa.Column("training", sa.JSON(), nullable=False),
        sa.Column("request", sa.JSON(), nullable=False),
        sa.Column("request_hash", sa.String(64), nullable=False),
        sa.Column("idempotency_key", sa.String(128), nullable=True),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column("deadline_s", sa.Float(), nullable=True),
        _ts("deadline_at", nullable=True),
        sa.Column("entrypoint", sa.String(1024), nullable=True),
        sa.Column("total_steps", sa.BigInteger(), nullable=False),
        sa.Column("steps_done", sa.Float(), nullable=False),
        sa.Column("chosen_plan_rank", sa.Integer(), nullable=True),
        _ts("created_at"),
        _ts("updated_at"),
        _ts("placed_at", nullable=True),
        _ts("started_at", nullable=True),
        _ts("finished_at", nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_jobs"),
        sa.UniqueConstraint("owner", "idempotency_key", name="uq_jobs_owner_idempotency_key"),
    )
    op.create_index("ix_jobs_owner_created_at", "jobs", ["owner", "created_at"])
    op.create_index("ix_jobs_state_created_at", "jobs", ["state", "created_at"])

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

    op.create_table(
        "allocations",
        sa.Column("id", BIG_ID, autoincrement=True, nullable=False),
        sa.Column("job_id", sa.String(32), nullable=False),
        sa.Column("node_id", sa.String(128), nullable=False),
        sa.Column("gpu_type", sa.String(64), nullable=False),
        sa.Column("gpus", sa.Integer(), nullable=False),
        sa.Column("plan_rank", sa.Integer(), nullable=True),
        _ts("created_at"),
        _ts("released_at", nullable=True),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name="fk_allocations_job_id_jobs", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name="pk_allocations"),
    )
    op.create_index("ix_allocations_job_id", "allocations", ["job_id"])
    op.create_index("ix_allocations_node_id", "allocations", ["node_id"])
    op.create_index("ix_allocations_released_at", "allocations", ["released_at"])

    op.create_table(
        "events",
        sa.Column("id", BIG_ID, autoincrement=True, nullable=False),
        sa.Column("job_id", sa.String(32), nullable=False),
        _ts("at"),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("state", sa.String(16), nullable=True),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("data", sa.JSON(), nullable=True),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name="fk_events_job_id_jobs", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name="pk_events"),
    )
    op.create_index("ix_events_job_id_id", "events", ["job_id", "id"])

    op.create_table(
        "nodes",
        sa.Column("id", sa.String(128), nullable=False),
        sa.Column("gpu_type", sa.String(64), nullable=False),
        sa.Column("gpu_memory", sa.BigInteger(), nullable=False),
        sa.Column("total_gpus", sa.Integer(), nullable=False),
        sa.Column("interconnect", sa.String(16), nullable=False),
        sa.Column("intra_bw_gbs", sa.Float(), nullable=True),
        sa.Column("labels", sa.JSON(), nullable=True),
        sa.Column("alive", sa.Boolean(), nullable=False),
        _ts("created_at"),
        _ts("updated_at"),
        sa.PrimaryKeyConstraint("id", name="pk_nodes"),
    )


def downgrade() -> None:
    op.drop_table("nodes")
    op.drop_index("ix_events_job_id_id", table_name="events")
    op.drop_table("events")
    op.drop_index("ix_allocations_released_at", table_name="allocations")
    op.drop_index("ix_allocations_node_id", table_name="allocations")
    op.drop_index("ix_allocations_job_id", table_name="allocations")
    op.drop_table("allocations")
    op.drop_table("plans")
    op.drop_index("ix_jobs_state_created_at", table_name="jobs")
    op.drop_index("ix_jobs_owner_created_at", table_name="jobs")
    op.drop_table("jobs")
    op.drop_index("ix_tokens_owner", table_name="tokens")
    op.drop_table("tokens")
