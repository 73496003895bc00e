"""The worker store's contract: the durable worker on every backend (memory, SQLite, PostgreSQL).

Written once, after eventsourcing's ``AggregateRecorderTestCase``: each
backend only builds the store (:class:`Stores`); every test runs the
:class:`~admission.worker.DurableWorker` through the
:class:`~admission.worker.WorkerStore` port and reads back through it.
Intake, the write cycle, ownership and fencing, observation, and the outbox
relay (worker contract §1-§3, §5).
"""

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

from admission.errors import (
    BeforeWriteError,
    FencedError,
    InvalidRecordError,
    LeaseHeldError,
    QueueFullError,
    RecordStateError,
    ScopeMismatchError,
    TargetTimeoutError,
)
from admission.receipts import AdmissionService, MemoryStore, Store
from admission.sql import SqlStore, SqlWorkerStore
from admission.testing import FaultyTarget
from admission.worker import (
    DurableWorker,
    MemoryWorkerStore,
    OutboxRelay,
    Readback,
    Scope,
    SqliteTarget,
    StatusRead,
    TargetRecord,
    WorkerLimits,
    WorkerStore,
    WorkItem,
    record_outbox,
    write_json_atomically,
)

# On PostgreSQL the async path adds little to what test_service.py shows there, for much time.
pytestmark = pytest.mark.async_stores("memory", "sqlite")

SCOPE = Scope.parse({"tenant": "t1", "account": "a1", "page": "p1", "form": "f1"})
QUEUE = "default"


def record(key: str, payload: object = None) -> dict[str, object]:
    return {**SCOPE.as_dict(), "source_key": key, "payload": payload if payload is not None else {"n": key}}


class Stores:
    """Builds the stores of one backend: one shared memory store, or new SQL handles on one database
    (two handles are two owners, as two processes would be)."""

    def __init__(self, url: str | None) -> None:
        self.url = url
        self._memory = MemoryWorkerStore()
        self._opened: list[SqlWorkerStore] = []

    def open(self) -> WorkerStore:
        if self.url is None:
            return self._memory
        store = SqlWorkerStore.open(self.url)
        self._opened.append(store)
        return store

    def close(self) -> None:
        for store in self._opened:
            store.dispose()


@pytest.fixture
def stores(backend_url: str | None) -> Iterator[Stores]:
    built = Stores(backend_url)
    yield built
    built.close()


@pytest.fixture
def store(stores: Stores) -> WorkerStore:
    return stores.open()


@pytest.fixture
def target(tmp_path: Path) -> SqliteTarget:
    return SqliteTarget(tmp_path / "target.sqlite3")


def worker_on(store: WorkerStore, **options: object) -> DurableWorker:
    options.setdefault("file_lock", False)
    return DurableWorker(store, SCOPE, **options)  # type: ignore[arg-type]


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
    store: WorkerStore,
) -> None:
    worker = worker_on(store)
    first = worker.accept(record("k1"))
    assert first.outcome == "accepted" and first.state == "prepared"
    again = worker_on(store).accept(record("k1"))
    assert (again.outcome, again.write_id) == ("duplicate", first.write_id)
    changed = worker_on(store).accept(record("k1", {"n": "other"}))
    assert (changed.outcome, changed.write_id) == ("conflict", first.write_id)
    assert len(store.records(QUEUE)) == 1
    assert [e["event_type"] for e in worker.events()] == ["accepted"]


@pytest.mark.parametrize("field", ["tenant", "account", "page", "form"])
def test_a_record_outside_any_scope_field_is_refused_with_nothing_written(
    store: WorkerStore, field: str
) -> None:
    worker = worker_on(store)
    with pytest.raises(ScopeMismatchError) as refused:
        worker.accept({**record("k"), field: "elsewhere"})
    assert refused.value.field == field
    assert store.records(QUEUE) == [] and store.events(QUEUE) == []


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
    store: WorkerStore, bad: dict[str, object], field: str
) -> None:
    worker = worker_on(store)
    with pytest.raises(InvalidRecordError) as refused:
        worker.accept({**record("k"), **bad})
    assert refused.value.field == field
    assert store.records(QUEUE) == []
    assert pickle.loads(pickle.dumps(refused.value)).field == field


