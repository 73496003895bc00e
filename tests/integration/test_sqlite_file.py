"""A SQLite file deleted, replaced or moved under a running process: nothing is acknowledged from it.

SQLite keeps writing into a file that is no longer at its path (an unlinked
inode, or the one a rename moved away), and a restart opens whatever the path
names then.  Every test here takes a file away from a running service and
checks that what the service answers ``StorageError`` (HTTP 503, retryable)
instead of a receipt, that what it did acknowledge is always in the file the
path names, and that a new engine sees the new file.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine, event

from admission.errors import StorageError
from admission.intent import receipt_token
from admission.jobs import Job, JobService
from admission.receipts import AdmissionService
from admission.sql import SqlJobStore, SqlStore, SqlWorkerStore, create_admission_engine, upgrade
from admission.worker import DurableWorker, Scope
from tests.support.backends import SQL_BACKENDS

pytestmark = pytest.mark.skipif("sqlite" not in SQL_BACKENDS, reason="ADMISSION_TEST_BACKEND excludes SQLite")

NS = "tenant-a"
KEYS = ["before", "after", "after-2", "during", "first", "second", "one", "two", "three", "four"] + [
    f"k{number}" for number in range(12)
]
SCOPE = Scope.parse({"tenant": "t1", "account": "a1", "page": "p1", "form": "f1"})


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One database at the head with an open run of ``wf``, copied for each test (an upgrade is slow)."""
    path = tmp_path_factory.mktemp("template") / "head.sqlite3"
    engine = create_admission_engine(f"sqlite:///{path}")
    upgrade(engine)
    store = SqlStore(engine)
    AdmissionService(store).start_run(NS, "wf")
    store.dispose()  # the last connection checkpoints the WAL: the file alone is the database
    assert not Path(f"{path}-wal").exists()
    return path


def copy_of(template: Path, path: Path) -> Path:
    shutil.copyfile(template, path)
    return path


def stored_keys(path: Path) -> set[str]:
    """The signal keys in the file ``path`` names now (read-only: a missing file stays missing)."""
    if not path.exists() or path.stat().st_size == 0:
        return set()
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as conn:
        tokens = {str(token) for (token,) in conn.execute("SELECT request_id FROM workflow_commands")}
    return {key for key in KEYS if receipt_token("signal", key) in tokens}


@contextlib.contextmanager
def service_on(path: Path) -> Iterator[AdmissionService]:
    store = SqlStore(create_admission_engine(f"sqlite:///{path}"))
    try:
        yield AdmissionService(store)
    finally:
        store.dispose()


def admit(service: AdmissionService, key: str) -> str:
    """Admit a signal under ``key``; its answer's command id."""
    return service.admit_signal(NS, "wf", "pay", {"key": key}, request_id=key).command_id


def unlink(path: Path, template: Path) -> None:
    path.unlink()


def unlink_with_side_files(path: Path, template: Path) -> None:
    # ``rm db*``: the WAL holds the latest commits, the shared-memory index the WAL's map.
    for victim in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
        victim.unlink(missing_ok=True)


def replace_with_another_database(path: Path, template: Path) -> None:
    other = copy_of(template, path.with_name("other.sqlite3"))
    os.replace(other, path)


def replace_with_another_database_and_its_side_files(path: Path, template: Path) -> None:
    # A restore as SQLite needs it: the old -wal must not stay beside the new file, or a
    # restart reads the old file's latest commits as the new file's (docs/guide.md).
    replace_with_another_database(path, template)
    for side in (Path(f"{path}-wal"), Path(f"{path}-shm")):
        side.unlink(missing_ok=True)


def recreate_empty(path: Path, template: Path) -> None:
    path.unlink()
    path.touch()


ATTACKS: dict[str, Callable[[Path, Path], None]] = {
    "unlink": unlink,
    "unlink_with_side_files": unlink_with_side_files,
    "replace_with_another_database": replace_with_another_database,
    "replace_with_another_database_and_its_side_files": replace_with_another_database_and_its_side_files,
    "recreate_empty": recreate_empty,
}


