"""The database schema, declared with SQLAlchemy Core.

Table names follow the upstream engine (``workflow_instances``,
``workflow_runs``, ``workflow_commands``, ``workflow_updates``,
``workflow_history_events``) so that legacy receipt databases upgrade in
place (contract §6).  Alembic owns the schema: ``admission/sql/migrations``
holds revision ``admission_0001`` (the receipt schema before intents, the shape legacy
databases have), ``0002`` (the intent columns, DDL only), ``0003`` (the
durable worker's tables and the outbox cursors, plus the fencing trigger on
``worker_records`` that refuses a write carrying a stale lease token) and
``0004`` (the durable job tables ``worker_job*``, worker contract §4;
docs/jobs.md), ``0005`` (``worker_jobs.not_before``, a retry's backoff), ``0006``
(``workflow_commands`` without its foreign key to its run, and the index by run) and ``0007``
(``workflow_history_events.compact_payload``: admission events kept compact).  This module
declares the head; a test proves ``upgrade head`` produces exactly it.

Values stored as bytes (arguments, results, contexts, event payloads) are in
the canonical encoding (contract §3), so a stored receipt can re-verify its own
digest and a literal key with NUL or 4-byte characters round-trips on every
backend.
"""

from __future__ import annotations

from typing import Final

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    UniqueConstraint,
)

from admission import _bounds as bounds

__all__ = [
    "metadata",
    "outbox_cursors",
    "worker_events",
    "worker_job_attempts",
    "worker_job_checkpoints",
    "worker_job_dependencies",
    "worker_job_events",
    "worker_job_scopes",
    "worker_jobs",
    "worker_leases",
    "worker_queues",
    "worker_records",
    "workflow_commands",
    "workflow_history_events",
    "workflow_instances",
    "workflow_runs",
    "workflow_updates",
]

NAMING_CONVENTION: Final = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

metadata = MetaData(naming_convention=NAMING_CONVENTION)
"""All of admission's tables."""

# SQLite only auto-increments an INTEGER PRIMARY KEY (the rowid alias).
_Position = BigInteger().with_variant(Integer(), "sqlite")
_Time = DateTime(timezone=True)

workflow_instances = Table(
    "workflow_instances",
    metadata,
    Column("id", String(bounds.ID), primary_key=True),
    Column("namespace", String(bounds.NAME), nullable=False),
    Column("workflow_id", String(bounds.NAME), nullable=False),
    Column("current_run_id", String(bounds.ID), nullable=True),
    Column("created_at", _Time, nullable=False),
    UniqueConstraint("namespace", "workflow_id"),
)
"""One row per (namespace, workflow_id): the row the admission lock takes."""

workflow_runs = Table(
    "workflow_runs",
    metadata,
    Column("id", String(bounds.ID), primary_key=True),
    Column("instance_id", String(bounds.ID), ForeignKey("workflow_instances.id"), nullable=False),
    Column("run_number", Integer, nullable=False),
    Column("status", String(bounds.STATUS), nullable=False),
    Column("continued_from_run_id", String(bounds.ID), nullable=True),
    Column("started_at", _Time, nullable=False),
    Column("closed_at", _Time, nullable=True),
    UniqueConstraint("instance_id", "run_number"),
)
"""Runs of an instance: ``open``, or closed as completed/failed/cancelled/terminated/continued."""

