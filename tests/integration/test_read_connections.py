"""The unlocked receipt read on SQLite: on an idle kept writer, never ahead of or behind a commit.

SQLite drops a connection's page cache when another connection has committed
since its last read; a writer keeps its own across its own commits.  So the
read takes an idle kept writer first (``admission/sql/_connections.py``).
What must not change: a read answers from committed rows only (a positive is
a committed receipt) and sees every commit made before it began, by this
store's writers, another engine's, or another process's.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import threading
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from admission.intent import receipt_token
from admission.receipts import AdmissionService, CommandRow, Decision
from admission.sql import SqlStore, create_admission_engine, upgrade

NS = "reads"
ARGS = {"order_id": "o-1"}


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'reads.sqlite3'}"
    engine = create_admission_engine(url)
    upgrade(engine)
    engine.dispose()
    return url


@contextlib.contextmanager
def _opened(url: str) -> Iterator[tuple[SqlStore, AdmissionService]]:
    """A store on ``url`` and its service, with an open run of ``wf``."""
    store = SqlStore.open(url)
    try:
        service = AdmissionService(store)
        service.start_run(NS, "wf")
        yield store, service
    finally:
        store.dispose()


def _keys(key: str) -> list[str]:
    return [receipt_token("signal", key), key]


def _read_connection(store: SqlStore) -> Any:
    """The driver connection the store's next unlocked read runs on."""
    return store._kept.read(store.engine, lambda connection, _cursor: connection)  # type: ignore[attr-defined]


def test_after_an_admission_the_read_runs_on_the_writer_that_committed_and_gives_it_back(
    sqlite_url: str,
) -> None:
    with _opened(sqlite_url) as (store, service):
        fresh = service.admit_signal(NS, "wf", "pay", ARGS, request_id="k")
        kept = store._kept  # type: ignore[attr-defined]
        (writer,) = kept.writers.free
        assert _read_connection(store) is writer.connection
        again = service.admit_signal(NS, "wf", "pay", ARGS, request_id="k")
        assert again.decision is Decision.RETAINED and again.command_id == fresh.command_id
        # Given back, idle, and no reader was opened for it.
        assert kept.writers.free == [writer] and kept.writers.count == 1
        assert kept.readers.count == 0


def _uncommitted_row(store: SqlStore, key: str) -> CommandRow:
    instance = store.find_instance(NS, "wf")
    assert instance is not None and instance.current_run_id is not None
    return CommandRow(
        id=str(uuid.uuid4()),
        instance_id=instance.id,
        run_id=instance.current_run_id,
        command_sequence=10_000,
        command_type="signal",
        name="pay",
        target_scope="instance",
        requested_run_id=None,
        request_id=receipt_token("signal", key),
        context=None,
        arguments=None,
        status="received",
        outcome="received",
        rejection_reason=None,
        created_at=datetime.now(UTC),
        intent_digest=None,
        arguments_digest=None,
        intent_encoding=None,
    )


def test_a_read_never_sees_a_receipt_whose_transaction_is_still_open(sqlite_url: str) -> None:
    with _opened(sqlite_url) as (store, service):
        service.admit_signal(NS, "wf", "pay", ARGS, request_id="warm")  # a writer is kept, idle
        now = datetime.now(UTC)
        with store.locked(NS, "wf", created_at=now, new_id=str(uuid.uuid4())) as tx:
            assert tx.insert_command(_uncommitted_row(store, "open"))
            # The writer holding the lock is lent: the read takes another connection, and
            # that one sees the last commit, not the open transaction's row.
            assert store.read_receipts(NS, "wf", "signal", _keys("open")) == []
            assert len(store.read_receipts(NS, "wf", "signal", _keys("warm"))) == 1
        found = store.read_receipts(NS, "wf", "signal", _keys("open"))
        assert [row.request_id for row, _ in found] == [receipt_token("signal", "open")]


def _admit_elsewhere(url: str, key: str) -> str:
    store = SqlStore.open(url)
    try:
        return AdmissionService(store).admit_signal(NS, "wf", "pay", ARGS, request_id=key).command_id
    finally:
        store.dispose()


def test_a_read_on_a_writer_sees_what_another_engine_and_another_process_committed_since(
    sqlite_url: str,
) -> None:
    with _opened(sqlite_url) as (store, service):
        for n in range(20):
            service.admit_signal(NS, "wf", "pay", ARGS, request_id=f"own-{n}")
        assert service.admit_signal(NS, "wf", "pay", ARGS, request_id="own-3").decision is Decision.RETAINED
        # The writer's cache now holds the pages of this instance's receipts; others commit.
        other_engine = _admit_elsewhere(sqlite_url, "other-engine")
        with multiprocessing.get_context("spawn").Pool(1) as pool:
            other_process = pool.apply(_admit_elsewhere, (sqlite_url, "other-process"))
        for key, command_id in (("other-engine", other_engine), ("other-process", other_process)):
            (writer,) = store._kept.writers.free  # type: ignore[attr-defined]
            assert _read_connection(store) is writer.connection
            again = service.admit_signal(NS, "wf", "pay", ARGS, request_id=key)
            assert again.decision is Decision.RETAINED and again.command_id == command_id


def test_threads_admitting_and_retrying_read_every_receipt_committed_before_their_read(
    sqlite_url: str,
) -> None:
    with _opened(sqlite_url) as (store, service):
        committed: dict[str, str] = {}
        errors: list[BaseException] = []
        mutex = threading.Lock()

        def work(worker: int) -> None:
            try:
                for n in range(25):
                    key = f"t{worker}-{n}"
                    fresh = service.admit_signal(NS, "wf", "pay", ARGS, request_id=key)
                    assert fresh.decision is Decision.FRESH
                    with mutex:
                        committed[key] = fresh.command_id
                        known = dict(committed)
                    # Every receipt committed before this read began (by any thread) is found.
                    for other, command_id in list(known.items())[-5:]:
                        found = store.read_receipts(NS, "wf", "signal", _keys(other))
                        assert [row.id for row, _ in found] == [command_id]
            except BaseException as exc:  # reported below, in the test's thread
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(w,)) for w in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert errors == []
        kept = store._kept  # type: ignore[attr-defined]
        assert kept.writers.count <= kept.writers.cap and kept.readers.count <= kept.readers.cap
