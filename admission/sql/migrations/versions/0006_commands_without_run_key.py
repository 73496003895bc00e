"""Commands without a foreign key to their run, and without the index by run (docs/performance.md).

``workflow_commands.run_id`` keeps its values: no row changes.  What goes is
the constraint ``fk_workflow_commands_run_id_workflow_runs`` and the index
``ix_workflow_commands_run_id`` that it needed (a run's deletion looks for its
commands).  The instance's admission lock already proves the run: runs are
made, closed and removed only under it, and every statement that finds
commands by run also names the instance, whose unique index
``(instance_id, command_sequence)`` serves it (tests/integration/test_command_plans.py).
``admission db check --deep`` checks the reference instead, as it checks the
references no key declares.
On each admission that is one index entry and one lookup of the run fewer
(on PostgreSQL also the share lock on the run's row), measured in
docs/performance.md.

PostgreSQL drops the constraint and the index in place.  SQLite cannot drop a
constraint, so the table is rebuilt: created under a temporary name with the
same columns, in the same order, and the same names for its keys, every row
copied as it is, the old table dropped and the new one renamed, its unique
receipt index made again.  These are plain statements, so ``db upgrade --sql``
renders them.  The downgrade puts the constraint and the index back (SQLite:
the same rebuild); it is refused, changing nothing, if a command names a run
that no longer exists.

Revision ID: admission_0006
Revises: admission_0005
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "admission_0006"
down_revision = "admission_0005"
branch_labels = None
depends_on = None

TABLE = "workflow_commands"
RUN_KEY = "fk_workflow_commands_run_id_workflow_runs"
RUN_INDEX = "ix_workflow_commands_run_id"
_REBUILT = "_admission_0006_workflow_commands"
TIME = sa.DateTime(timezone=True)


def _columns() -> list[sa.Column[object]]:
    # Revision 0001's columns, then 0002's: the order a rebuilt table must keep.
    return [
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
        sa.Column("intent_digest", sa.String(64), nullable=True),
        sa.Column("arguments_digest", sa.String(64), nullable=True),
        sa.Column("intent_encoding", sa.String(16), nullable=True),
    ]


def _rebuild_sqlite(*, run_key: bool) -> None:
    """Copy ``workflow_commands`` into a table of the same shape, with or without the run's key."""
    columns = _columns()
    keys: list[sa.Constraint] = [
        sa.PrimaryKeyConstraint("id", name="pk_workflow_commands"),
        sa.ForeignKeyConstraint(
            ["instance_id"],
            ["workflow_instances.id"],
            name="fk_workflow_commands_instance_id_workflow_instances",
        ),
    ]
    if run_key:
        keys.append(sa.ForeignKeyConstraint(["run_id"], ["workflow_runs.id"], name=RUN_KEY))
    unique = "uq_workflow_commands_instance_id_command_sequence"
    keys.append(sa.UniqueConstraint("instance_id", "command_sequence", name=unique))
    names = ", ".join(c.name for c in columns)
    op.create_table(_REBUILT, *columns, *keys)
    op.execute(f"INSERT INTO {_REBUILT} ({names}) SELECT {names} FROM {TABLE}")
    # Foreign keys are off for the migration (admission.sql._migrate, or the offline script
    # run by hand): the updates' key to the commands names the table, found again after the rename.
    op.drop_table(TABLE)
    op.rename_table(_REBUILT, TABLE)
    op.create_index(
        "workflow_commands_request_lookup", TABLE, ["instance_id", "command_type", "request_id"], unique=True
    )
    if run_key:
        op.create_index(RUN_INDEX, TABLE, ["run_id"])


def upgrade() -> None:
    if op.get_context().dialect.name == "sqlite":
        _rebuild_sqlite(run_key=False)
        return
    op.drop_constraint(RUN_KEY, TABLE, type_="foreignkey")
    op.drop_index(RUN_INDEX, table_name=TABLE)


def downgrade() -> None:
    if op.get_context().dialect.name == "sqlite":
        _rebuild_sqlite(run_key=True)
        return
    op.create_index(RUN_INDEX, TABLE, ["run_id"])
    op.create_foreign_key(RUN_KEY, TABLE, "workflow_runs", ["run_id"], ["id"])
