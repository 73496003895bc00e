"""Claimers share a queue, one running job per scope, and never wait on each other (docs/jobs.md, "Claims").

A claim locks the job's scope row before the job's row, the order an enqueue
takes them in; ``claim_next`` takes the scope row with ``FOR UPDATE SKIP
LOCKED`` on PostgreSQL, so a scope another claim holds is passed over, never
waited for.  The proofs use PostgreSQL's ``lock_timeout``: a claimer whose
connections give up on any lock after 50 ms passes over the scope another
claimer sits in (uncommitted) and claims in another scope, and fails with the
waiting lock put back (``FOR UPDATE``); it passes over a job an operator's
uncommitted pause holds the same way.  A claim and an enqueue that meet on
one scope both finish; with the job's lock taken first they deadlock.  Then
claimers share one scope: its jobs run one at a time, each claimed once, in
queue order, and no claimer errs (on SQLite too, where the write transaction
serialises them); and claimers over many scopes end with one running job in
every scope.  Last, the claim queries still read through the index on PostgreSQL.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, event, text

import admission.sql._jobs
from admission.errors import AdmissionError, StorageError
from admission.jobs import Job, JobService
from admission.sql import SqlJobStore
from tests.support.backends import SQL_BACKENDS, PostgresPool, database_url
from tests.support.jobkit import open_jobs
from tests.support.processes import WAIT

LOCK_NOT_AVAILABLE = "55P03"
DEADLOCK_DETECTED = "40P01"


@pytest.fixture
def pg_url(postgres_pool: PostgresPool) -> str:
    if "postgresql" not in SQL_BACKENDS:
        pytest.skip("PostgreSQL is not selected (ADMISSION_TEST_BACKEND)")
    return postgres_pool.fresh_database(migrated=True)


@pytest.fixture
def services() -> Iterator[list[JobService]]:
    opened: list[JobService] = []
    yield opened
    for service in opened:
        service.dispose()


def engine_of(service: JobService) -> Engine:
    assert isinstance(service.store, SqlJobStore)
    return service.store.engine


def impatient(service: JobService) -> JobService:
    """Every connection of the service gives up on a lock after 50 ms: any wait becomes an error."""
    engine = engine_of(service)

    def set_timeout(dbapi_connection: Any, _record: object) -> None:
        with dbapi_connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = '50ms'")
        dbapi_connection.commit()  # a SET in a transaction rolled back would be undone

    event.listen(engine, "connect", set_timeout)
    engine.dispose()  # the connection the revision check opened has no timeout: gone
    with engine.connect() as conn:
        assert conn.execute(text("SHOW lock_timeout")).scalar_one() == "50ms"
    return service


def job(job_id: str, scope: str = "tenant-a") -> Job:
    return Job(job_id, scope, "count", {"steps": 1})


def lock_error(error: BaseException) -> str | None:
    return getattr(getattr(error.__cause__, "orig", None), "sqlstate", None)


def paused_after(service: JobService, starts: str) -> tuple[threading.Event, threading.Event]:
    """Make the service stop inside its transaction, after its first statement that starts with ``starts``."""
    inside, release = threading.Event(), threading.Event()

    def hold(_conn: object, _cursor: object, statement: str, *_rest: object) -> None:
        if statement.startswith(starts) and not inside.is_set():
            inside.set()
            release.wait(WAIT)

    event.listen(engine_of(service), "after_cursor_execute", hold)
    return inside, release


def paused_in_its_claim(service: JobService) -> tuple[threading.Event, threading.Event]:
    """Make the service's next claim stop inside its transaction (the claim is written, not committed)."""
    return paused_after(service, "INSERT INTO worker_job_events")


