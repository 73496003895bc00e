"""The deep audit's statements: each one streams rows that need a look, or names what is missing.

Every "X without its Y" check is a ``LEFT JOIN ... WHERE Y IS NULL``: PostgreSQL
runs it as a hash anti-join, SQLite builds an automatic index for the joined
side, so none of them probes the event log once per row.  Nothing here writes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from sqlalchemy import (
    Column,
    ColumnElement,
    LargeBinary,
    Select,
    Table,
    and_,
    cast,
    func,
    literal,
    literal_column,
    select,
    union_all,
)

from admission.receipts._answers import REFUSALS
from admission.sql._compact import ADMISSION_EVENTS
from admission.sql._schema import (
    metadata,
    worker_events,
    worker_job_attempts,
    worker_job_checkpoints,
    worker_job_events,
    worker_jobs,
    worker_queues,
    worker_records,
    workflow_commands,
    workflow_history_events,
    workflow_instances,
    workflow_runs,
    workflow_updates,
)

__all__ = [
    "ADMISSION_EVENTS",
    "BLOBS",
    "COMMANDS_WITH_EVENTS",
    "EVENTS_WITHOUT_ROW",
    "LOGS_NEVER_DELETED",
    "PRUNED_EVENTS_AND_GAPS",
    "REFERENCES",
    "STATES_WITHOUT_EVENT",
    "UPDATES_MISSING",
    "Reference",
    "StateEvent",
    "blob_rows",
    "gaps_of",
    "high_water",
    "row_key",
    "stored_bytes",
]


_c = workflow_commands.c
_e = workflow_history_events.c


def stored_bytes(column: ColumnElement[Any]) -> ColumnElement[bytes]:
    """``column`` read as bytes, whatever SQLite holds in it.

    SQLite keeps a value's own type, not the column's: a BLOB column can hold
    TEXT (an edit with ``replace()`` makes one), which the driver would decode
    as UTF-8 (failing, and quoting the value in its error).  The cast reads
    the bytes either way; on PostgreSQL it changes nothing.
    """
    name = getattr(column, "name", None)
    cast_column = cast(column, LargeBinary)
    return cast_column.label(name) if isinstance(name, str) else cast_column


_admission_event = workflow_history_events.alias("admission_event")
COMMANDS_WITH_EVENTS: Final = (
    select(
        _c.id,
        _c.command_type,
        _c.name,
        _c.target_scope,
        _c.requested_run_id,
        _c.request_id,
        stored_bytes(_c.context),
        stored_bytes(_c.arguments),
        _c.intent_digest,
        _c.arguments_digest,
        _c.intent_encoding,
        _admission_event.c.position.label("event_position"),
        stored_bytes(_admission_event.c.payload).label("event_payload"),
        _admission_event.c.compact_payload.label("event_compact"),
    )
    .select_from(
        workflow_commands.outerjoin(
            _admission_event,
            and_(
                _admission_event.c.command_id == _c.id,
                _admission_event.c.event_type.in_(ADMISSION_EVENTS),
            ),
        )
    )
    .order_by(_c.id, _admission_event.c.position)
)
"""Every command with its admission event(s), by command id: one row per pair, or one with no event."""

UPDATES_MISSING: Final = (
    select(_c.id)
    .select_from(workflow_commands.outerjoin(workflow_updates, workflow_updates.c.command_id == _c.id))
    .where(_c.command_type == "update", _c.outcome.not_in(REFUSALS), workflow_updates.c.id.is_(None))
    .order_by(_c.id)
)
"""Admitted (not refused) update commands with no row in ``workflow_updates``."""


@dataclass(frozen=True)
class StateEvent:
    """A stored state that an event of the log must record: rows of ``table`` matching ``where``
    need an event of type ``event_type`` whose ``event_column`` names the row."""

    table: Table
    where: ColumnElement[bool]
    event_type: str
    event_column: str
    key: str = "id"

    def missing(self) -> Select[Any]:
        """The keys of the rows that have no such event."""
        found = workflow_history_events.alias("recorded")
        on = and_(found.c[self.event_column] == self.table.c[self.key], found.c.event_type == self.event_type)
        return (
            select(self.table.c[self.key])
            .select_from(self.table.outerjoin(found, on))
            .where(self.where, found.c.position.is_(None))
            .order_by(self.table.c[self.key])
        )


_r = workflow_runs.c
_u = workflow_updates.c
STATES_WITHOUT_EVENT: Final = (
    StateEvent(workflow_runs, _r.id.is_not(None), "RunStarted", "run_id"),
    StateEvent(workflow_runs, _r.status != "open", "RunClosed", "run_id"),
    StateEvent(workflow_updates, _u.status == "completed", "UpdateCompleted", "update_id"),
    StateEvent(workflow_updates, _u.status == "failed", "UpdateFailed", "update_id"),
    StateEvent(
        workflow_commands,
        and_(_c.command_type == "signal", _c.status == "applied"),
        "SignalApplied",
        "command_id",
    ),
    StateEvent(
        workflow_commands,
        and_(_c.command_type == "signal", _c.status == "rejected", _c.outcome.not_in(REFUSALS)),
        "SignalRejected",
        "command_id",
    ),
)
"""Every state the lifecycle writes beside an event (``receipts._lifecycle``) and that event."""


@dataclass(frozen=True)
class Reference:
    """``table.column`` names a row of ``parent`` by ``parent_column`` (NULL names nothing)."""

    table: Table
    column: str
    parent: Table
    parent_column: str

    def missing(self) -> Select[Any]:
        """The rows whose reference names no row, with the value they hold."""
        parent = self.parent.alias("parent")
        child = self.table.c[self.column]
        keys = [c for c in self.table.primary_key.columns]
        return (
            select(*keys, child.label("reference"))
            .select_from(self.table.outerjoin(parent, parent.c[self.parent_column] == child))
            .where(child.is_not(None), parent.c[self.parent_column].is_(None))
            .order_by(*keys)
        )


def _declared() -> list[Reference]:
    found = []
    for table in metadata.sorted_tables:
        for fk in sorted(table.foreign_keys, key=lambda f: f.parent.name):
            target: Column[Any] = fk.column
            assert isinstance(target.table, Table)
            found.append(Reference(table, fk.parent.name, target.table, target.name))
    return found


REFERENCES: Final = (
    *_declared(),
    # References no foreign key declares (a pruned run takes its events with it;
    # the log and the worker's records are never trimmed otherwise).
    Reference(workflow_instances, "current_run_id", workflow_runs, "id"),
    Reference(workflow_commands, "run_id", workflow_runs, "id"),  # its key dropped in revision 0006
    Reference(workflow_runs, "continued_from_run_id", workflow_runs, "id"),
    Reference(worker_events, "write_id", worker_records, "write_id"),
    Reference(worker_jobs, "attempt_id", worker_job_attempts, "attempt_id"),
    Reference(worker_jobs, "publish_attempt_id", worker_job_attempts, "attempt_id"),
    Reference(worker_job_checkpoints, "attempt_id", worker_job_attempts, "attempt_id"),
    Reference(worker_job_events, "attempt_id", worker_job_attempts, "attempt_id"),
)
"""Every reference between admission's rows: the declared foreign keys, then the undeclared ones."""

