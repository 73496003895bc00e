#!/usr/bin/env python3
"""Build a deterministic legacy database: what an older engine left behind (contract §6).

Usage: ``python tools/legacy_fixtures.py URL [--full]``

``URL`` names an EMPTY database (a SQLite file or PostgreSQL).  It is upgraded
to schema revision ``0001`` only (the receipt schema before intents), and then
filled with plain SQLAlchemy Core inserts, with fixed ids and fixed
timestamps (no randomness, no clock), with the rows an older writer would have
left: instances in two namespaces, runs (open, completed, and continued with a
current successor), commands, updates and history events (``tx_id`` 0,
payloads in the canonical encoding).  The printed JSON is the manifest's
summary (``--full``: the whole manifest).

Every legacy receipt shape of contract §6 is present, for updates and, where
meaningful, signals, in open, completed and continued runs:

- ``raw-key``: ``request_id`` holds the literal key (older writers, updates
  only), with the literal key in the context, or with a NULL context;
- ``token``: ``request_id`` holds ``<type>-v1:`` + sha256(key), the context
  holds the literal key;
- ``two-rows``: a raw-key row and a token row answer the same key;
- ``legacy-token``: a token row whose context does not prove its key (NULL,
  no ``request_id`` in it, or a token that is only the token of a raw value);
- ``modern-raw``: a raw value shaped like a token, sent as the key;
- unkeyed signals (``request_id`` NULL, context NULL or without a key).

The manifest (:class:`LegacyManifest`) says, for each case, the key a caller
would send, its name and target, and the answer contract §4/§6 asks for:
``retained_unverified`` (with command id, run id, update id, outcome, result)
or ``ambiguous`` (with the shape).  The expectations are written here by hand
from the contract, never computed with admission's own rules.

Importable: ``build_legacy_database(url) -> LegacyManifest``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import unicodedata
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final, Literal

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sqlalchemy import Connection, Engine, MetaData, insert, inspect, select

from admission import canonical_encode
from admission.sql import create_admission_engine, upgrade
from admission.sql._revisions import HOST_VERSION_TABLE, LEGACY_REVISIONS, VERSION_TABLE, version_table_of

__all__ = [
    "LEGACY_REVISION",
    "LegacyCase",
    "LegacyInstance",
    "LegacyManifest",
    "UnkeyedCommand",
    "build_legacy_database",
    "main",
]

LEGACY_REVISION: Final = "0001"
"""The revision the legacy database is left at."""

_ID_NAMESPACE: Final = uuid.UUID("5d0f8a36-6c1e-4a51-9f57-0c2b9d1e4a77")
_EPOCH: Final = datetime(2025, 3, 1, 9, 0, 0, tzinfo=UTC)
_TABLES: Final = (
    "workflow_instances",
    "workflow_runs",
    "workflow_commands",
    "workflow_updates",
    "workflow_history_events",
)

CommandType = Literal["signal", "update"]
Shape = Literal["raw-key", "token", "two-rows", "legacy-token", "modern-raw"]


def _fixed_id(label: str) -> str:
    return str(uuid.uuid5(_ID_NAMESPACE, label))


def token(command_type: str, key: str) -> str:
    """The receipt token, computed here independently of admission.intent._keys (contract §2.5)."""
    return f"{command_type}-v1:{hashlib.sha256(key.encode('utf-8')).hexdigest()}"


def _key_context(key: str) -> bytes:
    return canonical_encode({"request": {"request_id": key}})


_HTTP: Final = {"received": 202, "accepted": 202, "completed": 200, "failed": 422}


# -- the manifest ------------------------------------------------------------------------


@dataclass(frozen=True)
class LegacyCase:
    """One key a caller could send against the legacy database, and the answer it must get.

    ``expected`` is ``retained_unverified`` (the receipt fields are set) or
    ``ambiguous`` (``ambiguity`` is the contract §6 shape).  ``run_state`` is
    the kind of instance (``open``, ``completed``, ``continued``); ``run_status``
    the status of the run the receipt's row(s) belong to.  ``synthetic`` marks a
    shape older writers did not produce for this command type (raw signal
    keys), kept because the rules do not depend on the type.
    """

    case_id: str
    namespace: str
    workflow_id: str
    command_type: CommandType
    key: str
    name: str
    target: str | None
    shape: Shape
    variant: str
    run_state: str
    run_status: str
    expected: Literal["retained_unverified", "ambiguous"]
    ambiguity: str | None = None
    command_id: str | None = None
    run_id: str | None = None
    command_sequence: int | None = None
    update_id: str | None = None
    outcome: str | None = None
    http_status: int | None = None
    result: Any = None
    stored_result: str | None = None
    failure: str | None = None
    row_ids: tuple[str, ...] = ()
    synthetic: bool = False

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (the stored result as hex, ``None`` for a NULL column)."""
        return {
            "case_id": self.case_id,
            "namespace": self.namespace,
            "workflow_id": self.workflow_id,
            "command_type": self.command_type,
            "key": self.key,
            "name": self.name,
            "target": self.target,
            "shape": self.shape,
            "variant": self.variant,
            "run_state": self.run_state,
            "run_status": self.run_status,
            "expected": self.expected,
            "ambiguity": self.ambiguity,
            "command_id": self.command_id,
            "run_id": self.run_id,
            "command_sequence": self.command_sequence,
            "update_id": self.update_id,
            "outcome": self.outcome,
            "http_status": self.http_status,
            "result": self.result,
            "stored_result": self.stored_result,
            "failure": self.failure,
            "row_ids": list(self.row_ids),
            "synthetic": self.synthetic,
        }


