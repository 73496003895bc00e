"""Where admission's writes and bytes go, for ``bench/admission.py`` (the bytes of each table
and index: :func:`bench._bigdb.relation_bytes`).

- :func:`sqlite_pages`: the pages one call writes to SQLite's write-ahead
  log, by the table or index each belongs to.  A commit appends one frame
  per page its transaction changed, and the commit's ``fsync`` carries
  them all, so the count is what a call costs the disk.
- :func:`column_bytes`: the average stored size of each column of the
  commands' and the events' rows.

Not a script: ``bench/admission.py`` imports it.
"""

from __future__ import annotations

import collections
import sqlite3
import struct
from collections.abc import Callable

from sqlalchemy import Integer
from sqlalchemy.engine import make_url

from admission.sql import workflow_commands, workflow_history_events
from bench._bigdb import fetch_all

_WAL_HEADER, _FRAME_HEADER = 32, 24
"""Bytes of a write-ahead log's header and of each frame's (sqlite.org/fileformat.html, section 4)."""

COLUMN_SAMPLE = 10_000
"""Rows whose columns :func:`column_bytes` measures (the first ones stored)."""


def wal_frames(wal: str) -> list[int]:
    """The page number of every valid frame in the write-ahead log at ``wal``, in order.

    A frame is valid when its salts are the header's: a log restarted after a
    checkpoint keeps older frames behind the new ones until they are overwritten.
    """
    with open(wal, "rb") as f:
        data = f.read()
    if len(data) < _WAL_HEADER:
        return []
    page_size = struct.unpack(">I", data[8:12])[0]
    salts = data[16:24]
    pages = []
    at = _WAL_HEADER
    while at + _FRAME_HEADER + page_size <= len(data):
        if data[at + 8 : at + 16] != salts:
            break
        pages.append(struct.unpack(">I", data[at : at + 4])[0])
        at += _FRAME_HEADER + page_size
    return pages


def sqlite_pages(path: str, fn: Callable[[], None], calls: int) -> dict[str, float]:
    """Pages written to the log per call of ``fn``, by b-tree name, on the SQLite database at ``path``.

    Each call runs right after a ``wal_checkpoint(TRUNCATE)``, so the log
    holds that call's frames only.  A page is named by ``dbstat`` after the
    call (``free or other`` if no b-tree holds it then).
    """
    counted: collections.Counter[str] = collections.Counter()
    conn = sqlite3.connect(path, isolation_level=None, timeout=30)
    try:
        for _ in range(calls):
            busy, _, _ = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
            if busy:
                raise RuntimeError("the log could not be emptied before a call: a reader held it")
            fn()
            owners = dict(conn.execute("SELECT pageno, name FROM dbstat").fetchall())
            counted.update(owners.get(page, "free or other") for page in wal_frames(f"{path}-wal"))
    finally:
        conn.close()
    return {name: count / calls for name, count in counted.most_common()}


def column_bytes(url: str) -> list[tuple[str, str, float]]:
    """(table, column, average stored bytes) of the commands' and the events' columns, over the
    first :data:`COLUMN_SAMPLE` rows of each table.

    PostgreSQL: ``pg_column_size`` (the value as stored, with its length
    header).  SQLite: the value's bytes as a blob (text and blobs; an
    integer column is left out, its record size depends on the value).
    """
    postgres = make_url(url).get_backend_name() == "postgresql"
    measure = "pg_column_size({})" if postgres else "length(CAST({} AS BLOB))"
    queries = []
    for table in (workflow_commands, workflow_history_events):
        names = [c.name for c in table.c if postgres or not isinstance(c.type, Integer)]
        sql = (
            f"SELECT {', '.join('avg(' + measure.format(n) + ')' for n in names)} "
            f"FROM (SELECT * FROM {table.name} LIMIT {COLUMN_SAMPLE}) AS sampled"
        )
        queries.append((table.name, names, sql))
    rows = fetch_all(url, [(sql, ()) for _, _, sql in queries])
    out = []
    for (table_name, names, _), [row] in zip(queries, rows, strict=True):
        out += [(table_name, name, float(size or 0)) for name, size in zip(names, row, strict=True)]
    return out