EVENTS_WITHOUT_ROW: Final = (
    Reference(workflow_history_events, "command_id", workflow_commands, "id"),
    Reference(workflow_history_events, "update_id", workflow_updates, "id"),
    Reference(workflow_history_events, "run_id", workflow_runs, "id"),
)
"""Events that name a command, update or run the store no longer holds (pruning takes both)."""

BLOBS: Final = (
    (workflow_history_events, "payload"),
    (workflow_updates, "result"),
    (worker_queues, "scope"),
    (worker_records, "content"),
    (worker_records, "snapshot"),
    (worker_jobs, "payload"),
    (worker_jobs, "content"),
    (worker_jobs, "publish_result"),
    (worker_job_checkpoints, "state"),
)
"""Stored values in the canonical encoding (contract §3), beside the commands' own (checked with
their digests)."""

LOGS_NEVER_DELETED: Final = ((worker_events, "position"), (worker_job_events, "position"))
"""Append-only logs nothing deletes from: on SQLite, any hole in their positions is unexplained."""


def blob_rows(table: Table, column: str) -> Select[Any]:
    """The key and the stored bytes of every row of ``table`` with a value in ``column``."""
    keys = list(table.primary_key.columns)
    return select(*keys, stored_bytes(table.c[column])).where(table.c[column].is_not(None)).order_by(*keys)


def row_key(table: Table, row: Sequence[Any]) -> dict[str, Any]:
    """The leading primary-key values of ``row`` by column name."""
    return {c.name: row[i] for i, c in enumerate(table.primary_key.columns)}


def gaps_of(column: Column[Any]) -> Select[Any]:
    """``(position, previous)`` for every position whose predecessor is not ``position - 1`` (the first
    position's predecessor is 0), in descending order."""
    ordered = select(
        column.label("position"), func.lag(column, 1, 0).over(order_by=column).label("previous")
    ).subquery()
    return (
        select(ordered.c.position, ordered.c.previous)
        .where(ordered.c.position - ordered.c.previous > 1)
        .order_by(ordered.c.position.desc())
    )


def high_water(column: Column[Any]) -> Select[Any, int]:
    """The largest position and the number of rows."""
    return select(func.max(column), func.count())


_gaps = gaps_of(_e.position).subquery()
PRUNED_EVENTS_AND_GAPS: Final = union_all(
    select(_e.position, literal(None).label("previous"), _e.payload, literal(0).label("kind")).where(
        _e.event_type == "RunsPruned"
    ),
    select(_gaps.c.position, _gaps.c.previous, literal(None), literal(1)),
).order_by(literal_column("position").desc(), literal_column("kind"))
"""``RunsPruned`` events (kind 0, with their payload) and the holes below each present position
(kind 1, ``previous`` set), from the newest down, a ``RunsPruned`` before the hole under the same
position: a pruning deletes only events older than its own (``_audit._explain_gaps``)."""
