"""The job store port's contract, written once, run on every backend (worker contract §3, §4; docs/jobs.md).

Each test gets a fresh store of one backend from the ``job_stores`` fixture
(``tests/conftest.py``): the in-memory reference (``MemoryJobStore``), SQLite
and PostgreSQL (``ADMISSION_TEST_BACKEND`` picks the SQL ones), after
eventsourcing's ``AggregateRecorderTestCase``: the suite is the same, each
backend only builds the store.  ``job_stores.open()`` gives a second handle on
the same jobs (on SQL, another engine: what a second process holds), for the
tests with two owners.  The port's primitives are checked first, then the
rules of the service on top of them.

"Nothing was written" is read through the port (``footprint``).  What only SQL
can show (engine events, migrations, processes) is in ``tests/integration/``.
"""

from __future__ import annotations

import itertools
import pickle
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from admission.errors import (
    InvalidJobError,
    JobFencedError,
    JobQueueFullError,
    JobStateError,
    RetryableJobError,
    StorageError,
    UnknownJobError,
)
from admission.intent import Value, canonical_encode
from admission.jobs import (
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_MAX_WAITING,
    JOB_TRANSITIONS,
    MAX_DIAGNOSTIC_BYTES,
    Continue,
    Finish,
    Job,
    JobEvent,
    JobRow,
    JobRunner,
    JobService,
    JobStore,
    LocalPublisher,
    PublishedResult,
    bounded_diagnostic,
    find_cycle,
)
from tests.support.jobkit import LEASE, Counting, JobStores, ManualClock, expire, footprint, jobs_on

# On PostgreSQL the async path adds little to what test_service.py shows there, for much time.
pytestmark = pytest.mark.async_stores("memory", "sqlite")


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def store(job_stores: JobStores) -> JobStore:
    return job_stores.open()


@pytest.fixture
def jobs(store: JobStore, clock: ManualClock) -> Iterator[JobService]:
    service = jobs_on(store, clock)
    yield service
    service.dispose()


@pytest.fixture
def target(tmp_path: Path) -> LocalPublisher:
    return LocalPublisher(tmp_path / "target.sqlite3")


# -- the port's primitives --------------------------------------------------------------------------

T0 = datetime(2024, 1, 1, tzinfo=UTC)


def row(job_id: str = "p1", scope: str = "port", position: int = 1, **changes: object) -> JobRow:
    """A job row as an enqueue would insert it."""
    fresh = JobRow(
        job_id=job_id,
        scope=scope,
        position=position,
        kind="count",
        payload=canonical_encode({"steps": 1}),
        content=canonical_encode(job_id),
        state="queued",
        reason="enqueued",
        max_attempts=3,
        attempts=0,
        fence=0,
        beat=0,
        owner=None,
        attempt_id=None,
        paused=False,
        cancel_requested=False,
        stop_requested=False,
        checkpoint_step=0,
        publish_attempt_id=None,
        publish_result=None,
        diagnostic=None,
        created_at=T0,
        updated_at=T0,
    )
    return replace(fresh, **changes)  # type: ignore[arg-type]


def insert(store: JobStore, *rows: JobRow, depends_on: tuple[str, ...] = ()) -> None:
    with store.transaction() as tx:
        for new in rows:
            tx.lock_scope(new.scope, created_at=T0)
            tx.insert_job(replace(new, position=tx.next_position(new.scope)), depends_on)


def test_a_row_crosses_the_port_as_the_frozen_value_it_was_written_as(store: JobStore) -> None:
    written = row(
        publish_result=b"\x00result",
        publish_attempt_id="a1",
        diagnostic="d",
        paused=True,
        state="retry_wait",
        not_before=T0 + timedelta(seconds=1.5, microseconds=7),
    )
    insert(store, written)
    with store.transaction() as tx:
        read = tx.lock_job("p1")
        assert tx.find_jobs(["p1", "ghost"]) == [read]
        assert tx.lock_job("ghost") is None
        assert tx.lock_job("p1", skip_locked=True) == read  # its own lock is no other's
    assert type(read) is JobRow and read == replace(written, position=1)
    assert read.created_at.tzinfo is not None
    view = store.view("p1")
    assert view == read.view(()) and store.view("ghost") is None


def test_a_transaction_that_raises_leaves_nothing_of_itself(store: JobStore) -> None:
    insert(store, row("kept"))
    with pytest.raises(RuntimeError), store.transaction() as tx:
        tx.lock_scope("other", created_at=T0)
        tx.insert_job(row("gone", scope="other", position=tx.next_position("other")), ["kept"])
        kept = tx.lock_job("kept")
        assert kept is not None
        tx.save_job(replace(kept, state="running", fence=1))
        tx.append_event(JobEvent(0, "kept", "claim", "queued", "running", "claimed", 1, None, None, T0))
        raise RuntimeError("roll back")
    assert store.view("gone") is None and store.events("kept") == []
    assert store.counts() == {"queued": 1}
    with store.transaction() as tx:
        tx.lock_scope("other", created_at=T0)
        assert tx.next_position("other") == 1  # the scope's position was rolled back with the rest


