"""The benchmark's count of pages written to SQLite's log (``bench/_pages.py``).

``bench/admission.py`` reports, b-tree by b-tree, the pages each kind of
admission writes; docs/performance.md reasons from that table.  These tests
hold the reading of the log on real SQLite files: a transaction's frames
name the pages it changed, and frames left behind by a restarted log are
not counted again.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench._pages import sqlite_pages, wal_frames


@pytest.fixture
def db(tmp_path: Path) -> Iterator[tuple[str, sqlite3.Connection]]:
    path = str(tmp_path / "pages.sqlite3")
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA wal_autocheckpoint=0")  # the tests checkpoint themselves
    conn.execute("CREATE TABLE t (x INTEGER)")
    conn.execute("CREATE TABLE u (x INTEGER)")
    yield path, conn
    conn.close()


def _root(conn: sqlite3.Connection, name: str) -> int:
    (page,) = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = ?", (name,)).fetchone()
    return int(page)


def test_a_transaction_s_frames_are_the_pages_it_changed(db: tuple[str, sqlite3.Connection]) -> None:
    path, conn = db
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    assert wal_frames(f"{path}-wal") == []
    conn.execute("INSERT INTO t VALUES (1)")
    assert wal_frames(f"{path}-wal") == [_root(conn, "t")]
    conn.execute("BEGIN")
    conn.execute("INSERT INTO t VALUES (2)")
    conn.execute("INSERT INTO u VALUES (2)")
    conn.execute("COMMIT")
    assert sorted(wal_frames(f"{path}-wal")[1:]) == sorted([_root(conn, "t"), _root(conn, "u")])


def test_frames_a_restarted_log_left_behind_are_not_counted(db: tuple[str, sqlite3.Connection]) -> None:
    path, conn = db
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    for n in range(5):
        conn.execute("INSERT INTO u VALUES (?)", (n,))
    assert len(wal_frames(f"{path}-wal")) == 5
    # A RESTART checkpoint keeps the file; the next write starts the log over, with new salts,
    # over the first frame only: the four after it are the old log's.
    conn.execute("PRAGMA wal_checkpoint(RESTART)")
    conn.execute("INSERT INTO t VALUES (1)")
    assert Path(f"{path}-wal").stat().st_size > 2 * 4096
    assert wal_frames(f"{path}-wal") == [_root(conn, "t")]


def test_pages_per_call_are_named_by_their_b_tree(db: tuple[str, sqlite3.Connection]) -> None:
    path, conn = db
    conn.execute("CREATE INDEX t_x ON t (x)")
    calls = iter(range(100))

    def insert() -> None:
        conn.execute("INSERT INTO t VALUES (?)", (next(calls),))

    assert sqlite_pages(path, insert, 3) == {"t": 1.0, "t_x": 1.0}
