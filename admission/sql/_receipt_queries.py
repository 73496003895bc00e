"""The receipt adapter's statements and row converters, built once at import.

Statements are built once: SQLAlchemy then reuses their cache keys and
compiled SQL, which matters on the admission hot path; the hottest are
compiled again per dialect into :class:`ReceiptStatements` and run on the
driver (:class:`~admission.sql._raw.RawStatement`).  Converters turn rows
into the frozen values of :mod:`admission.receipts` (adapters never hand out
driver or SQLAlchemy rows).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import fields
from typing import Any, Final

from sqlalchemy import (
    CompoundSelect,
    Dialect,
    Select,
    String,
    and_,
    bindparam,
    exists,
    func,
    insert,
    literal,
    or_,
    select,
    union_all,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from admission.receipts._store import CommandRow, EventRow, InstanceRow, RunRow, UpdateRow, run_id_taken
from admission.sql._engine import constraint_name, is_postgresql
from admission.sql._event_rows import STORED_EVENT_KEYS, event_values
from admission.sql._raw import BulkStatement, RawStatement
from admission.sql._schema import (
    workflow_commands,
    workflow_history_events,
    workflow_instances,
    workflow_runs,
    workflow_updates,
)
from admission.sql._times import as_utc, utc_or_none

__all__ = [
    "COMMAND",
    "COMMAND_FIELDS",
    "INSERT_COMMAND",
    "INSERT_RUN",
    "INSERT_UPDATE",
    "INSTANCE_COLUMNS",
    "PENDING",
    "RUN",
    "TEXTS",
    "UPDATE",
    "UPDATE_OF_COMMAND",
    "ReceiptStatements",
    "command_of_columns",
    "command_row",
    "current_run_row",
    "fields_of",
    "insert_run",
    "instance_row",
    "key_values",
    "optional_update_row",
    "receipt_order",
    "receipt_pairs",
    "receipt_reads",
    "run_row",
    "signal_receipt_reads",
    "update_row",
]

REQUEST_INDEX: Final = ("instance_id", "command_type", "request_id")
"""The unique receipt index's columns: the backstop of the admission lock (contract §2.6, §4)."""


def instance_row(row: Mapping[Any, Any]) -> InstanceRow:
    """An instance from a row of ``workflow_instances``."""
    return InstanceRow(
        row["id"], row["namespace"], row["workflow_id"], row["current_run_id"], as_utc(row["created_at"])
    )


def run_row(row: Mapping[Any, Any]) -> RunRow:
    """A run from a row of ``workflow_runs``."""
    return RunRow(
        row["id"],
        row["instance_id"],
        row["run_number"],
        row["status"],
        row["continued_from_run_id"],
        as_utc(row["started_at"]),
        utc_or_none(row["closed_at"]),
    )


def optional_bytes(value: object) -> bytes | None:
    """A stored binary value as bytes (drivers hand back memoryview or bytes)."""
    return None if value is None else bytes(value)  # type: ignore[call-overload]


def command_row(row: Mapping[Any, Any]) -> CommandRow:
    """A command from a row of ``workflow_commands`` (or a join holding its columns by name)."""
    return command_of_columns([row[name] for name in COMMAND_FIELDS])


COMMAND_FIELDS: Final = tuple(f.name for f in fields(CommandRow))
if tuple(c.name for c in workflow_commands.c) != COMMAND_FIELDS:  # pragma: no cover - a schema edit
    raise ImportError("CommandRow's fields must be workflow_commands' columns, in table order")
_CONTEXT, _ARGUMENTS, _CREATED_AT = "context", "arguments", "created_at"
_CONTEXT_AT, _ARGUMENTS_AT, _CREATED_AT_AT = (
    COMMAND_FIELDS.index(name) for name in (_CONTEXT, _ARGUMENTS, _CREATED_AT)
)


def command_of_columns(values: Sequence[Any]) -> CommandRow:
    """A command from a driver row of ``workflow_commands``' columns in table order."""
    # Every field is set here, so the frozen dataclass's __init__ (one
    # object.__setattr__ per field, 18 of them) can be skipped: on the retry
    # path that __init__ costs about as much as the rest of the conversion.
    command = object.__new__(CommandRow)
    by_field = command.__dict__
    by_field.update(zip(COMMAND_FIELDS, values, strict=True))
    for name, value in ((_CONTEXT, values[_CONTEXT_AT]), (_ARGUMENTS, values[_ARGUMENTS_AT])):
        if value is not None and type(value) is not bytes:  # memoryview (psycopg)
            by_field[name] = bytes(value)
    by_field[_CREATED_AT] = as_utc(values[_CREATED_AT_AT])
    return command


