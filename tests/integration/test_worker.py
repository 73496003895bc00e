"""The durable worker on every SQL backend: intake, the write cycle, ownership, observation, outbox."""

from __future__ import annotations

import json
import pickle
import uuid
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine, func, select

from admission.errors import (
    BeforeWriteError,
    FencedError,
    InvalidRecordError,
    LeaseHeldError,
    QueueFullError,
    RecordStateError,
    ScopeMismatchError,
    StorageError,
    TargetTimeoutError,
    WorkerLockedError,
)
from admission.receipts import AdmissionService
from admission.sql import SqlStore, create_admission_engine, outbox_cursors, worker_events, worker_records
from admission.testing import FaultyTarget
from admission.worker import (
    OUTBOX_EVENT,
    DurableWorker,
    FileLock,
    OutboxRelay,
    Readback,
    Scope,
    SqliteTarget,
    StatusRead,
    TargetRecord,
    WorkerLimits,
    record_outbox,
    write_json_atomically,
)

SCOPE = Scope.parse({"tenant": "t1", "account": "a1", "page": "p1", "form": "f1"})


def record(key: str, payload: object = None) -> dict[str, object]:
    return {**SCOPE.as_dict(), "source_key": key, "payload": payload if payload is not None else {"n": key}}


@pytest.fixture
def engine(db_url: str) -> Iterator[Engine]:
    engine = create_admission_engine(db_url)
    yield engine
    engine.dispose()


@pytest.fixture
def target(tmp_path: Path) -> SqliteTarget:
    return SqliteTarget(tmp_path / "target.sqlite3")


def worker_on(engine: Engine, **options: object) -> DurableWorker:
    options.setdefault("file_lock", False)
    return DurableWorker(engine, SCOPE, **options)  # type: ignore[arg-type]


def count(engine: Engine, table: object) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(table)).scalar_one())  # type: ignore[arg-type]


class Counting:
    """A target that counts writes, and can fail each write in a chosen way."""

    def __init__(self, inner: SqliteTarget, failures: Sequence[BaseException | None] = ()) -> None:
        self.inner = inner
        self.failures = list(failures)
        self.writes = 0

    def write(self, record: TargetRecord) -> None:
        self.writes += 1
        failure = self.failures.pop(0) if self.failures else None
        if isinstance(failure, BeforeWriteError):
            raise failure
        if failure is not None:
            raise failure  # without writing: the target never got it
        self.inner.write(record)

    def read_back(self, write_id: str) -> Readback:
        return self.inner.read_back(write_id)

    def observe_status(self, write_ids: Sequence[str]) -> list[StatusRead]:
        return self.inner.observe_status(write_ids)


# -- intake (contract §1) ------------------------------------------------------------------------


def test_accept_replay_is_duplicate_changed_content_is_conflict_and_write_id_survives_restart(
    engine: Engine,
) -> None:
    worker = worker_on(engine)
    first = worker.accept(record("k1"))
    assert first.outcome == "accepted" and first.state == "prepared"
    again = worker_on(engine).accept(record("k1"))
    assert (again.outcome, again.write_id) == ("duplicate", first.write_id)
    changed = worker_on(engine).accept(record("k1", {"n": "other"}))
    assert (changed.outcome, changed.write_id) == ("conflict", first.write_id)
    assert count(engine, worker_records) == 1
    assert [e["event_type"] for e in worker.events()] == ["accepted"]


@pytest.mark.parametrize("field", ["tenant", "account", "page", "form"])
def test_a_record_outside_any_scope_field_is_refused_with_nothing_written(engine: Engine, field: str) -> None:
    worker = worker_on(engine)
    with pytest.raises(ScopeMismatchError) as refused:
        worker.accept({**record("k"), field: "elsewhere"})
    assert refused.value.field == field
    assert count(engine, worker_records) == 0 and count(engine, worker_events) == 0


@pytest.mark.parametrize(
    ("bad", "field"),
    [
        ({"source_key": ""}, "source_key"),
        ({"source_key": 5}, "source_key"),
        ({"extra": 1}, "extra"),
        ({"payload": {"x": object()}}, "payload"),
    ],
)
def test_bad_input_is_a_typed_error_naming_the_field(
    engine: Engine, bad: dict[str, object], field: str
) -> None:
    worker = worker_on(engine)
    with pytest.raises(InvalidRecordError) as refused:
        worker.accept({**record("k"), **bad})
    assert refused.value.field == field
    assert count(engine, worker_records) == 0
    assert pickle.loads(pickle.dumps(refused.value)).field == field


