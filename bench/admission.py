"""Admission throughput beside the raw-driver floor, every figure of issue #18 in one run.

Each measurement beside its floor measured in the same run:

1. **fresh** admissions/s: ``AdmissionService.admit_signal`` with a new
   ``request_id`` each call (one transaction each), round-robin over 16
   instances with an open run.  Floor: the raw driver (``sqlite3`` /
   psycopg 3, no SQLAlchemy) doing one transaction of two INSERTs per
   admission, a command-like row and an event-like row with the same values
   admission writes, into tables built from the same column, primary-key,
   unique and index definitions as ``workflow_commands`` and
   ``workflow_history_events`` (no foreign keys), on the same database.
   Two payloads, each with its own floor: a small signal (a fixed 4-field
   dict) and the issue's ~130-byte command (``{"cmd": "deploy.service",
   "args_digest": <64 hex>, "by": "svc-a", "n": i}``, a new ``n`` each call).
2. **retained** lookups/s: ``admit_signal`` retrying one of 256 existing keys
   with the same intent, which answers with the retained receipt.  Floor: a
   raw point ``SELECT *`` of that command row by
   (instance_id, command_type, request_id), autocommit.  Also **after a
   commit**: each retry (and each floor SELECT) timed alone, after another
   connection's untimed commit, as in a harness that alternates writes with
   retries (SQLite then reads the file again).
   Fresh and retained also run the **async path**: ``AsyncAdmissionService``
   over ``admission.aio.open_store`` on the same database, awaited in a loop
   on one event loop; its goal is at most 1.3x the synchronous path's time.
3. **PostgreSQL with 1, 4 and 8 processes** doing fresh admissions, each
   process on its own 16 instances, and the same for the floor: total
   admissions/s, admission ÷ floor at the same concurrency, and scaling.
4. **mixed** (PostgreSQL): streams of keyed admissions of which 0-100% are
   retries of recent keys, in each way a keyed admission can read its key
   (in the lock's round trip, first, and as the service chooses); the ratio
   is to reading first.
5. **batch**: ``AdmissionService.admit_many`` with 32 commands per call,
   commands/s beside single ``admit_signal`` calls (and the async twin when
   there is one); skipped where the tree has no ``admit_many``.
6. **growth**: a database loaded with ``--big-receipts`` receipts (default
   1,000,000, 100 per instance, the command payload) beside an empty one,
   fresh and retained on each with the floor on each (the floor's tables
   filled likewise), µs per operation and big ÷ empty; the build's time;
   bytes per receipt; and on PostgreSQL the WAL per fresh admission as an
   outside observer sees it: ``CHECKPOINT``, ``--wal-admissions`` fresh
   admissions over as many loaded instances, ``pg_current_wal_lsn()``
   difference ÷ calls, then the same for the floor.  The rows are made by
   the service and loaded through the adapter's own statements and
   converters (``bench/_bigdb.py``), then a sample is read back through the
   service.
7. **http**: ``bench/http.py`` run as a subprocess with the same options,
   its output included.

Durability is the same for both sides: SQLite in WAL with
``synchronous=FULL`` (a file in a temporary directory), PostgreSQL with
``fsync=on``, ``synchronous_commit=on``, ``full_page_writes=on`` (the server
this starts when no ``--pg-url`` is given; the tests' server turns them off).

Candidates are interleaved: each round runs admission and its floor for
``--seconds`` each, the order alternating every round, so drift of the
machine affects both alike.  The tables report medians over the rounds.
Beside the rates they give CPU per operation, of the benchmark process(es)
(Python, SQLAlchemy, the driver; SQLite runs in-process) and of the
PostgreSQL server (its postmaster's process tree, when this started it), and
for several processes the whole machine's CPU busy fraction, which includes
anything else running.  Header notes give the SQL statements per admission
and, on PostgreSQL, the WAL bytes each kind of operation writes.  The last
lines judge every goal of the issue by this run's numbers.

Usage: ``python bench/admission.py [--seconds N] [--rounds N] [--markdown]
[--backend sqlite|postgresql|all] [--pg-url URL] [--only PARTS] [--skip PARTS]
[--big-receipts N] [--wal-admissions N]``; parts are main, processes,
mixed, batch, growth and http.  ``--pg-url`` must name a scratch database: admission's
schema is upgraded to the head there and the benchmark writes rows into it
(and creates ``bench_*`` tables); the growth part needs a server of its own
(it creates databases), so it runs only without ``--pg-url``.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import importlib
import itertools
import multiprocessing
import os
import platform
import random
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

# This file is bench/admission.py: its own directory must not shadow the package.
_HERE = Path(__file__).resolve().parent
ROOT = _HERE.parent
sys.path[:] = [p for p in sys.path if Path(p or os.getcwd()).resolve() != _HERE]
sys.path.insert(0, str(ROOT))

import sqlalchemy  # noqa: E402
from sqlalchemy import Column, Index, Integer, MetaData, Table, UniqueConstraint  # noqa: E402
from sqlalchemy.engine import make_url  # noqa: E402

import admission  # noqa: E402
import admission.sql  # noqa: E402
from admission.aio import AsyncAdmissionService, AsyncStore, open_store  # noqa: E402
from admission.receipts import (  # noqa: E402
    AdmissionService,
    Decision,
)
from admission.receipts._service import RETRY_SHARE  # noqa: E402
from admission.sql import (  # noqa: E402
    SqlStore,
    create_admission_engine,
    normalize_url,
    upgrade,
    workflow_commands,
    workflow_history_events,
)
from admission.sql._engine import SQLITE_PRAGMAS  # noqa: E402
from bench import _bigdb, _pages  # noqa: E402
from bench._bigdb import (  # noqa: E402
    COMMAND,
    Instance,
    command_arguments,
    fetch_all,
    pg_conninfo,
)

NAMESPACE = "bench"
SIGNAL = "payment_received"
ARGUMENTS = {"order_id": "ord-2026-000417", "amount": 4250, "currency": "EUR", "final": True}
INSTANCES = 16
RETAINED_KEYS = 256  # per subject; --keys
PROCESSES = (1, 4, 8)
FLOOR_COMMANDS = "bench_floor_commands"
FLOOR_EVENTS = "bench_floor_events"
TOUCH = "bench_touch"  # a one-row table another connection commits to (Subject.after_commit)
DURABLE = {"fsync": "on", "synchronous_commit": "on", "full_page_writes": "on"}

_COMMAND_COLUMNS = [c.name for c in workflow_commands.columns]
_EVENT_COLUMNS = ["tx_id", "namespace", "instance_id", "run_id", "event_type", "command_id", "update_id",
                  "payload", "recorded_at"]  # fmt: skip


def floor_metadata() -> MetaData:
    """Tables with the columns, keys and indexes of admission's two written tables, no foreign keys."""
    metadata = MetaData()
    for source, name in ((workflow_commands, FLOOR_COMMANDS), (workflow_history_events, FLOOR_EVENTS)):
        table = Table(
            name,
            metadata,
            *[
                Column(
                    c.name,
                    c.type,
                    primary_key=c.primary_key,
                    nullable=c.nullable,
                    autoincrement=c.autoincrement,
                )
                for c in source.columns
            ],
            # The table's own options too: admission's event log is AUTOINCREMENT
            # on SQLite (positions are never reused), which costs a write of
            # sqlite_sequence in every transaction.
            **source.dialect_kwargs,
        )
        for constraint in source.constraints:
            if isinstance(constraint, UniqueConstraint):
                table.append_constraint(UniqueConstraint(*[c.name for c in constraint.columns]))
        for index in source.indexes:
            columns = [table.c[c.name] for c in index.columns]
            Index(f"{name}_{'_'.join(c.name for c in columns)}", *columns, unique=bool(index.unique))
    Table(TOUCH, metadata, Column("id", Integer, primary_key=True), Column("n", Integer))
    return metadata


def prepare_database(url: str) -> None:
    """Upgrade admission's schema to the head and (re)create the floor tables."""
    engine = create_admission_engine(url)
    try:
        upgrade(engine)
        metadata = floor_metadata()
        with engine.begin() as conn:
            metadata.drop_all(conn)
            metadata.create_all(conn)
            conn.execute(metadata.tables[TOUCH].insert().values(id=1, n=0))
    finally:
        engine.dispose()


# --------------------------------------------------------------------------
# One process's candidates on one database
# --------------------------------------------------------------------------


_SEQUENCE_BASES = itertools.count(1)