def update_row(row: Mapping[Any, Any]) -> UpdateRow:
    """An update from a row of ``workflow_updates``."""
    return UpdateRow(
        row["id"],
        row["command_id"],
        row["instance_id"],
        row["run_id"],
        row["name"],
        row["status"],
        optional_bytes(row["result"]),
        row["failure"],
        as_utc(row["accepted_at"]),
        utc_or_none(row["completed_at"]),
    )


_RUN_KEY: Final = ("pk_workflow_runs", "workflow_runs.id")
"""How a taken run id's refusal names the key: PostgreSQL's primary key, SQLite's column."""


def insert_run(conn: Connection, row: RunRow) -> None:
    """Insert ``row``; a run id another run holds is :class:`RunStateError` (``run_id_taken``),
    not a storage error to retry (the caller's transaction then rolls back, writing nothing)."""
    try:
        conn.execute(INSERT_RUN, fields_of(row))
    except IntegrityError as error:
        if error.orig is None or constraint_name(error.orig) not in _RUN_KEY:
            raise
        raise run_id_taken(row.id) from None


def fields_of(row: object) -> dict[str, Any]:
    """A row value's fields by name: they are its table's columns."""
    # Row values are plain dataclasses whose fields are the table's columns.
    return dict(vars(row))


# Statements are built once: SQLAlchemy then reuses their cache keys and
# compiled SQL, which matters on the admission hot path.
_b = bindparam
INSTANCE_COLUMNS: Final[tuple[Any, ...]] = (
    workflow_instances,
    *(c.label(f"run_{c.name}") for c in workflow_runs.c),
    select(func.max(workflow_commands.c.command_sequence))
    .where(workflow_commands.c.instance_id == workflow_instances.c.id)
    .scalar_subquery()
    .label("last_sequence"),
)
"""What the lock reads of an instance: its row, its current run's (``run_`` columns), its last sequence."""
INSTANCE_LOOKUP = (
    select(*INSTANCE_COLUMNS)
    .select_from(
        workflow_instances.outerjoin(workflow_runs, workflow_runs.c.id == workflow_instances.c.current_run_id)
    )
    .where(
        workflow_instances.c.namespace == _b("namespace"),
        workflow_instances.c.workflow_id == _b("workflow_id"),
    )
)
# PostgreSQL takes the row lock with a statement of its own: a statement that
# waited for the lock re-checks only the locked row, and would return the rest
# (the current run, the last sequence) as of before the wait.  The lookup that
# follows is a new statement, so under READ COMMITTED it sees every commit
# made before the lock was granted.  SQLite's BEGIN IMMEDIATE locks first.
LOCK_POSTGRES = (
    select(workflow_instances.c.id)
    .where(
        workflow_instances.c.namespace == _b("namespace"),
        workflow_instances.c.workflow_id == _b("workflow_id"),
    )
    .with_for_update()
)


def _no_receipt(value: str) -> Any:
    """No command of the locked instance holds the key as ``value`` (the token, or the raw key)."""
    return ~exists().where(
        workflow_commands.c.instance_id == workflow_instances.c.id,
        workflow_commands.c.command_type == _b("command_type"),
        workflow_commands.c.request_id == _b(value),
    )


LOCK_UNLESS_RETAINED = LOCK_POSTGRES.where(_no_receipt("token"), _no_receipt("raw"))
"""PostgreSQL: :data:`LOCK_POSTGRES` taken only while no receipt holds the key (a retry's
transaction then takes no lock and writes nothing; see
:meth:`~admission.sql.SqlStore.locked_unless_retained`).  Each test is one probe of the
receipt index, as in :func:`_by_key`."""

RUN = select(workflow_runs).where(
    workflow_runs.c.id == _b("run_id"), workflow_runs.c.instance_id == _b("iid")
)


def _by_key(query: Callable[[str], Select[Any]]) -> CompoundSelect[Any]:
    """``query`` for the token and for the raw key, as two point lookups.

    ``request_id IN (token, raw)`` would do, but PostgreSQL plans it as a
    filter over every command of the instance (an index scan on
    ``(instance_id, command_type)`` only), so a lookup would grow with the
    instance's history; each branch here is one probe of the unique index on
    both backends.  Rows come unordered and, when the two values are the same,
    twice: callers order them and drop repeats (:func:`receipt_order`).
    """
    return union_all(query("token"), query("raw"))


COMMANDS_BY_KEY = _by_key(
    lambda value: select(workflow_commands).where(
        workflow_commands.c.instance_id == _b("iid"),
        workflow_commands.c.command_type == _b("command_type"),
        workflow_commands.c.request_id == _b(value),
    )
)