def test_a_missing_scope_field_is_refused() -> None:
    with pytest.raises(InvalidRecordError) as refused:
        Scope.parse({"account": "a"})
    assert refused.value.field == "scope.tenant"


def test_the_scope_is_pinned_and_another_scope_is_refused(engine: Engine) -> None:
    worker_on(engine)
    other = Scope.parse({**SCOPE.as_dict(), "form": "f2"})
    with pytest.raises(ScopeMismatchError) as refused:
        DurableWorker(engine, other, file_lock=False)
    assert refused.value.field == "form"


def test_the_queue_bound_refuses_clearly_and_drops_nothing(engine: Engine, target: SqliteTarget) -> None:
    worker = worker_on(engine, limits=WorkerLimits(max_waiting=3))
    ids = [worker.accept(record(f"k{i}")).write_id for i in range(3)]
    with pytest.raises(QueueFullError) as full:
        worker.accept(record("k3"))
    assert full.value.limit == 3
    assert worker.accept(record("k0")).outcome == "duplicate"  # a replay still answers
    worker.run_once(target)
    assert sorted(target.write_ids()) == sorted(ids)
    assert worker.accept(record("k3")).outcome == "accepted"  # room again once settled


# -- the write cycle (contract §2) ---------------------------------------------------------------


def test_a_before_write_error_retries_and_the_last_attempt_ends_failed_safe(
    engine: Engine, target: SqliteTarget
) -> None:
    worker = worker_on(engine)
    write_id = worker.accept(record("k")).write_id
    outage = FaultyTarget(target, "outage")
    reports = [worker.run_once(outage) for _ in range(3)]
    assert [r.retried for r in reports] == [1, 1, 0] and reports[2].failed_safe == 1
    row = worker.get(write_id)
    assert (row["state"], row["attempts"]) == ("failed_safe", 3)
    assert worker.run_once(target).sent == 0
    assert target.write_ids() == []


def test_a_timeout_is_uncertain_and_an_exact_readback_confirms_it_without_resending(
    engine: Engine, target: SqliteTarget
) -> None:
    worker = worker_on(engine)
    write_id = worker.accept(record("k")).write_id
    assert worker.run_once(FaultyTarget(target, "timeout")).uncertain == 1
    assert worker.get(write_id)["state"] == "uncertain"
    counting = Counting(target)
    report = worker.run_once(counting)
    assert report.reconciled == 1 and counting.writes == 0
    assert worker.get(write_id)["state"] == "confirmed"
    assert target.write_ids() == [write_id] and target.duplicate_attempts() == 0


def test_an_uncertain_record_with_an_empty_readback_is_never_resent(
    engine: Engine, target: SqliteTarget
) -> None:
    worker = worker_on(engine)
    write_id = worker.accept(record("k")).write_id
    lost = Counting(target, [TargetTimeoutError("lost on the way")])
    worker.run_once(lost)
    for _ in range(3):
        assert worker.run_once(lost).still_uncertain == 1
    assert lost.writes == 1 and worker.get(write_id)["state"] == "uncertain"


def test_a_readback_with_other_content_does_not_confirm(engine: Engine, target: SqliteTarget) -> None:
    worker = worker_on(engine)
    write_id = worker.accept(record("k")).write_id
    worker.run_once(Counting(target, [RuntimeError("connection reset")]))
    target.write(TargetRecord(write_id, "t1", "k", b"not the record"))
    assert worker.run_once(target).still_uncertain == 1
    assert worker.get(write_id)["state"] == "uncertain"


def test_resolve_needs_who_and_why_and_records_them(engine: Engine, target: SqliteTarget) -> None:
    worker = worker_on(engine)
    write_id = worker.accept(record("k")).write_id
    with pytest.raises(RecordStateError):
        worker.resolve(write_id, "confirm", actor="ops", reason="checked")
    worker.run_once(Counting(target, [TargetTimeoutError("lost")]))
    with pytest.raises(InvalidRecordError) as refused:
        worker.resolve(write_id, "release", actor=" ", reason="x")
    assert refused.value.field == "actor"
    with pytest.raises(InvalidRecordError):
        worker.resolve(write_id, "retry", actor="ops", reason="x")
    assert worker.resolve(write_id, "release", actor="ops@example", reason="target has no row") == "prepared"
    last = worker.events(write_id)[-1]
    assert (last["event_type"], last["actor"], last["reason"]) == (
        "resolve_release",
        "ops@example",
        "target has no row",
    )
    assert worker.run_once(target).confirmed == 1
    assert target.write_ids() == [write_id]