workflow_commands = Table(
    "workflow_commands",
    metadata,
    Column("id", String(bounds.ID), primary_key=True),
    Column("instance_id", String(bounds.ID), ForeignKey("workflow_instances.id"), nullable=False),
    # No foreign key since revision 0006: the instance's lock proves the run, and the
    # index the key needed cost every admission an entry (docs/performance.md).
    Column("run_id", String(bounds.ID), nullable=True),
    Column("command_sequence", Integer, nullable=False),
    Column("command_type", String(bounds.STATUS), nullable=False),
    Column("name", String(bounds.NAME), nullable=False),
    Column("target_scope", String(bounds.SCOPE_KIND), nullable=False),
    Column("requested_run_id", String(bounds.ID), nullable=True),
    # A receipt token (``update-v1:<hex>``) for rows written by this version;
    # legacy rows may hold the raw key, a token, or NULL (contract §6).
    Column("request_id", String(bounds.TOKEN), nullable=True),
    # The canonical map {"request": {"request_id": <literal key>}}.
    Column("context", LargeBinary, nullable=True),
    Column("arguments", LargeBinary, nullable=True),
    Column("status", String(bounds.STATUS), nullable=False),
    Column("outcome", String(bounds.OUTCOME), nullable=False),
    Column("rejection_reason", String(bounds.CODE), nullable=True),
    Column("created_at", _Time, nullable=False),
    # Revision 0002: the admitted intent (contract §3).  NULL on legacy rows.
    Column("intent_digest", String(bounds.DIGEST), nullable=True),
    Column("arguments_digest", String(bounds.DIGEST), nullable=True),
    Column("intent_encoding", String(bounds.STATUS), nullable=True),
    UniqueConstraint("instance_id", "command_sequence"),
    # The backstop of the admission lock (contract §2.6, §4).
    Index("workflow_commands_request_lookup", "instance_id", "command_type", "request_id", unique=True),
)
"""Commands and their receipts."""

workflow_updates = Table(
    "workflow_updates",
    metadata,
    Column("id", String(bounds.ID), primary_key=True),
    Column("command_id", String(bounds.ID), ForeignKey("workflow_commands.id"), nullable=False, unique=True),
    Column("instance_id", String(bounds.ID), ForeignKey("workflow_instances.id"), nullable=False),
    Column("run_id", String(bounds.ID), ForeignKey("workflow_runs.id"), nullable=False),
    Column("name", String(bounds.NAME), nullable=False),
    Column("status", String(bounds.STATUS), nullable=False),
    # Canonical bytes of the result; a completed update with a NULL result
    # (legacy) or f6 completed with null.
    Column("result", LargeBinary, nullable=True),
    Column("failure", String(bounds.TEXT), nullable=True),
    Column("accepted_at", _Time, nullable=False),
    Column("completed_at", _Time, nullable=True),
    Index(None, "run_id"),
)
"""Updates: ``accepted`` then ``completed`` (with a result, possibly null) or ``failed``."""

workflow_history_events = Table(
    "workflow_history_events",
    metadata,
    Column("position", _Position, primary_key=True, autoincrement=True),
    # PostgreSQL: the writing transaction's id (txid_current()), so that a
    # reader never passes an event that commits later with a lower position
    # (docs/event-log.md).  SQLite has one writer at a time and stores 0.
    Column("tx_id", BigInteger, nullable=False),
    Column("namespace", String(bounds.NAME), nullable=False),
    Column("instance_id", String(bounds.ID), ForeignKey("workflow_instances.id"), nullable=False),
    Column("run_id", String(bounds.ID), nullable=True),
    Column("event_type", String(bounds.CODE), nullable=False),
    Column("command_id", String(bounds.ID), nullable=True),
    Column("update_id", String(bounds.ID), nullable=True),
    Column("payload", LargeBinary, nullable=False),
    Column("recorded_at", _Time, nullable=False),
    # Revision 0007: true when the payload keeps only what the command's row may lose (its
    # literal key) and readers rebuild the rest from the row (admission/sql/_compact.py).
    Column("compact_payload", Boolean, nullable=True),
    Index(None, "instance_id", "position"),
    Index(None, "tx_id", "position"),
    # Positions are never reused, even after pruning the newest events.
    sqlite_autoincrement=True,
)
"""The append-only event log: every admission, refusal and transition."""


# -- revision 0003: the durable worker and the outbox (docs/worker.md) -----------------

worker_queues = Table(
    "worker_queues",
    metadata,
    Column("queue", String(bounds.NAME), primary_key=True),
    # The scope's canonical encoding, pinned at creation (worker contract §1).
    Column("scope", LargeBinary, nullable=False),
    Column("created_at", _Time, nullable=False),
)
"""One row per worker queue: its pinned scope."""

