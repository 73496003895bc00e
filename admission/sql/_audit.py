"""The operator's deep audit: re-verify what the store holds, read-only, in one snapshot.

:func:`audit` re-derives every stored intent digest from the stored canonical
bytes (contract §3), checks that every command has its admission event and
every recorded state its event, that no event or row names a row that is gone,
that every stored value is canonical, and (SQLite) that the event log has no
hole that pruning does not account for (docs/event-log.md, "Gaps").  It reads
in one transaction (``REPEATABLE READ``, read-only, on PostgreSQL; one read
transaction with ``query_only`` on SQLite), streaming each table in batches,
and writes nothing.  Findings name a table, a row key and what is wrong; never
an argument, a result, a literal key or any other stored value.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from sqlalchemy import Engine, Executable, Table, text
from sqlalchemy.engine import Connection

from admission.errors import AdmissionError
from admission.intent._encoding import INTENT_VERSION, canonical_decode, intent_record
from admission.intent._keys import receipt_token
from admission.receipts._answers import context_of, literal_key
from admission.receipts._sealed import is_envelope_text
from admission.sql._audit_queries import (
    BLOBS,
    COMMANDS_WITH_EVENTS,
    EVENTS_WITHOUT_ROW,
    LOGS_NEVER_DELETED,
    PRUNED_EVENTS_AND_GAPS,
    REFERENCES,
    STATES_WITHOUT_EVENT,
    UPDATES_MISSING,
    blob_rows,
    gaps_of,
    high_water,
    row_key,
)
from admission.sql._compact import kept_key
from admission.sql._engine import is_postgresql, wrap_exceptions
from admission.sql._schema import workflow_commands, workflow_history_events

__all__ = ["DEFAULT_AUDIT_BATCH", "DEFAULT_MAX_FINDINGS", "FINDING_KINDS", "AuditReport", "Finding", "audit"]

DEFAULT_AUDIT_BATCH: Final = 1000
"""Rows fetched per round trip while streaming a table."""

DEFAULT_MAX_FINDINGS: Final = 1000
"""Findings listed in a report; beyond it they are counted (``counts``) but not listed."""

FINDING_KINDS: Final = {
    "intent_digest_mismatch": "the intent digest recomputed from the stored type, name, target and "
    "arguments is not the stored one",
    "arguments_digest_mismatch": "the SHA-256 of the stored arguments is not the stored arguments digest",
    "arguments_not_canonical": "the stored arguments are missing, not canonical, or not a list or a map",
    "context_mismatch": "the context is not canonical, or the key in it does not give the stored token",
    "unknown_encoding": "the intent digest was made with an encoding this version does not know",
    "event_digest_mismatch": "the admission event records another intent digest than its command",
    "event_key_mismatch": "a compact admission event does not hold its command's literal key alone",
    "missing_event": "a command, run, update or signal state has no event recording it",
    "duplicate_event": "a command has more than one admission event",
    "orphan_event": "an event names a command, update or run the store does not hold",
    "missing_update": "an admitted update command has no update row",
    "dangling_reference": "a row names a row of another table that does not exist",
    "not_canonical": "a stored value is not in the canonical encoding",
    "event_gap": "positions missing from an event log that no pruning accounts for",
    "unverifiable": "a legacy command stored without an intent digest: nothing to verify it against",
    "sealed": "arguments stored sealed (an envelope as received): their digests are over the plaintext, "
    "which the audit cannot read without the key",
}
"""Every kind of finding, and what it means (docs/cli.md, ``db check --deep``)."""

NOTE_KINDS: Final = frozenset({"unverifiable", "sealed"})
"""Kinds that are notes, not faults: a report with only these is clean."""


@dataclass(frozen=True)
class Finding:
    """One thing the audit found: its ``kind`` (:data:`FINDING_KINDS`), the ``table`` and row ``key``
    it concerns, and a ``detail`` that names columns and counts, never a stored value."""

    kind: str
    table: str
    key: Mapping[str, Any]
    detail: str

    @property
    def severity(self) -> Literal["error", "note"]:
        """``note`` for what cannot be verified (legacy rows), ``error`` for everything else."""
        return "note" if self.kind in NOTE_KINDS else "error"

    def to_dict(self) -> dict[str, object]:
        """The JSON form."""
        return {
            "kind": self.kind,
            "severity": self.severity,
            "table": self.table,
            "key": dict(self.key),
            "detail": self.detail,
        }


@dataclass(frozen=True)
class AuditReport:
    """What :func:`audit` found: the first ``max_findings`` findings, exact counts per kind, and how
    many values were checked (``workflow_commands``: commands; ``table.column``: stored values)."""

    findings: tuple[Finding, ...]
    counts: Mapping[str, int]
    rows: Mapping[str, int]
    truncated: bool

    @property
    def faults(self) -> dict[str, int]:
        """The counts of every kind found that is a fault, not a note."""
        return {
            kind: count for kind, count in sorted(self.counts.items()) if count and kind not in NOTE_KINDS
        }

    @property
    def ok(self) -> bool:
        """Whether nothing but notes was found."""
        return not self.faults

    def to_dict(self) -> dict[str, object]:
        """The JSON form, findings in the order they were found."""
        return {
            "ok": self.ok,
            "counts": dict(sorted(self.counts.items())),
            "rows": dict(sorted(self.rows.items())),
            "truncated": self.truncated,
            "findings": [f.to_dict() for f in self.findings],
        }


@dataclass
class _Collector:
    limit: int
    findings: list[Finding] = field(default_factory=list)
    counts: Counter[str] = field(default_factory=Counter)
    rows: Counter[str] = field(default_factory=Counter)

    def add(self, kind: str, table: str, key: Mapping[str, Any], detail: str) -> None:
        assert kind in FINDING_KINDS, kind
        self.counts[kind] += 1
        if len(self.findings) < self.limit:
            self.findings.append(Finding(kind, table, dict(key), detail))

    def report(self) -> AuditReport:
        return AuditReport(
            tuple(self.findings), dict(self.counts), dict(self.rows), sum(self.counts.values()) > self.limit
        )


def audit(
    engine: Engine, *, batch_size: int = DEFAULT_AUDIT_BATCH, max_findings: int = DEFAULT_MAX_FINDINGS
) -> AuditReport:
    """Audit the database behind ``engine`` (at the head revision), read-only, in one snapshot.

    Streams every table ``batch_size`` rows at a time; lists at most
    ``max_findings`` findings (the counts stay exact).  A driver error raises
    :class:`~admission.errors.StorageError`; an unusable ``batch_size`` or
    ``max_findings`` raises :class:`ValueError` before anything is read.
    """
    if type(batch_size) is not int or not 1 <= batch_size <= 100_000:
        raise ValueError(f"batch_size must be an int from 1 to 100000, got {batch_size!r}")
    if type(max_findings) is not int or max_findings < 0:
        raise ValueError(f"max_findings must be an int >= 0, got {max_findings!r}")
    found = _Collector(max_findings)
    with wrap_exceptions(engine.dialect), _snapshot(engine) as conn:
        _commands(conn, batch_size, found)
        for command_id in _stream(conn, UPDATES_MISSING, batch_size):
            found.add(
                "missing_update", "workflow_commands", {"id": command_id[0]}, "no row in workflow_updates"
            )
        for state in STATES_WITHOUT_EVENT:
            for row in _stream(conn, state.missing(), batch_size):
                found.add(
                    "missing_event",
                    state.table.name,
                    {state.key: row[0]},
                    f"no {state.event_type} event names it ({state.event_column})",
                )
        for reference in EVENTS_WITHOUT_ROW:
            for row in _stream(conn, reference.missing(), batch_size):
                found.add(
                    "orphan_event",
                    reference.table.name,
                    row_key(reference.table, row),
                    f"{reference.column} names no row of {reference.parent.name}",
                )
        for reference in REFERENCES:
            for row in _stream(conn, reference.missing(), batch_size):
                found.add(
                    "dangling_reference",
                    reference.table.name,
                    row_key(reference.table, row),
                    f"{reference.column} names no row of {reference.parent.name}",
                )
        for table, column in BLOBS:
            _canonical(conn, table, column, batch_size, found)
        if not is_postgresql(engine.dialect):
            _sqlite_gaps(conn, batch_size, found)
    return found.report()


@contextmanager
def _snapshot(engine: Engine) -> Iterator[Connection]:
    """One read-only transaction that sees one state of the database throughout."""
    with engine.connect() as conn:
        if is_postgresql(engine.dialect):
            conn = conn.execution_options(isolation_level="REPEATABLE READ", postgresql_readonly=True)
            with conn.begin() as transaction:
                yield conn
                transaction.rollback()
            return
        # SQLite: a deferred BEGIN takes its read snapshot at the first SELECT
        # and keeps it (WAL) to the end; query_only refuses any write meanwhile.
        # Text that is not UTF-8 is read with replacement characters, so that
        # it is a digest finding, not a driver error that would quote it.
        dbapi: Any = conn.connection.dbapi_connection
        text_factory = dbapi.text_factory
        dbapi.text_factory = _lenient_text
        conn.exec_driver_sql("PRAGMA query_only=ON")
        try:
            yield conn
        finally:
            conn.rollback()
            conn.exec_driver_sql("PRAGMA query_only=OFF")
            conn.rollback()
            dbapi.text_factory = text_factory


def _lenient_text(data: bytes) -> str:
    return data.decode("utf-8", "replace")


def _stream(conn: Connection, statement: Executable, batch_size: int) -> Iterator[Any]:
    """The statement's rows, fetched ``batch_size`` at a time (a server-side cursor on PostgreSQL)."""
    result = conn.execution_options(yield_per=batch_size).execute(statement)
    for partition in result.partitions():
        yield from partition


