"""The event log's rows as the receipt store writes and reads them (revision 0007 on).

An admission event's payload is written compact when it rebuilds exactly
(:func:`event_values`) and read whole again with its command's columns
(:func:`readable_events`, :func:`event_row`): ``admission/sql/_compact.py``
says what is kept and why.  Every read of ``workflow_history_events``
through the store goes through these, so the store port only ever sees
whole payloads.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from sqlalchemy import Select, and_, select

from admission.receipts._store import CommandRow, EventRow
from admission.sql._compact import COMMAND_COLUMNS, rebuilt, stored_payload
from admission.sql._schema import workflow_commands, workflow_history_events
from admission.sql._times import as_utc

__all__ = ["EVENT_KEYS", "STORED_EVENT_KEYS", "event_row", "event_values", "readable_events"]

EVENT_KEYS: Final = tuple(
    c.name for c in workflow_history_events.c if c.name not in ("position", "tx_id", "compact_payload")
)
"""An :class:`EventRow`'s columns the store writes (the position and ``tx_id`` are the database's)."""
STORED_EVENT_KEYS: Final = (*EVENT_KEYS, "compact_payload")
"""The columns an event's insert takes (:func:`event_values`)."""

_COMMAND_LABELS: Final = tuple((name, f"c_{name}") for name in COMMAND_COLUMNS)


def event_row(row: Mapping[Any, Any]) -> EventRow:
    """An event from a row of ``workflow_history_events`` read by :func:`readable_events` (a
    compact payload made whole from its command's columns, ``admission/sql/_compact.py``)."""
    payload = bytes(row["payload"])
    if row.get("compact_payload"):
        payload = rebuilt(payload, {name: row[label] for name, label in _COMMAND_LABELS}, row["position"])
    return EventRow(
        row["namespace"],
        row["instance_id"],
        row["run_id"],
        row["event_type"],
        row["command_id"],
        row["update_id"],
        payload,
        as_utc(row["recorded_at"]),
        row["position"],
        row["tx_id"],
    )


def readable_events() -> Select[Any]:
    """Events with what :func:`event_row` needs: for a compact payload, its command's columns."""
    events, commands = workflow_history_events, workflow_commands
    # Joined only for a compact payload: any other event reads no command.
    joined = and_(events.c.compact_payload.is_(True), commands.c.id == events.c.command_id)
    labelled = (commands.c[name].label(label) for name, label in _COMMAND_LABELS)
    return select(events, *labelled).select_from(events.outerjoin(commands, joined))


def event_values(event: EventRow, command: CommandRow | None) -> dict[str, Any]:
    """The columns :data:`STORED_EVENT_KEYS` of ``event``: its payload compact when it is
    ``command``'s admission event and rebuilds exactly (``admission/sql/_compact.py``)."""
    values = {name: getattr(event, name) for name in EVENT_KEYS}
    values["payload"], values["compact_payload"] = stored_payload(event, command)
    return values
