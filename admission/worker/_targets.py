"""The target port of the durable worker, and a real local target on SQLite (worker contract §2, §5).

A target is the external system a record is written to.  The worker speaks
to it only through :class:`Target`: ``write`` raises
:class:`~admission.errors.BeforeWriteError` only when the request provably
never left (the one error that permits another send); ``read_back`` answers
found / missing / unknown for one ``write_id``; ``observe_status`` reads the
latest status snapshots of confirmed records.

:class:`SqliteTarget` is a separate SQLite database whose table has
``write_id`` UNIQUE, so a second write of one record can never hide: it is
refused and counted (:meth:`SqliteTarget.duplicate_attempts`).
:class:`admission.testing.FaultyTarget` wraps a target with the faults of contract §6.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal, Protocol

from admission.intent._encoding import canonical_decode, canonical_encode

__all__ = [
    "DuplicateWriteError",
    "Readback",
    "SqliteTarget",
    "StatusRead",
    "Target",
    "TargetRecord",
]

ReadKind = Literal["found", "missing", "unknown"]


@dataclass(frozen=True)
class TargetRecord:
    """What the worker writes: the durable ``write_id`` and the canonical content."""

    write_id: str
    tenant: str
    source_key: str
    content: bytes


@dataclass(frozen=True)
class Readback:
    """The target's answer about one ``write_id``.

    ``found`` carries the stored ``write_id`` and content; ``missing`` means the
    target positively has no such row; ``unknown`` (a failed or ambiguous
    read) says nothing either way and must change nothing (contract §2).
    """

    kind: ReadKind
    write_id: str
    content: bytes | None = None
    detail: str = ""


@dataclass(frozen=True)
class StatusRead:
    """The target's status of one confirmed record: ``found`` with a snapshot,
    ``missing``, or ``unknown`` (the read failed; contract §5)."""

    kind: ReadKind
    write_id: str
    snapshot: object = None
    detail: str = ""


class Target(Protocol):
    """The adapter port the worker writes through."""

    def write(self, record: TargetRecord) -> None:
        """Write the record; raise BeforeWriteError only if it was provably never dispatched."""
        ...

    def read_back(self, write_id: str) -> Readback:
        """Read back what the target holds for ``write_id``."""
        ...

    def observe_status(self, write_ids: Sequence[str]) -> list[StatusRead]:
        """The latest status of each record, in the order asked."""
        ...


class DuplicateWriteError(RuntimeError):
    """The target already holds this ``write_id``: a second send reached it."""


_SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS target_rows (
    write_id TEXT NOT NULL UNIQUE,
    tenant TEXT NOT NULL,
    source_key TEXT NOT NULL,
    content BLOB NOT NULL,
    status BLOB
);
CREATE TABLE IF NOT EXISTS duplicate_attempts (
    write_id TEXT NOT NULL
);
"""


class SqliteTarget:
    """A real local target: its own SQLite file, WAL, ``synchronous=FULL``.

    Its ``status`` column is what :meth:`observe_status` reports; tests and
    operators change it with :meth:`set_status` and :meth:`delete`.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._conn: sqlite3.Connection | None = None
        self._pid = os.getpid()
        with self._connect() as conn:
            conn.executescript(_SCHEMA)

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        # One connection, kept open as a real adapter keeps its session (and
        # reopened in a forked child).  Autocommit: every statement is its
        # own durable transaction.
        if self._conn is None or self._pid != os.getpid():
            conn = sqlite3.connect(self.path, timeout=30, isolation_level=None, check_same_thread=False)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")
            self._conn, self._pid = conn, os.getpid()
        yield self._conn

    def close(self) -> None:
        """Close the target's connection (it reopens on the next call)."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def write(self, record: TargetRecord) -> None:
        """Insert the row and commit; a second row for the same ``write_id`` is refused and counted."""
        with self._connect() as conn:
            try:
                conn.execute(
                    "INSERT INTO target_rows (write_id, tenant, source_key, content) VALUES (?, ?, ?, ?)",
                    (record.write_id, record.tenant, record.source_key, record.content),
                )
            except sqlite3.IntegrityError as exc:
                conn.execute("INSERT INTO duplicate_attempts (write_id) VALUES (?)", (record.write_id,))
                raise DuplicateWriteError(f"the target already holds write_id {record.write_id}") from exc

    def read_back(self, write_id: str) -> Readback:
        """``found`` with the stored content, or ``missing``; a failing read is ``unknown``."""
        try:
            with self._connect() as conn:
                row = conn.execute(
                    "SELECT write_id, content FROM target_rows WHERE write_id = ?", (write_id,)
                ).fetchone()
        except sqlite3.Error as exc:
            return Readback("unknown", write_id, detail=f"read failed: {exc}")
        if row is None:
            return Readback("missing", write_id)
        return Readback("found", str(row[0]), bytes(row[1]))

    def observe_status(self, write_ids: Sequence[str]) -> list[StatusRead]:
        """The stored status snapshot of each row (``None`` until one is set), or ``missing``."""
        try:
            with self._connect() as conn:
                found = {
                    str(w): s
                    for w, s in conn.execute(
                        f"SELECT write_id, status FROM target_rows WHERE write_id IN "
                        f"({', '.join('?' * len(write_ids))})",
                        list(write_ids),
                    )
                }
        except sqlite3.Error as exc:
            return [StatusRead("unknown", w, detail=f"read failed: {exc}") for w in write_ids]
        reads = []
        for write_id in write_ids:
            if write_id not in found:
                reads.append(StatusRead("missing", write_id))
            else:
                raw = found[write_id]
                reads.append(StatusRead("found", write_id, None if raw is None else canonical_decode(raw)))
        return reads

    def set_status(self, write_id: str, snapshot: object) -> None:
        """Set the status snapshot the target reports for ``write_id``."""
        with self._connect() as conn:
            conn.execute(
                "UPDATE target_rows SET status = ? WHERE write_id = ?", (canonical_encode(snapshot), write_id)
            )

    def delete(self, write_id: str) -> None:
        """Remove a row, as an external system might."""
        with self._connect() as conn:
            conn.execute("DELETE FROM target_rows WHERE write_id = ?", (write_id,))

    def write_ids(self) -> list[str]:
        """Every ``write_id`` the target holds."""
        with self._connect() as conn:
            return [str(r[0]) for r in conn.execute("SELECT write_id FROM target_rows ORDER BY rowid")]

    def duplicate_attempts(self) -> int:
        """How many writes reached the target for a ``write_id`` it already held."""
        with self._connect() as conn:
            return int(conn.execute("SELECT count(*) FROM duplicate_attempts").fetchone()[0])