def _commands(conn: Connection, batch_size: int, found: _Collector) -> None:
    """Every command's digests, context and admission event (``COMMANDS_WITH_EVENTS``)."""
    table = workflow_commands.name
    previous: str | None = None
    for row in _stream(conn, COMMANDS_WITH_EVENTS, batch_size):
        command_id = row.id
        key = {"id": command_id}
        if command_id != previous:
            previous = command_id
            found.rows[table] += 1
            _verify_command(row, found)
            if row.event_position is None:
                found.add(
                    "missing_event", table, key, "no SignalReceived, UpdateAccepted or CommandRejected event"
                )
                continue
        else:
            found.add(
                "duplicate_event", table, key, f"another admission event at position {row.event_position}"
            )
        if row.event_compact:
            # The rest of a compact payload is read from this row (admission/sql/_compact.py).
            _verify_compact(row, key, found)
        elif row.intent_digest is not None:
            recorded = _payload_field(row.event_payload, "intent_digest")
            if recorded != row.intent_digest:
                found.add(
                    "event_digest_mismatch",
                    table,
                    key,
                    f"the event at position {row.event_position} records another intent digest",
                )


def _verify_compact(row: Any, key: dict[str, Any], found: _Collector) -> None:
    """A compact payload holds the literal key alone (none for a command without one): the key
    of the row's token while the row holds one (a released key is in the event only; whether
    the context gives the token is the context check's)."""
    payload = bytes(row.event_payload or b"")
    try:
        canonical_decode(payload, max_size=max(len(payload), 1))
    except AdmissionError:
        return  # reported as not_canonical by the payload check
    recorded = kept_key(payload)
    if not isinstance(recorded, str | None) or (
        row.request_id is not None and _token_of(row.command_type, recorded) != row.request_id
    ):
        found.add(
            "event_key_mismatch",
            workflow_commands.name,
            key,
            f"the compact event at position {row.event_position} does not hold the command's key alone",
        )


