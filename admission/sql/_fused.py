"""PostgreSQL's admission in few round trips: the transaction's statements sent together.

A fresh admission on PostgreSQL is, under the lock, ``BEGIN``, the lock,
the instance lookup, the command's insert, its update's insert (for an
update), its event's insert and ``COMMIT``.  Sent one at a time they cost a
round trip each; here they go in two exchanges of libpq's pipeline mode (sent
through :mod:`~admission.sql._wire`, or psycopg's pipeline object behind a
transaction pooler, where nothing may be prepared by name):

1. ``BEGIN``, the lock and the lookup (:func:`lock_rows`); for a keyed
   command, the lock taken only while no receipt holds the key, and the key's
   receipts after the lookup (:mod:`~admission.sql._keyed`).  The server runs
   them in order, so the lookup, a new statement under READ COMMITTED, starts
   only once the lock is granted and sees every commit made before.
2. One statement that inserts the command, its update and its event
   (:data:`FUSED_ADMISSION`: data-modifying CTEs, the update and the event
   inserted only if the command was, so a key already taken writes nothing),
   then ``COMMIT`` when the transaction is the store's own and the admission
   is its last write (:func:`write_rows`).

A batch (``admit_many``) takes the same path in three exchanges: ``BEGIN``
and all its instances' locks (:class:`ManyLocks`: the missing instances
created in lock order, every lock in lock order, then every instance read);
the lookup of all its keys; then all its rows in one statement
(:data:`BATCH_ROWS`) with ``COMMIT``.  A key found taken there (a write
outside the locks) fails that statement, so the ``COMMIT`` never runs.

Why it is safe: the pipeline's statements up to its sync are one unit for
the server.  If the fused statement fails, the server skips everything after
it until the sync, the ``COMMIT`` too, and the transaction, begun
explicitly, stays open in error until it is rolled back
(:func:`own_transaction`): nothing of it is committed
(``tests/integration/test_fused_admission.py``).  A caller's transaction is
never committed here: only the store's own takes ``COMMIT`` in the pipeline.

To send ``BEGIN`` in the pipeline instead of psycopg sending it alone (and
waiting for its answer) before the first statement, the store's own
transaction runs with the driver connection in autocommit and begins
explicitly; the commit, or else :func:`own_transaction`, puts the connection
back out of autocommit before it is given back, so nothing else ever sees it
so.  Behind a transaction pooler this is the same transaction:
``BEGIN`` to ``COMMIT``, nothing kept in the session.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from datetime import datetime
from typing import Any, Final

from sqlalchemy import Dialect, Insert, Select, String, and_, bindparam, cast, func, insert, null, select
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import Connection

from admission.receipts._store import CommandRow, EventRow, UpdateRow
from admission.sql._engine import is_unique_violation
from admission.sql._event_rows import STORED_EVENT_KEYS, event_values
from admission.sql._greenlet import wait
from admission.sql._raw import RawStatement
from admission.sql._receipt_queries import COMMAND_FIELDS, INSTANCE_COLUMNS, REQUEST_INDEX, TEXTS
from admission.sql._schema import (
    workflow_commands,
    workflow_history_events,
    workflow_instances,
    workflow_runs,
    workflow_updates,
)
from admission.sql._wire import Step, exchange, exchange_async, wire_ready

__all__ = [
    "BATCH_ROWS",
    "FUSED_ADMISSION",
    "FusedStatements",
    "ManyLocks",
    "lock_rows",
    "own_transaction",
    "write_rows",
]

_IDLE: Final = 0  # psycopg.pq.TransactionStatus.IDLE: no transaction open
REQUEST_LOOKUP: Final = next(
    str(index.name)
    for index in workflow_commands.indexes
    if index.unique and tuple(c.name for c in index.columns) == REQUEST_INDEX
)
"""The unique receipt index's name (the backstop of the admission lock: contract §2.6, §4)."""


