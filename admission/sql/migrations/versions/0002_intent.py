"""Intent columns on commands (contract §3, §6): DDL only, nullable, no backfill.

Existing rows are left exactly as they are; a row without ``intent_digest``
is a legacy receipt.  Downgrading is refused once any receipt has been written
in the new format, because an older writer would then be an unsafe rollback
target (docs/upgrading.md); ``-x allow-unsafe-downgrade=yes`` overrides.

Revision ID: admission_0002
Revises: admission_0001
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import context, op

revision = "admission_0002"
down_revision = "admission_0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("workflow_commands") as batch:
        batch.add_column(sa.Column("intent_digest", sa.String(64), nullable=True))
        batch.add_column(sa.Column("arguments_digest", sa.String(64), nullable=True))
        batch.add_column(sa.Column("intent_encoding", sa.String(16), nullable=True))


def downgrade() -> None:
    written = (
        op.get_bind()
        .execute(sa.text("SELECT count(*) FROM workflow_commands WHERE intent_digest IS NOT NULL"))
        .scalar_one()
    )
    allowed = context.get_x_argument(as_dictionary=True).get("allow-unsafe-downgrade") == "yes"
    if written and not allowed:
        raise RuntimeError(
            f"refusing to downgrade: {written} receipts were written with intent digests, and an "
            "older writer would answer their keys without comparing intent. Drain and upgrade "
            "every writer instead; see docs/upgrading.md"
        )
    with op.batch_alter_table("workflow_commands") as batch:
        batch.drop_column("intent_encoding")
        batch.drop_column("arguments_digest")
        batch.drop_column("intent_digest")
