"""The durable worker and the outbox cursors (worker contract §1-§3): DDL only.

New tables only; nothing existing changes and nothing is backfilled.  The
fencing trigger on ``worker_records`` makes the database itself refuse a
write whose ``fence`` is not the queue's current lease token (contract §3).

Revision ID: admission_0003
Revises: admission_0002
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import context, op

revision = "admission_0003"
down_revision = "admission_0002"
branch_labels = None
depends_on = None

TIME = sa.DateTime(timezone=True)
POSITION = sa.BigInteger().with_variant(sa.Integer(), "sqlite")

SQLITE_FENCE = """
CREATE TRIGGER worker_records_fence BEFORE UPDATE ON worker_records
WHEN NEW.fence IS NOT (SELECT token FROM worker_leases WHERE queue = NEW.queue)
BEGIN
    SELECT RAISE(ABORT, 'worker_fence: stale fencing token');
END
"""

POSTGRES_FENCE_FUNCTION = """
CREATE FUNCTION worker_records_fence() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    current_token BIGINT;
BEGIN
    -- FOR SHARE: a concurrent claim (which updates the lease row) waits for
    -- this transaction, so the token cannot change between check and commit.
    SELECT token INTO current_token FROM worker_leases WHERE queue = NEW.queue FOR SHARE;
    IF NEW.fence IS DISTINCT FROM current_token THEN
        RAISE EXCEPTION 'worker_fence: stale fencing token % (current %)', NEW.fence, current_token
            USING CONSTRAINT = 'worker_fence';
    END IF;
    RETURN NEW;
END
$$
"""

POSTGRES_FENCE_TRIGGER = """
CREATE TRIGGER worker_records_fence BEFORE UPDATE ON worker_records
FOR EACH ROW EXECUTE FUNCTION worker_records_fence()
"""


def upgrade() -> None:
    op.create_table(
        "worker_queues",
        sa.Column("queue", sa.String(255), nullable=False),
        sa.Column("scope", sa.LargeBinary(), nullable=False),
        sa.Column("created_at", TIME, nullable=False),
        sa.PrimaryKeyConstraint("queue", name="pk_worker_queues"),
    )
    op.create_table(
        "worker_leases",
        sa.Column("queue", sa.String(255), nullable=False),
        sa.Column("token", sa.BigInteger(), nullable=False),
        sa.Column("holder", sa.String(255), nullable=True),
        sa.Column("heartbeat", sa.BigInteger(), nullable=False),
        sa.Column("claimed_at", TIME, nullable=True),
        sa.ForeignKeyConstraint(
            ["queue"], ["worker_queues.queue"], name="fk_worker_leases_queue_worker_queues"
        ),
        sa.PrimaryKeyConstraint("queue", name="pk_worker_leases"),
    )
    op.create_table(
        "worker_records",
        sa.Column("id", POSITION, autoincrement=True, nullable=False),
        sa.Column("write_id", sa.String(36), nullable=False),
        sa.Column("queue", sa.String(255), nullable=False),
        sa.Column("tenant", sa.String(255), nullable=False),
        sa.Column("source_key", sa.String(255), nullable=False),
        sa.Column("content", sa.LargeBinary(), nullable=False),
        sa.Column("state", sa.String(32), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("diagnostic", sa.String(2048), nullable=True),
        sa.Column("fence", sa.BigInteger(), nullable=True),
        sa.Column("snapshot", sa.LargeBinary(), nullable=True),
        sa.Column("poll_health", sa.String(16), nullable=True),
        sa.Column("polled_at", TIME, nullable=True),
        sa.Column("created_at", TIME, nullable=False),
        sa.Column("updated_at", TIME, nullable=False),
        sa.ForeignKeyConstraint(
            ["queue"], ["worker_queues.queue"], name="fk_worker_records_queue_worker_queues"
        ),
        sa.PrimaryKeyConstraint("id", name="pk_worker_records"),
        sa.UniqueConstraint("write_id", name="uq_worker_records_write_id"),
        sa.UniqueConstraint(
            "queue", "tenant", "source_key", name="uq_worker_records_queue_tenant_source_key"
        ),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_worker_records_queue_state_id", "worker_records", ["queue", "state", "id"])
    op.create_table(
        "worker_events",
        sa.Column("position", POSITION, autoincrement=True, nullable=False),
        sa.Column("queue", sa.String(255), nullable=False),
        sa.Column("write_id", sa.String(36), nullable=True),
        sa.Column("event_type", sa.String(64), nullable=False),
        sa.Column("from_state", sa.String(32), nullable=True),
        sa.Column("to_state", sa.String(32), nullable=True),
        sa.Column("reason", sa.String(2048), nullable=False),
        sa.Column("actor", sa.String(255), nullable=True),
        sa.Column("fence", sa.BigInteger(), nullable=True),
        sa.Column("recorded_at", TIME, nullable=False),
        sa.PrimaryKeyConstraint("position", name="pk_worker_events"),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_worker_events_queue_position", "worker_events", ["queue", "position"])
    op.create_index("ix_worker_events_write_id", "worker_events", ["write_id"])
    op.create_table(
        "outbox_cursors",
        sa.Column("consumer", sa.String(255), nullable=False),
        sa.Column("tx_id", sa.BigInteger(), nullable=False),
        sa.Column("position", sa.BigInteger(), nullable=False),
        sa.Column("updated_at", TIME, nullable=False),
        sa.PrimaryKeyConstraint("consumer", name="pk_outbox_cursors"),
    )
    # The context's dialect, not the bind's: offline (``--sql``) there is no bind.
    if op.get_context().dialect.name == "postgresql":
        op.execute(POSTGRES_FENCE_FUNCTION)
        op.execute(POSTGRES_FENCE_TRIGGER)
    else:
        op.execute(SQLITE_FENCE)


def downgrade() -> None:
    # Dropping the queue would drop its records, uncertain ones included, and
    # with them what an operator needs to settle a write that may have landed.
    records = op.get_bind().execute(sa.text("SELECT count(*) FROM worker_records")).scalar_one()
    allowed = context.get_x_argument(as_dictionary=True).get("allow-unsafe-downgrade") == "yes"
    if records and not allowed:
        raise RuntimeError(
            f"refusing to downgrade: {records} worker records and their events would be dropped. "
            "Settle and drain the queues first, or run `admission db downgrade REVISION --allow-unsafe "
            "--db URL` (alembic itself: -x allow-unsafe-downgrade=yes); see docs/worker.md"
        )
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP TRIGGER worker_records_fence ON worker_records")
        op.execute("DROP FUNCTION worker_records_fence()")
    op.drop_table("outbox_cursors")
    op.drop_index("ix_worker_events_write_id", table_name="worker_events")
    op.drop_index("ix_worker_events_queue_position", table_name="worker_events")
    op.drop_table("worker_events")
    op.drop_index("ix_worker_records_queue_state_id", table_name="worker_records")
    op.drop_table("worker_records")
    op.drop_table("worker_leases")
    op.drop_table("worker_queues")
