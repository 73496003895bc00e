"""admission for asyncio: the async service and stores, the same rules awaited.

``AsyncAdmissionService`` has every method of ``AdmissionService`` as a
coroutine; ``AsyncStore`` gives a store's reads as coroutines; ``AsyncOnce``
runs ``async def`` handlers once per command key (``docs/once.md``).  The
synchronous code runs unchanged with its statements awaited on the event
loop (``docs/async.md``); install ``admission[asyncio]``.
"""

from admission.aio._bridge import awaiting, run_sync, wait
from admission.aio._once import AsyncAttempt, AsyncOnce
from admission.aio._service import AsyncAdmissionService, AsyncStore

__all__ = [
    "AsyncAdmissionService",
    "AsyncAttempt",
    "AsyncOnce",
    "AsyncStore",
    "awaiting",
    "run_sync",
    "wait",
]
