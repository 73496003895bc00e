"""Targets over admission's own services: the sync service on any store, and the async service.

:class:`ServiceTarget` drives :class:`~admission.receipts.AdmissionService` over
any :class:`~admission.receipts.Store`: admission's memory and SQL stores, or a
user's own store implementing the storage port.  :class:`AsyncServiceTarget`
drives :class:`~admission.aio.AsyncAdmissionService`, its coroutines run on an
event loop of its own in a thread.  Both answer in the wire form
(``Admission.to_dict()``), and turn the service's refusals into
:class:`~admission.conformance.Refusal`.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeVar

from admission.conformance._target import (
    CAPABILITIES,
    HISTORY,
    LIFECYCLE,
    PROGRESS,
    Answer,
    CommandType,
    Refusal,
)
from admission.errors import RunStateError, UnknownCommandError, UnknownUpdateError
from admission.receipts import Admission, AdmissionService, MemoryStore, Store

if TYPE_CHECKING:
    from admission.aio import AsyncAdmissionService, AsyncStore

__all__ = ["AsyncServiceTarget", "ServiceTarget"]

T = TypeVar("T")
UNCLOCKED = frozenset({LIFECYCLE, PROGRESS, HISTORY})
"""What a service with a clock of its own supports: everything but the machine's clock and pruning."""


@contextmanager
def refusals() -> Iterator[None]:
    """The service's refusals as the wire names them (contract §5)."""
    try:
        yield
    except RunStateError as exc:
        raise Refusal("run_state", type(exc).__name__) from exc
    except UnknownUpdateError as exc:
        raise Refusal("update_unknown", type(exc).__name__) from exc
    except UnknownCommandError as exc:
        raise Refusal("command_unknown", type(exc).__name__) from exc


def wire(admission: Admission) -> Answer:
    """An admission answer in its wire form: its HTTP status and ``to_dict()``."""
    return Answer(admission.http_status, admission.to_dict())


def _is_factory(store: object) -> bool:
    # A store class (``MemoryStore``) or a function makes stores; a store instance is used as is.
    return isinstance(store, type) or (callable(store) and not hasattr(store, "locked"))