def test_a_missing_scope_field_is_refused() -> None:
    with pytest.raises(InvalidRecordError) as refused:
        Scope.parse({"account": "a"})
    assert refused.value.field == "scope.tenant"


def test_the_scope_is_pinned_and_another_scope_is_refused(store: WorkerStore) -> None:
    worker_on(store)
    other = Scope.parse({**SCOPE.as_dict(), "form": "f2"})
    with pytest.raises(ScopeMismatchError) as refused:
        DurableWorker(store, other, file_lock=False)
    assert refused.value.field == "form"


def test_the_queue_bound_refuses_clearly_and_drops_nothing(store: WorkerStore, target: SqliteTarget) -> None:
    worker = worker_on(store, limits=WorkerLimits(max_waiting=3))
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
    store: WorkerStore, target: SqliteTarget
) -> None:
    worker = worker_on(store)
    write_id = worker.accept(record("k")).write_id
    outage = FaultyTarget(target, "outage")
    reports = [worker.run_once(outage) for _ in range(3)]
    assert [r.retried for r in reports] == [1, 1, 0] and reports[2].failed_safe == 1
    row = worker.get(write_id)
    assert (row.state, row.attempts) == ("failed_safe", 3)
    assert worker.run_once(target).sent == 0
    assert target.write_ids() == []


def test_a_timeout_is_uncertain_and_an_exact_readback_confirms_it_without_resending(
    store: WorkerStore, target: SqliteTarget
) -> None:
    worker = worker_on(store)
    write_id = worker.accept(record("k")).write_id
    assert worker.run_once(FaultyTarget(target, "timeout")).uncertain == 1
    assert worker.get(write_id).state == "uncertain"
    counting = Counting(target)
    report = worker.run_once(counting)
    assert report.reconciled == 1 and counting.writes == 0
    assert worker.get(write_id).state == "confirmed"
    assert target.write_ids() == [write_id] and target.duplicate_attempts() == 0


def test_an_uncertain_record_with_an_empty_readback_is_never_resent(
    store: WorkerStore, target: SqliteTarget
) -> None:
    worker = worker_on(store)
    write_id = worker.accept(record("k")).write_id
    lost = Counting(target, [TargetTimeoutError("lost on the way")])
    worker.run_once(lost)
    for _ in range(3):
        assert worker.run_once(lost).still_uncertain == 1
    assert lost.writes == 1 and worker.get(write_id).state == "uncertain"


def test_a_readback_with_other_content_does_not_confirm(store: WorkerStore, target: SqliteTarget) -> None:
    worker = worker_on(store)
    write_id = worker.accept(record("k")).write_id
    worker.run_once(Counting(target, [RuntimeError("connection reset")]))
    target.write(TargetRecord(write_id, "t1", "k", b"not the record"))
    assert worker.run_once(target).still_uncertain == 1
    assert worker.get(write_id).state == "uncertain"


def test_resolve_needs_who_and_why_and_records_them(store: WorkerStore, target: SqliteTarget) -> None:
    worker = worker_on(store)
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


def test_diagnostics_are_bounded_and_marked(store: WorkerStore, target: SqliteTarget) -> None:
    worker = worker_on(store)
    write_id = worker.accept(record("k")).write_id
    worker.run_once(Counting(target, [RuntimeError("x" * 10_000)]))
    diagnostic = worker.get(write_id).diagnostic
    assert len(diagnostic.encode()) <= 2048 and diagnostic.endswith("[truncated]")


def test_every_transition_is_an_event_with_its_states(store: WorkerStore, target: SqliteTarget) -> None:
    worker = worker_on(store)
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


def test_a_record_left_in_flight_is_uncertain_at_the_next_start(
    store: WorkerStore, target: SqliteTarget
) -> None:
    class Stop(BaseException):
        pass

    def crash(point: str) -> None:
        if point == "after_in_flight":
            raise Stop

    worker = worker_on(store, hook=crash)
    write_id = worker.accept(record("k")).write_id
    with pytest.raises(Stop):
        worker.run_once(target)
    assert worker.get(write_id).state == "in_flight"
    counting = Counting(target)
    report = worker_on(store).run_once(counting)
    assert (report.recovered, report.still_uncertain, counting.writes) == (1, 1, 0)
    assert worker.get(write_id).state == "uncertain"