worker_leases = Table(
    "worker_leases",
    metadata,
    Column("queue", String(bounds.NAME), ForeignKey("worker_queues.queue"), primary_key=True),
    # The fencing token: every claim increments it (worker contract §3).  The
    # trigger on worker_records refuses an update whose fence is not this.
    Column("token", BigInteger, nullable=False),
    Column("holder", String(bounds.NAME), nullable=True),
    # Bumped by the holder on every renewal; a claimant judges liveness by
    # watching it change on its own monotonic clock, never by a stored time.
    Column("heartbeat", BigInteger, nullable=False),
    Column("claimed_at", _Time, nullable=True),
)
"""The lease of each queue: token, holder and heartbeat."""

worker_records = Table(
    "worker_records",
    metadata,
    Column("id", _Position, primary_key=True, autoincrement=True),
    Column("write_id", String(bounds.ID), nullable=False, unique=True),
    Column("queue", String(bounds.NAME), ForeignKey("worker_queues.queue"), nullable=False),
    Column("tenant", String(bounds.NAME), nullable=False),
    Column("source_key", String(bounds.NAME), nullable=False),
    # The record's canonical encoding (admission's intent-v1 CBOR).
    Column("content", LargeBinary, nullable=False),
    Column("state", String(bounds.WRITE_STATE), nullable=False),
    Column("attempts", Integer, nullable=False),
    Column("diagnostic", String(bounds.TEXT), nullable=True),
    # The lease token of the last write; the fencing trigger checks it.
    Column("fence", BigInteger, nullable=True),
    Column("snapshot", LargeBinary, nullable=True),
    Column("poll_health", String(bounds.STATUS), nullable=True),
    Column("polled_at", _Time, nullable=True),
    Column("created_at", _Time, nullable=False),
    Column("updated_at", _Time, nullable=False),
    UniqueConstraint("queue", "tenant", "source_key"),
    Index(None, "queue", "state", "id"),
    sqlite_autoincrement=True,
)
"""Accepted records, their durable write_id and write state (worker contract §1, §2)."""

worker_events = Table(
    "worker_events",
    metadata,
    Column("position", _Position, primary_key=True, autoincrement=True),
    Column("queue", String(bounds.NAME), nullable=False),
    Column("write_id", String(bounds.ID), nullable=True),
    Column("event_type", String(bounds.CODE), nullable=False),
    Column("from_state", String(bounds.WRITE_STATE), nullable=True),
    Column("to_state", String(bounds.WRITE_STATE), nullable=True),
    Column("reason", String(bounds.TEXT), nullable=False),
    Column("actor", String(bounds.NAME), nullable=True),
    Column("fence", BigInteger, nullable=True),
    Column("recorded_at", _Time, nullable=False),
    Index(None, "queue", "position"),
    Index(None, "write_id"),
    sqlite_autoincrement=True,
)
"""The worker's append-only event log: every transition, observation and poll-health change."""

outbox_cursors = Table(
    "outbox_cursors",
    metadata,
    Column("consumer", String(bounds.NAME), primary_key=True),
    Column("tx_id", BigInteger, nullable=False),
    Column("position", BigInteger, nullable=False),
    Column("updated_at", _Time, nullable=False),
)
"""Where each consumer of the event log stands (an EventCursor), moved with its effects."""

# -- durable jobs (revision 0004; worker contract §3, §4; docs/jobs.md) ---------------------------

worker_job_scopes = Table(
    "worker_job_scopes",
    metadata,
    Column("scope", String(bounds.NAME), primary_key=True),
    # The last queue position handed out in this scope: jobs are claimed in this order.
    Column("last_position", BigInteger, nullable=False),
    Column("created_at", _Time, nullable=False),
)
"""One row per job scope: the row an enqueue locks, so the queue bound is counted exactly."""