def _token_of(command_type: str, key: str | None) -> str | None:
    """The receipt token of ``key`` (``None`` for no key, or a key the token refuses)."""
    if key is None:
        return None
    try:
        return receipt_token(command_type, key)
    except AdmissionError:
        return None  # its message would quote the key


def _payload_field(payload: bytes | None, name: str) -> object:
    try:
        decoded = canonical_decode(bytes(payload or b""), max_size=max(len(payload or b""), 1))
    except AdmissionError:
        return None  # reported as not_canonical by the payload check
    return decoded.get(name) if isinstance(decoded, dict) else None


def _sealed(arguments: bytes) -> bool:
    """Whether stored arguments are a sealed envelope rather than a list or a map.

    Only the exact text ``store_arguments="envelope"`` writes counts (a JSON
    object of the string members ``blob`` and ``codec``, keys sorted, no
    spaces): any other text, such as a tampered byte that happens to decode
    as a string, is checked against the digests like plaintext and fails.
    """
    try:
        text = canonical_decode(arguments, max_size=max(len(arguments), 1))
    except AdmissionError:
        return False  # reported by the digest and canonical checks
    return isinstance(text, str) and is_envelope_text(text)


def _verify_command(row: Any, found: _Collector) -> None:
    """The stored digests against the stored bytes (contract §3); a legacy row is a note."""
    table, key = workflow_commands.name, {"id": row.id}
    if row.intent_digest is None:
        found.add("unverifiable", table, key, "no intent digest (written before revision 0002)")
        return
    if row.intent_encoding != INTENT_VERSION:
        found.add("unknown_encoding", table, key, f"intent_encoding is not {INTENT_VERSION}")
        return
    if row.arguments is None:
        found.add("arguments_not_canonical", table, key, "arguments are NULL beside an intent digest")
        return
    arguments = bytes(row.arguments)
    if _sealed(arguments):
        # Stored as received under store_arguments="envelope": the digests are
        # over the plaintext, which only the key opens; the context still is checked.
        found.add("sealed", table, key, "arguments stored sealed: the digests are over the plaintext")
        _verify_context(row, found)
        return
    if hashlib.sha256(arguments).hexdigest() != row.arguments_digest:
        found.add("arguments_digest_mismatch", table, key, "arguments do not hash to arguments_digest")
    try:
        # The service's own limit may be above the default: the stored size is the bound here.
        value = canonical_decode(arguments, max_size=max(len(arguments), 1))
        target = row.requested_run_id if row.target_scope == "run" else None
        record = intent_record(row.command_type, row.name, value, target, max_size=max(len(arguments), 1))
    except AdmissionError as exc:
        found.add("arguments_not_canonical", table, key, _refusal(exc))
        return
    if hashlib.sha256(record).hexdigest() != row.intent_digest:
        found.add(
            "intent_digest_mismatch",
            table,
            key,
            "command_type, name, target and arguments do not hash to intent_digest",
        )
    _verify_context(row, found)