TEXTS: Final = postgresql.ARRAY(String())
"""PostgreSQL: a text array parameter (a batch's values, one statement for all)."""
_KEYS = (
    func.unnest(_b("iids", type_=TEXTS), _b("command_types", type_=TEXTS), _b("request_ids", type_=TEXTS))
    .table_valued("iid", "command_type", "request_id")
    .render_derived(name="k")
)
COMMANDS_OF_INSTANCES = select(workflow_commands).join(
    _KEYS,
    and_(
        workflow_commands.c.instance_id == _KEYS.c.iid,
        workflow_commands.c.command_type == _KEYS.c.command_type,
        workflow_commands.c.request_id == _KEYS.c.request_id,
    ),
)
"""PostgreSQL: the commands stored under any of several (instance id, command type, value)
triples, given as three arrays of one length: a batch's lookup of all its keys under its locks in
one statement, whose one plan (a probe of the receipt index per triple) fits any batch."""


def wanted_keys(request_ids: Sequence[str], postgres: bool) -> list[str]:
    """The values a lookup can match: as in :func:`key_values`, PostgreSQL text holds no NUL."""
    return [r for r in request_ids if not (postgres and "\x00" in r)]


def _receipt_read(value: str) -> Select[Any]:
    """The unlocked receipt read of a retry, with the command's update (if any)."""
    return (
        select(workflow_commands, *(c.label(f"u_{c.name}") for c in workflow_updates.c))
        .select_from(
            workflow_commands.join(
                workflow_instances, workflow_instances.c.id == workflow_commands.c.instance_id
            ).outerjoin(workflow_updates, workflow_updates.c.command_id == workflow_commands.c.id)
        )
        .where(
            workflow_instances.c.namespace == _b("namespace"),
            workflow_instances.c.workflow_id == _b("workflow_id"),
            workflow_commands.c.command_type == _b("command_type"),
            workflow_commands.c.request_id == _b(value),
        )
    )


def _signal_receipt_read(value: str) -> Select[Any]:
    """The unlocked receipt read of a signal: signals have no update rows, so no join with them."""
    return (
        select(workflow_commands)
        .select_from(
            workflow_commands.join(
                workflow_instances, workflow_instances.c.id == workflow_commands.c.instance_id
            )
        )
        .where(
            workflow_instances.c.namespace == _b("namespace"),
            workflow_instances.c.workflow_id == _b("workflow_id"),
            workflow_commands.c.command_type == _b("command_type"),
            workflow_commands.c.request_id == _b(value),
        )
    )


Extend = Callable[[Select[Any]], Select[Any]]


def _unchanged(query: Select[Any]) -> Select[Any]:
    return query


def signal_receipt_reads(extend: Extend = _unchanged) -> CompoundSelect[Any]:
    """A signal key's receipt read (by token and by raw key), each branch passed through ``extend``."""
    return _by_key(lambda value: extend(_signal_receipt_read(value)))


def receipt_reads(extend: Extend = _unchanged) -> CompoundSelect[Any]:
    """An update key's receipt read with the updates, each branch passed through ``extend``."""
    return _by_key(lambda value: extend(_receipt_read(value)))


RECEIPTS = receipt_reads()
SIGNAL_RECEIPTS = signal_receipt_reads()
PENDING = (
    select(workflow_commands, *(c.label(f"u_{c.name}") for c in workflow_updates.c))
    .select_from(
        workflow_commands.outerjoin(workflow_updates, workflow_updates.c.command_id == workflow_commands.c.id)
    )
    .where(
        workflow_commands.c.instance_id == _b("iid"),
        workflow_commands.c.run_id.in_(_b("run_ids", expanding=True)),
        or_(
            and_(workflow_commands.c.command_type == "signal", workflow_commands.c.status == "received"),
            workflow_updates.c.status == "accepted",
        ),
    )
    .order_by(workflow_commands.c.command_sequence)
)
COMMAND = select(workflow_commands).where(
    workflow_commands.c.id == _b("command_id"), workflow_commands.c.instance_id == _b("iid")
)
UPDATE_OF_COMMAND = select(workflow_updates).where(workflow_updates.c.command_id == _b("command_id"))
UPDATE = select(workflow_updates).where(
    workflow_updates.c.id == _b("update_id"), workflow_updates.c.instance_id == _b("iid")
)
INSERT_COMMAND = insert(workflow_commands)
INSERT_UPDATE = insert(workflow_updates)
INSERT_RUN = insert(workflow_runs)
_LOGGED_EVENT = {
    dialect: insert(workflow_history_events).values(
        tx_id=func.txid_current() if dialect == "postgresql" else literal(0)
    )
    for dialect in ("postgresql", "sqlite")
}
INSERT_EVENT = {
    dialect: statement.returning(workflow_history_events.c.position, workflow_history_events.c.tx_id)
    for dialect, statement in _LOGGED_EVENT.items()
}
_ADMITTED_COMMAND = {
    name: dialect.insert(workflow_commands).on_conflict_do_nothing(index_elements=list(REQUEST_INDEX))
    for name, dialect in (("postgresql", postgresql), ("sqlite", sqlite))
}
INSERT_KEYED_COMMAND = {
    dialect: statement.returning(workflow_commands.c.id) for dialect, statement in _ADMITTED_COMMAND.items()
}


