"""The durable worker where SQL is the subject: the caller's transaction, rival relays, downgrades.

Everything the worker does through its store port is in ``tests/contract/test_worker_store.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import Engine, func, select

from admission.errors import (
    StorageError,
    WorkerLockedError,
)
from admission.receipts import AdmissionService
from admission.sql import SqlStore, SqlWorkerStore, create_admission_engine, outbox_cursors
from admission.worker import (
    OUTBOX_EVENT,
    DurableWorker,
    FileLock,
    OutboxRelay,
    Scope,
    WorkerLimits,
    record_outbox,
)

SCOPE = Scope.parse({"tenant": "t1", "account": "a1", "page": "p1", "form": "f1"})


def record(key: str, payload: object = None) -> dict[str, object]:
    return {**SCOPE.as_dict(), "source_key": key, "payload": payload if payload is not None else {"n": key}}


def count(engine: Engine, table: object) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(table)).scalar_one())  # type: ignore[arg-type]


def test_the_file_lock_is_exclusive(tmp_path: Path) -> None:
    first, second = FileLock(tmp_path / "q.lock"), FileLock(tmp_path / "q.lock")
    first.acquire()
    with pytest.raises(WorkerLockedError):
        second.acquire()
    first.release()
    second.acquire()
    second.release()


# -- the outbox (issue 6 item 1) -----------------------------------------------------------------


def test_an_outbox_entry_commits_with_its_admission_and_is_relayed_once(db_url: str) -> None:
    store = SqlStore.open(db_url)
    service = AdmissionService(store)
    worker = DurableWorker(SqlWorkerStore(store.engine), SCOPE, file_lock=False)
    relay = OutboxRelay(store, worker, target="crm")
    service.start_run("ns", "wf-1")
    with pytest.raises(RuntimeError), store.begin() as conn:
        record_outbox(store, conn, "ns", "wf-1", target="crm", source_key="lost", content=record("lost"))
        raise RuntimeError("the admission failed")
    with store.begin() as conn:
        service.admit_signal("ns", "wf-1", "lead", {"id": 1}, request_id="r-1", connection=conn)
        record_outbox(store, conn, "ns", "wf-1", target="crm", source_key="lead-1", content=record("lead-1"))
        record_outbox(store, conn, "ns", "wf-1", target="mail", source_key="m-1", content=record("m-1"))
    first = relay.pump()
    assert (first.accepted, first.duplicates) == (1, 0)
    assert relay.pump().read == 0
    assert [r["source_key"] for r in worker.status()["records"]] == ["lead-1"]  # type: ignore[union-attr]
    events = store.read_events(relay.cursor(), 100)
    assert events == []
    outbox = [
        e for e in store.read_history(store.find_instance("ns", "wf-1").id) if e.event_type == OUTBOX_EVENT
    ]  # type: ignore[union-attr]
    assert len(outbox) == 2
    store.dispose()


def test_a_second_relay_that_moved_the_cursor_first_makes_this_one_stop_not_repeat(db_url: str) -> None:
    store, other_store = SqlStore.open(db_url), SqlStore.open(db_url)
    service = AdmissionService(store)
    worker = DurableWorker(SqlWorkerStore(store.engine), SCOPE, file_lock=False)
    relay = OutboxRelay(store, worker, target="crm")
    rival = OutboxRelay(
        other_store, DurableWorker(SqlWorkerStore(other_store.engine), SCOPE, file_lock=False), target="crm"
    )
    service.start_run("ns", "wf-1")
    with store.begin() as conn:
        for key in ("lead-1", "lead-2"):
            record_outbox(store, conn, "ns", "wf-1", target="crm", source_key=key, content=record(key))
    read_events = store.read_events

    def read_then_lose_the_race(after: object, limit: int) -> object:
        events = read_events(after, limit)  # type: ignore[arg-type]
        assert rival.pump().accepted == 2  # the other process relays them all first
        return events

    store.read_events = read_then_lose_the_race  # type: ignore[method-assign, assignment]
    with pytest.raises(StorageError, match="moved by another process"):
        relay.pump()
    store.read_events = read_events  # type: ignore[method-assign]
    # Each entry was accepted once, by the rival; this relay wrote nothing and now stands past them.
    assert sorted(r["source_key"] for r in worker.status()["records"]) == ["lead-1", "lead-2"]  # type: ignore[union-attr]
    assert relay.cursor() == rival.cursor() and relay.pump().read == 0
    store.dispose()
    other_store.dispose()


def test_a_full_queue_stops_the_relay_without_moving_its_cursor(db_url: str) -> None:
    store = SqlStore.open(db_url)
    worker = DurableWorker(
        SqlWorkerStore(store.engine), SCOPE, file_lock=False, limits=WorkerLimits(max_waiting=1)
    )
    relay = OutboxRelay(store, worker, target="crm")
    for key in ("a", "b"):
        with store.begin() as conn:
            record_outbox(store, conn, "ns", "wf", target="crm", source_key=key, content=record(key))
    report = relay.pump()
    assert (report.accepted, report.blocked) == (1, True)
    cursor = relay.cursor()
    assert relay.pump().blocked and relay.cursor() == cursor
    assert count(store.engine, outbox_cursors) == 1
    store.dispose()


def test_the_downgrade_of_0003_is_refused_while_worker_records_exist(db_url: str) -> None:
    from admission.sql import HEAD_REVISION, downgrade, revision_of

    engine = create_admission_engine(db_url)
    try:
        worker = DurableWorker(SqlWorkerStore(engine), SCOPE, file_lock=False)
        worker.accept(record("k"))
        with pytest.raises(RuntimeError, match="refusing to downgrade: 1 worker records"):
            downgrade(engine, "0002")
        assert revision_of(engine) == HEAD_REVISION  # one transaction: nothing was downgraded
        assert worker.find("k").state == "prepared"
        downgrade(engine, "0002", allow_unsafe=True)
        assert revision_of(engine) == "admission_0002"
    finally:
        engine.dispose()
