"""The engine, its dialect helpers, and THE driver-error boundary.

Every SQL adapter of admission (receipts, the durable worker, durable jobs)
gets its engine from :func:`create_admission_engine` and wears
:func:`wrap_exceptions` around every method that reaches the database: the
one place where a driver's error becomes an admission error, with the
driver's exception kept as the cause (after procrastinate's
``wrap_exceptions``).  Constraints are matched by name (PostgreSQL reports
it; on SQLite a UNIQUE failure names its columns, and admission's triggers
begin their message with their constraint's name), never by free text.
"""

from __future__ import annotations

import asyncio
import logging
import re
import sqlite3
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, Literal

from sqlalchemy import Dialect, Engine, Table, create_engine, event
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import URL, Connection, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from admission import telemetry
from admission.errors import AdmissionError, InputError, StorageError
from admission.sql._budget import CONNECTIONS_PARAMETER, DEFAULT_CONNECTIONS, apply_budget
from admission.sql._greenlet import greenlets, wait
from admission.sql._health import checked_on_checkout
from admission.sql._pooler import POOLER_HINT, POOLER_PARAMETER, apply_pooler
from admission.sql._sqlite_file import DatabaseFileMovedError, FileGuard, guarded_connection

__all__ = [
    "CONNECTIONS_PARAMETER",
    "DEFAULT_CONNECTIONS",
    "DEFAULT_URL",
    "SQLITE_BUSY_TIMEOUT_MS",
    "SQLITE_PRAGMAS",
    "SQLITE_WAL_AUTOCHECKPOINT",
    "WRITE_OPTION",
    "async_url",
    "constraint_name",
    "create_admission_engine",
    "create_async_admission_engine",
    "create_awaited_engine",
    "insert_or_ignore",
    "is_postgresql",
    "is_unique_violation",
    "masked_url",
    "normalize_url",
    "pause",
    "schema_of",
    "wrap_exceptions",
]

DEFAULT_URL: Final = "sqlite:///admission.sqlite3"
"""The embedded default: a SQLite file in the working directory."""

SQLITE_BUSY_TIMEOUT_MS: Final = 30_000
"""How long a SQLite writer waits for another's lock before it is refused as busy."""

SQLITE_WAL_AUTOCHECKPOINT: Final = 10_000
"""Pages of write-ahead log after which a SQLite commit copies the log into the database file
(SQLite's default: 1,000).  Fewer, larger checkpoints copy a hot index page once for many commits
that changed it; the log grows to about 40 MB with 4 KiB pages (docs/performance.md, "Checkpoints")."""

SQLITE_PRAGMAS: Final = (
    "synchronous=FULL",
    "foreign_keys=ON",
    f"busy_timeout={SQLITE_BUSY_TIMEOUT_MS}",
    f"wal_autocheckpoint={SQLITE_WAL_AUTOCHECKPOINT}",
)
"""What every connection of an admission engine on SQLite sets after ``journal_mode=WAL``."""

WRITE_OPTION: Final = "admission_write"
"""The execution option that marks admission's own write transactions (``BEGIN IMMEDIATE`` on SQLite)."""


def normalize_url(url: str) -> str:
    """Accept ``postgresql://`` and ``postgres://`` URLs and use the psycopg 3 driver for them."""
    parsed = make_url(
        url.replace("postgres://", "postgresql://", 1) if url.startswith("postgres://") else url
    )
    if parsed.drivername == "postgresql":
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed.render_as_string(hide_password=False)


_QUERY_PASSWORD: Final = re.compile(r"(?P<keep>[?&][^=&]*password=)[^&]*", re.IGNORECASE)


def masked_url(url: str) -> str:
    """``url`` as it may be shown in output or logs: its password, if any, as ``***``
    (in the query too: psycopg reads ``?password=``)."""
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):
        return "***"  # not parsed, so no telling which part is the password
    shown = url if parsed.password is None else parsed.render_as_string(hide_password=True)
    return _QUERY_PASSWORD.sub(r"\g<keep>***", shown)


def is_postgresql(dialect: Dialect) -> bool:
    """Whether ``dialect`` is PostgreSQL (the server); otherwise it is SQLite (embedded)."""
    return dialect.name == "postgresql"


SCHEMA_OPTION: Final = "admission_schema"
"""The engine execution option that records the PostgreSQL schema admission's tables live in."""