def _verify_context(row: Any, found: _Collector) -> None:
    table, key = workflow_commands.name, {"id": row.id}
    if row.context is None:
        if row.request_id is not None:
            found.add("context_mismatch", table, key, "request_id is set but the context is NULL")
        return
    context = bytes(row.context)
    literal = literal_key(context)
    if literal is None or context_of(literal) != context:
        found.add("context_mismatch", table, key, "the context is not the canonical map of a key")
        return
    if _token_of(row.command_type, literal) != row.request_id:
        found.add("context_mismatch", table, key, "the key in the context does not give request_id's token")


def _refusal(exc: AdmissionError) -> str:
    """Which field the encoding refused and where, without the value it refused."""
    field_name = getattr(exc, "field", None)
    offset = getattr(exc, "offset", None)
    where = f"{field_name}" if isinstance(field_name, str) else "value"
    if isinstance(offset, int):
        where += f" at byte {offset}"
    return f"{where}: not canonical {INTENT_VERSION}"


def _canonical(conn: Connection, table: Table, column: str, batch_size: int, found: _Collector) -> None:
    for row in _stream(conn, blob_rows(table, column), batch_size):
        found.rows[f"{table.name}.{column}"] += 1
        data = bytes(row[-1])
        try:
            canonical_decode(data, max_size=max(len(data), 1))
        except AdmissionError as exc:
            found.add("not_canonical", table.name, row_key(table, row), f"{column}: {_refusal(exc)}")


