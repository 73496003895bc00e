"""Where job results are published: a real local target (a SQLite database of its own) and an in-memory one.

Both implement :class:`admission.jobs.Publisher`.  Neither deduplicates: every
``publish`` call appends a publication, so a second publication of a job is
visible to ``read_published`` (and to the tests), never hidden.  The local
target shares no transaction with the job database, which is exactly the
situation recovery after publish exists for (worker contract §4).
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Final

from admission.errors import StorageError
from admission.job_states import PublishedResult

__all__ = ["LocalPublisher", "MemoryPublisher"]

_SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS published_results (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id TEXT NOT NULL,
    attempt_id TEXT NOT NULL,
    result BLOB NOT NULL,
    published_at TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS published_results_job ON published_results (job_id, seq);
"""


class LocalPublisher:
    """A local external target: table ``published_results`` in the SQLite file at ``path``.

    Each publication commits (``synchronous=FULL``) before ``publish`` returns.
    """

    def __init__(self, path: str | Path, *, now: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        self.path = str(path)
        self.now = now
        try:
            with self._connect() as conn:
                conn.executescript(_SCHEMA)
        except sqlite3.Error as exc:
            raise StorageError(f"the publication target {self.path} is unusable: {exc}") from exc

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        return conn

    def publish(self, job_id: str, attempt_id: str, result: bytes) -> None:
        """Append one publication and commit it."""
        try:
            conn = self._connect()
            try:
                conn.execute(
                    "INSERT INTO published_results (job_id, attempt_id, result, published_at)"
                    " VALUES (?, ?, ?, ?)",
                    (job_id, attempt_id, bytes(result), self.now().isoformat()),
                )
            finally:
                conn.close()
        except sqlite3.Error as exc:
            raise StorageError(f"publishing job {job_id!r} failed: {exc}") from exc

    def read_published(self, job_id: str) -> Sequence[PublishedResult]:
        """Every publication of ``job_id``, oldest first."""
        try:
            conn = self._connect()
            try:
                rows = conn.execute(
                    "SELECT job_id, attempt_id, result FROM published_results WHERE job_id = ? ORDER BY seq",
                    (job_id,),
                ).fetchall()
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


class MemoryPublisher:
    """The in-memory target: the same behaviour as :class:`LocalPublisher`, in a list."""

    def __init__(self) -> None:
        self.publications: list[PublishedResult] = []
        self._lock = threading.Lock()

    def publish(self, job_id: str, attempt_id: str, result: bytes) -> None:
        """Append one publication."""
        with self._lock:
            self.publications.append(PublishedResult(job_id, attempt_id, bytes(result)))

    def read_published(self, job_id: str) -> Sequence[PublishedResult]:
        """Every publication of ``job_id``, oldest first."""
        with self._lock:
            return [p for p in self.publications if p.job_id == job_id]