_SCHEMA_NAME: Final = re.compile(r"[a-z_][a-z0-9_]{0,62}")


def schema_of(engine: Engine) -> str | None:
    """The PostgreSQL schema ``engine`` keeps admission's tables in (``None``: the default)."""
    schema = engine.get_execution_options().get(SCHEMA_OPTION)
    return schema if isinstance(schema, str) else None


LockWait = Literal["blocking", "awaited"]
"""How a SQLite writer waits for another's lock: in SQLite's busy handler, or on the event loop."""


def create_admission_engine(
    url: str,
    *,
    schema: str | None = None,
    lock_wait: LockWait = "blocking",
    connections: int | None = None,
    pooler: str | None = None,
    **kwargs: Any,
) -> Engine:
    """Create an engine configured as admission needs it.

    ``connections`` (or the URL's ``?admission_connections=N``, taken out of
    the URL before the driver sees it) is the connection budget: the engine's
    pool holds at most that many connections (``pool_size=N``,
    ``max_overflow=0``), and a store on the engine keeps its read and write
    connections inside it, so one store never holds more than ``N``
    connections in a process (default :data:`DEFAULT_CONNECTIONS`;
    ``admission/sql/_connections.py``).  Anything but a positive integer,
    or the budget given both ways, raises
    :class:`~admission.errors.InputError` (``field`` ``connections``) before
    anything is opened.  Without it, ``pool_size`` and ``max_overflow`` given
    here are the pool's own bound.

    On PostgreSQL every connection the pool hands out is first checked
    without a round trip (its socket polled): one the server has ended
    (a restart, a failover, a terminated session) is replaced, not used.

    SQLite: WAL journal, ``synchronous=FULL``, foreign keys on, a busy
    timeout, a checkpoint every :data:`SQLITE_WAL_AUTOCHECKPOINT` pages of
    log, pooled connections, and admission's write transactions opened with
    ``BEGIN IMMEDIATE`` so that the admission lock is taken before the first
    read (a deferred transaction that upgrades to a write can fail
    instead of waiting).  Other transactions on the engine begin deferred.
    Each connection checks that its path still names the file it opened
    (``admission/sql/_sqlite_file.py``): a database file or ``-wal`` deleted,
    replaced or moved away under the process is refused as
    :class:`~admission.errors.StorageError`, never acknowledged, and the
    engine opens no other file until it is disposed.

    ``lock_wait="awaited"`` (SQLite; the async stores' engine, ``docs/async.md``):
    a write transaction that finds another writer's lock is retried after
    sleeps awaited on the event loop (when run by :func:`admission.aio.run_sync`)
    instead of waiting in SQLite's busy handler, which would hold the loop;
    the same overall wait, :data:`SQLITE_BUSY_TIMEOUT_MS`.

    ``schema`` (PostgreSQL only) puts every admission table, the version
    table included, in that schema instead of the default one: each
    connection starts with it as its only ``search_path``, so the same
    statements serve every schema.  ``admission db upgrade`` creates it.

    ``pooler="transaction"`` (PostgreSQL only; or ``admission_pooler=transaction``
    in the URL's query, taken out before the driver sees it): the database is
    reached through a pooler in transaction mode (PgBouncer's ``pool_mode =
    transaction``), so nothing is kept on a server session: no prepared
    statement, no ``DEALLOCATE ALL``, no session setting
    (``admission/sql/_pooler.py``).  Another value raises
    :class:`~admission.errors.InputError` (``field`` ``pooler``).

    A URL that cannot be parsed, or that names a dialect or driver that is
    not installed, raises :class:`~admission.errors.InputError` (``field``
    ``url``), keeping SQLAlchemy's error as the cause.

    A URL naming an asyncio driver (``sqlite+aiosqlite``,
    ``postgresql+psycopg_async``) gives the ``sync_engine`` of
    :func:`create_async_admission_engine`'s engine: statements on it run only
    inside :func:`admission.aio.run_sync` (migrations need a synchronous URL).
    """
    if lock_wait not in ("blocking", "awaited"):
        raise InputError("must be blocking or awaited", field="lock_wait")
    if lock_wait == "awaited":
        kwargs[_AWAITED_LOCK] = True
    engine = _admission_engine(url, schema, connections, kwargs, pooler)
    # An asyncio driver's URL: the synchronous face of its engine, for code run by admission.aio.run_sync.
    return engine.sync_engine if isinstance(engine, AsyncEngine) else engine


