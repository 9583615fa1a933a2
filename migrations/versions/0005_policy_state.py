"""Policy state that must survive a restart: the deadline policies' admission of each job.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-24

* ``jobs.policy_state``: the policy's note about the job (``scheduler.policy.PolicyNote``'s
  ``data``: for ``elastic``/``elasticflow``, whether it was admitted with a deadline
  guarantee, its pinned GPU type and its entry in the opportunity-cost window), written when
  the policy changes it and handed back to the policy's ``restore`` after a restart; NULL
  for jobs the policy keeps nothing about.

Frozen: explicit ``op.*`` calls, never the live models.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("policy_state", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("policy_state")