@pytest.mark.parametrize("lock", ["skip_locked", "for_update"])
def test_a_claimer_passes_over_the_scope_another_claimer_holds_and_claims_in_another_without_waiting(
    pg_url: str, services: list[JobService], monkeypatch: pytest.MonkeyPatch, lock: str
) -> None:
    first, second = open_jobs(pg_url), impatient(open_jobs(pg_url))
    services.extend((first, second))
    first.enqueue_all([job("a1"), job("a2"), job("b1", "tenant-b")])
    if lock == "for_update":
        # The waiting lock put back: the test must fail then, or it proves nothing.
        monkeypatch.setattr(admission.sql._jobs, "_LOCK_SCOPE_OR_SKIP", admission.sql._jobs._LOCK_SCOPE)
    inside, release = paused_in_its_claim(first)
    answers: list[object] = []
    claimer = threading.Thread(target=lambda: answers.append(first.claim_next("tenant-a")))
    claimer.start()
    try:
        assert inside.wait(WAIT)  # the first claimer holds tenant-a and a1, uncommitted
        if lock == "skip_locked":
            assert second.claim_next("tenant-a") is None  # at once: not waited for, no error
        else:
            with pytest.raises(StorageError) as gave_up:
                second.claim_next("tenant-a")
            assert lock_error(gave_up.value) == LOCK_NOT_AVAILABLE
        # Another scope is another lock: claimed side by side.
        taken = second.claim_next("tenant-b")
        assert taken is not None and (taken.job_id, taken.outcome) == ("b1", "claimed")
        # A claim naming a job waits for its scope (to answer exactly), so it gives up here.
        with pytest.raises(StorageError) as named:
            second.claim("a2")
        assert lock_error(named.value) == LOCK_NOT_AVAILABLE
    finally:
        release.set()
        claimer.join(WAIT)
    [held] = answers
    assert getattr(held, "job_id", None) == "a1" and first.status("a1").fence == 1
    # a1 runs: nothing else of its scope starts, and the refusal writes nothing.
    assert second.claim_next("tenant-a") is None
    busy = second.claim("a2")
    assert (busy.outcome, busy.state, busy.reason) == ("not_claimable", "queued", "scope_busy")
    assert [e.event for e in first.events("a2")] == ["enqueue"] and first.status("a2").fence == 0


@pytest.mark.parametrize("lock", ["skip_locked", "for_update"])
def test_claim_next_passes_over_a_job_an_operator_holds_without_waiting(
    pg_url: str, services: list[JobService], monkeypatch: pytest.MonkeyPatch, lock: str
) -> None:
    operator, claimer = open_jobs(pg_url), impatient(open_jobs(pg_url))
    services.extend((operator, claimer))
    operator.enqueue_all([job("a1"), job("a2")])
    if lock == "for_update":
        monkeypatch.setattr(admission.sql._jobs, "_LOCK_JOB_OR_SKIP", admission.sql._jobs._LOCK_JOB)
    inside, release = paused_after(operator, "INSERT INTO worker_job_events")
    pausing = threading.Thread(target=lambda: operator.pause("a1"))
    pausing.start()
    try:
        assert inside.wait(WAIT)  # the operator's pause holds a1, uncommitted
        if lock == "skip_locked":
            taken = claimer.claim_next("tenant-a")
            assert taken is not None and (taken.job_id, taken.outcome) == ("a2", "claimed")
        else:
            with pytest.raises(StorageError) as gave_up:
                claimer.claim_next("tenant-a")
            assert lock_error(gave_up.value) == LOCK_NOT_AVAILABLE
    finally:
        release.set()
        pausing.join(WAIT)
    assert operator.status("a1").paused


def waiting_on_a_lock(service: JobService) -> bool:
    with engine_of(service).connect() as conn:
        query = (
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE wait_event_type = 'Lock' AND datname = current_database()"
        )
        return int(conn.execute(text(query)).scalar_one()) > 0


@pytest.mark.parametrize("order", ["scope_first", "job_first"])
def test_a_claim_and_an_enqueue_meeting_on_one_scope_both_finish_because_both_lock_the_scope_first(
    pg_url: str, services: list[JobService], monkeypatch: pytest.MonkeyPatch, order: str
) -> None:
    enqueuing, claiming = open_jobs(pg_url), open_jobs(pg_url)
    services.extend((enqueuing, claiming))
    enqueuing.enqueue(job("a"))
    if order == "job_first":
        # The other order: the claim reads its job's scope with the job locked, then locks the scope.
        locking = admission.sql._jobs._FIND_JOBS.with_for_update()
        monkeypatch.setattr(admission.sql._jobs, "_FIND_JOBS", locking)
    # The enqueue holds the scope; next it reads its dependency "a" under a shared lock.
    inside, release = paused_after(enqueuing, "SELECT worker_job_scopes.scope")
    errors: list[BaseException] = []
    answers: list[object] = []

    def attempt(call: Any) -> None:
        try:
            answers.append(call())
        except AdmissionError as exc:
            errors.append(exc)

    dependent = Job("b", "tenant-a", "count", {"steps": 1}, depends_on=("a",))
    threads = [
        threading.Thread(target=attempt, args=(lambda: enqueuing.enqueue(dependent),)),
        threading.Thread(target=attempt, args=(lambda: claiming.claim("a"),)),
    ]
    threads[0].start()
    try:
        assert inside.wait(WAIT)
        threads[1].start()
        give_up = time.monotonic() + WAIT
        while not waiting_on_a_lock(claiming) and time.monotonic() < give_up:
            time.sleep(0.01)  # until the claim waits for the scope the enqueue holds
    finally:
        release.set()
        for thread in threads:
            thread.join(WAIT)
    if order == "job_first":
        [error] = errors  # PostgreSQL found the cycle and ended one of the two
        assert lock_error(error) == DEADLOCK_DETECTED
        return
    assert errors == []
    assert claiming.status("a").state == "running" and claiming.status("b").state == "blocked"


