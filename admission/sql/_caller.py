"""The caller's transaction, in the forms engines hold it: the one place that finds its Connection.

A caller that owns the transaction passes ``connection=`` (docs/guide.md,
section 6): a SQLAlchemy ``Connection`` in a transaction, an ORM ``Session``,
or, through :class:`admission.aio.AsyncAdmissionService`, an
``AsyncConnection`` or ``AsyncSession``.  :func:`caller_connection` turns
each into the ``Connection`` of its transaction and checks that it reaches
the store's database; :func:`join_transaction` then makes sure, on SQLite,
that the transaction holds the database's write lock before admission's
first read.  Nothing here commits or rolls back: the transaction stays the
caller's.
"""

from __future__ import annotations

import os
from typing import Any, Final

from sqlalchemy import Engine
from sqlalchemy.engine import URL, Connection
from sqlalchemy.exc import InvalidRequestError
from sqlalchemy.util.concurrency import in_greenlet

from admission.errors import InputError
from admission.sql._engine import WRITE_OPTION, is_postgresql, schema_of

__all__ = ["caller_connection", "join_transaction"]

FIELD: Final = "connection"

# A write that changes nothing but takes SQLite's write lock, as BEGIN IMMEDIATE would: a
# transaction that has read nothing yet waits for the lock under the busy timeout; one that
# read first and was overtaken by another writer is refused as busy, never answered wrongly.
_TAKE_WRITE_LOCK: Final = "UPDATE workflow_instances SET id = id WHERE 0"

_AUTOCOMMIT: Final = "the caller's connection is in autocommit: there is no transaction to join"
_FORMS: Final = "a SQLAlchemy Connection in a transaction, a Session, an AsyncConnection or an AsyncSession"


def caller_connection(engine: Engine, handle: object) -> Connection:
    """The ``Connection`` of the caller's transaction that ``handle`` holds, checked against ``engine``.

    A ``Connection`` is used as it is and must be in a transaction; a
    ``Session`` gives ``session.connection()``, which joins its transaction
    (beginning it, as any query would, if none is open yet); an
    ``AsyncConnection`` gives its ``sync_connection`` and an ``AsyncSession``
    its ``sync_session``'s connection.  The connection must reach the
    database of ``engine`` (the same engine, or one with the same backend,
    parameter style, host, port, database and schema: a driver or its asyncio
    twin, any user and password; a multi-host URL's servers in any order, in
    SQLAlchemy's form or libpq's).  Anything else, an async form outside the async service, or a
    transaction in autocommit raises :class:`~admission.errors.InputError`
    with ``field`` ``connection``, before anything is written.
    """
    if isinstance(handle, Connection):
        connection = handle
        if connection.engine is not engine:
            _check_database(engine, connection.engine, "connection")
    else:
        connection = _connection_of(engine, handle)
    if not connection.in_transaction():
        raise InputError(
            "the caller's connection must be in a transaction (use SqlStore.begin() or a Session)",
            field=FIELD,
        )
    if connection.get_execution_options().get("isolation_level") == "AUTOCOMMIT":
        raise InputError(_AUTOCOMMIT, field=FIELD)
    return connection


def join_transaction(connection: Connection) -> None:
    """Make the caller's transaction ready for admission's lock (call it inside the error boundary).

    The admission lock on SQLite is the database's write lock (contract §4):
    admission's own transactions, :meth:`SqlStore.begin` and
    :attr:`SqlStore.write_engine` take it with ``BEGIN IMMEDIATE``.  A
    transaction begun another way (a ``Session`` on the store's engine, a
    plain ``engine.begin()``) is deferred, so a no-op write takes the lock
    here, before admission's first read.  On PostgreSQL the lock is a row
    lock that the statements take themselves; a driver connection in
    autocommit would release it after each one, so it is refused.
    """
    dbapi: Any = connection.connection.dbapi_connection
    if is_postgresql(connection.dialect):
        if getattr(dbapi, "autocommit", False):
            raise InputError(_AUTOCOMMIT, field=FIELD)
        return
    if connection.get_execution_options().get(WRITE_OPTION):
        return
    connection.exec_driver_sql(_TAKE_WRITE_LOCK)
    if not getattr(dbapi, "in_transaction", True):
        # The driver ran the statement on its own: there is no transaction to join.
        raise InputError(_AUTOCOMMIT, field=FIELD)


