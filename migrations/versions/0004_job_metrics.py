"""Per-job training metrics: the last step windows (loss, tokens/s, step time vs predicted).

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-24

* ``jobs.metrics``: a JSON list of the job's most recent step windows (one per progress
  report, at most ``service.runner.METRIC_WINDOWS``), NULL until the first report.

Frozen: explicit ``op.*`` calls, never the live models.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("metrics", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("metrics")