def test_the_fenced_update_matches_only_a_running_job_under_its_fence(store: JobStore) -> None:
    insert(store, row(state="running", fence=2, beat=5))
    later = T0 + timedelta(seconds=1)
    with store.transaction() as tx:
        assert tx.fenced_update("p1", 1, updated_at=later) is None
        assert tx.fenced_update("ghost", 2, updated_at=later) is None
        renewed = tx.fenced_update("p1", 2, updated_at=later)
    assert renewed is not None and (renewed.beat, renewed.updated_at) == (6, later)
    with store.transaction() as tx:
        current = tx.lock_job("p1")
        assert current is not None and current == renewed
        tx.save_job(replace(current, state="completed"))
    with store.transaction() as tx:
        assert tx.fenced_update("p1", 2, updated_at=later) is None


def test_saving_a_job_keeps_the_fields_fixed_at_enqueue(store: JobStore) -> None:
    insert(store, row())
    with store.transaction() as tx:
        current = tx.lock_job("p1")
        assert current is not None
        changed = replace(current, state="retry_wait", attempts=1, diagnostic="x", publish_result=b"r")
        tx.save_job(replace(changed, payload=b"other", content=b"other", kind="other", scope="elsewhere"))
    with store.transaction() as tx:
        assert tx.lock_job("p1") == changed


def test_a_constraint_the_store_keeps_is_refused_as_a_storage_error(store: JobStore) -> None:
    insert(store, row())
    for write in (
        lambda tx: tx.insert_job(row(position=2), ()),  # the same job id
        lambda tx: tx.insert_job(row("p2", position=3), ["ghost"]),  # a dependency that does not exist
    ):
        with pytest.raises(StorageError), store.transaction() as tx:
            tx.lock_scope("port", created_at=T0)
            write(tx)
    with store.transaction() as tx:
        tx.insert_checkpoint(job_id="p1", step=1, attempt_id="a1", fence=1, state=b"\x01", recorded_at=T0)
    with pytest.raises(StorageError), store.transaction() as tx:
        tx.insert_checkpoint(job_id="p1", step=1, attempt_id="a2", fence=2, state=b"\x02", recorded_at=T0)
    with store.transaction() as tx:
        assert tx.checkpoint_state("p1", 1) == b"\x01" and tx.checkpoint_state("p1", 2) is None
    assert store.counts() == {"queued": 1}


def test_dependents_and_dependencies_are_read_as_stored(store: JobStore) -> None:
    insert(store, row("a"), row("b"))
    insert(store, row("c", state="blocked"), row("d", state="blocked"), depends_on=("b", "a"))
    insert(store, row("e"), depends_on=("a",))
    with store.transaction() as tx:
        assert [r.job_id for r in tx.blocked_dependents("a")] == ["c", "d"]  # e is not blocked
        assert tx.blocked_dependents("c") == []
        assert sorted(tx.dependency_states("c")) == ["queued", "queued"]
        assert tx.dependencies("c") == ("a", "b") and tx.dependencies("a") == ()
        assert tx.share_states(["b", "a", "ghost"]) == {"a": "queued", "b": "queued"}
        assert tx.count_unfinished("port") == 5 and tx.count_unfinished("ghost") == 0
    assert store.view("c") == replace(row("c", state="blocked"), position=3).view(("a", "b"))
    assert store.counts("port") == {"queued": 3, "blocked": 2} and store.counts("ghost") == {}


def test_claim_candidates_are_the_unpaused_due_waiting_jobs_first_then_running_ones_in_queue_order(
    store: JobStore,
) -> None:
    states = ["running", "queued", "retry_wait", "completed", "blocked", "queued", "running", "queued"]
    insert(store, *(row(f"c{i}", state=s) for i, s in enumerate(states)))
    insert(store, row("paused", state="queued", paused=True), row("elsewhere", scope="other"))
    later = T0 + timedelta(microseconds=1)
    insert(
        store,
        row("waits", state="retry_wait", not_before=later),
        row("due", state="retry_wait", not_before=T0),
    )
    assert store.claim_candidates("port", 10, now=T0) == ["c1", "c2", "c5", "c7", "due", "c0", "c6"]
    assert store.claim_candidates("port", 10, now=later)[-4:] == ["waits", "due", "c0", "c6"]
    assert store.claim_candidates("port", 2, now=T0) == ["c1", "c2"]
    assert store.claim_candidates("ghost", 10, now=T0) == []


def test_events_and_checkpoints_come_back_in_order_with_their_times(store: JobStore) -> None:
    insert(store, row(), row("p2"))
    with store.transaction() as tx:
        for n, job_id in enumerate(["p1", "p2", "p1"]):
            event = JobEvent(0, job_id, "paused", "queued", "queued", f"r{n}", n, None, None, T0)
            tx.append_event(event)
        for step in (2, 1):
            state = canonical_encode({"step": step})
            tx.insert_checkpoint(job_id="p1", step=step, attempt_id="a", fence=1, state=state, recorded_at=T0)
    events = store.events("p1")
    assert [e.reason for e in events] == ["r0", "r2"] and events[0].position < events[1].position
    assert all(e.recorded_at == T0 and e.recorded_at.tzinfo is not None for e in events)
    assert [(c.step, c.state) for c in store.checkpoints("p1")] == [(1, {"step": 1}), (2, {"step": 2})]
    assert store.events("ghost") == [] and store.checkpoints("p2") == []


# -- the service's rules on the port -----------------------------------------------------------------

MARKS = {"enqueue", "paused", "resumed", "cancel_requested", "stop_requested", "result_recorded"}


def job(job_id: str = "j1", steps: int = 3, **kw: object) -> Job:
    return Job(job_id, kw.pop("scope", "tenant-a"), "count", {"steps": steps}, **kw)  # type: ignore[arg-type]


