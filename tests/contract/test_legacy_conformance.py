"""Property-based conformance: legacy rows and new admissions against a reference model of §4 and §6.

A hypothesis state machine plants legacy rows (raw keys, tokens with and
without their literal key, raw values shaped like tokens) beside the rows new
admissions write, and checks every answer of the real service against a
small model written from the contract's words.  It runs on every store.
"""

from __future__ import annotations

import hashlib
import itertools
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from admission import canonical_encode
from admission.receipts import AdmissionService, CommandRow, Decision, Store, UpdateRow

NS = "conformance"
KEYS = [
    "k1",
    "K1",
    "k2",
    "é",
    "update-v1:" + hashlib.sha256(b"k1").hexdigest(),
    "signal-v1:" + hashlib.sha256(b"k2").hexdigest(),
]
NAMES = ["approve", "reject"]
ARGUMENTS = [[], [1], [1.0], {"a": 1}]


def token(command_type: str, key: str) -> str:
    return f"{command_type}-v1:" + hashlib.sha256(key.encode()).hexdigest()


def looks_like_token(value: str) -> bool:
    prefix, _, digest = value.partition("-v1:")
    return (
        prefix in ("signal", "update") and len(digest) == 64 and all(c in "0123456789abcdef" for c in digest)
    )


@dataclass(frozen=True)
class ModelRow:
    """A stored row as the contract describes it."""

    command_id: str
    request_id: str
    literal: str | None
    name: str
    target: str | None
    arguments: object
    modern: bool


@dataclass(frozen=True)
class Expected:
    decision: Decision
    command_id: str | None = None
    conflict: tuple[str, ...] = ()
    verified: bool = True


def expect(
    rows: list[ModelRow], key: str, name: str, arguments: object, target: str | None, command_type: str
) -> Expected | None:
    """Contract §4 and §6, read literally: ``None`` means "no receipt: a fresh command"."""
    tok = token(command_type, key)
    # Rows that answer the key: a modern row is stored under its token with its
    # literal key; a legacy row answers by raw value or by token.
    modern = [r for r in rows if r.modern and r.request_id == tok and r.literal == key]
    legacy = [r for r in rows if not r.modern and r.request_id in (key, tok)]
    found = modern + legacy
    if not found:
        return None
    if len(found) > 1:
        return Expected(Decision.AMBIGUOUS)  # two-rows
    row = found[0]
    if row.modern:
        parts = tuple(
            part
            for part, same in (
                ("name", row.name == name),
                ("arguments", canonical_encode(row.arguments) == canonical_encode(arguments)),
                ("target", row.target == target),
            )
            if not same
        )
        if parts:
            return Expected(Decision.CONFLICT, row.command_id, parts)
        return Expected(Decision.RETAINED, row.command_id)
    if row.request_id == key and key != tok and looks_like_token(key):
        return Expected(Decision.AMBIGUOUS)  # modern-raw
    if row.request_id == tok and row.literal != key:
        return Expected(Decision.AMBIGUOUS)  # legacy-token
    parts = tuple(
        part for part, same in (("name", row.name == name), ("target", row.target == target)) if not same
    )
    if parts:
        return Expected(Decision.CONFLICT, row.command_id, parts, verified=False)
    return Expected(Decision.RETAINED, row.command_id, verified=False)


