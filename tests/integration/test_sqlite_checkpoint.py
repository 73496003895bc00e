"""SQLite's checkpoint interval on admission's engines: every SQLITE_WAL_AUTOCHECKPOINT pages of log.

A commit copies the write-ahead log into the database file once the log
holds that many pages (SQLite's own default is 1,000).  The log is then
written again from its start, so its file stops growing: its size shows
where the checkpoints fell.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from sqlalchemy import Engine, text

from admission.sql import SQLITE_WAL_AUTOCHECKPOINT, create_admission_engine, create_async_admission_engine
from tests.support.backends import SQL_BACKENDS

pytestmark = pytest.mark.skipif("sqlite" not in SQL_BACKENDS, reason="ADMISSION_TEST_BACKEND excludes SQLite")

ROWS_PER_COMMIT = 100
"""Rows of a page each (a 3,000-byte blob on a 4 KiB page) per transaction."""


def _write_pages(engine: Engine, pages: int, start: int) -> int:
    """Commit rows of about a page each, ``ROWS_PER_COMMIT`` a transaction; the next row's number."""
    n = start
    while n < start + pages:
        with engine.begin() as conn:
            conn.execute(
                text("INSERT INTO filler (n, body) VALUES (:n, randomblob(3000))"),
                [{"n": n + i} for i in range(ROWS_PER_COMMIT)],
            )
        n += ROWS_PER_COMMIT
    return n


def test_the_log_is_checkpointed_at_admissions_interval_and_no_commit_is_lost(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.sqlite3"
    engine = create_admission_engine(f"sqlite:///{path}")
    wal = Path(f"{path}-wal")
    try:
        with engine.connect() as conn:
            assert conn.execute(text("PRAGMA wal_autocheckpoint")).scalar() == SQLITE_WAL_AUTOCHECKPOINT
            assert conn.execute(text("PRAGMA page_size")).scalar() == 4096
        with engine.begin() as conn:
            conn.execute(text("CREATE TABLE filler (n INTEGER PRIMARY KEY, body BLOB NOT NULL)"))
        # Three times SQLite's own interval: with it, the log would have been checkpointed
        # and restarted at about 1,000 pages, and its file would have stopped near 4 MB.
        written = _write_pages(engine, 3_000, 0)
        assert wal.stat().st_size > 3_000 * 4096
        # Past admission's interval: the log restarted, its file stopped growing near it.
        written = _write_pages(engine, SQLITE_WAL_AUTOCHECKPOINT + 2_000, written)
        most = (SQLITE_WAL_AUTOCHECKPOINT + 2 * ROWS_PER_COMMIT + 10) * (4096 + 24)
        assert wal.stat().st_size < most
        with engine.connect() as conn:
            assert conn.execute(text("SELECT count(*), max(n) FROM filler")).one() == (written, written - 1)
    finally:
        engine.dispose()
    # Every commit is in the files a new process opens.
    reopened = create_admission_engine(f"sqlite:///{path}")
    try:
        with reopened.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM filler")).scalar() == written
    finally:
        reopened.dispose()
    assert os.path.getsize(path) > written * 3000


def test_the_async_engine_checkpoints_at_the_same_interval(tmp_path: Path) -> None:
    async def main() -> None:
        engine = create_async_admission_engine(f"sqlite:///{tmp_path / 'async.sqlite3'}")
        try:
            async with engine.connect() as conn:
                found = (await conn.execute(text("PRAGMA wal_autocheckpoint"))).scalar()
            assert found == SQLITE_WAL_AUTOCHECKPOINT
        finally:
            await engine.dispose()

    asyncio.run(main())
