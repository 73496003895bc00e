"""Durable jobs on SQL only: what the job store port's contract suite cannot show (worker contract §3, §4).

The rules themselves run on every backend in ``tests/contract/test_job_store.py``;
here are the behaviours only a database has: a dependent enqueued by another
connection while its dependency completes (row locks, seen through engine
events), and the refused downgrade of the job tables.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import Engine

from admission.jobs import Job, JobService
from admission.sql import HEAD_REVISION, SqlJobStore, downgrade, revision_of
from tests.support.jobkit import ManualClock, open_jobs


@pytest.fixture
def jobs(db_url: str) -> Iterator[JobService]:
    service = open_jobs(db_url, ManualClock())
    yield service
    service.dispose()


def job(job_id: str = "j1", steps: int = 3, **kw: object) -> Job:
    return Job(job_id, kw.pop("scope", "tenant-a"), "count", {"steps": steps}, **kw)  # type: ignore[arg-type]


def engine_of(service: JobService) -> Engine:
    assert isinstance(service.store, SqlJobStore)
    return service.store.engine


def test_a_dependent_enqueued_while_its_dependency_completes_is_never_left_blocked(db_url: str) -> None:
    import threading
    import time

    from sqlalchemy import event

    finishing, enqueuing = open_jobs(db_url), open_jobs(db_url)
    try:
        finishing.enqueue(job("a"))
        lease = finishing.claim("a").lease
        assert lease is not None
        finishing.record_result(lease, {"sum": 6})
        threads: list[threading.Thread] = []

        def meanwhile(_c: object, _cur: object, statement: str, *_rest: object) -> None:
            # The completion has just looked for blocked dependents (none yet):
            # now another process enqueues one, before the completion commits.
            if threads or "worker_job_dependencies" not in statement or "blocked" not in str(_rest):
                return
            dependent = job("b", depends_on=("a",), scope="tenant-b")  # another scope: another lock
            thread = threading.Thread(target=lambda: enqueuing.enqueue(dependent))
            threads.append(thread)
            thread.start()
            time.sleep(0.5)  # time for the enqueue to finish, unless it waits for this commit

        event.listen(engine_of(finishing), "after_cursor_execute", meanwhile)
        finishing.complete(lease)
        event.remove(engine_of(finishing), "after_cursor_execute", meanwhile)
        [thread] = threads
        thread.join(30)
        assert finishing.status("a").state == "completed"
        assert finishing.status("b").state == "queued"  # its dependency succeeded: claimable
    finally:
        finishing.dispose()
        enqueuing.dispose()


def test_the_downgrade_of_0004_is_refused_while_jobs_exist(jobs: JobService) -> None:
    jobs.enqueue(job())
    with pytest.raises(RuntimeError, match="refusing to downgrade"):
        downgrade(engine_of(jobs), "0003")
    assert revision_of(engine_of(jobs)) == HEAD_REVISION