_ASYNC_DRIVERS: Final = {
    "sqlite": "sqlite+aiosqlite",
    "sqlite+pysqlite": "sqlite+aiosqlite",
    "postgresql+psycopg": "postgresql+psycopg_async",
}
"""The asyncio driver admission uses for each synchronous one it knows (aiosqlite; psycopg's own)."""


def async_url(url: str) -> str:
    """``url`` with the asyncio driver of its database: ``sqlite+aiosqlite`` for SQLite,
    ``postgresql+psycopg_async`` for PostgreSQL (``postgres://`` too); an asyncio driver is kept.

    Raises :class:`~admission.errors.InputError` (``field`` ``url``) for a URL that cannot be
    parsed or names a synchronous driver without an asyncio twin.
    """
    try:
        parsed = make_url(normalize_url(url))
        loaded = parsed.get_dialect()
    except (ArgumentError, ValueError) as exc:
        raise InputError(f"the database URL cannot be used: {exc}", field="url") from exc
    except ImportError:
        loaded = None  # a driver that is not installed: named below when the engine is made
    if loaded is not None and loaded.is_async:
        return parsed.render_as_string(hide_password=False)
    driver = _ASYNC_DRIVERS.get(parsed.drivername)
    if driver is None:
        raise InputError(
            f"the driver {parsed.drivername} has no asyncio driver admission knows; "
            "use sqlite:// or postgresql:// (or name an asyncio driver)",
            field="url",
        )
    return parsed.set(drivername=driver).render_as_string(hide_password=False)


def create_async_admission_engine(
    url: str,
    *,
    schema: str | None = None,
    connections: int | None = None,
    pooler: str | None = None,
    **kwargs: Any,
) -> AsyncEngine:
    """Create an :class:`~sqlalchemy.ext.asyncio.AsyncEngine` configured as admission needs it.

    The same engine as :func:`create_admission_engine` (the same URL checks
    and errors, ``schema``, the connection budget ``connections``, ``pooler``, SQLite pragmas,
    ``BEGIN IMMEDIATE`` for
    admission's writes, the SQLite file guard), on the database's asyncio
    driver (:func:`async_url`): aiosqlite or psycopg's ``AsyncConnection``.
    Its ``sync_engine`` is what admission's stores run on, inside
    :func:`admission.aio.run_sync` (``docs/async.md``).  Needs
    ``admission[asyncio]``.
    """
    engine = _admission_engine(async_url(url), schema, connections, kwargs, pooler)
    assert isinstance(engine, AsyncEngine)  # async_url named an asyncio driver
    return engine


def create_awaited_engine(
    url: str,
    *,
    schema: str | None = None,
    connections: int | None = None,
    pooler: str | None = None,
    **kwargs: Any,
) -> Engine:
    """The engine admission's async stores run on, inside :func:`admission.aio.run_sync` (``docs/async.md``).

    SQLite (``sqlite://``): the standard ``sqlite3`` driver on the event
    loop's own thread, with ``lock_wait="awaited"``.  An embedded database
    answers in microseconds, where handing each statement to a driver thread
    (aiosqlite) costs a thread switch each way; what can take long, waiting
    for another process's write lock, is awaited on the loop.  A commit's
    fsync runs on the loop's thread.  A URL naming an asyncio driver
    (``sqlite+aiosqlite``), and PostgreSQL (psycopg's ``AsyncConnection``):
    the ``sync_engine`` of :func:`create_async_admission_engine`, every
    statement awaited.  ``connections`` is the budget, as for
    :func:`create_admission_engine`.
    """
    try:
        parsed = make_url(normalize_url(url))
    except (ArgumentError, ValueError) as exc:
        raise InputError(f"the database URL cannot be used: {exc}", field="url") from exc
    if parsed.get_backend_name() == "sqlite" and not _is_async(url):
        return create_admission_engine(
            url, schema=schema, lock_wait="awaited", connections=connections, pooler=pooler, **kwargs
        )
    return create_async_admission_engine(
        url, schema=schema, connections=connections, pooler=pooler, **kwargs
    ).sync_engine


