"""PostgreSQL's hot statements sent through libpq's pipeline directly, without psycopg's cursors.

A fresh admission on PostgreSQL is two exchanges of a few statements each
(:mod:`~admission.sql._fused`).  Through psycopg's cursors and pipeline object
each statement costs about 90 µs of client CPU (query conversion, the
prepared-statement manager, a cursor's result set-up, a poll and a send per
statement), several times what libpq itself needs: on the 2-core machine the
client's CPU, not the server's, is what bounds eight processes admitting at
once (docs/performance.md).

Here a :class:`WireStatement` is a :class:`~admission.sql._raw.RawStatement`
with its placeholders numbered (``$1``), prepared once per connection under a
name of its own, in the same exchange as its first execution.  Its values are
dumped and its rows loaded by psycopg's own ``Transformer`` (the adapters a
cursor uses, so the bytes sent are the ones a cursor sends), and the exchange
is sent in one flush and read through psycopg's own generator and ``wait``,
non-blocking, as a cursor's is.  :func:`exchange` sends a list of statements and a sync, then
reads every result; the first error raises as psycopg raises it, after the
whole exchange has been read, so the connection is left out of pipeline mode
and its transaction, if one was begun, open in error for the rollback.

Only where statements may be prepared by name: behind a transaction pooler
(``prepare_threshold=None``, :mod:`~admission.sql._pooler`) the callers keep
psycopg's own path.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, Final
from weakref import WeakKeyDictionary

from admission.sql._raw import RawStatement

if TYPE_CHECKING:
    from psycopg import pq

# psycopg is imported where it is used: it is an extra (admission[postgresql]), and these
# functions run only on its connections.

__all__ = [
    "Step",
    "WireStatement",
    "exchange",
    "exchange_async",
    "forget_prepared",
    "read_tuples",
    "wire_ready",
]

_PLACEHOLDER: Final = re.compile(r"%(?:\(([^)]+)\)([sb])|%)")
"""A named placeholder in pyformat (``%(name)s``, or ``%(name)b`` for binary), or an escaped ``%%``."""

Key = tuple[bytes, tuple[int, ...]]
"""A prepared statement's SQL and parameter types."""


class _Session:
    """The statements prepared on one connection's server session, by :data:`Key`."""

    __slots__ = ("count", "names")

    def __init__(self) -> None:
        self.names: dict[Key, bytes] = {}
        self.count = 0  # names handed out, so a name is never given twice on a session

    def name(self) -> bytes:
        self.count += 1
        return f"_admission_{self.count}".encode()


_sessions: WeakKeyDictionary[Any, _Session] = WeakKeyDictionary()
"""Per psycopg connection, what its session holds prepared."""


def forget_prepared(driver: Any) -> None:
    """After ``DEALLOCATE ALL`` on ``driver``'s session: nothing of it is prepared any more."""
    _sessions.pop(driver, None)


def wire_ready(driver: Any) -> bool:
    """Whether ``driver`` (a sync psycopg connection) may take :func:`exchange`: statements are
    prepared by name on its session (no transaction pooler in between)."""
    return driver.prepare_threshold is not None


class WireStatement:
    """A :class:`RawStatement` in libpq's own form: ``$n`` placeholders, each parameter's format."""

    __slots__ = ("_names", "formats", "sql", "values")

    def __init__(self, raw: RawStatement) -> None:
        from psycopg.adapt import PyFormat

        order: list[str] = []
        formats: list[PyFormat] = []

        def numbered(match: re.Match[str]) -> str:
            name, kind = match.group(1), match.group(2)
            if name is None:
                return "%"
            if name not in order:
                order.append(name)
                formats.append(PyFormat.BINARY if kind == "b" else PyFormat.AUTO)
            return f"${order.index(name) + 1}"

        self.sql: bytes = _PLACEHOLDER.sub(numbered, raw.sql).encode()
        self.formats = tuple(formats)
        # The statement's values in ``$n`` order, each through its type's bind processor.
        self.values = raw.ordered(order)
        self._names: list[str] | None = None

    @classmethod
    def of(cls, raw: RawStatement) -> WireStatement:
        """``raw``'s libpq form, made once."""
        wired = raw.wired
        if wired is None:
            wired = raw.wired = cls(raw)
        assert isinstance(wired, WireStatement)
        return wired

    def tuples(self, transformer: Any, result: pq.abc.PGresult) -> list[tuple[Any, ...]]:
        """The rows of ``result``, loaded by psycopg's loaders, in column order."""
        if self._names is None:
            self._names = [(result.fname(i) or b"").decode() for i in range(result.nfields)]
        transformer.set_pgresult(result)
        rows: list[tuple[Any, ...]] = transformer.load_rows(0, result.ntuples, tuple)
        return rows

    def as_dicts(self, rows: Sequence[tuple[Any, ...]]) -> list[dict[str, Any]]:
        """``rows`` of :meth:`tuples` as dicts by column name."""
        names = self._names
        assert names is not None
        return [dict(zip(names, row, strict=True)) for row in rows]