class Subject:
    """Admission and its raw-driver floor on one database, for one process.

    ``tag`` keeps the workflow ids of each process (and each run) apart.
    ``payload`` is the signal's arguments: ``signal`` (a small dict, fixed) or
    ``command`` (issue #18's ~130-byte command, a new ``n`` each call).
    ``loaded`` are instances of a loaded database to admit to (otherwise
    ``instances`` new ones are started) and ``keys`` loaded keys to retry
    (otherwise ``RETAINED_KEYS`` are admitted first).
    """

    def __init__(
        self,
        backend: str,
        url: str,
        tag: str,
        *,
        retained: bool = True,
        asynchronous: bool | None = None,
        payload: str = "signal",
        instances: int = INSTANCES,
        loaded: Sequence[Instance] | None = None,
        keys: Sequence[Instance] | None = None,
    ) -> None:
        self.backend = backend
        self.tag = tag
        self.url = url
        self.store = SqlStore.open(url)
        self.service = AdmissionService(self.store)
        self.name: str = SIGNAL if payload == "signal" else COMMAND
        self.arguments: Callable[[int], object] = command_arguments
        if payload == "signal":
            self.arguments = lambda n: ARGUMENTS
        if loaded is None:
            self.workflows = [f"{tag}-{k}" for k in range(instances)]
            runs = [self.service.start_run(NAMESPACE, w) for w in self.workflows]
            self.run_ids = [r.run_id for r in runs]
            self.instance_ids = []
            for w in self.workflows:
                found = self.store.find_instance(NAMESPACE, w)
                assert found is not None
                self.instance_ids.append(found.id)
        else:
            self.workflows = [i.workflow_id for i in loaded]
            self.run_ids = [i.run_id for i in loaded]
            self.instance_ids = [i.instance_id for i in loaded]
        self.count = len(self.workflows)
        self._fresh = itertools.count()
        self._floor = itertools.count()
        self._lookups = itertools.count()
        self._point = itertools.count()
        # The floor's own command sequences, in memory, apart from every other subject's on loaded instances.
        self._sequence = [next(_SEQUENCE_BASES) * 10**7] * self.count
        # Bytes of the sizes admission writes, taken from a real admission.
        probe = self.service.admit_signal(
            NAMESPACE, self.workflows[0], self.name, self.arguments(0), request_id=f"{tag}-probe"
        )
        assert probe.decision is Decision.FRESH
        ((row, _),) = self.store.read_receipts(
            NAMESPACE, self.workflows[0], "signal", [admission.receipt_token("signal", f"{tag}-probe")]
        )
        self._context, self._arguments = row.context, row.arguments
        self._digests = (row.intent_digest, row.arguments_digest, row.intent_encoding)
        # The payload as stored (an admission event's is compact, admission/sql/_compact.py).
        stored = "SELECT payload FROM workflow_history_events WHERE command_id = " + (
            "%s" if backend == "postgresql" else "?"
        )
        [[(payload,)]] = fetch_all(url, [(stored, [probe.command_id])])
        self._payload = bytes(payload)
        self.payload_bytes = len(row.arguments or b"")
        # workflow, key, instance id, token, arguments
        self.retained: list[tuple[str, str, str, str, object]] = []
        if retained and keys is not None:
            self.retained = [
                (k.workflow_id, k.key, k.instance_id, admission.receipt_token("signal", k.key),
                 command_arguments(k.key_n))
                for k in keys
            ]  # fmt: skip
        elif retained:
            for i in range(RETAINED_KEYS):
                k = i % self.count
                key = f"{tag}-retained-{i}"
                self.service.admit_signal(
                    NAMESPACE, self.workflows[k], self.name, self.arguments(i), request_id=key
                )
                self.retained.append(
                    (self.workflows[k], key, self.instance_ids[k], admission.receipt_token("signal", key),
                     self.arguments(i))
                )  # fmt: skip
        if self.retained:
            workflow, key, _, _, arguments = self.retained[0]
            again = self.service.admit_signal(NAMESPACE, workflow, self.name, arguments, request_id=key)
            assert again.decision is Decision.RETAINED, again
        self._connect_raw(url)
        self.loop: asyncio.AbstractEventLoop | None = None
        if retained if asynchronous is None else asynchronous:
            self.loop = asyncio.new_event_loop()
            self.async_store: AsyncStore = self.loop.run_until_complete(open_store(url))
            self.async_service = AsyncAdmissionService(self.async_store)
            self._async_fresh = itertools.count()

    # -- the raw driver ----------------------------------------------------

    def _connect_raw(self, url: str) -> None:
        placeholders = ", ".join(["?" if self.backend == "sqlite" else "%s"] * len(_COMMAND_COLUMNS))
        self._insert_command = (
            f"INSERT INTO {FLOOR_COMMANDS} ({', '.join(_COMMAND_COLUMNS)}) VALUES ({placeholders})"
        )
        p = "?" if self.backend == "sqlite" else "%s"
        txid = "0" if self.backend == "sqlite" else "txid_current()"
        self._insert_event = (
            f"INSERT INTO {FLOOR_EVENTS} ({', '.join(_EVENT_COLUMNS)}) "
            f"VALUES ({txid}, {', '.join([p] * (len(_EVENT_COLUMNS) - 1))}) RETURNING position, tx_id"
        )
        self._select = (
            f"SELECT * FROM workflow_commands "
            f"WHERE instance_id = {p} AND command_type = {p} AND request_id = {p}"
        )
        if self.backend == "sqlite":
            path = make_url(url).database
            assert path
            # The durability, lock and checkpoint settings admission's engine uses (its own list);
            # autocommit mode.  A connection with SQLite's own checkpoint interval would checkpoint
            # the log for every connection on the file, so the toucher takes them too, then
            # switches its syncs off.
            self.raw = sqlite3.connect(path, timeout=30, isolation_level=None)
            self.touch = sqlite3.connect(path, timeout=30, isolation_level=None)
            for pragma in ("journal_mode=WAL", *SQLITE_PRAGMAS):
                self.raw.execute(f"PRAGMA {pragma}")
                self.touch.execute(f"PRAGMA {pragma}")
            self.touch.execute("PRAGMA synchronous=OFF")
            self.raw_read = self.raw
        else:
            import psycopg

            self.raw = psycopg.connect(**pg_conninfo(url))  # a transaction per admission
            self.raw_read = psycopg.connect(**pg_conninfo(url), autocommit=True)
            self.touch = psycopg.connect(**pg_conninfo(url), options="-c synchronous_commit=off")
        self._raw_cursor = self.raw.cursor()
        self._read_cursor = self.raw_read.cursor()
        self._touch = self.touch.cursor()
        self._touch_sql = f"UPDATE {TOUCH} SET n = n + 1"

    def settle(self) -> None:
        """On PostgreSQL: ``ANALYZE``, then new sessions for the stores, so each statement measured
        is planned for the tables as they are now, as in a service that has run a while.

        A new database's first plans were made for nearly empty tables, and a
        part that writes thousands of rows a second outgrows them before the
        store plans again (``REPLAN_AFTER``): measured then, a single call's
        receipt read scanned the whole table (6-7 ms a call on a new server).
        """
        if self.backend != "postgresql":
            return
        self.raw_read.execute("ANALYZE")
        self.store.dispose()
        if self.loop is not None:
            self.loop.run_until_complete(self.async_store.dispose())

    def close(self) -> None:
        self.touch.close()
        self.raw.close()
        if self.raw_read is not self.raw:
            self.raw_read.close()
        self.store.dispose()
        if self.loop is not None:
            self.loop.run_until_complete(self.async_store.dispose())
            self.loop.close()

    # -- the candidates ----------------------------------------------------

    def admit_fresh(self) -> None:
        i = next(self._fresh)
        self.service.admit_signal(
            NAMESPACE, self.workflows[i % self.count], self.name, self.arguments(i),
            request_id=f"{self.tag}-fresh-{i}",
        )  # fmt: skip

    def floor_fresh(self) -> None:
        i = next(self._floor)
        k = i % self.count
        self._sequence[k] += 1
        now = datetime.now(UTC)
        when: object = now if self.backend == "postgresql" else now.isoformat(" ")
        command_id = str(uuid.uuid4())
        token = f"signal-v1:{self.tag}-floor-{i:040d}"
        intent_digest, arguments_digest, intent_encoding = self._digests
        command = (
            command_id, self.instance_ids[k], self.run_ids[k], self._sequence[k], "signal", self.name,
            "instance", None, token, self._context, self._arguments, "received", "received", None, when,
            intent_digest, arguments_digest, intent_encoding,
        )  # fmt: skip
        event = (NAMESPACE, self.instance_ids[k], self.run_ids[k], "SignalReceived", command_id, None,
                 self._payload, when)  # fmt: skip
        cur = self._raw_cursor
        if self.backend == "sqlite":
            cur.execute("BEGIN IMMEDIATE")
            cur.execute(self._insert_command, command)
            cur.execute(self._insert_event, event).fetchone()
            cur.execute("COMMIT")
        else:
            cur.execute(self._insert_command, command)
            cur.execute(self._insert_event, event)
            cur.fetchone()
            self.raw.commit()

    def admit_retained(self) -> None:
        workflow, key, _, _, arguments = self.retained[next(self._lookups) % len(self.retained)]
        self.service.admit_signal(NAMESPACE, workflow, self.name, arguments, request_id=key)

    async def admit_fresh_async(self) -> None:
        i = next(self._async_fresh)
        await self.async_service.admit_signal(
            NAMESPACE, self.workflows[i % self.count], self.name, self.arguments(i),
            request_id=f"{self.tag}-async-{i}",
        )  # fmt: skip

    async def admit_retained_async(self) -> None:
        workflow, key, _, _, arguments = self.retained[next(self._lookups) % len(self.retained)]
        await self.async_service.admit_signal(NAMESPACE, workflow, self.name, arguments, request_id=key)

    def awaited(self, fn: Callable[[], Awaitable[None]]) -> Callable[[float], tuple[int, float]]:
        """A timed loop of ``fn`` on this subject's event loop (one loop entry per segment, not per call)."""
        assert self.loop is not None
        loop = self.loop

        async def timed(seconds: float) -> tuple[int, float]:
            calls = 0
            start = time.perf_counter()
            end = start + seconds
            while True:
                await fn()
                calls += 1
                now = time.perf_counter()
                if now >= end:
                    return calls, now - start

        return lambda seconds: loop.run_until_complete(timed(seconds))

    def after_commit(self, fn: Callable[[], None]) -> Callable[[float], tuple[int, float]]:
        """A loop timing only ``fn``, each call after another connection's commit (untimed).

        A commit by any connection changes the SQLite file, and every other
        connection then drops its page cache at its next read: a harness
        that writes between retries (alternating admission with its floors
        call by call) sees retries that read the file again.  The commit is
        an UPDATE of a one-row table on a connection of its own, without
        fsync, so it costs little; on PostgreSQL (shared buffers) it changes
        nothing for the reader.
        """

        def timed(seconds: float) -> tuple[int, float]:
            calls, spent = 0, 0.0
            while spent < seconds:
                self._touch.execute(self._touch_sql)
                if self.backend == "postgresql":
                    self.touch.commit()
                start = time.perf_counter()
                fn()
                spent += time.perf_counter() - start
                calls += 1
            return calls, spent

        return timed

    def warm(self, seconds: float) -> None:
        """Warm every cache (SQLAlchemy's compiled cache, prepared statements, pages) for each candidate."""
        for fn in (self.admit_fresh, self.floor_fresh, self.admit_retained, self.floor_point_select):
            run_for(fn, min(0.3, seconds))

    def floor_point_select(self) -> None:
        _, _, instance_id, token, _ = self.retained[next(self._point) % len(self.retained)]
        self._read_cursor.execute(self._select, (instance_id, "signal", token))
        row = self._read_cursor.fetchone()
        assert row is not None