def runner(store: JobService, target: LocalPublisher, handler: Counting | None = None) -> JobRunner:
    return JobRunner(store, target, {"count": handler or Counting()})


# -- enqueue: duplicate, conflict, bounds, validation ---------------------------------------------------


def test_same_content_is_a_duplicate_and_changed_content_a_conflict_that_writes_nothing(
    jobs: JobService,
) -> None:
    assert jobs.enqueue(job()).outcome == "enqueued"
    before = footprint(jobs, "j1")
    assert jobs.enqueue(job()).outcome == "duplicate"
    for changed in (
        job(steps=4),
        job(max_attempts=5),
        job(scope="tenant-b"),
        Job("j1", "tenant-a", "other", {"steps": 3}),
    ):
        answer = jobs.enqueue(changed)
        assert (answer.outcome, answer.state) == ("conflict", "queued")
    assert footprint(jobs, "j1") == before
    with jobs.store.transaction() as tx:
        stored = tx.lock_job("j1")
    assert stored is not None and stored.payload == canonical_encode({"steps": 3})


def test_dependency_order_does_not_change_the_canonical_content(jobs: JobService) -> None:
    jobs.enqueue_all([job("a"), job("b")])
    assert jobs.enqueue(job("c", depends_on=("a", "b"))).outcome == "enqueued"
    assert jobs.enqueue(job("c", depends_on=("b", "a"))).outcome == "duplicate"


def test_a_batch_with_one_conflict_writes_nothing(jobs: JobService) -> None:
    jobs.enqueue(job("a"))
    before = footprint(jobs, "a", "new")
    answers = jobs.enqueue_all([job("new"), job("a", steps=9)])
    assert [a.outcome for a in answers] == ["aborted", "conflict"]
    assert footprint(jobs, "a", "new") == before
    with pytest.raises(UnknownJobError):
        jobs.status("new")


def test_the_queue_is_bounded_at_128_waiting_jobs_per_scope_with_a_typed_refusal(jobs: JobService) -> None:
    assert DEFAULT_MAX_WAITING == 128
    answers = jobs.enqueue_all([job(f"j{i}") for i in range(128)])
    assert {a.outcome for a in answers} == {"enqueued"}
    known = [f"j{i}" for i in range(128)] + ["one-too-many"]
    before = footprint(jobs, *known)
    with pytest.raises(JobQueueFullError) as refused:
        jobs.enqueue(job("one-too-many"))
    assert (refused.value.scope, refused.value.waiting, refused.value.limit) == ("tenant-a", 128, 128)
    assert refused.value.code == "job_queue_full"
    assert footprint(jobs, *known) == before
    # Another scope has its own bound; a duplicate of a waiting job is still answered.
    assert jobs.enqueue(job("elsewhere", scope="tenant-b")).outcome == "enqueued"
    assert jobs.enqueue(job("j0")).outcome == "duplicate"
    # A job that leaves the waiting states makes room.
    jobs.cancel("j0")
    assert jobs.enqueue(job("one-too-many")).outcome == "enqueued"


def test_a_batch_past_the_bound_is_refused_whole(job_stores: JobStores, clock: ManualClock) -> None:
    store = jobs_on(job_stores.open(), clock, max_waiting=3)
    try:
        store.enqueue(job("a"))
        before = footprint(store, "a", "b", "c", "d")
        with pytest.raises(JobQueueFullError):
            store.enqueue_all([job("b"), job("c"), job("d")])
        assert footprint(store, "a", "b", "c", "d") == before
        assert [a.outcome for a in store.enqueue_all([job("b"), job("c")])] == ["enqueued", "enqueued"]
    finally:
        store.dispose()


def test_running_and_retrying_jobs_count_against_the_bound_so_a_retry_never_passes_it(
    job_stores: JobStores, clock: ManualClock
) -> None:
    store = jobs_on(job_stores.open(), clock, max_waiting=2)
    try:
        store.enqueue_all([job("a"), job("b")])
        lease = store.claim("a").lease
        assert lease is not None
        with pytest.raises(JobQueueFullError):
            store.enqueue(job("c"))
        store.fail(lease, "transient", retryable=True)
        assert store.counts("tenant-a") == {"queued": 1, "retry_wait": 1}
        with pytest.raises(JobQueueFullError) as refused:
            store.enqueue(job("c"))
        assert refused.value.waiting == 2
        store.cancel("a")
        assert store.enqueue(job("c")).outcome == "enqueued"
    finally:
        store.dispose()


@pytest.mark.parametrize(
    ("bad", "field"),
    [
        (Job("", "s", "count"), "job_id"),
        (Job("x" * 129, "s", "count"), "job_id"),
        (Job("a\nb", "s", "count"), "job_id"),
        (Job("a", "", "count"), "scope"),
        (Job("a", "s", ""), "kind"),
        (Job("a", "s", "count", max_attempts=0), "max_attempts"),
        (Job("a", "s", "count", max_attempts=101), "max_attempts"),
        (Job("a", "s", "count", max_attempts=True), "max_attempts"),
        (Job("a", "s", "count", payload={1: 2}), "payload"),  # type: ignore[dict-item]
        (Job("a", "s", "count", payload=object()), "payload"),  # type: ignore[arg-type]
        (Job("a", "s", "count", depends_on=["b"]), "depends_on"),  # type: ignore[arg-type]
        (Job("a", "s", "count", depends_on=("b", "b")), "depends_on"),
        (Job("a", "s", "count", depends_on=("a",)), "depends_on"),
    ],
)
def test_a_malformed_job_is_refused_naming_the_field_and_nothing_is_written(
    jobs: JobService, bad: Job, field: str
) -> None:
    before = footprint(jobs, bad.job_id)
    with pytest.raises(InvalidJobError) as refused:
        jobs.enqueue(bad)
    assert refused.value.field == field and refused.value.code == "job_invalid"
    assert str(refused.value).startswith(f"{field}: ")
    assert footprint(jobs, bad.job_id) == before
    assert pickle.loads(pickle.dumps(refused.value)).field == field


