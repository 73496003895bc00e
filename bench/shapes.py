"""Bytes per receipt in other storage shapes of the same receipts (issue #18: <= 800).

Admits ``--receipts`` keyed signals carrying the ~130-byte command payload
(100 per instance, in batches that span 32 instances) through the service,
then copies every stored command and event, in the order they were
written, into the tables of each shape below, with the indexes the receipt
paths need (the commands by id, by (instance, sequence) and by (instance,
type, token); the events by position, by (instance, position) and by
(transaction, position)), and reports each shape's bytes per receipt,
tables and indexes together.

The shapes are cumulative: each keeps the changes of the ones above it.
Each copy is read back and must give every stored value again (a shape that
loses something is no shape of the same receipts): the ids, digests, codes
and times as their text, and an admission event's payload, kept compact in
every shape as the head keeps it (revision 0007), rebuilt from the shape's
command row as the store rebuilds it (``admission/sql/_compact.py``).
``stored`` copies the head schema's columns as they are: the control,
against which the copy's load order can be judged (the receipt tables
themselves are reported beside it).

On SQLite it also counts the pages new receipts put in the log when written
straight into each shape's tables (the rows only, no admission logic): one
receipt per transaction, and a batch of 32 over 16 instances per transaction
(``bench/_pages.py``).

Run it as ``python bench/shapes.py`` (a private PostgreSQL server is started
unless ``--pg-url`` names a scratch database, or ``--backend sqlite``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import itertools
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# This file is bench/shapes.py: its own directory must not shadow the package, and the
# repository's root gives ``bench`` and ``tests.support``.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or os.getcwd()).resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))

from sqlalchemy import (  # noqa: E402
    BigInteger,
    Column,
    DateTime,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    SmallInteger,
    String,
    Table,
    UniqueConstraint,
    insert,
    select,
)
from sqlalchemy.dialects import postgresql  # noqa: E402
from sqlalchemy.engine import Engine, make_url  # noqa: E402

from admission.intent import (  # noqa: E402
    canonical_decode,
    canonical_encode,
    encode_intent,
    receipt_token,
)
from admission.receipts import AdmissionService, BatchCommand, EventRow  # noqa: E402
from admission.receipts._answers import command_payload, context_of, literal_key  # noqa: E402
from admission.receipts._service import time_ordered_id  # noqa: E402
from admission.sql import create_admission_engine, normalize_url, upgrade  # noqa: E402
from admission.sql._compact import ADMISSION_EVENTS, COMMAND_COLUMNS, rebuilt, stored_payload  # noqa: E402
from admission.sql._event_rows import event_row, readable_events  # noqa: E402
from admission.sql._receipt_queries import command_row  # noqa: E402
from admission.sql._receipts import SqlStore  # noqa: E402
from admission.sql._schema import workflow_commands, workflow_history_events  # noqa: E402
from admission.sql._times import as_utc  # noqa: E402
from bench._bigdb import COMMAND, NAMESPACE, command_arguments, fetch_all  # noqa: E402
from bench._pages import sqlite_pages  # noqa: E402

PER_INSTANCE = 100
SPAN = 32  # commands per batch, each on the next instance


@dataclass(frozen=True)
class Shape:
    """One way of storing the same receipts: what it changes, and whether the contract allows it."""

    name: str
    change: str
    flags: frozenset[str]
    allowed: str = "yes"


_STEPS = (
    ("stored", "the head schema's columns as stored (admission events compact: 0007)", "", "yes"),
    (
        "instance",
        "an integer per instance in place of its UUID text, in the rows and indexes",
        "instance",
        "yes",
    ),
    ("namespace", "the events without their namespace (the instance names it)", "namespace", "yes"),
    ("ids", "the other ids as 16 bytes (PostgreSQL: `uuid`)", "ids", "yes"),
    ("digests", "the two digests as their 32 bytes", "digests", "yes"),
    (
        "derived",
        "no digests where the row's own arguments give them (plain, not sealed, arguments)",
        "derived",
        "yes",
    ),
    ("codes", "type, scope, status, outcome, reason, encoding, event type as small integers", "codes", "yes"),
    ("times", "times as integer microseconds (PostgreSQL's were 8 bytes already)", "times", "yes"),
    ("context", "the literal key as text in place of its canonical map", "context", "yes"),
    (
        "token",
        "the receipt token as its 32 bytes",
        "token",
        "no: contract §2.5 names the stored token as hex text",
    ),
)


def shapes() -> list[Shape]:
    """The shapes, each with the flags of the ones before it."""
    flags: set[str] = set()
    out = []
    for name, change, flag, allowed in _STEPS:
        if flag:
            flags.add(flag)
        out.append(Shape(name, change, frozenset(flags), allowed))
    return out


# -- the receipts ------------------------------------------------------------------------


def admit(url: str, receipts: int) -> int:
    """Admit ``receipts`` keyed commands (100 per instance) into a new database; the count stored."""
    engine = create_admission_engine(url)
    upgrade(engine)
    engine.dispose()
    store = SqlStore.open(url)
    service = AdmissionService(store)
    instances = max(1, receipts // PER_INSTANCE)
    workflows = [f"shape-{k:06d}" for k in range(instances)]
    for workflow in workflows:
        service.start_run(NAMESPACE, workflow)
    sequence = itertools.count()
    for start in range(0, receipts, SPAN):
        batch = []
        for n in range(start, min(start + SPAN, receipts)):
            # Consecutive calls on consecutive instances, as many callers would make them.
            workflow = workflows[n % instances]
            batch.append(
                BatchCommand("signal", NAMESPACE, workflow, COMMAND, command_arguments(next(sequence)),
                             request_id=f"{workflow}-{n // instances}")
            )  # fmt: skip
        answers = service.admit_many(batch)
        if any(isinstance(a, Exception) for a in answers):
            raise RuntimeError(f"a batch was refused: {answers!r}")
    store.dispose()
    [[(count,)]] = fetch_all(url, [("SELECT count(*) FROM workflow_commands", ())])
    return int(count)


# -- the shapes' tables ------------------------------------------------------------------

_Id16 = LargeBinary().with_variant(postgresql.UUID(as_uuid=True), "postgresql")
_Position = BigInteger().with_variant(Integer(), "sqlite")


def tables(shape: Shape, metadata: MetaData) -> tuple[Table, Table]:
    """The commands' and events' tables of ``shape``, with the indexes of the receipt paths."""
    f = shape.flags
    instance = Integer() if "instance" in f else String()
    ident = _Id16 if "ids" in f else String()
    code = SmallInteger() if "codes" in f else String()
    digest = LargeBinary() if "digests" in f else String()
    when = BigInteger() if "times" in f else DateTime(timezone=True)
    prefix = f"shape_{shape.name}"
    commands = Table(
        f"{prefix}_commands",
        metadata,
        Column("id", ident, primary_key=True),
        Column("instance", instance, nullable=False),
        Column("run_id", ident),
        Column("command_sequence", Integer, nullable=False),
        Column("command_type", code, nullable=False),
        Column("name", String, nullable=False),
        Column("target_scope", code, nullable=False),
        Column("requested_run_id", ident),
        Column("request_id", LargeBinary if "token" in f else String),
        Column("context", String if "context" in f else LargeBinary),
        Column("arguments", LargeBinary),
        Column("status", code, nullable=False),
        Column("outcome", code, nullable=False),
        Column("rejection_reason", code),
        Column("created_at", when, nullable=False),
        Column("intent_digest", digest),
        Column("arguments_digest", digest),
        Column("intent_encoding", code),
        UniqueConstraint("instance", "command_sequence"),
        Index(f"{prefix}_receipt", "instance", "command_type", "request_id", unique=True),
    )
    events = Table(
        f"{prefix}_events",
        metadata,
        Column("position", _Position, primary_key=True, autoincrement=False),
        Column("tx_id", BigInteger, nullable=False),
        *([] if "namespace" in f else [Column("namespace", String, nullable=False)]),
        Column("instance", instance, nullable=False),
        Column("run_id", ident),
        Column("event_type", code, nullable=False),
        Column("command_id", ident),
        Column("update_id", ident),
        Column("payload", LargeBinary, nullable=False),
        Column("recorded_at", when, nullable=False),
        Index(f"{prefix}_events_instance", "instance", "position"),
        Index(f"{prefix}_events_tx", "tx_id", "position"),
    )
    return commands, events


# -- encoding a stored row in a shape, and back -------------------------------------------

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_CODED = (
    "command_type",
    "target_scope",
    "status",
    "outcome",
    "rejection_reason",
    "intent_encoding",
    "event_type",
)
_IDS = ("id", "run_id", "requested_run_id", "command_id", "update_id")


def _plain(arguments: bytes | None) -> bool:
    """Whether stored arguments are the plain arguments (a list or a map), not a sealed text."""
    return arguments is not None and not isinstance(canonical_decode(bytes(arguments)), str)


class Codec:
    """Encodes stored rows in one shape and decodes them back (``postgresql``: ids as ``uuid``)."""

    def __init__(
        self, shape: Shape, instances: Mapping[str, int], codes: Mapping[str, int], postgres: bool
    ) -> None:
        self.flags = shape.flags
        self.instances = instances
        self.by_number = {n: i for i, n in instances.items()}
        self.codes = codes
        self.by_code = {c: s for s, c in codes.items()}
        self.postgres = postgres

    def _id(self, value: str | None) -> Any:
        if value is None or "ids" not in self.flags:
            return value
        parsed = uuid.UUID(value)
        return parsed if self.postgres else parsed.bytes

    def _unid(self, value: Any) -> str | None:
        if value is None or "ids" not in self.flags:
            return value
        return str(value if isinstance(value, uuid.UUID) else uuid.UUID(bytes=bytes(value)))

    def _time(self, value: dt.datetime) -> Any:
        if "times" not in self.flags:
            return value
        return (as_utc(value) - _EPOCH) // dt.timedelta(microseconds=1)

    def _untime(self, value: Any) -> dt.datetime:
        if "times" not in self.flags:
            return as_utc(value)
        return _EPOCH + dt.timedelta(microseconds=value)

    def _token(self, value: str | None) -> Any:
        return value if value is None or "token" not in self.flags else bytes.fromhex(value.split(":", 1)[1])

    def encode_command(self, row: Mapping[str, Any]) -> dict[str, Any]:
        """``row`` (a stored command's columns) in this shape."""
        f = self.flags
        out = dict(row)
        out["instance"] = self.instances[row["instance_id"]] if "instance" in f else row["instance_id"]
        del out["instance_id"]
        for name in _IDS:
            if name in out:
                out[name] = self._id(out[name])
        if "digests" in f:
            for name in ("intent_digest", "arguments_digest"):
                out[name] = None if row[name] is None else bytes.fromhex(row[name])
        if "derived" in f and row["intent_digest"] is not None and _plain(row["arguments"]):
            out["intent_digest"] = out["arguments_digest"] = None
        if "codes" in f:
            for name in _CODED:
                if name in out:
                    out[name] = None if row[name] is None else self.codes[row[name]]
        out["created_at"] = self._time(row["created_at"])
        if "context" in f:
            out["context"] = literal_key(row["context"])
        out["request_id"] = self._token(row["request_id"])
        return out

    def decode_command(self, row: Mapping[str, Any]) -> dict[str, Any]:
        """The stored command's columns again, from ``row`` in this shape."""
        f = self.flags
        out = dict(row)
        out["instance_id"] = self.by_number[row["instance"]] if "instance" in f else row["instance"]
        del out["instance"]
        for name in _IDS:
            if name in out:
                out[name] = self._unid(out[name])
        if "digests" in f:
            for name in ("intent_digest", "arguments_digest"):
                out[name] = None if row[name] is None else bytes(row[name]).hex()
        if "codes" in f:
            for name in _CODED:
                if name in out:
                    out[name] = None if row[name] is None else self.by_code[row[name]]
        out["created_at"] = self._untime(row["created_at"])
        if "derived" in f and out["intent_digest"] is None and out["intent_encoding"] is not None:
            # A modern row (it has an encoding) without digests: its plain arguments give them.
            intent = encode_intent(
                out["command_type"], out["name"], canonical_decode(bytes(out["arguments"])),
                out["requested_run_id"],
            )  # fmt: skip
            out["intent_digest"], out["arguments_digest"] = intent.digest, intent.arguments_digest
        if "context" in f:
            key = row["context"]
            out["context"] = None if key is None else canonical_encode({"request": {"request_id": key}})
        if "token" in f and row["request_id"] is not None:
            out["request_id"] = f"{out['command_type']}-v1:{bytes(row['request_id']).hex()}"
        for name in ("arguments", "context"):
            out[name] = None if out[name] is None else bytes(out[name])
        return out

    def encode_event(self, row: Mapping[str, Any], command: Mapping[str, Any] | None) -> dict[str, Any]:
        """``row`` (a stored event's columns) in this shape; ``command``: its stored command."""
        f = self.flags
        out = dict(row)
        out["instance"] = self.instances[row["instance_id"]] if "instance" in f else row["instance_id"]
        del out["instance_id"]
        if "namespace" in f:
            del out["namespace"]
        for name in _IDS:
            if name in out:
                out[name] = self._id(out[name])
        if "codes" in f:
            out["event_type"] = self.codes[row["event_type"]]
        out["recorded_at"] = self._time(row["recorded_at"])
        if command is not None and row["event_type"] in ADMISSION_EVENTS:
            # As the head stores it (revision 0007): the literal key alone.
            out["payload"], compact = stored_payload(EventRow(**row), command_row(command))
            assert compact, f"the admission event at {row['position']} is not kept compact"
        return out

    def decode_event(
        self, row: Mapping[str, Any], command: Mapping[str, Any] | None, namespace: str
    ) -> dict[str, Any]:
        """The stored event's columns again; ``command``: its command decoded, ``namespace`` its
        instance's."""
        f = self.flags
        out = dict(row)
        out["instance_id"] = self.by_number[row["instance"]] if "instance" in f else row["instance"]
        del out["instance"]
        if "namespace" in f:
            out["namespace"] = namespace
        for name in _IDS:
            if name in out:
                out[name] = self._unid(out[name])
        if "codes" in f:
            out["event_type"] = self.by_code[row["event_type"]]
        out["recorded_at"] = self._untime(row["recorded_at"])
        out["payload"] = bytes(row["payload"])
        if command is not None and out["event_type"] in ADMISSION_EVENTS:
            columns = {name: command[name] for name in COMMAND_COLUMNS}
            out["payload"] = rebuilt(out["payload"], columns, out["position"])
        return out


# -- measuring ----------------------------------------------------------------------------


@dataclass
class Measured:
    """One shape's bytes per receipt on one backend."""

    shape: Shape
    commands: float
    events: float
    pages: tuple[float, float] | None = None
    """SQLite: pages written to the log by one receipt's transaction and by a batch of 32."""

    @property
    def total(self) -> float:
        return self.commands + self.events


def _stored(engine: Engine) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The stored commands' columns, and the events' as the store reads them (whole payloads)."""
    with engine.connect() as conn:
        commands = [
            dict(r)
            for r in conn.execute(select(workflow_commands).order_by(workflow_commands.c.id)).mappings()
        ]
        by_position = readable_events().order_by(workflow_history_events.c.position)
        events = [vars(event_row(r)) for r in conn.execute(by_position).mappings()]
    for row in commands:
        row["created_at"] = as_utc(row["created_at"])
    return commands, events


def _relation_sizes(engine: Engine, names: Sequence[str]) -> dict[str, int]:
    """Bytes of each table in ``names`` with its indexes."""
    with engine.connect() as conn:
        if engine.dialect.name == "postgresql":
            query = "SELECT pg_total_relation_size(%(t)s::regclass)"
            return {t: int(conn.exec_driver_sql(query, {"t": t}).scalar_one()) for t in names}
        query = (
            "SELECT coalesce(sum(pgsize), 0) FROM dbstat WHERE name IN "
            "(SELECT name FROM sqlite_master WHERE tbl_name = ?)"
        )
        return {t: int(conn.exec_driver_sql(query, (t,)).scalar_one()) for t in names}


def measure(url: str, receipts: int, chunk: int = 2000) -> tuple[list[Measured], int, float]:
    """Each shape's bytes per receipt on the database at ``url`` (new), the receipts admitted, and
    the receipt tables' own bytes per receipt (commands and events with their indexes)."""
    count = admit(url, receipts)
    engine = create_admission_engine(url)
    postgres = engine.dialect.name == "postgresql"
    try:
        commands, events = _stored(engine)
        by_id = {c["id"]: c for c in commands}
        instances = {
            i: n
            for n, i in enumerate(
                sorted({c["instance_id"] for c in commands} | {e["instance_id"] for e in events})
            )
        }
        namespace_of = {e["instance_id"]: e["namespace"] for e in events}
        words = sorted({str(r[n]) for r in commands + events for n in _CODED if r.get(n) is not None})
        codes = {w: i for i, w in enumerate(words)}
        own = _relation_sizes(engine, ["workflow_commands", "workflow_history_events"])
        receipt_tables = sum(own.values()) / count
        fresh = None if postgres else _fresh_rows(commands, events, WRITES * (1 + BATCH))
        results = []
        for shape in shapes():
            metadata = MetaData()
            shape_commands, shape_events = tables(shape, metadata)
            metadata.drop_all(engine)
            metadata.create_all(engine)
            codec = Codec(shape, instances, codes, postgres)
            for start in range(0, len(commands), chunk):
                with engine.begin() as conn:
                    encoded = [codec.encode_command(r) for r in commands[start : start + chunk]]
                    conn.execute(insert(shape_commands), encoded)
            for start in range(0, len(events), chunk):
                with engine.begin() as conn:
                    part = events[start : start + chunk]
                    encoded = [codec.encode_event(e, by_id.get(e["command_id"])) for e in part]
                    conn.execute(insert(shape_events), encoded)
            _check(engine, codec, shape_commands, shape_events, commands, events, by_id, namespace_of)
            sizes = _relation_sizes(engine, [shape_commands.name, shape_events.name])
            pages = None
            if not postgres:
                pages = _pages_written(engine, url, codec, shape_commands, shape_events, fresh)
            per_receipt = (sizes[shape_commands.name] / count, sizes[shape_events.name] / count)
            results.append(Measured(shape, *per_receipt, pages))
            metadata.drop_all(engine)
        return results, count, receipt_tables
    finally:
        engine.dispose()


WRITES = 20
"""SQLite: transactions of each kind whose pages are counted, per shape."""
BATCH = 32
"""Receipts in a batch's transaction, over :data:`BATCH_INSTANCES` instances (as ``admit_many``'s)."""
BATCH_INSTANCES = 16

Fresh = list[tuple[dict[str, Any], dict[str, Any]]]


def _fresh_rows(commands: Sequence[Mapping[str, Any]], events: Sequence[Mapping[str, Any]], n: int) -> Fresh:
    """``n`` new receipts (command and admission event, stored columns) on
    :data:`BATCH_INSTANCES` of the loaded instances, each after its instance's last, made from
    that instance's last receipt with a new id, key, sequence and position."""
    last: dict[str, Mapping[str, Any]] = {}
    for row in commands:
        if row["command_sequence"] >= last.get(row["instance_id"], row)["command_sequence"]:
            last[row["instance_id"]] = row
    spread = sorted(last)[:: max(1, len(last) // BATCH_INSTANCES)][:BATCH_INSTANCES]
    template = {e["command_id"]: e for e in events if e["command_id"] is not None}
    sequence = {i: last[i]["command_sequence"] for i in spread}
    position = max(e["position"] for e in events)
    now = dt.datetime.now(dt.UTC)
    out: Fresh = []
    for n_ in range(n):
        instance = spread[n_ % len(spread)]
        sequence[instance] += 1
        position += 1
        key = f"{instance}-fresh-{n_}"
        command = {
            **last[instance],
            "id": time_ordered_id(),
            "command_sequence": sequence[instance],
            "request_id": receipt_token("signal", key),
            "context": context_of(key),
            "created_at": now,
        }
        event = {
            **template[last[instance]["id"]],
            "position": position,
            "command_id": command["id"],
            "payload": canonical_encode(command_payload(command_row(command), key)),
            "recorded_at": now,
        }
        out.append((command, event))
    return out


def _pages_written(
    engine: Engine, url: str, codec: Codec, shape_commands: Table, shape_events: Table, fresh: Fresh | None
) -> tuple[float, float]:
    """SQLite: pages one receipt's transaction and one batch's write to the log, in ``shape``'s
    tables (:func:`bench._pages.sqlite_pages`, a checkpoint before each)."""
    assert fresh is not None
    rows = iter(fresh)

    def write(count: int) -> Callable[[], None]:
        def once() -> None:
            taken = [next(rows) for _ in range(count)]
            with engine.begin() as conn:
                conn.execute(insert(shape_commands), [codec.encode_command(c) for c, _ in taken])
                conn.execute(insert(shape_events), [codec.encode_event(e, c) for c, e in taken])

        return once

    path = make_url(url).database
    assert path is not None
    mine = (shape_commands.name, shape_events.name)
    owned = _owned(engine, mine)
    single = sum(v for k, v in sqlite_pages(path, write(1), WRITES).items() if k in owned)
    batch = sum(v for k, v in sqlite_pages(path, write(BATCH), WRITES).items() if k in owned)
    return single, batch


def _owned(engine: Engine, tables: Sequence[str]) -> set[str]:
    """The names of ``tables`` and of their indexes (SQLite)."""
    with engine.connect() as conn:
        marks = ", ".join("?" * len(tables))
        query = f"SELECT name FROM sqlite_master WHERE tbl_name IN ({marks})"
        return {str(name) for (name,) in conn.exec_driver_sql(query, tuple(tables))}


def _check(
    engine: Engine,
    codec: Codec,
    shape_commands: Table,
    shape_events: Table,
    commands: Sequence[Mapping[str, Any]],
    events: Sequence[Mapping[str, Any]],
    by_id: Mapping[str, Mapping[str, Any]],
    namespace_of: Mapping[str, str],
) -> None:
    """Every row of the shape decodes to the stored row (raises ``AssertionError`` otherwise)."""
    with engine.connect() as conn:
        back = [codec.decode_command(r) for r in conn.execute(select(shape_commands)).mappings()]
        decoded = {c["id"]: c for c in back}
        for stored in commands:
            again = decoded[stored["id"]]
            for name, value in stored.items():
                if (bytes(value) if isinstance(value, memoryview) else value) != again[name]:
                    raise AssertionError(f"{shape_commands.name}: {name} of {stored['id']} is not read back")
        rows = conn.execute(select(shape_events).order_by(shape_events.c.position)).mappings()
        count = 0
        for stored, row in zip(events, rows, strict=True):
            command = decoded.get(stored["command_id"]) if stored["command_id"] in by_id else None
            again = codec.decode_event(row, command, namespace_of[stored["instance_id"]])
            for name, value in stored.items():
                if (bytes(value) if isinstance(value, memoryview) else value) != again[name]:
                    raise AssertionError(
                        f"{shape_events.name}: {name} at {stored['position']} is not read back"
                    )
            count += 1
        if count != len(events) or len(back) != len(commands):
            raise AssertionError("a shape's tables do not hold every row")


# -- the report ---------------------------------------------------------------------------


def report(results: Mapping[str, tuple[list[Measured], int, float]], markdown: bool) -> Iterator[str]:
    """The table of every shape on every backend measured."""
    backends = list(results)
    paged = [b for b in backends if results[b][0][0].pages is not None]
    header = [
        "shape", "what it changes", *(f"{b} bytes per receipt" for b in backends),
        *(f"{b} pages per receipt's transaction / per batch of {BATCH}" for b in paged), "contract allows",
    ]  # fmt: skip
    rows = []
    first = {b: results[b][0][0].total for b in backends}
    for i, shape in enumerate(shapes()):
        cells = [shape.name, shape.change]
        for b in backends:
            m = results[b][0][i]
            cells.append(f"{m.total:,.0f} ({m.commands:,.0f} + {m.events:,.0f}; {m.total / first[b]:.2f}x)")
        for b in paged:
            single, batch = results[b][0][i].pages or (0.0, 0.0)
            cells.append(f"{single:.1f} / {batch:.1f}")
        cells.append(shape.allowed)
        rows.append(cells)
    if markdown:
        yield "| " + " | ".join(header) + " |"
        yield (
            "|"
            + "|".join("---" if i < 2 or i == len(header) - 1 else "---:" for i in range(len(header)))
            + "|"
        )
        yield from ("| " + " | ".join(r) + " |" for r in rows)
    else:
        widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
        for r in [header, *rows]:
            yield "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True))
    for b in backends:
        _, count, own = results[b]
        yield (
            f"# {b}: {count:,} receipts; the receipt tables themselves (commands and events with their "
            f"indexes) {own:,.0f} bytes per receipt; each shape as commands + events"
        )


def main(argv: list[str] | None = None) -> int:
    """Measure every shape and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--receipts", type=int, default=50_000, help="receipts to admit (default 50,000)")
    parser.add_argument("--backend", choices=("sqlite", "postgresql", "all"), default="all")
    parser.add_argument("--pg-url", help="a scratch PostgreSQL database (default: start a private server)")
    parser.add_argument("--markdown", action="store_true", help="print a Markdown table")
    args = parser.parse_args(argv)
    started = time.monotonic()
    results: dict[str, tuple[list[Measured], int, float]] = {}
    with tempfile.TemporaryDirectory(prefix="admission-shapes-") as directory:
        if args.backend in ("sqlite", "all"):
            results["sqlite"] = measure(f"sqlite:///{directory}/shapes.sqlite3", args.receipts)
        if args.backend in ("postgresql", "all"):
            server = None
            url = args.pg_url
            if url is None:
                from tests.support.pgserver import PostgresServer

                server = PostgresServer().start()
                url = server.create_database("admission_shapes")
            try:
                results["postgresql"] = measure(normalize_url(url), args.receipts)
            finally:
                if server is not None:
                    server.stop()
    for line in report(results, args.markdown):
        print(line)
    print(f"# {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
