"""The receipt store on SQLite (the embedded default) and PostgreSQL.

The admission lock (contract §4) is, on PostgreSQL, a row lock on the
instance (``SELECT ... FOR UPDATE``, after an ``INSERT ... ON CONFLICT DO
NOTHING`` when the row must first be created, so two first-time callers still
serialise on it) and, on SQLite, a write transaction opened with ``BEGIN
IMMEDIATE`` under a busy timeout.  The unique index
``workflow_commands_request_lookup`` is the backstop: a command insert is ``ON
CONFLICT DO NOTHING`` on exactly that index, so a duplicate key is read back
and answered as a receipt, never surfaced as an error.

Driver errors become admission errors at the one boundary,
:func:`~admission.sql._engine.wrap_exceptions`, keeping the cause.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from datetime import datetime
from typing import Any, TypeVar

from sqlalchemy import Engine, delete, update
from sqlalchemy.engine import Connection

from admission.receipts._store import (
    CommandRow,
    EventRow,
    InstanceRow,
    LockedInstance,
    PruneCounts,
    RunRow,
    UpdateRow,
    insert_stepwise,
)
from admission.sql._caller import caller_connection, join_transaction
from admission.sql._connections import USES, budget_of, kept_for, replan_due
from admission.sql._engine import (
    DEFAULT_URL,
    WRITE_OPTION,
    create_admission_engine,
    insert_or_ignore,
    is_postgresql,
    wrap_exceptions,
)
from admission.sql._event_rows import event_values
from admission.sql._fused import FusedStatements, ManyLocks, lock_rows, own_transaction
from admission.sql._keyed import KeyedLocks
from admission.sql._pooler import pooler_of
from admission.sql._receipt_queries import (
    COMMAND,
    INSERT_COMMAND,
    INSERT_UPDATE,
    PENDING,
    RUN,
    UPDATE,
    UPDATE_OF_COMMAND,
    ReceiptStatements,
    command_of_columns,
    command_row,
    current_run_row,
    fields_of,
    insert_run,
    instance_row,
    key_values,
    receipt_order,
    receipt_pairs,
    run_row,
    update_row,
    wanted_keys,
)
from admission.sql._receipt_reads import ReceiptReads
from admission.sql._replica import REPLICA_RETRY_SECONDS, ReadReplica, ReplicaCounts, replica_engine
from admission.sql._retention import delete_run_rows, delete_runless_refusals, latest_time
from admission.sql._revisions import check_revision
from admission.sql._schema import workflow_commands, workflow_instances, workflow_runs, workflow_updates
from admission.sql._sqlite_file import verify_file
from admission.sql._wire import forget_prepared, read_tuples, wire_ready

__all__ = ["SqlStore"]

T = TypeVar("T")


class _SqlLocked:
    """One instance under the admission lock, on one connection."""

    def __init__(
        self,
        conn: Connection,
        cursor: Any,
        locked: Mapping[str, Any],
        statements: tuple[ReceiptStatements, FusedStatements | None],
        *,
        is_async: bool,
        commits: bool,
        found: tuple[tuple[str, Sequence[str]], list[CommandRow]] | None = None,
    ) -> None:
        self._conn = conn
        # The DBAPI cursor of the same connection, inside the same transaction,
        # for the hot statements (see RawStatement).
        self._cursor = cursor
        self._raw, self._fused = statements
        self._async = is_async
        # The store's own transaction, begun in the lock's pipeline: its last write may commit it.
        self._commits = commits
        self._instance = instance_row(locked)
        self._current = current_run_row(locked)
        self._last_sequence: int = locked["last_sequence"] or 0
        self._postgres = self._fused is not None
        # A key's commands read in the lock's round trip, after the lock: its first lookup's answer.
        self._found = found
        # The last command inserted: its admission event, appended next, may be kept compact.
        self._inserted: CommandRow | None = None

    @property
    def instance(self) -> InstanceRow:
        return self._instance

    def run(self, run_id: str) -> RunRow | None:
        if self._current is not None and self._current.id == run_id:
            return self._current
        row = self._conn.execute(RUN, {"run_id": run_id, "iid": self._instance.id}).mappings().first()
        return None if row is None else run_row(row)

    def current_run(self) -> RunRow | None:
        return self._current

    def find_commands(self, command_type: str, request_ids: Sequence[str]) -> list[CommandRow]:
        if self._found is not None:
            (wanted, found), self._found = self._found, None  # once: a write may follow
            if wanted == (command_type, request_ids):
                return found
        group = (self._instance.id, command_type)
        if len(request_ids) > 2:
            return self.find_commands_many({group: request_ids})[group]
        # A key under the lock, as its token and its raw key: the two-value statement.
        pair = key_values(request_ids, self._postgres)
        if pair is None:
            return []
        params = {"iid": group[0], "command_type": command_type, "token": pair[0], "raw": pair[1]}
        rows = [(command_row(row), None) for row in self._raw.commands_by_key.rows(self._cursor, params)]
        return [command for command, _ in (receipt_order(rows) if len(rows) > 1 else rows)]

    def find_commands_many(
        self, wanted: Mapping[tuple[str, str], Sequence[str]]
    ) -> dict[tuple[str, str], list[CommandRow]]:
        found: dict[tuple[str, str], list[tuple[CommandRow, None]]] = {key: [] for key in wanted}
        triples = [
            (iid, kind, value)
            for (iid, kind), ids in wanted.items()
            for value in wanted_keys(ids, self._postgres)
        ]
        for row in self._raw.batch_reads.commands(self._cursor, triples) if triples else ():
            command = command_row(row)
            found[(command.instance_id, command.command_type)].append((command, None))
        return {group: [command for command, _ in receipt_order(rows)] for group, rows in found.items()}

    def get_command(self, command_id: str) -> CommandRow | None:
        row = (
            self._conn.execute(COMMAND, {"command_id": command_id, "iid": self._instance.id})
            .mappings()
            .first()
        )
        return None if row is None else command_row(row)

    def next_command_sequence(self) -> int:
        # The lock serialises every writer of this instance, so the maximum
        # read with the lock stays valid for the whole transaction.
        self._last_sequence += 1
        return self._last_sequence

    def insert_command(self, row: CommandRow) -> bool:
        values = fields_of(row)
        if row.request_id is None:
            self._conn.execute(INSERT_COMMAND, values)
        elif not self._raw.insert_keyed_command.rows(self._cursor, values):
            return False
        self._inserted = row
        return True

    def insert_admitted(
        self, command: CommandRow, update: UpdateRow | None, event: EventRow, *, last: bool = False
    ) -> bool:
        if self._fused is None:
            return insert_stepwise(self, command, update, event)
        # PostgreSQL: one statement, and COMMIT with it when the transaction is the store's own.
        dbapi = self._conn.connection.dbapi_connection
        commit = last and self._commits
        return self._fused.insert(dbapi, self._cursor, (command, update, event), commit, self._async)

    def insert_admitted_many(
        self, admitted: Sequence[tuple[CommandRow, UpdateRow | None, EventRow]], *, last: bool = False
    ) -> bool:
        if self._fused is None:
            return self._raw.batch.insert(self._conn, admitted)
        # PostgreSQL: one statement for the whole batch, and COMMIT with it when the
        # transaction is the store's own.
        dbapi = self._conn.connection.dbapi_connection
        return self._fused.insert_many(dbapi, self._cursor, admitted, last and self._commits, self._async)

    def update_for_command(self, command_id: str) -> UpdateRow | None:
        row = self._conn.execute(UPDATE_OF_COMMAND, {"command_id": command_id}).mappings().first()
        return None if row is None else update_row(row)

    def get_update(self, update_id: str) -> UpdateRow | None:
        row = (
            self._conn.execute(UPDATE, {"update_id": update_id, "iid": self._instance.id}).mappings().first()
        )
        return None if row is None else update_row(row)

    def insert_update(self, row: UpdateRow) -> None:
        self._conn.execute(INSERT_UPDATE, fields_of(row))

    def save_update(self, row: UpdateRow) -> None:
        self._conn.execute(
            update(workflow_updates).where(workflow_updates.c.id == row.id).values(fields_of(row))
        )

    def save_command(self, row: CommandRow) -> None:
        self._conn.execute(
            update(workflow_commands).where(workflow_commands.c.id == row.id).values(fields_of(row))
        )

    def pending_commands(self, run_ids: Sequence[str]) -> list[tuple[CommandRow, UpdateRow | None]]:
        if not run_ids:
            return []
        rows = self._conn.execute(PENDING, {"iid": self._instance.id, "run_ids": list(run_ids)}).mappings()
        return receipt_pairs(list(rows), True)

    def insert_run(self, row: RunRow) -> None:
        insert_run(self._conn, row)

    def save_run(self, row: RunRow) -> None:
        self._conn.execute(update(workflow_runs).where(workflow_runs.c.id == row.id).values(fields_of(row)))
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
        events, updates, commands = delete_run_rows(self._conn, self._instance.id, runs)
        if self._instance.current_run_id in runs:
            self.set_current_run(None)
        removed = self._conn.execute(
            delete(workflow_runs).where(
                workflow_runs.c.instance_id == self._instance.id, workflow_runs.c.id.in_(runs)
            )
        ).rowcount
        return PruneCounts(removed, commands, updates, events)

    def delete_runless_refusals(self, before: datetime) -> PruneCounts:
        return delete_runless_refusals(self._conn, self._instance.id, before)

    def latest_time(self, run_ids: Sequence[str]) -> datetime | None:
        return latest_time(self._conn, self._instance.id, run_ids)

    def append_event(self, event_row: EventRow) -> EventRow:
        # On PostgreSQL tx_id is txid_current(): readers use it to never pass
        # an event that commits later (docs/event-log.md).  The payload is kept compact only
        # if this is the admission event of the command inserted last (event_values checks).
        values = event_values(event_row, self._inserted)
        (row,) = self._raw.insert_event.rows(self._cursor, values)
        return EventRow(**{**fields_of(event_row), "position": row["position"], "tx_id": row["tx_id"]})


class SqlStore(ReceiptReads, KeyedLocks):
    """The :class:`~admission.receipts.Store` on SQLite or PostgreSQL.

    Opening checks the schema revision and refuses anything but the head
    (contract §6): run ``admission db upgrade`` first.

    ``read_engine`` (on a streaming replica of the database) answers the
    retries whose receipt is final; every other read, and every read while
    the replica fails (tried again after ``replica_retry`` seconds), is the
    primary's (:class:`~admission.sql._replica.ReadReplica`, ``docs/replicas.md``).
    """

    def __init__(
        self,
        engine: Engine,
        *,
        check: bool = True,
        read_engine: Engine | None = None,
        replica_retry: float = REPLICA_RETRY_SECONDS,
    ) -> None:
        self.engine = engine
        self.replica = None if read_engine is None else ReadReplica(read_engine, engine, replica_retry)
        self.postgres = is_postgresql(engine.dialect)
        # Prepared statements are planned anew now and then (REPLAN_AFTER); behind a
        # transaction pooler none are prepared, and DEALLOCATE ALL would reach whichever
        # server session the transaction was lent (admission/sql/_pooler.py).
        self._replan = self.postgres and pooler_of(engine) is None
        self._raw = ReceiptStatements(engine.dialect)
        self._fused = FusedStatements(engine.dialect) if self.postgres else None
        self._translating = wrap_exceptions(engine.dialect)  # no state of its own: one for every block
        # The engine with admission's write option set once, not per transaction.
        self._write_engine = engine.execution_options(**{WRITE_OPTION: True})
        # The kept read and write connections, inside the engine's connection budget.
        self._kept = kept_for(engine)
        # psycopg's pipeline mode needs libpq 14 or later; without it the lock
        # and the lookup take a round trip each.  SQLAlchemy's adapter of
        # psycopg's AsyncConnection has no pipeline(): on an asyncio engine the
        # pipeline is driven on the AsyncConnection itself (_pipelined).
        pipeline = getattr(engine.dialect.loaded_dbapi, "Pipeline", None)
        self._pipeline = self.postgres and pipeline is not None and bool(pipeline.is_supported())
        self._many_locks = ManyLocks(engine.dialect) if self._pipeline else None
        self._async = engine.dialect.is_async
        # A sync PostgreSQL store reads a retry's receipts through libpq's pipeline directly
        # (admission/sql/_wire.py), on connections in autocommit where statements are prepared.
        self._wired_reads = self.postgres and not self._async
        # A keyed command's receipts read in the lock's round trip (admission/sql/_keyed.py); with a
        # replica a retry's read goes there first instead.
        self.keyed_locks = self._pipeline and self.replica is None
        if check:
            with self._read() as conn:
                check_revision(conn)

    @classmethod
    def open(cls, url: str = DEFAULT_URL, *, read_url: str | None = None, **engine_options: Any) -> SqlStore:
        """Create an engine for ``url`` (options as for
        :func:`~admission.sql.create_admission_engine`, ``connections=N`` the budget) and open the
        store on it; with ``read_url``, a replica's engine with the same ``engine_options``, so its
        pool has the same bounds (see the class)."""
        read_engine = None if read_url is None else replica_engine(read_url, engine_options)
        return cls(create_admission_engine(url, **engine_options), read_engine=read_engine)

    def replica_counts(self) -> ReplicaCounts | None:
        """What the read replica answered so far in this process (``None`` without one)."""
        return None if self.replica is None else self.replica.counts()

    @property
    def connections(self) -> int:
        """The store's connection budget: the most connections it holds in this process (its
        engine's pool bound; ``admission/sql/_connections.py``)."""
        return budget_of(self.engine)

    def dispose(self) -> None:
        """Close the engine's pooled connections and this process's kept read and write connections."""
        if self.replica is not None:
            self.replica.dispose()
        self._kept.close()
        self.engine.dispose()

    @property
    def write_engine(self) -> Engine:
        """:attr:`engine` for transactions that will admit: on SQLite they begin with ``BEGIN IMMEDIATE``.

        Bind a caller's ``Session`` to it (``Session(store.write_engine)``) when
        the transaction reads before it admits: it then holds SQLite's write lock
        from its first statement.  On PostgreSQL it is the same database and
        the same transactions as :attr:`engine`.
        """
        return self._write_engine

    @contextmanager
    def begin(self) -> Iterator[Connection]:
        """A connection in a write transaction, for a caller that owns the transaction.

        On SQLite this is ``BEGIN IMMEDIATE``: the transaction holds the write
        lock, which is admission's lock there, from its first statement.
        Commits on success, rolls back on an exception.
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

    def _translate(self) -> AbstractContextManager[None]:
        return self._translating

    def _lock(
        self,
        conn: Connection,
        namespace: str,
        workflow_id: str,
        created_at: datetime,
        new_id: str,
        begin: str | None = None,
    ) -> _SqlLocked:
        """The instance's lock in ``conn``'s transaction; with ``begin``, the store's own transaction,
        begun by that statement in the lock's round trip (:func:`~admission.sql._fused.own_transaction`)."""
        params = {"namespace": namespace, "workflow_id": workflow_id}
        dbapi = self._driver(conn, begin)
        cursor = dbapi.cursor()
        rows = self._lock_rows(dbapi, cursor, params, begin)
        return self._locked(conn, (dbapi, cursor), rows, params, (created_at, new_id), begin is not None)

    def _locked(
        self,
        conn: Connection,
        driver: tuple[Any, Any],
        rows: list[dict[str, Any]],
        params: Mapping[str, Any],
        new: tuple[datetime, str],
        commits: bool,
        found: tuple[tuple[str, Sequence[str]], list[CommandRow]] | None = None,
    ) -> _SqlLocked:
        """The locked instance of the lock's ``rows``; with none, the instance created and locked."""
        dbapi, cursor = driver
        if not rows:
            values = {"id": new[1], "current_run_id": None, "created_at": new[0]}
            values.update(namespace=params["namespace"], workflow_id=params["workflow_id"])
            # Two first-time callers both get here; the loser of the insert
            # waits on the winner's uncommitted row and then locks it below.
            insert_or_ignore(conn, workflow_instances, values, ["namespace", "workflow_id"])
            rows = self._lock_rows(dbapi, cursor, params, None)
        (row,) = rows
        statements = (self._raw, self._fused)
        return _SqlLocked(conn, cursor, row, statements, is_async=self._async, commits=commits, found=found)

    def _driver(self, conn: Connection, begin: str | None) -> Any:
        """``conn``'s driver connection, its statements planned anew when due (REPLAN_AFTER)."""
        dbapi: Any = conn.connection.dbapi_connection
        if self._replan:
            info = conn.connection.info
            info[USES] = uses = info.get(USES, 0) + 1
            if replan_due(uses):
                # Allowed inside a transaction; a caller's own statements are
                # prepared again too.  Before the BEGIN sent with the lock.
                if begin is not None:
                    dbapi.autocommit = True
                # A text of its own each time: psycopg forgets its own statements on a
                # DEALLOCATE ALL only when it sees that text for the first time while it holds
                # some (a text it has seen before is not looked at again).
                dbapi.execute(f"DEALLOCATE ALL /* use {uses} */")
                forget_prepared(conn.connection.driver_connection)
        return dbapi

    def _lock_many(
        self,
        conn: Connection,
        ordered: Sequence[tuple[tuple[str, str], str]],
        created_at: datetime,
        begin: str | None,
    ) -> dict[tuple[str, str], _SqlLocked]:
        """Several instances' locks in ``ordered``'s order; on PostgreSQL with pipelines in one round
        trip, with ``begin`` when given (the store's own transaction, as for :meth:`_lock`)."""
        cursor, raw = conn.connection.dbapi_connection.cursor(), (self._raw, self._fused)  # type: ignore[union-attr]
        if self._many_locks is not None:
            dbapi = self._driver(conn, begin)
            found = self._many_locks.rows(dbapi, ordered, created_at, begin=begin, is_async=self._async)
        elif not self.postgres:
            # SQLite: BEGIN IMMEDIATE holds the lock; the instances are read at once, and a
            # missing one is created by its own lock below.
            rows = self._raw.batch_reads.instances(cursor, [key for key, _ in ordered])
            found = {(row["namespace"], row["workflow_id"]): row for row in rows}
        else:
            found = {}
        return {
            key: _SqlLocked(conn, cursor, found[key], raw, is_async=self._async, commits=begin is not None)
            if key in found
            else self._lock(conn, *key, created_at, new_id)
            for key, new_id in ordered
        }

    def _lock_rows(
        self, dbapi: Any, cursor: Any, params: Mapping[str, Any], begin: str | None
    ) -> list[dict[str, Any]]:
        """Take the instance's lock and read it (no rows if it does not exist yet)."""
        lookup = self._raw.instance_lookup
        lock = self._raw.lock_postgres
        if lock is None:
            # SQLite: BEGIN IMMEDIATE already holds the lock.
            return lookup.rows(cursor, params)
        # PostgreSQL: the lock and the lookup are two statements (see LOCK_POSTGRES),
        # sent in one round trip, with the BEGIN if there is one (admission/sql/_fused.py).
        if not self._pipeline:
            return lookup.rows(cursor, params) if lock.rows(cursor, params) else []
        locked, found = lock_rows(dbapi, cursor, (lock, lookup), params, begin=begin, is_async=self._async)
        return found if locked else []

    @contextmanager
    def _held(
        self, connection: Connection | None, take: Callable[[Connection, str | None], T]
    ) -> Iterator[T]:
        """A transaction, the caller's or the store's own, with ``take`` run first in it (the locks);
        ``take`` gets the ``BEGIN`` of the store's own on PostgreSQL with pipelines
        (:func:`~admission.sql._fused.own_transaction`), else ``None``."""
        if connection is not None:
            # The caller owns the transaction: neither commit nor roll back.
            with self._translate():
                join_transaction(connection)
                yield take(connection, None)
            return
        with self._translate(), self._kept.transaction(self.engine, self._write_engine) as conn:
            if not self._pipeline:
                yield take(conn, None)
                return
            with own_transaction(conn) as begin:
                yield take(conn, begin)

    def locked(
        self,
        namespace: str,
        workflow_id: str,
        *,
        created_at: datetime,
        new_id: str,
        connection: object | None = None,
    ) -> AbstractContextManager[LockedInstance]:
        """Open a transaction holding the admission lock of one instance (contract §4).

        ``connection`` is the caller's transaction, in any form
        :func:`~admission.sql._caller.caller_connection` takes (a ``Connection``,
        a ``Session``, and through the async service an ``AsyncConnection`` or
        ``AsyncSession``): the lock is taken inside it, and it is neither
        committed nor rolled back here.
        """
        joined = None if connection is None else caller_connection(self.engine, connection)
        return self._held(
            joined,
            lambda conn, begin: self._lock(conn, namespace, workflow_id, created_at, new_id, begin),
        )

    def locked_many(
        self,
        keys: Sequence[tuple[str, str]],
        *,
        created_at: datetime,
        new_ids: Sequence[str],
        connection: object | None = None,
    ) -> AbstractContextManager[Mapping[tuple[str, str], LockedInstance]]:
        """One transaction holding several instances' locks (:meth:`Store.locked_many`)."""
        joined = None if connection is None else caller_connection(self.engine, connection)
        # In key order, so no two batches wait on each other in a cycle (on SQLite
        # BEGIN IMMEDIATE already holds the write lock, and the rest only read).
        ordered = sorted(dict(zip(keys, new_ids, strict=True)).items())
        return self._held(joined, lambda conn, begin: self._lock_many(conn, ordered, created_at, begin))

    def read_receipts(
        self, namespace: str, workflow_id: str, command_type: str, request_ids: Sequence[str]
    ) -> list[tuple[CommandRow, UpdateRow | None]]:
        """Committed commands by ``request_id`` values with their updates, in one read, no lock."""
        values = key_values(request_ids, self.postgres)
        if values is None:
            return []
        token, raw = values
        params = dict(
            namespace=namespace, workflow_id=workflow_id, command_type=command_type, token=token, raw=raw
        )
        found: list[tuple[CommandRow, UpdateRow | None]] | None
        if self.replica is not None:
            found = self.replica.read(command_type, params)
            if found is not None:
                return receipt_order(found) if len(found) > 1 else found
        with self._translate():
            found = self._kept.read(
                self.engine,
                lambda connection, cursor: self._receipts_on(connection, cursor, command_type, params),
            )
        return receipt_order(found) if len(found) > 1 else found

    def _receipts_on(
        self, connection: Any, cursor: Any, command_type: str, params: Mapping[str, Any]
    ) -> list[tuple[CommandRow, UpdateRow | None]]:
        found: list[tuple[CommandRow, UpdateRow | None]]
        if command_type == "signal":
            statement = self._raw.signal_receipts
            if self._wired_reads and connection.autocommit and wire_ready(connection):
                signals = read_tuples(connection, statement, params)
            else:
                signals = statement.tuples(cursor, params)
            found = [(command_of_columns(r), None) for r in signals]
        else:
            found = receipt_pairs(self._raw.receipts.rows(cursor, params), True)
        if found and not self.postgres:
            # Never answer a retry from a file a restart will not open (docs/guide.md).
            verify_file(connection)
        return found
