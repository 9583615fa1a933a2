"""Token expiry, and the indexes that keep quotas and ``/metrics`` off the job history.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-24

* ``tokens.expires_at``: a token stops working at this instant (NULL: never expires).
* ``ix_jobs_owner_state`` (owner, state): a user's queued jobs are counted at submission
  (the ``quota_max_queued`` setting) from the live ones only, not from their history.
* ``ix_jobs_placed_at`` / ``ix_jobs_finished_at``, partial (only rows where the column is
  set, so a submission, which sets neither, does not touch them): ``/metrics`` reads only
  the jobs placed or finished since its previous scrape.

Frozen: explicit ``op.*`` calls, never the live models.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def _partial(column: str) -> dict[str, object]:
    where = sa.text(f"{column} IS NOT NULL")
    return {"sqlite_where": where, "postgresql_where": where}


def upgrade() -> None:
    with op.batch_alter_table("tokens") as batch:
        batch.add_column(sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True))
    op.create_index("ix_jobs_owner_state", "jobs", ["owner", "state"])
    op.create_index("ix_jobs_placed_at", "jobs", ["placed_at"], **_partial("placed_at"))
    op.create_index("ix_jobs_finished_at", "jobs", ["finished_at"], **_partial("finished_at"))


def downgrade() -> None:
    op.drop_index("ix_jobs_finished_at", table_name="jobs")
    op.drop_index("ix_jobs_placed_at", table_name="jobs")
    op.drop_index("ix_jobs_owner_state", table_name="jobs")
    with op.batch_alter_table("tokens") as batch:
        batch.drop_column("expires_at")
