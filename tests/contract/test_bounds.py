"""Stored text fields: one declared bound, the same answer on memory, SQLite and PostgreSQL.

PostgreSQL text cannot hold NUL and its ``VARCHAR(n)`` holds n characters;
SQLite holds anything.  A value one backend would store and another refuse
must be refused by all of them, before the transaction, with a typed input
error that names the field (never a retryable storage error).  Each test
here runs on every backend through the ``backend`` fixture.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from admission.errors import InputError
from admission.receipts import AdmissionService, MemoryStore
from admission.sql import SqlStore, SqlWorkerStore
from admission.worker import DurableWorker, MemoryWorkerStore, Scope, WorkerStore

NS = "ns"
WF = "wf-1"


@pytest.fixture
def service(backend_url: str | None) -> Iterator[AdmissionService]:
    if backend_url is None:
        yield AdmissionService(MemoryStore())
        return
    store = SqlStore.open(backend_url)
    try:
        yield AdmissionService(store)
    finally:
        store.dispose()


@pytest.fixture
def worker_store(backend_url: str | None) -> Iterator[WorkerStore]:
    if backend_url is None:
        yield MemoryWorkerStore()
        return
    store = SqlWorkerStore.open(backend_url)
    try:
        yield store
    finally:
        store.dispose()


def refused(field: str, call: object, *args: object, **kwargs: object) -> InputError:
    assert callable(call)
    with pytest.raises(InputError) as caught:
        call(*args, **kwargs)
    assert caught.value.field == field, caught.value
    return caught.value


# -- the reported cases -----------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["a\x00b", "n" * 256], ids=["nul", "256-characters"])
def test_a_command_name_no_backend_can_store_is_refused_naming_it_and_nothing_is_written(
    service: AdmissionService, name: str
) -> None:
    service.start_run(NS, WF, run_id="r1")
    before = service.history(NS, WF)
    for admit in (service.admit_signal, service.admit_update):
        refused("name", admit, NS, WF, name, {}, request_id="k1")
        refused("name", admit, NS, WF, name, {})
    assert service.history(NS, WF) == before
    assert service.receipt(NS, WF, "signal", "k1") is None


@pytest.mark.parametrize("length", [37, 255])
def test_a_run_id_longer_than_a_run_id_column_is_refused_naming_it_and_nothing_is_written(
    service: AdmissionService, length: int
) -> None:
    run_id = "r" * length
    refused("run_id", service.start_run, NS, WF, run_id=run_id)
    assert service.history(NS, WF) == []
    service.start_run(NS, WF, run_id="r1")
    before = service.history(NS, WF)
    refused("run_id", service.admit_signal, NS, WF, "go", {}, request_id="k1", run_id=run_id)
    refused("run_id", service.admit_update, NS, WF, "go", {}, request_id="k2", run_id=run_id)
    refused("new_run_id", service.continue_as_new, NS, WF, new_run_id=run_id)
    refused("run_id", service.close_run, NS, WF, "completed", run_id=run_id)
    assert service.history(NS, WF) == before


@pytest.mark.parametrize("field", ["source_key", "tenant"])
def test_nul_in_a_worker_source_key_or_tenant_is_refused_naming_it_and_nothing_is_written(
    worker_store: WorkerStore, field: str
) -> None:
    scope = {"tenant": "t1", "form": "f1"}
    record = {**scope, "source_key": "k1", "payload": {"n": 1}}
    if field == "tenant":
        refused("scope.tenant", Scope.parse, {**scope, "tenant": "t\x00"})
        return
    worker = DurableWorker(worker_store, Scope.parse(scope), file_lock=False)
    refused("source_key", worker.accept, {**record, "source_key": "k\x00"})
    assert worker_store.records("default") == []
