"""The connections a SQL store keeps, inside its connection budget.

The budget: every connection a store holds in a process is checked out of
its engine's pool, whose bound (``pool_size`` plus ``max_overflow``; for an
engine admission makes, ``connections=N`` or ``?admission_connections=N``
gives ``N`` and no overflow) is therefore the most the store ever holds,
kept and pooled together.  A user-made engine keeps its own pool's bound.

Kept connections: checking a connection out of the pool and back in costs
more than the statements of an admission on SQLite, and a pooled read costs
an extra round trip on PostgreSQL; so the stores of an engine keep a few
connections checked out (never detached: the pool counts them; one set per
engine, :func:`kept_for`) and lend each to one locked transaction (writers)
or one unlocked receipt read (readers) at a time, whatever thread or task
asks: a pool of 32 threads shares them.  On SQLite a read takes an idle
writer first, outside any transaction: SQLite drops a connection's page cache
whenever another connection has committed, so a reader would read the
receipt's pages from the file again after every admission, while a writer
keeps its cache across its own commits (:meth:`Kept._read_on_writer`).
Of a budget ``N``, ``N - 1`` may be kept (half writers, rounded up,
the rest readers: :func:`kept_shares`), so that at least one connection
always goes round the pool.  When every kept one is lent, the work takes a
pooled connection, waiting for one if the budget is spent.  No store code
holds a connection while it waits for another (a locked transaction runs on
its one connection; a retry's read is made before the lock, or in its round
trip), so a wait always ends: the kept ones are given back when their work
ends, and the one left to the pool always comes back.  A caller's own
transaction that reads through the store while it is open holds two; the
pool's timeout then ends the wait as a :class:`~admission.errors.StorageError`.

Health: a kept connection is checked when it is taken, without a round
trip (:func:`~admission.sql._health.connection_alive`: the socket of one the
server ended reads as closed), and replaced if the server ended it.  A
driver error that is a disconnect drops every idle kept connection at once
(a new generation; lent ones are closed when given back), so stale
connections cannot fail calls one after another: after a failover or a
restart, at most the calls already in flight fail, and the check usually
makes it none (``tests/integration/test_connection_health.py``).  The pool's checkouts get the same check (the
engine's ``checkout`` event).

A process that forked gets a new pool and its own connections; it never
uses or closes its parent's, whose sockets it shares (they stay referenced,
so collecting them never ends the parent's sessions).
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import Any, Final, TypeVar

from sqlalchemy import Engine
from sqlalchemy.engine import Connection
from sqlalchemy.pool import NullPool, QueuePool

from admission.errors import AdmissionError, InputError
from admission.sql._engine import DEFAULT_CONNECTIONS, is_postgresql, pause
from admission.sql._greenlet import greenlets
from admission.sql._health import is_disconnect, quiet, watch
from admission.sql._pooler import pooler_of

R = TypeVar("R")

__all__ = [
    "READ_CONNECTIONS",
    "REPLAN_AFTER",
    "USES",
    "WRITE_CONNECTIONS",
    "Kept",
    "budget_of",
    "kept_for",
    "kept_shares",
    "replan_due",
]


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
neither is done; nor on SQLite, whose plans do not depend on the tables' sizes
(admission runs no ``ANALYZE``).
"""

USES: Final = "admission_uses"
"""The key of a connection's ``info`` that counts its uses (see :data:`REPLAN_AFTER`)."""


def replan_due(uses: int) -> bool:
    """Whether a connection's statements are due to be planned again after ``uses`` uses."""
    return uses in REPLAN_AFTER or uses % REPLAN_AFTER[-1] == 0


