"""admission for asyncio: the async service and stores, the same rules awaited.

``AsyncAdmissionService`` has every method of ``AdmissionService`` as a
coroutine; ``AsyncStore`` gives a store's reads as coroutines; ``open_store``
opens the SQL store on an async engine (aiosqlite, psycopg's async
connection), and the worker's intake and relay and the job service have
faces an engine awaits; ``AsyncOnce`` runs ``async def`` handlers once per
command key (``docs/once.md``).  The synchronous code runs unchanged with
its statements awaited on the event loop (``docs/async.md``); install
``admission[asyncio]``.
"""

from admission.aio._bridge import awaiting, run_sync, wait
from admission.aio._once import AsyncAttempt, AsyncOnce
from admission.aio._service import AsyncAdmissionService, AsyncStore
from admission.aio._stores import (
    AsyncDurableWorker,
    AsyncJobService,
    AsyncOutboxRelay,
    caller_engine,
    open_job_store,
    open_store,
    open_worker_store,
)

__all__ = [
    "AsyncAdmissionService",
    "AsyncAttempt",
    "AsyncDurableWorker",
    "AsyncJobService",
    "AsyncOnce",
    "AsyncOutboxRelay",
    "AsyncStore",
    "awaiting",
    "caller_engine",
    "open_job_store",
    "open_store",
    "open_worker_store",
    "run_sync",
    "wait",
]