@pytest.mark.parametrize("attack", ATTACKS)
def test_an_admission_after_the_file_is_taken_away_is_refused_and_a_restart_finds_none_of_it(
    attack: str, template: Path, tmp_path: Path
) -> None:
    path = copy_of(template, tmp_path / "engine.sqlite3")
    with service_on(path) as service:
        admit(service, "before")
        assert stored_keys(path) == {"before"}
        ATTACKS[attack](path, template)
        after = stored_keys(path)

        with pytest.raises(StorageError, match="no longer the file"):
            admit(service, "after")
        # A retry of the receipt acknowledged before is not answered from the old file either,
        # and nor is a read: the service answers from the file the path names, or not at all.
        with pytest.raises(StorageError):
            admit(service, "before")
        with pytest.raises(StorageError):
            service.receipt(NS, "wf", "signal", "before")
        # It keeps refusing (new connections are refused too) and never recreates a deleted file.
        with pytest.raises(StorageError):
            admit(service, "after-2")
        assert stored_keys(path) == after
        assert path.exists() == (attack.startswith("replace") or attack == "recreate_empty")

    # The restart: a new engine opens what the path names now, which never holds the refused keys.
    assert "after" not in stored_keys(path) and "after-2" not in stored_keys(path)
    if attack == "replace_with_another_database_and_its_side_files":
        with service_on(path) as restarted:
            assert restarted.receipt(NS, "wf", "signal", "before") is None
            admit(restarted, "after")
        assert stored_keys(path) == {"after"}


def test_a_deleted_write_ahead_log_is_refused_with_the_writes_it_would_lose(
    template: Path, tmp_path: Path
) -> None:
    path = copy_of(template, tmp_path / "engine.sqlite3")
    with service_on(path) as service:
        admit(service, "before")
        Path(f"{path}-wal").unlink()
        with pytest.raises(StorageError, match="no longer the file"):
            admit(service, "after")


def test_a_symlink_pointed_elsewhere_or_a_replaced_target_is_refused(template: Path, tmp_path: Path) -> None:
    real = copy_of(template, tmp_path / "real.sqlite3")
    link = tmp_path / "engine.sqlite3"
    link.symlink_to(real)
    with service_on(link) as service:
        admit(service, "before")
        other = copy_of(template, tmp_path / "other.sqlite3")
        repointed = tmp_path / "repointed"
        repointed.symlink_to(other)
        os.replace(repointed, link)
        with pytest.raises(StorageError, match="no longer the file"):
            admit(service, "after")
    assert "after" not in stored_keys(link) and stored_keys(real) == {"before"}

    with service_on(link) as service:  # the target itself replaced, the link unchanged
        admit(service, "first")
        os.replace(copy_of(template, tmp_path / "third.sqlite3"), other)
        with pytest.raises(StorageError, match="no longer the file"):
            admit(service, "second")
    assert "second" not in stored_keys(link)


def test_a_file_moved_away_and_back_is_used_again_and_a_replaced_one_only_after_dispose(
    template: Path, tmp_path: Path
) -> None:
    path = copy_of(template, tmp_path / "engine.sqlite3")
    aside = tmp_path / "aside.sqlite3"
    with service_on(path) as service:
        admit(service, "one")
        for suffix in ("", "-wal", "-shm"):
            os.rename(f"{path}{suffix}", f"{aside}{suffix}")
        with pytest.raises(StorageError):
            admit(service, "two")
        for suffix in ("", "-wal", "-shm"):
            os.rename(f"{aside}{suffix}", f"{path}{suffix}")
        assert stored_keys(path) == {"one"}  # refused when it began: not written to the file moved away
        # The very file the engine opened is back at its path (the engine keeps it open,
        # so its inode cannot be another file's): it is safe to use again.
        admit(service, "three")
        assert service.receipt(NS, "wf", "signal", "one") is not None

        replace_with_another_database_and_its_side_files(path, template)
        with pytest.raises(StorageError):
            admit(service, "four")
        service.store.dispose()  # type: ignore[attr-defined]
        # Disposed, the engine opens what the path names now.
        admit(service, "four")
    assert stored_keys(path) == {"four"}


def test_a_file_deleted_while_the_commit_runs_is_not_acknowledged(template: Path, tmp_path: Path) -> None:
    path = copy_of(template, tmp_path / "engine.sqlite3")
    with service_on(path) as service:
        admit(service, "before")
        engine: Engine = service.store.engine  # type: ignore[attr-defined]

        def unlink_now(_connection: Any) -> None:
            # The last moment before COMMIT, after every check made when the transaction began.
            if path.exists():
                path.unlink()

        event.listen(engine, "commit", unlink_now)
        with pytest.raises(StorageError, match="no longer the file"):
            admit(service, "during")
        # The write reached the unlinked file; a retry must not find it there and call it retained.
        with pytest.raises(StorageError):
            admit(service, "during")
    assert not path.exists()