def test_diagnostics_are_bounded_and_marked(engine: Engine, target: SqliteTarget) -> None:
    worker = worker_on(engine)
    write_id = worker.accept(record("k")).write_id
    worker.run_once(Counting(target, [RuntimeError("x" * 10_000)]))
    diagnostic = worker.get(write_id)["diagnostic"]
    assert len(diagnostic.encode()) <= 2048 and diagnostic.endswith("[truncated]")


def test_every_transition_is_an_event_with_its_states(engine: Engine, target: SqliteTarget) -> None:
    worker = worker_on(engine)
    write_id = worker.accept(record("k")).write_id
    worker.run_once(FaultyTarget(target, "outage"))
    worker.run_once(target)
    steps = [(e["event_type"], e["from_state"], e["to_state"]) for e in worker.events(write_id)]
    assert steps == [
        ("accepted", None, "prepared"),
        ("dispatch", "prepared", "in_flight"),
        ("before_write_error", "in_flight", "prepared"),
        ("dispatch", "prepared", "in_flight"),
        ("acknowledged", "in_flight", "confirmed"),
    ]


def test_a_record_left_in_flight_is_uncertain_at_the_next_start(engine: Engine, target: SqliteTarget) -> None:
    class Stop(BaseException):
        pass

    def crash(point: str) -> None:
        if point == "after_in_flight":
            raise Stop

    worker = worker_on(engine, hook=crash)
    write_id = worker.accept(record("k")).write_id
    with pytest.raises(Stop):
        worker.run_once(target)
    assert worker.get(write_id)["state"] == "in_flight"
    counting = Counting(target)
    report = worker_on(engine).run_once(counting)
    assert (report.recovered, report.still_uncertain, counting.writes) == (1, 1, 0)
    assert worker.get(write_id)["state"] == "uncertain"


def test_a_crash_inside_a_send_batch_leaves_the_whole_batch_uncertain_and_unsent(
    engine: Engine, target: SqliteTarget
) -> None:
    class Stop(BaseException):
        pass

    def crash(point: str) -> None:
        if point == "after_in_flight":
            raise Stop

    worker = worker_on(engine, hook=crash, send_batch=4)
    ids = [worker.accept(record(f"k{i}")).write_id for i in range(6)]
    with pytest.raises(Stop):
        worker.run_once(target)
    assert [worker.get(i)["state"] for i in ids] == ["in_flight"] * 4 + ["prepared"] * 2
    counting = Counting(target)
    report = worker_on(engine, send_batch=4).run_once(counting)
    assert (report.recovered, report.still_uncertain, report.confirmed, counting.writes) == (4, 4, 2, 2)
    assert sorted(target.write_ids()) == sorted(ids[4:])


def test_batched_sends_confirm_every_record_once(engine: Engine, target: SqliteTarget) -> None:
    worker = worker_on(engine, send_batch=3)
    ids = [worker.accept(record(f"k{i}")).write_id for i in range(7)]
    report = worker.run_once(target)
    assert (report.sent, report.confirmed) == (7, 7)
    assert sorted(target.write_ids()) == sorted(ids)
    assert all(
        [e["event_type"] for e in worker.events(i)] == ["accepted", "dispatch", "acknowledged"] for i in ids
    )
    with pytest.raises(InvalidRecordError):
        worker_on(engine, send_batch=0)