def _connection_of(engine: Engine, handle: object) -> Connection:
    from sqlalchemy.orm import Session

    if isinstance(handle, Session):
        return _session_connection(engine, handle, "Session")
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

    if isinstance(handle, AsyncSession | AsyncConnection):
        if not in_greenlet():
            raise InputError(
                f"an {type(handle).__name__} is awaited: pass it to admission.aio.AsyncAdmissionService",
                field=FIELD,
            )
        if isinstance(handle, AsyncSession):
            return _session_connection(engine, handle.sync_session, "AsyncSession")
        connection = handle.sync_connection
        if connection is None:
            raise InputError("the AsyncConnection is not started (`async with engine.begin()`)", field=FIELD)
        if connection.engine is not engine:
            _check_database(engine, connection.engine, "AsyncConnection")
        return connection
    raise InputError(f"expected {_FORMS}, not {type(handle).__name__}", field=FIELD)


def _session_connection(engine: Engine, session: Any, form: str) -> Connection:
    try:
        bind = session.get_bind()
    except InvalidRequestError as exc:
        raise InputError(f"the {form} has no bind: give it the store's engine", field=FIELD) from exc
    bound: Engine = bind.engine
    if bound is not engine:
        _check_database(engine, bound, form)
    try:
        connection: Connection = session.connection()
    except InvalidRequestError as exc:
        # Autobegin disabled with no transaction begun, or a transaction that
        # failed and waits for the caller's rollback.
        raise InputError(f"the {form} cannot join a transaction: {exc}", field=FIELD) from exc
    return connection


def _check_database(engine: Engine, other: Engine, form: str) -> None:
    if not _same_database(engine, other):
        raise InputError(
            f"the {form} reaches another database than the store's: "
            "admission writes only where its store reads",
            field=FIELD,
        )


def _same_database(engine: Engine, other: Engine) -> bool:
    mine, theirs = engine.dialect, other.dialect
    if mine is theirs and engine.url is other.url:
        # The same engine under other execution options (``SqlStore.begin()``'s).
        return schema_of(engine) == schema_of(other)
    # A driver and its asyncio twin (pysqlite and aiosqlite, psycopg and its async connection)
    # reach the same database and take the store's statements in the same parameter style.
    if (mine.name, mine.paramstyle) != (theirs.name, theirs.paramstyle):
        return False
    if schema_of(engine) != schema_of(other):
        return False
    return _place(engine.url, is_postgresql(mine)) == _place(other.url, is_postgresql(theirs))


def _place(url: URL, server: bool) -> tuple[object, ...]:
    """Where ``url`` leads: the user and the password choose who connects, not where."""
    if server:
        rest = sorted((key, value) for key, value in url.query.items() if key not in ("host", "port"))
        return (_servers(url), url.database, rest)
    return (os.path.realpath(url.database) if url.database else None,)


def _servers(url: URL) -> frozenset[tuple[str | None, int | None]]:
    """The servers ``url`` names, as ``(host, port)``: one, or a multi-host URL's list in either form,
    SQLAlchemy's (``host=a:1&host=b:2``) or libpq's (``host=a,b&port=1,2``).  The list's order is
    only the order they are tried in, so a set: the same cluster named in another order or form."""
    hosts = url.query.get("host")
    if hosts is None:
        return frozenset({(url.host, url.port)})
    ports = url.query.get("port")
    port_list = ports.split(",") if isinstance(ports, str) else list(ports or ())
    if isinstance(hosts, str) and (port_list or "," in hosts or ":" not in hosts):
        names = hosts.split(",")
        if len(port_list) == 1:  # libpq: one port for every host
            port_list *= len(names)
        pairs = [(name, port_list[i] if i < len(port_list) else None) for i, name in enumerate(names)]
    else:  # SQLAlchemy's form: ``host:port`` tokens, one string when there is only one
        tokens = [hosts] if isinstance(hosts, str) else hosts
        pairs = [(host, port or None) for host, _, port in (token.partition(":") for token in tokens)]
    default = url.port
    return frozenset(
        (host or None, int(port) if port and port.isdigit() else default) for host, port in pairs
    )
