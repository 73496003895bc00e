"""What the HTTP adapter awaits: the async service, or a synchronous one on threads.

The app awaits :class:`~admission.aio.AsyncAdmissionService` on the event loop:
no thread pool on the admission path (``admission serve`` runs this way).  An
engine that hands the app a synchronous :class:`~admission.receipts.AdmissionService`
(whose statements block) gets it run in the thread pool, as before, so the
loop never waits on a database.
"""

from __future__ import annotations

import functools
from typing import Any

from starlette.concurrency import run_in_threadpool

from admission.aio import AsyncAdmissionService
from admission.receipts._answers import RunInfo
from admission.receipts._rules import Admission
from admission.receipts._service import AdmissionService

__all__ = ["AwaitedService", "awaited"]


class _InThreads:
    """A synchronous service, each call on the thread pool."""

    def __init__(self, service: AdmissionService) -> None:
        self._service = service

    async def admit_signal(self, *args: Any, **kwargs: Any) -> Admission:
        return await run_in_threadpool(functools.partial(self._service.admit_signal, *args, **kwargs))

    async def admit_update(self, *args: Any, **kwargs: Any) -> Admission:
        return await run_in_threadpool(functools.partial(self._service.admit_update, *args, **kwargs))

    async def receipt(self, *args: Any, **kwargs: Any) -> Admission | None:
        return await run_in_threadpool(functools.partial(self._service.receipt, *args, **kwargs))

    # The engine's side (``_lifecycle``): runs and the progress of commands.

    async def start_run(self, *args: Any, **kwargs: Any) -> RunInfo:
        return await run_in_threadpool(functools.partial(self._service.start_run, *args, **kwargs))

    async def close_run(self, *args: Any, **kwargs: Any) -> RunInfo:
        return await run_in_threadpool(functools.partial(self._service.close_run, *args, **kwargs))

    async def continue_as_new(self, *args: Any, **kwargs: Any) -> RunInfo:
        return await run_in_threadpool(functools.partial(self._service.continue_as_new, *args, **kwargs))

    async def apply_signal(self, *args: Any, **kwargs: Any) -> Admission:
        return await run_in_threadpool(functools.partial(self._service.apply_signal, *args, **kwargs))

    async def complete_update(self, *args: Any, **kwargs: Any) -> Admission:
        return await run_in_threadpool(functools.partial(self._service.complete_update, *args, **kwargs))

    async def fail_update(self, *args: Any, **kwargs: Any) -> Admission:
        return await run_in_threadpool(functools.partial(self._service.fail_update, *args, **kwargs))


AwaitedService = AsyncAdmissionService | _InThreads
"""What the app awaits: the async service itself, or a synchronous one on threads."""


def awaited(service: AdmissionService | AsyncAdmissionService) -> AwaitedService:
    """``service`` as the app awaits it: the async service itself, a synchronous one on threads."""
    if isinstance(service, AsyncAdmissionService):
        return service
    if isinstance(service, AdmissionService):
        return _InThreads(service)
    raise TypeError("service must be an AdmissionService or an AsyncAdmissionService")