@dataclass(frozen=True)
class UnkeyedCommand:
    """A command without a key (``request_id`` NULL): no receipt, nothing to retry by key."""

    namespace: str
    workflow_id: str
    command_id: str
    command_type: CommandType
    run_id: str
    context: str

    def to_dict(self) -> dict[str, Any]:
        return dict(vars(self))


@dataclass(frozen=True)
class LegacyInstance:
    """One workflow instance of the fixture and its runs (oldest first)."""

    namespace: str
    workflow_id: str
    instance_id: str
    run_state: str
    current_run_id: str
    runs: tuple[tuple[str, int, str], ...]
    """``(run_id, run_number, status)`` per run."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "namespace": self.namespace,
            "workflow_id": self.workflow_id,
            "instance_id": self.instance_id,
            "run_state": self.run_state,
            "current_run_id": self.current_run_id,
            "runs": [{"run_id": r, "run_number": n, "status": s} for r, n, s in self.runs],
        }


@dataclass(frozen=True)
class LegacyManifest:
    """What :func:`build_legacy_database` wrote, and what every legacy key must answer."""

    revision: str
    instances: tuple[LegacyInstance, ...]
    cases: tuple[LegacyCase, ...]
    unkeyed: tuple[UnkeyedCommand, ...]
    row_counts: dict[str, int]

    def to_dict(self) -> dict[str, Any]:
        return {
            "revision": self.revision,
            "row_counts": dict(self.row_counts),
            "instances": [i.to_dict() for i in self.instances],
            "cases": [c.to_dict() for c in self.cases],
            "unkeyed": [u.to_dict() for u in self.unkeyed],
        }

    def matrix(self) -> dict[str, dict[str, dict[str, int]]]:
        """Case counts: shape -> run state -> command type."""
        out: dict[str, dict[str, dict[str, int]]] = {}
        for case in self.cases:
            per_state = out.setdefault(case.shape, {}).setdefault(case.run_state, {})
            per_state[case.command_type] = per_state.get(case.command_type, 0) + 1
        return out

    def summary(self) -> dict[str, Any]:
        """A compact view: counts, instances, the shape matrix and one line per case."""
        return {
            "revision": self.revision,
            "row_counts": dict(self.row_counts),
            "instances": [
                f"{i.namespace}/{i.workflow_id}: {i.run_state} "
                f"({', '.join(f'run {n} {s}' for _, n, s in i.runs)})"
                for i in self.instances
            ],
            "cases": len(self.cases),
            "expected": {
                kind: sum(1 for c in self.cases if c.expected == kind)
                for kind in ("retained_unverified", "ambiguous")
            },
            "matrix": self.matrix(),
            "unkeyed_commands": len(self.unkeyed),
            "case_lines": [
                f"{c.case_id}: {c.command_type} {c.key!r} -> {c.expected}"
                + (f" ({c.ambiguity})" if c.ambiguity else f" {c.outcome}")
                for c in self.cases
            ],
        }


# -- the builder ------------------------------------------------------------------------


@dataclass
class _Update:
    row: dict[str, Any]


@dataclass
class _Command:
    inst: _Instance
    row: dict[str, Any]
    key: str | None
    """The literal key the older writer knew (in the event payload), or None."""
    made_from: str | None
    """The key whose raw value or token is in ``request_id``."""
    update: _Update | None = None


@dataclass
class _Instance:
    namespace: str
    workflow_id: str
    run_state: str
    row: dict[str, Any]
    runs: list[dict[str, Any]] = field(default_factory=list)
    commands: list[_Command] = field(default_factory=list)

    @property
    def label(self) -> str:
        return f"{self.namespace}/{self.workflow_id}"

    @property
    def current(self) -> dict[str, Any]:
        return self.runs[-1]


@dataclass
class _PendingCase:
    case_id: str
    instance: _Instance
    command_type: CommandType
    key: str
    shape: Shape
    variant: str
    rows: list[_Command]
    ambiguity: str | None
    synthetic: bool


class _Builder:
    """Collects rows in memory, in the order an older engine would have written them."""

    def __init__(self) -> None:
        self._tick = 0
        self.instances: list[_Instance] = []
        self.events: list[dict[str, Any]] = []
        self.cases: list[_PendingCase] = []
        self.unkeyed: list[UnkeyedCommand] = []

    def now(self) -> datetime:
        self._tick += 1
        return _EPOCH + timedelta(seconds=7 * self._tick, microseconds=1000 * (self._tick % 997))

    def _event(
        self,
        inst: _Instance,
        run_id: str | None,
        event_type: str,
        at: datetime,
        payload: dict[str, Any],
        command_id: str | None = None,
        update_id: str | None = None,
    ) -> None:
        self.events.append(
            {
                "tx_id": 0,
                "namespace": inst.namespace,
                "instance_id": inst.row["id"],
                "run_id": run_id,
                "event_type": event_type,
                "command_id": command_id,
                "update_id": update_id,
                "payload": canonical_encode(payload),
                "recorded_at": at,
            }
        )

    # runs

    def instance(self, namespace: str, workflow_id: str, run_state: str) -> _Instance:
        at = self.now()
        label = f"{namespace}/{workflow_id}"
        inst = _Instance(
            namespace,
            workflow_id,
            run_state,
            {
                "id": _fixed_id(f"instance:{label}"),
                "namespace": namespace,
                "workflow_id": workflow_id,
                "current_run_id": None,
                "created_at": at,
            },
        )
        self.instances.append(inst)
        self._start_run(inst, at, None)
        return inst

    def _start_run(self, inst: _Instance, at: datetime, previous: dict[str, Any] | None) -> None:
        number = len(inst.runs) + 1
        run = {
            "id": _fixed_id(f"run:{inst.label}/{number}"),
            "instance_id": inst.row["id"],
            "run_number": number,
            "status": "open",
            "continued_from_run_id": None if previous is None else previous["id"],
            "started_at": at,
            "closed_at": None,
        }
        inst.runs.append(run)
        inst.row["current_run_id"] = run["id"]
        payload: dict[str, Any] = {"run_number": number}
        if previous is not None:
            payload["continued_from_run_id"] = previous["id"]
        self._event(inst, run["id"], "RunStarted", at, payload)

    def close(self, inst: _Instance, status: str) -> None:
        at = self.now()
        run = inst.current
        run["status"] = status
        run["closed_at"] = at
        self._event(inst, run["id"], "RunClosed", at, {"status": status})

    def continue_as_new(self, inst: _Instance) -> None:
        previous = inst.current
        self.close(inst, "continued")
        self._start_run(inst, previous["closed_at"], previous)

    # commands

    def command(
        self,
        inst: _Instance,
        command_type: CommandType,
        name: str,
        *,
        request_id: str | None,
        context: bytes | None,
        key: str | None,
        made_from: str | None = None,
        arguments: Any = None,
        run: dict[str, Any] | None = None,
        run_scope: bool = False,
        no_arguments: bool = False,
    ) -> _Command:
        """One admitted command (received signal, accepted update) in ``run`` (default: current)."""
        at = self.now()
        run = inst.current if run is None else run
        sequence = len(inst.commands) + 1
        outcome = "received" if command_type == "signal" else "accepted"
        row = {
            "id": _fixed_id(f"command:{inst.label}/{sequence}"),
            "instance_id": inst.row["id"],
            "run_id": run["id"],
            "command_sequence": sequence,
            "command_type": command_type,
            "name": name,
            "target_scope": "run" if run_scope else "instance",
            "requested_run_id": run["id"] if run_scope else None,
            "request_id": request_id,
            "context": context,
            "arguments": None if no_arguments else canonical_encode(arguments),
            "status": outcome,
            "outcome": outcome,
            "rejection_reason": None,
            "created_at": at,
        }
        command = _Command(inst, row, key, made_from)
        inst.commands.append(command)
        if command_type == "update":
            command.update = _Update(
                {
                    "id": _fixed_id(f"update:{inst.label}/{sequence}"),
                    "command_id": row["id"],
                    "instance_id": inst.row["id"],
                    "run_id": run["id"],
                    "name": name,
                    "status": "accepted",
                    "result": None,
                    "failure": None,
                    "accepted_at": at,
                    "completed_at": None,
                }
            )
        payload: dict[str, Any] = {
            "command_type": command_type,
            "name": name,
            "command_sequence": sequence,
            "outcome": outcome,
            "target_scope": row["target_scope"],
            "request_id": key,
        }
        if run_scope:
            payload["requested_run_id"] = run["id"]
        self._event(
            inst,
            run["id"],
            "SignalReceived" if command_type == "signal" else "UpdateAccepted",
            at,
            payload,
            command_id=row["id"],
            update_id=command.update.row["id"] if command.update else None,
        )
        if request_id is None:
            self.unkeyed.append(
                UnkeyedCommand(
                    inst.namespace,
                    inst.workflow_id,
                    row["id"],
                    command_type,
                    run["id"],
                    "NULL" if context is None else context.hex(),
                )
            )
        return command

    def complete(self, inst: _Instance, command: _Command, result: bytes | None) -> _Command:
        """Complete an update; ``result`` None is the legacy NULL column (completed with null)."""
        assert command.update is not None
        at = self.now()
        update = command.update.row
        update.update(status="completed", result=result, completed_at=at)
        payload: dict[str, Any] = {"status": "completed"}
        if result is not None:
            payload["result"] = result
        self._event(inst, update["run_id"], "UpdateCompleted", at, payload, command.row["id"], update["id"])
        return command

    def fail(self, inst: _Instance, command: _Command, failure: str) -> _Command:
        assert command.update is not None
        at = self.now()
        update = command.update.row
        update.update(status="failed", failure=failure, completed_at=at)
        payload = {"status": "failed", "failure": failure}
        self._event(inst, update["run_id"], "UpdateFailed", at, payload, command.row["id"], update["id"])
        return command

    # shapes: each writes the row(s) and registers the case(s) they answer

    def _case(
        self,
        case_id: str,
        shape: Shape,
        variant: str,
        rows: Sequence[_Command],
        key: str | None,
        ambiguity: str | None,
        synthetic: bool,
    ) -> None:
        first = rows[0]
        sent = first.made_from if key is None else key
        assert sent is not None, case_id
        assert all(r.inst is first.inst and r.row["command_type"] == first.row["command_type"] for r in rows)
        self.cases.append(
            _PendingCase(
                case_id,
                first.inst,
                first.row["command_type"],
                sent,
                shape,
                variant,
                list(rows),
                ambiguity,
                synthetic,
            )
        )

    def retained(self, case_id: str, shape: Shape, variant: str, row: _Command) -> None:
        """A key that names exactly ``row``, a legacy receipt: retained, unverified."""
        self._case(case_id, shape, variant, [row], None, None, False)

    def ambiguous(
        self,
        case_id: str,
        shape: Shape,
        variant: str,
        *rows: _Command,
        key: str | None = None,
        synthetic: bool = False,
    ) -> None:
        """A key (default: the one the first row was made from) that ``rows`` answer ambiguously."""
        self._case(case_id, shape, variant, rows, key, shape, synthetic)

    def raw(
        self,
        inst: _Instance,
        command_type: CommandType,
        name: str,
        key: str,
        arguments: Any,
        *,
        with_context: bool = True,
        **options: Any,
    ) -> _Command:
        """A raw-key row: ``request_id`` is the literal key."""
        context = _key_context(key) if with_context else None
        return self.command(
            inst,
            command_type,
            name,
            request_id=key,
            context=context,
            key=key,
            made_from=key,
            arguments=arguments,
            **options,
        )

    def tok(
        self,
        inst: _Instance,
        command_type: CommandType,
        name: str,
        key: str,
        arguments: Any,
        *,
        context: bytes | Literal["key"] | None = "key",
        **options: Any,
    ) -> _Command:
        """A token row: ``request_id`` is the token; the context holds the key unless told otherwise."""
        stored = _key_context(key) if context == "key" else context
        return self.command(
            inst,
            command_type,
            name,
            request_id=token(command_type, key),
            context=stored,
            key=key if context == "key" else None,
            made_from=key,
            arguments=arguments,
            **options,
        )

    def unkeyed_signal(self, inst: _Instance, name: str, context: bytes | None, **options: Any) -> _Command:
        return self.command(inst, "signal", name, request_id=None, context=context, key=None, **options)

    # finishing

    def manifest(self, row_counts: dict[str, int]) -> LegacyManifest:
        instances = tuple(
            LegacyInstance(
                i.namespace,
                i.workflow_id,
                i.row["id"],
                i.run_state,
                i.row["current_run_id"],
                tuple((r["id"], r["run_number"], r["status"]) for r in i.runs),
            )
            for i in self.instances
        )
        cases = tuple(self._finish_case(p) for p in self.cases)
        return LegacyManifest(LEGACY_REVISION, instances, cases, tuple(self.unkeyed), row_counts)

    @staticmethod
    def _finish_case(p: _PendingCase) -> LegacyCase:
        runs = {r["id"]: r for r in p.instance.runs}
        first = p.rows[0].row
        statuses = sorted({runs[c.row["run_id"]]["status"] for c in p.rows})
        common: dict[str, Any] = {
            "case_id": p.case_id,
            "namespace": p.instance.namespace,
            "workflow_id": p.instance.workflow_id,
            "command_type": p.command_type,
            "key": p.key,
            "name": first["name"],
            "target": first["requested_run_id"] if first["target_scope"] == "run" else None,
            "shape": p.shape,
            "variant": p.variant,
            "run_state": p.instance.run_state,
            "run_status": "+".join(statuses),
            "row_ids": tuple(c.row["id"] for c in p.rows),
            "synthetic": p.synthetic,
        }
        if p.ambiguity is not None:
            return LegacyCase(**common, expected="ambiguous", ambiguity=p.ambiguity)
        assert len(p.rows) == 1, p.case_id
        command = p.rows[0]
        update = command.update.row if command.update else None
        outcome = update["status"] if update else first["outcome"]
        stored = None if update is None or update["result"] is None else update["result"]
        return LegacyCase(
            **common,
            expected="retained_unverified",
            command_id=first["id"],
            run_id=first["run_id"],
            command_sequence=first["command_sequence"],
            update_id=update["id"] if update else None,
            outcome=outcome,
            http_status=_HTTP[outcome],
            result=_RESULTS.get(stored) if outcome == "completed" else None,
            stored_result=None if stored is None else stored.hex(),
            failure=update["failure"] if update else None,
        )


# Results are written from this table so the manifest can state the decoded value.
_NULL_RESULT: Final = canonical_encode(None)  # f6
_APPROVED: Final = {"approved": True, "amount": 1250}
_SHIPPED: Final = {"carrier": "DHL", "parcels": [1, 2], "note": "zerbrechlich: Glas"}
_RENEWED: Final = {"renewed": 1, "until": "2026-03-01"}
_RESULTS: Final[dict[bytes | None, Any]] = {
    None: None,
    _NULL_RESULT: None,
    canonical_encode(_APPROVED): _APPROVED,
    canonical_encode(_SHIPPED): _SHIPPED,
    canonical_encode(_RENEWED): _RENEWED,
}


def _write_fixture(b: _Builder) -> None:
    """The fixture itself: every row, in the order an older engine would have written it."""
    U: Final = "update"
    S: Final = "signal"
    no_key = canonical_encode({"request": {}})  # a context that names no key
    nfc = unicodedata.normalize("NFC", "café-7")
    nfd = unicodedata.normalize("NFD", "café-7")
    assert nfc != nfd
    approved = canonical_encode(_APPROVED)
    shipped = canonical_encode(_SHIPPED)

    # ---- acme/order-1001: one open run ------------------------------------------------------
    a1 = b.instance("acme", "order-1001", "open")
    b.retained(
        "a1-u-raw",
        "raw-key",
        "context holds the key; accepted",
        b.raw(a1, U, "approve", "pay-001", {"amount": 100}),
    )
    b.retained(
        "a1-u-raw-noctx",
        "raw-key",
        "context NULL; completed, result NULL",
        b.complete(a1, b.raw(a1, U, "approve", "pay-002", {"amount": 2}, with_context=False), None),
    )
    b.retained(
        "a1-u-token-f6",
        "token",
        "completed, result f6 (null)",
        b.complete(a1, b.tok(a1, U, "approve", "pay-003", {"amount": 3}), _NULL_RESULT),
    )
    b.retained(
        "a1-u-token-result",
        "token",
        "completed with a result",
        b.complete(a1, b.tok(a1, U, "approve", "pay-004", [4]), approved),
    )
    b.retained(
        "a1-u-token-failed",
        "token",
        "failed",
        b.fail(a1, b.tok(a1, U, "approve", "pay-005", {"amount": 5}), "card declined"),
    )
    b.ambiguous(
        "a1-u-two-rows",
        "two-rows",
        "raw row (accepted) and token row (completed)",
        b.raw(a1, U, "approve", "pay-006", {"amount": 6}),
        b.complete(a1, b.tok(a1, U, "approve", "pay-006", {"amount": 6}), _NULL_RESULT),
    )
    b.ambiguous(
        "a1-u-legacy-token-null",
        "legacy-token",
        "context NULL; accepted",
        b.tok(a1, U, "approve", "pay-007", {"amount": 7}, context=None),
    )
    b.ambiguous(
        "a1-u-legacy-token-nokey",
        "legacy-token",
        "context without request_id; completed, NULL",
        b.complete(a1, b.tok(a1, U, "approve", "pay-008", {"amount": 8}, context=no_key), None),
    )
    shaped = b.raw(a1, U, "approve", token(U, "pay-009"), {"amount": 9})
    b.ambiguous("a1-u-modern-raw", "modern-raw", "raw value shaped like a token", shaped)
    b.ambiguous(
        "a1-u-modern-raw-collision",
        "legacy-token",
        "the key's token is a raw value whose context names another key",
        shaped,
        key="pay-009",
    )
    b.retained(
        "a1-u-case-upper",
        "raw-key",
        "differs from pay-010 only in case",
        b.raw(a1, U, "approve", "Pay-010", {"amount": 10}),
    )
    b.retained(
        "a1-u-case-lower",
        "raw-key",
        "differs from Pay-010 only in case; completed",
        b.complete(a1, b.raw(a1, U, "approve", "pay-010", {"amount": 10}), _NULL_RESULT),
    )
    b.retained(
        "a1-u-raw-nonascii",
        "raw-key",
        "non-ASCII raw key",
        b.complete(a1, b.raw(a1, U, "resize", "größe-①-Ω", {"size": "XL"}), approved),
    )
    b.retained(
        "a1-u-token-nonascii",
        "token",
        "non-ASCII key, 4-byte character",
        b.tok(a1, U, "resize", "注文-🚀-42", {"size": "S"}),
    )
    b.retained(
        "a1-u-raw-nfc",
        "raw-key",
        "NFC form; the NFD form is another key",
        b.raw(a1, U, "rename", nfc, {"to": nfc}),
    )
    b.retained(
        "a1-u-token-nfd",
        "token",
        "NFD form; the NFC form is another key",
        b.complete(a1, b.tok(a1, U, "rename", nfd, {"to": nfd}), _NULL_RESULT),
    )
    b.retained(
        "a1-u-token-nul",
        "token",
        "key contains NUL (kept only in the context)",
        b.complete(a1, b.tok(a1, U, "approve", "nul\x00key", {"amount": 0}), approved),
    )
    b.retained(
        "a1-u-token-run-scope",
        "token",
        "run scope; accepted",
        b.tok(a1, U, "approve", "pay-012", {"amount": 12}, run_scope=True),
    )
    b.retained("a1-s-token", "token", "received", b.tok(a1, S, "nudge", "sig-001", ["hello"]))
    b.retained(
        "a1-s-token-shared-key",
        "token",
        "same key as update pay-003: an independent receipt",
        b.tok(a1, S, "nudge", "pay-003", ["same key as an update"]),
    )
    b.unkeyed_signal(a1, "nudge", None, no_arguments=True)
    b.unkeyed_signal(a1, "nudge", no_key, arguments=["no key"])
    b.unkeyed_signal(a1, "nudge", canonical_encode({"request": {"request_id": None}}), arguments=[])
    b.ambiguous(
        "a1-s-legacy-token",
        "legacy-token",
        "context NULL",
        b.tok(a1, S, "nudge", "sig-006", ["lost"], context=None),
    )
    b.ambiguous(
        "a1-s-two-rows",
        "two-rows",
        "raw row and token row",
        b.raw(a1, S, "nudge", "sig-007", ["x"]),
        b.tok(a1, S, "nudge", "sig-007", ["x"]),
        synthetic=True,
    )
    shaped = b.raw(a1, S, "nudge", token(S, "sig-008"), ["y"])
    b.ambiguous("a1-s-modern-raw", "modern-raw", "raw value shaped like a token", shaped, synthetic=True)
    b.ambiguous(
        "a1-s-modern-raw-collision",
        "legacy-token",
        "the key's token is a raw value whose context names another key",
        shaped,
        key="sig-008",
        synthetic=True,
    )
    b.retained(
        "a1-s-token-run-scope",
        "token",
        "run scope",
        b.tok(a1, S, "nudge", "sig-009", ["run"], run_scope=True),
    )
    b.retained("a1-s-token-nonascii", "token", "non-ASCII key", b.tok(a1, S, "ping", "🔔-ping-ü", []))
    b.retained(
        "a1-s-token-case", "token", "differs from sig-001 only in case", b.tok(a1, S, "ping", "SIG-001", [])
    )

    # ---- acme/order-1002: one run, completed; updates finish before it closes ---------------------
    a2 = b.instance("acme", "order-1002", "completed")
    ship_raw = b.raw(a2, U, "ship", "ship-001", {"carrier": "DHL"})
    ship_noctx = b.raw(a2, U, "ship", "ship-002", {"carrier": "UPS"}, with_context=False)
    ship_tok = b.tok(a2, U, "ship", "ship-003", {"carrier": "DHL"})
    ship_f6 = b.tok(a2, U, "ship", "ship-004", {"carrier": "DPD"})
    two_tok = b.tok(a2, U, "ship", "ship-005", {"carrier": "DHL"})
    two_raw = b.raw(a2, U, "ship", "ship-005", {"carrier": "DHL"})
    lost = b.tok(a2, U, "ship", "ship-006", {"carrier": "GLS"}, context=None)
    other = b.tok(
        a2,
        U,
        "ship",
        "ship-007",
        {"carrier": "GLS"},
        context=canonical_encode({"request": {"trace_id": "t-7"}}),
    )
    modern = b.raw(a2, U, "ship", token(U, "ship-008"), {"carrier": "DHL"})
    upper = b.raw(a2, U, "ship", "Ship-009", {"carrier": "DHL"})
    lower = b.tok(a2, U, "ship", "SHIP-009", {"carrier": "DHL"})
    strasse = b.tok(a2, U, "ship", "Straße-10", {"carrier": "Post"})
    sig = b.tok(a2, S, "note", "note-001", ["packed"])
    b.unkeyed_signal(a2, "note", None, arguments=["unkeyed"])
    sig_lost = b.tok(a2, S, "note", "note-002", ["lost"], context=None)
    sig_raw = b.raw(a2, S, "note", "note-003", ["dup"])
    sig_tok = b.tok(a2, S, "note", "note-003", ["dup"])
    sig_modern = b.raw(a2, S, "note", token(S, "note-004"), ["z"], with_context=False)
    b.complete(a2, ship_raw, None)
    b.fail(a2, ship_noctx, "address unknown")
    b.complete(a2, ship_tok, shipped)
    b.complete(a2, ship_f6, _NULL_RESULT)
    b.fail(a2, two_tok, "duplicate shipment")
    b.complete(a2, two_raw, None)
    b.complete(a2, lost, _NULL_RESULT)
    b.complete(a2, other, shipped)
    b.complete(a2, modern, None)
    b.complete(a2, upper, _NULL_RESULT)
    b.fail(a2, lower, "wrong warehouse")
    b.complete(a2, strasse, shipped)
    b.close(a2, "completed")
    b.retained("a2-u-raw", "raw-key", "context holds the key; completed, result NULL", ship_raw)
    b.retained("a2-u-raw-noctx", "raw-key", "context NULL; failed", ship_noctx)
    b.retained("a2-u-token-result", "token", "completed with a result", ship_tok)
    b.retained("a2-u-token-f6", "token", "completed, result f6 (null)", ship_f6)
    b.ambiguous("a2-u-two-rows", "two-rows", "token row (failed) and raw row (completed)", two_tok, two_raw)
    b.ambiguous("a2-u-legacy-token-null", "legacy-token", "context NULL; completed", lost)
    b.ambiguous("a2-u-legacy-token-nokey", "legacy-token", "context without request_id; completed", other)
    b.ambiguous("a2-u-modern-raw", "modern-raw", "raw value shaped like a token", modern)
    b.ambiguous(
        "a2-u-modern-raw-collision",
        "legacy-token",
        "the key's token is a raw value whose context names another key",
        modern,
        key="ship-008",
    )
    b.retained("a2-u-case-raw", "raw-key", "differs from SHIP-009 only in case", upper)
    b.retained("a2-u-case-token", "token", "differs from Ship-009 only in case; failed", lower)
    b.retained("a2-u-token-nonascii", "token", "non-ASCII key (ß)", strasse)
    b.retained("a2-s-token", "token", "received", sig)
    b.ambiguous("a2-s-legacy-token", "legacy-token", "context NULL", sig_lost)
    b.ambiguous("a2-s-two-rows", "two-rows", "raw row and token row", sig_raw, sig_tok, synthetic=True)
    b.ambiguous(
        "a2-s-modern-raw",
        "modern-raw",
        "raw value shaped like a token, no context",
        sig_modern,
        synthetic=True,
    )
    b.ambiguous(
        "a2-s-modern-raw-collision",
        "legacy-token",
        "the key's token is a raw value with no context",
        sig_modern,
        key="note-004",
        synthetic=True,
    )

    # ---- acme/order-1003: run 1 continued as new, run 2 open and current -----------------------
    a3 = b.instance("acme", "order-1003", "continued")
    first = a3.current
    b.retained(
        "a3-u-raw",
        "raw-key",
        "continued run; completed with a result",
        b.complete(a3, b.raw(a3, U, "renew", "renew-001", {"months": 12}), canonical_encode(_RENEWED)),
    )
    b.retained(
        "a3-u-raw-noctx",
        "raw-key",
        "context NULL; completed, result NULL",
        b.complete(a3, b.raw(a3, U, "renew", "renew-002", {"months": 1}, with_context=False), None),
    )
    b.retained(
        "a3-u-token-f6",
        "token",
        "completed, result f6 (null)",
        b.complete(a3, b.tok(a3, U, "renew", "renew-003", {"months": 3}), _NULL_RESULT),
    )
    b.retained(
        "a3-u-token-failed",
        "token",
        "failed",
        b.fail(a3, b.tok(a3, U, "renew", "renew-004", {"months": 4}), "plan retired"),
    )
    b.retained(
        "a3-u-token-run-scope",
        "token",
        "run scope on the continued run; completed",
        b.complete(a3, b.tok(a3, U, "renew", "renew-005", {"months": 5}, run_scope=True), _NULL_RESULT),
    )
    b.ambiguous(
        "a3-u-legacy-token-null",
        "legacy-token",
        "context NULL; accepted",
        b.tok(a3, U, "renew", "renew-006", {"months": 6}, context=None),
    )
    shaped = b.complete(a3, b.raw(a3, U, "renew", token(U, "renew-007"), {"months": 7}), None)
    b.ambiguous("a3-u-modern-raw", "modern-raw", "raw value shaped like a token", shaped)
    b.ambiguous(
        "a3-u-modern-raw-collision",
        "legacy-token",
        "the key's token is a raw value whose context names another key",
        shaped,
        key="renew-007",
    )
    span_raw = b.complete(a3, b.raw(a3, U, "renew", "renew-008", {"months": 8}), _NULL_RESULT)
    b.retained("a3-s-token", "token", "continued run", b.tok(a3, S, "ping", "ping-001", [1]))
    b.retained(
        "a3-s-token-run-scope",
        "token",
        "run scope on the continued run",
        b.tok(a3, S, "ping", "ping-002", [2], run_scope=True),
    )
    b.unkeyed_signal(a3, "ping", None, arguments=[0])
    b.ambiguous(
        "a3-s-legacy-token",
        "legacy-token",
        "context without request_id",
        b.tok(a3, S, "ping", "ping-003", [3], context=no_key),
    )
    b.ambiguous(
        "a3-s-modern-raw",
        "modern-raw",
        "raw value shaped like a token",
        b.raw(a3, S, "ping", token(S, "ping-006"), [6]),
        synthetic=True,
    )
    sig_span_raw = b.raw(a3, S, "ping", "ping-004", [4])
    b.continue_as_new(a3)
    assert a3.current is not first
    b.ambiguous(
        "a3-u-two-rows-across-runs",
        "two-rows",
        "raw row on the continued run, token row on its successor",
        span_raw,
        b.tok(a3, U, "renew", "renew-008", {"months": 8}),
    )
    b.ambiguous(
        "a3-s-two-rows-across-runs",
        "two-rows",
        "raw row on the continued run, token row on its successor",
        sig_span_raw,
        b.tok(a3, S, "ping", "ping-004", [4]),
        synthetic=True,
    )
    b.retained(
        "a3-u-token-successor",
        "token",
        "on the successor run; accepted",
        b.tok(a3, U, "renew", "renew-009", {"months": 9}),
    )
    b.retained(
        "a3-u-case-successor",
        "raw-key",
        "differs from renew-001 (continued run) only in case",
        b.raw(a3, U, "renew", "Renew-001", {"months": 12}),
    )
    b.retained(
        "a3-u-raw-nonascii-successor",
        "raw-key",
        "non-ASCII raw key on the successor run",
        b.complete(a3, b.raw(a3, U, "renew", "ünïcödé-renew", {"months": 2}), _NULL_RESULT),
    )
    b.retained("a3-s-token-successor", "token", "on the successor run", b.tok(a3, S, "ping", "ping-005", [5]))
    b.unkeyed_signal(a3, "ping", None, no_arguments=True)

    # ---- globex/order-1001: the workflow id and keys of acme/order-1001, another namespace -------
    g1 = b.instance("globex", "order-1001", "open")
    b.retained(
        "g1-u-token-same-key",
        "token",
        "acme/order-1001 has a raw row for this key",
        b.complete(g1, b.tok(g1, U, "approve", "pay-001", {"amount": 100}), approved),
    )
    b.retained(
        "g1-u-raw-same-key",
        "raw-key",
        "a legacy-token ambiguity in acme, a plain receipt here",
        b.raw(g1, U, "approve", "pay-007", {"amount": 7}),
    )
    b.retained(
        "g1-s-token-same-key",
        "token",
        "same key as acme/order-1001 sig-001",
        b.tok(g1, S, "nudge", "sig-001", ["hello"]),
    )
    b.unkeyed_signal(g1, "nudge", None, arguments=["unkeyed"])


def _insert(conn: Connection, b: _Builder) -> dict[str, int]:
    meta = MetaData()
    meta.reflect(conn, only=list(_TABLES))
    t = meta.tables
    conn.execute(insert(t["workflow_instances"]), [i.row for i in b.instances])
    conn.execute(insert(t["workflow_runs"]), [r for i in b.instances for r in i.runs])
    commands = [c for i in b.instances for c in i.commands]
    conn.execute(insert(t["workflow_commands"]), [c.row for c in commands])
    conn.execute(insert(t["workflow_updates"]), [c.update.row for c in commands if c.update is not None])
    # One at a time, without a position: the database assigns 1, 2, ... as an older engine's inserts got.
    events = t["workflow_history_events"]
    for event in b.events:
        conn.execute(insert(events).values(event))
    positions = conn.execute(select(events.c.position).order_by(events.c.position)).scalars().all()
    if positions != list(range(1, len(b.events) + 1)):
        raise RuntimeError(f"history positions are not 1..{len(b.events)}: is the database fresh?")
    return {name: len(conn.execute(select(t[name])).all()) for name in _TABLES}


Stamping = Literal["legacy", "none"]


def _restamp(engine: Engine, stamp: Stamping) -> None:
    own, legacy = version_table_of(VERSION_TABLE), version_table_of(HOST_VERSION_TABLE)
    with engine.begin() as conn:
        own.drop(conn)
        if stamp == "legacy":
            legacy.create(conn)
            conn.execute(legacy.insert().values(version_num=LEGACY_REVISION))


def build_legacy_database(url: str, *, stamp: Stamping = "legacy") -> LegacyManifest:
    """Upgrade the EMPTY database at ``url`` to revision 0001 and write the legacy fixture into it.

    ``stamp`` says how the revision is left recorded: ``"legacy"`` as earlier
    builds stamped it (``0001`` in ``alembic_version``), ``"none"`` as an
    older engine that never used alembic left it (no version table at all).
    """
    engine = create_admission_engine(url)
    try:
        with engine.connect() as conn:
            existing = inspect(conn).get_table_names()
        if existing:
            raise RuntimeError(f"the database is not empty (it has {', '.join(sorted(existing))})")
        revision = upgrade(engine, LEGACY_REVISION)
        if revision != LEGACY_REVISIONS[LEGACY_REVISION]:
            raise RuntimeError(f"upgrade to {LEGACY_REVISION} left the database at {revision!r}")
        _restamp(engine, stamp)
        builder = _Builder()
        _write_fixture(builder)
        with engine.begin() as conn:
            counts = _insert(conn, builder)
        return builder.manifest(counts)
    finally:
        engine.dispose()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("url", metavar="URL", help="an empty database: sqlite:///path or postgresql://...")
    parser.add_argument("--full", action="store_true", help="print the whole manifest, not the summary")
    parser.add_argument(
        "--stamp",
        choices=["legacy", "none"],
        default="legacy",
        help="leave 0001 in alembic_version as earlier builds did (legacy), or no stamp at all (none)",
    )
    args = parser.parse_args(argv)
    manifest = build_legacy_database(args.url, stamp=args.stamp)
    print(json.dumps(manifest.to_dict() if args.full else manifest.summary(), indent=2, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