# -- ownership (contract §3) ---------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_an_expired_lease_is_reclaimed_with_a_new_token_and_the_old_owner_is_fenced(
    db_url: str, target: SqliteTarget
) -> None:
    engine_a, engine_b = create_admission_engine(db_url), create_admission_engine(db_url)
    clock_a, clock_b = Clock(), Clock()
    old = DurableWorker(engine_a, SCOPE, file_lock=False, monotonic=clock_a, lease_ttl=10)
    new = DurableWorker(engine_b, SCOPE, file_lock=False, monotonic=clock_b, lease_ttl=10)
    write_id = old.accept(record("k")).write_id
    token = old.claim()
    with pytest.raises(LeaseHeldError):
        new.claim()
    clock_b.now += 9
    with pytest.raises(LeaseHeldError):
        new.claim()  # not yet ttl on the claimant's own clock
    old.renew()  # the heartbeat moves: the claimant starts watching again
    clock_b.now += 9
    with pytest.raises(LeaseHeldError):
        new.claim()
    clock_b.now += 10
    assert new.claim() == token + 1
    row = old.get(write_id)
    with pytest.raises(FencedError) as fenced:
        old._transition(row, "dispatch", "late write of an expired owner")
    assert fenced.value.token == token
    with pytest.raises(FencedError):
        old._dispatch([row], [])  # the batched transition (one executemany) is refused too
    with pytest.raises(FencedError):
        old.renew()
    assert old.get(write_id)["state"] == "prepared"
    assert new.run_once(target).confirmed == 1
    engine_a.dispose()
    engine_b.dispose()


def test_an_owner_that_keeps_its_lease_while_idle_and_reading_back_is_never_taken_over(
    db_url: str, target: SqliteTarget
) -> None:
    engine_a, engine_b = create_admission_engine(db_url), create_admission_engine(db_url)
    clock_a, clock_b = Clock(), Clock()
    owner = DurableWorker(engine_a, SCOPE, file_lock=False, monotonic=clock_a, lease_ttl=10)
    other = DurableWorker(engine_b, SCOPE, file_lock=False, monotonic=clock_b, lease_ttl=10)
    write_id = owner.accept(record("k")).write_id
    with owner.owned():
        owner.run_once(FaultyTarget(target, "timeout"))  # leaves the record uncertain
        target.delete(write_id)  # and its readbacks find nothing
        for _ in range(4):  # idle, then a cycle whose only work is a readback that finds nothing
            with pytest.raises(LeaseHeldError):
                other.claim()
            clock_a.now += 6
            clock_b.now += 6
            owner.keep_lease()
            clock_a.now += 6
            clock_b.now += 6
            assert owner.run_once(target).still_uncertain == 1
        with pytest.raises(LeaseHeldError):
            other.claim()  # 48 s on both clocks, yet the heartbeat never stood still for 10
    engine_a.dispose()
    engine_b.dispose()


def test_the_file_lock_is_exclusive(tmp_path: Path) -> None:
    first, second = FileLock(tmp_path / "q.lock"), FileLock(tmp_path / "q.lock")
    first.acquire()
    with pytest.raises(WorkerLockedError):
        second.acquire()
    first.release()
    second.acquire()
    second.release()


# -- observation (contract §5) -------------------------------------------------------------------


def confirmed(worker: DurableWorker, target: SqliteTarget, keys: Sequence[str]) -> list[str]:
    ids = [worker.accept(record(k)).write_id for k in keys]
    worker.run_once(target)
    return ids


def test_only_a_changed_snapshot_makes_an_event_and_missing_is_never_recreated(
    engine: Engine, target: SqliteTarget
) -> None:
    worker = worker_on(engine)
    (write_id,) = confirmed(worker, target, ["k"])
    assert worker.observe(write_id, {"stage": "new"}) is True
    assert worker.observe(write_id, {"stage": "new"}) is False
    assert worker.observe(write_id, {"stage": "won"}) is True
    kinds = [e["event_type"] for e in worker.events(write_id)]
    assert kinds.count("status_changed") == 2
    target.delete(write_id)
    report = worker.poll_status(target)
    assert report.missing == 1 and worker.get(write_id)["state"] == "confirmed_then_missing"
    assert worker.run_once(target).sent == 0 and target.write_ids() == []
    with pytest.raises(RecordStateError):
        worker.observe(write_id, {"stage": "back"})


def test_polling_is_bounded_and_oldest_polled_first(engine: Engine, target: SqliteTarget) -> None:
    worker = worker_on(engine)
    ids = confirmed(worker, target, [f"k{i}" for i in range(5)])
    for bad in (0, 1001, True):
        with pytest.raises(InvalidRecordError):
            worker.poll_status(target, limit=bad)
    passes: list[set[str]] = []
    for _ in range(3):
        before = {i: worker.get(i)["polled_at"] for i in ids}
        assert worker.poll_status(target, limit=2).read == 2
        passes.append({i for i in ids if worker.get(i)["polled_at"] != before[i]})
    # Every record is polled once before any is polled twice.
    assert len(passes[0] | passes[1]) == 4
    assert set(ids) - passes[0] - passes[1] <= passes[2]


