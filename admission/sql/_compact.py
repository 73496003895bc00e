"""An admission event's payload kept compact in the database: its literal key, the rest in its command.

A command is admitted with one event (``SignalReceived``, ``UpdateAccepted``
or ``CommandRejected``) whose payload records it as admitted: its type,
name, sequence, outcome, scope, literal key, intent digest, requested run
and, when refused, the reason (``receipts._answers.command_payload``).  The
command's row keeps all of them, as they were, but two: releasing a key
clears the row's key (docs/lifecycle.md, "Releasing a key"), and a pending
command closed with its run gets a reason that its admission event does not
show.  So from revision ``admission_0007`` the store writes such a payload
as ``{"request_id": key}`` (``{}`` for a command without a key) and sets
``workflow_history_events.compact_payload``; a reader joins the command's
columns (:data:`COMMAND_COLUMNS`) and gets the payload back byte for byte
(:func:`rebuilt`), with the reason only for a refused outcome, which is
when admission sets it.  The store port sees the same payloads as before;
the tables held 167 (SQLite) and 175 (PostgreSQL) fewer bytes a receipt, measured
in docs/performance.md.

A payload is written compact only if rebuilding it gives its exact bytes
(:func:`stored_payload`); any other payload, and every event of another
type, is written as it is.

Pure: no I/O, no SQLAlchemy.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from admission.errors import StorageError
from admission.intent import canonical_encode
from admission.receipts._answers import REFUSALS, admission_payload, context_of
from admission.receipts._store import CommandRow, EventRow

__all__ = ["ADMISSION_EVENTS", "COMMAND_COLUMNS", "context_key", "kept_key", "rebuilt", "stored_payload"]

ADMISSION_EVENTS: Final = ("SignalReceived", "UpdateAccepted", "CommandRejected")
"""The event each command is admitted with (``receipts._lifecycle.admitted``): exactly one per command."""

COMMAND_COLUMNS: Final = (
    "command_type",
    "name",
    "command_sequence",
    "outcome",
    "target_scope",
    "intent_digest",
    "requested_run_id",
    "rejection_reason",
)
"""The command's columns a compact payload is rebuilt from; readers select them as ``c_<name>``."""

_KEY_PREFIX: Final = canonical_encode({"request": {"request_id": ""}})[:-1]
"""A command context's bytes before its key's text header (``context_of``)."""
_KEPT_PREFIX: Final = canonical_encode({"request_id": ""})[:-1]
"""A compact payload's bytes before its key's text header."""
_NO_KEY: Final = canonical_encode({})
"""The compact payload of a command without a key."""


class _NotMade:
    """Bytes that are not what admission makes: a context ``context_of`` did not make, or a
    payload that is not a compact one."""


_NOT_MADE: Final = _NotMade()


def _text_after(prefix: bytes, data: bytes) -> str | None:
    """The CBOR text string right after ``prefix`` in ``data``, or ``None``; read without decoding
    the whole map (callers encode the map again and compare, so only exact bytes pass)."""
    if not data.startswith(prefix) or len(data) <= len(prefix):
        return None
    at = len(prefix)
    head = data[at]
    # A text string's header (major type 3): the length in the byte, or in the 1 or 2 bytes
    # after it (a key of at most 255 code points is at most 1,020 bytes).
    if 0x60 <= head <= 0x77:
        start, length = at + 1, head - 0x60
    elif head == 0x78 and len(data) > at + 1:
        start, length = at + 2, data[at + 1]
    elif head == 0x79 and len(data) > at + 2:
        start, length = at + 3, int.from_bytes(data[at + 1 : at + 3])
    else:
        return None
    try:
        return data[start : start + length].decode("utf-8")
    except UnicodeDecodeError:
        return None


def context_key(context: bytes | None) -> str | _NotMade | None:
    """The literal key a command's ``context`` holds (``None``: no key), read without decoding
    the whole map; :data:`_NOT_MADE` unless ``context`` is exactly what ``context_of`` makes."""
    if context is None:
        return None
    key = _text_after(_KEY_PREFIX, context)
    # Made again and compared: whatever the bytes, only the context of exactly this key passes.
    return key if key is not None and context_of(key) == context else _NOT_MADE


def _compact(key: str | None) -> bytes:
    return _NO_KEY if key is None else canonical_encode({"request_id": key})


def kept_key(payload: bytes) -> str | _NotMade | None:
    """The literal key a compact payload keeps (``None``: the command had none); :data:`_NOT_MADE`
    unless ``payload`` is exactly a compact payload."""
    # The key read in place, then the payload made again from it: only exact bytes pass.
    key = None if payload == _NO_KEY else _text_after(_KEPT_PREFIX, payload)
    return key if payload == _compact(key) else _NOT_MADE


def _full(key: str | None, columns: Mapping[str, Any]) -> bytes:
    reason = columns["rejection_reason"] if columns["outcome"] in REFUSALS else None
    return canonical_encode(
        admission_payload(
            columns["command_type"],
            columns["name"],
            columns["command_sequence"],
            columns["outcome"],
            columns["target_scope"],
            key,
            columns["intent_digest"],
            columns["requested_run_id"],
            reason,
        )
    )


def stored_payload(event: EventRow, command: CommandRow | None) -> tuple[bytes, bool | None]:
    """What ``workflow_history_events`` stores of ``event`` (``payload``, ``compact_payload``):
    the compact payload when ``event`` is the admission event of ``command`` (as admitted) and
    rebuilds exactly; otherwise the payload as it is and ``None``."""
    if command is None or event.event_type not in ADMISSION_EVENTS or event.command_id != command.id:
        return event.payload, None
    key = context_key(command.context)
    if isinstance(key, _NotMade):
        return event.payload, None
    if _full(key, vars(command)) != event.payload:
        return event.payload, None
    return _compact(key), True


def rebuilt(payload: bytes, columns: Mapping[str, Any], position: int) -> bytes:
    """The admission event's payload from its compact form and its command's ``columns``
    (``None`` each if the command is gone: :class:`~admission.errors.StorageError`)."""
    if columns["command_type"] is None:
        raise StorageError(
            f"the admission event at position {position} keeps its payload compact, but its command "
            'is gone (docs/event-log.md, "Compact payloads")'
        )
    key = kept_key(payload)
    if isinstance(key, _NotMade):
        raise StorageError(f"the admission event at position {position} holds no compact payload")
    return _full(key, columns)
