"""A job's measured peak memory beside the prediction, and its out-of-memory correction.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-25

* ``jobs.memory``: what the training workers measured (per-rank tensor peak, and the
  allocator's reserve on CUDA), the prediction of the plan that ran, and the cumulative
  correction of the job's predicted tensors after an out-of-memory run
  (``orchestrator.oom``; the service applies it to the stored plans again after a
  restart); NULL before the first report.

Frozen: explicit ``op.*`` calls, never the live models.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("memory", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("memory")