class Queue:
    """What the claimers of one test share: the order in which jobs began and ended, and their errors."""

    def __init__(self, jobs: int) -> None:
        self.jobs = jobs
        self.start = threading.Barrier(1)
        self.lock = threading.Lock()
        self.marks: list[tuple[str, str]] = []
        self.running: list[int | None] = []
        self.errors: list[BaseException] = []

    def mark(self, what: str, job_id: str) -> None:
        with self.lock:
            self.marks.append((what, job_id))


def drain(claimer: JobService, owner: JobService, queue: Queue, mine: list[str]) -> None:
    """Claim from one scope until all its jobs completed; run each job claimed, and complete it.

    A job begins after its claim committed and ends before its completion
    commits, so if two ran at once their marks would interleave.  The claims
    are the impatient service's; the owner's writes go through a service of
    their own, since an owner's write may wait a moment for a claimer that is
    judging its job.
    """
    try:
        queue.start.wait(WAIT)
        give_up = time.monotonic() + WAIT  # a bound on a broken run, not a measure
        while owner.counts("queue").get("completed", 0) < queue.jobs and time.monotonic() < give_up:
            answer = claimer.claim_next("queue")
            if answer is None or answer.lease is None:
                time.sleep(0.002)  # the scope is busy (another claimer's job runs): not a wait on a lock
                continue
            lease = answer.lease
            queue.mark("start", lease.job_id)
            mine.append(lease.job_id)
            running = owner.counts("queue").get("running")
            queue.running.append(running)
            owner.checkpoint(lease, 1, running)  # the job's work, while it alone runs
            owner.record_result(lease, {"running": running})
            queue.mark("end", lease.job_id)
            owner.complete(lease)
    except BaseException as exc:  # every error of a claimer is the test's finding
        queue.errors.append(exc)


def claimers(url: str, backend: str, count: int, services: list[JobService]) -> list[JobService]:
    """``count`` services, each with an engine of its own; on PostgreSQL none of them waits for a lock."""
    made = [open_jobs(url) for _ in range(count)]
    services.extend(made)
    return [impatient(service) for service in made] if backend == "postgresql" else made


def run_all(targets: list[tuple[Any, tuple[Any, ...]]]) -> None:
    threads = [threading.Thread(target=target, args=args) for target, args in targets]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT)


@pytest.mark.parametrize("backend", SQL_BACKENDS)
def test_claimers_sharing_one_scope_run_its_jobs_one_at_a_time_in_order_each_once_without_errors(
    backend: str, postgres_pool: PostgresPool, tmp_path: Path, services: list[JobService]
) -> None:
    url = database_url(backend, postgres_pool, tmp_path)
    count = 4
    jobs = [job(f"q{i:03d}", "queue") for i in range(24)]
    claiming = claimers(url, backend, count, services)
    owners = [open_jobs(url) for _ in range(count)]
    services.extend(owners)
    owners[0].enqueue_all(jobs)
    queue = Queue(len(jobs))
    queue.start = threading.Barrier(count)
    claimed: list[list[str]] = [[] for _ in range(count)]
    run_all([(drain, (c, o, queue, mine)) for c, o, mine in zip(claiming, owners, claimed, strict=True)])
    assert queue.errors == []
    order = [job_id for what, job_id in queue.marks if what == "start"]
    # One at a time: every job ended before the next began; in queue order; each once.
    assert queue.marks == [(what, j) for j in order for what in ("start", "end")]
    assert order == [j.job_id for j in jobs]
    assert sorted(j for mine in claimed for j in mine) == order
    assert queue.running == [1] * len(jobs)  # what the database said while each job ran
    assert owners[0].counts("queue") == {"completed": len(jobs)}
    assert all(owners[0].status(j.job_id).fence == 1 for j in jobs)