class LegacyConformance(RuleBasedStateMachine):
    """One instance per run of the machine, with an open run; legacy rows planted directly in the store."""

    store: Store
    counter = itertools.count()

    @initialize()
    def start(self) -> None:
        self.workflow_id = f"wf-{next(self.counter)}"
        clock = itertools.count()
        self.service = AdmissionService(
            self.store, clock=lambda: datetime(2026, 1, 1, tzinfo=UTC) + timedelta(seconds=next(clock))
        )
        self.run_id = self.service.start_run(NS, self.workflow_id).run_id
        self.rows: dict[str, list[ModelRow]] = {"signal": [], "update": []}
        self.fresh = 0

    @rule(
        command_type=st.sampled_from(["signal", "update"]),
        key=st.sampled_from(KEYS),
        name=st.sampled_from(NAMES),
        scope=st.booleans(),
        shape=st.sampled_from(["raw", "token", "token-without-literal"]),
    )
    def plant_legacy_row(self, command_type: str, key: str, name: str, scope: bool, shape: str) -> None:
        request_id = key if shape == "raw" else token(command_type, key)
        if any(r.request_id == request_id for r in self.rows[command_type]):
            return  # the unique index forbids it; older code could not have written it either
        literal = None if shape == "token-without-literal" else key
        target = self.run_id if scope else None
        command_id = f"legacy-{next(self.counter)}"
        now = datetime(2025, 6, 1, tzinfo=UTC)
        with self.store.locked(NS, self.workflow_id, created_at=now, new_id="unused") as tx:
            tx.insert_command(
                CommandRow(
                    id=command_id,
                    instance_id=tx.instance.id,
                    run_id=self.run_id,
                    command_sequence=tx.next_command_sequence(),
                    command_type=command_type,
                    name=name,
                    target_scope="run" if scope else "instance",
                    requested_run_id=target,
                    request_id=request_id,
                    context=None
                    if literal is None
                    else canonical_encode({"request": {"request_id": literal}}),
                    arguments=b"legacy-codec-payload",
                    status="received" if command_type == "signal" else "accepted",
                    outcome="received" if command_type == "signal" else "accepted",
                    rejection_reason=None,
                    created_at=now,
                    intent_digest=None,
                    arguments_digest=None,
                    intent_encoding=None,
                )
            )
            if command_type == "update":
                tx.insert_update(
                    UpdateRow(
                        f"u-{command_id}",
                        command_id,
                        tx.instance.id,
                        self.run_id,
                        name,
                        "accepted",
                        None,
                        None,
                        now,
                        None,
                    )
                )
        self.rows[command_type].append(
            ModelRow(command_id, request_id, literal, name, target, None, modern=False)
        )

    @rule(
        command_type=st.sampled_from(["signal", "update"]),
        key=st.sampled_from(KEYS),
        name=st.sampled_from(NAMES),
        arguments=st.sampled_from(ARGUMENTS),
        scope=st.booleans(),
    )
    def admit(self, command_type: str, key: str, name: str, arguments: object, scope: bool) -> None:
        target = self.run_id if scope else None
        expected = expect(self.rows[command_type], key, name, arguments, target, command_type)
        admit = self.service.admit_signal if command_type == "signal" else self.service.admit_update
        answer = admit(NS, self.workflow_id, name, arguments, request_id=key, run_id=target)
        if expected is None:
            assert answer.decision is Decision.FRESH and answer.intent_verified
            self.fresh += 1
            assert answer.command_id is not None
            self.rows[command_type].append(
                ModelRow(
                    answer.command_id, token(command_type, key), key, name, target, arguments, modern=True
                )
            )
            return
        assert answer.decision is expected.decision, (answer.to_dict(), expected)
        if expected.decision is Decision.AMBIGUOUS:
            assert answer.command_id is None and answer.http_status == 409
            return
        assert answer.intent_verified is expected.verified
        if expected.decision is Decision.CONFLICT:
            assert answer.conflict == expected.conflict
            assert answer.retained_command_id == expected.command_id
        else:
            assert answer.retained and answer.command_id == expected.command_id

    @precondition(lambda self: self.rows["update"] or self.rows["signal"])
    @rule(key=st.sampled_from(KEYS))
    def read_receipt(self, key: str) -> None:
        for command_type in ("signal", "update"):
            answer = self.service.receipt(NS, self.workflow_id, command_type, key)  # type: ignore[arg-type]
            # Reading never writes and never contradicts admission.
            probe = expect(self.rows[command_type], key, "", [], None, command_type)
            if probe is None:
                assert answer is None
            elif probe.decision is Decision.AMBIGUOUS:
                assert answer is not None and answer.decision is Decision.AMBIGUOUS
            else:
                assert answer is not None and answer.command_id == probe.command_id

    @invariant()
    def only_fresh_admissions_write_events(self) -> None:
        assert len(self.service.history(NS, self.workflow_id)) == 1 + self.fresh


def test_legacy_rows_and_new_admissions_follow_the_contract(store: Store) -> None:
    machine = type("Machine", (LegacyConformance,), {"store": store})
    run_state_machine_as_test(
        machine, settings=settings(max_examples=60, stateful_step_count=25, deadline=None)
    )


@pytest.mark.parametrize(
    ("rows", "key", "shape"),
    [
        (
            [
                ModelRow("a", "k", "k", "n", None, None, False),
                ModelRow("b", token("update", "k"), "k", "n", None, None, False),
            ],
            "k",
            "two-rows",
        ),
        ([ModelRow("a", token("update", "k"), None, "n", None, None, False)], "k", "legacy-token"),
        (
            [ModelRow("a", token("update", "x"), None, "n", None, None, False)],
            token("update", "x"),
            "modern-raw",
        ),
    ],
)
def test_the_model_knows_the_three_ambiguity_shapes(rows: list[ModelRow], key: str, shape: str) -> None:
    assert expect(rows, key, "n", [], None, "update") == Expected(Decision.AMBIGUOUS), shape
