"""Where job results are published: a real local target (a SQLite database of its own) and an in-memory one.

Both implement :class:`admission.jobs._values.Publisher`.  Neither deduplicates: every
``publish`` call appends a publication, so a second publication of a job is
visible to ``read_published`` (and to the tests), never hidden.  The local
target shares no transaction with the job database, which is exactly the
situation recovery after publish exists for (worker contract §4).

Both are **fenced** (worker contract §3): a target keeps, per job, the
highest fencing token any owner has written or read with, and refuses a
``publish`` or a fenced ``read_published`` that carries a lower one
(:class:`~admission.errors.JobFencedError`), in the same transaction as the
write.  The database refuses an old owner's writes to the job; this refuses
its late publication.  An owner whose lease lapsed while it was paused
between recording a result and publishing it would otherwise publish after
the next owner's recovery read the target, found nothing and published the
same result again: a second external effect.  With the fence, the next
owner's read raises the job's token at the target first, so the old owner's
publication is refused whenever it arrives after that read, and found by
that read whenever it arrived before.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Final

from admission.errors import JobFencedError, StorageError
from admission.jobs._states import PublishedResult

__all__ = ["LocalPublisher", "refused_publication"]

_SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS published_results (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id TEXT NOT NULL,
    attempt_id TEXT NOT NULL,
    result BLOB NOT NULL,
    published_at TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS published_results_job ON published_results (job_id, seq);
CREATE TABLE IF NOT EXISTS publication_fences (
    job_id TEXT PRIMARY KEY,
    fence INTEGER NOT NULL
);
"""


def refused_publication(job_id: str, fence: int, current: int, action: str) -> JobFencedError:
    """The refusal of a publication or fenced read that carries an older token than one seen."""
    return JobFencedError(
        f"the publication target refused to {action} job {job_id!r} with fencing token {fence}: "
        f"an owner with token {current} has been here since",
        job_id=job_id,
        fence=fence,
        current_fence=current,
        state=None,
    )


_BUSY_SECONDS: Final = 30.0
"""How long a connection to the target waits for another's lock."""


def _write_ahead(conn: sqlite3.Connection) -> None:
    """Put the target in WAL mode (it stays so).

    Two runners opening a new target at once can both hold its read lock while each wants the
    write lock to switch the mode: SQLite then refuses one of them at once, without the busy
    wait (waiting would be a deadlock), and that one asks again once the other is done.
    """
    deadline = time.monotonic() + _BUSY_SECONDS
    while True:
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            # By its code, as admission/sql/_engine.py tells a busy BEGIN IMMEDIATE.
            busy = getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_BUSY
            if not busy or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


class LocalPublisher:
    """A local external target: table ``published_results`` in the SQLite file at ``path``.

    Each publication commits (``synchronous=FULL``) before ``publish`` returns.
    """

    def __init__(self, path: str | Path, *, now: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        self.path = str(path)
        self.now = now
        try:
            conn = self._connect()
            try:
                conn.executescript(_SCHEMA)
            finally:
                conn.close()
        except sqlite3.Error as exc:
            raise StorageError(f"the publication target {self.path} is unusable: {exc}") from exc

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=_BUSY_SECONDS, isolation_level=None)
        try:
            _write_ahead(conn)
            conn.execute("PRAGMA synchronous=FULL")
        except BaseException:
            conn.close()
            raise
        return conn

    @staticmethod
    def _fence(conn: sqlite3.Connection, job_id: str, fence: int | None, action: str) -> None:
        # Inside the caller's BEGIN IMMEDIATE: the check and the raise are one step.
        if fence is None:
            return
        row = conn.execute("SELECT fence FROM publication_fences WHERE job_id = ?", (job_id,)).fetchone()
        if row is not None and int(row[0]) > fence:
            raise refused_publication(job_id, fence, int(row[0]), action)
        if row is None or int(row[0]) < fence:
            conn.execute(
                "INSERT INTO publication_fences (job_id, fence) VALUES (?, ?)"
                " ON CONFLICT (job_id) DO UPDATE SET fence = excluded.fence",
                (job_id, fence),
            )

    def publish(self, job_id: str, attempt_id: str, result: bytes, *, fence: int | None = None) -> None:
        """Append one publication and commit it; with ``fence``, only if no newer owner was here."""
        try:
            conn = self._connect()
            try:
                conn.execute("BEGIN IMMEDIATE")
                try:
                    self._fence(conn, job_id, fence, "publish")
                    conn.execute(
                        "INSERT INTO published_results (job_id, attempt_id, result, published_at)"
                        " VALUES (?, ?, ?, ?)",
                        (job_id, attempt_id, bytes(result), self.now().isoformat()),
                    )
                except BaseException:
                    conn.execute("ROLLBACK")
                    raise
                conn.execute("COMMIT")
            finally:
                conn.close()
        except sqlite3.Error as exc:
            raise StorageError(f"publishing job {job_id!r} failed: {exc}") from exc

    def read_published(self, job_id: str, *, fence: int | None = None) -> Sequence[PublishedResult]:
        """Every publication of ``job_id``, oldest first.

        With ``fence`` the read also raises the job's token at the target, so
        that an older owner's publication can no longer land after it.
        """
        try:
            conn = self._connect()
            try:
                conn.execute("BEGIN IMMEDIATE" if fence is not None else "BEGIN")
                try:
                    self._fence(conn, job_id, fence, "read")
                    rows = conn.execute(
                        "SELECT job_id, attempt_id, result FROM published_results"
                        " WHERE job_id = ? ORDER BY seq",
                        (job_id,),
                    ).fetchall()
                except BaseException:
                    conn.execute("ROLLBACK")
                    raise
                conn.execute("COMMIT")
            finally:
                conn.close()
        except sqlite3.Error as exc:
            raise StorageError(f"reading the publications of job {job_id!r} failed: {exc}") from exc
        return [PublishedResult(str(j), str(a), bytes(r)) for j, a, r in rows]

    def count(self) -> int:
        """How many publications the target holds, of every job."""
        conn = self._connect()
        try:
            return int(conn.execute("SELECT count(*) FROM published_results").fetchone()[0])
        finally:
            conn.close()