def _admission_engine(
    url: str,
    schema: str | None,
    connections: int | None,
    kwargs: dict[str, Any],
    pooler: str | None = None,
) -> Engine | AsyncEngine:
    try:
        parsed = make_url(normalize_url(url))
    except (ArgumentError, ValueError) as exc:
        # SQLAlchemy's messages here name the part it could not use, never the password.
        raise InputError(f"the database URL cannot be used: {exc}", field="url") from exc
    if pooler is not None or POOLER_PARAMETER in parsed.query:
        parsed = apply_pooler(parsed, pooler, schema, kwargs)
        url = parsed.render_as_string(hide_password=False)
    parsed = apply_budget(parsed, connections, kwargs)
    url = parsed.render_as_string(hide_password=False)
    if schema is not None:
        _check_schema(schema, parsed)
        connect_args = dict(kwargs.pop("connect_args", {}))
        connect_args["options"] = f"-csearch_path={schema}"
        kwargs["connect_args"] = connect_args
        kwargs["execution_options"] = {**kwargs.get("execution_options", {}), SCHEMA_OPTION: schema}
    try:
        return _configured_engine(url, **kwargs)
    except ImportError as exc:
        # admission itself picks psycopg for postgresql:// URLs (normalize_url),
        # so it names the extra that installs it.
        extra = " (pip install 'admission[postgresql]')" if url.startswith("postgres") else ""
        if _is_async(url):
            extra = " (pip install 'admission[asyncio]')"
        raise InputError(f"the database driver is not installed: {exc}{extra}", field="url") from exc
    except (ArgumentError, ValueError) as exc:
        raise InputError(f"the database URL cannot be used: {exc}", field="url") from exc


def _is_async(url: str) -> bool:
    parsed = make_url(url)
    try:
        return bool(parsed.get_dialect().is_async)
    except ImportError:
        # Not installed: the ones admission maps to are named, to say what to install.
        return parsed.get_driver_name() in {name.partition("+")[2] for name in _ASYNC_DRIVERS.values()}


def _check_schema(schema: str, url: URL) -> None:
    backend = url.get_backend_name()
    if backend != "postgresql":
        raise InputError(
            f"a schema applies to PostgreSQL only; {backend} keeps admission's tables in its file",
            field="schema",
        )
    if not isinstance(schema, str) or not _SCHEMA_NAME.fullmatch(schema):
        raise InputError(
            "expected a schema name of 1 to 63 lower-case letters, digits and underscores, "
            "not starting with a digit",
            field="schema",
        )
    if "options" in url.query:
        raise InputError("the URL already sets libpq options; give the schema in one place", field="schema")


_AWAITED_LOCK: Final = "admission_awaited_lock"
"""The key that carries ``lock_wait="awaited"`` to :func:`_configured_engine`."""


def pause(seconds: float) -> None:
    """Sleep: awaited on the loop inside a greenlet, so other tasks run; else on this thread."""
    concurrency = greenlets()
    if concurrency.in_greenlet():
        wait(asyncio.sleep(seconds))
    else:
        time.sleep(seconds)


def _begin_immediate_awaited(dbapi_connection: Any) -> None:
    """``BEGIN IMMEDIATE`` that waits for another writer with :func:`pause`, never in SQLite.

    SQLite's busy handler sleeps in the driver call, holding the event loop for
    as long as another process writes; with the handler off for this one
    statement, a busy answer comes at once and the wait is awaited instead.
    """
    dbapi_connection.execute("PRAGMA busy_timeout=0")
    try:
        delay, deadline = 0.001, time.monotonic() + SQLITE_BUSY_TIMEOUT_MS / 1000
        while True:
            try:
                dbapi_connection.execute("BEGIN IMMEDIATE")
                return
            except sqlite3.OperationalError as exc:
                busy = getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_BUSY
                if not busy or time.monotonic() >= deadline:
                    raise
            pause(delay)
            delay = min(delay * 2, 0.05)
    finally:
        # Every other statement keeps the busy handler (a reader meets a lock only in rare moments).
        dbapi_connection.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")


