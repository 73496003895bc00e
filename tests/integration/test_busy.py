"""A SQLite database held by another writer past the busy timeout: every store answers StorageError.

The write transactions begin with ``BEGIN IMMEDIATE`` on the driver; a busy
timeout there must reach each store's one translation boundary as the typed
``StorageError``, never as the driver's own exception, and nothing is written.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import admission.sql._engine
from admission.errors import StorageError
from admission.jobs import Job, JobService
from admission.receipts import AdmissionService
from admission.sql import SqlJobStore, SqlStore, SqlWorkerStore, create_admission_engine, upgrade
from admission.worker import DurableWorker, Scope

SCOPE = Scope.parse({"tenant": "t1", "account": "a1", "page": "p1", "form": "f1"})


@pytest.fixture
def held(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, sqlite3.Connection]]:
    """A database at the head, and a connection that will hold its write lock."""
    monkeypatch.setattr(admission.sql._engine, "SQLITE_BUSY_TIMEOUT_MS", 50)
    path = tmp_path / "busy.sqlite3"
    engine = create_admission_engine(f"sqlite:///{path}")
    upgrade(engine)
    engine.dispose()
    holder = sqlite3.connect(path, isolation_level=None)
    yield f"sqlite:///{path}", holder
    holder.close()


def _refused_while_held(holder: sqlite3.Connection, write: Callable[[], object]) -> StorageError:
    holder.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(StorageError) as refused:
            write()
    finally:
        holder.execute("ROLLBACK")
    assert "busy" in str(refused.value) or "locked" in str(refused.value)
    return refused.value


def test_the_admission_store_the_job_store_and_the_worker_answer_a_busy_database_with_storage_error(
    held: tuple[str, sqlite3.Connection],
) -> None:
    url, holder = held
    engine = create_admission_engine(url)
    try:
        service = AdmissionService(SqlStore(engine))
        jobs = JobService(SqlJobStore(engine))
        jobs.enqueue(Job("j1", "tenant-a", "count", {"steps": 1}))
        worker = DurableWorker(SqlWorkerStore(engine), SCOPE, file_lock=False)
        record = {**SCOPE.as_dict(), "source_key": "lead-1", "payload": {}}

        _refused_while_held(holder, lambda: service.start_run("ns", "wf"))
        _refused_while_held(holder, lambda: jobs.pause("j1"))
        _refused_while_held(holder, lambda: worker.accept(record))
        # Nothing was written, and each works again once the other writer is gone.
        assert service.store.find_instance("ns", "wf") is None
        assert jobs.status("j1").paused is False
        assert not any(worker.status(records=False)["counts"].values())  # type: ignore[union-attr]
        service.start_run("ns", "wf")
        assert jobs.pause("j1").paused is True
        assert worker.accept(record).outcome == "accepted"
    finally:
        engine.dispose()
