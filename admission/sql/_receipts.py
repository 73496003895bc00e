"""The SQLAlchemy store: SQLite (the embedded default) and PostgreSQL.

This is the only module with dialect branches.  The admission lock (contract
§4) is, on PostgreSQL, a row lock on the instance (``SELECT ... FOR UPDATE``,
after an ``INSERT ... ON CONFLICT DO NOTHING`` when the row must first be
created, so two first-time callers still serialise on it) and, on SQLite, a
write transaction opened with ``BEGIN IMMEDIATE`` under a busy timeout.  The
unique index ``workflow_commands_request_lookup`` is the backstop: a command
insert is ``ON CONFLICT DO NOTHING`` on exactly that index, so a duplicate
key is read back and answered as a receipt, never surfaced as an error.

Driver errors are translated here, once, keeping the cause.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, suppress
from dataclasses import fields
from datetime import UTC, datetime
from typing import Any, Final

from sqlalchemy import (
    BindParameter,
    ClauseElement,
    CompoundSelect,
    Dialect,
    Engine,
    Select,
    Table,
    and_,
    bindparam,
    create_engine,
    delete,
    event,
    func,
    insert,
    literal,
    or_,
    select,
    tuple_,
    union_all,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, IntegrityError, OperationalError
from sqlalchemy.sql.compiler import SQLCompiler

from admission.errors import AdmissionError, InputError, StorageError
from admission.receipts._store import (
    CommandRow,
    EventCursor,
    EventRow,
    InstanceRow,
    LockedInstance,
    PruneCounts,
    PruneTarget,
    RunRow,
    UpdateRow,
)
from admission.sql._schema import (
    check_revision,
    workflow_commands,
    workflow_history_events,
    workflow_instances,
    workflow_runs,
    workflow_updates,
)

__all__ = [
    "DEFAULT_URL",
    "BulkInsert",
    "BulkStatement",
    "SqlStore",
    "as_utc",
    "create_admission_engine",
    "insert_or_ignore",
    "masked_url",
    "normalize_url",
]

DEFAULT_URL: Final = "sqlite:///admission.sqlite3"
"""The embedded default: a SQLite file in the working directory."""

SQLITE_BUSY_TIMEOUT_MS: Final = 30_000
_REQUEST_INDEX: Final = ("instance_id", "command_type", "request_id")
_WRITE: Final = "admission_write"


def normalize_url(url: str) -> str:
    """Accept ``postgresql://`` and ``postgres://`` URLs and use the psycopg 3 driver for them."""
    parsed = make_url(
        url.replace("postgres://", "postgresql://", 1) if url.startswith("postgres://") else url
    )
    if parsed.drivername == "postgresql":
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed.render_as_string(hide_password=False)


def masked_url(url: str) -> str:
    """``url`` as it may be shown in output or logs: its password, if any, as ``***``."""
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):
        return "***"  # not parsed, so no telling which part is the password
    return url if parsed.password is None else parsed.render_as_string(hide_password=True)


def create_admission_engine(url: str, **kwargs: Any) -> Engine:
    """Create an engine configured as admission needs it.

    SQLite: WAL journal, ``synchronous=FULL``, foreign keys on, a busy
    timeout, pooled connections, and admission's write transactions opened
    with ``BEGIN IMMEDIATE`` so that the admission lock is taken before the
    first read (a deferred transaction that upgrades to a write can fail
    instead of waiting).  Other transactions on the engine begin deferred.

    A URL that cannot be parsed, or that names a dialect or driver that is
    not installed, raises :class:`~admission.errors.InputError` (``field``
    ``url``), keeping SQLAlchemy's error as the cause.
    """
    try:
        return _configured_engine(url, **kwargs)
    except (ArgumentError, ValueError, ImportError) as exc:
        # SQLAlchemy's messages here name the part it could not use, never the password.
        raise InputError(f"the database URL cannot be used: {exc}", field="url") from exc