def test_a_crash_inside_a_send_batch_leaves_the_whole_batch_uncertain_and_unsent(
    store: WorkerStore, target: SqliteTarget
) -> None:
    class Stop(BaseException):
        pass

    def crash(point: str) -> None:
        if point == "after_in_flight":
            raise Stop

    worker = worker_on(store, hook=crash, send_batch=4)
    ids = [worker.accept(record(f"k{i}")).write_id for i in range(6)]
    with pytest.raises(Stop):
        worker.run_once(target)
    assert [worker.get(i).state for i in ids] == ["in_flight"] * 4 + ["prepared"] * 2
    counting = Counting(target)
    report = worker_on(store, send_batch=4).run_once(counting)
    assert (report.recovered, report.still_uncertain, report.confirmed, counting.writes) == (4, 4, 2, 2)
    assert sorted(target.write_ids()) == sorted(ids[4:])


def test_batched_sends_confirm_every_record_once(store: WorkerStore, target: SqliteTarget) -> None:
    worker = worker_on(store, send_batch=3)
    ids = [worker.accept(record(f"k{i}")).write_id for i in range(7)]
    report = worker.run_once(target)
    assert (report.sent, report.confirmed) == (7, 7)
    assert sorted(target.write_ids()) == sorted(ids)
    assert all(
        [e["event_type"] for e in worker.events(i)] == ["accepted", "dispatch", "acknowledged"] for i in ids
    )
    with pytest.raises(InvalidRecordError):
        worker_on(store, send_batch=0)


# -- ownership (contract §3) ---------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_an_expired_lease_is_reclaimed_with_a_new_token_and_the_old_owner_is_fenced(
    stores: Stores, target: SqliteTarget
) -> None:
    clock_a, clock_b = Clock(), Clock()
    old = DurableWorker(stores.open(), SCOPE, file_lock=False, monotonic=clock_a, lease_ttl=10)
    new = DurableWorker(stores.open(), SCOPE, file_lock=False, monotonic=clock_b, lease_ttl=10)
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
        old._writer.transition(row, "dispatch", "late write of an expired owner")
    assert fenced.value.token == token
    item = WorkItem(row.write_id, row.tenant, row.source_key, row.content, row.state, row.attempts)
    with pytest.raises(FencedError):
        old._dispatch([item], [])  # the batched transition (one batched update) is refused too
    with pytest.raises(FencedError):
        old.renew()
    assert old.get(write_id).state == "prepared"
    assert new.run_once(target).confirmed == 1


def test_an_owner_that_keeps_its_lease_while_idle_and_reading_back_is_never_taken_over(
    stores: Stores, target: SqliteTarget
) -> None:
    clock_a, clock_b = Clock(), Clock()
    owner = DurableWorker(stores.open(), SCOPE, file_lock=False, monotonic=clock_a, lease_ttl=10)
    other = DurableWorker(stores.open(), SCOPE, file_lock=False, monotonic=clock_b, lease_ttl=10)
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


# -- observation (contract §5) -------------------------------------------------------------------


def confirmed(worker: DurableWorker, target: SqliteTarget, keys: Sequence[str]) -> list[str]:
    ids = [worker.accept(record(k)).write_id for k in keys]
    worker.run_once(target)
    return ids


def test_only_a_changed_snapshot_makes_an_event_and_missing_is_never_recreated(
    store: WorkerStore, target: SqliteTarget
) -> None:
    worker = worker_on(store)
    (write_id,) = confirmed(worker, target, ["k"])
    assert worker.observe(write_id, {"stage": "new"}) is True
    assert worker.observe(write_id, {"stage": "new"}) is False
    assert worker.observe(write_id, {"stage": "won"}) is True
    kinds = [e["event_type"] for e in worker.events(write_id)]
    assert kinds.count("status_changed") == 2
    target.delete(write_id)
    report = worker.poll_status(target)
    assert report.missing == 1 and worker.get(write_id).state == "confirmed_then_missing"
    assert worker.run_once(target).sent == 0 and target.write_ids() == []
    with pytest.raises(RecordStateError):
        worker.observe(write_id, {"stage": "back"})