class ServiceTarget:
    """admission's synchronous service over a store, as a conformance target.

    ``store`` is a :class:`~admission.receipts.Store` shared by every example (the examples'
    workflow ids never meet), or a zero-argument factory called at each example's start
    (:meth:`memory`: a fresh :class:`~admission.receipts.MemoryStore` each time).  With
    ``clock`` (the default) the service reads the machine's clock, and the target declares
    every capability; without it the service keeps its own clock and cannot prune on the
    machine's terms.
    """

    strips_keys = False

    def __init__(
        self, store: Store | Callable[[], Store], *, clock: bool = True, name: str = "service"
    ) -> None:
        self.name = name
        self.now = datetime.now(UTC)
        self.capabilities = CAPABILITIES if clock else UNCLOCKED
        self._clock = clock
        self._factory: Callable[[], Store] | None = store if _is_factory(store) else None  # type: ignore[assignment]
        self.service: AdmissionService | None = None if self._factory else self._build(store)  # type: ignore[arg-type]

    @classmethod
    def memory(cls) -> ServiceTarget:
        """A fresh in-memory store for every example."""
        return cls(MemoryStore, name="memory")

    @classmethod
    def of(cls, service: AdmissionService, name: str = "service") -> ServiceTarget:
        """A user's existing service, on its own clock (no :data:`CLOCK`, no :data:`PRUNE`)."""
        target = cls(service.store, clock=False, name=name)
        target.service = service
        return target

    def _build(self, store: Store) -> AdmissionService:
        if self._clock:
            return AdmissionService(store, clock=lambda: self.now)
        return AdmissionService(store)

    def begin(self, example: int) -> None:
        """A fresh store (from the factory), or the shared one."""
        if self._factory is not None:
            self.service = self._build(self._factory())

    @property
    def _service(self) -> AdmissionService:
        if self.service is None:
            raise RuntimeError("ServiceTarget.begin() has not been called")
        return self.service

    def admit(
        self,
        namespace: str,
        workflow_id: str,
        command_type: CommandType,
        name: str,
        arguments: object,
        *,
        request_id: str | None,
        run_id: str | None,
    ) -> Answer:
        """Admit through ``admit_signal`` / ``admit_update``."""
        service = self._service
        admit = service.admit_signal if command_type == "signal" else service.admit_update
        return wire(admit(namespace, workflow_id, name, arguments, request_id=request_id, run_id=run_id))

    def receipt(
        self, namespace: str, workflow_id: str, command_type: CommandType, request_id: str
    ) -> Answer | None:
        """The receipt a key names."""
        found = self._service.receipt(namespace, workflow_id, command_type, request_id)
        return None if found is None else wire(found)

    def start_run(self, namespace: str, workflow_id: str) -> Mapping[str, object]:
        """Start a run."""
        with refusals():
            return self._service.start_run(namespace, workflow_id).to_dict()

    def close_run(self, namespace: str, workflow_id: str, status: str) -> Mapping[str, object]:
        """Close the current run."""
        with refusals():
            return self._service.close_run(namespace, workflow_id, status).to_dict()

    def continue_as_new(self, namespace: str, workflow_id: str) -> Mapping[str, object]:
        """Continue the current run as new."""
        with refusals():
            return self._service.continue_as_new(namespace, workflow_id).to_dict()

    def apply_signal(self, namespace: str, workflow_id: str, command_id: str) -> Answer:
        """Apply a signal."""
        with refusals():
            return wire(self._service.apply_signal(namespace, workflow_id, command_id))

    def complete_update(self, namespace: str, workflow_id: str, update_id: str, result: object) -> Answer:
        """Complete an update."""
        with refusals():
            return wire(self._service.complete_update(namespace, workflow_id, update_id, result))

    def fail_update(self, namespace: str, workflow_id: str, update_id: str, failure: str) -> Answer:
        """Fail an update."""
        with refusals():
            return wire(self._service.fail_update(namespace, workflow_id, update_id, failure))

    def history(self, namespace: str, workflow_id: str) -> Sequence[Mapping[str, object]]:
        """The instance's event log."""
        return [e.to_dict() for e in self._service.history(namespace, workflow_id)]

    def prune(self, retention_days: int, now: datetime, dry_run: bool) -> Mapping[str, int]:
        """Prune at the machine's ``now``.  The cap on a clock far ahead of the newest recorded
        time is off: the machine's clock is right, and its ``now`` runs days past the last write."""
        report = self._service.prune(retention_days, now=now, dry_run=dry_run, max_clock_lead=None)
        counts = report.counts
        return {
            "runs": counts.runs,
            "commands": counts.commands,
            "updates": counts.updates,
            "events": counts.events,
        }