def budget_of(engine: Engine) -> int:
    """The most connections a store on ``engine`` holds: its pool's bound.

    A :class:`~sqlalchemy.pool.QueuePool` holds ``pool_size`` plus
    ``max_overflow`` (an unbounded overflow counts as
    :data:`~admission.sql.DEFAULT_CONNECTIONS` more); a ``NullPool`` opens one
    per checkout, so only the kept ones are bounded, by
    :data:`~admission.sql.DEFAULT_CONNECTIONS`; a pool of one connection
    (``StaticPool``, ``SingletonThreadPool``) keeps none.
    """
    pool = engine.pool
    if isinstance(pool, QueuePool):
        overflow: int = pool._max_overflow  # QueuePool offers no public accessor
        return pool.size() + (overflow if overflow >= 0 else DEFAULT_CONNECTIONS)
    if isinstance(pool, NullPool):
        return DEFAULT_CONNECTIONS
    return 1


def kept_shares(budget: int) -> tuple[int, int]:
    """``(writers, readers)`` kept of ``budget``: all but one, half writers rounded up."""
    kept = max(budget - 1, 0)
    writers = (kept + 1) // 2
    return writers, kept - writers


WRITE_CONNECTIONS: Final = kept_shares(DEFAULT_CONNECTIONS)[0]
"""Write connections a store keeps at the default budget (4 of 8).  Kept for code that read it
before the budget; the budget (``connections``) sets the number now: :func:`kept_shares`."""

READ_CONNECTIONS: Final = kept_shares(DEFAULT_CONNECTIONS)[1]
"""Read connections a store keeps at the default budget (3 of 8).  Kept for code that read it
before the budget; the budget (``connections``) sets the number now: :func:`kept_shares`."""


# The pool each engine's connections come from, per process: a forked child
# gives the engine a new pool once and keeps the parent's referenced.
_pools_mutex: Final = threading.Lock()
_pool_pid: weakref.WeakKeyDictionary[Engine, int] = weakref.WeakKeyDictionary()
_left_behind: Final[list[object]] = []


def _own_pool(engine: Engine) -> None:
    pid = os.getpid()
    with _pools_mutex:
        if _pool_pid.setdefault(engine, pid) == pid:
            return
        # SQLAlchemy's advice for a forked child: a new pool, the parent's
        # connections neither used nor closed (kept referenced here).
        _left_behind.append(engine.pool)
        engine.dispose(close=False)
        _pool_pid[engine] = pid


class _Held:
    """A kept connection: a read one (``proxy``, its driver ``connection`` in autocommit and its
    ``cursor``) or a write one (``proxy`` is the SQLAlchemy ``Connection``; on SQLite its ``cursor``
    once it has read, see :meth:`Kept._read_on_writer`), with the process and the generation it
    belongs to."""

    __slots__ = ("connection", "cursor", "generation", "pid", "poller", "proxy", "uses")

    def __init__(self, proxy: Any, generation: int, dbapi_connection: Any, postgres: bool) -> None:
        self.proxy = proxy
        self.connection: Any = dbapi_connection
        # PostgreSQL: the socket, watched for the server ending the session (SQLite: nothing to watch).
        self.poller: Any = watch(dbapi_connection) if postgres else None
        self.cursor: Any = None
        self.uses = 0
        self.generation = generation
        self.pid = os.getpid()


class _Kind:
    """The kept connections of one kind (read or write): the idle ones and how many there are."""

    __slots__ = ("cap", "count", "free")

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.free: list[_Held] = []
        self.count = 0  # kept by this process, idle or lent