def _fused(with_update: bool) -> Select[Any]:
    """The fused admission: command (``c_`` parameters), update (``u_``) if ``with_update``, event (``e_``).

    Values selected from the command's CTE are cast to their column's type: a
    parameter in a select list has no type of its own (a ``NULL`` would be text).
    Text is cast without its length, which would cut a longer value short: the
    column refuses it, as it refuses it from a plain insert.
    """
    command = (
        postgresql.insert(workflow_commands)
        .values(
            {name: bindparam(f"c_{name}", type_=workflow_commands.c[name].type) for name in COMMAND_FIELDS}
        )
        .on_conflict_do_nothing(index_elements=list(REQUEST_INDEX))
        .returning(workflow_commands.c.id)
        .cte("c")
    )

    def typed(table: Any, prefix: str, name: str) -> Any:
        column_type = table.c[name].type
        target = String() if isinstance(column_type, String) else column_type
        return cast(bindparam(f"{prefix}{name}", type_=column_type), target)

    events = workflow_history_events
    logged = select(*(typed(events, "e_", name) for name in STORED_EVENT_KEYS), func.txid_current())
    event = (
        insert(events)
        .from_select([*STORED_EVENT_KEYS, "tx_id"], logged.select_from(command))
        .returning(events.c.position, events.c.tx_id)
        .cte("e")
    )
    fused = select(event.c.position, event.c.tx_id)
    if with_update:
        names = [c.name for c in workflow_updates.c]
        update = (
            insert(workflow_updates)
            .from_select(
                names, select(*(typed(workflow_updates, "u_", n) for n in names)).select_from(command)
            )
            .cte("u")
        )
        # Not referenced by the select: a data-modifying CTE runs all the same.
        fused = fused.add_cte(update)
    return fused


FUSED_ADMISSION: Final = {False: _fused(False), True: _fused(True)}
"""The fused admission without and with an update row (see the module docstring)."""


def _column_arrays(table: Any, names: Sequence[str], prefix: str, alias: str) -> Any:
    """The rows of one array parameter per column (``prefix`` + name + "s"), numbered ``n`` in order.

    Each array is cast to its column's type, text without its length (a cast to
    ``VARCHAR(n)`` would cut a longer value short; the column refuses it instead).
    """

    def array_of(name: str) -> Any:
        column_type = table.c[name].type
        return postgresql.ARRAY(String() if isinstance(column_type, String) else column_type)

    arrays = (bindparam(f"{prefix}{name}s", type_=array_of(name)) for name in names)
    return func.unnest(*arrays).table_valued(*names, with_ordinality="n").render_derived(name=alias)


def _batch_rows(with_updates: bool) -> Insert:
    """A batch's fresh admissions in one statement: every command (``c_<column>s`` arrays), every
    update (``u_``) if ``with_updates``, every event (``e_``); it returns no rows.

    Rows go in in their arrays' order (event positions as row-by-row inserts would
    give them).  A command whose key the receipt index already holds fails the
    whole statement (no ``ON CONFLICT``): nothing after it in its pipeline runs,
    a ``COMMIT`` sent with it included, and the batch rolls back
    (:meth:`FusedStatements.insert_many`).  The updates' foreign key to their
    command is checked at the statement's end, when every command is in.
    """

    def rows_of(table: Any, names: Sequence[str], prefix: str, alias: str) -> Any:
        given = _column_arrays(table, names, prefix, alias)
        return select(*(given.c[n] for n in names)).order_by(given.c.n)

    events = workflow_history_events
    logged = rows_of(events, STORED_EVENT_KEYS, "e_", "ke").add_columns(func.txid_current())
    many = (
        insert(workflow_commands)
        .from_select(list(COMMAND_FIELDS), rows_of(workflow_commands, COMMAND_FIELDS, "c_", "kc"))
        .add_cte(insert(events).from_select([*STORED_EVENT_KEYS, "tx_id"], logged).cte("e"))
    )
    if with_updates:
        names = [c.name for c in workflow_updates.c]
        accepted = rows_of(workflow_updates, names, "u_", "ku")
        many = many.add_cte(insert(workflow_updates).from_select(names, accepted).cte("u"))
    return many


BATCH_ROWS: Final = {False: _batch_rows(False), True: _batch_rows(True)}
"""A batch's fresh admissions in one statement, without and with update rows."""


