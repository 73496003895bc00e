"""Admission events are stored compact and read back whole, on SQLite and PostgreSQL (revision 0007).

The same commands go to the memory store, which keeps every payload as
admission built it, and to the SQL store under test, with one clock and one
id source: the histories and the log read back must be the same, byte for
byte, while the table holds each admission event's literal key alone. The
commands cover what a payload can record and what a row can go through
afterwards: keyed and unkeyed signals, an update, refusals (a run that is
not current, no open run), a batch, a released key, pending signals closed
with their run.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from sqlalchemy import select, update

from admission.intent import canonical_decode, canonical_encode
from admission.receipts import AdmissionService, BatchCommand, EventCursor, EventRow, MemoryStore, Store
from admission.sql import SqlStore, audit, create_admission_engine, workflow_history_events
from admission.sql._compact import ADMISSION_EVENTS

NS = "ns"


def _clock() -> Callable[[], datetime]:
    ticks = itertools.count()
    start = datetime(2026, 12, 7, 8, 0, tzinfo=UTC)
    return lambda: start + timedelta(milliseconds=next(ticks))


def _ids() -> Callable[[], str]:
    numbers = itertools.count(1)
    return lambda: f"00000000-0000-7000-8000-{next(numbers):012d}"


def _script(service: AdmissionService) -> None:
    """Every kind of admission event, and every later change of a command's row."""
    first = service.start_run(NS, "wf")
    service.admit_signal(NS, "wf", "paid", {"amount": 1}, request_id="key-1")
    service.admit_signal(NS, "wf", "paid", {"amount": 2})  # no key
    service.admit_signal(NS, "wf", "paid", {"amount": 3}, request_id="key-\x00-\U0001f600")
    accepted = service.admit_update(NS, "wf", "set", ["x"], request_id="upd-1")
    assert accepted.update_id is not None
    # Refused: a run that is not the current one (a keyed refusal is a receipt too).
    service.admit_signal(
        NS, "wf", "paid", [], request_id="key-2", run_id="00000000-0000-7000-8000-999999999999"
    )
    service.admit_many(
        [BatchCommand("signal", NS, "wf", "paid", {"n": n}, request_id=f"batch-{n}") for n in range(3)]
        + [BatchCommand("update", NS, "wf", "set", ["y"], request_id="batch-upd")]
    )
    # The update's key released: the row forgets its key, the event keeps it.
    service.release_update(NS, "wf", accepted.update_id, failure="boom")
    # The run closed with signals still pending: their rows get a reason their events never had.
    service.close_run(NS, "wf", "completed", run_id=first.run_id)
    # Refused: no open run.
    service.admit_signal(NS, "wf", "paid", [], request_id="key-3")


def _run(store: Store) -> AdmissionService:
    service = AdmissionService(store, clock=_clock(), new_id=_ids())
    _script(service)
    return service


def test_the_store_gives_every_payload_back_as_admission_built_it(db_url: str) -> None:
    memory = _run(MemoryStore())
    store = SqlStore.open(db_url)
    try:
        sql = _run(store)
        expected = [
            (e.event_type, e.command_id, e.payload) for e in memory.store.read_history(_instance(memory))
        ]
        history = store.read_history(_instance(sql))
        assert [(e.event_type, e.command_id, e.payload) for e in history] == expected
        logged = store.read_events(EventCursor(), 1000)
        assert [(e.event_type, e.command_id, e.payload) for e in logged] == expected
        assert [h.payload for h in sql.history(NS, "wf")] == [canonical_decode(p) for _, _, p in expected]
    finally:
        store.dispose()
    # The table holds each admission event's literal key alone; every other event whole.
    engine = create_admission_engine(db_url)
    try:
        with engine.connect() as conn:
            events = workflow_history_events.c
            stored = conn.execute(
                select(events.event_type, events.payload, events.compact_payload).order_by(events.position)
            ).all()
    finally:
        engine.dispose()
    whole = {(t, c): p for t, c, p in expected}
    admissions = 0
    for (event_type, payload, compact), (_, command_id, original) in zip(stored, expected, strict=True):
        if event_type in ADMISSION_EVENTS:
            admissions += 1
            key = canonical_decode(original)["request_id"]  # type: ignore[index]
            assert compact is True
            assert bytes(payload) == canonical_encode({} if key is None else {"request_id": key})
        else:
            assert compact is None and bytes(payload) == whole[(event_type, command_id)]
    assert admissions == 10  # every command of the script


def test_an_event_appended_with_a_payload_of_its_own_is_kept_whole(db_url: str) -> None:
    store = SqlStore.open(db_url)
    try:
        service = AdmissionService(store)
        service.start_run(NS, "wf")
        answer = service.admit_signal(NS, "wf", "paid", [], request_id="k")
        instance = _instance(service)
        # Through the port, an admission event's type with a payload admission did not build.
        own = canonical_encode({"note": "written by hand"})
        with store.locked(NS, "wf", created_at=datetime.now(UTC), new_id="unused") as tx:
            tx.append_event(_event(instance, answer.command_id, own))
        assert store.read_history(instance)[-1].payload == own
    finally:
        store.dispose()


def test_a_compact_event_whose_key_is_not_its_command_s_is_an_audit_finding(db_url: str) -> None:
    store = SqlStore.open(db_url)
    try:
        service = AdmissionService(store)
        service.start_run(NS, "wf")
        answer = service.admit_signal(NS, "wf", "paid", [], request_id="mine")
    finally:
        store.dispose()
    engine = create_admission_engine(db_url)
    try:
        assert audit(engine).ok
        events = workflow_history_events
        with engine.begin() as conn:
            conn.execute(
                update(events)
                .where(events.c.command_id == answer.command_id)
                .values(payload=canonical_encode({"request_id": "theirs"}))
            )
        report = audit(engine)
        assert [(f.kind, f.key) for f in report.findings] == [
            ("event_key_mismatch", {"id": answer.command_id})
        ]
    finally:
        engine.dispose()


def _instance(service: AdmissionService) -> str:
    found = service.store.find_instance(NS, "wf")
    assert found is not None
    return found.id


def _event(instance: str, command_id: str | None, payload: bytes) -> EventRow:
    return EventRow(NS, instance, None, "SignalReceived", command_id, None, payload, datetime.now(UTC))