# --------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------

NAN = float("nan")


@dataclass(frozen=True)
class Sample:
    """One timed segment: operations per second, and CPU seconds per operation."""

    rate: float
    client_cpu: float  # the benchmark process(es): Python, SQLAlchemy, the driver (and SQLite itself)
    server_cpu: float  # the PostgreSQL server processes (NaN when unknown, or SQLite)
    busy: float = NAN  # the whole machine's CPU busy fraction (other users included)


def run_for(fn: Callable[[], None], seconds: float) -> tuple[int, float]:
    """Call ``fn`` until ``seconds`` have passed; returns (calls, elapsed seconds)."""
    calls = 0
    start = time.perf_counter()
    end = start + seconds
    while True:
        fn()
        calls += 1
        now = time.perf_counter()
        if now >= end:
            return calls, now - start


def interleaved(candidates: dict[str, Callable[[], Sample]], rounds: int) -> dict[str, list[Sample]]:
    """Run each candidate once per round, the order alternating every round."""
    samples: dict[str, list[Sample]] = {name: [] for name in candidates}
    names = list(candidates)
    for r in range(rounds):
        for name in names if r % 2 == 0 else reversed(names):
            samples[name].append(candidates[name]())
    return samples


def postgres_cpu(postmaster: int | None) -> float:
    """CPU seconds used so far by a PostgreSQL server: the postmaster and its children (Linux)."""
    if postmaster is None:
        return NAN
    total = 0
    try:
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                with open(f"/proc/{entry.name}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            # After the command: state, ppid, ..., utime (14th field overall), stime (15th).
            if int(entry.name) == postmaster or int(fields[1]) == postmaster:
                total += int(fields[11]) + int(fields[12])
    except OSError:
        return NAN
    return total / os.sysconf("SC_CLK_TCK")


def measure(
    fn: Callable[[], None],
    seconds: float,
    postmaster: int | None,
    timed: Callable[[float], tuple[int, float]] | None = None,
) -> Callable[[], Sample]:
    """A segment of ``fn`` called for ``seconds`` (or of ``timed``, a loop that times itself)."""

    def segment() -> Sample:
        cpu, server, machine = time.process_time(), postgres_cpu(postmaster), cpu_times()
        calls, elapsed = run_for(fn, seconds) if timed is None else timed(seconds)
        return Sample(
            calls / elapsed,
            (time.process_time() - cpu) / calls,
            (postgres_cpu(postmaster) - server) / calls,
            busy_fraction(machine, cpu_times()),
        )

    return segment


def fsync_latency(directory: str, *, append: bool, seconds: float = 0.4) -> float:
    """Mean seconds per 4 KiB write + fdatasync in ``directory``: appending, or overwriting one block."""
    fd, path = tempfile.mkstemp(dir=directory)
    try:
        block = b"\0" * 4096
        os.write(fd, block * 16)
        os.fsync(fd)

        def once() -> None:
            if append:
                os.write(fd, block)
            else:
                os.pwrite(fd, block, 4096)
            os.fdatasync(fd)

        os.lseek(fd, 0, os.SEEK_END)
        calls, elapsed = run_for(once, seconds)
        return elapsed / calls
    finally:
        os.close(fd)
        os.unlink(path)


def cpu_times() -> tuple[int, int] | None:
    """(busy, total) jiffies of all CPUs from /proc/stat, or None where there is none."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields) - idle, sum(fields)


def busy_fraction(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float:
    if before is None or after is None or after[1] == before[1]:
        return NAN
    return (after[0] - before[0]) / (after[1] - before[1])


def wal_bytes(subject: Subject, fn: Callable[[], None], calls: int = 50) -> float:
    """PostgreSQL WAL bytes written per call (a transaction that writes WAL flushes it at commit)."""
    with subject.raw_read.cursor() as cur:
        cur.execute("SELECT pg_current_wal_insert_lsn()")
        (start,) = cur.fetchone()  # type: ignore[misc]
        for _ in range(calls):
            fn()
        cur.execute("SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), %s)", (start,))
        (written,) = cur.fetchone()  # type: ignore[misc]
    return float(written) / calls


def count_statements(subject: Subject, fn: Callable[[], None], calls: int = 20) -> float:
    """SQL statements sent per call, through admission's engine or on the driver (BEGIN/COMMIT not counted).

    The hot path runs its statements on the DBAPI cursor (``admission.sql.RawStatement``),
    which the engine's events do not see, so those are counted at that class.
    """
    seen = 0

    def before(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        nonlocal seen
        if not statement.lstrip().upper().startswith(("BEGIN", "COMMIT")):
            seen += 1

    raw = admission.sql.RawStatement
    originals = {"parameters": raw.parameters}  # called once per execution

    def counted(original: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            nonlocal seen
            seen += 1
            return original(*args, **kwargs)

        return call

    # PostgreSQL's hot path sends its statements through libpq directly (admission/sql/_wire.py):
    # counted as each exchange is made up, plain BEGIN/COMMIT (bytes steps) left out.
    try:
        sending = importlib.import_module("admission.sql._wire")._Sending
    except (ImportError, AttributeError):
        sending = None  # a tree from before it
    made_up = sending.__init__ if sending is not None else None

    def exchange(self: Any, driver: Any, steps: Any) -> None:
        nonlocal seen
        seen += sum(1 for step in steps if not isinstance(step, bytes))
        assert made_up is not None
        made_up(self, driver, steps)

    sqlalchemy.event.listen(subject.store.engine, "before_cursor_execute", before)
    for name, original in originals.items():
        setattr(raw, name, counted(original))
    if sending is not None:
        sending.__init__ = exchange
    try:
        for _ in range(calls):
            fn()
    finally:
        sqlalchemy.event.remove(subject.store.engine, "before_cursor_execute", before)
        for name, original in originals.items():
            setattr(raw, name, original)
        if sending is not None:
            sending.__init__ = made_up
    return seen / calls


def _median(samples: Sequence[Sample], field: str) -> float:
    values = [getattr(s, field) for s in samples]
    return NAN if any(v != v for v in values) else statistics.median(values)


@dataclass
class Row:
    backend: str
    measurement: str
    candidate: str
    samples: list[Sample]
    floor: list[Sample] | None = None
    payload: str = ""

    @property
    def median(self) -> float:
        return _median(self.samples, "rate")

    @property
    def ratio(self) -> float:
        return 1.0 if self.floor is None else self.median / _median(self.floor, "rate")


AFTER_COMMIT = "after a commit"


def bench_single(
    backend: str, url: str, tag: str, rounds: int, seconds: float, postmaster: int | None
) -> tuple[list[Row], list[str]]:
    """Fresh and retained, each payload, beside their floors; and the notes of the run."""
    signal = Subject(backend, url, tag)
    command = Subject(backend, url, f"{tag}-c", payload="command", asynchronous=False)
    try:
        for subject in (signal, command):
            subject.warm(seconds)
        fresh_async = signal.awaited(signal.admit_fresh_async)
        retained_async = signal.awaited(signal.admit_retained_async)
        for timed in (fresh_async, retained_async):
            timed(min(0.3, seconds))
        notes = [
            f"{backend}: SQL statements per admission (BEGIN/COMMIT not counted): "
            f"fresh {count_statements(signal, signal.admit_fresh):.0f}, "
            f"retained {count_statements(signal, signal.admit_retained):.0f}; floor: 2 and 1"
        ]
        if backend == "postgresql":
            notes[0] += (
                f"; WAL bytes in the bench (warm pages, 50 calls, pg_current_wal_insert_lsn) per retained "
                f"admission {wal_bytes(signal, signal.admit_retained):.0f} "
                f"(point SELECT {wal_bytes(signal, signal.floor_point_select):.0f}), "
                f"per fresh admission {wal_bytes(signal, signal.admit_fresh):.0f} "
                f"(floor {wal_bytes(signal, signal.floor_fresh):.0f})"
            )
        fresh = interleaved(
            {
                "admission": measure(signal.admit_fresh, seconds, postmaster),
                "async": measure(signal.admit_fresh, seconds, postmaster, fresh_async),
                "floor": measure(signal.floor_fresh, seconds, postmaster),
                "command admission": measure(command.admit_fresh, seconds, postmaster),
                "command floor": measure(command.floor_fresh, seconds, postmaster),
            },
            rounds,
        )
        retained = interleaved(
            {
                "admission": measure(signal.admit_retained, seconds, postmaster),
                "async": measure(signal.admit_retained, seconds, postmaster, retained_async),
                "floor": measure(signal.floor_point_select, seconds, postmaster),
                "command admission": measure(command.admit_retained, seconds, postmaster),
                "command floor": measure(command.floor_point_select, seconds, postmaster),
                "committed admission": measure(
                    signal.admit_retained, seconds, postmaster, signal.after_commit(signal.admit_retained)
                ),
                "committed floor": measure(
                    signal.floor_point_select,
                    seconds,
                    postmaster,
                    signal.after_commit(signal.floor_point_select),
                ),
            },
            rounds,
        )
    finally:
        signal.close()
        command.close()
    small = f"signal, {signal.payload_bytes} B stored"
    large = f"command, {command.payload_bytes} B stored"
    rows = [
        Row(backend, "fresh", "admission", fresh["admission"], fresh["floor"], small),
        Row(backend, "fresh", ASYNC, fresh["async"], fresh["floor"], small),
        Row(backend, "fresh", "floor: 2 INSERTs, 1 tx", fresh["floor"], None, small),
        Row(backend, "fresh", "admission", fresh["command admission"], fresh["command floor"], large),
        Row(backend, "fresh", "floor: 2 INSERTs, 1 tx", fresh["command floor"], None, large),
        Row(backend, "retained", "admission", retained["admission"], retained["floor"], small),
        Row(backend, "retained", ASYNC, retained["async"], retained["floor"], small),
        Row(backend, "retained", "floor: point SELECT", retained["floor"], None, small),
        Row(backend, "retained", "admission", retained["command admission"], retained["command floor"],
            large),
        Row(backend, "retained", "floor: point SELECT", retained["command floor"], None, large),
        Row(backend, f"retained, {AFTER_COMMIT}", "admission", retained["committed admission"],
            retained["committed floor"], small),
        Row(backend, f"retained, {AFTER_COMMIT}", "floor: point SELECT", retained["committed floor"], None,
            small),
    ]  # fmt: skip
    return rows, notes


def explain_outside(rows: Sequence[Row]) -> list[str]:
    """Why a harness outside (issue #18: 0.30x/0.34x fresh, 0.10x retained on SQLite) measures less."""
    by = {(r.backend, r.measurement, r.candidate, r.payload.split(",")[0]): r for r in rows}
    lines = []
    for backend in sorted({r.backend for r in rows}):
        small, large = (
            by.get((backend, "fresh", "admission", "signal")),
            by.get((backend, "fresh", "admission", "command")),
        )
        warm, cold = (
            by.get((backend, "retained", "admission", "signal")),
            by.get((backend, f"retained, {AFTER_COMMIT}", "admission", "signal")),
        )
        if small is None or large is None or warm is None or cold is None:
            continue
        lines.append(
            f"{backend}: the ~130-byte command payload takes fresh from {small.ratio:.2f}x to "
            f"{large.ratio:.2f}x the floor ({1e6 / small.median:,.0f} -> {1e6 / large.median:,.0f} µs; "
            f"the floor writes the same "
            f"bytes, admission also encodes and digests them); a retry after another connection's commit is "
            f"{cold.ratio:.2f}x its floor ({1e6 / cold.median:,.0f} µs) against {warm.ratio:.2f}x warm "
            f"({1e6 / warm.median:,.0f} µs)"
            + (" — SQLite drops a connection's page cache when the file changed, and admission reads "
               "receipts "
               "on its own read connection: a harness alternating writes with retries measures the cold case"
               if backend == "sqlite" else "")
        )  # fmt: skip
    if lines:
        lines.append(
            "the floors here write exactly admission's column values (probe row's bytes, AUTOINCREMENT, "
            "the same indexes); a floor with fewer or smaller values, or no fdatasync, makes any ratio lower"
        )
    return lines


# --------------------------------------------------------------------------
# PostgreSQL with several processes
# --------------------------------------------------------------------------


def _worker(pipe: Any, url: str, tag: str) -> None:
    subject = Subject("postgresql", url, tag, retained=False)
    try:
        for fn in (subject.admit_fresh, subject.floor_fresh):
            run_for(fn, 0.2)
        pipe.send("ready")
        while True:
            message = pipe.recv()
            if message is None:
                return
            candidate, start_at, seconds = message
            fn = subject.admit_fresh if candidate == "admission" else subject.floor_fresh
            while time.monotonic() < start_at:
                time.sleep(0.001)
            cpu = time.process_time()
            calls, elapsed = run_for(fn, seconds)
            pipe.send((calls, elapsed, time.process_time() - cpu))
    finally:
        subject.close()


class Fleet:
    """Worker processes, each with its own instances, started once and driven round by round."""

    def __init__(self, url: str, tag: str, size: int, postmaster: int | None) -> None:
        context = multiprocessing.get_context("spawn")
        self.postmaster = postmaster
        self.pipes = []
        self.processes = []
        for i in range(size):
            parent, child = context.Pipe()
            process = context.Process(target=_worker, args=(child, url, f"{tag}-p{i}"), daemon=True)
            process.start()
            self.pipes.append(parent)
            self.processes.append(process)
        for pipe in self.pipes:
            if pipe.recv() != "ready":
                raise RuntimeError("a benchmark worker did not start")

    def measure(self, candidate: str, processes: int, seconds: float) -> Callable[[], Sample]:
        def segment() -> Sample:
            start_at = time.monotonic() + 0.05
            for pipe in self.pipes[:processes]:
                pipe.send((candidate, start_at, seconds))
            while time.monotonic() < start_at:
                time.sleep(0.001)
            machine, server = cpu_times(), postgres_cpu(self.postmaster)
            results = [pipe.recv() for pipe in self.pipes[:processes]]
            server = postgres_cpu(self.postmaster) - server
            calls = sum(r[0] for r in results)
            return Sample(
                sum(n / elapsed for n, elapsed, _ in results),
                sum(r[2] for r in results) / calls,
                server / calls,
                busy_fraction(machine, cpu_times()),
            )

        return segment

    def stop(self) -> None:
        for pipe in self.pipes:
            pipe.send(None)
        for process in self.processes:
            process.join(timeout=30)


Samples = dict[tuple[int, str], list[Sample]]


def bench_processes(url: str, tag: str, rounds: int, seconds: float, postmaster: int | None) -> Samples:
    """Samples per (processes, candidate)."""
    fleet = Fleet(url, tag, max(PROCESSES), postmaster)
    try:
        candidates = {
            f"{n}/{name}": fleet.measure(name, n, seconds)
            for n in PROCESSES
            for name in ("admission", "floor")
        }
        samples = interleaved(candidates, rounds)
    finally:
        fleet.stop()
    return {(int(key.split("/")[0]), key.split("/")[1]): values for key, values in samples.items()}


# --------------------------------------------------------------------------
# Flat as the data grows: a loaded database beside an empty one
# --------------------------------------------------------------------------

GROWTH_INSTANCES = 256  # instances admitted to in the growth part; --keys


@dataclass
class Growth:
    """One measurement on the empty and on the loaded database, admission and floor."""

    backend: str
    measurement: str
    admission: tuple[list[Sample], list[Sample]]  # (empty, big)
    floor: tuple[list[Sample], list[Sample]]

    def cost(self, pair: tuple[list[Sample], list[Sample]]) -> tuple[float, float]:
        """µs per operation on the empty and on the big database."""
        return 1e6 / _median(pair[0], "rate"), 1e6 / _median(pair[1], "rate")

    @property
    def admission_growth(self) -> float:
        empty, big = self.cost(self.admission)
        return big / empty

    @property
    def floor_growth(self) -> float:
        empty, big = self.cost(self.floor)
        return big / empty


def build_big(
    backends: dict[str, tuple[str, str]], tag: str, receipts: int
) -> tuple[dict[str, _bigdb.Built], list[str], dict[str, list[tuple[str, float]]]]:
    """Load ``receipts`` receipts into each backend's big database; the notes of the build, and each
    big database's bytes per receipt by table and index (:func:`bench._bigdb.relation_bytes`)."""
    floor = floor_metadata()
    # Every column but the event log's position, which the floor's table numbers itself.
    names = [
        (t, [c.name for c in floor.tables[t].c if c.name != "position"])
        for t in (FLOOR_COMMANDS, FLOOR_EVENTS)
    ]
    started = time.perf_counter()
    built = dict(
        zip(
            backends,
            _bigdb.build_all([big for _, big in backends.values()], names, tag, receipts),
            strict=True,
        )
    )
    notes = [
        f"loaded database: {receipts:,} receipts, 100 per instance (the ~130-byte command payload), rows "
        f"made by AdmissionService over the in-memory store (100 instances; the others those rows with new "
        f"ids) and "
        f"loaded through the adapter's statements and converters, the floor's tables filled with copies; "
        f"{' and '.join(backends)} at once, each in its own process: {time.perf_counter() - started:,.0f} s ("
        + "; ".join(
            f"{backend} making and inserting {b.parts[0]:,.0f} s, the floor's copies and statistics "
            f"{b.parts[1]:,.0f} s"
            for backend, b in built.items()
        )
        + ")"
    ]
    relations = {}
    for backend, (_, big) in backends.items():
        notes.append(f"{backend} loaded database checked: {_bigdb.check(big, built[backend])}")
        count = built[backend].receipts
        relations[backend] = _bigdb.relation_bytes(big, count)
        own = sum(size for _, size in relations[backend])
        whole = _bigdb.database_bytes(big) / count
        notes.append(
            f"{backend} bytes per receipt at {count:,}: {own:,.0f} in admission's receipt tables with their "
            f"indexes; {whole:,.0f} for the whole database (which also holds the floor's filled tables)"
        )
    return built, notes, relations


def bench_growth(
    backend: str,
    urls: tuple[str, str],
    built: _bigdb.Built,
    tag: str,
    rounds: int,
    seconds: float,
    postmaster: int | None,
) -> list[Growth]:
    """Fresh and retained (command payload) on the empty and the loaded database, with the floor on each."""
    draw = random.Random(2)
    loaded = draw.sample(built.instances, min(GROWTH_INSTANCES, len(built.instances)))
    keys = draw.sample(built.instances, len(built.instances))  # a key of every loaded instance, shuffled
    empty = Subject(
        backend, urls[0], f"{tag}-e", payload="command", asynchronous=False, instances=GROWTH_INSTANCES
    )
    big = Subject(
        backend, urls[1], f"{tag}-b", payload="command", asynchronous=False, loaded=loaded, keys=keys
    )
    try:
        for subject in (empty, big):
            subject.warm(seconds)
        results = {}
        for measurement, admit, floor in (
            ("fresh", Subject.admit_fresh, Subject.floor_fresh),
            ("retained", Subject.admit_retained, Subject.floor_point_select),
        ):
            samples = interleaved(
                {
                    f"{side} {name}": measure(fn.__get__(subject), seconds, postmaster)
                    for side, subject in (("empty", empty), ("big", big))
                    for name, fn in (("admission", admit), ("floor", floor))
                },
                rounds,
            )
            results[measurement] = Growth(
                backend,
                measurement,
                (samples["empty admission"], samples["big admission"]),
                (samples["empty floor"], samples["big floor"]),
            )
    finally:
        empty.close()
        big.close()
    return list(results.values())


# The receipt index: the one on the commands' request_id (admission/sql/_schema.py).
RECEIPT_INDEX = next(index.name for index in workflow_commands.indexes if "request_id" in index.columns)
WalShare = tuple[str, float, float]
"""A relation (or ``other``), its WAL bytes per call, and the full-page images' part of them."""

# Each WAL record, by the relation of its first block (pg_walinspect, PostgreSQL 15's contrib).
WAL_BY_RELATION = """
SELECT coalesce(
         pg_filenode_relation(0, substring(block_ref from 'rel \\d+/\\d+/(\\d+)')::oid)::regclass::text,
         'other'
       ) AS relation,
       sum(record_length) AS bytes, sum(fpi_length) AS fpi
FROM pg_get_wal_records_info(%s::pg_lsn, %s::pg_lsn)
GROUP BY 1 ORDER BY 2 DESC
"""


def wal_outside(
    url: str, built: _bigdb.Built, tag: str, calls: int
) -> tuple[tuple[float, float], dict[str, list[WalShare]] | str]:
    """WAL bytes per fresh admission and per floor transaction after a CHECKPOINT, on the loaded database,
    and each one's bytes by relation (or why they could not be read).

    As an outside observer measures it: ``pg_current_wal_lsn()`` before and
    after ``calls`` fresh admissions spread over as many loaded instances
    (the first change of each page after a checkpoint writes its full
    image), everything the server wrote in between included.  The breakdown
    reads the same WAL back with ``pg_walinspect`` (a superuser's extension),
    each record counted under the relation of its first block.
    """
    import psycopg

    spread = random.Random(3).sample(built.instances, min(calls, len(built.instances)))
    subject = Subject("postgresql", url, f"{tag}-w", payload="command", retained=False, loaded=spread)
    shares: dict[str, list[WalShare]] | str = {}
    try:
        with psycopg.connect(**pg_conninfo(url), autocommit=True) as conn:
            try:
                conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
            except psycopg.Error as exc:
                shares = f"no WAL breakdown: {type(exc).__name__}: {str(exc).strip()}"
            result = []
            for who, fn in (("admission", subject.admit_fresh), ("floor", subject.floor_fresh)):
                conn.execute("CHECKPOINT")
                (start,) = conn.execute("SELECT pg_current_wal_lsn()").fetchone()  # type: ignore[misc]
                for _ in range(calls):
                    fn()
                (end, written) = conn.execute(
                    "SELECT pg_current_wal_lsn(), pg_wal_lsn_diff(pg_current_wal_lsn(), %s)", (start,)
                ).fetchone()  # type: ignore[misc]
                result.append(float(written) / calls)
                if isinstance(shares, dict):
                    # Read now: the next CHECKPOINT may recycle the segments.
                    found = conn.execute(WAL_BY_RELATION, (start, end)).fetchall()
                    shares[who] = [
                        (relation, float(size) / calls, float(fpi) / calls) for relation, size, fpi in found
                    ]
    finally:
        subject.close()
    return (result[0], result[1]), shares


def print_wal_shares(shares: dict[str, list[WalShare]], markdown: bool) -> None:
    """The WAL of each side by relation, largest first; relations under 1% of a side's WAL together."""
    header = ("side", "relation", "WAL B per call", "of it full-page images")
    lines = []
    for who, rows in shares.items():
        total = sum(size for _, size, _ in rows)
        small = [row for row in rows if row[1] < total / 100]
        for relation, size, fpi in [row for row in rows if row not in small]:
            lines.append((who, relation, f"{size:,.0f}", f"{fpi:,.0f}"))
        if small:
            lines.append((who, f"{len(small)} others", f"{sum(r[1] for r in small):,.0f}",
                          f"{sum(r[2] for r in small):,.0f}"))  # fmt: skip
    table(header, lines, markdown, right=(2, 3))


def print_bytes(
    relations: dict[str, list[tuple[str, float]]],
    columns: dict[str, list[tuple[str, str, float]]],
    receipts: int,
    markdown: bool,
) -> None:
    """Bytes per receipt by table and index on the loaded database, then the stored size of each
    column of a command's and an event's row."""
    lines = [(backend, name, f"{size:,.1f}") for backend, rows in relations.items() for name, size in rows
             if size >= 0.5]  # fmt: skip
    table(("backend", "table or index", f"B per receipt at {receipts:,}"), lines, markdown, right=(2,))
    print()
    lines = [
        (backend, f"{t}.{c}", f"{size:,.1f}") for backend, rows in columns.items() for t, c, size in rows
    ]
    table(("backend", "column", "average B stored"), lines, markdown, right=(2,))


def print_pages(pages: PagesBy, markdown: bool) -> None:
    """SQLite: pages written to the log per call, by b-tree, for each kind of call (one column each)."""
    kinds = list(pages)
    names = sorted(
        {n for by in pages.values() for n in by}, key=lambda n: -max(by.get(n, 0) for by in pages.values())
    )
    lines = [(n, *(f"{pages[k].get(n, 0.0):,.1f}" for k in kinds)) for n in names]
    lines.append(("all", *(f"{sum(pages[k].values()):,.1f}" for k in kinds)))
    header = ("sqlite b-tree", *(f"pages per {k}" for k in kinds))
    table(header, lines, markdown, right=tuple(range(1, len(header))))


def print_growth(growth: Sequence[Growth], receipts: int, markdown: bool) -> None:
    header = (
        "backend",
        "measurement",
        "admission µs empty",
        f"admission µs at {receipts:,}",
        "admission big / empty",
        "floor µs empty",
        f"floor µs at {receipts:,}",
        "floor big / empty",
    )
    lines = []
    for g in growth:
        a, f = g.cost(g.admission), g.cost(g.floor)
        lines.append(
            (g.backend, g.measurement, f"{a[0]:,.0f}", f"{a[1]:,.0f}", f"{g.admission_growth:.2f}x",
             f"{f[0]:,.0f}", f"{f[1]:,.0f}", f"{g.floor_growth:.2f}x")
        )  # fmt: skip
    table(header, lines, markdown, right=(2, 3, 4, 5, 6, 7))


# --------------------------------------------------------------------------
# Batch admission: admit_many beside single calls
# --------------------------------------------------------------------------

BATCH = 32
ASYNC_SINGLE = "async service's "


PagesBy = dict[str, dict[str, float]]
"""Pages written to SQLite's log per call, by b-tree, for each kind of call (bench/_pages.py)."""
PAGE_CALLS = {"single admit_signal": 20, f"admit_many of {BATCH}": 10, "floor transaction": 20}
"""Each kind of call whose pages are counted, and how many calls (each after a checkpoint)."""


def bench_batch(
    backend: str, url: str, tag: str, rounds: int, seconds: float, postmaster: int | None
) -> tuple[list[Row], list[str], PagesBy | None]:
    """Commands/s of ``admit_many`` with 32 commands per call beside single ``admit_signal`` calls;
    on SQLite, also the pages each kind of call writes to the log."""
    try:
        from admission.receipts import BatchCommand  # type: ignore[attr-defined]
    except ImportError:
        return (
            [],
            [f"{backend} batch: skipped, this tree has no admission.receipts.BatchCommand (admit_many)"],
            None,
        )
    has_async = hasattr(AsyncAdmissionService, "admit_many")
    subject = Subject(backend, url, f"{tag}-m", retained=False, asynchronous=has_async)
    batches = itertools.count()

    def commands() -> list[Any]:
        b = next(batches)
        return [
            BatchCommand("signal", NAMESPACE, subject.workflows[i % subject.count], SIGNAL, ARGUMENTS,
                         request_id=f"{tag}-many-{b}-{i}")
            for i in range(BATCH)
        ]  # fmt: skip

    def many() -> None:
        subject.service.admit_many(commands())  # type: ignore[attr-defined]

    async def many_async() -> None:
        await subject.async_service.admit_many(commands())  # type: ignore[attr-defined]

    try:
        answers = subject.service.admit_many(commands())  # type: ignore[attr-defined]
        if len(answers) != BATCH or not all(getattr(a, "decision", None) is Decision.FRESH for a in answers):
            raise RuntimeError(f"admit_many did not admit a batch of new keys: {answers!r}")
        run_for(subject.admit_fresh, min(0.3, seconds))
        run_for(many, min(0.3, seconds))
        subject.settle()
        candidates = {
            "single": measure(subject.admit_fresh, seconds, postmaster),
            "many": measure(many, seconds, postmaster),
        }
        if has_async:
            candidates["many async"] = measure(many, seconds, postmaster, subject.awaited(many_async))
            candidates["single async"] = measure(
                subject.admit_fresh, seconds, postmaster, subject.awaited(subject.admit_fresh_async)
            )
        samples = interleaved(candidates, rounds)
        pages = None
        if backend == "sqlite":
            path = make_url(url).database
            assert path
            pages = {
                kind: _pages.sqlite_pages(path, fn, calls)
                for (kind, calls), fn in zip(
                    PAGE_CALLS.items(), (subject.admit_fresh, many, subject.floor_fresh), strict=True
                )
            }
    finally:
        subject.close()

    def per_command(values: list[Sample]) -> list[Sample]:
        return [Sample(v.rate * BATCH, v.client_cpu / BATCH, v.server_cpu / BATCH, v.busy) for v in values]

    measurement = f"batch of {BATCH}"
    rows = [
        Row(backend, measurement, "admit_many", per_command(samples["many"]), samples["single"], "signal"),
        Row(backend, measurement, "single admit_signal calls", samples["single"], None, "signal"),
    ]
    if has_async:
        # The async twin against the async service's single calls: each service against its own.
        rows += [
            Row(backend, measurement, "admit_many, async", per_command(samples["many async"]),
                samples["single async"], "signal"),
            Row(backend, measurement, "single admit_signal calls, async", samples["single async"], None,
                "signal"),
        ]  # fmt: skip
    return rows, [], pages


# --------------------------------------------------------------------------
# PostgreSQL: streams with a share of retries, each way a keyed admission reads its key
# --------------------------------------------------------------------------

MIXED_SHARES = (0.0, 0.1, 0.25, 0.5, 1.0)
LOCK_WAY, READ_WAY, CHOICE = "read in the lock's round trip", "read first", "the service's choice"
RING = 16  # the recent keys a retry takes again, round robin


class _Stream:
    """Keyed admissions of which ``share`` are retries of one of this stream's recent keys,
    spread evenly; each way of reading the key is a subject (a store and a service) of its own."""

    def __init__(self, subject: Subject, way: str, share: float, tag: str) -> None:
        self.subject, self.way, self.share, self.tag = subject, way, share, tag
        self.calls = itertools.count()
        self.fresh = itertools.count()
        self.recent: collections.deque[tuple[str, str]] = collections.deque(maxlen=RING)
        for _ in range(RING):
            self.admit(retry=False)

    def admit(self, retry: bool) -> None:
        subject = self.subject
        if retry:
            workflow, key = self.recent[0]
            self.recent.rotate(-1)
        else:
            n = next(self.fresh)
            workflow, key = subject.workflows[n % subject.count], f"{self.tag}-{n}"
        if self.way == LOCK_WAY:
            # The service's own measure of recent retries kept at none: always the lock's way.
            subject.service._retry_share = 0.0  # type: ignore[attr-defined]
        answer = subject.service.admit_signal(NAMESPACE, workflow, SIGNAL, ARGUMENTS, request_id=key)
        if answer.retained is not retry:
            raise RuntimeError(f"{self.way}: a {'retry' if retry else 'new key'} answered {answer!r}")
        if not retry:
            self.recent.append((workflow, key))

    def __call__(self) -> None:
        n = next(self.calls)
        self.admit(retry=int((n + 1) * self.share) > int(n * self.share))


def bench_mixed(
    url: str, tag: str, rounds: int, seconds: float, postmaster: int | None
) -> tuple[list[Row], list[str]]:
    """µs per keyed admission on PostgreSQL with 0-100% retries, each way of reading the key.

    Without a replica a keyed admission either reads its key's receipts in the
    round trip that takes the lock (a fresh key: two round trips on one
    connection; a retry: two, the second its ``COMMIT``) or reads them first on
    a connection of their own (a fresh key: three round trips on two; a retry:
    one).  The service takes the first way while retries are under
    ``RETRY_SHARE`` of its recent keyed admissions: "the service's choice".
    """
    ways = (LOCK_WAY, READ_WAY, CHOICE)
    subjects = {way: Subject("postgresql", url, f"{tag}-x{n}", retained=False) for n, way in enumerate(ways)}
    subjects[READ_WAY].store.keyed_locks = False
    try:
        if not subjects[LOCK_WAY].store.keyed_locks:
            return [], ["postgresql mixed: skipped, the store does not read a key in the lock's round trip"]
        candidates: dict[str, Callable[[], Sample]] = {}
        for share in MIXED_SHARES:
            for way in ways:
                stream = _Stream(subjects[way], way, share, f"{tag}-{way[:4]}-{share}")
                run_for(stream, min(0.2, seconds))
                candidates[f"{share} {way}"] = measure(stream, seconds, postmaster)
        for subject in subjects.values():
            subject.settle()
        samples = interleaved(candidates, rounds)
    finally:
        for subject in subjects.values():
            subject.close()
    rows = []
    for share in MIXED_SHARES:
        read_first = samples[f"{share} {READ_WAY}"]
        for way in ways:
            floor = None if way == READ_WAY else read_first
            measurement = f"keyed, {share:.0%} retries"
            rows.append(Row("postgresql", measurement, way, samples[f"{share} {way}"], floor, "signal"))
    note = (
        "keyed, N% retries: a stream of keyed admissions of which N% retry one of its 16 latest keys, "
        "spread evenly; each row's ratio is to reading the key first (the way a store without "
        f"KeyedLocking takes); the service's choice switches at RETRY_SHARE = {RETRY_SHARE}"
    )
    return rows, [note]


# --------------------------------------------------------------------------
# Over the wire: bench/http.py, run as it is
# --------------------------------------------------------------------------


def run_http(args: argparse.Namespace, pg_url: str | None) -> str:
    """bench/http.py's whole output (its own subprocess, the same options)."""
    command = [sys.executable, str(_HERE / "http.py"), "--rounds", str(args.rounds), "--seconds",
               str(args.seconds), "--backend", args.backend]  # fmt: skip
    if args.markdown:
        command.append("--markdown")
    if pg_url is not None:
        command += ["--pg-url", pg_url]
    result = subprocess.run(command, capture_output=True, text=True, timeout=3600, check=False)
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or ["no output"])[-1]
        return f"{result.stdout}# bench/http.py failed (exit {result.returncode}): {last}\n"
    return result.stdout


# --------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------


def pg_settings(url: str) -> str:
    import psycopg

    names = ("server_version", "fsync", "synchronous_commit", "full_page_writes", "wal_sync_method")
    with psycopg.connect(**pg_conninfo(url), autocommit=True) as conn:
        values = [f"{name}={conn.execute(f'SHOW {name}').fetchone()[0]}" for name in names]  # type: ignore[index]
    return "PostgreSQL " + ", ".join(values)


def _us(seconds: float) -> str:
    return "n/a" if seconds != seconds else f"{seconds * 1e6:,.0f}"


def print_rows(rows: Sequence[Row], markdown: bool) -> None:
    header = (
        "backend",
        "measurement",
        "payload",
        "candidate",
        "median ops/s",
        "median µs/op",
        "client CPU µs/op",
        "server CPU µs/op",
        "ratio to floor",
    )
    lines = [
        (
            row.backend,
            row.measurement,
            row.payload,
            row.candidate,
            f"{row.median:,.0f}",
            f"{1e6 / row.median:,.0f}",
            _us(_median(row.samples, "client_cpu")),
            _us(_median(row.samples, "server_cpu")),
            f"{row.ratio:.2f}x" if row.floor is not None else "floor",
        )
        for row in rows
    ]
    table(header, lines, markdown, right=(4, 5, 6, 7))


def print_processes(samples: Samples, markdown: bool) -> None:
    rate = {key: _median(values, "rate") for key, values in samples.items()}
    header = (
        "processes",
        "admission total/s",
        "floor total/s",
        "admission / floor",
        "admission scaling vs 1",
        "floor scaling vs 1",
        "CPU µs per admission (client + server)",
        "CPU µs per floor op (client + server)",
        "machine CPU busy (admission / floor)",
    )
    lines = []
    for n in PROCESSES:
        a, f = rate[(n, "admission")], rate[(n, "floor")]
        cpu = {
            name: (_median(samples[(n, name)], "client_cpu"), _median(samples[(n, name)], "server_cpu"))
            for name in ("admission", "floor")
        }
        busy = {name: _median(samples[(n, name)], "busy") for name in ("admission", "floor")}
        lines.append(
            (
                str(n),
                f"{a:,.0f}",
                f"{f:,.0f}",
                f"{a / f:.2f}x",
                f"{a / rate[(1, 'admission')]:.2f}x",
                f"{f / rate[(1, 'floor')]:.2f}x",
                f"{_us(cpu['admission'][0])} + {_us(cpu['admission'][1])}",
                f"{_us(cpu['floor'][0])} + {_us(cpu['floor'][1])}",
                f"{busy['admission']:.0%} / {busy['floor']:.0%}",
            )
        )
    table(header, lines, markdown, right=(0, 1, 2))


def table(
    header: Sequence[str], lines: Sequence[Sequence[str]], markdown: bool, right: Sequence[int]
) -> None:
    if markdown:
        print("| " + " | ".join(header) + " |")
        print("|" + "|".join("---:" if i in right else "---" for i in range(len(header))) + "|")
        for line in lines:
            print("| " + " | ".join(line) + " |")
        return
    widths = [max(len(h), *(len(line[i]) for line in lines)) for i, h in enumerate(header)]
    for line in (header, *lines):
        print(
            "  ".join(
                c.rjust(w) if i in right else c.ljust(w)
                for i, (c, w) in enumerate(zip(line, widths, strict=True))
            )
        )


ASYNC = "admission, async"
ASYNC_GOAL = 1.3
"""The async path's time per call, at most this many times the synchronous path's."""


GOALS = {"fresh": 0.5, "retained": 0.33}
"""Issue #18: fresh at least half the floor's rate, a retained answer a third of a raw point SELECT's."""
PROCESS_GOAL = 0.5
GROWTH_GOAL = 1.25
BYTES_GOAL = 800
WAL_GOAL = 3000
BATCH_GOAL = 5.0


def _met(ok: bool) -> str:
    return "met" if ok else "NOT met"


@dataclass
class Results:
    """Everything one run measured (each part may be skipped)."""

    rows: list[Row]
    processes: Samples | None = None
    growth: list[Growth] | None = None
    wal: tuple[float, float] | None = None
    wal_shares: dict[str, list[WalShare]] | str | None = None
    pages: PagesBy | None = None
    relation_bytes: dict[str, list[tuple[str, float]]] | None = None  # their sum: bytes per receipt
    column_bytes: dict[str, list[tuple[str, str, float]]] | None = None


def verdicts(results: Results) -> list[str]:
    """Each goal of issue #18, met or not, by the numbers of this run."""
    lines = []
    sync = {(r.backend, r.measurement, r.payload): r for r in results.rows if r.candidate == "admission"}
    for row in results.rows:
        if row.candidate == ASYNC:
            # Time per call is the inverse of the rate.
            slower = sync[(row.backend, row.measurement, row.payload)].median / row.median
            lines.append(
                f"{row.backend} {row.measurement}, async: {slower:.2f}x the sync path's time per call, "
                f"goal <= {ASYNC_GOAL}x: {_met(slower <= ASYNC_GOAL)}"
            )
            continue
        if row.floor is None:
            continue
        if row.candidate.startswith("admit_many"):
            lines.append(
                f"{row.backend} {row.measurement}, {row.candidate}: {row.ratio:.2f}x the "
                f"{ASYNC_SINGLE if row.candidate.endswith('async') else ''}single-call rate, "
                f"goal >= {BATCH_GOAL}x: {_met(row.ratio >= BATCH_GOAL)}"
            )
            continue
        goal = GOALS.get(row.measurement)
        if goal is None:  # explanatory rows (after a commit) have no goal
            continue
        lines.append(
            f"{row.backend} {row.measurement} ({row.payload}): {row.ratio:.2f}x the floor, goal >= {goal}x: "
            f"{_met(row.ratio >= goal)} ({row.ratio / goal:.2f}x the goal)"
        )
    if results.processes is not None:
        rate = {key: _median(values, "rate") for key, values in results.processes.items()}
        ratio = rate[(8, "admission")] / rate[(8, "floor")]
        lines.append(
            f"postgresql 8 processes: admission's total {ratio:.2f}x the floor's total at 8, "
            f"goal >= {PROCESS_GOAL}x: {_met(ratio >= PROCESS_GOAL)}"
        )
    for g in results.growth or []:
        ok = g.admission_growth <= GROWTH_GOAL or g.admission_growth <= g.floor_growth
        lines.append(
            f"{g.backend} {g.measurement} at the loaded size: {g.admission_growth:.2f}x the empty database's "
            f"cost (the floor's own growth {g.floor_growth:.2f}x), goal <= {GROWTH_GOAL}x or <= the floor's: "
            f"{_met(ok)}"
        )
    for backend, rows in (results.relation_bytes or {}).items():
        size = sum(per_receipt for _, per_receipt in rows)
        lines.append(
            f"{backend} bytes per receipt (receipt tables with indexes): {size:,.0f}, goal <= {BYTES_GOAL}: "
            f"{_met(size <= BYTES_GOAL)}"
        )
    if results.wal is not None:
        admitted, floor = results.wal
        index = ""
        if isinstance(results.wal_shares, dict):
            # The receipt index is the contract's unique key (contract §2.6, §4): any schema keeps one.
            key = [size for name, size, _ in results.wal_shares["admission"] if name == RECEIPT_INDEX]
            index = f", of it the receipt index alone {key[0]:,.0f} B" if key else ""
        lines.append(
            f"postgresql WAL per fresh admission from outside (after a CHECKPOINT, loaded database): "
            f"{admitted:,.0f} B{index} (floor {floor:,.0f} B), goal <= {WAL_GOAL:,} B: "
            f"{_met(admitted <= WAL_GOAL)}"
        )
    return lines


PARTS = ("main", "processes", "mixed", "batch", "growth", "http")
"""The parts of a run: fresh/retained beside the floors; PostgreSQL 1/4/8 processes; admit_many;
the loaded database (build, growth, bytes per receipt, WAL from outside); bench/http.py."""


def progress(started: float, what: str) -> None:
    """A line on stderr as each part ends: a long run shows where it is (the report comes at the end)."""
    print(f"# {time.monotonic() - started:,.0f} s: {what}", file=sys.stderr, flush=True)


def _parts(value: str) -> set[str]:
    chosen = {p.strip() for p in value.split(",") if p.strip()}
    unknown = chosen - set(PARTS)
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown part(s) {', '.join(sorted(unknown))}; parts: {', '.join(PARTS)}"
        )
    return chosen