worker_jobs = Table(
    "worker_jobs",
    metadata,
    Column("job_id", String(bounds.JOB_ID), primary_key=True),
    Column("scope", String(bounds.NAME), ForeignKey("worker_job_scopes.scope"), nullable=False),
    Column("position", BigInteger, nullable=False),
    Column("kind", String(bounds.JOB_ID), nullable=False),
    Column("payload", LargeBinary, nullable=False),
    # The canonical encoding of everything the caller gave (duplicate vs conflict).
    Column("content", LargeBinary, nullable=False),
    Column("state", String(bounds.JOB_STATE), nullable=False),
    Column("reason", String(bounds.CODE), nullable=False),
    Column("max_attempts", Integer, nullable=False),
    Column("attempts", Integer, nullable=False),
    # The fencing token: only grows, a new value on every claim (worker contract §3).
    Column("fence", BigInteger, nullable=False),
    # Bumped by every fenced write: a would-be reclaimer watches it on its own monotonic clock.
    Column("beat", BigInteger, nullable=False),
    Column("owner", String(bounds.JOB_ID), nullable=True),
    Column("attempt_id", String(bounds.ID), nullable=True),
    Column("paused", Boolean, nullable=False),
    Column("cancel_requested", Boolean, nullable=False),
    Column("stop_requested", Boolean, nullable=False),
    Column("checkpoint_step", Integer, nullable=False),
    # The result recorded before it is published, and the attempt that publishes it.
    Column("publish_attempt_id", String(bounds.ID), nullable=True),
    Column("publish_result", LargeBinary, nullable=True),
    Column("diagnostic", String(bounds.TEXT), nullable=True),
    Column("created_at", _Time, nullable=False),
    Column("updated_at", _Time, nullable=False),
    # Revision 0005: while in retry_wait, no claim before this time (the retry's backoff).
    Column("not_before", _Time, nullable=True),
    UniqueConstraint("scope", "position"),
    Index(None, "scope", "state"),
)
"""Durable jobs: state, fence, flags, the latest checkpoint step and the publish intent."""

worker_job_dependencies = Table(
    "worker_job_dependencies",
    metadata,
    Column("job_id", String(bounds.JOB_ID), ForeignKey("worker_jobs.job_id"), primary_key=True),
    Column("depends_on", String(bounds.JOB_ID), ForeignKey("worker_jobs.job_id"), primary_key=True),
    Index(None, "depends_on"),
)
"""Job ``job_id`` may be claimed only once job ``depends_on`` has completed."""

worker_job_attempts = Table(
    "worker_job_attempts",
    metadata,
    Column("attempt_id", String(bounds.ID), primary_key=True),
    Column("job_id", String(bounds.JOB_ID), ForeignKey("worker_jobs.job_id"), nullable=False),
    Column("number", Integer, nullable=False),
    Column("fence", BigInteger, nullable=False),
    Column("owner", String(bounds.JOB_ID), nullable=False),
    Column("started_at", _Time, nullable=False),
    Column("ended_at", _Time, nullable=True),
    Column("outcome", String(bounds.CODE), nullable=True),
    Column("diagnostic", String(bounds.TEXT), nullable=True),
    UniqueConstraint("job_id", "number"),
)
"""One row per claim of a job (fresh or reclaim), with the fence it ran under."""

worker_job_checkpoints = Table(
    "worker_job_checkpoints",
    metadata,
    Column("job_id", String(bounds.JOB_ID), ForeignKey("worker_jobs.job_id"), primary_key=True),
    Column("step", Integer, primary_key=True),
    Column("attempt_id", String(bounds.ID), nullable=False),
    Column("fence", BigInteger, nullable=False),
    Column("state", LargeBinary, nullable=False),
    Column("recorded_at", _Time, nullable=False),
)
"""Immutable step checkpoints: the state after step ``step``, in the canonical encoding."""

worker_job_events = Table(
    "worker_job_events",
    metadata,
    Column("position", _Position, primary_key=True, autoincrement=True),
    Column("job_id", String(bounds.JOB_ID), ForeignKey("worker_jobs.job_id"), nullable=False),
    Column("event", String(bounds.CODE), nullable=False),
    Column("from_state", String(bounds.JOB_STATE), nullable=True),
    Column("to_state", String(bounds.JOB_STATE), nullable=False),
    Column("reason", String(bounds.CODE), nullable=False),
    Column("fence", BigInteger, nullable=True),
    Column("attempt_id", String(bounds.ID), nullable=True),
    Column("detail", String(bounds.TEXT), nullable=True),
    Column("recorded_at", _Time, nullable=False),
    Index(None, "job_id", "position"),
    sqlite_autoincrement=True,
)
"""Every job transition and request, written in the transaction that made it."""
