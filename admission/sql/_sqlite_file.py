"""A SQLite file that its path no longer names: refused, never acknowledged.

SQLite opens its file once and keeps it open.  A file deleted, replaced
(``os.replace``, a restore from backup) or moved away under a running
process stays open, and commits keep going into it, where a restart, which
opens whatever the path names then, will never look.  In WAL mode the same
holds for the ``-wal`` file, which holds the latest commits until a
checkpoint copies them into the database file.

Each connection of an admission engine remembers what it opened, as
``(st_dev, st_ino)``: the database file through the path as given (so a
symlink pointed elsewhere counts), and the write-ahead log beside the file
SQLite resolved.  It checks them:

- when an admission write transaction begins (the database file: refused
  before anything is written, in the common case);
- after every COMMIT returns, before the caller hears of success (both
  files).  This is the check that makes the rule hold: a file taken away
  before the commit finished is seen, and the caller gets
  :class:`DatabaseFileMovedError` (a retryable ``StorageError`` at the
  boundary) instead of an acknowledgement.  What was committed went into
  the file that was taken away; a retry finds it only if that file comes
  back;
- after the unlocked receipt read found a receipt, before it is answered
  (``SqlStore.read_receipts``), so that a retry is never answered from a
  file a restart will not open.

The engine remembers the database file its first connection opened and
opens no other: a new connection (after a failed one was closed, or as the
pool grows) to a path that names another file, or none, is refused before
SQLite opens it, so a deleted database is never recreated empty.
``Engine.dispose()`` (``SqlStore.dispose()``) forgets it: the next
connection opens, and is bound to, what the path names then.  A file moved
away and back is the same file (its connections keep its inode, which
therefore cannot be given to another file): it is used again.

The checks are ``os.stat`` calls (one when a write begins, two after a
commit, two after a read that found a receipt); ``docs/performance.md``
gives their cost.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from typing import Any, Final

__all__ = ["DatabaseFileMovedError", "FileGuard", "guarded_connection", "verify_file"]

FileIdentity = tuple[int, int]
"""``(st_dev, st_ino)``: which file a path names."""

_CONSEQUENCE: Final = (
    "nothing written through it is acknowledged; dispose of the engine (or restart the process) "
    "to open what the path names now"
)


class DatabaseFileMovedError(sqlite3.OperationalError):
    """The SQLite file a connection has open is no longer the file its path names.

    A driver error (an ``OperationalError``), so that every store's boundary
    translates it, as any unavailable database, into a retryable
    :class:`~admission.errors.StorageError` and closes the connection.
    """


def _identity(path: str) -> FileIdentity | None:
    try:
        status = os.stat(path)
    except OSError:
        # Gone, or no longer reachable: either way not provably the same file.
        return None
    return (status.st_dev, status.st_ino)


def _moved(path: str, what: str) -> DatabaseFileMovedError:
    return DatabaseFileMovedError(
        f"the SQLite {what} {path} is no longer the file this engine opened; {_CONSEQUENCE}"
    )


class FileGuard:
    """The database file one engine is bound to, and the connection class that checks it.

    One per engine: ``connection_class`` is given to the driver as its
    connection ``factory``; :meth:`forget` is called when the engine is
    disposed.
    """

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._identity: FileIdentity | None = None

    def forget(self) -> None:
        """Bind the engine to what the path names when its next connection opens."""
        with self._mutex:
            self._identity = None

    def _admit(self, path: str, before: FileIdentity | None, opened: FileIdentity | None) -> None:
        with self._mutex:
            if opened is None or (before is not None and before != opened):
                # Gone, or replaced while SQLite opened it: no telling which file it has.
                raise _moved(path, "database file")
            if self._identity is None:
                self._identity = opened
            elif opened != self._identity:
                raise _moved(path, "database file")

    def _before_open(self, path: str) -> FileIdentity | None:
        before = _identity(path)
        with self._mutex:
            if self._identity is not None and before != self._identity:
                raise _moved(path, "database file")
        return before

    def connection_class(self, base: type[sqlite3.Connection] | None = None) -> type[sqlite3.Connection]:
        """A :class:`GuardedConnection` bound to this guard (on ``base``, a caller's own factory)."""
        bases: tuple[type, ...] = (GuardedConnection,) if base is None else (GuardedConnection, base)
        return type("GuardedConnection", bases, {"_guard": self})


class GuardedConnection(sqlite3.Connection):
    """A ``sqlite3`` connection that refuses to acknowledge a commit into a file its path no longer names."""

    _guard: FileGuard

    def __init__(self, database: Any, *args: Any, **kwargs: Any) -> None:
        self._path: str | None = None
        self._wal: str | None = None
        self._identity: FileIdentity | None = None
        self._wal_identity: FileIdentity | None = None
        uri = bool(kwargs.get("uri", False))
        named = os.fsdecode(database) if isinstance(database, (str, bytes, os.PathLike)) else ""
        path = None if uri or named in ("", ":memory:") else os.path.abspath(named)
        before = None if path is None else self._guard._before_open(path)
        super().__init__(database, *args, **kwargs)
        try:
            if path is None:
                # A URI names its file its own way: take the file SQLite resolved.
                path = self._main_file()
                before = None if path is None else _identity(path)
            if path is not None:
                opened = _identity(path)
                self._guard._admit(path, before, opened)
                self._path, self._identity = path, opened
        except BaseException:
            self.close()
            raise

    def _main_file(self) -> str | None:
        for _, name, file in self.execute("PRAGMA database_list").fetchall():
            if name == "main":
                return str(file) or None  # "" for a temporary or in-memory database
        return None

    def adopt_journal(self, wal: bool) -> None:
        """Remember the write-ahead log this connection opened (``wal``: the journal mode is WAL)."""
        if self._path is None or not wal:
            return
        # Beside the file SQLite resolved (through any symlink), where SQLite puts it.
        main = self._main_file()
        self._wal = None if main is None else f"{main}-wal"
        # A new database has no log until its first write; it is recorded at the first check then.
        self._wal_identity = None if self._wal is None else _identity(self._wal)

    def check_file(self) -> None:
        """Raise :class:`DatabaseFileMovedError` if the path no longer names the database file opened."""
        path = self._path
        if path is not None and _identity(path) != self._identity:
            raise _moved(path, "database file")

    def check_files(self) -> None:
        """:meth:`check_file`, and the same for the write-ahead log."""
        self.check_file()
        wal = self._wal
        if wal is None:
            return
        found = _identity(wal)
        if self._wal_identity is None:
            self._wal_identity = found
        elif found != self._wal_identity:
            raise _moved(wal, "write-ahead log")

    def commit(self) -> None:
        """Commit, then check that the commit went into the files the paths name (see the module)."""
        super().commit()
        self.check_files()


def guarded_connection(dbapi_connection: object) -> GuardedConnection | None:
    """The :class:`GuardedConnection` under a driver connection: itself, or the ``sqlite3``
    connection aiosqlite runs in its thread, under SQLAlchemy's adapter; ``None`` for any other."""
    if isinstance(dbapi_connection, GuardedConnection):
        return dbapi_connection
    # SQLAlchemy's adapter of an asyncio driver holds the driver's connection;
    # aiosqlite's holds the sqlite3 connection as ``_conn`` (ValueError once closed).
    driver = getattr(dbapi_connection, "driver_connection", None)
    try:
        inner = getattr(driver, "_conn", None)
    except ValueError:
        return None
    return inner if isinstance(inner, GuardedConnection) else None


def verify_file(dbapi_connection: object) -> None:
    """:meth:`GuardedConnection.check_files` of a driver connection, if it is one (no-op otherwise)."""
    guarded = guarded_connection(dbapi_connection)
    if guarded is not None:
        guarded.check_files()
