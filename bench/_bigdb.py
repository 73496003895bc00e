"""A large receipt database for ``bench/admission.py``: rows written by the service, loaded in bulk.

Rows are made by the real :class:`~admission.receipts.AdmissionService` over
the in-memory store (one store per instance: a run started, then a receipt
per command key) for the first 100 instances; the other instances take
those rows with new identifiers (:func:`derive`).  They reach
the database through the SQL adapter's own statements and row converters
(:func:`~admission.sql._receipt_queries.fields_of` and the statements'
bind processors, as :class:`~admission.sql._raw.RawStatement` applies them),
so a change of the stored columns carries over; only the way of sending
differs (``executemany`` in large transactions on SQLite, ``COPY`` on
PostgreSQL).  The floor's tables get the same command and event rows.
:func:`check` then reads a sample back through the service.

Not a script: ``bench/admission.py`` imports it.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import multiprocessing
import random
import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import insert
from sqlalchemy.engine import make_url

import admission
from admission.receipts import AdmissionService, Decision
from admission.receipts._memory import MemoryStore
from admission.sql import SqlStore, create_admission_engine, normalize_url
from admission.sql._event_rows import STORED_EVENT_KEYS, event_values
from admission.sql._raw import RawStatement
from admission.sql._receipt_queries import COMMAND_FIELDS, INSERT_COMMAND, INSERT_EVENT, INSERT_RUN, fields_of
from admission.sql._schema import workflow_instances, workflow_runs

NAMESPACE = "bench"
COMMAND = "deploy"
RECEIPTS_PER_INSTANCE = 100
INSTANCES_PER_CHUNK = 100
_DIGESTS = [hashlib.sha256(str(n).encode()).hexdigest() for n in range(1024)]


def command_arguments(n: int) -> dict[str, object]:
    """The ~130-byte command payload of issue #18, for call ``n``."""
    return {"cmd": "deploy.service", "args_digest": _DIGESTS[n % len(_DIGESTS)], "by": "svc-a", "n": n}


@dataclass(frozen=True)
class Instance:
    """One loaded instance, and one of its keys (drawn at random) for retries."""

    workflow_id: str
    instance_id: str
    run_id: str
    receipts: int
    key: str
    key_n: int
    command_id: str


Fields = dict[str, Any]


@dataclass
class Chunk:
    """The rows of a few instances, as fields by name (each row's :func:`fields_of`)."""

    instances: list[Fields] = field(default_factory=list)
    runs: list[Fields] = field(default_factory=list)
    commands: list[Fields] = field(default_factory=list)
    events: list[Fields] = field(default_factory=list)
    loaded: list[Instance] = field(default_factory=list)

    def __iadd__(self, other: Chunk) -> Chunk:
        self.instances += other.instances
        self.runs += other.runs
        self.commands += other.commands
        self.events += other.events
        self.loaded += other.loaded
        return self


def workflow_of(tag: str, k: int) -> str:
    """Loaded instance ``k``'s workflow id: all of one width, so they can stand in for each other."""
    return f"{tag}-big-{k:07d}"


def generate(tag: str, k: int, receipts: int, service: AdmissionService) -> Chunk:
    """Instance ``k`` as the service writes it: a run started, then ``receipts`` signals with new keys."""
    store = MemoryStore()
    service.store = store
    workflow = workflow_of(tag, k)
    run = service.start_run(NAMESPACE, workflow)
    picked = random.Random(f"{tag}-{k}").randrange(receipts)
    command_id = ""
    for i in range(receipts):
        answer = service.admit_signal(
            NAMESPACE, workflow, COMMAND, command_arguments(k * receipts + i), request_id=f"{workflow}-{i}"
        )
        if i == picked:
            assert answer.command_id is not None
            command_id = answer.command_id
    # The store's tables are its whole content: exactly what the service wrote, each event as
    # the SQL store keeps it (an admission event's payload compact, admission/sql/_compact.py).
    tables = store._tables
    (instance,) = tables.instances.values()
    commands = {c.id: c for c in tables.commands.values()}
    return Chunk(
        [fields_of(instance)],
        [fields_of(r) for r in tables.runs.values()],
        [fields_of(r) for r in tables.commands.values()],
        [event_values(e, commands.get(e.command_id or "")) for e in tables.events],
        [Instance(workflow, instance.id, run.run_id, receipts, f"{workflow}-{picked}", k * receipts + picked,
                  command_id)],
    )  # fmt: skip