def _configured_engine(url: str, **kwargs: Any) -> Engine:
    url = normalize_url(url)
    if make_url(url).get_backend_name() != "sqlite":
        kwargs.setdefault("pool_pre_ping", False)
        return create_engine(url, **kwargs)
    if make_url(url).database in (None, "", ":memory:"):
        raise StorageError("an in-memory SQLite database cannot be shared between connections; use a file")
    kwargs.setdefault("connect_args", {"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000, "check_same_thread": False})
    engine = create_engine(url, **kwargs)

    @event.listens_for(engine, "connect")
    def _configure(dbapi_connection: Any, _record: object) -> None:
        # pysqlite would emit its own deferred BEGIN; admission emits its own.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=FULL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _begin(conn: Connection) -> None:
        if conn.get_execution_options().get(_WRITE):
            # Admission's own write transactions: on the driver, because
            # SQLAlchemy's execution path costs several times the statement.
            # SQLAlchemy does not wrap what a begin listener raises, so a busy
            # timeout is wrapped here as SQLAlchemy wraps a statement's error:
            # every store's translation then sees the error it expects.
            error = conn.dialect.loaded_dbapi.Error
            try:
                conn.connection.dbapi_connection.execute("BEGIN IMMEDIATE")  # type: ignore[union-attr]
            except error as exc:
                raise DBAPIError.instance("BEGIN IMMEDIATE", (), exc, error) from exc
        else:
            conn.exec_driver_sql("BEGIN")

    return engine


def insert_or_ignore(
    connection: Connection, table: Table, values: Mapping[str, Any], index_elements: Sequence[str]
) -> int:
    """``INSERT ... ON CONFLICT (index_elements) DO NOTHING``; returns the number of rows inserted.

    The one statement admission's other SQL modules need a dialect for; it
    lives here so that this stays the only module with dialect branches.
    """
    dialect_insert = postgresql.insert if connection.dialect.name == "postgresql" else sqlite.insert
    statement = dialect_insert(table).values(dict(values)).on_conflict_do_nothing(
        index_elements=list(index_elements)
    )
    return int(connection.execute(statement).rowcount)


def as_utc(value: datetime | str) -> datetime:
    """A stored time as a timezone-aware UTC datetime.

    SQLite hands back naive datetimes (text, when read through the driver
    itself); they were written as UTC.
    """
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _utc_or_none(value: datetime | str | None) -> datetime | None:
    return None if value is None else as_utc(value)


def _instance(row: Mapping[Any, Any]) -> InstanceRow:
    return InstanceRow(
        row["id"], row["namespace"], row["workflow_id"], row["current_run_id"], as_utc(row["created_at"])
    )


def _run(row: Mapping[Any, Any]) -> RunRow:
    return RunRow(
        row["id"],
        row["instance_id"],
        row["run_number"],
        row["status"],
        row["continued_from_run_id"],
        as_utc(row["started_at"]),
        _utc_or_none(row["closed_at"]),
    )


def _bytes(value: object) -> bytes | None:
    return None if value is None else bytes(value)  # type: ignore[call-overload]


def _command(row: Mapping[Any, Any]) -> CommandRow:
    """A command from a row of ``workflow_commands`` (or a join holding its columns by name)."""
    return _command_of_columns([row[name] for name in _COMMAND_FIELDS])


_COMMAND_FIELDS: Final = tuple(f.name for f in fields(CommandRow))
if tuple(c.name for c in workflow_commands.c) != _COMMAND_FIELDS:  # pragma: no cover - a schema edit
    raise ImportError("CommandRow's fields must be workflow_commands' columns, in table order")


def _command_of_columns(values: Sequence[Any]) -> CommandRow:
    """A command from a driver row of ``workflow_commands``' columns in table order."""
    # Every field is set here, so the frozen dataclass's __init__ (one
    # object.__setattr__ per field, 18 of them) can be skipped: on the retry
    # path that __init__ costs about as much as the rest of the conversion.
    by_field = dict(zip(_COMMAND_FIELDS, values, strict=True))
    by_field["context"] = _bytes(by_field["context"])
    by_field["arguments"] = _bytes(by_field["arguments"])
    by_field["created_at"] = as_utc(by_field["created_at"])
    command = object.__new__(CommandRow)
    command.__dict__.update(by_field)
    return command


def _update(row: Mapping[Any, Any]) -> UpdateRow:
    return UpdateRow(
        row["id"],
        row["command_id"],
        row["instance_id"],
        row["run_id"],
        row["name"],
        row["status"],
        _bytes(row["result"]),
        row["failure"],
        as_utc(row["accepted_at"]),
        _utc_or_none(row["completed_at"]),
    )


def _event(row: Mapping[Any, Any]) -> EventRow:
    return EventRow(
        row["namespace"],
        row["instance_id"],
        row["run_id"],
        row["event_type"],
        row["command_id"],
        row["update_id"],
        bytes(row["payload"]),
        as_utc(row["recorded_at"]),
        row["position"],
        row["tx_id"],
    )


def _fields(row: object) -> dict[str, Any]:
    # Row values are plain dataclasses whose fields are the table's columns.
    return dict(vars(row))


_UNIQUE_SQLITE: Final = re.compile(r"UNIQUE constraint failed: (.+)$")


def _constraint(exc: IntegrityError) -> str:
    """The name of the violated constraint (PostgreSQL), or its columns (SQLite)."""
    return _constraint_of(exc.orig)


def _constraint_of(error: object) -> str:
    """:func:`_constraint` for the driver's own exception."""
    diag = getattr(error, "diag", None)
    name = getattr(diag, "constraint_name", None)
    if name:
        return str(name)
    match = _UNIQUE_SQLITE.search(str(error))
    return match.group(1) if match else "unknown"


# Statements are built once: SQLAlchemy then reuses their cache keys and
# compiled SQL, which matters on the admission hot path.
_b = bindparam
_INSTANCE_LOOKUP = (
    select(
        workflow_instances,
        *(c.label(f"run_{c.name}") for c in workflow_runs.c),
        select(func.max(workflow_commands.c.command_sequence))
        .where(workflow_commands.c.instance_id == workflow_instances.c.id)
        .scalar_subquery()
        .label("last_sequence"),
    )
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
_LOCK_POSTGRES = (
    select(workflow_instances.c.id)
    .where(
        workflow_instances.c.namespace == _b("namespace"),
        workflow_instances.c.workflow_id == _b("workflow_id"),
    )
    .with_for_update()
)
_RUN = select(workflow_runs).where(
    workflow_runs.c.id == _b("run_id"), workflow_runs.c.instance_id == _b("iid")
)
def _by_key(query: Callable[[str], Select[Any]]) -> CompoundSelect[Any]:
    """``query`` for the token and for the raw key, as two point lookups.

    ``request_id IN (token, raw)`` would do, but PostgreSQL plans it as a
    filter over every command of the instance (an index scan on
    ``(instance_id, command_type)`` only), so a lookup would grow with the
    instance's history; each branch here is one probe of the unique index on
    both backends.  Rows come unordered and, when the two values are the same,
    twice: callers order them and drop repeats (:func:`_receipt_order`).
    """
    return union_all(query("token"), query("raw"))


_COMMANDS_BY_KEY = _by_key(
    lambda value: select(workflow_commands).where(
        workflow_commands.c.instance_id == _b("iid"),
        workflow_commands.c.command_type == _b("command_type"),
        workflow_commands.c.request_id == _b(value),
    )
)
# The unlocked receipt read of a retry, with the command's update (if any).
_RECEIPTS = _by_key(
    lambda value: select(workflow_commands, *(c.label(f"u_{c.name}") for c in workflow_updates.c))
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
# Signals have no update rows, so their read does not join workflow_updates.
_SIGNAL_RECEIPTS = _by_key(
    lambda value: select(workflow_commands)
    .select_from(
        workflow_commands.join(workflow_instances, workflow_instances.c.id == workflow_commands.c.instance_id)
    )
    .where(
        workflow_instances.c.namespace == _b("namespace"),
        workflow_instances.c.workflow_id == _b("workflow_id"),
        workflow_commands.c.command_type == _b("command_type"),
        workflow_commands.c.request_id == _b(value),
    )
)
_PENDING = (
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
_COMMAND = select(workflow_commands).where(
    workflow_commands.c.id == _b("command_id"), workflow_commands.c.instance_id == _b("iid")
)
_UPDATE_OF_COMMAND = select(workflow_updates).where(workflow_updates.c.command_id == _b("command_id"))
_UPDATE = select(workflow_updates).where(
    workflow_updates.c.id == _b("update_id"), workflow_updates.c.instance_id == _b("iid")
)
_INSERT_COMMAND = insert(workflow_commands)
_INSERT_UPDATE = insert(workflow_updates)
_INSERT_RUN = insert(workflow_runs)
_INSERT_EVENT = {
    dialect: insert(workflow_history_events)
    .values(tx_id=func.txid_current() if dialect == "postgresql" else literal(0))
    .returning(workflow_history_events.c.position, workflow_history_events.c.tx_id)
    for dialect in ("postgresql", "sqlite")
}
_INSERT_KEYED_COMMAND = {
    "postgresql": postgresql.insert(workflow_commands)
    .on_conflict_do_nothing(index_elements=list(_REQUEST_INDEX))
    .returning(workflow_commands.c.id),
    "sqlite": sqlite.insert(workflow_commands)
    .on_conflict_do_nothing(index_elements=list(_REQUEST_INDEX))
    .returning(workflow_commands.c.id),
}


def _key_values(request_ids: Sequence[str], postgres: bool) -> tuple[str, str] | None:
    """The two values a receipt lookup compares ``request_id`` with (token, raw key)."""
    # PostgreSQL text cannot hold NUL, so no stored value can equal a key that
    # contains one; asking would only make the driver refuse the query.
    wanted = [r for r in request_ids if not (postgres and "\x00" in r)]
    if not wanted:
        return None
    if len(wanted) > 2:
        raise ValueError("a receipt lookup compares at most two values")
    return wanted[0], wanted[-1]


def _receipt_order(
    found: Sequence[tuple[CommandRow, UpdateRow | None]],
) -> list[tuple[CommandRow, UpdateRow | None]]:
    """Receipts by creation time, then sequence, each once (see :func:`_by_key`)."""
    unique = {command.id: (command, update) for command, update in found}
    return sorted(unique.values(), key=lambda pair: (pair[0].created_at, pair[0].command_sequence))


def _current_run(row: Mapping[Any, Any]) -> RunRow | None:
    if row["run_id"] is None:
        return None
    return RunRow(
        row["run_id"],
        row["run_instance_id"],
        row["run_run_number"],
        row["run_status"],
        row["run_continued_from_run_id"],
        as_utc(row["run_started_at"]),
        _utc_or_none(row["run_closed_at"]),
    )


def _optional_update(row: Mapping[Any, Any]) -> UpdateRow | None:
    if row["u_id"] is None:
        return None
    return UpdateRow(
        row["u_id"],
        row["u_command_id"],
        row["u_instance_id"],
        row["u_run_id"],
        row["u_name"],
        row["u_status"],
        _bytes(row["u_result"]),
        row["u_failure"],
        as_utc(row["u_accepted_at"]),
        _utc_or_none(row["u_completed_at"]),
    )


class _SqlLocked:
    """One instance under the admission lock, on one connection."""

    def __init__(
        self, conn: Connection, cursor: Any, locked: Mapping[str, Any], postgres: bool, raw: _Statements
    ) -> None:
        self._conn = conn
        # The DBAPI cursor of the same connection, inside the same transaction,
        # for the hot statements (see _Raw).
        self._cursor = cursor
        self._raw = raw
        self._instance = _instance(locked)
        self._current = _current_run(locked)
        self._last_sequence: int = locked["last_sequence"] or 0
        self._postgres = postgres

    @property
    def instance(self) -> InstanceRow:
        return self._instance

    def run(self, run_id: str) -> RunRow | None:
        if self._current is not None and self._current.id == run_id:
            return self._current
        row = self._conn.execute(_RUN, {"run_id": run_id, "iid": self._instance.id}).mappings().first()
        return None if row is None else _run(row)

    def current_run(self) -> RunRow | None:
        return self._current

    def find_commands(self, command_type: str, request_ids: Sequence[str]) -> list[CommandRow]:
        values = _key_values(request_ids, self._postgres)
        if values is None:
            return []
        params = {
            "iid": self._instance.id,
            "command_type": command_type,
            "token": values[0],
            "raw": values[1],
        }
        rows = [(_command(r), None) for r in self._raw.commands_by_key.rows(self._cursor, params)]
        return [command for command, _ in (_receipt_order(rows) if len(rows) > 1 else rows)]

    def get_command(self, command_id: str) -> CommandRow | None:
        row = (
            self._conn.execute(_COMMAND, {"command_id": command_id, "iid": self._instance.id})
            .mappings()
            .first()
        )
        return None if row is None else _command(row)

    def next_command_sequence(self) -> int:
        # The lock serialises every writer of this instance, so the maximum
        # read with the lock stays valid for the whole transaction.
        self._last_sequence += 1
        return self._last_sequence

    def insert_command(self, row: CommandRow) -> bool:
        values = _fields(row)
        if row.request_id is None:
            self._conn.execute(_INSERT_COMMAND, values)
            return True
        return bool(self._raw.insert_keyed_command.rows(self._cursor, values))

    def update_for_command(self, command_id: str) -> UpdateRow | None:
        row = self._conn.execute(_UPDATE_OF_COMMAND, {"command_id": command_id}).mappings().first()
        return None if row is None else _update(row)

    def get_update(self, update_id: str) -> UpdateRow | None:
        row = (
            self._conn.execute(_UPDATE, {"update_id": update_id, "iid": self._instance.id}).mappings().first()
        )
        return None if row is None else _update(row)

    def insert_update(self, row: UpdateRow) -> None:
        self._conn.execute(_INSERT_UPDATE, _fields(row))

    def save_update(self, row: UpdateRow) -> None:
        self._conn.execute(
            update(workflow_updates).where(workflow_updates.c.id == row.id).values(_fields(row))
        )

    def save_command(self, row: CommandRow) -> None:
        self._conn.execute(
            update(workflow_commands).where(workflow_commands.c.id == row.id).values(_fields(row))
        )

    def pending_commands(self, run_ids: Sequence[str]) -> list[tuple[CommandRow, UpdateRow | None]]:
        if not run_ids:
            return []
        rows = self._conn.execute(_PENDING, {"iid": self._instance.id, "run_ids": list(run_ids)}).mappings()
        return [(_command(r), _optional_update(r)) for r in rows]

    def insert_run(self, row: RunRow) -> None:
        self._conn.execute(_INSERT_RUN, _fields(row))

    def save_run(self, row: RunRow) -> None:
        self._conn.execute(update(workflow_runs).where(workflow_runs.c.id == row.id).values(_fields(row)))
        if self._current is not None and self._current.id == row.id:
            self._current = row

    def set_current_run(self, run_id: str | None) -> None:
        self._conn.execute(
            update(workflow_instances)
            .where(workflow_instances.c.id == self._instance.id)
            .values(current_run_id=run_id)
        )
        self._instance = InstanceRow(
            self._instance.id,
            self._instance.namespace,
            self._instance.workflow_id,
            run_id,
            self._instance.created_at,
        )
        self._current = None if run_id is None else self.run(run_id)

    def delete_runs(self, run_ids: Sequence[str]) -> PruneCounts:
        if not run_ids:
            return PruneCounts()
        runs = list(run_ids)
        iid = self._instance.id
        events = self._conn.execute(
            delete(workflow_history_events).where(
                workflow_history_events.c.instance_id == iid, workflow_history_events.c.run_id.in_(runs)
            )
        ).rowcount
        updates = self._conn.execute(
            delete(workflow_updates).where(
                workflow_updates.c.instance_id == iid, workflow_updates.c.run_id.in_(runs)
            )
        ).rowcount
        commands = self._conn.execute(
            delete(workflow_commands).where(
                workflow_commands.c.instance_id == iid, workflow_commands.c.run_id.in_(runs)
            )
        ).rowcount
        if self._instance.current_run_id in runs:
            self.set_current_run(None)
        removed = self._conn.execute(
            delete(workflow_runs).where(workflow_runs.c.instance_id == iid, workflow_runs.c.id.in_(runs))
        ).rowcount
        return PruneCounts(removed, commands, updates, events)

    def delete_runless_refusals(self, before: datetime) -> PruneCounts:
        stale = select(workflow_commands.c.id).where(
            workflow_commands.c.instance_id == self._instance.id,
            workflow_commands.c.run_id.is_(None),
            workflow_commands.c.created_at < before,
        )
        events = self._conn.execute(
            delete(workflow_history_events).where(
                workflow_history_events.c.instance_id == self._instance.id,
                workflow_history_events.c.run_id.is_(None),
                workflow_history_events.c.command_id.in_(stale),
            )
        ).rowcount
        commands = self._conn.execute(
            delete(workflow_commands).where(workflow_commands.c.id.in_(stale.scalar_subquery()))
        ).rowcount
        return PruneCounts(0, commands, 0, events)

    def append_event(self, event_row: EventRow) -> EventRow:
        values = _fields(event_row)
        del values["position"], values["tx_id"]
        # On PostgreSQL tx_id is txid_current(): readers use it to never pass
        # an event that commits later (docs/event-log.md).
        (row,) = self._raw.insert_event.rows(self._cursor, values)
        return EventRow(**{**_fields(event_row), "position": row["position"], "tx_id": row["tx_id"]})


class _Raw:
    """A Core statement compiled once for one dialect, executed on a DBAPI cursor.

    For the admission hot path, where SQLAlchemy's per-execution work (event
    dispatch, parameter construction, result set-up) costs several times the
    statement itself.  The SQL is the Core statement's own compilation, and
    every parameter goes through the bind processor of its type for this
    dialect, which is what SQLAlchemy applies itself: a row written here is
    stored exactly as Core would store it (``tests/integration/test_raw_statements.py``).
    Rows come back as the driver returns them, for the converters above.
    Engine-level execution events do not see these statements.
    """

    __slots__ = ("_binds", "_names", "_positional", "sql")

    def __init__(
        self, statement: ClauseElement, dialect: Dialect, column_keys: Sequence[str] | None = None
    ) -> None:
        compiled = statement.compile(dialect=dialect, column_keys=list(column_keys) if column_keys else None)
        assert isinstance(compiled, SQLCompiler)
        self.sql: str = compiled.string
        by_name: dict[str, BindParameter[Any]] = {name: bind for bind, name in compiled.bind_names.items()}
        order = compiled.positiontup
        self._positional = order is not None
        # The result's column names, taken from the first execution: every
        # use of ``cursor.description`` makes psycopg build one object per
        # column, which costs more than fetching the row.
        self._names: list[str] | None = None
        names = list(order) if order is not None else list(by_name)
        # (rendered name, caller's key or None for a literal, processor, literal value)
        self._binds: list[tuple[str, str | None, Any, Any]] = []
        for name in names:
            bind = by_name[name]
            if bind.expanding:
                raise ValueError("expanding parameters are not supported here")
            processor = bind.type.dialect_impl(dialect).bind_processor(dialect)
            # Anonymous binds (``literal(0)``) carry their value; named ones come from the caller.
            key = None if bind.unique else bind.key
            self._binds.append((name, key, processor, bind.value))

    def parameters(self, params: Mapping[str, Any]) -> list[Any] | dict[str, Any]:
        """The driver's parameters for ``params``, processed as SQLAlchemy processes them."""
        values = []
        for _, key, processor, literal_value in self._binds:
            value = literal_value if key is None else params[key]
            values.append(value if processor is None else processor(value))
        if self._positional:
            return values
        return {name: value for (name, *_), value in zip(self._binds, values, strict=True)}

    def parameter_sets(
        self, rows: Sequence[Mapping[str, Any]], common: Mapping[str, Any]
    ) -> list[list[Any]] | list[dict[str, Any]]:
        """:meth:`parameters` for many rows that share the values in ``common``.

        Shared values and literals are processed once; each row gives the rest.
        """
        template: list[Any] = []
        varying: list[tuple[int, str, Any]] = []
        for index, (_, key, processor, literal_value) in enumerate(self._binds):
            if key is not None and key not in common:
                template.append(None)
                varying.append((index, key, processor))
                continue
            value = literal_value if key is None else common[key]
            template.append(value if processor is None else processor(value))
        sets: list[list[Any]] = []
        for row in rows:
            values = template.copy()
            for index, key, processor in varying:
                value = row[key]
                values[index] = value if processor is None else processor(value)
            sets.append(values)
        if self._positional:
            return sets
        names = [name for name, *_ in self._binds]
        return [dict(zip(names, values, strict=True)) for values in sets]

    def tuples(self, cursor: Any, params: Mapping[str, Any]) -> list[Any]:
        """Execute on ``cursor`` and return the driver's rows as they come, in column order."""
        cursor.execute(self.sql, self.parameters(params))
        return list(cursor.fetchall())

    def rows(self, cursor: Any, params: Mapping[str, Any]) -> list[dict[str, Any]]:
        """Execute on ``cursor`` and return every row as a dict by column name."""
        cursor.execute(self.sql, self.parameters(params))
        return self.fetched(cursor)

    def fetched(self, cursor: Any) -> list[dict[str, Any]]:
        """The rows this statement returned on ``cursor``, as dicts by column name.

        Only for statements that return rows (``SELECT``, ``RETURNING``).
        """
        names = self._names
        if names is None:
            names = self._names = [column[0] for column in cursor.description]
        # fetchall also finishes the statement (SQLite keeps an unfinished one active).
        return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


class BulkStatement:
    """One Core DML statement run for many parameter sets, in one ``executemany``
    on the transaction's own cursor.

    For statements repeated row by row on a hot path (the worker's state
    transitions and their events): the SQL is the Core statement's own
    compilation, built once, and every value goes through its type's bind
    processor, as with :class:`_Raw`, so rows are stored exactly as Core
    would store them, without SQLAlchemy's per-execution work.  Parameters
    are named by ``bindparam`` keys (or by column for an INSERT given
    ``keys``).  A driver error is raised as Core raises it (a
    :class:`sqlalchemy.exc.DBAPIError` keeping the driver's exception), so
    callers translate it as they translate any other statement's.
    """

    def __init__(self, statement: ClauseElement, dialect: Dialect, keys: Sequence[str] | None = None) -> None:
        self._raw = _Raw(statement, dialect, keys)
        self._error: type[Exception] = dialect.loaded_dbapi.Error

    def execute(
        self,
        connection: Connection,
        rows: Sequence[Mapping[str, Any]],
        common: Mapping[str, Any] | None = None,
    ) -> int:
        """Run the statement once per row inside ``connection``'s transaction; the rows it changed.

        ``common`` holds the values every row shares (processed once).
        """
        if not rows:
            return 0
        dbapi = connection.connection.dbapi_connection
        assert dbapi is not None
        cursor: Any = dbapi.cursor()
        parameters = self._raw.parameter_sets(rows, common or {})
        try:
            cursor.executemany(self._raw.sql, parameters)
            return int(cursor.rowcount)
        except self._error as exc:
            raise DBAPIError.instance(self._raw.sql, parameters, exc, self._error) from exc
        finally:
            cursor.close()


class BulkInsert:
    """Many rows into one table in one ``executemany`` (a :class:`BulkStatement`).

    For append-only logs written row by row on a hot path (the worker's
    events).  ``keys`` are the columns given; the others take their defaults
    (an autoincrement key).  Driver errors become :class:`StorageError`,
    keeping the cause.
    """

    def __init__(self, table: Table, dialect: Dialect, keys: Sequence[str]) -> None:
        self._statement = BulkStatement(table.insert(), dialect, keys)

    def insert(
        self,
        connection: Connection,
        rows: Sequence[Mapping[str, Any]],
        common: Mapping[str, Any] | None = None,
    ) -> None:
        """Insert ``rows`` inside ``connection``'s transaction (``common``: values they share)."""
        try:
            self._statement.execute(connection, rows, common)
        except DBAPIError as exc:
            constraint = _constraint_of(exc.orig)
            raise StorageError(
                f"the database refused a write ({constraint})", constraint=constraint
            ) from exc.orig


_EVENT_KEYS: Final = tuple(c.name for c in workflow_history_events.c if c.name not in ("position", "tx_id"))


class _Statements:
    """The hot-path statements of one store, compiled for its dialect."""

    def __init__(self, dialect: Dialect) -> None:
        name = "postgresql" if dialect.name == "postgresql" else "sqlite"
        self.instance_lookup = _Raw(_INSTANCE_LOOKUP, dialect)
        self.lock_postgres = _Raw(_LOCK_POSTGRES, dialect) if name == "postgresql" else None
        self.commands_by_key = _Raw(_COMMANDS_BY_KEY, dialect)
        self.receipts = _Raw(_RECEIPTS, dialect)
        self.signal_receipts = _Raw(_SIGNAL_RECEIPTS, dialect)
        self.insert_keyed_command = _Raw(_INSERT_KEYED_COMMAND[name], dialect, _COMMAND_FIELDS)
        self.insert_event = _Raw(_INSERT_EVENT[name], dialect, _EVENT_KEYS)


WRITE_CONNECTIONS: Final = 8
"""Write connections a store keeps for its own locked transactions, per process (see ``_Writers``)."""

REPLAN_AFTER: Final = (100, 1_000, 10_000)
"""Uses of a connection after which its statements are planned anew (then every 10,000).

psycopg prepares a statement on the server after a few executions, and
PostgreSQL keeps the generic plan it made then: a plan made while the tables
were nearly empty (a new database) scans ``workflow_commands`` whole, and
costs more with every command stored (1.6 ms against 0.13 ms after 3,000
admissions).  Planning again for the tables as they are makes it a point
probe for good.  The receipt-read connection is replaced; a write connection
drops its prepared statements (``DEALLOCATE ALL``, which psycopg follows).
"""

_USES: Final = "admission_uses"


def _replan_due(uses: int) -> bool:
    return uses in REPLAN_AFTER or uses % REPLAN_AFTER[-1] == 0


class _Readers:
    """One autocommit driver connection per thread and process, for the unlocked receipt read.

    A pooled connection would cost a checkout and, on return, a rollback: an
    extra round trip per retry on PostgreSQL.  Each thread keeps its own
    connection (a DBAPI connection is not safe to share between threads); a
    process that forked gets new ones, and never closes or uses its parent's,
    whose sockets it shares.  A connection that raised a driver error is
    dropped and the next read opens a new one.
    """

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._local = threading.local()
        self._mutex = threading.Lock()
        self._open: list[tuple[int, threading.Thread, Any]] = []
        # Connections inherited through fork: kept referenced so that
        # collecting them never closes the parent's session.
        self._inherited: list[Any] = []

    def cursor(self) -> Any:
        """A cursor on this thread's connection, opened on first use."""
        pid = os.getpid()
        held = getattr(self._local, "held", None)
        if held is not None and held[0] == pid:
            held[3] += 1
            if not _replan_due(held[3]):
                return held[2]
            uses = held[3]
            self.discard()  # replaced, so that its statements are planned again (REPLAN_AFTER)
        else:
            uses = 0
        connection = self._connect()
        cursor = connection.cursor()
        self._local.held = [pid, connection, cursor, uses]
        with self._mutex:
            # A thread that ended (a server's pool retires idle threads) leaves
            # its connection here: close those as new threads come.
            ended = [(p, t, c) for p, t, c in self._open if p == pid and not t.is_alive()]
            self._open = [entry for entry in self._open if entry not in ended]
            self._open.append((pid, threading.current_thread(), connection))
        for _, _, stale in ended:
            with suppress(Exception):
                stale.close()
        return cursor

    def _connect(self) -> Any:
        # A connection made by the engine's pool, so that its connect-time
        # configuration (SQLite pragmas, connect_args) applies, then detached
        # from the pool for good.
        proxy = self._engine.raw_connection()
        proxy.detach()
        connection: Any = proxy.dbapi_connection
        if self._engine.dialect.name == "postgresql":
            connection.rollback()
            connection.autocommit = True
        # SQLite: the engine's connections already have isolation_level=None,
        # so each SELECT is its own WAL read, without an explicit transaction.
        return connection

    def discard(self) -> None:
        """Drop this thread's connection after a driver error."""
        held = getattr(self._local, "held", None)
        self._local.held = None
        if held is None or held[0] != os.getpid():
            return
        with self._mutex:
            self._open = [entry for entry in self._open if entry[2] is not held[1]]
        # It is being thrown away because it failed; closing may fail too.
        with suppress(Exception):
            held[1].close()

    def close(self) -> None:
        """Close every connection this process opened; other threads reopen on their next read."""
        pid = os.getpid()
        with self._mutex:
            mine = [c for p, _, c in self._open if p == pid]
            self._inherited.extend(c for p, _, c in self._open if p != pid)
            self._open = []
            self._local = threading.local()
        for connection in mine:
            with suppress(Exception):  # best effort: the connection may already be broken
                connection.close()


class _Writers:
    """Kept write connections for the store's own locked transactions.

    Checking a connection out of the engine's pool and back in costs more
    than the statements of an admission on SQLite (a new ``Connection``, the
    pool's events, and a reset on return).  Instead, up to ``limit``
    SQLAlchemy connections, made by the pool (so its connect-time
    configuration applies) and detached from it, are kept in a free list and
    lent to one transaction at a time; when all are lent, a transaction takes
    a pooled connection as before, so at most ``limit`` connections are held
    beyond the pool's own.  A connection is given back only after a
    transaction that ended cleanly or with admission's own typed error; after
    any other failure it is closed and a new one is made when needed.  A
    forked process makes its own and never uses or closes its parent's.
    """

    def __init__(self, engine: Engine, limit: int) -> None:
        self._engine = engine
        self._limit = limit
        self._mutex = threading.Lock()
        self._pid = os.getpid()
        self._free: list[Connection] = []
        self._lent = 0
        # Connections inherited through fork: kept referenced so that
        # collecting them never closes the parent's session.
        self._inherited: list[Connection] = []
        self._generation = 0

    def _take(self) -> tuple[Connection | None, int]:
        with self._mutex:
            if self._pid != os.getpid():
                self._inherited.extend(self._free)
                self._free, self._lent, self._pid = [], 0, os.getpid()
                self._generation += 1
            if self._free:
                self._lent += 1
                return self._free.pop(), self._generation
            if self._lent >= self._limit:
                return None, self._generation
            self._lent += 1
            generation = self._generation
        try:
            connection = self._engine.connect()
            connection.detach()
        except BaseException:
            with self._mutex:
                self._lent -= 1
            raise
        return connection, generation

    def _give(self, connection: Connection, generation: int, healthy: bool) -> None:
        with self._mutex:
            mine = generation == self._generation and self._pid == os.getpid()
            if mine:
                self._lent -= 1
                if healthy and not connection.invalidated and not connection.in_transaction():
                    self._free.append(connection)
                    return
        if mine or self._pid == os.getpid():
            with suppress(Exception):  # best effort: it may be the broken one
                connection.close()

    @contextmanager
    def transaction(self) -> Iterator[Connection]:
        """A write transaction on a kept connection (or, when all are lent, a pooled one)."""
        connection, generation = self._take()
        if connection is None:
            with self._engine.connect() as pooled, pooled.begin():
                yield pooled
            return
        healthy = False
        try:
            with connection.begin():
                yield connection
            healthy = True
        except AdmissionError:
            # Admission's own refusal was rolled back on a sound connection;
            # driver errors reach here untranslated and close the connection.
            healthy = True
            raise
        finally:
            self._give(connection, generation, healthy)

    def close(self) -> None:
        """Close this process's free connections; lent ones are closed when given back."""
        with self._mutex:
            if self._pid != os.getpid():
                return
            free, self._free = self._free, []
            self._lent = 0
            self._generation += 1
        for connection in free:
            with suppress(Exception):
                connection.close()


class SqlStore:
    """The :class:`~admission.receipts._store.Store` on SQLite or PostgreSQL.

    Opening checks the schema revision and refuses anything but the head
    (contract §6): run ``admission db upgrade`` first.
    """

    def __init__(self, engine: Engine, *, check: bool = True) -> None:
        self.engine = engine
        self.postgres = engine.dialect.name == "postgresql"
        self._raw = _Statements(engine.dialect)
        # The engine with admission's write option set once, not per transaction.
        self._write_engine = engine.execution_options(**{_WRITE: True})
        self._readers = _Readers(engine)
        self._writers = _Writers(self._write_engine, WRITE_CONNECTIONS)
        self._dbapi_error: type[Exception] = engine.dialect.loaded_dbapi.Error
        # psycopg's pipeline mode needs libpq 14 or later; without it the lock
        # and the lookup take a round trip each.
        pipeline = getattr(engine.dialect.loaded_dbapi, "Pipeline", None)
        self._pipeline = self.postgres and pipeline is not None and bool(pipeline.is_supported())
        self._dbapi_integrity: type[Exception] = engine.dialect.loaded_dbapi.IntegrityError
        self._dbapi_operational: type[Exception] = engine.dialect.loaded_dbapi.OperationalError
        if check:
            with self._read() as conn:
                check_revision(conn)

    @classmethod
    def open(cls, url: str = DEFAULT_URL, **engine_options: Any) -> SqlStore:
        """Create an engine for ``url`` and open the store on it."""
        return cls(create_admission_engine(url, **engine_options))

    def dispose(self) -> None:
        """Close the engine's pooled connections and this process's kept read and write connections."""
        self._readers.close()
        self._writers.close()
        self.engine.dispose()

    @contextmanager
    def begin(self) -> Iterator[Connection]:
        """A connection in a write transaction, for a caller that owns the transaction.

        On SQLite this is ``BEGIN IMMEDIATE``, which admission needs when it
        takes its lock inside the caller's transaction.  Commits on success,
        rolls back on an exception.
        """
        with self._translate(), self._write() as conn:
            yield conn

    @contextmanager
    def _write(self) -> Iterator[Connection]:
        with self._write_engine.connect() as conn, conn.begin():
            yield conn

    @contextmanager
    def _read(self) -> Iterator[Connection]:
        with self._translate(), self.engine.connect() as conn, conn.begin():
            yield conn

    @contextmanager
    def _translate(self) -> Iterator[None]:
        try:
            yield
        except IntegrityError as exc:
            raise StorageError(
                f"the database refused a write ({_constraint(exc)})", constraint=_constraint(exc)
            ) from exc
        except OperationalError as exc:
            raise StorageError(f"the database is unavailable or busy: {exc.orig}") from exc
        except DBAPIError as exc:
            raise StorageError(f"the database refused an operation: {exc.orig}") from exc
        except self._dbapi_integrity as exc:
            # The same refusal, raised by a statement run on the driver (_Raw).
            name = _constraint_of(exc)
            raise StorageError(f"the database refused a write ({name})", constraint=name) from exc
        except self._dbapi_operational as exc:
            raise StorageError(f"the database is unavailable or busy: {exc}") from exc
        except self._dbapi_error as exc:
            raise StorageError(f"the database refused an operation: {exc}") from exc

    def _lock(
        self, conn: Connection, namespace: str, workflow_id: str, created_at: datetime, new_id: str
    ) -> _SqlLocked:
        params = {"namespace": namespace, "workflow_id": workflow_id}
        dbapi = conn.connection.dbapi_connection
        assert dbapi is not None
        if self.postgres:
            info = conn.connection.info
            info[_USES] = uses = info.get(_USES, 0) + 1
            if _replan_due(uses):
                # See REPLAN_AFTER.  Allowed inside a transaction; a caller's
                # own statements are prepared again too.
                dbapi.execute("DEALLOCATE ALL")
        cursor = dbapi.cursor()
        rows = self._lock_rows(dbapi, cursor, params)
        if not rows:
            values = {
                "id": new_id,
                "namespace": namespace,
                "workflow_id": workflow_id,
                "current_run_id": None,
                "created_at": created_at,
            }
            # Two first-time callers both get here; the loser of the insert
            # waits on the winner's uncommitted row and then locks it below.
            insert_or_ignore(conn, workflow_instances, values, ["namespace", "workflow_id"])
            rows = self._lock_rows(dbapi, cursor, params)
        (row,) = rows
        return _SqlLocked(conn, cursor, row, self.postgres, self._raw)

    def _lock_rows(self, dbapi: Any, cursor: Any, params: Mapping[str, Any]) -> list[dict[str, Any]]:
        """Take the instance's lock and read it (no rows if it does not exist yet)."""
        lookup = self._raw.instance_lookup
        lock = self._raw.lock_postgres
        if lock is None:
            # SQLite: BEGIN IMMEDIATE already holds the lock.
            return lookup.rows(cursor, params)
        # PostgreSQL: the lock and the lookup are two statements (see
        # _LOCK_POSTGRES), sent in one round trip.  The server runs them in
        # order, so the lookup starts, with a new snapshot, only once the lock
        # is granted, and sees every commit made before.
        if not self._pipeline:
            return lookup.rows(cursor, params) if lock.rows(cursor, params) else []
        lookup_cursor = dbapi.cursor()
        with dbapi.pipeline():
            cursor.execute(lock.sql, lock.parameters(params))
            lookup_cursor.execute(lookup.sql, lookup.parameters(params))
        if not cursor.fetchall():
            return []
        return lookup.fetched(lookup_cursor)

    @contextmanager
    def _locked(
        self,
        namespace: str,
        workflow_id: str,
        created_at: datetime,
        new_id: str,
        connection: Connection | None,
    ) -> Iterator[LockedInstance]:
        if connection is not None:
            # The caller owns the transaction: neither commit nor roll back.
            with self._translate():
                yield self._lock(connection, namespace, workflow_id, created_at, new_id)
            return
        with self._translate(), self._writers.transaction() as conn:
            yield self._lock(conn, namespace, workflow_id, created_at, new_id)

    def locked(
        self,
        namespace: str,
        workflow_id: str,
        *,
        created_at: datetime,
        new_id: str,
        connection: object | None = None,
    ) -> AbstractContextManager[LockedInstance]:
        """Open a transaction holding the admission lock of one instance (contract §4)."""
        if connection is not None and not isinstance(connection, Connection):
            raise TypeError("connection must be a SQLAlchemy Connection")
        if isinstance(connection, Connection) and not connection.in_transaction():
            raise AdmissionError("the caller's connection must be in a transaction (use SqlStore.begin())")
        return self._locked(namespace, workflow_id, created_at, new_id, connection)

    def find_instance(self, namespace: str, workflow_id: str) -> InstanceRow | None:
        """Read an instance without locking it."""
        with self._read() as conn:
            row = (
                conn.execute(
                    select(workflow_instances).where(
                        workflow_instances.c.namespace == namespace,
                        workflow_instances.c.workflow_id == workflow_id,
                    )
                )
                .mappings()
                .first()
            )
        return None if row is None else _instance(row)

    def read_receipts(
        self, namespace: str, workflow_id: str, command_type: str, request_ids: Sequence[str]
    ) -> list[tuple[CommandRow, UpdateRow | None]]:
        """Committed commands by ``request_id`` values with their updates, in one read, no lock."""
        values = _key_values(request_ids, self.postgres)
        if values is None:
            return []
        params = {
            "namespace": namespace,
            "workflow_id": workflow_id,
            "command_type": command_type,
            "token": values[0],
            "raw": values[1],
        }
        found: list[tuple[CommandRow, UpdateRow | None]]
        try:
            cursor = self._readers.cursor()
            if command_type == "signal":
                signals = self._raw.signal_receipts.tuples(cursor, params)
                found = [(_command_of_columns(r), None) for r in signals]
            else:
                found = [(_command(r), _optional_update(r)) for r in self._raw.receipts.rows(cursor, params)]
        except self._dbapi_error as exc:
            self._readers.discard()
            raise StorageError(f"the database is unavailable or busy: {exc}") from exc
        return _receipt_order(found) if len(found) > 1 else found

    def read_history(self, instance_id: str) -> list[EventRow]:
        """Every event of one instance, in log order."""
        with self._read() as conn:
            rows = (
                conn.execute(
                    select(workflow_history_events)
                    .where(workflow_history_events.c.instance_id == instance_id)
                    .order_by(workflow_history_events.c.position)
                )
                .mappings()
                .all()
            )
        return [_event(r) for r in rows]

    def prune_targets(self, before: datetime) -> list[PruneTarget]:
        """Chain ends closed before ``before``, then instances with older run-less refusals."""
        runs = (
            select(workflow_instances.c.namespace, workflow_instances.c.workflow_id, workflow_runs.c.id)
            .join(workflow_instances, workflow_instances.c.id == workflow_runs.c.instance_id)
            .where(workflow_runs.c.status.not_in(["open", "continued"]), workflow_runs.c.closed_at < before)
            .order_by(workflow_runs.c.closed_at, workflow_runs.c.id)
        )
        runless = (
            select(workflow_instances.c.namespace, workflow_instances.c.workflow_id)
            .where(
                workflow_instances.c.id.in_(
                    select(workflow_commands.c.instance_id).where(
                        workflow_commands.c.run_id.is_(None), workflow_commands.c.created_at < before
                    )
                )
            )
            .order_by(workflow_instances.c.id)
        )
        with self._read() as conn:
            ends = [PruneTarget(ns, wf, run_id) for ns, wf, run_id in conn.execute(runs)]
            stale = [PruneTarget(ns, wf, None) for ns, wf in conn.execute(runless)]
        return ends + stale

    def read_events(self, after: EventCursor, limit: int) -> list[EventRow]:
        """Events after ``after`` that are safe to read now, in (tx_id, position) order.

        On PostgreSQL only events of transactions older than every transaction
        still running are returned (``tx_id < txid_snapshot_xmin``): a
        transaction still open may yet commit events with lower positions,
        and a reader that passed them would never see them.
        """
        events = workflow_history_events
        query = select(events)
        if self.postgres:
            query = query.where(
                tuple_(events.c.tx_id, events.c.position)
                > tuple_(literal(after.tx_id), literal(after.position)),
                events.c.tx_id < func.txid_snapshot_xmin(func.txid_current_snapshot()),
            ).order_by(events.c.tx_id, events.c.position)
        else:
            query = query.where(events.c.position > after.position).order_by(events.c.position)
        with self._read() as conn:
            rows = conn.execute(query.limit(limit)).mappings().all()
        return [_event(r) for r in rows]