def test_polling_is_bounded_and_oldest_polled_first(store: WorkerStore, target: SqliteTarget) -> None:
    worker = worker_on(store)
    ids = confirmed(worker, target, [f"k{i}" for i in range(5)])
    for bad in (0, 1001, True):
        with pytest.raises(InvalidRecordError):
            worker.poll_status(target, limit=bad)
    passes: list[set[str]] = []
    for _ in range(3):
        before = {i: worker.get(i).polled_at for i in ids}
        assert worker.poll_status(target, limit=2).read == 2
        passes.append({i for i in ids if worker.get(i).polled_at != before[i]})
    # Every record is polled once before any is polled twice.
    assert len(passes[0] | passes[1]) == 4
    assert set(ids) - passes[0] - passes[1] <= passes[2]


def test_a_failed_poll_keeps_the_snapshot_and_records_one_health_event(
    store: WorkerStore, target: SqliteTarget
) -> None:
    worker = worker_on(store)
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
    assert row.state == "confirmed" and row.poll_health == "failing"
    assert worker.status()["records"][0]["snapshot"] == {"stage": "new"}  # type: ignore[index]
    kinds = [e["event_type"] for e in worker.events(write_id)]
    assert kinds.count("poll_failed") == 1
    worker.poll_status(target)
    assert [e["event_type"] for e in worker.events(write_id)][-1] == "poll_recovered"


def test_status_is_json_and_exports_atomically(
    store: WorkerStore, target: SqliteTarget, tmp_path: Path
) -> None:
    worker = worker_on(store)
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
    store: WorkerStore, target: SqliteTarget, size: int, limits: list[int]
) -> None:
    worker = worker_on(store, queue=f"fair-{uuid.uuid4().hex}", now=Ticking())
    ids = confirmed(worker, target, [f"{worker.queue}-{i}" for i in range(size)])
    polls = dict.fromkeys(ids, 0)
    for limit in limits:
        before = {i: worker.get(i).polled_at for i in ids}
        worker.poll_status(target, limit=limit)
        for i in ids:
            polls[i] += worker.get(i).polled_at != before[i]
        assert max(polls.values()) - min(polls.values()) <= 1
    assert sum(polls.values()) == sum(min(limit, size) for limit in limits)


# -- the outbox relay (worker contract preamble) ------------------------------------------------------


@pytest.fixture
def receipts(backend_url: str | None) -> Iterator[Store]:
    if backend_url is None:
        yield MemoryStore()
        return
    sql = SqlStore.open(backend_url)
    yield sql
    sql.dispose()


def test_the_relay_accepts_each_entry_for_its_target_once_and_a_full_queue_stops_it_in_place(
    receipts: Store, store: WorkerStore, target: SqliteTarget
) -> None:
    worker = worker_on(store, limits=WorkerLimits(max_waiting=2))
    relay = OutboxRelay(receipts, worker, target="crm")
    AdmissionService(receipts).start_run("ns", "wf-1")
    for key in ("a", "b", "c"):
        record_outbox(receipts, None, "ns", "wf-1", target="crm", source_key=key, content=record(key))
    record_outbox(receipts, None, "ns", "wf-1", target="mail", source_key="m", content=record("m"))
    first = relay.pump()
    assert (first.accepted, first.blocked) == (2, True)
    cursor = relay.cursor()
    assert relay.pump().blocked and relay.cursor() == cursor  # nothing moved, nothing dropped
    assert [r.source_key for r in store.records(QUEUE)] == ["a", "b"]
    assert worker.run_once(target).confirmed == 2  # settled records make room again
    rest = relay.pump()
    assert (rest.accepted, rest.blocked) == (1, False)
    assert relay.pump().read == 0
    assert sorted(r.source_key for r in store.records(QUEUE)) == ["a", "b", "c"]


def test_an_entry_the_intake_refuses_is_an_event_not_a_drop(receipts: Store, store: WorkerStore) -> None:
    worker = worker_on(store)
    relay = OutboxRelay(receipts, worker, target="crm")
    bad = {**record("x"), "tenant": "elsewhere"}
    record_outbox(receipts, None, "ns", "wf-1", target="crm", source_key="x", content=bad)
    report = relay.pump()
    assert (report.read, report.refused, report.accepted) == (1, 1, 0)
    (refusal,) = store.events(QUEUE)
    assert refusal.event_type == "intake_refused" and refusal.write_id is None
    assert store.records(QUEUE) == [] and relay.pump().read == 0
