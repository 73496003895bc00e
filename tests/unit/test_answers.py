"""The retry's shortcut (``plainly_retained``) answers exactly as the full judgement of the same rows."""

from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import given
from hypothesis import strategies as st

from admission.intent._encoding import canonical_encode
from admission.intent._keys import receipt_token
from admission.receipts._answers import answer_judgement, context_of, plainly_retained, stored_receipt
from admission.receipts._rules import Admission, Decision, Intent, judge_receipts
from admission.receipts._store import CommandRow, UpdateRow

KEYS = ("order-1", "order-2", "signal-v1:" + "a" * 64)
DIGESTS = ("d" * 64, "e" * 64)
WHEN = datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=UTC)


def _judged(
    found: list[tuple[CommandRow, UpdateRow | None]], key: str, token: str, intent: Intent
) -> Admission | None:
    """The service's full path for rows found by a retry's unlocked read."""
    rows = [row for row, _ in found]
    judgement = judge_receipts([stored_receipt(r, key) for r in rows], key, token, intent)
    if judgement.decision is None:
        return None
    updates = {row.id: update for row, update in found}
    return answer_judgement("ns", "wf", judgement, rows, updates.get, key, intent.command_type)


@st.composite
def _found(draw: st.DrawFn) -> tuple[list[tuple[CommandRow, UpdateRow | None]], str, Intent]:
    command_type = draw(st.sampled_from(["signal", "update"]))
    key = draw(st.sampled_from(KEYS))
    intent = Intent(command_type, "n", None, draw(st.sampled_from(DIGESTS)), "a" * 64)
    found: list[tuple[CommandRow, UpdateRow | None]] = []
    for number in range(draw(st.integers(1, 2))):
        stored_key = draw(st.sampled_from(KEYS))
        row = CommandRow(
            id=f"c{number}",
            instance_id="i",
            run_id="r",
            command_sequence=number + 1,
            command_type=command_type,
            name=draw(st.sampled_from(["n", "m"])),
            target_scope=draw(st.sampled_from(["instance", "run"])),
            requested_run_id=draw(st.sampled_from([None, "r"])),
            request_id=draw(st.sampled_from([receipt_token(command_type, stored_key), stored_key])),
            context=draw(
                st.sampled_from(
                    [context_of(stored_key), None, b"\xff", canonical_encode({"request": {"request_id": 1}})]
                )
            ),
            arguments=b"",
            status=draw(st.sampled_from(["received", "accepted", "applied", "rejected"])),
            outcome=draw(st.sampled_from(["received", "accepted", "run_not_active"])),
            rejection_reason=None,
            created_at=WHEN,
            intent_digest=draw(st.sampled_from([*DIGESTS, None])),
            arguments_digest=draw(st.sampled_from(["a" * 64, "b" * 64, None])),
            intent_encoding="intent-v1",
        )
        update = None
        if draw(st.booleans()):
            status = draw(st.sampled_from(["accepted", "completed", "failed"]))
            result = canonical_encode({"ok": 1}) if status == "completed" else None
            failure = "no" if status == "failed" else None
            update = UpdateRow(f"u{number}", row.id, "i", "r", "n", status, result, failure, WHEN, None)
        found.append((row, update))
    return found, key, intent


@given(_found())
def test_the_shortcut_gives_the_full_judgements_answer_or_leaves_it_to_the_judgement(
    case: tuple[list[tuple[CommandRow, UpdateRow | None]], str, Intent],
) -> None:
    found, key, intent = case
    token = receipt_token(intent.command_type, key)
    plain = plainly_retained("ns", "wf", found, key, token, intent.digest)
    if plain is not None:
        assert plain == _judged(found, key, token, intent)
        assert plain.decision is Decision.RETAINED and plain.intent_verified


def test_the_shortcut_answers_the_common_retry() -> None:
    key, token = "order-1", receipt_token("update", "order-1")
    row = CommandRow(
        "c", "i", "r", 1, "update", "n", "instance", None, token, context_of(key), b"", "accepted",
        "accepted", None, WHEN, DIGESTS[0], "a" * 64, "intent-v1",
    )  # fmt: skip
    update = UpdateRow("u", "c", "i", "r", "n", "completed", canonical_encode([1]), None, WHEN, WHEN)
    intent = Intent("update", "n", None, DIGESTS[0], "a" * 64)
    plain = plainly_retained("ns", "wf", [(row, update)], key, token, intent.digest)
    assert plain is not None and plain == _judged([(row, update)], key, token, intent)
    assert plain.update_status == "completed" and plain.result == [1]
    # Another intent, two rows, or a row without this key's context: the full judgement decides.
    assert plainly_retained("ns", "wf", [(row, update)], key, token, DIGESTS[1]) is None
    assert plainly_retained("ns", "wf", [(row, update)] * 2, key, token, intent.digest) is None
    assert plainly_retained("ns", "wf", [(row, update)], "order-2", token, intent.digest) is None
