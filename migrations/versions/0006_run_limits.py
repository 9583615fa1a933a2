"""Run-time limits: each job's limit and the time it has spent running.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-25

* ``jobs.max_runtime_s``: the most seconds the job may spend RUNNING (what it asked for, or
  the operator's default, fixed at submission); NULL: no limit.
* ``jobs.running_s``: the seconds it has spent RUNNING so far, over every launch, restart
  and resize, as the control loop last reported them (with its progress and when it stops
  running); a restarted service hands it back to the loop, so the count goes on. 0 for the
  jobs stored before this revision.

Frozen: explicit ``op.*`` calls, never the live models.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("max_runtime_s", sa.Float(), nullable=True))
        batch.add_column(sa.Column("running_s", sa.Float(), nullable=False,
                                   server_default=sa.text("0")))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("running_s")
        batch.drop_column("max_runtime_s")
