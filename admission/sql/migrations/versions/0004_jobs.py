"""Durable job tables (worker contract §3, §4): new tables only, DDL, nothing backfilled.

``worker_job_scopes``, ``worker_jobs``, ``worker_job_dependencies``,
``worker_job_attempts``, ``worker_job_checkpoints`` and ``worker_job_events``
(docs/jobs.md).  No existing table is touched, so downgrading drops exactly
these tables; it is refused while any job exists, because their history would
be lost (``-x allow-unsafe-downgrade=yes`` overrides).

Revision ID: admission_0004
Revises: admission_0003
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import context, op

revision = "admission_0004"
down_revision = "admission_0003"
branch_labels = None
depends_on = None

TIME = sa.DateTime(timezone=True)
POSITION = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
JOB_ID = sa.String(128)


def _job_fk(column: str, table: str) -> sa.ForeignKeyConstraint:
    return sa.ForeignKeyConstraint([column], ["worker_jobs.job_id"], name=f"fk_{table}_{column}_worker_jobs")


def upgrade() -> None:
    op.create_table(
        "worker_job_scopes",
        sa.Column("scope", sa.String(255), nullable=False),
        sa.Column("last_position", sa.BigInteger(), nullable=False),
        sa.Column("created_at", TIME, nullable=False),
        sa.PrimaryKeyConstraint("scope", name="pk_worker_job_scopes"),
    )
    op.create_table(
        "worker_jobs",
        sa.Column("job_id", JOB_ID, nullable=False),
        sa.Column("scope", sa.String(255), nullable=False),
        sa.Column("position", sa.BigInteger(), nullable=False),
        sa.Column("kind", sa.String(128), nullable=False),
        sa.Column("payload", sa.LargeBinary(), nullable=False),
        sa.Column("content", sa.LargeBinary(), nullable=False),
        sa.Column("state", sa.String(24), nullable=False),
        sa.Column("reason", sa.String(64), nullable=False),
        sa.Column("max_attempts", sa.Integer(), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("fence", sa.BigInteger(), nullable=False),
        sa.Column("beat", sa.BigInteger(), nullable=False),
        sa.Column("owner", sa.String(128), nullable=True),
        sa.Column("attempt_id", sa.String(36), nullable=True),
        sa.Column("paused", sa.Boolean(), nullable=False),
        sa.Column("cancel_requested", sa.Boolean(), nullable=False),
        sa.Column("stop_requested", sa.Boolean(), nullable=False),
        sa.Column("checkpoint_step", sa.Integer(), nullable=False),
        sa.Column("publish_attempt_id", sa.String(36), nullable=True),
        sa.Column("publish_result", sa.LargeBinary(), nullable=True),
        sa.Column("diagnostic", sa.String(2048), nullable=True),
        sa.Column("created_at", TIME, nullable=False),
        sa.Column("updated_at", TIME, nullable=False),
        sa.PrimaryKeyConstraint("job_id", name="pk_worker_jobs"),
        sa.ForeignKeyConstraint(
            ["scope"], ["worker_job_scopes.scope"], name="fk_worker_jobs_scope_worker_job_scopes"
        ),
        sa.UniqueConstraint("scope", "position", name="uq_worker_jobs_scope_position"),
    )
    op.create_index("ix_worker_jobs_scope_state", "worker_jobs", ["scope", "state"])
    op.create_table(
        "worker_job_dependencies",
        sa.Column("job_id", JOB_ID, nullable=False),
        sa.Column("depends_on", JOB_ID, nullable=False),
        sa.PrimaryKeyConstraint("job_id", "depends_on", name="pk_worker_job_dependencies"),
        _job_fk("job_id", "worker_job_dependencies"),
        _job_fk("depends_on", "worker_job_dependencies"),
    )
    op.create_index("ix_worker_job_dependencies_depends_on", "worker_job_dependencies", ["depends_on"])
    op.create_table(
        "worker_job_attempts",
        sa.Column("attempt_id", sa.String(36), nullable=False),
        sa.Column("job_id", JOB_ID, nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("fence", sa.BigInteger(), nullable=False),
        sa.Column("owner", sa.String(128), nullable=False),
        sa.Column("started_at", TIME, nullable=False),
        sa.Column("ended_at", TIME, nullable=True),
        sa.Column("outcome", sa.String(64), nullable=True),
        sa.Column("diagnostic", sa.String(2048), nullable=True),
        sa.PrimaryKeyConstraint("attempt_id", name="pk_worker_job_attempts"),
        _job_fk("job_id", "worker_job_attempts"),
        sa.UniqueConstraint("job_id", "number", name="uq_worker_job_attempts_job_id_number"),
    )
    op.create_table(
        "worker_job_checkpoints",
        sa.Column("job_id", JOB_ID, nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("attempt_id", sa.String(36), nullable=False),
        sa.Column("fence", sa.BigInteger(), nullable=False),
        sa.Column("state", sa.LargeBinary(), nullable=False),
        sa.Column("recorded_at", TIME, nullable=False),
        sa.PrimaryKeyConstraint("job_id", "step", name="pk_worker_job_checkpoints"),
        _job_fk("job_id", "worker_job_checkpoints"),
    )
    op.create_table(
        "worker_job_events",
        sa.Column("position", POSITION, nullable=False, autoincrement=True),
        sa.Column("job_id", JOB_ID, nullable=False),
        sa.Column("event", sa.String(64), nullable=False),
        sa.Column("from_state", sa.String(24), nullable=True),
        sa.Column("to_state", sa.String(24), nullable=False),
        sa.Column("reason", sa.String(64), nullable=False),
        sa.Column("fence", sa.BigInteger(), nullable=True),
        sa.Column("attempt_id", sa.String(36), nullable=True),
        sa.Column("detail", sa.String(2048), nullable=True),
        sa.Column("recorded_at", TIME, nullable=False),
        sa.PrimaryKeyConstraint("position", name="pk_worker_job_events"),
        _job_fk("job_id", "worker_job_events"),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_worker_job_events_job_id_position", "worker_job_events", ["job_id", "position"])


def downgrade() -> None:
    jobs = op.get_bind().execute(sa.text("SELECT count(*) FROM worker_jobs")).scalar_one()
    allowed = context.get_x_argument(as_dictionary=True).get("allow-unsafe-downgrade") == "yes"
    if jobs and not allowed:
        raise RuntimeError(
            f"refusing to downgrade: {jobs} durable jobs and their history would be dropped. "
            "Drain the jobs first, or run `admission db downgrade REVISION --allow-unsafe --db URL` "
            "(alembic itself: -x allow-unsafe-downgrade=yes); see docs/jobs.md"
        )
    for table in (
        "worker_job_events",
        "worker_job_checkpoints",
        "worker_job_attempts",
        "worker_job_dependencies",
        "worker_jobs",
        "worker_job_scopes",
    ):
        op.drop_table(table)
