"""Jobs are claimed like a queue: concurrent claimers never wait on each other (docs/jobs.md, "Claims").

On PostgreSQL ``claim_next`` locks its candidate with ``FOR UPDATE SKIP
LOCKED``: a job another claimer holds is passed over, not waited for.  The
proof uses PostgreSQL's ``lock_timeout``: a claimer whose connections give up
on any lock after 50 ms claims the next job while another claimer sits inside
its uncommitted claim of the first; the same claimer with the waiting lock
put back (``FOR UPDATE``) fails with ``lock_not_available``.  Then several
claimers drain one queue at once: every job is claimed exactly once, and no
claimer errs (on SQLite too, where the write transaction serialises them).
Last, the claim query still reads through the index on PostgreSQL.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, event, text

import admission.sql._jobs
from admission.errors import StorageError
from admission.jobs import Job, JobService
from admission.sql import SqlJobStore
from tests.support.backends import SQL_BACKENDS, PostgresPool, database_url
from tests.support.jobkit import open_jobs
from tests.support.processes import WAIT

LOCK_NOT_AVAILABLE = "55P03"


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


def lock_error(error: StorageError) -> str | None:
    return getattr(getattr(error.__cause__, "orig", None), "sqlstate", None)


def paused_in_its_claim(service: JobService) -> tuple[threading.Event, threading.Event]:
    """Make the service's next claim stop inside its transaction (the claim is written, not committed)."""
    inside, release = threading.Event(), threading.Event()

    def hold(_conn: object, _cursor: object, statement: str, *_rest: object) -> None:
        if statement.startswith("INSERT INTO worker_job_events") and not inside.is_set():
            inside.set()
            release.wait(WAIT)

    event.listen(engine_of(service), "after_cursor_execute", hold)
    return inside, release


@pytest.mark.parametrize("lock", ["skip_locked", "for_update"])
def test_a_claimer_takes_the_next_job_without_waiting_for_the_one_another_claimer_holds(
    pg_url: str, services: list[JobService], monkeypatch: pytest.MonkeyPatch, lock: str
) -> None:
    first, second = open_jobs(pg_url), impatient(open_jobs(pg_url))
    services.extend((first, second))
    first.enqueue_all([job("j1"), job("j2")])
    if lock == "for_update":
        # The waiting lock put back: the test must fail then, or it proves nothing.
        monkeypatch.setattr(admission.sql._jobs, "_LOCK_JOB_OR_SKIP", admission.sql._jobs._LOCK_JOB)
    inside, release = paused_in_its_claim(first)
    answers: list[object] = []
    claimer = threading.Thread(target=lambda: answers.append(first.claim_next("tenant-a")))
    claimer.start()
    try:
        assert inside.wait(WAIT)  # the first claimer holds j1, uncommitted
        if lock == "skip_locked":
            taken = second.claim_next("tenant-a")
            assert taken is not None and taken.job_id == "j2" and taken.outcome == "claimed"
        else:
            with pytest.raises(StorageError) as gave_up:
                second.claim_next("tenant-a")
            assert lock_error(gave_up.value) == LOCK_NOT_AVAILABLE
        # A claim naming j1 waits for its row (to answer exactly), so it gives up here.
        with pytest.raises(StorageError) as named:
            second.claim("j1")
        assert lock_error(named.value) == LOCK_NOT_AVAILABLE
    finally:
        release.set()
        claimer.join(WAIT)
    [held] = answers
    assert getattr(held, "job_id", None) == "j1"
    assert first.status("j1").fence == 1


def drain(
    service: JobService, start: threading.Barrier, claimed: list[str], errors: list[BaseException]
) -> None:
    try:
        start.wait(WAIT)
        while (answer := service.claim_next("queue")) is not None:
            claimed.append(answer.job_id)
    except BaseException as exc:  # every error of a claimer is the test's finding
        errors.append(exc)


@pytest.mark.parametrize("backend", SQL_BACKENDS)
def test_concurrent_claimers_claim_every_job_exactly_once_without_errors(
    backend: str, postgres_pool: PostgresPool, tmp_path: Path, services: list[JobService]
) -> None:
    url = database_url(backend, postgres_pool, tmp_path)
    claimers = 4
    jobs = [job(f"q{i:03d}", "queue") for i in range(48)]
    for _ in range(claimers):
        service = open_jobs(url)
        services.append(impatient(service) if backend == "postgresql" else service)
    services[0].enqueue_all(jobs)
    start = threading.Barrier(claimers)
    claimed: list[list[str]] = [[] for _ in range(claimers)]
    errors: list[BaseException] = []
    threads = [
        threading.Thread(target=drain, args=(service, start, mine, errors))
        for service, mine in zip(services, claimed, strict=True)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT)
    assert errors == []
    every = [job_id for mine in claimed for job_id in mine]
    assert sorted(every) == [j.job_id for j in jobs]  # each once: no job twice, none left
    assert all(services[0].status(j.job_id).fence == 1 for j in jobs)
    assert services[0].counts("queue") == {"running": len(jobs)}


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
        if "ORDER BY" in statement and "worker_jobs.paused" in statement:
            seen.append((statement, parameters))

    event.listen(engine, "before_cursor_execute", capture)
    assert service.claim_next("s7") is not None
    event.remove(engine, "before_cursor_execute", capture)
    statement, parameters = seen[0]  # the candidates query, as claim_next ran it
    with engine.connect() as conn:
        plan = "\n".join(conn.exec_driver_sql("EXPLAIN " + statement, parameters).scalars())
    assert "ix_worker_jobs_scope_state" in plan and "Seq Scan" not in plan, plan