def claim_round(claimer: JobService, scopes: list[str], queue: Queue, mine: list[str]) -> None:
    """Go round the scopes, claiming (and holding) what can be claimed, until a round claims nothing."""
    try:
        queue.start.wait(WAIT)
        while True:
            taken = [claimer.claim_next(scope) for scope in scopes]
            won = [answer.job_id for answer in taken if answer is not None and answer.lease is not None]
            mine.extend(won)
            if not won:
                return
    except BaseException as exc:  # every error of a claimer is the test's finding
        queue.errors.append(exc)


@pytest.mark.parametrize("backend", SQL_BACKENDS)
def test_claimers_over_many_scopes_leave_one_running_job_in_every_scope_side_by_side(
    backend: str, postgres_pool: PostgresPool, tmp_path: Path, services: list[JobService]
) -> None:
    url = database_url(backend, postgres_pool, tmp_path)
    count, scopes = 4, [f"s{n}" for n in range(8)]
    claiming = claimers(url, backend, count, services)
    claiming[0].enqueue_all([job(f"{scope}-j{i}", scope) for i in range(3) for scope in scopes])
    queue = Queue(0)
    queue.start = threading.Barrier(count)
    claimed: list[list[str]] = [[] for _ in range(count)]
    # Each claimer starts its rounds at another scope, so that they meet on every scope.
    rounds = [scopes[n * 2 :] + scopes[: n * 2] for n in range(count)]
    run_all(
        [(claim_round, (c, r, queue, mine)) for c, r, mine in zip(claiming, rounds, claimed, strict=True)]
    )
    assert queue.errors == []
    every = sorted(j for mine in claimed for j in mine)
    assert every == sorted(f"{scope}-j0" for scope in scopes)  # each scope's oldest, each once
    for scope in scopes:
        assert claiming[0].counts(scope) == {"running": 1, "queued": 2}


def test_the_claim_query_reads_through_the_scope_and_state_index(
    pg_url: str, services: list[JobService]
) -> None:
    service = open_jobs(pg_url)
    services.append(service)
    engine = engine_of(service)
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO worker_job_scopes VALUES ('s' || generate_series(1, 37), 0, now())"))
        conn.execute(
            text(
                "INSERT INTO worker_jobs (job_id, scope, position, kind, payload, content, state, reason, "
                "max_attempts, attempts, fence, beat, paused, cancel_requested, stop_requested, "
                "checkpoint_step, created_at, updated_at, not_before) "
                "SELECT 'j' || n, 's' || (n % 37 + 1), n, 'count', '\\x00', '\\x00', "
                "(ARRAY['completed', 'completed', 'failed', 'queued', 'retry_wait', 'running'])[n % 6 + 1], "
                "'r', 3, 1, 1, 0, false, false, false, 0, now(), now(), "
                "CASE WHEN n % 6 = 4 THEN now() + interval '1 minute' END "
                "FROM generate_series(1, 20000) AS n"
            )
        )
        conn.execute(text("ANALYZE worker_jobs"))
    seen: list[tuple[str, Any]] = []

    def capture(_conn: object, _cursor: object, statement: str, parameters: Any, *_rest: object) -> None:
        if statement.startswith("SELECT worker_jobs.job_id") and "ORDER BY" in statement:
            seen.append((statement, parameters))

    event.listen(engine, "before_cursor_execute", capture)
    # s7 holds running jobs (as no claim makes them now), their leases live as far as this
    # service knows: it claims nothing, but it has read the candidates and the running jobs.
    assert service.claim_next("s7") is None
    event.remove(engine, "before_cursor_execute", capture)
    candidates, running = seen  # the two queries, as claim_next ran them
    assert "worker_jobs.paused" in candidates[0] and "worker_jobs.paused" not in running[0]
    for statement, parameters in seen:
        with engine.connect() as conn:
            plan = "\n".join(conn.exec_driver_sql("EXPLAIN " + statement, parameters).scalars())
        assert "ix_worker_jobs_scope_state" in plan and "Seq Scan" not in plan, plan