def derive(template: Chunk, tag: str, k: int, new_id: Callable[[], str]) -> Chunk:
    """Instance ``k`` from a template instance the service wrote: its rows with new identifiers.

    Every value stays as the service wrote it but the identifiers: the
    instance's, its run's and commands' ids (new ones from the service's own
    id source), its workflow id, and with it the command keys (tokens made
    by :func:`admission.receipt_token`, the raw key inside the stored context
    and event payloads replaced byte for byte: workflow ids have one width).
    Arguments repeat the template instance's.
    """
    (loaded,) = template.loaded
    old, new = loaded.workflow_id, workflow_of(tag, k)
    old_b, new_b = old.encode(), new.encode()
    ids = {template.instances[0]["id"]: new_id()}
    ids.update((r["id"], new_id()) for r in template.runs)
    ids.update((c["id"], new_id()) for c in template.commands)
    ids[None] = None

    def key(token_of: str, raw: str | None) -> str | None:
        return None if raw is None else admission.receipt_token(token_of, raw.replace(old, new))

    raw_keys = {c["request_id"]: f"{old}-{i}" for i, c in enumerate(template.commands)}
    commands = []
    for c in template.commands:
        commands.append(
            {**c, "id": ids[c["id"]], "instance_id": ids[c["instance_id"]], "run_id": ids[c["run_id"]],
             "request_id": key(c["command_type"], raw_keys[c["request_id"]]),
             "context": None if c["context"] is None else c["context"].replace(old_b, new_b)}
        )  # fmt: skip
    return Chunk(
        [{**template.instances[0], "id": ids[template.instances[0]["id"]], "workflow_id": new,
          "current_run_id": ids[template.instances[0]["current_run_id"]]}],
        [{**r, "id": ids[r["id"]], "instance_id": ids[r["instance_id"]],
          "continued_from_run_id": ids.get(r["continued_from_run_id"])} for r in template.runs],
        commands,
        [{**e, "instance_id": ids[e["instance_id"]], "run_id": ids[e["run_id"]],
          "command_id": ids[e["command_id"]], "payload": e["payload"].replace(old_b, new_b)}
         for e in template.events],
        [Instance(new, ids[loaded.instance_id], ids[loaded.run_id], loaded.receipts,
                  loaded.key.replace(old, new), loaded.key_n, ids[loaded.command_id])],
    )  # fmt: skip


TEMPLATES = 100
"""Instances written by the service itself; the others are derived from them (see :func:`derive`)."""