def key_values(request_ids: Sequence[str], postgres: bool) -> tuple[str, str] | None:
    """The two values a receipt lookup compares ``request_id`` with (token, raw key)."""
    # PostgreSQL text cannot hold NUL, so no stored value can equal a key that
    # contains one; asking would only make the driver refuse the query.
    wanted = [r for r in request_ids if not (postgres and "\x00" in r)]
    if not wanted:
        return None
    if len(wanted) > 2:
        raise ValueError("a receipt lookup compares at most two values")
    return wanted[0], wanted[-1]


def receipt_order(
    found: Sequence[tuple[CommandRow, UpdateRow | None]],
) -> list[tuple[CommandRow, UpdateRow | None]]:
    """Receipts by creation time, then sequence, each once (see :func:`_by_key`)."""
    unique = {command.id: (command, update) for command, update in found}
    return sorted(unique.values(), key=lambda pair: (pair[0].created_at, pair[0].command_sequence))


def receipt_pairs(
    rows: Sequence[Mapping[Any, Any]], with_updates: bool
) -> list[tuple[CommandRow, UpdateRow | None]]:
    """Rows of commands, with their joined update's ``u_`` columns where ``with_updates``, as
    (command, update) pairs in the order read (a signal's have no update)."""
    if not with_updates:
        return [(command_row(row), None) for row in rows]
    return [(command_row(row), optional_update_row(row)) for row in rows]


def current_run_row(row: Mapping[Any, Any]) -> RunRow | None:
    """The current run joined to an instance lookup (``run_`` columns), if any."""
    if row["run_id"] is None:
        return None
    return RunRow(
        row["run_id"],
        row["run_instance_id"],
        row["run_run_number"],
        row["run_status"],
        row["run_continued_from_run_id"],
        as_utc(row["run_started_at"]),
        utc_or_none(row["run_closed_at"]),
    )


def optional_update_row(row: Mapping[Any, Any]) -> UpdateRow | None:
    """The update joined to a command (``u_`` columns), if any."""
    if row["u_id"] is None:
        return None
    return UpdateRow(
        row["u_id"],
        row["u_command_id"],
        row["u_instance_id"],
        row["u_run_id"],
        row["u_name"],
        row["u_status"],
        optional_bytes(row["u_result"]),
        row["u_failure"],
        as_utc(row["u_accepted_at"]),
        utc_or_none(row["u_completed_at"]),
    )


UPDATE_FIELDS: Final = tuple(f.name for f in fields(UpdateRow))


CHUNK: Final = 64
"""SQLite: at most this many keys (or instances) per statement of a batch's reads, so each count's
statement is compiled once and a batch of any size takes few."""


def _commands_under(count: int) -> Select[Any]:
    """SQLite: the commands under any of ``count`` (instance id, command type, value) triples
    (``i0``, ``t0``, ``r0``, ...): each term a probe of the receipt index."""
    c = workflow_commands.c
    terms = (
        and_(c.instance_id == _b(f"i{n}"), c.command_type == _b(f"t{n}"), c.request_id == _b(f"r{n}"))
        for n in range(count)
    )
    return select(workflow_commands).where(or_(*terms))


def _instances_of(count: int) -> Select[Any]:
    """SQLite: what the lock reads of ``count`` instances (``n0``, ``w0``, ...) in one statement."""
    i = workflow_instances.c
    terms = (and_(i.namespace == _b(f"n{n}"), i.workflow_id == _b(f"w{n}")) for n in range(count))
    return (
        select(*INSTANCE_COLUMNS)
        .select_from(workflow_instances.outerjoin(workflow_runs, workflow_runs.c.id == i.current_run_id))
        .where(or_(*terms))
    )