class AsyncServiceTarget:
    """admission's asyncio service as a conformance target (needs ``admission[asyncio]``).

    Its coroutines run on an event loop of its own, in a thread; the machine's calls wait for
    them.  ``store`` is an ``AsyncStore`` or a store without I/O (``MemoryStore``), shared by
    every example, or a zero-argument factory (its result may be awaitable, as
    ``lambda: admission.aio.open_store(url)`` is) called on the loop at each example's start;
    :meth:`opened` opens one store on the loop for every example.  :meth:`close` ends the loop.
    """

    strips_keys = False

    def __init__(
        self,
        store: object,
        *,
        clock: bool = True,
        name: str = "async service",
    ) -> None:
        from admission.aio import AsyncAdmissionService

        self._service_class = AsyncAdmissionService
        self.name = name
        self.now = datetime.now(UTC)
        self.capabilities = CAPABILITIES if clock else UNCLOCKED
        self._clock = clock
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="conformance-loop", daemon=True)
        self._thread.start()
        self._factory: Callable[[], object] | None = store if _is_factory(store) else None  # type: ignore[assignment]
        self._stores: list[Any] = []
        self.service: AsyncAdmissionService | None = None if self._factory else self._build(store)

    @classmethod
    def memory(cls) -> AsyncServiceTarget:
        """A fresh in-memory store for every example."""
        return cls(MemoryStore, name="memory (async)")

    @classmethod
    def opened(
        cls, open_store: Callable[[], Awaitable[AsyncStore]], name: str = "async service"
    ) -> AsyncServiceTarget:
        """One store for every example, opened on the target's loop (``lambda: open_store(url)``)."""
        target = cls(MemoryStore(), name=name)
        target.service = target._build(target._await(open_store()))
        return target

    def _build(self, store: object) -> AsyncAdmissionService:
        self._stores.append(store)
        if self._clock:
            return self._service_class(store, clock=lambda: self.now)  # type: ignore[arg-type]
        return self._service_class(store)  # type: ignore[arg-type]

    def _await(self, awaitable: Awaitable[T]) -> T:
        async def wrapped() -> T:
            return await awaitable

        return asyncio.run_coroutine_threadsafe(wrapped(), self._loop).result()

    def _call(self, method: str, *args: object, **kwargs: object) -> Any:
        if self.service is None:
            raise RuntimeError("AsyncServiceTarget.begin() has not been called")
        coroutine: Coroutine[Any, Any, Any] = getattr(self.service, method)(*args, **kwargs)
        with refusals():
            return self._await(coroutine)

    def begin(self, example: int) -> None:
        """A fresh store (from the factory), or the shared one."""
        if self._factory is not None:
            made = self._factory()
            self.service = self._build(self._await(made) if inspect.isawaitable(made) else made)

    def close(self) -> None:
        """Close the stores the target opened (those with connections) and end its loop."""
        for store in self._stores:
            dispose = getattr(store, "dispose", None)
            if dispose is not None and inspect.iscoroutinefunction(dispose):
                self._await(dispose())
        self._stores.clear()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    def admit(
        self,
        namespace: str,
        workflow_id: str,
        command_type: CommandType,
        name: str,
        arguments: object,
        *,
        request_id: str | None,
        run_id: str | None,
    ) -> Answer:
        """Admit through ``admit_signal`` / ``admit_update``, awaited."""
        method = "admit_signal" if command_type == "signal" else "admit_update"
        return wire(
            self._call(method, namespace, workflow_id, name, arguments, request_id=request_id, run_id=run_id)
        )

    def receipt(
        self, namespace: str, workflow_id: str, command_type: CommandType, request_id: str
    ) -> Answer | None:
        """The receipt a key names."""
        found = self._call("receipt", namespace, workflow_id, command_type, request_id)
        return None if found is None else wire(found)

    def start_run(self, namespace: str, workflow_id: str) -> Mapping[str, object]:
        """Start a run."""
        return self._call("start_run", namespace, workflow_id).to_dict()  # type: ignore[no-any-return]

    def close_run(self, namespace: str, workflow_id: str, status: str) -> Mapping[str, object]:
        """Close the current run."""
        return self._call("close_run", namespace, workflow_id, status).to_dict()  # type: ignore[no-any-return]

    def continue_as_new(self, namespace: str, workflow_id: str) -> Mapping[str, object]:
        """Continue the current run as new."""
        return self._call("continue_as_new", namespace, workflow_id).to_dict()  # type: ignore[no-any-return]

    def apply_signal(self, namespace: str, workflow_id: str, command_id: str) -> Answer:
        """Apply a signal."""
        return wire(self._call("apply_signal", namespace, workflow_id, command_id))

    def complete_update(self, namespace: str, workflow_id: str, update_id: str, result: object) -> Answer:
        """Complete an update."""
        return wire(self._call("complete_update", namespace, workflow_id, update_id, result))

    def fail_update(self, namespace: str, workflow_id: str, update_id: str, failure: str) -> Answer:
        """Fail an update."""
        return wire(self._call("fail_update", namespace, workflow_id, update_id, failure))

    def history(self, namespace: str, workflow_id: str) -> Sequence[Mapping[str, object]]:
        """The instance's event log."""
        return [e.to_dict() for e in self._call("history", namespace, workflow_id)]

    def prune(self, retention_days: int, now: datetime, dry_run: bool) -> Mapping[str, int]:
        """Prune at the machine's ``now`` (the clock cap off, as for :class:`ServiceTarget`)."""
        report = self._call("prune", retention_days, now=now, dry_run=dry_run, max_clock_lead=None)
        counts = report.counts
        return {
            "runs": counts.runs,
            "commands": counts.commands,
            "updates": counts.updates,
            "events": counts.events,
        }
