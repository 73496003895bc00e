"""Admission throughput beside the raw-driver floor, measured in one run.

Three measurements, each beside its floor measured in the same run:

1. **fresh** admissions/s: ``AdmissionService.admit_signal`` with a new
   ``request_id`` each call (one transaction each), round-robin over 16
   instances with an open run.  Floor: the raw driver (``sqlite3`` /
   psycopg 3, no SQLAlchemy) doing one transaction of two INSERTs per
   admission, a command-like row and an event-like row with the same values
   admission writes, into tables built from the same column, primary-key,
   unique and index definitions as ``workflow_commands`` and
   ``workflow_history_events`` (no foreign keys), on the same database.
2. **retained** lookups/s: ``admit_signal`` retrying one of 256 existing keys
   with the same intent, which answers with the retained receipt.  Floor: a
   raw point ``SELECT *`` of that command row by
   (instance_id, command_type, request_id), autocommit.
   Both measurements also run the **async path**: ``AsyncAdmissionService``
   over ``admission.aio.open_store`` (aiosqlite, psycopg's async connection)
   on the same database, its calls awaited in a loop on one event loop;
   its goal is at most 1.3x the synchronous path's time per call.
3. **PostgreSQL with 1, 4 and 8 processes** doing fresh admissions, each
   process on its own 16 instances (so they do not contend one row lock),
   and the same for the floor: total admissions/s and the scaling ratio.

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
and, on PostgreSQL, the WAL bytes each kind of operation writes.

Usage: ``python bench/admission.py [--seconds N] [--rounds N] [--markdown]
[--backend sqlite|postgresql|all] [--pg-url URL]``.  ``--pg-url`` must name a
scratch database: admission's schema is upgraded to the head there and the
benchmark writes rows into it (and creates ``bench_floor_*`` tables).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import multiprocessing
import os
import platform
import sqlite3
import statistics
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
from sqlalchemy import Column, Index, MetaData, Table, UniqueConstraint  # noqa: E402
from sqlalchemy.engine import make_url  # noqa: E402

import admission  # noqa: E402
import admission.sql  # noqa: E402
from admission.aio import AsyncAdmissionService, AsyncStore, open_store  # noqa: E402
from admission.receipts import (  # noqa: E402
    AdmissionService,
    Decision,
)
from admission.sql import (  # noqa: E402
    SqlStore,
    create_admission_engine,
    normalize_url,
    upgrade,
    workflow_commands,
    workflow_history_events,
)

NAMESPACE = "bench"
SIGNAL = "payment_received"
ARGUMENTS = {"order_id": "ord-2026-000417", "amount": 4250, "currency": "EUR", "final": True}
INSTANCES = 16
RETAINED_KEYS = 256
PROCESSES = (1, 4, 8)
FLOOR_COMMANDS = "bench_floor_commands"
FLOOR_EVENTS = "bench_floor_events"
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
    finally:
        engine.dispose()


def pg_conninfo(url: str) -> dict[str, Any]:
    """psycopg.connect keyword arguments for a SQLAlchemy PostgreSQL URL."""
    parsed = make_url(normalize_url(url))
    info: dict[str, Any] = {
        "host": parsed.host,
        "port": parsed.port,
        "user": parsed.username,
        "password": parsed.password,
        "dbname": parsed.database,
        **parsed.query,
    }
    return {k: v for k, v in info.items() if v is not None}


# --------------------------------------------------------------------------
# One process's candidates on one database
# --------------------------------------------------------------------------


class Subject:
    """Admission and its raw-driver floor on one database, for one process.

    ``tag`` keeps the workflow ids of each process (and each run) apart.
    """

    def __init__(self, backend: str, url: str, tag: str, *, retained: bool = True) -> None:
        self.backend = backend
        self.tag = tag
        self.store = SqlStore.open(url)
        self.service = AdmissionService(self.store)
        self.workflows = [f"{tag}-{k}" for k in range(INSTANCES)]
        runs = [self.service.start_run(NAMESPACE, w) for w in self.workflows]
        self.run_ids = [r.run_id for r in runs]
        self.instance_ids = []
        for w in self.workflows:
            found = self.store.find_instance(NAMESPACE, w)
            assert found is not None
            self.instance_ids.append(found.id)
        self._fresh = itertools.count()
        self._floor = itertools.count()
        self._lookups = itertools.count()
        self._point = itertools.count()
        self._sequence = [10**6] * INSTANCES  # the floor's own command sequences, in memory
        # Bytes of the sizes admission writes, taken from a real admission.
        probe = self.service.admit_signal(
            NAMESPACE, self.workflows[0], SIGNAL, ARGUMENTS, request_id=f"{tag}-probe"
        )
        assert probe.decision is Decision.FRESH
        ((row, _),) = self.store.read_receipts(
            NAMESPACE, self.workflows[0], "signal", [admission.receipt_token("signal", f"{tag}-probe")]
        )
        self._context, self._arguments = row.context, row.arguments
        self._digests = (row.intent_digest, row.arguments_digest, row.intent_encoding)
        self._payload = self.store.read_history(self.instance_ids[0])[-1].payload
        self.retained: list[tuple[str, str, str, str]] = []  # workflow, key, instance id, token
        if retained:
            for i in range(RETAINED_KEYS):
                k = i % INSTANCES
                key = f"{tag}-retained-{i}"
                self.service.admit_signal(NAMESPACE, self.workflows[k], SIGNAL, ARGUMENTS, request_id=key)
                self.retained.append(
                    (self.workflows[k], key, self.instance_ids[k], admission.receipt_token("signal", key))
                )
            again = self.service.admit_signal(
                NAMESPACE, self.retained[0][0], SIGNAL, ARGUMENTS, request_id=self.retained[0][1]
            )
            assert again.decision is Decision.RETAINED, again
        self._connect_raw(url)
        self.loop: asyncio.AbstractEventLoop | None = None
        if retained:  # the single-process measurements; the fleets measure the sync path only
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
            # The durability and lock settings admission's engine uses; autocommit mode.
            self.raw = sqlite3.connect(path, timeout=30, isolation_level=None)
            for pragma in ("journal_mode=WAL", "synchronous=FULL", "foreign_keys=ON", "busy_timeout=30000"):
                self.raw.execute(f"PRAGMA {pragma}")
            self.raw_read = self.raw
        else:
            import psycopg

            self.raw = psycopg.connect(**pg_conninfo(url))  # a transaction per admission
            self.raw_read = psycopg.connect(**pg_conninfo(url), autocommit=True)
        self._raw_cursor = self.raw.cursor()
        self._read_cursor = self.raw_read.cursor()

    def close(self) -> None:
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
            NAMESPACE, self.workflows[i % INSTANCES], SIGNAL, ARGUMENTS, request_id=f"{self.tag}-fresh-{i}"
        )

    def floor_fresh(self) -> None:
        i = next(self._floor)
        k = i % INSTANCES
        self._sequence[k] += 1
        now = datetime.now(UTC)
        when: object = now if self.backend == "postgresql" else now.isoformat(" ")
        command_id = str(uuid.uuid4())
        token = f"signal-v1:{self.tag}-floor-{i:040d}"
        intent_digest, arguments_digest, intent_encoding = self._digests
        command = (
            command_id, self.instance_ids[k], self.run_ids[k], self._sequence[k], "signal", SIGNAL,
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
        workflow, key, _, _ = self.retained[next(self._lookups) % len(self.retained)]
        self.service.admit_signal(NAMESPACE, workflow, SIGNAL, ARGUMENTS, request_id=key)

    async def admit_fresh_async(self) -> None:
        i = next(self._async_fresh)
        await self.async_service.admit_signal(
            NAMESPACE, self.workflows[i % INSTANCES], SIGNAL, ARGUMENTS, request_id=f"{self.tag}-async-{i}"
        )

    async def admit_retained_async(self) -> None:
        workflow, key, _, _ = self.retained[next(self._lookups) % len(self.retained)]
        await self.async_service.admit_signal(NAMESPACE, workflow, SIGNAL, ARGUMENTS, request_id=key)

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

    def floor_point_select(self) -> None:
        _, _, instance_id, token = self.retained[next(self._point) % len(self.retained)]
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

    sqlalchemy.event.listen(subject.store.engine, "before_cursor_execute", before)
    for name, original in originals.items():
        setattr(raw, name, counted(original))
    try:
        for _ in range(calls):
            fn()
    finally:
        sqlalchemy.event.remove(subject.store.engine, "before_cursor_execute", before)
        for name, original in originals.items():
            setattr(raw, name, original)
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

    @property
    def median(self) -> float:
        return _median(self.samples, "rate")

    @property
    def ratio(self) -> float:
        return 1.0 if self.floor is None else self.median / _median(self.floor, "rate")


def bench_single(
    backend: str, url: str, tag: str, rounds: int, seconds: float, postmaster: int | None
) -> tuple[list[Row], str]:
    subject = Subject(backend, url, tag)
    try:
        # Warm every cache (SQLAlchemy's compiled cache, prepared statements, pages).
        for fn in (
            subject.admit_fresh,
            subject.floor_fresh,
            subject.admit_retained,
            subject.floor_point_select,
        ):
            run_for(fn, min(0.3, seconds))
        fresh_async = subject.awaited(subject.admit_fresh_async)
        retained_async = subject.awaited(subject.admit_retained_async)
        for timed in (fresh_async, retained_async):
            timed(min(0.3, seconds))
        note = (
            f"{backend}: SQL statements per admission (BEGIN/COMMIT not counted): "
            f"fresh {count_statements(subject, subject.admit_fresh):.0f}, "
            f"retained {count_statements(subject, subject.admit_retained):.0f}; floor: 2 and 1"
        )
        if backend == "postgresql":
            note += (
                f"; WAL bytes per retained admission {wal_bytes(subject, subject.admit_retained):.0f} "
                f"(point SELECT {wal_bytes(subject, subject.floor_point_select):.0f}), "
                f"per fresh admission {wal_bytes(subject, subject.admit_fresh):.0f} "
                f"(floor {wal_bytes(subject, subject.floor_fresh):.0f})"
            )
        fresh = interleaved(
            {
                "admission": measure(subject.admit_fresh, seconds, postmaster),
                "async": measure(subject.admit_fresh, seconds, postmaster, fresh_async),
                "floor": measure(subject.floor_fresh, seconds, postmaster),
            },
            rounds,
        )
        retained = interleaved(
            {
                "admission": measure(subject.admit_retained, seconds, postmaster),
                "async": measure(subject.admit_retained, seconds, postmaster, retained_async),
                "floor": measure(subject.floor_point_select, seconds, postmaster),
            },
            rounds,
        )
    finally:
        subject.close()
    rows = [
        Row(backend, "fresh", "admission", fresh["admission"], fresh["floor"]),
        Row(backend, "fresh", ASYNC, fresh["async"], fresh["floor"]),
        Row(backend, "fresh", "floor: 2 INSERTs, 1 tx", fresh["floor"]),
        Row(backend, "retained", "admission", retained["admission"], retained["floor"]),
        Row(backend, "retained", ASYNC, retained["async"], retained["floor"]),
        Row(backend, "retained", "floor: point SELECT", retained["floor"]),
    ]
    return rows, note


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
            row.candidate,
            f"{row.median:,.0f}",
            f"{1e6 / row.median:,.0f}",
            _us(_median(row.samples, "client_cpu")),
            _us(_median(row.samples, "server_cpu")),
            f"{row.ratio:.2f}x" if row.floor is not None else "floor",
        )
        for row in rows
    ]
    table(header, lines, markdown, right=(3, 4, 5, 6))


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


def verdicts(rows: Sequence[Row], samples: Samples | None) -> list[str]:
    """Each goal, met or not, by the numbers of this run."""
    lines = []
    goals = {"fresh": 0.5, "retained": 0.25}
    sync = {(row.backend, row.measurement): row for row in rows if row.candidate == "admission"}
    for row in rows:
        if row.candidate == ASYNC:
            # Time per call is the inverse of the rate.
            slower = sync[(row.backend, row.measurement)].median / row.median
            lines.append(
                f"{row.backend} {row.measurement}, async: {slower:.2f}x the sync path's time per call, "
                f"goal <= {ASYNC_GOAL}x: {'met' if slower <= ASYNC_GOAL else 'NOT met'}"
            )
            continue
        if row.floor is None:
            continue
        goal = goals[row.measurement]
        lines.append(
            f"{row.backend} {row.measurement}: {row.ratio:.2f}x the floor, goal >= {goal}x: "
            f"{'met' if row.ratio >= goal else 'NOT met'} ({row.ratio / goal:.2f}x the goal)"
        )
    if samples is not None:
        rate = {key: _median(values, "rate") for key, values in samples.items()}
        scaling = rate[(8, "admission")] / rate[(1, "admission")]
        ceiling = rate[(8, "floor")] / rate[(1, "floor")]
        lines.append(
            f"postgresql 8 processes / 1: admission {scaling:.2f}x, goal >= 2.5x: "
            f"{'met' if scaling >= 2.5 else 'NOT met'}; the raw floor scales {ceiling:.2f}x on this machine"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--seconds", type=float, default=1.0, help="seconds per candidate and round (default 1)"
    )
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds (default 7)")
    parser.add_argument("--markdown", action="store_true", help="print Markdown tables")
    parser.add_argument("--backend", choices=("sqlite", "postgresql", "all"), default="all")
    parser.add_argument("--pg-url", help="a scratch PostgreSQL database (default: start a private server)")
    args = parser.parse_args(argv)

    tag = uuid.uuid4().hex[:8]
    started = time.monotonic()
    rows: list[Row] = []
    notes: list[str] = []
    processes: Samples | None = None
    load = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="admission-bench-") as directory:
        print(
            f"# python {platform.python_version()}, admission {admission.__version__}, "
            f"SQLAlchemy {sqlalchemy.__version__}, sqlite {sqlite3.sqlite_version}, {os.cpu_count()} CPUs, "
            f"rounds={args.rounds}, seconds={args.seconds:g}"
        )
        print(
            f"# 4 KiB write + fdatasync in the temp dir: appending "
            f"{fsync_latency(directory, append=True) * 1e6:,.0f} µs, overwriting "
            f"{fsync_latency(directory, append=False) * 1e6:,.0f} µs"
        )
        if args.backend in ("sqlite", "all"):
            url = f"sqlite:///{directory}/admission.sqlite3"
            prepare_database(url)
            backend_rows, note = bench_single("sqlite", url, tag, args.rounds, args.seconds, None)
            rows += backend_rows
            notes.append(note)
        if args.backend in ("postgresql", "all"):
            server = None
            url = args.pg_url
            if url is None:
                from tests.support.pgserver import PostgresServer

                server = PostgresServer(settings=DURABLE).start()
                url = server.create_database("admission_bench")
            postmaster = server.pid if server is not None else None
            url = normalize_url(url)
            try:
                prepare_database(url)
                notes.append(pg_settings(url))
                backend_rows, note = bench_single(
                    "postgresql", url, tag, args.rounds, args.seconds, postmaster
                )
                rows += backend_rows
                notes.append(note)
                processes = bench_processes(url, tag, args.rounds, args.seconds, postmaster)
            finally:
                if server is not None:
                    server.stop()
    for note in notes:
        print(f"# {note}")
    print_rows(rows, args.markdown)
    if processes is not None:
        print()
        print_processes(processes, args.markdown)
    print()
    for line in verdicts(rows, processes):
        print(f"# goal: {line}")
    end_load = os.getloadavg()
    print(
        f"# load average (1 min) at start {load[0]:.2f}, at end {end_load[0]:.2f}; "
        f"total {time.monotonic() - started:.0f} s"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