def main(argv: list[str] | None = None) -> int:
    global RETAINED_KEYS, GROWTH_INSTANCES
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--seconds", type=float, default=1.0, help="seconds per candidate and round (default 1)"
    )
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds (default 7)")
    parser.add_argument("--markdown", action="store_true", help="print Markdown tables")
    parser.add_argument("--backend", choices=("sqlite", "postgresql", "all"), default="all")
    parser.add_argument("--pg-url", help="a scratch PostgreSQL database (default: start a private server)")
    parser.add_argument(
        "--only", type=_parts, default=None, help=f"comma-separated parts to run, of: {', '.join(PARTS)}"
    )
    parser.add_argument("--skip", type=_parts, default=set(), help="comma-separated parts to leave out")
    parser.add_argument(
        "--big-receipts",
        type=int,
        default=1_000_000,
        help="receipts in the loaded database, 100 per instance (default 1,000,000)",
    )
    parser.add_argument(
        "--wal-admissions",
        type=int,
        default=2000,
        help="fresh admissions (and floor transactions) after a CHECKPOINT, for WAL per admission "
        "(default 2,000)",
    )
    parser.add_argument(
        "--keys",
        type=int,
        default=RETAINED_KEYS,
        help="retained keys per candidate, and instances admitted to in the growth part (default 256)",
    )
    args = parser.parse_args(argv)
    RETAINED_KEYS = GROWTH_INSTANCES = args.keys
    parts = (set(PARTS) if args.only is None else args.only) - args.skip
    backends = ("sqlite", "postgresql") if args.backend == "all" else (args.backend,)
    if args.pg_url is not None and "growth" in parts:
        parser.error("the growth part needs databases of its own: run it without --pg-url")

    tag = uuid.uuid4().hex[:8]
    started = time.monotonic()
    results = Results([])
    notes: list[str] = []
    http_output = None
    load = os.getloadavg()
    print(
        f"# python {platform.python_version()}, admission {admission.__version__}, "
        f"SQLAlchemy {sqlalchemy.__version__}, sqlite {sqlite3.sqlite_version}, {os.cpu_count()} CPUs, "
        f"rounds={args.rounds}, seconds={args.seconds:g}, parts={','.join(p for p in PARTS if p in parts)}"
    )
    with tempfile.TemporaryDirectory(prefix="admission-bench-") as directory:
        print(
            f"# 4 KiB write + fdatasync in the temp dir: appending "
            f"{fsync_latency(directory, append=True) * 1e6:,.0f} µs, overwriting "
            f"{fsync_latency(directory, append=False) * 1e6:,.0f} µs"
        )
        server = None
        urls: dict[str, str] = {}
        if "sqlite" in backends:
            urls["sqlite"] = f"sqlite:///{directory}/admission.sqlite3"
        try:
            if "postgresql" in backends:
                url = args.pg_url
                if url is None:
                    from tests.support.pgserver import PostgresServer

                    server = PostgresServer(settings=DURABLE).start()
                    url = server.create_database("admission_bench")
                urls["postgresql"] = normalize_url(url)
                notes.append(pg_settings(urls["postgresql"]))
            postmaster = server.pid if server is not None else None
            for backend, url in urls.items():
                prepare_database(url)
                pm = postmaster if backend == "postgresql" else None
                if "main" in parts:
                    backend_rows, backend_notes = bench_single(
                        backend, url, tag, args.rounds, args.seconds, pm
                    )
                    results.rows += backend_rows
                    notes += backend_notes
                    progress(started, f"{backend} fresh and retained done")
                if "batch" in parts:
                    backend_rows, backend_notes, pages = bench_batch(
                        backend, url, tag, args.rounds, args.seconds, pm
                    )
                    results.rows += backend_rows
                    notes += backend_notes
                    results.pages = pages or results.pages  # SQLite's only
                    progress(started, f"{backend} batch done")
                if backend == "postgresql" and "processes" in parts:
                    results.processes = bench_processes(url, tag, args.rounds, args.seconds, postmaster)
                    progress(started, "postgresql processes done")
                if backend == "postgresql" and "mixed" in parts:
                    backend_rows, backend_notes = bench_mixed(url, tag, args.rounds, args.seconds, pm)
                    results.rows += backend_rows
                    notes += backend_notes
                    progress(started, "postgresql mixed retries done")
            if "growth" in parts:
                pairs: dict[str, tuple[str, str]] = {}
                for backend in urls:
                    if backend == "sqlite":
                        pair = (f"sqlite:///{directory}/empty.sqlite3", f"sqlite:///{directory}/big.sqlite3")
                    else:
                        assert server is not None
                        pair = (
                            normalize_url(server.create_database("admission_empty")),
                            normalize_url(server.create_database("admission_big")),
                        )
                    for each in pair:
                        prepare_database(each)
                    pairs[backend] = pair
                built, build_notes, results.relation_bytes = build_big(pairs, tag, args.big_receipts)
                notes += build_notes
                progress(started, "loaded databases built and checked")
                results.column_bytes = {b: _pages.column_bytes(pair[1]) for b, pair in pairs.items()}
                results.growth = []
                for backend, pair in pairs.items():
                    pm = postmaster if backend == "postgresql" else None
                    results.growth += bench_growth(
                        backend, pair, built[backend], tag, args.rounds, args.seconds, pm
                    )
                if "postgresql" in pairs:
                    results.wal, results.wal_shares = wal_outside(
                        pairs["postgresql"][1], built["postgresql"], tag, args.wal_admissions
                    )
                progress(started, "growth done")
            if "http" in parts:
                http_url = None
                if server is not None:
                    http_url = normalize_url(server.create_database("admission_http"))
                elif args.pg_url is not None:
                    http_url = args.pg_url
                http_output = run_http(args, http_url)
                progress(started, "bench/http.py done")
        finally:
            if server is not None:
                server.stop()
    for note in notes:
        print(f"# {note}")
    if results.rows:
        print_rows(results.rows, args.markdown)
        for line in explain_outside(results.rows):
            print(f"# why a harness outside measures less: {line}")
    if results.processes is not None:
        print()
        print_processes(results.processes, args.markdown)
    if results.growth:
        print()
        print_growth(results.growth, args.big_receipts, args.markdown)
    if results.relation_bytes is not None and results.column_bytes is not None:
        print()
        print_bytes(results.relation_bytes, results.column_bytes, args.big_receipts, args.markdown)
    if results.pages is not None:
        print()
        print_pages(results.pages, args.markdown)
    if results.wal is not None:
        print(
            f"# postgresql WAL from outside, after a CHECKPOINT, {args.wal_admissions:,} calls on the loaded "
            f"database: {results.wal[0]:,.0f} B per fresh admission, {results.wal[1]:,.0f} B per floor "
            "transaction"
        )
    if isinstance(results.wal_shares, str):
        print(f"# {results.wal_shares}")
    elif results.wal_shares is not None:
        print()
        print_wal_shares(results.wal_shares, args.markdown)
    if http_output is not None:
        print()
        print("# bench/http.py, run with the same options:")
        print(http_output.rstrip())
    print()
    for line in verdicts(results):
        print(f"# goal: {line}")
    end_load = os.getloadavg()
    print(
        f"# load average (1 min) at start {load[0]:.2f}, at end {end_load[0]:.2f}; "
        f"total {time.monotonic() - started:.0f} s"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
