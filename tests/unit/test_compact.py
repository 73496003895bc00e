"""An admission event's compact payload gives back the payload admission wrote, byte for byte.

``admission/sql/_compact.py`` keeps only the literal key in the event and
reads the rest from the command's row.  For every command the service can
admit, and after every change its row can go through later (a released key,
a pending command closed with its run), the rebuilt payload must be exactly
the one ``receipts._lifecycle`` built; anything that would not rebuild so is
stored as it is.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from admission.errors import StorageError
from admission.intent import canonical_encode
from admission.intent._keys import receipt_token
from admission.receipts._answers import REFUSALS, command_payload, context_of
from admission.receipts._store import CommandRow, EventRow
from admission.sql._compact import ADMISSION_EVENTS, COMMAND_COLUMNS, context_key, rebuilt, stored_payload

WHEN = datetime(2026, 12, 7, 8, 0, tzinfo=UTC)
IDS = st.uuids().map(str)
# Keys as contract §2 allows them: 1 to 255 code points, NUL and 4-byte characters included.
KEYS = st.text(min_size=1, max_size=255)
DIGESTS = st.binary(min_size=32, max_size=32).map(bytes.hex)


@st.composite
def admitted(draw: st.DrawFn) -> tuple[CommandRow, str | None, EventRow]:
    """A command as admission writes it, its key, and its admission event."""
    command_type = draw(st.sampled_from(["signal", "update"]))
    outcome = draw(st.sampled_from(["received" if command_type == "signal" else "accepted", *REFUSALS]))
    refused = outcome in REFUSALS
    key = draw(st.none() | KEYS)
    requested = draw(st.none() | IDS)
    row = CommandRow(
        id=draw(IDS),
        instance_id=draw(IDS),
        run_id=draw(st.none() | IDS),
        command_sequence=draw(st.integers(1, 2**31 - 1)),
        command_type=command_type,
        name=draw(st.text(min_size=1, max_size=40)),
        target_scope="instance" if requested is None else "run",
        requested_run_id=requested,
        request_id=None if key is None else receipt_token(command_type, key),
        context=context_of(key),
        arguments=canonical_encode(
            draw(st.dictionaries(st.text(max_size=5), st.integers(-(2**63), 2**63 - 1), max_size=3))
        ),
        status="rejected" if refused else outcome,
        outcome=outcome,
        rejection_reason=draw(st.sampled_from(["run_not_active", "selected_run_not_current"]))
        if refused
        else None,
        created_at=WHEN,
        intent_digest=draw(DIGESTS),
        arguments_digest=draw(DIGESTS),
        intent_encoding="intent-v1",
    )
    event_type = (
        "CommandRejected" if refused else ("SignalReceived" if command_type == "signal" else "UpdateAccepted")
    )
    event = EventRow(
        "ns",
        row.instance_id,
        row.run_id,
        event_type,
        row.id,
        None,
        canonical_encode(command_payload(row, key)),
        WHEN,
    )
    return row, key, event


def _columns(row: CommandRow) -> dict[str, object]:
    return {name: getattr(row, name) for name in COMMAND_COLUMNS}


@given(admitted())
def test_every_admission_event_is_kept_compact_and_rebuilds_exactly(
    case: tuple[CommandRow, str | None, EventRow],
) -> None:
    row, key, event = case
    payload, compact = stored_payload(event, row)
    assert compact is True
    assert payload == canonical_encode({} if key is None else {"request_id": key})
    assert len(payload) < len(event.payload)
    assert rebuilt(payload, _columns(row), 7) == event.payload


@given(admitted(), st.sampled_from(["released", "closed"]))
def test_the_row_s_later_changes_leave_the_rebuilt_payload_as_admitted(
    case: tuple[CommandRow, str | None, EventRow], change: str
) -> None:
    row, _, event = case
    payload, _ = stored_payload(event, row)
    if change == "released":
        # Releasing a key clears it from the row; the event keeps it (docs/lifecycle.md).
        later = replace(row, request_id=None, context=None)
    elif row.outcome in REFUSALS:
        return  # a refused command is never pending: nothing closes it
    else:
        # A pending command closed with its run gets a reason its admission event never showed.
        later = replace(row, status="rejected", rejection_reason="run_closed_before_signal_applied")
    assert rebuilt(payload, _columns(later), 7) == event.payload


@given(KEYS)
def test_the_key_is_read_from_exactly_the_context_admission_makes(key: str) -> None:
    context = context_of(key)
    assert context_key(context) == key
    assert context_key(None) is None
    # Any other bytes are not a context admission made: such a payload is kept whole.
    for other in (context + b"\x00", context[:-1], b"\xa0", context.replace(b"request_id", b"request_ix")):
        assert not isinstance(context_key(other), str | None)


@given(admitted())
def test_a_payload_that_would_not_rebuild_is_kept_as_it_is(
    case: tuple[CommandRow, str | None, EventRow],
) -> None:
    row, _, event = case
    for other in (
        replace(event, payload=event.payload + b"\xf6"),  # not the payload admission built
        replace(event, event_type="SignalApplied"),  # not an admission event
        replace(event, command_id="another"),  # another command's
    ):
        assert stored_payload(other, row) == (other.payload, None)
    assert stored_payload(event, None) == (event.payload, None)
    assert set(ADMISSION_EVENTS) == {"SignalReceived", "UpdateAccepted", "CommandRejected"}


def test_a_compact_event_without_its_command_or_not_compact_is_a_storage_error() -> None:
    gone = dict.fromkeys(COMMAND_COLUMNS)
    with pytest.raises(StorageError, match=r"position 3 .* its command is gone"):
        rebuilt(canonical_encode({"request_id": "k"}), gone, 3)
    columns = {
        "command_type": "signal", "name": "n", "command_sequence": 1, "outcome": "received",
        "target_scope": "instance", "intent_digest": "d" * 64, "requested_run_id": None,
        "rejection_reason": None,
    }  # fmt: skip
    for payload in ({"request_id": "k", "name": "x"}, {"request_id": 5}, ["k"]):
        with pytest.raises(StorageError, match="position 4 holds no compact payload"):
            rebuilt(canonical_encode(payload), columns, 4)
