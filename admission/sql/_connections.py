"""The connections a SQL store keeps: per-thread (or lent) readers and a few kept writers.

Checking a connection out of the engine's pool and back in costs more than
the statements of an admission on SQLite, and a pooled read costs an extra
round trip on PostgreSQL; these keep connections made by the pool (so its
connect-time configuration applies) and detached from it.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any, Final

from sqlalchemy import Engine
from sqlalchemy.engine import Connection

from admission.errors import AdmissionError
from admission.sql._engine import is_postgresql
from admission.sql._pooler import pooler_of

__all__ = [
    "READ_CONNECTIONS",
    "REPLAN_AFTER",
    "USES",
    "WRITE_CONNECTIONS",
    "LendingReaders",
    "Readers",
    "Writers",
    "replan_due",
]


WRITE_CONNECTIONS: Final = 8
"""Write connections a store keeps for its own locked transactions, per process (see :class:`Writers`)."""

READ_CONNECTIONS: Final = 8
"""Read connections a store over an asyncio engine keeps for the unlocked receipt read
(see :class:`LendingReaders`)."""

REPLAN_AFTER: Final = (100, 1_000, 10_000)
"""Uses of a connection after which its statements are planned anew (then every 10,000).

psycopg prepares a statement on the server after a few executions, and
PostgreSQL keeps the generic plan it made then: a plan made while the tables
were nearly empty (a new database) scans ``workflow_commands`` whole, and
costs more with every command stored (1.6 ms against 0.13 ms after 3,000
admissions).  Planning again for the tables as they are makes it a point
probe for good.  The receipt-read connection is replaced; a write connection
drops its prepared statements (``DEALLOCATE ALL``, which psycopg follows).
Behind a transaction pooler nothing is prepared (``admission/sql/_pooler.py``):
neither is done.
"""

USES: Final = "admission_uses"
"""The key of a connection's ``info`` that counts its uses (see :data:`REPLAN_AFTER`)."""


def replan_due(uses: int) -> bool:
    """Whether a connection's statements are due to be planned again after ``uses`` uses."""
    return uses in REPLAN_AFTER or uses % REPLAN_AFTER[-1] == 0


class Readers:
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
        self._replan = pooler_of(engine) is None  # see REPLAN_AFTER
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
            if not (self._replan and replan_due(held[3])):
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
        return _autocommit(self._engine)

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


class LendingReaders:
    """Autocommit driver connections lent to one unlocked receipt read at a time, for a store
    over an asyncio engine.

    :class:`Readers` keeps one connection per thread; on an event loop every
    task runs on the loop's thread, so two reads awaiting at once would share
    one connection and one cursor.  Here up to ``limit`` connections, made by
    the pool (so its connect-time configuration applies) and detached from
    it, are kept in a free list, and each read borrows one for its statement
    only; when all are lent, a read takes a pooled connection, as
    :class:`Writers` does.  The mutex guards the list only: it is never held
    while a statement is awaited.  A connection whose read raised anything
    (a driver error, a cancelled task) is closed; a forked process makes its
    own and never uses or closes its parent's.
    """

    def __init__(self, engine: Engine, limit: int) -> None:
        self._engine = engine
        self._limit = limit
        self._replan = pooler_of(engine) is None  # see REPLAN_AFTER
        self._mutex = threading.Lock()
        self._pid = os.getpid()
        # [connection, cursor, uses]
        self._free: list[list[Any]] = []
        self._kept = 0
        # Connections inherited through fork: kept referenced so that
        # collecting them never closes the parent's session.
        self._inherited: list[list[Any]] = []

    def _take(self) -> list[Any] | None:
        with self._mutex:
            if self._pid != os.getpid():
                self._inherited.extend(self._free)
                self._free, self._kept, self._pid = [], 0, os.getpid()
            if self._free:
                return self._free.pop()
            if self._kept >= self._limit:
                return None
            self._kept += 1
        try:
            connection = _autocommit(self._engine)
        except BaseException:
            with self._mutex:
                self._kept -= 1
            raise
        return [connection, connection.cursor(), 0]

    def _drop(self, held: list[Any]) -> None:
        with self._mutex:
            mine = self._pid == os.getpid()
            if mine:
                self._kept -= 1
        if mine:
            with suppress(Exception):  # best effort: it may be the broken one
                held[0].close()

    @contextmanager
    def lend(self) -> Iterator[tuple[Any, Any]]:
        """A driver connection and its cursor for one read (a pooled one when all are lent)."""
        held = self._take()
        if held is None:
            proxy = self._engine.raw_connection()
            try:
                yield proxy.dbapi_connection, proxy.cursor()
            finally:
                proxy.close()  # back to the pool, which rolls back what the read began
            return
        held[2] += 1
        if self._replan and replan_due(held[2]):
            # Replaced, so that its statements are planned again (REPLAN_AFTER).
            uses = held[2]
            self._drop(held)
            with self._mutex:
                self._kept += 1
            try:
                connection = _autocommit(self._engine)
            except BaseException:
                with self._mutex:
                    self._kept -= 1
                raise
            held = [connection, connection.cursor(), uses]
        try:
            yield held[0], held[1]
        except BaseException:
            self._drop(held)
            raise
        with self._mutex:
            if self._pid == os.getpid():
                self._free.append(held)
            else:
                self._inherited.append(held)  # forked while it was lent: the parent's, never closed here

    def close(self) -> None:
        """Close this process's free connections; lent ones are closed if their read fails."""
        with self._mutex:
            if self._pid != os.getpid():
                return
            free, self._free = self._free, []
            self._kept -= len(free)
        for connection, _, _ in free:
            with suppress(Exception):
                connection.close()


def _autocommit(engine: Engine) -> Any:
    # A connection made by the engine's pool, so that its connect-time
    # configuration (SQLite pragmas, connect_args) applies, then detached
    # from the pool for good.
    proxy = engine.raw_connection()
    proxy.detach()
    connection: Any = proxy.dbapi_connection
    if is_postgresql(engine.dialect):
        connection.rollback()
        connection.autocommit = True
    # SQLite: the engine's connections already have isolation_level=None,
    # so each SELECT is its own WAL read, without an explicit transaction.
    return connection


class Writers:
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
