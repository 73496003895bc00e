"""The audit's rules in their universal form: a command stored as admission stores it verifies, and
any changed byte of its arguments, or another name or target, is a finding on that command; the holes
pruning leaves in a log are explained, and one more deleted event never is."""

from __future__ import annotations

import json
from types import SimpleNamespace

from hypothesis import given, settings
from hypothesis import strategies as st

from admission.intent import INTENT_VERSION, encode_intent, receipt_token
from admission.intent._encoding import canonical_encode
from admission.receipts._answers import context_of
from admission.receipts._sealed import envelope_text, is_envelope_text
from admission.sql._audit import _Collector, _verify_command, unexplained_gaps
from tests.support.strategies import ARGUMENTS, TEXT

# Each example encodes and digests a whole intent twice: 100 examples find what
# the CI profile's 400 find here, in a quarter of the time.
QUICK = settings(max_examples=100)

NAMES = TEXT.filter(bool)
TARGETS = st.one_of(st.none(), st.uuids().map(str))
KEYS = st.one_of(st.none(), TEXT.filter(bool))


def stored(
    command_type: str, name: str, arguments: object, target: str | None, key: str | None
) -> SimpleNamespace:
    """A command row as the admission service writes it (``AdmissionService._admit``)."""
    encoded = encode_intent(command_type, name, arguments, target)
    return SimpleNamespace(
        id="c-1",
        command_type=command_type,
        name=name,
        target_scope="instance" if target is None else "run",
        requested_run_id=target,
        request_id=None if key is None else receipt_token(command_type, key),
        context=context_of(key),
        arguments=encoded.arguments,
        intent_digest=encoded.digest,
        arguments_digest=encoded.arguments_digest,
        intent_encoding=INTENT_VERSION,
    )


def findings(row: SimpleNamespace) -> set[tuple[str, str]]:
    found = _Collector(100)
    _verify_command(row, found)
    return {(f.kind, f.key["id"]) for f in found.findings}


@QUICK
@given(st.sampled_from(["signal", "update"]), NAMES, ARGUMENTS, TARGETS, KEYS)
def test_a_command_as_admission_stores_it_verifies(
    command_type: str, name: str, arguments: object, target: str | None, key: str | None
) -> None:
    assert findings(stored(command_type, name, arguments, target, key)) == set()


@QUICK
@given(st.sampled_from(["signal", "update"]), NAMES, ARGUMENTS, TARGETS, st.data())
def test_any_changed_argument_byte_is_found(
    command_type: str, name: str, arguments: object, target: str | None, data: st.DataObject
) -> None:
    row = stored(command_type, name, arguments, target, None)
    index = data.draw(st.integers(0, len(row.arguments) - 1))
    flip = data.draw(st.integers(1, 255))
    tampered = bytearray(row.arguments)
    tampered[index] ^= flip
    row.arguments = bytes(tampered)
    assert ("arguments_digest_mismatch", "c-1") in findings(row)


@QUICK
@given(NAMES, NAMES, ARGUMENTS)
def test_another_name_is_found(name: str, other: str, arguments: object) -> None:
    row = stored("update", name, arguments, None, None)
    row.name = other
    assert (findings(row) == set()) is (name == other)


@QUICK
@given(ARGUMENTS, st.uuids().map(str))
def test_a_target_added_or_dropped_is_found(arguments: object, target: str) -> None:
    scoped = stored("signal", "go", arguments, target, None)
    scoped.target_scope = "instance"
    assert findings(scoped) == {("intent_digest_mismatch", "c-1")}


# -- holes in a pruned log (docs/event-log.md, "Gaps") ----------------------------------------------------


def marks(present: list[int], pruned: dict[int, int]) -> list[tuple[int, int | None, object]]:
    """What the audit's query gives for a log: RunsPruned rows and holes, newest first."""
    rows: list[tuple[int, int | None, object]] = []
    previous = 0
    for position in sorted(present):
        if position - previous > 1:
            rows.append((position, previous, None))
        previous = position
    rows += [(position, None, count) for position, count in pruned.items()]
    # Newest first; at one position, the RunsPruned before the hole beneath it.
    return sorted(rows, key=lambda r: (-r[0], r[1] is not None))


LOGS = st.lists(st.tuples(st.booleans(), st.lists(st.integers(0, 10**6), max_size=4)), max_size=30)


@given(LOGS, st.integers(0, 10**6))
def test_holes_only_pruning_made_are_explained_and_one_more_deletion_never_is(
    steps: list[tuple[bool, list[int]]], victim: int
) -> None:
    # A log as admission writes it: appends, and prunings that delete some older events and then
    # append a RunsPruned event with their count.
    present: list[int] = []
    pruned: dict[int, int] = {}
    for prune, picks in steps:
        if prune:
            candidates = [p for p in present if p not in pruned]
            chosen = {candidates[i % len(candidates)] for i in picks} if candidates else set()
            present = [p for p in present if p not in chosen]
            present.append(max([*present, *chosen, *pruned, 0]) + 1)
            pruned[present[-1]] = len(chosen)
        else:
            present.append(max([*present, *pruned, 0]) + 1)
    assert list(unexplained_gaps(marks(present, pruned))) == []
    interior = sorted(present)[:-1]  # the newest is the top-of-log check (sqlite_sequence), not this one
    if interior:
        gone = interior[victim % len(interior)]
        after = [p for p in present if p != gone]
        assert list(unexplained_gaps(marks(after, {p: c for p, c in pruned.items() if p != gone}))) != []


def test_a_changed_byte_that_decodes_as_a_text_is_a_mismatch_not_a_sealed_note() -> None:
    # {} is 0xa0; 0xa0 ^ 0xc0 is 0x60, the empty text: a text, but not an envelope.
    row = stored("signal", "go", {}, None, None)
    assert row.arguments == b"\xa0"
    row.arguments = b"\x60"
    assert ("arguments_digest_mismatch", "c-1") in findings(row)
    assert ("sealed", "c-1") not in findings(row)


@QUICK
@given(ARGUMENTS, TEXT, TEXT)
def test_only_the_envelope_text_the_adapter_writes_is_a_sealed_note(
    arguments: object, codec: str, blob: str
) -> None:
    envelope = json.dumps(
        {"codec": codec, "blob": blob}, ensure_ascii=False, separators=(",", ":"), sort_keys=True
    )
    row = stored("signal", "go", arguments, None, None)
    row.arguments = canonical_encode(envelope)
    assert findings(row) == {("sealed", "c-1")}
    # The same members spaced or in another order are not what the adapter writes.
    row.arguments = canonical_encode(json.dumps({"blob": blob, "codec": codec}, indent=1))
    assert ("arguments_digest_mismatch", "c-1") in findings(row)


@given(st.text(), st.text())
def test_the_envelope_text_is_known_and_any_other_spelling_of_it_is_not(codec: str, blob: str) -> None:
    # One definition of what a sealed command stores, for the HTTP adapter and the audit alike.
    text = envelope_text(codec, blob)
    assert is_envelope_text(text)
    assert not is_envelope_text(text.replace(":", ": ", 1))
    assert not is_envelope_text(json.dumps({"blob": blob, "codec": codec, "x": ""}, separators=(",", ":")))
