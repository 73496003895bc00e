"""A store of one's own written before ``LockedInstance.insert_admitted`` joined the port still
admits: the service writes a fresh admission's rows through the older methods, one by one."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from admission.receipts import AdmissionService, Decision, MemoryStore


class _OlderLocked:
    """A locked instance with every method of the port but ``insert_admitted``."""

    def __init__(self, tx: Any, calls: list[str]) -> None:
        self._tx, self._calls = tx, calls

    def __getattr__(self, name: str) -> Any:
        if name == "insert_admitted":
            raise AttributeError(name)
        if name in ("insert_command", "insert_update", "append_event"):
            self._calls.append(name)
        return getattr(self._tx, name)


class _OlderStore:
    def __init__(self) -> None:
        self._store = MemoryStore()
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    @contextmanager
    def locked(self, *args: Any, **kwargs: Any) -> Iterator[_OlderLocked]:
        with self._store.locked(*args, **kwargs) as tx:
            yield _OlderLocked(tx, self.calls)


def test_a_store_without_insert_admitted_admits_signals_and_updates_as_before() -> None:
    store = _OlderStore()
    service = AdmissionService(store)  # type: ignore[arg-type]
    service.start_run("ns", "wf")
    fresh = service.admit_signal("ns", "wf", "go", {"n": 1}, request_id="k1")
    update = service.admit_update("ns", "wf", "set", {"n": 2}, request_id="k2")
    assert (fresh.decision, update.decision) == (Decision.FRESH, Decision.FRESH)
    assert store.calls.count("insert_command") == 2 and store.calls.count("insert_update") == 1
    again = service.admit_signal("ns", "wf", "go", {"n": 1}, request_id="k1")
    assert again.decision is Decision.RETAINED and again.command_id == fresh.command_id
    history = [e.event_type for e in service.history("ns", "wf")]
    assert history[-2:] == ["SignalReceived", "UpdateAccepted"]
