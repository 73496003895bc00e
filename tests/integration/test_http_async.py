"""The app awaits the async service on its event loop: no thread pool on the admission path."""

from __future__ import annotations

import asyncio
import itertools
import warnings
from collections.abc import Callable

import pytest

with warnings.catch_warnings():
    # The framework's test client warns about its own future; it is not ours to fix.
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

from admission.aio import AsyncAdmissionService
from admission.http import create_app
from admission.receipts import AdmissionService, MemoryStore

pytestmark = pytest.mark.filterwarnings("ignore:Using `httpx` with `starlette.testclient`")


def recording_ids(seen: list[bool]) -> Callable[[], str]:
    """``new_id`` that notes, for every id the service draws, whether it runs on an event loop's thread."""
    counter = itertools.count(1)

    def new_id() -> str:
        try:
            asyncio.get_running_loop()
            seen.append(True)
        except RuntimeError:
            seen.append(False)
        return f"id-{next(counter)}"

    return new_id


def exercise(client: TestClient) -> None:
    for route in ("signal", "update"):
        for _ in range(2):  # fresh, then retained
            response = client.post(f"/api/workflows/wf/{route}/go", json={"request_id": f"k-{route}"})
            assert response.status_code in (200, 202), response.text
    assert (
        client.get("/api/workflows/wf/receipts/update", params={"request_id": "k-update"}).status_code == 202
    )


@pytest.mark.parametrize("kind", ["async", "sync"])
def test_the_async_service_runs_on_the_loop_and_a_sync_one_on_threads(kind: str) -> None:
    seen: list[bool] = []
    sync = AdmissionService(MemoryStore(), new_id=recording_ids(seen))
    sync.start_run("default", "wf")
    seen.clear()
    service = AsyncAdmissionService(sync.store, new_id=recording_ids(seen)) if kind == "async" else sync
    exercise(TestClient(create_app(service), raise_server_exceptions=False))
    assert seen, "the service drew no ids"
    # Every id of every admission was drawn inside the service's own code: on the loop's
    # thread for the async service, on a worker thread for a synchronous one.
    assert set(seen) == {kind == "async"}


def test_a_service_of_another_kind_is_refused() -> None:
    with pytest.raises(TypeError, match="AsyncAdmissionService"):
        create_app(object())  # type: ignore[arg-type]


@pytest.mark.parametrize("kind", ["async", "sync"])
def test_with_the_async_service_no_request_hops_to_a_thread(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A hop costs a thread wake-up each way, more than a retained admission on a busy
    # machine: the app's own dependencies (the namespace, the strict parse) are async.
    import anyio.to_thread

    hops: list[str] = []
    run_sync = anyio.to_thread.run_sync

    async def counted(func: Callable[..., object], *args: object, **kwargs: object) -> object:
        hops.append(getattr(func, "__qualname__", repr(func)))
        return await run_sync(func, *args, **kwargs)

    monkeypatch.setattr(anyio.to_thread, "run_sync", counted)
    sync = AdmissionService(MemoryStore())
    service = AsyncAdmissionService(sync.store) if kind == "async" else sync
    client = TestClient(create_app(service), raise_server_exceptions=False, headers={"X-Namespace": "ns"})
    assert client.post("/api/workflows/wf/runs", json={}).status_code == 201
    exercise(client)
    if kind == "async":
        assert hops == []
    else:  # the same count sees the synchronous service's calls
        assert hops
