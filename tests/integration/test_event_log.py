"""The event log is read after a cursor and never skips an event (docs/event-log.md).

On PostgreSQL positions come from a sequence, and transactions commit in any
order, so an event can become visible after an event with a higher position.
A reader that advanced by position alone would pass it for good.  These tests
race real OS processes (``spawn``): writers append events in transactions
they hold open, readers poll from a cursor, and nothing is ever missed.  On
SQLite (one writer at a time) the same tests hold as well.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import random
import time
import traceback
from collections.abc import Iterator
from contextlib import suppress
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, select

from admission.receipts import AdmissionService, EventCursor, EventRow
from admission.sql import SqlStore, normalize_url, workflow_history_events
from tests.support.processes import WAIT, running

CTX = multiprocessing.get_context("spawn")
NS = "tenant-log"
"""Upper bound for any wait on a worker: only a hang ever reaches it."""

events = workflow_history_events


# -- worker processes (module-level so that ``spawn`` can import them) -----------------------------


def _report_failure(results: Any, who: str) -> None:
    results.put({"who": who, "error": traceback.format_exc()})


def _append_and_hold(db_url: str, workflow_id: str, commit: Any, results: Any) -> None:
    """Transaction A: admit a signal in a caller-owned transaction, report it, commit only when told."""
    try:
        store = SqlStore.open(db_url)
        service = AdmissionService(store)
        with store.begin() as conn:
            answer = service.admit_signal(NS, workflow_id, "a", [], request_id="held", connection=conn)
            row = conn.execute(
                select(events.c.position, events.c.tx_id).where(events.c.command_id == answer.command_id)
            ).one()
            results.put(
                {
                    "who": "A",
                    "stage": "appended",
                    "command_id": answer.command_id,
                    "position": row[0],
                    "tx_id": row[1],
                }
            )
            if not commit.wait(WAIT):
                os._exit(3)  # never commit unless told
        results.put({"who": "A", "stage": "committed"})
        store.dispose()
    except BaseException:
        _report_failure(results, "A")


def _admit_and_commit(db_url: str, workflow_id: str, calling: Any, results: Any) -> None:
    """Transaction B: admit a signal (the service commits it) and report its event."""
    try:
        store = SqlStore.open(db_url)
        service = AdmissionService(store)
        store.find_instance(NS, workflow_id)
        calling.set()
        answer = service.admit_signal(NS, workflow_id, "b", [], request_id="later")
        with store.engine.connect() as conn:
            position, tx_id = conn.execute(
                select(events.c.position, events.c.tx_id).where(events.c.command_id == answer.command_id)
            ).one()
        results.put(
            {
                "who": "B",
                "stage": "committed",
                "command_id": answer.command_id,
                "position": position,
                "tx_id": tx_id,
            }
        )
        store.dispose()
    except BaseException:
        _report_failure(results, "B")


def _write(
    db_url: str, workflows: list[str], transactions: int, seed: int, barrier: Any, results: Any
) -> None:
    """A writer: transactions of one or two events each, with random sleeps while they are open."""
    try:
        rng = random.Random(seed)
        store = SqlStore.open(db_url)
        service = AdmissionService(store)
        store.find_instance(NS, workflows[0])
        barrier.wait(WAIT)
        started = time.monotonic()
        written = 0
        for t in range(transactions):
            workflow_id = rng.choice(workflows)
            with store.begin() as conn:
                for e in range(rng.randint(1, 2)):
                    service.admit_signal(NS, workflow_id, "tick", [seed, t, e], connection=conn)
                    written += 1
                    time.sleep(rng.uniform(0, 0.004))
            time.sleep(rng.uniform(0, 0.002))
        store.dispose()
        results.put({"who": "writer", "written": written, "seconds": time.monotonic() - started})
    except BaseException:
        _report_failure(results, "writer")
        barrier.abort()


def _tail(db_url: str, seed: int, barrier: Any, control: Any, results: Any) -> None:
    """The reader: follow the log from the start with ``read_events`` until told how many events exist."""
    try:
        rng = random.Random(seed)
        store = SqlStore.open(db_url)
        barrier.wait(WAIT)
        seen: list[tuple[int, int]] = []
        cursor = EventCursor()
        expected: int | None = None
        read_while_writing = 0
        idle_since: float | None = None
        polls = 0
        while True:
            if expected is None:
                with suppress(queue.Empty):
                    expected = control.get_nowait()
                    read_while_writing = len(seen)
            batch = store.read_events(cursor, rng.randint(1, 8))
            polls += 1
            seen.extend((e.tx_id, e.position) for e in batch)
            if batch:
                cursor = EventCursor(batch[-1].tx_id, batch[-1].position)
                idle_since = None
                continue
            if expected is not None:
                # Everything has committed: stop once all is read, or once the
                # log stays empty (a skipped event would never come).
                idle_since = idle_since or time.monotonic()
                if len(seen) >= expected or time.monotonic() - idle_since > 2:
                    break
            time.sleep(0.001)
        store.dispose()
        results.put({"who": "reader", "seen": seen, "polls": polls, "read_while_writing": read_while_writing})
    except BaseException:
        _report_failure(results, "reader")
        barrier.abort()


# -- helpers of the parent ---------------------------------------------------------------------------


def receive(results: Any, who: str) -> dict[str, Any]:
    """The next report, which must come from ``who``; a worker's exception fails the test."""
    report: dict[str, Any] = results.get(timeout=WAIT)
    assert "error" not in report, f"worker {report['who']} failed:\n{report['error']}"
    assert report["who"] == who, report
    return report