def _configured_engine(url: str, **kwargs: Any) -> Engine | AsyncEngine:
    url = normalize_url(url)
    # An asyncio driver waits for the lock on its own thread, never on the loop.
    awaited_lock = bool(kwargs.pop(_AWAITED_LOCK, False)) and not _is_async(url)
    # An asyncio driver: the same configuration, on the synchronous face
    # (sync_engine) that admission's stores run on, whose listeners see the
    # driver through SQLAlchemy's adapter (docs/async.md).
    create: Callable[..., Engine | AsyncEngine] = create_async_engine if _is_async(url) else create_engine
    if make_url(url).get_backend_name() != "sqlite":
        # A zero-round-trip check on checkout instead of pre-ping's round trip (connection_alive).
        kwargs.setdefault("pool_pre_ping", False)
        made_pg = create(url, **kwargs)
        pooled = made_pg.sync_engine if isinstance(made_pg, AsyncEngine) else made_pg
        event.listen(pooled, "checkout", checked_on_checkout)
        return made_pg
    if make_url(url).database in (None, "", ":memory:"):
        raise StorageError("an in-memory SQLite database cannot be shared between connections; use a file")
    # aiosqlite hands these, and the guard's factory, to sqlite3.connect in its own thread.
    kwargs.setdefault("connect_args", {"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000, "check_same_thread": False})
    guard = _guard_file(make_url(url), kwargs)
    made = create(url, **kwargs)
    engine = made.sync_engine if isinstance(made, AsyncEngine) else made

    @event.listens_for(engine, "connect")
    def _configure(dbapi_connection: Any, _record: object) -> None:
        # pysqlite would emit its own deferred BEGIN; admission emits its own.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        # Not chained: an asyncio driver's cursor.execute returns the driver's own cursor.
        cursor.execute("PRAGMA journal_mode=WAL")
        (mode,) = cursor.fetchone()
        for pragma in SQLITE_PRAGMAS:
            cursor.execute(f"PRAGMA {pragma}")
        cursor.close()
        guarded = guarded_connection(dbapi_connection)
        if guarded is not None:
            # After the pragma's read, which opened the log of an existing database.
            guarded.adopt_journal(str(mode).lower() == "wal")

    @event.listens_for(engine, "begin")
    def _begin(conn: Connection) -> None:
        if conn.get_execution_options().get(WRITE_OPTION):
            # Admission's own write transactions: on the driver, because
            # SQLAlchemy's execution path costs several times the statement.
            # SQLAlchemy does not wrap what a begin listener raises, so a busy
            # timeout is wrapped here as SQLAlchemy wraps a statement's error:
            # the boundary then sees the error it expects.
            error = conn.dialect.loaded_dbapi.Error
            dbapi_connection: Any = conn.connection.dbapi_connection
            try:
                guarded = guarded_connection(dbapi_connection)
                if guarded is not None:
                    # Refused before anything is written (docs/guide.md, "A SQLite file
                    # taken away"); the check after COMMIT is the one that guarantees it.
                    guarded.check_file()
                # Both sqlite3's connection and SQLAlchemy's adapter of aiosqlite have execute().
                if awaited_lock:
                    _begin_immediate_awaited(dbapi_connection)
                else:
                    dbapi_connection.execute("BEGIN IMMEDIATE")
            except error as exc:
                raise DBAPIError.instance("BEGIN IMMEDIATE", (), exc, error) from exc
        else:
            conn.exec_driver_sql("BEGIN")

    if guard is not None:
        # A disposed engine opens, and is bound to, what the path names then.
        event.listen(engine, "engine_disposed", lambda _engine: guard.forget())
    return made


def _guard_file(url: URL, kwargs: dict[str, Any]) -> FileGuard | None:
    """Give the driver a connection class that checks its file (sqlite3's, through pysqlite or
    aiosqlite), and its guard."""
    if url.get_driver_name() not in ("pysqlite", "aiosqlite"):
        return None
    connect_args = dict(kwargs["connect_args"])
    guard = FileGuard()
    connect_args["factory"] = guard.connection_class(connect_args.get("factory"))
    kwargs["connect_args"] = connect_args
    return guard


def insert_or_ignore(
    connection: Connection, table: Table, values: Mapping[str, Any], index_elements: Sequence[str]
) -> int:
    """``INSERT ... ON CONFLICT (index_elements) DO NOTHING``; returns the number of rows inserted."""
    dialect_insert = postgresql.insert if is_postgresql(connection.dialect) else sqlite.insert
    statement = (
        dialect_insert(table).values(dict(values)).on_conflict_do_nothing(index_elements=list(index_elements))
    )
    return int(connection.execute(statement).rowcount)


# -- the driver-error boundary ------------------------------------------------------------------------

_SQLITE_UNIQUE: Final = re.compile(r"UNIQUE constraint failed: (.+)$")
_SQLITE_NAMED: Final = re.compile(r"^([a-z][a-z0-9_]*): ")


def constraint_name(error: BaseException) -> str:
    """The name of the constraint a driver's error reports: PostgreSQL names it; SQLite names
    a UNIQUE failure's columns, and admission's triggers start their message with their name."""
    diag = getattr(error, "diag", None)
    name = getattr(diag, "constraint_name", None)
    if name:
        return str(name)
    text = str(error)
    match = _SQLITE_UNIQUE.search(text) or _SQLITE_NAMED.match(text)
    return match.group(1) if match else "unknown"


def is_unique_violation(error: BaseException, index: str) -> bool:
    """Whether a PostgreSQL driver's ``error`` is a unique violation (23505) of the index ``index``."""
    return getattr(error, "sqlstate", None) == "23505" and constraint_name(error) == index


_log: Final = telemetry.logger("sql")

Refusals = Mapping[str, Callable[[], AdmissionError]]
"""Constraint name -> the admission error a refusal by that constraint means."""


class wrap_exceptions:  # lower case: it reads as a function, ``with wrap_exceptions(dialect):``
    """Translate every driver error raised in the block into an admission error, keeping the cause.

    A refusal by a constraint named in ``refusals`` becomes that error (the
    fencing trigger's ``worker_fence`` becomes :class:`FencedError`); any
    other integrity failure, an unavailable or busy database, and every other
    driver error become :class:`StorageError`, which callers may retry.
    Errors raised through SQLAlchemy and errors raised by the driver itself
    (statements run on a DBAPI cursor) are translated alike; admission's own
    errors pass through unchanged.  A class rather than a generator: it wraps
    every read of a retry, and one instance holds no state of a block, so a
    store may keep one and use it in any number of blocks at once.
    """

    __slots__ = ("_dbapi", "_refusals")

    def __init__(self, dialect: Dialect, refusals: Refusals | None = None) -> None:
        self._dbapi: Any = dialect.loaded_dbapi
        self._refusals = refusals

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, trace: object) -> None:
        if error is None:
            return
        if isinstance(error, PoolTimeoutError):
            # Every connection of the budget stayed in use for the pool's whole timeout.
            raise StorageError(
                "no connection of the store's budget came free in time (admission_connections)"
            ) from error
        if isinstance(error, DBAPIError):
            raise _translate(error.orig or error, self._dbapi, self._refusals) from error
        if isinstance(error, self._dbapi.Error):
            raise _translate(error, self._dbapi, self._refusals) from error


def _translate(error: BaseException, dbapi: Any, refusals: Refusals | None) -> AdmissionError:
    translated = _translated(error, dbapi, refusals)
    # The driver's class and the constraint's name, never the driver's message: it may quote a
    # value (psycopg's DETAIL does) or the statement's parameters.  A refusal by a constraint is
    # the database doing its job; anything else is worth an operator's look.
    refused = isinstance(error, dbapi.IntegrityError)
    _log.log(
        logging.DEBUG if refused else logging.INFO,
        "%s from the driver became %s (%s)",
        type(error).__name__,
        type(translated).__name__,
        constraint_name(error) if refused else translated.code,
    )
    return translated


def _translated(error: BaseException, dbapi: Any, refusals: Refusals | None) -> AdmissionError:
    if isinstance(error, DatabaseFileMovedError):
        return StorageError(str(error))
    name = constraint_name(error)
    if refusals and name in refusals:
        return refusals[name]()
    if isinstance(error, dbapi.IntegrityError):
        return StorageError(f"the database refused a write ({name})", constraint=name)
    if isinstance(error, dbapi.OperationalError):
        return StorageError(f"the database is unavailable or busy: {error}")
    if getattr(error, "sqlstate", None) in _PREPARED_ELSEWHERE:
        return StorageError(f"the database refused an operation: {error}; {POOLER_HINT}")
    return StorageError(f"the database refused an operation: {error}")


_PREPARED_ELSEWHERE: Final = ("26000", "42P05")
"""A prepared statement missing (``invalid_sql_statement_name``) or already there
(``duplicate_prepared_statement``) on the server session: what a pooler in transaction mode
does to the driver's prepared statements when admission was not told of it."""