def test_attempts_are_bounded_at_three_by_default(jobs: JobService, target: LocalPublisher) -> None:
    assert DEFAULT_MAX_ATTEMPTS == 3
    jobs.enqueue(job())
    handler = Counting(fail_at={})
    run = runner(jobs, target, handler)
    for attempt in range(1, 4):
        handler.fail_at[1] = RetryableJobError(f"transient {attempt}")
        report = run.run("j1")
        assert report.state == ("retry_wait" if attempt < 3 else "failed")
    view = jobs.status("j1")
    assert (view.state, view.reason, view.attempts) == ("failed", "attempts_exhausted", 3)
    assert view.diagnostic is not None and "transient 3" in view.diagnostic
    assert run.run("j1").outcome == "final"
    assert target.count() == 0


def test_a_diagnostic_over_2_kib_is_refused_and_bounded_diagnostic_fits_visibly(jobs: JobService) -> None:
    jobs.enqueue(job())
    lease = jobs.claim("j1").lease
    assert lease is not None
    before = footprint(jobs, "j1")
    with pytest.raises(InvalidJobError) as refused:
        jobs.fail(lease, "é" * (MAX_DIAGNOSTIC_BYTES // 2 + 1), retryable=True)
    assert refused.value.field == "diagnostic"
    with pytest.raises(InvalidJobError) as surrogate:
        jobs.fail(lease, "broken \ud800 text", retryable=True)  # no database can store it
    assert surrogate.value.field == "diagnostic" and "surrogate" in str(surrogate.value)
    assert footprint(jobs, "j1") == before and jobs.status("j1").state == "running"
    cut = bounded_diagnostic("é" * 5000)
    assert len(cut.encode()) <= MAX_DIAGNOSTIC_BYTES and cut.endswith(" [truncated 7976 bytes]")
    jobs.fail(lease, cut, retryable=True)
    assert jobs.status("j1").diagnostic == cut


# -- dependencies ---------------------------------------------------------------------------------------


def test_a_dependency_must_exist(jobs: JobService) -> None:
    with pytest.raises(InvalidJobError, match="'ghost' does not exist") as refused:
        jobs.enqueue(job("a", depends_on=("ghost",)))
    assert refused.value.field == "depends_on"
    assert jobs.counts() == {}


@pytest.mark.parametrize("size", [2, 3, 7])
def test_a_dependency_cycle_in_a_batch_is_refused_and_nothing_written(jobs: JobService, size: int) -> None:
    ring = [job(f"r{i}", depends_on=(f"r{(i + 1) % size}",)) for i in range(size)]
    with pytest.raises(InvalidJobError, match="cycle r0 -> ") as refused:
        jobs.enqueue_all([job("fine"), *ring])
    assert refused.value.field == "depends_on"
    assert jobs.counts() == {}


def test_a_job_is_blocked_until_its_dependencies_completed(jobs: JobService, target: LocalPublisher) -> None:
    handler = Counting()
    run = runner(jobs, target, handler)
    answers = jobs.enqueue_all([job("c", depends_on=("a", "b")), job("a", steps=1), job("b", steps=1)])
    assert [a.state for a in answers] == ["blocked", "queued", "queued"]
    assert (jobs.claim("c").outcome, jobs.claim("c").reason) == ("not_claimable", "blocked")
    assert run.run("a").state == "completed"
    assert jobs.status("c").state == "blocked"
    assert run.run("b").state == "completed"
    view = jobs.status("c")
    assert (view.state, view.reason, view.depends_on) == ("queued", "dependencies_completed", ("a", "b"))
    assert run.run("c").state == "completed"
    # A job enqueued after its dependency completed starts queued.
    assert jobs.enqueue(job("d", depends_on=("c",))).state == "queued"


def test_a_failed_dependency_fails_its_dependents_transitively(
    jobs: JobService, target: LocalPublisher
) -> None:
    jobs.enqueue_all([job("a"), job("b", depends_on=("a",)), job("c", depends_on=("b",))])
    handler = Counting(fail_at={1: ValueError("broken")})
    assert runner(jobs, target, handler).run("a").state == "failed"
    for dependent in ("b", "c"):
        view = jobs.status(dependent)
        assert (view.state, view.reason) == ("failed", "dependency_failed")
    # Enqueued after its dependency failed: it can never run.
    assert jobs.status(jobs.enqueue(job("d", depends_on=("a",))).job_id).state == "failed"


def test_claim_next_reclaims_its_scopes_running_job_behind_more_waiting_ones_than_it_scans(
    job_stores: JobStores, clock: ManualClock
) -> None:
    import admission.jobs._service

    store = jobs_on(job_stores.open(), clock, max_waiting=200)
    try:
        waiting = admission.jobs._service._CLAIM_SCAN + 2
        store.enqueue_all([job(f"j{i:03d}") for i in range(waiting + 1)])
        lease = store.claim("j000").lease  # the oldest runs; more wait behind it than one scan reads
        assert lease is not None
        assert store.claim_next("tenant-a") is None  # its lease lives: nothing else of the scope starts
        clock.advance(LEASE)
        taken = store.claim_next("tenant-a")
        assert taken is not None and taken.lease is not None
        assert (taken.job_id, taken.reason, taken.lease.fence) == ("j000", "lease_expired", lease.fence + 1)
        assert store.counts("tenant-a") == {"running": 1, "queued": waiting}
    finally:
        store.dispose()


# -- pause, stop, cancel ----------------------------------------------------------------------------


def test_pause_stops_new_claims_until_resume(jobs: JobService, target: LocalPublisher) -> None:
    jobs.enqueue(job())
    assert jobs.pause("j1").paused
    assert (jobs.claim("j1").outcome, jobs.claim("j1").reason) == ("not_claimable", "paused")
    assert jobs.claim_next("tenant-a") is None
    assert jobs.status("j1").state == "queued"
    jobs.resume("j1")
    assert runner(jobs, target).run("j1").state == "completed"
    assert [e.event for e in jobs.events("j1")][:3] == ["enqueue", "paused", "resumed"]


def test_pause_also_stops_the_reclaim_of_an_expired_lease(jobs: JobService, clock: ManualClock) -> None:
    jobs.enqueue(job())
    assert jobs.claim("j1").outcome == "claimed"
    jobs.pause("j1")
    clock.advance(LEASE * 5)
    assert jobs.claim("j1").reason == "paused"


@pytest.mark.parametrize("request_name", ["stop", "cancel"])
def test_stop_and_cancel_end_a_waiting_job(jobs: JobService, request_name: str) -> None:
    jobs.enqueue_all([job("q"), job("b", depends_on=("q",))])
    view = getattr(jobs, request_name)("b")
    assert (view.state, view.reason) == ("cancelled", "stopped" if request_name == "stop" else "cancelled")
    assert jobs.claim("b").outcome == "final"


def test_stop_lets_a_running_attempt_finish_but_prevents_a_retry(
    jobs: JobService, target: LocalPublisher
) -> None:
    jobs.enqueue(job("done"))
    jobs.enqueue(job("retry"))
    for job_id, fail in (("done", None), ("retry", RetryableJobError("again"))):
        lease = jobs.claim(job_id).lease
        assert lease is not None
        view = jobs.stop(job_id)
        assert (view.state, view.stop_requested) == ("running", True)
        if fail is None:
            result = jobs.record_result(lease, {"sum": 6})
            target.publish(job_id, lease.attempt_id, result)
            assert jobs.complete(lease).state == "completed"
        else:
            view = jobs.fail(lease, "again", retryable=True)
            assert (view.state, view.reason) == ("cancelled", "stopped")


def test_cancel_marks_a_running_job_which_stops_at_its_next_step_boundary(
    jobs: JobService, target: LocalPublisher
) -> None:
    jobs.enqueue(job(steps=5))

    class CancelAtTwo(Counting):
        def __call__(self, payload, step, state):  # type: ignore[no-untyped-def]
            if step == 2:
                jobs.cancel("j1")
            return super().__call__(payload, step, state)

    handler = CancelAtTwo()
    report = runner(jobs, target, handler).run("j1")
    assert (report.state, report.reason, report.steps) == ("cancelled", "cancelled", (1, 2))
    assert target.count() == 0
    events = [(e.event, e.to_state) for e in jobs.events("j1")]
    assert ("cancel_requested", "running") in events
    assert events[-1] == ("cancelled_after_reconciliation", "cancelled")


def test_a_crashed_cancelled_job_is_reconciled_by_the_next_owner_without_running(
    jobs: JobService, clock: ManualClock, target: LocalPublisher
) -> None:
    jobs.enqueue(job())
    assert jobs.claim("j1").outcome == "claimed"
    jobs.cancel("j1")
    expire(jobs, clock, "j1")
    handler = Counting()
    report = runner(jobs, target, handler).run("j1")
    assert (report.outcome, report.state) == ("final", "cancelled")
    assert handler.calls == [] and target.count() == 0


# -- fencing -----------------------------------------------------------------------------------------


def test_every_claim_takes_a_new_larger_fence(jobs: JobService, clock: ManualClock) -> None:
    jobs.enqueue(job(max_attempts=5))
    fences = []
    for _ in range(4):
        lease = jobs.claim("j1").lease
        assert lease is not None
        fences.append(lease.fence)
        expire(jobs, clock, "j1")
    assert fences == sorted(set(fences)) and fences[0] == 1


def test_a_live_lease_is_not_reclaimed_and_each_renewal_restarts_the_watch(
    job_stores: JobStores, jobs: JobService, clock: ManualClock
) -> None:
    other_clock = ManualClock()
    other = jobs_on(job_stores.open(), other_clock)
    try:
        jobs.enqueue(job())
        lease = jobs.claim("j1").lease
        assert lease is not None
        assert other.claim("j1").reason == "lease_live"
        other_clock.advance(LEASE - 0.001)
        assert other.claim("j1").reason == "lease_live"
        jobs.heartbeat(lease)  # renewed: the other store must watch a whole lease again
        other_clock.advance(LEASE - 0.001)
        assert other.claim("j1").reason == "lease_live"
        other_clock.advance(LEASE)
        taken = other.claim("j1")
        assert taken.outcome == "claimed" and taken.lease is not None
        assert taken.lease.fence == lease.fence + 1
    finally:
        other.dispose()


def test_a_stale_fence_is_refused_by_the_store_for_every_owner_write(
    job_stores: JobStores, jobs: JobService, clock: ManualClock
) -> None:
    # Two services on two handles (on SQL: two engines, two connections): two owners holding two tokens.
    other_clock = ManualClock()
    other = jobs_on(job_stores.open(), other_clock)
    try:
        jobs.enqueue(job())
        old = jobs.claim("j1").lease
        assert old is not None
        jobs.checkpoint(old, 1, 1)
        expire(other, other_clock, "j1")
        new = other.claim("j1").lease
        assert new is not None and new.fence > old.fence and new.resume_step == 1
        before = footprint(jobs, "j1")
        view = jobs.status("j1")
        writes = [
            lambda: jobs.heartbeat(old),
            lambda: jobs.checkpoint(old, 2, 3),
            lambda: jobs.record_result(old, {"sum": 6}),
            lambda: jobs.fail(old, "late", retryable=True),
            lambda: jobs.fail(old, "late", retryable=False),
            lambda: jobs.recover(old, []),
        ]
        for write in writes:
            with pytest.raises(JobFencedError) as refused:
                write()
            assert (refused.value.fence, refused.value.current_fence) == (old.fence, new.fence)
            assert refused.value.code == "job_fenced"
        assert footprint(jobs, "j1") == before and jobs.status("j1") == view
        # The new owner's writes go through.
        assert other.checkpoint(new, 2, 3).cancel_requested is False
    finally:
        other.dispose()


def test_a_fence_is_refused_once_the_job_left_running(jobs: JobService, target: LocalPublisher) -> None:
    jobs.enqueue(job())
    lease = jobs.claim("j1").lease
    assert lease is not None
    target.publish("j1", lease.attempt_id, jobs.record_result(lease, {"sum": 6}))
    jobs.complete(lease)
    with pytest.raises(JobFencedError) as refused:
        jobs.complete(lease)
    assert refused.value.state == "completed"


# -- lease renewal while a step runs ---------------------------------------------------------------


class _Watched:
    """A step 2 that outlasts the lease several times over while another store watches the job.

    Between observations it waits until the runner has renewed the lease
    (``renewed()`` grew) or, without renewals, for a fixed real time.
    """

    def __init__(self, other: JobService, other_clock: ManualClock, renewed: object) -> None:
        self.other, self.other_clock, self.renewed = other, other_clock, renewed
        self.claims: list[str] = []
        self.calls: list[int] = []

    def __call__(self, payload: Value, step: int, state: Value) -> Continue | Finish:
        import time

        self.calls.append(step)
        if step == 2 and len(self.calls) == 2:
            for _ in range(3):
                answer = self.other.claim("j1")
                self.claims.append(answer.outcome if answer.lease is None else "claimed")
                if answer.lease is not None:
                    break
                # Counted after the claim: a renewal the claim already saw must not end the
                # wait, or the next claim would find the heartbeat it saw a whole lease ago.
                before = self.renewed()  # type: ignore[operator]
                self.other_clock.advance(LEASE + 1)  # a whole lease on the watcher's clock
                give_up = time.monotonic() + (5 if before is not None else 0.3)
                while time.monotonic() < give_up and (before is None or self.renewed() == before):  # type: ignore[operator]
                    time.sleep(0.01)
        total = (state if isinstance(state, int) else 0) + step
        return Finish({"sum": total}) if step >= 3 else Continue(total)


@pytest.mark.parametrize("renewing", [True, False])
def test_a_step_longer_than_the_lease_keeps_it_while_the_runner_renews(
    job_stores: JobStores, jobs: JobService, target: LocalPublisher, renewing: bool
) -> None:
    if renewing and job_stores.backend.endswith("-async"):
        pytest.skip("the runner renews from a thread of its own: it stays synchronous (docs/async.md)")
    other_clock = ManualClock()
    other = jobs_on(job_stores.open(), other_clock)
    try:
        jobs.enqueue(job())
        beats = [0]
        heartbeat = jobs.heartbeat

        def counted(lease: object) -> object:
            control = heartbeat(lease)  # type: ignore[arg-type]
            beats[0] += 1
            return control

        jobs.heartbeat = counted  # type: ignore[method-assign, assignment]
        handler = _Watched(other, other_clock, (lambda: beats[0]) if renewing else (lambda: None))
        run = JobRunner(jobs, target, {"count": handler}, heartbeat_every=0.05 if renewing else None)
        report = run.run("j1")
        if renewing:
            # The watcher saw the lease renewed each time: the job was never taken.
            assert handler.claims == ["not_claimable"] * 3 and beats[0] >= 3
            assert (report.state, report.steps) == ("completed", (1, 2, 3))
            [only] = target.read_published("j1")
            assert only.result == canonical_encode({"sum": 6})
        else:
            # Renewing only at checkpoints, the watcher takes the job over in the middle of step 2.
            assert handler.claims == ["not_claimable", "claimed"] and beats[0] == 0
            assert report.outcome == "fenced" and target.read_published("j1") == []
    finally:
        other.dispose()


def test_a_renewal_that_fails_for_a_busy_database_is_tried_again_at_the_next_beat(
    jobs: JobService, target: LocalPublisher, backend: str
) -> None:
    import threading

    from admission.errors import StorageError

    if backend.endswith("-async"):
        pytest.skip("the runner renews from a thread of its own: it stays synchronous (docs/async.md)")

    jobs.enqueue(job(steps=2))
    calls: list[str] = []
    renewed = threading.Event()
    heartbeat = jobs.heartbeat

    def flaky(lease: object) -> object:
        if not calls:
            calls.append("busy")
            raise StorageError("the database is unavailable or busy: database is locked")
        calls.append("renewed")
        renewed.set()
        return heartbeat(lease)  # type: ignore[arg-type]

    jobs.heartbeat = flaky  # type: ignore[method-assign, assignment]

    def step(payload: Value, number: int, state: Value) -> Continue | Finish:
        if number == 1:
            assert renewed.wait(5), calls  # the step outlives a failed beat and a good one
            return Continue(1)
        return Finish({"sum": 3})

    report = JobRunner(jobs, target, {"count": step}, heartbeat_every=0.02).run("j1")
    assert calls[:2] == ["busy", "renewed"]
    assert (report.state, report.steps) == ("completed", (1, 2))


def test_a_renewal_interval_must_be_shorter_than_the_lease(jobs: JobService, target: LocalPublisher) -> None:
    for bad in (0, -1, LEASE, LEASE * 2, True, "often"):
        with pytest.raises(InvalidJobError) as refused:
            JobRunner(jobs, target, {}, heartbeat_every=bad)  # type: ignore[arg-type]
        assert refused.value.field == "heartbeat_every"
    assert JobRunner(jobs, target, {}).heartbeat_every == LEASE / 3
    assert JobRunner(jobs, target, {}, heartbeat_every=None).heartbeat_every is None


# -- checkpoints and resume -------------------------------------------------------------------------


def test_a_retry_resumes_from_the_step_after_the_last_checkpoint(
    jobs: JobService, target: LocalPublisher
) -> None:
    jobs.enqueue(job(steps=5))
    handler = Counting(fail_at={4: RetryableJobError("flaky")})
    run = runner(jobs, target, handler)
    first = run.run("j1")
    assert (first.state, first.steps) == ("retry_wait", (1, 2, 3))
    second = run.run("j1")
    assert (second.state, second.steps) == ("completed", (4, 5))
    assert [step for step, _ in handler.calls] == [1, 2, 3, 4, 4, 5]
    assert handler.calls[4] == (4, 6)  # resumed with the checkpointed state 1 + 2 + 3
    [only] = target.read_published("j1")
    assert only.result == canonical_encode({"sum": 15})
    checkpoints = jobs.checkpoints("j1")
    assert [(c.step, c.state) for c in checkpoints] == [(1, 1), (2, 3), (3, 6), (4, 10)]
    assert checkpoints[2].fence < checkpoints[3].fence


def test_checkpoints_are_immutable_and_in_order(jobs: JobService) -> None:
    jobs.enqueue(job())
    lease = jobs.claim("j1").lease
    assert lease is not None
    jobs.checkpoint(lease, 1, "one")
    before = footprint(jobs, "j1")
    for step in (1, 3, 0):
        with pytest.raises(InvalidJobError) as refused:
            jobs.checkpoint(lease, step, "again")
        assert refused.value.field == "step"
    assert footprint(jobs, "j1") == before
    assert [(c.step, c.state) for c in jobs.checkpoints("j1")] == [(1, "one")]


# -- publication and recovery ------------------------------------------------------------------------


def crash_after_publish(jobs: JobService, target: LocalPublisher, result: object = None) -> str:
    """Run the steps, record and publish the result, and 'crash' before the acknowledgement."""
    lease = jobs.claim("j1").lease
    assert lease is not None
    for step, state in ((1, 1), (2, 3)):
        jobs.checkpoint(lease, step, state)
    recorded = jobs.record_result(lease, {"sum": 6})
    target.publish("j1", lease.attempt_id, recorded if result is None else canonical_encode(result))
    return lease.attempt_id


def test_a_consistent_publication_is_recovered_without_re_execution(
    jobs: JobService, clock: ManualClock, target: LocalPublisher
) -> None:
    jobs.enqueue(job())
    attempt = crash_after_publish(jobs, target)
    expire(jobs, clock, "j1")
    handler = Counting()
    report = runner(jobs, target, handler).run("j1")
    assert (report.state, report.reason, report.steps, report.published) == (
        "completed",
        "recovered_after_publish",
        (),
        False,
    )
    assert handler.calls == []
    assert [p.attempt_id for p in target.read_published("j1")] == [attempt]


@pytest.mark.parametrize("tamper", ["other bytes", "second publication", "other attempt"])
def test_an_inconsistent_publication_becomes_recovery_required_then_an_operator_resolves(
    jobs: JobService, clock: ManualClock, target: LocalPublisher, tamper: str
) -> None:
    jobs.enqueue(job())
    if tamper == "other bytes":
        crash_after_publish(jobs, target, result={"sum": 7})
    else:
        attempt = crash_after_publish(jobs, target)
        other = attempt if tamper == "second publication" else "someone-else"
        target.publish("j1", other, canonical_encode({"sum": 6}))
    expire(jobs, clock, "j1")
    handler = Counting()
    report = runner(jobs, target, handler).run("j1")
    assert (report.state, report.reason) == ("recovery_required", "inconsistent_publication")
    assert handler.calls == []
    assert jobs.claim("j1").reason == "recovery_required"
    with pytest.raises(InvalidJobError) as refused:
        jobs.resolve("j1", "completed", who="", why="checked")
    assert refused.value.field == "who"
    view = jobs.resolve("j1", "completed", who="ops@example", why="target checked by hand")
    assert (view.state, view.reason) == ("completed", "resolved_completed")
    assert jobs.events("j1")[-1].detail == "ops@example: target checked by hand"
    with pytest.raises(JobStateError):
        jobs.resolve("j1", "failed", who="ops@example", why="twice")


def test_a_recorded_but_unpublished_result_is_published_once_with_the_same_ids(
    jobs: JobService, clock: ManualClock, target: LocalPublisher
) -> None:
    jobs.enqueue(job())
    lease = jobs.claim("j1").lease
    assert lease is not None
    jobs.record_result(lease, {"sum": 6})  # then a crash before publishing
    expire(jobs, clock, "j1")
    handler = Counting()
    report = runner(jobs, target, handler).run("j1")
    assert (report.state, report.reason, report.published) == ("completed", "published_on_replay", True)
    assert handler.calls == []
    assert target.read_published("j1") == [
        PublishedResult("j1", lease.attempt_id, canonical_encode({"sum": 6}))
    ]


def test_a_duplicate_delivery_of_a_final_job_does_nothing(jobs: JobService, target: LocalPublisher) -> None:
    jobs.enqueue(job())
    handler = Counting()
    run = runner(jobs, target, handler)
    assert run.run("j1").state == "completed"
    calls, before = list(handler.calls), footprint(jobs, "j1")
    for _ in range(3):
        assert run.run("j1").outcome == "final"
        assert jobs.claim("j1").outcome == "final"
        assert jobs.enqueue(job()).outcome == "duplicate"
        assert run.run_next("tenant-a") is None
    assert handler.calls == calls and footprint(jobs, "j1") == before
    assert target.count() == 1


# -- the event log -----------------------------------------------------------------------------------


def test_every_transition_is_an_event_of_the_table_written_with_the_state(
    jobs: JobService, clock: ManualClock, target: LocalPublisher
) -> None:
    jobs.enqueue_all([job("a", max_attempts=4), job("b", depends_on=("a",))])
    handler = Counting(fail_at={2: RetryableJobError("x")})
    run = runner(jobs, target, handler)
    run.run("a")
    lease = jobs.claim("a").lease
    assert lease is not None
    expire(jobs, clock, "a")
    run.run("a")
    run.run("b")
    for job_id in ("a", "b"):
        events = jobs.events(job_id)
        state = None
        for event in events:
            assert event.from_state == state, (job_id, event)
            if event.from_state is not None and (event.from_state, event.event) in JOB_TRANSITIONS:
                assert JOB_TRANSITIONS[(event.from_state, event.event)] == event.to_state
            else:  # the enqueue, or a request that changes no state
                assert event.event in MARKS and (
                    event.event == "enqueue" or event.from_state == event.to_state
                )
            assert event.recorded_at.tzinfo is not None
            state = event.to_state
        assert state == jobs.status(job_id).state == "completed"
    kinds = [e.event for e in jobs.events("a")]
    assert kinds == [
        "enqueue",
        "claim",
        "retryable_failure",
        "claim",
        "reclaim",
        "result_recorded",
        "complete",
    ]


# -- rules with a universal form, as properties -----------------------------------------------------------

payloads = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.floats() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=6,
)


def test_a_second_enqueue_is_a_duplicate_exactly_when_the_canonical_content_is_equal(
    jobs: JobService,
) -> None:
    ids = itertools.count()

    @given(payloads, payloads, st.integers(1, 3), st.integers(1, 3))
    @settings(max_examples=60, deadline=None)
    def check(first: Value, second: Value, attempts_1: int, attempts_2: int) -> None:
        job_id = f"p{next(ids)}"
        a = Job(job_id, "props", "count", first, max_attempts=attempts_1)
        b = Job(job_id, "props", "count", second, max_attempts=attempts_2)
        jobs.enqueue(a)
        jobs.cancel(job_id)  # keep the scope's queue free
        same = canonical_encode(first) == canonical_encode(second) and attempts_1 == attempts_2
        assert jobs.enqueue(b).outcome == ("duplicate" if same else "conflict")

    check()


def test_a_batch_is_refused_exactly_when_its_dependencies_have_a_cycle_and_then_writes_nothing(
    jobs: JobService,
) -> None:
    batches = itertools.count()

    @given(
        st.dictionaries(st.sampled_from("abcde"), st.lists(st.sampled_from("abcde"), unique=True, max_size=2))
    )
    @settings(max_examples=40, deadline=None)
    def check(edges: dict[str, list[str]]) -> None:
        prefix = f"b{next(batches)}-"
        names = set(edges) | {d for ds in edges.values() for d in ds}
        batch = [
            Job(
                prefix + n, f"scope-{prefix}", "count", depends_on=tuple(prefix + d for d in edges.get(n, []))
            )
            for n in sorted(names)
        ]
        cyclic = find_cycle(edges) is not None
        before = footprint(jobs, *(member.job_id for member in batch))
        if cyclic:
            with pytest.raises(InvalidJobError) as refused:
                jobs.enqueue_all(batch)
            assert refused.value.field == "depends_on"
            assert footprint(jobs, *(member.job_id for member in batch)) == before
        else:
            answers = jobs.enqueue_all(batch)
            assert {a.outcome for a in answers} <= {"enqueued"}
            for answer, member in zip(answers, batch, strict=True):
                assert answer.state == ("blocked" if member.depends_on else "queued")

    check()