def chunks(tag: str, receipts: int) -> Iterator[Chunk]:
    r"""A database of ``receipts`` receipts, 100 per instance, in chunks of 100 instances.

    The service writes the first :data:`TEMPLATES` instances itself (through
    the in-memory store); the rest are :func:`derive`\ d from them, which is
    ~10 times faster than admitting each receipt.
    """
    instances = max(1, receipts // RECEIPTS_PER_INSTANCE)
    per = min(RECEIPTS_PER_INSTANCE, receipts)
    service = AdmissionService(MemoryStore())
    templates = [generate(tag, k, per, service) for k in range(min(TEMPLATES, instances))]
    new_id = service._new_id
    for first in range(0, instances, INSTANCES_PER_CHUNK):
        chunk = Chunk()
        for k in range(first, min(first + INSTANCES_PER_CHUNK, instances)):
            chunk += (
                templates[k] if k < len(templates) else derive(templates[k % len(templates)], tag, k, new_id)
            )
        yield chunk


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


class Loader:
    """Bulk inserts into one database through the adapter's statements and converters.

    The floor's tables get copies of the loaded command and event rows, in
    SQL, once the load is done (the same values, without converting twice).
    """

    def __init__(self, url: str, floor: Sequence[tuple[str, Sequence[str]]]) -> None:
        engine = create_admission_engine(url)
        d = engine.dialect
        engine.dispose()
        self.postgres = d.name == "postgresql"
        # Per kind of row: (table, the statement the adapter writes such a row with).
        self.kinds: dict[str, tuple[str, RawStatement]] = {
            "instances": (
                "workflow_instances",
                RawStatement(insert(workflow_instances), d, [c.name for c in workflow_instances.c]),
            ),
            "runs": ("workflow_runs", RawStatement(INSERT_RUN, d, [c.name for c in workflow_runs.c])),
            "commands": ("workflow_commands", RawStatement(INSERT_COMMAND, d, COMMAND_FIELDS)),
            "events": ("workflow_history_events", RawStatement(INSERT_EVENT[d.name], d, STORED_EVENT_KEYS)),
        }
        # The floor's (commands, events) tables: (name, columns) each.
        (commands, command_columns), (events, event_columns) = floor
        self.copies = [
            (commands, "workflow_commands", command_columns),
            (events, "workflow_history_events", event_columns),
        ]
        if self.postgres:
            import psycopg

            self.conn: Any = psycopg.connect(**pg_conninfo(url))
            self.conn.execute("SET synchronous_commit = off")  # a build: its own durability does not matter
            self.conn.commit()
        else:
            path = make_url(url).database
            assert path
            self.conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
            # A build: no journal, no fsync, a large cache (WAL again in finish()).
            for pragma in ("journal_mode=OFF", "synchronous=OFF", "cache_size=-1000000"):
                self.conn.execute(f"PRAGMA {pragma}")

    def load(self, chunk: Chunk) -> None:
        """Insert one chunk's rows in one transaction."""
        rows = {
            "instances": chunk.instances,
            "runs": chunk.runs,
            "commands": chunk.commands,
            "events": chunk.events,
        }
        if self.postgres:
            with self.conn.transaction():
                # What txid_current() gives every INSERT of this transaction (the event statement's tx_id).
                (txid,) = self.conn.execute("SELECT txid_current()").fetchone()
                for kind, (table, statement) in self.kinds.items():
                    sets = statement.parameter_sets(rows[kind], {})
                    columns = list(sets[0])  # bound by column name (an INSERT given its keys)
                    extra = ["tx_id"] if kind == "events" else []
                    with self.conn.cursor().copy(
                        f"COPY {table} ({', '.join(columns + extra)}) FROM STDIN"
                    ) as copy:
                        for values in sets:
                            assert isinstance(values, dict)
                            copy.write_row([*values.values(), *([txid] if extra else [])])
        else:
            cur = self.conn.cursor()
            cur.execute("BEGIN")
            for kind, (_, statement) in self.kinds.items():
                cur.executemany(statement.sql, statement.parameter_sets(rows[kind], {}))
            cur.execute("COMMIT")

    def finish(self) -> None:
        """Fill the floor's tables; leave the database as a long-running one would be."""
        for floor, source, columns in self.copies:
            names = ", ".join(columns)
            self.conn.execute(f"INSERT INTO {floor} ({names}) SELECT {names} FROM {source}")
        if self.postgres:
            self.conn.commit()
            self.conn.autocommit = True
            for table in [t for t, _ in self.kinds.values()] + [floor for floor, *_ in self.copies]:
                self.conn.execute(f"ANALYZE {table}")
        else:
            self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.close()


@dataclass(frozen=True)
class Built:
    """A loaded database: its instances (with one key each) and the build's time."""

    instances: list[Instance]
    receipts: int
    seconds: float
    parts: tuple[float, float]  # making and inserting the rows, then the floor's copies and statistics


def build(url: str, floor: Sequence[tuple[str, Sequence[str]]], tag: str, receipts: int) -> Built:
    """Generate the rows and load them into one database (see :func:`build_all`)."""
    started = time.perf_counter()
    loader = Loader(url, floor)
    instances: list[Instance] = []
    total = 0
    for chunk in chunks(tag, receipts):
        loader.load(chunk)
        instances += chunk.loaded
        total += len(chunk.commands)
    inserted = time.perf_counter()
    loader.finish()
    done = time.perf_counter()
    return Built(instances, total, done - started, (inserted - started, done - inserted))


def build_all(
    urls: Sequence[str], floor: Sequence[tuple[str, Sequence[str]]], tag: str, receipts: int
) -> list[Built]:
    """:func:`build` for each database at once, each in a process of its own.

    Each process makes its own rows (the same keys and arguments, its own
    ids): generating twice costs less than sharing rows between threads,
    which hold the GIL in turn.
    """
    if len(urls) == 1:
        return [build(urls[0], floor, tag, receipts)]
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(len(urls), mp_context=context) as pool:
        futures = [pool.submit(build, url, floor, tag, receipts) for url in urls]
        return [f.result() for f in futures]


def check(url: str, built: Built, sample: int = 100) -> str:
    """Read a sample back through the service: loaded keys retained, the next sequence continues."""
    store = SqlStore.open(url)
    try:
        service = AdmissionService(store)
        draw = random.Random(0)
        picked = draw.sample(built.instances, min(sample, len(built.instances)))
        for loaded in picked:
            answer = service.admit_signal(
                NAMESPACE, loaded.workflow_id, COMMAND, command_arguments(loaded.key_n), request_id=loaded.key
            )
            if answer.decision is not Decision.RETAINED or answer.command_id != loaded.command_id:
                raise RuntimeError(f"a loaded key did not answer as loaded: {answer}")
        loaded = picked[0]
        answer = service.admit_signal(
            NAMESPACE, loaded.workflow_id, COMMAND, command_arguments(-1), request_id=f"{loaded.key}-check"
        )
        if answer.decision is not Decision.FRESH or answer.command_sequence != loaded.receipts + 1:
            raise RuntimeError(f"a fresh admission on a loaded instance did not continue it: {answer}")
        found = store.find_instance(NAMESPACE, loaded.workflow_id)
        assert found is not None and found.id == loaded.instance_id
    finally:
        store.dispose()
    return (
        f"{len(picked)} loaded keys retried through the service answered retained with the loaded "
        f"command id; a fresh admission on a loaded instance got command_sequence {loaded.receipts + 1}"
    )


RECEIPT_TABLES = ("workflow_instances", "workflow_runs", "workflow_commands", "workflow_updates",
                  "workflow_history_events")  # fmt: skip
"""The receipt schema's tables (the jobs' and the worker's are not a receipt's)."""


def fetch_all(url: str, statements: Sequence[tuple[str, Sequence[Any]]]) -> list[list[tuple[Any, ...]]]:
    """Every row of each ``(sql, parameters)`` statement, read in turn on one connection of the
    driver to ``url``'s database (autocommit on PostgreSQL; ``sql`` in the driver's own style)."""
    if make_url(url).get_backend_name() == "postgresql":
        import psycopg

        with psycopg.connect(**pg_conninfo(url), autocommit=True) as conn:
            return [conn.execute(sql, params or None).fetchall() for sql, params in statements]
    path = make_url(url).database
    assert path
    lite = sqlite3.connect(path)
    try:
        return [lite.execute(sql, params).fetchall() for sql, params in statements]
    finally:
        lite.close()


def relation_bytes(url: str, receipts: int) -> list[tuple[str, float]]:
    """Bytes per receipt in each table and index of the receipt schema, largest first (SQLite's
    ``dbstat``; PostgreSQL's table sizes, TOAST included, and index sizes). Their sum is the
    receipt tables with their indexes."""
    if make_url(url).get_backend_name() == "postgresql":
        sizes = """
            SELECT t AS relation, pg_table_size(t::regclass) FROM unnest(%s::text[]) AS t
            UNION ALL
            SELECT i.indexrelid::regclass::text, pg_relation_size(i.indexrelid)
            FROM pg_index AS i WHERE i.indrelid = ANY(%s::regclass[])
        """
        [found] = fetch_all(url, [(sizes, [list(RECEIPT_TABLES)] * 2)])
    else:
        placeholders = ", ".join("?" * len(RECEIPT_TABLES))
        by_name = (
            "SELECT name, sum(pgsize) FROM dbstat WHERE name IN "
            f"(SELECT name FROM sqlite_master WHERE tbl_name IN ({placeholders})) GROUP BY name"
        )
        [found] = fetch_all(url, [(by_name, RECEIPT_TABLES)])
    return sorted(((str(name), float(size) / receipts) for name, size in found), key=lambda r: -r[1])


def database_bytes(url: str) -> int:
    """The whole database's size in bytes (which also holds the floor's filled tables)."""
    if make_url(url).get_backend_name() == "postgresql":
        [[(size,)]] = fetch_all(url, [("SELECT pg_database_size(current_database())", ())])
        return int(size)
    [[(page_count,)], [(page_size,)]] = fetch_all(url, [("PRAGMA page_count", ()), ("PRAGMA page_size", ())])
    return int(page_count * page_size)