class FusedStatements:
    """:data:`FUSED_ADMISSION` compiled for one PostgreSQL dialect."""

    def __init__(self, dialect: Dialect) -> None:
        self.signal = RawStatement(FUSED_ADMISSION[False], dialect)
        self.update = RawStatement(FUSED_ADMISSION[True], dialect)
        self.many = {
            with_updates: RawStatement(statement, dialect, binary=True)
            for with_updates, statement in BATCH_ROWS.items()
        }

    def insert_many(
        self,
        dbapi: Any,
        cursor: Any,
        admitted: Sequence[tuple[CommandRow, UpdateRow | None, EventRow]],
        commit: bool,
        is_async: bool,
    ) -> bool:
        """Insert a batch's fresh commands, updates and events (:data:`BATCH_ROWS`), and with
        ``commit`` commit in the same round trip (:func:`write_rows`); ``False``, nothing
        committed and the transaction failed, if the receipt index held a command's key
        (see :meth:`~admission.receipts.LockedInstance.insert_admitted_many`)."""
        params: dict[str, list[Any]] = {f"c_{name}s": [] for name in COMMAND_FIELDS}
        params.update((f"e_{name}s", []) for name in STORED_EVENT_KEYS)
        columns = [params[f"c_{name}s"] for name in COMMAND_FIELDS]
        logged = [params[f"e_{name}s"] for name in STORED_EVENT_KEYS]
        updates = []
        for command, update, event in admitted:
            for column, value in zip(columns, vars(command).values(), strict=True):
                column.append(value)
            for column, value in zip(logged, event_values(event, command).values(), strict=True):
                column.append(value)
            if update is not None:
                updates.append(vars(update))
        if updates:
            params.update((f"u_{name}s", [u[name] for u in updates]) for name in updates[0])
        try:
            statement = self.many[bool(updates)]
            write_rows(dbapi, cursor, statement, params, commit=commit, is_async=is_async)
        except Exception as error:
            # A key taken by a write outside the locks.
            if is_unique_violation(error, REQUEST_LOOKUP):
                return False
            raise
        return True

    def insert(
        self,
        dbapi: Any,
        cursor: Any,
        rows: tuple[CommandRow, UpdateRow | None, EventRow],
        commit: bool,
        is_async: bool,
    ) -> bool:
        """Insert a fresh command, its update and its event (``rows``), and with ``commit`` commit
        in the same round trip (:func:`write_rows`); ``False``, nothing inserted, if the unique
        receipt index already holds the command's key."""
        command, update, event = rows
        params = {f"c_{name}": value for name, value in vars(command).items()}
        # The event's position and tx_id are the database's.
        params.update((f"e_{name}", value) for name, value in event_values(event, command).items())
        statement = self.signal
        if update is not None:
            params.update((f"u_{name}", value) for name, value in vars(update).items())
            statement = self.update
        return bool(write_rows(dbapi, cursor, statement, params, commit=commit, is_async=is_async))


def _begin_statement(driver: Any) -> str:
    """The ``BEGIN`` psycopg would send for ``driver``'s settings (an engine's ``isolation_level``)."""
    parts = ["BEGIN"]
    if driver.isolation_level is not None:
        from psycopg import IsolationLevel  # only psycopg's connections come here

        parts.append("ISOLATION LEVEL " + IsolationLevel(driver.isolation_level).name.replace("_", " "))
    if driver.read_only is not None:
        parts.append("READ ONLY" if driver.read_only else "READ WRITE")
    if driver.deferrable is not None:
        parts.append("DEFERRABLE" if driver.deferrable else "NOT DEFERRABLE")
    return " ".join(parts)


@contextmanager
def own_transaction(connection: Connection) -> Iterator[str]:
    """The store's own transaction on ``connection``, begun by the caller with the statement yielded.

    The first thing sent must be that ``BEGIN``, in the lock's pipeline, with
    the driver connection in autocommit (:func:`lock_rows` puts it so, in the
    same await on the async path).  The block's end commits (nothing is sent
    if :func:`write_rows` committed already) or, on an exception, rolls back;
    the connection is then out of autocommit again, before SQLAlchemy's own
    commit or rollback (which then has nothing to do) and before the
    connection is given back.
    """
    dbapi: Any = connection.connection.dbapi_connection
    driver: Any = connection.connection.driver_connection
    try:
        yield _begin_statement(driver)
        if driver.info.transaction_status != _IDLE:
            dbapi.commit()
    except BaseException:
        if driver.info.transaction_status != _IDLE:
            with suppress(Exception):  # the error raised is the one to report
                dbapi.rollback()
        raise
    finally:
        if driver.autocommit:
            # Fails only on a broken connection, which is then thrown away.
            with suppress(Exception):
                dbapi.autocommit = False