Step = tuple[RawStatement, Mapping[str, Any]] | bytes
"""One statement of an exchange: a prepared one with its parameters, or plain SQL without any
(``BEGIN``, ``COMMIT``)."""


def exchange(driver: Any, steps: Sequence[Step], *, restartable: bool = False) -> list[list[dict[str, Any]]]:
    """Send ``steps`` in one pipeline with a sync, read every result; each step's rows, in order.

    A statement not yet prepared on ``driver``'s session is prepared in the same
    exchange, just before it.  An error raises once every result is read (the
    statements after a failed one are skipped by the server, a ``COMMIT``
    among them).

    psycopg drops every statement prepared on a session (``DEALLOCATE ALL``)
    when it rolls a transaction back while it holds prepared statements of its
    own; the first exchange after that finds its statements gone.  With
    ``restartable`` (``steps`` start with the ``BEGIN`` of a transaction, or
    run in autocommit: nothing done before them is lost by a rollback) the
    transaction is rolled back and the exchange sent again, its statements
    prepared anew; otherwise the error raises.
    """
    return _as_dicts(steps, _restarted(driver, steps, restartable))


def read_tuples(driver: Any, statement: RawStatement, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
    """The rows of ``statement`` in column order, on ``driver`` in autocommit (see :func:`exchange`).

    Not restarted when its statement is found gone: a read connection's session
    keeps what it prepared (in autocommit psycopg has nothing to roll back), so a
    statement gone from it means a transaction pooler between (``admission_pooler``
    unset, :mod:`~admission.sql._pooler`), which the error names.  The session's
    statements are then prepared again by the next read.
    """
    (rows,) = _exchange(driver, [(statement, params)])
    return rows


async def exchange_async(
    driver: Any, steps: Sequence[Step], *, restartable: bool = False
) -> list[list[dict[str, Any]]]:
    """:func:`exchange` on a psycopg ``AsyncConnection``."""
    from psycopg import errors

    try:
        wired = await _exchange_async(driver, steps)
    except errors.InvalidSqlStatementName:
        if not restartable:
            raise
        await driver.rollback()
        wired = await _exchange_async(driver, steps)
    return _as_dicts(steps, wired)


def _as_dicts(steps: Sequence[Step], wired: Sequence[list[tuple[Any, ...]]]) -> list[list[dict[str, Any]]]:
    return [
        [] if isinstance(step, bytes) else WireStatement.of(step[0]).as_dicts(rows)
        for step, rows in zip(steps, wired, strict=True)
    ]


def _restarted(driver: Any, steps: Sequence[Step], restartable: bool) -> list[list[tuple[Any, ...]]]:
    from psycopg import errors

    try:
        return _exchange(driver, steps)
    except errors.InvalidSqlStatementName:
        if not restartable:
            raise
    driver.rollback()
    return _exchange(driver, steps)


def _exchange(driver: Any, steps: Sequence[Step]) -> list[list[tuple[Any, ...]]]:
    sending = _Sending(driver, steps)
    try:
        groups = driver.wait(sending.communicate())
    except BaseException:
        if not sending.leave():
            driver.close()
        raise
    sending.leave()
    return sending.received(groups)


async def _exchange_async(driver: Any, steps: Sequence[Step]) -> list[list[tuple[Any, ...]]]:
    sending = _Sending(driver, steps)
    try:
        groups = await driver.wait(sending.communicate())
    except BaseException:
        if not sending.leave():
            await driver.close()
        raise
    sending.leave()
    return sending.received(groups)


class _Sending:
    """One exchange's commands (prepares where needed), and what each one's result is."""

    __slots__ = ("_driver", "_session", "_steps", "_transformer", "commands", "sent")

    def __init__(self, driver: Any, steps: Sequence[Step]) -> None:
        from psycopg.adapt import Transformer

        pgconn = driver.pgconn
        self._driver, self._steps = driver, steps
        self._transformer = transformer = Transformer(driver)
        session = _sessions.get(driver)
        if session is None:
            session = _sessions[driver] = _Session()
        self._session = session
        names = session.names
        self.commands: list[Callable[[], None]] = []
        # Per command sent, in order: the statement whose rows it returns, None for a plain
        # statement, or the (SQL, types) key and name of a prepare.
        self.sent: list[WireStatement | tuple[Key, bytes] | None] = []
        for step in steps:
            if isinstance(step, bytes):
                self.commands.append(partial(pgconn.send_query_params, step, None))
                self.sent.append(None)
                continue
            raw, params = step
            statement = WireStatement.of(raw)
            dumped = transformer.dump_sequence(statement.values(params), statement.formats)
            key = (statement.sql, tuple(transformer.types or ()))
            name = names.get(key)
            if name is None:
                name = session.name()
                self.commands.append(partial(pgconn.send_prepare, name, statement.sql, param_types=key[1]))
                self.sent.append((key, name))
            formats = transformer.formats
            self.commands.append(partial(pgconn.send_query_prepared, name, dumped, param_formats=formats))
            self.sent.append(statement)
        self.commands.append(pgconn.pipeline_sync)

    def communicate(self) -> Any:
        """A generator for psycopg's ``wait`` that sends the commands in one flush, then reads
        every result up to the sync's. The connection is put in pipeline mode first;
        :meth:`leave` takes it out.

        In pipeline mode libpq only buffers each command (it flushes on its own once 64 KB are
        waiting), and the sync flushes the rest: the exchange goes out in one ``send`` when it
        fits the socket's buffer. psycopg's ``pipeline_communicate`` instead waits for the
        socket to be writable and flushes before each command: a ``poll`` and a ``send`` per
        statement (8 sends and ~13 polls a fresh admission, against 2 and 3 here, counted by
        ``strace``). What the socket does not take at once is sent as it becomes writable,
        the results read meanwhile into libpq's buffer, so neither side waits on a full
        buffer.
        """
        from psycopg import generators, pq
        from psycopg.waiting import Ready, Wait

        pgconn = self._driver.pgconn
        pgconn.enter_pipeline_mode()
        for command in self.commands:
            command()
        while pgconn.flush():  # 1 while some of the exchange is still to be sent
            ready = yield Wait.RW
            if ready & Ready.R:
                pgconn.consume_input()
        groups: list[list[Any]] = []
        while not groups or groups[-1][0].status != pq.ExecStatus.PIPELINE_SYNC:
            if group := (yield from generators.fetch_many(pgconn)):
                groups.append(group)
        return groups

    def leave(self) -> bool:
        """Out of pipeline mode; ``False`` if results are still pending (a broken connection, an
        interrupt): the caller then closes the connection, so that the pool never lends one left
        in pipeline mode."""
        from psycopg import errors, pq

        pgconn = self._driver.pgconn
        if pgconn.pipeline_status == pq.PipelineStatus.OFF:
            return True
        try:
            pgconn.exit_pipeline_mode()
        except errors.Error:
            return False
        return True

    def received(self, groups: Sequence[Sequence[Any]]) -> list[list[tuple[Any, ...]]]:
        """Each step's rows from the results read; the first error raised as psycopg raises it."""
        from psycopg import errors, pq

        results = [group[-1] for group in groups if group[0].status != pq.ExecStatus.PIPELINE_SYNC]
        if len(results) != len(self.sent):
            raise errors.InternalError(f"a pipeline of {len(self.sent)} commands gave {len(results)} results")
        failed = next((r for r in results if r.status == pq.ExecStatus.FATAL_ERROR), None)
        names = self._session.names
        rows: list[list[tuple[Any, ...]]] = []
        for what, result in zip(self.sent, results, strict=True):
            if result.status in (pq.ExecStatus.FATAL_ERROR, pq.ExecStatus.PIPELINE_ABORTED):
                continue
            if isinstance(what, tuple):
                names[what[0]] = what[1]  # prepared: it stays on the session, whatever the transaction does
            else:
                rows.append([] if what is None else what.tuples(self._transformer, result))
        if failed is not None:
            error = errors.error_from_result(failed, encoding=self._driver.info.encoding)
            if isinstance(error, errors.InvalidSqlStatementName):
                names.clear()  # the session lost its prepared statements (DISCARD, DEALLOCATE)
            raise error
        if len(rows) != len(self._steps):
            raise errors.InternalError("a pipeline was aborted without an error")
        return rows