def test_the_worker_and_job_stores_on_the_engine_refuse_too(template: Path, tmp_path: Path) -> None:
    path = copy_of(template, tmp_path / "engine.sqlite3")
    engine = create_admission_engine(f"sqlite:///{path}")
    try:
        jobs = JobService(SqlJobStore(engine))
        worker = DurableWorker(SqlWorkerStore(engine), SCOPE, file_lock=False)
        record = {**SCOPE.as_dict(), "source_key": "lead-1", "payload": {}}
        jobs.enqueue(Job("j1", "tenant-a", "count", {"steps": 1}))
        assert worker.accept(record).outcome == "accepted"
        replace_with_another_database_and_its_side_files(path, template)
        with pytest.raises(StorageError, match="no longer the file"):
            jobs.enqueue(Job("j2", "tenant-a", "count", {"steps": 1}))
        with pytest.raises(StorageError, match="no longer the file"):
            worker.accept({**record, "source_key": "lead-2"})
        with pytest.raises(StorageError):
            jobs.status("j1")
    finally:
        engine.dispose()
    with contextlib.closing(sqlite3.connect(path)) as conn:
        assert conn.execute("SELECT count(*) FROM worker_jobs").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM worker_records").fetchone() == (0,)


def test_the_http_adapter_answers_503_retryable(template: Path, tmp_path: Path) -> None:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from fastapi.testclient import TestClient

    from admission.http import JsonCodec, create_app, envelope

    path = copy_of(template, tmp_path / "engine.sqlite3")
    with service_on(path) as service:
        client = TestClient(create_app(service), raise_server_exceptions=False)
        body = {"request_id": "k1", "input": envelope(JsonCodec(), {"amount": 1})}
        headers = {"X-Namespace": NS}
        assert client.post("/api/workflows/wf/signal/pay", json=body, headers=headers).status_code == 202
        path.unlink()
        for key in ("k1", "k2"):  # the retry of an acknowledged key, and a new one
            response = client.post(
                "/api/workflows/wf/signal/pay", json={**body, "request_id": key}, headers=headers
            )
            assert response.status_code == 503
            answer = response.json()
            assert (answer["reason"], answer["retryable"]) == ("storage_unavailable", True)
            assert "no longer the file" in answer["message"]


# -- the rule, for any sequence -------------------------------------------------------------------

STEPS = st.lists(
    st.sampled_from(
        [
            "admit",
            "retry",
            "unlink",
            "replace",
            "replace_file_only",
            "recreate",
            "move_away",
            "move_back",
            "dispose",
        ]
    ),
    min_size=1,
    max_size=12,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=STEPS)
@example(steps=["admit", "unlink", "admit"])
@example(steps=["admit", "replace", "retry", "admit", "dispose", "admit"])
@example(steps=["admit", "move_away", "admit", "move_back", "retry", "admit"])
def test_every_acknowledged_receipt_is_in_the_file_the_path_names_when_it_is_acknowledged(
    steps: list[str], template: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    directory = tmp_path_factory.mktemp("steps")
    path = copy_of(template, directory / "engine.sqlite3")
    aside = directory / "aside.sqlite3"
    keys: list[str] = []
    with service_on(path) as service:
        for number, step in enumerate(steps):
            if step in ("admit", "retry"):
                key = keys[-1] if step == "retry" and keys else f"k{number}"
                try:
                    admit(service, key)
                except StorageError:
                    continue
                keys.append(key)
                # Acknowledged: then the file the path names holds it, now.
                assert key in stored_keys(path), steps[: number + 1]
            elif step == "unlink":
                path.unlink(missing_ok=True)
            elif step == "replace":
                replace_with_another_database_and_its_side_files(path, template)
            elif step == "replace_file_only":
                replace_with_another_database(path, template)
            elif step == "recreate":
                path.unlink(missing_ok=True)
                path.touch()
            elif step == "move_away" and path.exists() and not aside.exists():
                os.rename(path, aside)
            elif step == "move_back" and aside.exists():
                os.replace(aside, path)
            elif step == "dispose":
                service.store.dispose()  # type: ignore[attr-defined]


class _CallerConnection(sqlite3.Connection):
    """A caller's own driver connection class, given as ``connect_args["factory"]``."""


@pytest.mark.parametrize("form", ["factory", "uri"])
def test_the_check_holds_for_a_callers_connection_class_and_for_a_file_uri(
    form: str, template: Path, tmp_path: Path
) -> None:
    path = copy_of(template, tmp_path / "engine.sqlite3")
    if form == "factory":
        engine = create_admission_engine(
            f"sqlite:///{path}", connect_args={"factory": _CallerConnection, "check_same_thread": False}
        )
    else:
        engine = create_admission_engine(f"sqlite:///file:{path}?mode=rw&uri=true")
    store = SqlStore(engine)
    try:
        service = AdmissionService(store)
        admit(service, "before")
        raw = engine.raw_connection()
        assert isinstance(raw.dbapi_connection, _CallerConnection) == (form == "factory")
        raw.close()
        path.unlink()
        with pytest.raises(StorageError, match="no longer the file"):
            admit(service, "after")
    finally:
        store.dispose()