async def _lock_async(
    driver: Any, begin: str | None, statements: Sequence[RawStatement], params: Mapping[str, Any]
) -> list[list[dict[str, Any]]]:
    if begin is not None and not driver.autocommit:
        await driver.set_autocommit(True)
    if begin is not None and wire_ready(driver):
        steps: list[Step] = [begin.encode(), *((statement, params) for statement in statements)]
        return (await exchange_async(driver, steps, restartable=True))[1:]
    cursors = [driver.cursor() for _ in statements]
    async with driver.pipeline():
        if begin is not None:
            await driver.cursor().execute(begin, prepare=False)
        for statement, cursor in zip(statements, cursors, strict=True):
            await cursor.execute(statement.sql, statement.parameters(params))
    return [
        statement.as_rows(cursor.description, await cursor.fetchall())
        for statement, cursor in zip(statements, cursors, strict=True)
    ]


def lock_rows(
    dbapi: Any,
    cursor: Any,
    statements: Sequence[RawStatement],
    params: Mapping[str, Any],
    *,
    begin: str | None,
    is_async: bool,
) -> list[list[dict[str, Any]]]:
    """``begin`` (when given: the driver connection is put in autocommit first), the lock and what
    follows it (``statements``: the instance lookup, and the key's receipts for
    :meth:`~admission.sql.SqlStore.locked_unless_retained`) in one round trip; each statement's
    rows, in order.  The lock returns no row when the instance does not exist yet."""
    if is_async:
        # The connection is this transaction's alone: its statements are
        # awaited here as the adapter would await them.
        return wait(_lock_async(dbapi.driver_connection, begin, statements, params))
    if begin is not None and not dbapi.autocommit:
        dbapi.autocommit = True
    if begin is not None and wire_ready(dbapi):
        steps: list[Step] = [begin.encode(), *((statement, params) for statement in statements)]
        return exchange(dbapi, steps, restartable=True)[1:]
    cursors = [cursor, *(dbapi.cursor() for _ in statements[1:])]
    with dbapi.pipeline():
        if begin is not None:
            dbapi.cursor().execute(begin, prepare=False)
        for statement, each in zip(statements, cursors, strict=True):
            each.execute(statement.sql, statement.parameters(params))
    return [statement.fetched(each) for statement, each in zip(statements, cursors, strict=True)]


def _numbered(*names: str) -> Any:
    """The rows of text array parameters named ``names`` + "s", numbered ``n`` in their order."""
    arrays = (bindparam(f"{name}s", type_=TEXTS) for name in names)
    return func.unnest(*arrays).table_valued(*names, with_ordinality="n").render_derived(name="k")


_NEW = _numbered("id", "namespace", "workflow_id")
_HELD = _numbered("namespace", "workflow_id")
_IS_HELD = and_(
    workflow_instances.c.namespace == _HELD.c.namespace,
    workflow_instances.c.workflow_id == _HELD.c.workflow_id,
)
CREATE_INSTANCES: Final = (
    postgresql.insert(workflow_instances)
    .from_select(
        ["id", "namespace", "workflow_id", "current_run_id", "created_at"],
        select(
            _NEW.c.id,
            _NEW.c.namespace,
            _NEW.c.workflow_id,
            null(),
            bindparam("created_at", type_=workflow_instances.c.created_at.type),
        ).order_by(_NEW.c.n),
    )
    .on_conflict_do_nothing(index_elements=["namespace", "workflow_id"])
)
"""A batch's instances that do not exist yet, inserted in lock order (``ids``, ``namespaces``,
``workflow_ids``: one element per instance, ``created_at`` for all)."""
LOCK_INSTANCES: Final = (
    select(workflow_instances.c.id)
    .join(_HELD, _IS_HELD)
    .order_by(_HELD.c.n)
    .with_for_update(of=workflow_instances)
)
"""A batch's instances locked in lock order: the rows are sorted first, then locked one by one."""
INSTANCES_LOOKUP: Final = select(*INSTANCE_COLUMNS).select_from(
    workflow_instances.join(_HELD, _IS_HELD).outerjoin(
        workflow_runs, workflow_runs.c.id == workflow_instances.c.current_run_id
    )
)
"""What the lock reads of each of a batch's instances, after the lock (as :data:`LOCK_POSTGRES`)."""


async def _lock_many_async(
    driver: Any, begin: str | None, statements: Sequence[RawStatement], params: Mapping[str, Any]
) -> list[dict[str, Any]]:
    *writes, lookup = statements
    if begin is not None and not driver.autocommit:
        await driver.set_autocommit(True)
    cursor = driver.cursor()
    async with driver.pipeline():
        if begin is not None:
            await driver.cursor().execute(begin, prepare=False)
        for statement in writes:
            await driver.cursor().execute(statement.sql, statement.parameters(params))
        await cursor.execute(lookup.sql, lookup.parameters(params))
    return lookup.as_rows(cursor.description, await cursor.fetchall())


