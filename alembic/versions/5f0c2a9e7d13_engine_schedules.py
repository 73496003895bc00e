"""The host's own table: the engine's schedules.

Revision ID: 5f0c2a9e7d13
Revises:
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "5f0c2a9e7d13"
down_revision = None
branch_labels = ("engine",)
# The host's history needs admission's tables first (it could reference
# them); alembic then upgrades the admission branch along with its own.
depends_on = "admission"


def upgrade() -> None:
    op.create_table(
        "engine_schedules",
        sa.Column("id", sa.String(36), primary_key=True),
        sa.Column("workflow_id", sa.String(255), nullable=False),
        sa.Column("next_fire_at", sa.DateTime(timezone=True), nullable=True),
    )


def downgrade() -> None:
    op.drop_table("engine_schedules")
