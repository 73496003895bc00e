"""A retry's backoff on durable jobs (docs/jobs.md, "Backoff"): one nullable column, DDL only.

``worker_jobs.not_before``: while a job is in ``retry_wait``, no claim takes it
before this time.  Existing rows are left exactly as they are (NULL: no wait),
so a job that was waiting to be retried stays claimable as it was.  The
column is not indexed: claims find candidates through ``ix_worker_jobs_scope_state``
and filter on it.  Downgrading drops the column; a job still waiting out a
backoff then becomes claimable at once, which an older build did anyway, so
the downgrade is not refused.

Revision ID: admission_0005
Revises: admission_0004
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "admission_0005"
down_revision = "admission_0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("worker_jobs") as batch:
        batch.add_column(sa.Column("not_before", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    # SQLite 3.35+ drops a column in place; recreating worker_jobs would mean dropping a
    # table four others reference.
    with op.batch_alter_table("worker_jobs", recreate="never") as batch:
        batch.drop_column("not_before")
