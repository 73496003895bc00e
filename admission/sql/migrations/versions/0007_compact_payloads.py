"""Admission events kept compact (docs/event-log.md, "Compact payloads"): one nullable column, DDL only.

``workflow_history_events.compact_payload``: true on an admission event whose
payload keeps only its command's literal key, the rest being read from the
command's row when the event is read (``admission/sql/_compact.py``).  Every
existing event is left exactly as it is (NULL: the payload is whole).

The downgrade makes every compact payload whole again, from its command's
row as a reader would, then drops the column: an older admission reads each
payload as it finds it.  It is refused, changing nothing, if a compact
event's command is gone (nothing to make it whole from), and it cannot be
printed with ``--sql``: the payloads are made here, not in SQL.  The payload
is built by this module's own copy of its ``v1`` shape, so the revision
keeps meaning what it meant when it shipped.

Revision ID: admission_0007
Revises: admission_0006
Create Date: 2026-12-07
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import context, op

from admission.intent import canonical_decode, canonical_encode

revision = "admission_0007"
down_revision = "admission_0006"
branch_labels = None
depends_on = None

_REFUSALS = ("run_not_active", "rejected_not_current")
"""The outcomes admission gives a command refused by run state: the only ones with a reason at admission."""

_FROM = (
    "FROM workflow_history_events e LEFT JOIN workflow_commands c ON c.id = e.command_id "
    "WHERE e.compact_payload IS NOT NULL"
)
_ORPHANS = sa.text(f"SELECT count(*), min(e.position) {_FROM} AND c.id IS NULL")
_PAGE = sa.text(
    "SELECT e.position, e.payload, c.command_type, c.name, c.command_sequence, c.outcome, "
    f"c.target_scope, c.intent_digest, c.requested_run_id, c.rejection_reason {_FROM} "
    "AND e.position > :after ORDER BY e.position LIMIT 1000"
)
_WHOLE = sa.text("UPDATE workflow_history_events SET payload = :payload WHERE position = :position")


def upgrade() -> None:
    with op.batch_alter_table("workflow_history_events") as batch:
        batch.add_column(sa.Column("compact_payload", sa.Boolean(), nullable=True))


def _whole(kept: bytes, command: Any) -> bytes:
    """The admission event's ``v1`` payload: its key (kept) and its command's columns."""
    decoded = canonical_decode(bytes(kept))
    key = decoded.get("request_id") if isinstance(decoded, dict) else None
    payload: dict[str, object] = {
        "command_type": command.command_type,
        "name": command.name,
        "command_sequence": command.command_sequence,
        "outcome": command.outcome,
        "target_scope": command.target_scope,
        "request_id": key,
        "intent_digest": command.intent_digest,
    }
    if command.requested_run_id is not None:
        payload["requested_run_id"] = command.requested_run_id
    if command.outcome in _REFUSALS and command.rejection_reason is not None:
        payload["reason"] = command.rejection_reason
    return canonical_encode(payload)


def downgrade() -> None:
    if context.is_offline_mode():
        raise RuntimeError(
            "revision 0007's downgrade makes compact payloads whole from their commands' rows, which "
            "a printed script cannot do: downgrade the database itself, not with --sql"
        )
    bind = op.get_bind()
    missing, first = bind.execute(_ORPHANS).one()
    if missing:
        raise RuntimeError(
            f"refusing to downgrade: {missing} compact admission events (the first at position {first}) "
            "have no command row to make their payloads whole from; see docs/upgrading.md"
        )
    after = 0
    while page := bind.execute(_PAGE, {"after": after}).all():
        made = [{"payload": _whole(row.payload, row), "position": row.position} for row in page]
        bind.execute(_WHOLE, made)
        after = page[-1].position
    # SQLite 3.35+ drops a column in place; recreating the log would copy every event.
    with op.batch_alter_table("workflow_history_events", recreate="never") as batch:
        batch.drop_column("compact_payload")
