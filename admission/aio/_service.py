"""The admission service for asyncio: the same service, its statements awaited.

:class:`AsyncAdmissionService` holds an :class:`~admission.receipts.AdmissionService`
(``sync``) and runs each of its methods through :func:`~admission.aio._bridge.run_sync`:
the validation, the lock, the decisions and the event log are the synchronous
service's own code, so both paths give the same answers by construction
(``docs/async.md``).  On a store over an async engine every statement is
awaited on the event loop; on :class:`~admission.receipts.MemoryStore` nothing
waits at all.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from admission.aio._bridge import awaiting, run_sync
from admission.intent._encoding import DEFAULT_MAX_SIZE
from admission.receipts._service import AdmissionService, utc_now
from admission.receipts._store import Store

__all__ = ["AsyncAdmissionService", "AsyncStore"]


class AsyncStore:
    """A receipt store an engine awaits: the reads of the storage port, each an ``async`` method.

    ``sync`` is the :class:`~admission.receipts.Store` underneath: a
    :class:`~admission.receipts.MemoryStore`, or a :class:`~admission.sql.SqlStore`
    over an async engine (:func:`admission.aio.open_store`), whose statements
    are then awaited.  The admission lock is taken only inside the service.
    """

    def __init__(self, sync: Store) -> None:
        self.sync = sync

    find_instance = awaiting(Store.find_instance)
    read_receipts = awaiting(Store.read_receipts)
    read_history = awaiting(Store.read_history)
    read_events = awaiting(Store.read_events)
    prune_targets = awaiting(Store.prune_targets)
    newest_time = awaiting(Store.newest_time)

    async def dispose(self) -> None:
        """Close the store's connections (nothing to close for a store without any)."""
        dispose: Callable[[], None] | None = getattr(self.sync, "dispose", None)
        if dispose is not None:
            await run_sync(dispose)


class AsyncAdmissionService:
    """Admits signals and updates for asyncio callers: every method of
    :class:`~admission.receipts.AdmissionService`, awaited.

    ``store`` is an :class:`AsyncStore` (or a synchronous store without I/O,
    such as :class:`~admission.receipts.MemoryStore`, which is wrapped);
    ``clock``, ``new_id`` and ``max_size`` mean what they mean to the
    synchronous service, which is ``sync``.
    """

    def __init__(
        self,
        store: AsyncStore | Store,
        *,
        clock: Callable[[], datetime] = utc_now,
        new_id: Callable[[], str] | None = None,
        max_size: int = DEFAULT_MAX_SIZE,
    ) -> None:
        self.store = store if isinstance(store, AsyncStore) else AsyncStore(store)
        options: dict[str, Any] = {"clock": clock, "max_size": max_size}
        if new_id is not None:
            options["new_id"] = new_id
        self.sync = AdmissionService(self.store.sync, **options)

    start_run = awaiting(AdmissionService.start_run)
    close_run = awaiting(AdmissionService.close_run)
    continue_as_new = awaiting(AdmissionService.continue_as_new)
    apply_signal = awaiting(AdmissionService.apply_signal)
    admit_signal = awaiting(AdmissionService.admit_signal)
    admit_update = awaiting(AdmissionService.admit_update)
    admit_many = awaiting(AdmissionService.admit_many)
    complete_update = awaiting(AdmissionService.complete_update)
    fail_update = awaiting(AdmissionService.fail_update)
    release_update = awaiting(AdmissionService.release_update)
    take_over_update = awaiting(AdmissionService.take_over_update)
    prune = awaiting(AdmissionService.prune)
    receipt = awaiting(AdmissionService.receipt)
    history = awaiting(AdmissionService.history)