class Kept:
    """The kept read and write connections of the stores on one engine, inside its budget
    (one per engine: :func:`kept_for`).

    Each call is given the engine to use: the engine itself, or the same
    engine with admission's write option (one pool).  None is kept here, so
    that an engine no store uses any more can be collected.  See the module
    docstring.
    """

    def __init__(self, engine: Engine) -> None:
        self._dialect = engine.dialect
        self._postgres = is_postgresql(engine.dialect)
        # Behind a transaction pooler nothing is prepared: no reader is replaced to plan again;
        # nor on SQLite, which keeps no plan made for the tables as they were (REPLAN_AFTER).
        self._replan = self._postgres and pooler_of(engine) is None
        writers, readers = kept_shares(budget_of(engine))
        self.readers, self.writers = _Kind(readers), _Kind(writers)
        self._mutex = threading.Lock()
        self._pid = os.getpid()
        self._generation = 0
        # Connections of a parent process: kept referenced, never closed here.
        self._inherited: list[object] = []
        # A SQLite writer on the event loop's thread (lock_wait="awaited") waits for another
        # process's lock with the loop free, holding its connection: a pooled checkout that
        # blocked the loop's thread would then never see it given back (see _wait_for_writer).
        self._blocking_pool = not engine.dialect.is_async
        # SQLite: a read takes an idle writer first, whose page cache its own commits keep (read).
        self._reads_on_writers = not self._postgres
        _own_pool(engine)

    # -- bookkeeping ---------------------------------------------------------------------

    def _follow_fork(self, engine: Engine) -> None:
        """Under the mutex: a forked process starts with nothing kept (and a pool of its own)."""
        if self._pid == os.getpid():
            return
        for kind in (self.readers, self.writers):
            self._inherited.extend(kind.free)
            kind.free, kind.count = [], 0
        self._generation += 1
        self._pid = os.getpid()
        _own_pool(engine)

    def _take(self, kind: _Kind, engine: Engine) -> tuple[_Held | None, bool]:
        """An idle kept connection (``(held, False)``), a place for a new one (``(None, True)``),
        or nothing (``(None, False)``: every kept one is lent)."""
        with self._mutex:
            self._follow_fork(engine)
            if kind.free:
                return kind.free.pop(), False
            if kind.count >= kind.cap:
                return None, False
            kind.count += 1
            return None, True

    def _give(self, kind: _Kind, held: _Held, sound: bool) -> bool:
        """Give ``held`` back: kept if ``sound`` and current (``True``), else to be closed by the caller
        (``False``; a parent's connection is only kept referenced, and ``True`` is returned)."""
        with self._mutex:
            if held.pid != os.getpid():
                self._inherited.append(held)  # forked while it was lent: the parent's
                return True
            if sound and held.generation == self._generation and self._pid == held.pid:
                kind.free.append(held)
                return True
            if self._pid == held.pid:
                kind.count -= 1
            return False

    def _unplace(self, kind: _Kind) -> None:
        """A place taken for a new connection that could not be made."""
        with self._mutex:
            if self._pid == os.getpid():
                kind.count -= 1

    def _failed(self, error: BaseException, dbapi_connection: Any) -> None:
        """After a driver error: a disconnect drops every idle kept connection (a new generation)."""
        if is_disconnect(self._dialect, error, dbapi_connection):
            self._drop_idle()

    def _drop_idle(self) -> None:
        with self._mutex:
            if self._pid != os.getpid():
                return
            idle = self.readers.free + self.writers.free
            for kind in (self.readers, self.writers):
                kind.count -= len(kind.free)
                kind.free = []
            self._generation += 1
        for held in idle:
            _invalidate(held.proxy)

    # -- readers -------------------------------------------------------------------------

    def _new_reader(self, engine: Engine, uses: int) -> _Held:
        try:
            proxy = engine.raw_connection()
            held = _Held(proxy, self._generation, proxy.dbapi_connection, self._postgres)
            if self._postgres:
                held.connection.rollback()
                held.connection.autocommit = True
            # SQLite: the engine's connections already have isolation_level=None,
            # so each SELECT is its own WAL read, without an explicit transaction.
            held.cursor = held.connection.cursor()
        except BaseException:
            self._unplace(self.readers)
            raise
        held.uses = uses
        return held

    def read(self, engine: Engine, statements: Callable[[Any, Any], R]) -> R:
        """``statements(connection, cursor)`` on a kept driver connection in autocommit (a pooled
        one in a transaction when every kept reader is lent); its result.

        SQLite: on an idle kept writer when there is one (see :meth:`_read_on_writer`)."""
        pid = os.getpid()
        if self._reads_on_writers and self._pid == pid:
            try:
                writer = self.writers.free.pop()
            except IndexError:
                pass
            else:
                return self._read_on_writer(writer, statements, pid)
        free = self.readers.free
        try:
            # The common case, without the mutex: an idle kept reader of this process (a list's
            # pop is atomic); anything else takes the mutex below.
            held = free.pop() if self._pid == pid else None
        except IndexError:
            held = None
        place = False
        if held is None:
            held, place = self._take(self.readers, engine)
            if held is None and not place:
                return self._pooled_read(engine, statements)
        if held is None:
            held = self._new_reader(engine, 0)
        else:
            held.uses += 1
            if (self._postgres and not quiet(held.poller, held.connection)) or (
                self._replan and replan_due(held.uses)
            ):
                # Ended by the server (replaced before use), or due to be planned again (REPLAN_AFTER).
                _invalidate(held.proxy)
                held = self._new_reader(engine, held.uses)
        try:
            result = statements(held.connection, held.cursor)
        except BaseException as exc:
            self._close_failed(self.readers, held, exc)
            raise
        if held.generation == self._generation and held.pid == pid:
            # Given back without the mutex (an append is atomic): a drop or a close that raced
            # with it leaves one connection of the older generation idle, still checked before use.
            self.readers.free.append(held)
        elif not self._give(self.readers, held, True):
            _invalidate(held.proxy)
        return result

    def _close_failed(self, kind: _Kind, held: _Held, error: BaseException) -> None:
        """After any failure of a read (a driver error, a cancelled task): ``held`` is closed, its
        state unknown; a disconnect drops the idle ones too."""
        if not self._give(kind, held, False):
            _invalidate(held.proxy)
        self._failed(error, held.connection)

    def _read_on_writer(self, held: _Held, statements: Callable[[Any, Any], R], pid: int) -> R:
        """``statements`` on an idle kept write connection, outside any transaction (SQLite).

        SQLite drops a connection's whole page cache when it begins a read after a commit made
        by another connection, so a kept reader reads the pages of the receipt lookup from the
        file (the log) again after every admission; a connection's own commits leave its cache
        as it is.  An idle writer (the one that committed last comes first) therefore answers
        from memory.  Each statement is its own read of the latest commit, as on a reader: the
        connection is in autocommit between its transactions.
        """
        cursor = held.cursor
        try:
            if cursor is None:
                cursor = held.cursor = held.connection.cursor()
            result = statements(held.connection, cursor)
        except BaseException as exc:
            self._close_failed(self.writers, held, exc)
            raise
        if held.generation == self._generation and held.pid == pid:
            self.writers.free.append(held)  # as a reader is given back, without the mutex
        else:
            self._give_writer(held)
        return result

    def _pooled_read(self, engine: Engine, statements: Callable[[Any, Any], R]) -> R:
        proxy = engine.raw_connection()
        try:
            return statements(proxy.dbapi_connection, proxy.cursor())
        except BaseException as exc:
            if is_disconnect(self._dialect, exc, proxy.dbapi_connection):
                proxy.invalidate()  # not back to the pool: a lost connection cannot roll back
                self._drop_idle()
            raise
        finally:
            proxy.close()  # back to the pool, which rolls back what the read began

    # -- writers -------------------------------------------------------------------------

    def _writer(self, engine: Engine, write_engine: Engine) -> _Held | None:
        held, place = self._take(self.writers, engine)
        if held is None and not place:
            return self._wait_for_writer(engine, write_engine)
        return self._checked_writer(held, write_engine)

    def _checked_writer(self, held: _Held | None, write_engine: Engine) -> _Held:
        """``held`` if the server has not ended it, else (or for ``None``) a new kept writer."""
        if held is not None:
            if not self._postgres or quiet(held.poller, held.connection):
                return held
            _invalidate(held.proxy)  # ended by the server: replaced before use
        try:
            connection = write_engine.connect()
            return _Held(connection, self._generation, connection.connection.dbapi_connection, self._postgres)
        except BaseException:
            self._unplace(self.writers)
            raise

    @contextmanager
    def transaction(self, engine: Engine, write_engine: Engine) -> Iterator[Connection]:
        """A write transaction on ``write_engine`` (``engine`` with admission's write option), on
        a kept connection (or, when all are lent, a pooled one)."""
        held = self._writer(engine, write_engine)
        if held is None:
            with write_engine.connect() as pooled:
                dbapi = pooled.connection.dbapi_connection
                try:
                    with pooled.begin():
                        yield pooled
                except BaseException as exc:
                    self._failed(exc, dbapi)
                    raise
            return
        connection: Connection = held.proxy
        dbapi = connection.connection.dbapi_connection
        try:
            with connection.begin():
                yield connection
        except AdmissionError:
            # Admission's own refusal was rolled back on a sound connection.
            self._give_writer(held)
            raise
        except BaseException as exc:
            # Driver errors reach here untranslated: the connection is closed.
            if not self._give(self.writers, held, False):
                _invalidate(connection)
            self._failed(exc, dbapi)
            raise
        self._give_writer(held)

    def _give_writer(self, held: _Held) -> None:
        connection: Connection = held.proxy
        sound = not connection.invalidated and not connection.in_transaction()
        if not self._give(self.writers, held, sound):
            if sound:
                with suppress(Exception):
                    connection.close()  # sound, of an older generation: back to the pool
            else:
                _invalidate(connection)

    def _wait_for_writer(self, engine: Engine, write_engine: Engine) -> _Held | None:
        """Every kept writer is lent: on a blocking pool inside the event loop's greenlet, wait
        for one to come back with the loop free (a pooled checkout would block the loop's thread
        while the writers' holders wait on the loop); anywhere else ``None``: take a pooled one."""
        if not self._blocking_pool or not self.writers.cap or not _in_greenlet():
            return None
        delay = 0.0005
        while True:
            pause(delay)
            held, place = self._take(self.writers, engine)
            if held is not None or place:
                return self._checked_writer(held, write_engine)
            delay = min(delay * 2, 0.02)

    # -- closing -------------------------------------------------------------------------

    def close(self) -> None:
        """Close this process's idle kept connections; lent ones are closed when given back."""
        with self._mutex:
            if self._pid != os.getpid():
                return
            readers, writers = self.readers.free, self.writers.free
            for kind in (self.readers, self.writers):
                kind.count -= len(kind.free)
                kind.free = []
            self._generation += 1
        for held in readers:
            _invalidate(held.proxy)
        for held in writers:
            with suppress(Exception):
                held.proxy.close()


def _in_greenlet() -> bool:
    try:
        return bool(greenlets().in_greenlet())
    except InputError:  # greenlet is not installed: nothing runs on an event loop's greenlet
        return False


_kept_mutex: Final = threading.Lock()
_kept: weakref.WeakKeyDictionary[Engine, Kept] = weakref.WeakKeyDictionary()


def kept_for(engine: Engine) -> Kept:
    """The kept connections of ``engine``'s stores: one set per engine, so that two stores on one
    engine share its budget instead of each keeping ``N - 1`` of the same ``N``."""
    with _kept_mutex:
        kept = _kept.get(engine)
        if kept is None:
            kept = _kept[engine] = Kept(engine)
        return kept


def _invalidate(connection: Any) -> None:
    """Close a kept connection's driver connection and give its place back to the pool."""
    # Best effort: it is thrown away because it failed, or is being replaced; closing may fail too.
    with suppress(Exception):
        connection.invalidate()
    with suppress(Exception):
        connection.close()