def committed_positions_after(db: Engine, position: int) -> list[int]:
    """What a reader going by position alone would see: every committed event above ``position``."""
    with db.connect() as conn:
        return list(
            conn.execute(
                select(events.c.position).where(events.c.position > position).order_by(events.c.position)
            )
            .scalars()
            .all()
        )


def last(batch: list[EventRow]) -> EventCursor:
    return EventCursor(batch[-1].tx_id, batch[-1].position)


@pytest.fixture
def sql_store(db_url: str) -> Iterator[SqlStore]:
    store = SqlStore.open(db_url)
    yield store
    store.dispose()


@pytest.fixture
def observer(db_url: str) -> Iterator[Engine]:
    """A plain engine for looking at the rows; on SQLite its reads take no lock (admission's writes do)."""
    engine = create_engine(normalize_url(db_url))
    yield engine
    engine.dispose()


# -- an event that commits later with a lower position --------------------------------------------------


def test_reader_does_not_pass_an_event_whose_transaction_is_still_open(
    sql_store: SqlStore, observer: Engine, db_url: str
) -> None:
    service = AdmissionService(sql_store)
    service.start_run(NS, "wf-a")
    service.start_run(NS, "wf-b")
    setup = sql_store.read_events(EventCursor(), 100)
    assert [e.event_type for e in setup] == ["RunStarted", "RunStarted"]
    cursor = last(setup)

    commit, calling, results = CTX.Event(), CTX.Event(), CTX.Queue()
    a = CTX.Process(target=_append_and_hold, args=(db_url, "wf-a", commit, results))
    b = CTX.Process(target=_admit_and_commit, args=(db_url, "wf-b", calling, results))
    with running(a):
        appended = receive(results, "A")
        with running(b):
            if sql_store.postgres:
                # B commits while A is still open: its event has a higher
                # position than A's and is visible, so a reader going by
                # position would pass A's event and never come back for it.
                later = receive(results, "B")
                assert later["position"] > appended["position"]
                assert later["tx_id"] > appended["tx_id"]
                assert committed_positions_after(observer, cursor.position) == [later["position"]]
            else:
                # SQLite has one writer at a time: B waits for A's lock.
                assert calling.wait(WAIT)
                time.sleep(0.3)
                assert results.empty() and b.is_alive()
                assert committed_positions_after(observer, cursor.position) == []
            for _ in range(3):
                assert sql_store.read_events(cursor, 100) == []
            commit.set()
            assert receive(results, "A")["stage"] == "committed"
            if not sql_store.postgres:
                later = receive(results, "B")
                assert later["position"] > appended["position"]
    assert (a.exitcode, b.exitcode) == (0, 0)

    # Continuing from the same cursor: A's event, then B's, nothing skipped.
    first = sql_store.read_events(cursor, 1)
    assert [(e.command_id, e.position) for e in first] == [(appended["command_id"], appended["position"])]
    second = sql_store.read_events(last(first), 1)
    assert [(e.command_id, e.position) for e in second] == [(later["command_id"], later["position"])]
    assert sql_store.read_events(last(second), 100) == []


# -- randomized stress: concurrent writers, one tailing reader ------------------------------------------

WRITERS = 4
TRANSACTIONS = 25
WORKFLOWS = [f"wf-{i}" for i in range(8)]


def test_tailing_reader_sees_every_event_exactly_once_in_cursor_order_under_concurrent_writers(
    sql_store: SqlStore, observer: Engine, db_url: str
) -> None:
    seed = random.randrange(2**32)
    service = AdmissionService(sql_store)
    for workflow_id in WORKFLOWS:
        service.start_run(NS, workflow_id)
    barrier, control, results = CTX.Barrier(WRITERS + 1), CTX.Queue(), CTX.Queue()
    writers = [
        CTX.Process(target=_write, args=(db_url, WORKFLOWS, TRANSACTIONS, seed + n, barrier, results))
        for n in range(WRITERS)
    ]
    reader = CTX.Process(target=_tail, args=(db_url, seed, barrier, control, results))
    with running(reader, *writers):
        written = sum(receive(results, "writer")["written"] for _ in writers)
        for writer in writers:
            writer.join(WAIT)
        with observer.connect() as conn:
            stored = conn.execute(select(events.c.tx_id, events.c.position)).all()
        assert len(stored) == written + len(WORKFLOWS)
        control.put(len(stored))
        report = receive(results, "reader")

    seen = report["seen"]
    # The reader really tailed the log while the writers were writing.
    assert report["read_while_writing"] > len(WORKFLOWS)
    assert len(set(seen)) == len(seen), f"seed {seed}: an event was read twice"
    assert seen == sorted(seen), f"seed {seed}: not in cursor order"
    # Every committed event was read: had the reader passed an event that
    # committed later behind its cursor, it would be missing here.
    missing = sorted({p for _, p in stored} - {p for _, p in seen})
    assert missing == [], f"seed {seed}: skipped positions {missing}"
    assert sorted(map(tuple, stored)) == seen