class ManyLocks:
    """PostgreSQL: a batch's instances created if missing, locked and read in one round trip."""

    def __init__(self, dialect: Dialect) -> None:
        self._statements = tuple(
            RawStatement(statement, dialect, binary=True)
            for statement in (CREATE_INSTANCES, LOCK_INSTANCES, INSTANCES_LOOKUP)
        )

    def rows(
        self,
        dbapi: Any,
        keys: Sequence[tuple[tuple[str, str], str]],
        created_at: datetime,
        *,
        begin: str | None,
        is_async: bool,
    ) -> dict[tuple[str, str], dict[str, Any]]:
        """For each ((namespace, workflow_id), new id) of ``keys``, in their order (the lock
        order), in the connection's transaction: the instance's row inserted with the new id
        unless it exists, then every lock, then every instance read; each one's row, by key.
        ``begin`` (when given: the driver connection is put in autocommit first) goes first, in
        the same round trip, as in :func:`lock_rows`.

        Rows are created in lock order before any lock is taken, so a batch never
        holds an instance's lock while it waits to create another.  The read is a
        statement of its own after the locks: under READ COMMITTED it sees every
        commit made before its locks were granted (as :data:`LOCK_POSTGRES`).
        Instances are never deleted, so every key has its row.
        """
        params = {
            "ids": [new_id for _, new_id in keys],
            "namespaces": [namespace for (namespace, _), _ in keys],
            "workflow_ids": [workflow_id for (_, workflow_id), _ in keys],
            "created_at": created_at,
        }
        if is_async:
            found = wait(_lock_many_async(dbapi.driver_connection, begin, self._statements, params))
        else:
            *writes, lookup = self._statements
            if begin is not None and not dbapi.autocommit:
                dbapi.autocommit = True
            cursor = dbapi.cursor()
            with dbapi.pipeline():
                if begin is not None:
                    dbapi.cursor().execute(begin, prepare=False)
                for statement in writes:
                    dbapi.cursor().execute(statement.sql, statement.parameters(params))
                cursor.execute(lookup.sql, lookup.parameters(params))
            found = lookup.fetched(cursor)
        return {(row["namespace"], row["workflow_id"]): row for row in found}


async def _write_async(
    driver: Any, statement: RawStatement, params: Mapping[str, Any]
) -> list[dict[str, Any]]:
    if wire_ready(driver):
        rows, _ = await exchange_async(driver, [(statement, params), b"COMMIT"])
        await driver.set_autocommit(False)  # in this await, not one more (own_transaction)
        return rows
    cursor = driver.cursor()
    async with driver.pipeline():
        await cursor.execute(statement.sql, statement.parameters(params))
        await driver.cursor().execute("COMMIT", prepare=False)
    await driver.set_autocommit(False)  # in this await, not one more (own_transaction)
    if cursor.description is None:  # a statement that returns no rows (BATCH_ROWS)
        return []
    return statement.as_rows(cursor.description, await cursor.fetchall())


def write_rows(
    dbapi: Any,
    cursor: Any,
    statement: RawStatement,
    params: Mapping[str, Any],
    *,
    commit: bool,
    is_async: bool,
) -> list[dict[str, Any]]:
    """Run ``statement`` and, with ``commit``, ``COMMIT`` in the same round trip; its rows.

    An error in the statement raises, and the ``COMMIT`` is not run: the
    server skips the rest of a pipeline after an error.  After the commit the
    connection is out of autocommit: a statement after it (a lost race's read
    of the stored receipt) runs in a transaction of its own, which the
    block of :func:`own_transaction` commits.
    """
    if not commit:
        return statement.rows(cursor, params)
    if is_async:
        return wait(_write_async(dbapi.driver_connection, statement, params))
    if wire_ready(dbapi):
        rows, _ = exchange(dbapi, [(statement, params), b"COMMIT"])
        dbapi.autocommit = False
        return rows
    with dbapi.pipeline():
        cursor.execute(statement.sql, statement.parameters(params))
        dbapi.cursor().execute("COMMIT", prepare=False)
    dbapi.autocommit = False
    return statement.fetched(cursor)
