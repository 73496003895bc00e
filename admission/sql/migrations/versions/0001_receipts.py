"""The receipt schema before intents: the shape legacy databases have.

Commands carry a nullable ``request_id`` (a raw key or a token on legacy
rows, NULL for unkeyed signals) under the unique index
``workflow_commands_request_lookup``, and no digest columns.

Revision ID: admission_0001
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "admission_0001"
down_revision = None
branch_labels = ("admission",)
depends_on = None

TIME = sa.DateTime(timezone=True)
POSITION = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "workflow_instances",
        sa.Column("id", sa.String(36), nullable=False),
        sa.Column("namespace", sa.String(255), nullable=False),
        sa.Column("workflow_id", sa.String(255), nullable=False),
        sa.Column("current_run_id", sa.String(36), nullable=True),
        sa.Column("created_at", TIME, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_workflow_instances"),
        sa.UniqueConstraint("namespace", "workflow_id", name="uq_workflow_instances_namespace_workflow_id"),
    )
    op.create_table(
        "workflow_runs",
        sa.Column("id", sa.String(36), nullable=False),
        sa.Column("instance_id", sa.String(36), nullable=False),
        sa.Column("run_number", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("continued_from_run_id", sa.String(36), nullable=True),
        sa.Column("started_at", TIME, nullable=False),
        sa.Column("closed_at", TIME, nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_workflow_runs"),
        sa.ForeignKeyConstraint(
            ["instance_id"], ["workflow_instances.id"], name="fk_workflow_runs_instance_id_workflow_instances"
        ),
        sa.UniqueConstraint("instance_id", "run_number", name="uq_workflow_runs_instance_id_run_number"),
    )
    op.create_table(
        "workflow_commands",
        sa.Column("id", sa.String(36), nullable=False),
        sa.Column("instance_id", sa.String(36), nullable=False),
        sa.Column("run_id", sa.String(36), nullable=True),
        sa.Column("command_sequence", sa.Integer(), nullable=False),
        sa.Column("command_type", sa.String(16), nullable=False),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("target_scope", sa.String(8), nullable=False),
        sa.Column("requested_run_id", sa.String(36), nullable=True),
        sa.Column("request_id", sa.String(191), nullable=True),
        sa.Column("context", sa.LargeBinary(), nullable=True),
        sa.Column("arguments", sa.LargeBinary(), nullable=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("outcome", sa.String(32), nullable=False),
        sa.Column("rejection_reason", sa.String(64), nullable=True),
        sa.Column("created_at", TIME, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_workflow_commands"),
        sa.ForeignKeyConstraint(
            ["instance_id"],
            ["workflow_instances.id"],
            name="fk_workflow_commands_instance_id_workflow_instances",
        ),
        sa.ForeignKeyConstraint(
            ["run_id"], ["workflow_runs.id"], name="fk_workflow_commands_run_id_workflow_runs"
        ),
        sa.UniqueConstraint(
            "instance_id", "command_sequence", name="uq_workflow_commands_instance_id_command_sequence"
        ),
    )
    op.create_index(
        "workflow_commands_request_lookup",
        "workflow_commands",
        ["instance_id", "command_type", "request_id"],
        unique=True,
    )
    op.create_index("ix_workflow_commands_run_id", "workflow_commands", ["run_id"])
    op.create_table(
        "workflow_updates",
        sa.Column("id", sa.String(36), nullable=False),
        sa.Column("command_id", sa.String(36), nullable=False),
        sa.Column("instance_id", sa.String(36), nullable=False),
        sa.Column("run_id", sa.String(36), nullable=False),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("result", sa.LargeBinary(), nullable=True),
        sa.Column("failure", sa.String(2048), nullable=True),
        sa.Column("accepted_at", TIME, nullable=False),
        sa.Column("completed_at", TIME, nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_workflow_updates"),
        sa.ForeignKeyConstraint(
            ["command_id"], ["workflow_commands.id"], name="fk_workflow_updates_command_id_workflow_commands"
        ),
        sa.ForeignKeyConstraint(
            ["instance_id"],
            ["workflow_instances.id"],
            name="fk_workflow_updates_instance_id_workflow_instances",
        ),
        sa.ForeignKeyConstraint(
            ["run_id"], ["workflow_runs.id"], name="fk_workflow_updates_run_id_workflow_runs"
        ),
        sa.UniqueConstraint("command_id", name="uq_workflow_updates_command_id"),
    )
    op.create_index("ix_workflow_updates_run_id", "workflow_updates", ["run_id"])
    op.create_table(
        "workflow_history_events",
        sa.Column("position", POSITION, nullable=False, autoincrement=True),
        sa.Column("tx_id", sa.BigInteger(), nullable=False),
        sa.Column("namespace", sa.String(255), nullable=False),
        sa.Column("instance_id", sa.String(36), nullable=False),
        sa.Column("run_id", sa.String(36), nullable=True),
        sa.Column("event_type", sa.String(64), nullable=False),
        sa.Column("command_id", sa.String(36), nullable=True),
        sa.Column("update_id", sa.String(36), nullable=True),
        sa.Column("payload", sa.LargeBinary(), nullable=False),
        sa.Column("recorded_at", TIME, nullable=False),
        sa.PrimaryKeyConstraint("position", name="pk_workflow_history_events"),
        sa.ForeignKeyConstraint(
            ["instance_id"],
            ["workflow_instances.id"],
            name="fk_workflow_history_events_instance_id_workflow_instances",
        ),
        # Positions are never reused, even after pruning the newest events:
        # a reader's cursor must not be passed by a recycled position.
        sqlite_autoincrement=True,
    )
    op.create_index(
        "ix_workflow_history_events_instance_id_position",
        "workflow_history_events",
        ["instance_id", "position"],
    )
    op.create_index(
        "ix_workflow_history_events_tx_id_position", "workflow_history_events", ["tx_id", "position"]
    )


def downgrade() -> None:
    op.drop_table("workflow_history_events")
    op.drop_table("workflow_updates")
    op.drop_index("workflow_commands_request_lookup", table_name="workflow_commands")
    op.drop_table("workflow_commands")
    op.drop_table("workflow_runs")
    op.drop_table("workflow_instances")