class BatchReads:
    """A batch's reads under its locks in few statements: its keys' stored commands, and on
    SQLite its instances (PostgreSQL reads those with the locks: ``admission/sql/_fused.py``).

    On PostgreSQL one statement takes the keys as arrays; on SQLite, a statement per
    :data:`CHUNK` whose terms each probe an index, one execution instead of one per key
    (sent to SQLite, many point reads cost several times one read of them all).
    """

    def __init__(self, dialect: Dialect) -> None:
        self._dialect = dialect
        postgres = is_postgresql(dialect)
        self._commands = RawStatement(COMMANDS_OF_INSTANCES, dialect, binary=True) if postgres else None
        self._by_count: dict[tuple[Callable[[int], Select[Any]], int], RawStatement] = {}

    def commands(self, cursor: Any, triples: Sequence[tuple[str, str, str]]) -> list[dict[str, Any]]:
        """The stored commands under any of ``triples`` (instance id, command type, value)."""
        if self._commands is not None:
            columns = enumerate(("iids", "command_types", "request_ids"))
            return self._commands.rows(cursor, {name: [t[n] for t in triples] for n, name in columns})
        return self._chunked(cursor, _commands_under, "itr", triples)

    def instances(self, cursor: Any, keys: Sequence[tuple[str, str]]) -> list[dict[str, Any]]:
        """SQLite: what the lock reads of each existing instance of ``keys`` (namespace, workflow id)."""
        return self._chunked(cursor, _instances_of, "nw", keys)

    def _chunked(
        self, cursor: Any, build: Callable[[int], Select[Any]], names: str, values: Sequence[tuple[str, ...]]
    ) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = []
        for start in range(0, len(values), CHUNK):
            chunk = values[start : start + CHUNK]
            statement = self._by_count.get((build, len(chunk)))
            if statement is None:
                statement = RawStatement(build(len(chunk)), self._dialect)
                self._by_count[(build, len(chunk))] = statement
            named = (zip(names, each, strict=True) for each in chunk)
            params = {f"{name}{n}": value for n, pairs in enumerate(named) for name, value in pairs}
            rows += statement.rows(cursor, params)
        return rows


class ReceiptStatements:
    """The hot-path statements of one store, compiled for its dialect."""

    def __init__(self, dialect: Dialect) -> None:
        name = "postgresql" if is_postgresql(dialect) else "sqlite"
        self.instance_lookup = RawStatement(INSTANCE_LOOKUP, dialect)
        postgres = name == "postgresql"
        self.lock_postgres = RawStatement(LOCK_POSTGRES, dialect) if postgres else None
        self.lock_unless_retained = RawStatement(LOCK_UNLESS_RETAINED, dialect) if postgres else None
        self.batch_reads = BatchReads(dialect)
        self.commands_by_key = RawStatement(COMMANDS_BY_KEY, dialect)
        self.receipts = RawStatement(RECEIPTS, dialect)
        self.signal_receipts = RawStatement(SIGNAL_RECEIPTS, dialect)
        self.insert_keyed_command = RawStatement(INSERT_KEYED_COMMAND[name], dialect, COMMAND_FIELDS)
        self.insert_event = RawStatement(INSERT_EVENT[name], dialect, STORED_EVENT_KEYS)
        self.batch = AdmittedRows(dialect, name)


class AdmittedRows:
    """A batch's fresh admissions written together: one ``executemany`` per table.

    The statements are the single insert's (the command's ``ON CONFLICT DO
    NOTHING`` on the receipt index, the event's ``tx_id``) without their
    ``RETURNING``: a batch needs neither the ids back nor the positions.
    """

    def __init__(self, dialect: Dialect, name: str) -> None:
        self._commands = BulkStatement(_ADMITTED_COMMAND[name], dialect, COMMAND_FIELDS)
        self._updates = BulkStatement(INSERT_UPDATE, dialect, UPDATE_FIELDS)
        self._events = BulkStatement(_LOGGED_EVENT[name], dialect, STORED_EVENT_KEYS)

    def insert(
        self, connection: Connection, admitted: Sequence[tuple[CommandRow, UpdateRow | None, EventRow]]
    ) -> bool:
        """Insert the rows in order; ``False`` if the receipt index held a key (see
        :meth:`~admission.receipts.LockedInstance.insert_admitted_many`)."""
        # A row value's fields are its table's columns (fields_of), read here in place.
        commands = [vars(command) for command, _, _ in admitted]
        if self._commands.execute(connection, commands) != len(commands):
            return False
        self._updates.execute(connection, [vars(update) for _, update, _ in admitted if update is not None])
        self._events.execute(connection, [event_values(event, command) for command, _, event in admitted])
        return True