def _sqlite_gaps(conn: Connection, batch_size: int, found: _Collector) -> None:
    """Holes in SQLite's event logs that nothing accounts for (docs/event-log.md, "Gaps").

    SQLite positions are ``AUTOINCREMENT`` rowids taken under the write lock:
    a rolled-back transaction gives its position back, so a hole is a deleted
    event.  Pruning deletes events and records how many in a ``RunsPruned``
    event appended after them; every hole must lie below a ``RunsPruned``
    whose count still covers it.  The worker's and jobs' logs are never
    trimmed: any hole in them is unexplained.
    """
    events = workflow_history_events.name
    top, _count = conn.execute(high_water(workflow_history_events.c.position)).one()
    above = _sequence(conn, events) - (top or 0)
    if above > 0:
        found.add("event_gap", events, {"position": (top or 0) + 1}, f"{above} newest position(s) missing")
    rows = _stream(conn, PRUNED_EVENTS_AND_GAPS, batch_size)
    marks = (
        (p, None, _payload_field(data, "events")) if kind == 0 else (p, prev, None)
        for p, prev, data, kind in rows
    )
    for first, last, missing in unexplained_gaps(marks):
        found.add(
            "event_gap",
            events,
            {"position": first},
            f"{missing} of positions {first} to {last} missing, "
            "not accounted for by a later RunsPruned event",
        )
    for table, column in LOGS_NEVER_DELETED:
        top, _count = conn.execute(high_water(table.c[column])).one()
        above = _sequence(conn, table.name) - (top or 0)
        if above > 0:
            found.add(
                "event_gap", table.name, {column: (top or 0) + 1}, f"{above} newest position(s) missing"
            )
        for position, previous in _stream(conn, gaps_of(table.c[column]), batch_size):
            found.add(
                "event_gap",
                table.name,
                {column: previous + 1},
                f"positions {previous + 1} to {position - 1} missing from a log nothing deletes from",
            )


def unexplained_gaps(marks: Iterable[tuple[int, int | None, object]]) -> Iterator[tuple[int, int, int]]:
    """The holes of a pruned log that no pruning accounts for: ``(first, last, unexplained)``.

    ``marks`` come from the newest position down: ``(position, None, count)``
    for a ``RunsPruned`` event that deleted ``count`` older events, and
    ``(position, previous, None)`` for the hole between a present position and
    the present one below it (``previous``; 0 below the first).  A pruning
    deletes only events older than its own, so a hole draws on the counts of
    the ``RunsPruned`` events above it, less what holes above it drew.
    """
    budget = 0
    for position, previous, count in marks:
        if previous is None:
            budget += count if type(count) is int and count > 0 else 0
            continue
        missing = position - previous - 1
        explained = min(budget, missing)
        budget -= explained
        if explained < missing:
            yield previous + 1, position - 1, missing - explained


def _sequence(conn: Connection, table: str) -> int:
    """The highest position SQLite has handed out for ``table`` (0 if it keeps no counter)."""
    row = conn.execute(text("SELECT seq FROM sqlite_sequence WHERE name = :name"), {"name": table}).first()
    return int(row[0]) if row is not None else 0
