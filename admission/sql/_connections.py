"""The connections a SQL store keeps: per-thread readers and a few kept writers.

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

__all__ = ["REPLAN_AFTER", "USES", "WRITE_CONNECTIONS", "Readers", "Writers", "replan_due"]


WRITE_CONNECTIONS: Final = 8
"""Write connections a store keeps for its own locked transactions, per process (see :class:`Writers`)."""

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
            if not replan_due(held[3]):
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
        if is_postgresql(self._engine.dialect):
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