def test_a_failed_poll_keeps_the_snapshot_and_records_one_health_event(
    engine: Engine, target: SqliteTarget
) -> None:
    worker = worker_on(engine)
    (write_id,) = confirmed(worker, target, ["k"])
    target.set_status(write_id, {"stage": "new"})
    worker.poll_status(target)

    class Broken(Counting):
        def observe_status(self, write_ids: Sequence[str]) -> list[StatusRead]:
            raise OSError("target unreachable")

    broken = Broken(target)
    for _ in range(3):
        assert worker.poll_status(broken).failed == 1
    row = worker.get(write_id)
    assert row["state"] == "confirmed" and row["poll_health"] == "failing"
    assert worker.status()["records"][0]["snapshot"] == {"stage": "new"}  # type: ignore[index]
    kinds = [e["event_type"] for e in worker.events(write_id)]
    assert kinds.count("poll_failed") == 1
    worker.poll_status(target)
    assert [e["event_type"] for e in worker.events(write_id)][-1] == "poll_recovered"


def test_status_is_json_and_exports_atomically(engine: Engine, target: SqliteTarget, tmp_path: Path) -> None:
    worker = worker_on(engine)
    confirmed(worker, target, ["a", "b"])
    path = tmp_path / "status.json"
    worker.export_status(path)
    exported = json.loads(path.read_text())
    assert exported == json.loads(json.dumps(worker.status()))
    assert exported["counts"]["confirmed"] == 2
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    # An export that fails half-way leaves the previous file whole and no temporary behind.
    before = path.read_bytes()
    with pytest.raises(TypeError):
        write_json_atomically(path, {"counts": {"confirmed": 3}, "broken": object()})
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


# -- the outbox (issue 6 item 1) -----------------------------------------------------------------


def test_an_outbox_entry_commits_with_its_admission_and_is_relayed_once(db_url: str) -> None:
    store = SqlStore.open(db_url)
    service = AdmissionService(store)
    worker = DurableWorker(store.engine, SCOPE, file_lock=False)
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
    worker = DurableWorker(store.engine, SCOPE, file_lock=False)
    relay = OutboxRelay(store, worker, target="crm")
    rival = OutboxRelay(other_store, DurableWorker(other_store.engine, SCOPE, file_lock=False), target="crm")
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
    worker = DurableWorker(store.engine, SCOPE, file_lock=False, limits=WorkerLimits(max_waiting=1))
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


class Ticking:
    """A wall clock that moves one second per reading, so stored times never tie."""

    def __init__(self) -> None:
        self.now = datetime(2026, 12, 1, tzinfo=UTC)

    def __call__(self) -> datetime:
        self.now += timedelta(seconds=1)
        return self.now


@settings(max_examples=10, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(size=st.integers(2, 7), limits=st.lists(st.integers(1, 4), min_size=1, max_size=6))
def test_polling_is_fair_for_any_sequence_of_limits(
    engine: Engine, target: SqliteTarget, size: int, limits: list[int]
) -> None:
    worker = worker_on(engine, queue=f"fair-{uuid.uuid4().hex}", now=Ticking())
    ids = confirmed(worker, target, [f"{worker.queue}-{i}" for i in range(size)])
    polls = dict.fromkeys(ids, 0)
    for limit in limits:
        before = {i: worker.get(i)["polled_at"] for i in ids}
        worker.poll_status(target, limit=limit)
        for i in ids:
            polls[i] += worker.get(i)["polled_at"] != before[i]
        assert max(polls.values()) - min(polls.values()) <= 1
    assert sum(polls.values()) == sum(min(limit, size) for limit in limits)


def test_the_downgrade_of_0003_is_refused_while_worker_records_exist(db_url: str) -> None:
    from admission.sql import downgrade, revision_of

    engine = create_admission_engine(db_url)
    try:
        worker = DurableWorker(engine, SCOPE, file_lock=False)
        worker.accept(record("k"))
        with pytest.raises(RuntimeError, match="refusing to downgrade: 1 worker records"):
            downgrade(engine, "0002")
        assert revision_of(engine) == "0004"  # one transaction: nothing was downgraded
        assert worker.find("k")["state"] == "prepared"
        downgrade(engine, "0002", allow_unsafe=True)
        assert revision_of(engine) == "0002"
    finally:
        engine.dispose()
