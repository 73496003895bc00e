"""The SQL stores for asyncio, and the worker's and jobs' faces an engine awaits.

Opening a store makes an :class:`~sqlalchemy.ext.asyncio.AsyncEngine`
(:func:`~admission.sql.create_async_admission_engine`) and runs the
synchronous store (:class:`~admission.sql.SqlStore`,
:class:`~admission.sql.SqlWorkerStore`, :class:`~admission.sql.SqlJobStore`)
on its ``sync_engine``: the lock, the statements and the event log are the
synchronous store's own, and every statement is awaited on the loop when that
code runs through :func:`~admission.aio.run_sync`.  The faces below are built
with :func:`~admission.aio.awaiting`, so nothing of the worker or the job
service is copied (``docs/async.md``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

from sqlalchemy import Engine
from sqlalchemy.ext.asyncio import AsyncEngine

from admission.aio._bridge import awaiting, run_sync
from admission.aio._service import AsyncStore
from admission.errors import InputError
from admission.jobs import JobService, JobStore
from admission.sql import (
    SqlJobStore,
    SqlStore,
    SqlWorkerStore,
    create_async_admission_engine,
    create_awaited_engine,
    schema_of,
)
from admission.sql._engine import WRITE_OPTION
from admission.sql._replica import replica_engine
from admission.worker import DurableWorker, OutboxRelay, Scope, WorkerStore

__all__ = [
    "AsyncDurableWorker",
    "AsyncJobService",
    "AsyncOutboxRelay",
    "caller_engine",
    "open_job_store",
    "open_store",
    "open_worker_store",
]

S = TypeVar("S")


async def _opened(url: str, opener: Callable[[Engine], S], engine_options: dict[str, Any]) -> S:
    engine = create_awaited_engine(url, **engine_options)
    try:
        # Opening reads the schema revision: a statement, so awaited too.
        return await run_sync(opener, engine)
    except BaseException:
        await run_sync(engine.dispose)
        raise


async def open_store(url: str, *, read_url: str | None = None, **engine_options: Any) -> AsyncStore:
    """The receipt store at ``url`` for asyncio: a :class:`~admission.sql.SqlStore` on an async engine.

    ``url`` is a ``sqlite://`` or ``postgresql://`` URL (or one naming an
    asyncio driver); the engine uses aiosqlite or psycopg's
    ``AsyncConnection`` (:func:`~admission.sql.async_url`).  Opening checks
    the schema revision and refuses anything but the head, as
    :meth:`SqlStore.open <admission.sql.SqlStore.open>` does; bad URLs raise
    :class:`~admission.errors.InputError` naming ``url``.  Give the result to
    :class:`~admission.aio.AsyncAdmissionService`; ``await store.dispose()``
    closes its connections.

    ``read_url`` names a read replica that answers the retries whose receipt
    is final, with an engine made as the primary's (``docs/replicas.md``).
    """
    if read_url is None:
        return AsyncStore(await _opened(url, SqlStore, engine_options))
    read_engine = replica_engine(read_url, engine_options, awaited=True)
    try:
        return AsyncStore(
            await _opened(url, functools.partial(SqlStore, read_engine=read_engine), engine_options)
        )
    except BaseException:
        await run_sync(read_engine.dispose)
        raise


def caller_engine(store: AsyncStore) -> AsyncEngine:
    """A new :class:`~sqlalchemy.ext.asyncio.AsyncEngine` on ``store``'s database, for the caller's
    own ``AsyncSession`` or ``AsyncConnection`` that admission joins (``docs/guide.md`` §6).

    Its transactions begin as admission's writes do (``BEGIN IMMEDIATE`` on SQLite), so the
    admission lock is held from the caller's first statement; the driver is the database's
    asyncio driver (aiosqlite, psycopg's ``AsyncConnection``), whatever the store runs on.
    The caller disposes of it (``await engine.dispose()``).  A store that is not a SQL store
    raises :class:`~admission.errors.InputError` (``field`` ``store``).
    """
    sync = store.sync
    if not isinstance(sync, SqlStore):
        raise InputError("only a SQL store has a database to share", field="store")
    url = sync.engine.url.render_as_string(hide_password=False)
    engine = create_async_admission_engine(url, schema=schema_of(sync.engine))
    return engine.execution_options(**{WRITE_OPTION: True})


async def open_worker_store(url: str, **engine_options: Any) -> WorkerStore:
    """The durable worker's store at ``url`` on an async engine (for :class:`AsyncDurableWorker`).

    The synchronous :class:`~admission.sql.SqlWorkerStore`, checked at the
    head revision; its statements run only inside :func:`~admission.aio.run_sync`
    (as :class:`AsyncDurableWorker` and :class:`AsyncOutboxRelay` call them).
    ``await run_sync(store.dispose)`` closes it.
    """
    return await _opened(url, SqlWorkerStore, engine_options)


async def open_job_store(url: str, **engine_options: Any) -> JobStore:
    """The job store at ``url`` on an async engine (for :class:`AsyncJobService`).

    The synchronous :class:`~admission.sql.SqlJobStore`, checked at the head
    revision; its statements run only inside :func:`~admission.aio.run_sync`.
    ``await AsyncJobService(store).dispose()`` closes it.
    """
    return await _opened(url, SqlJobStore, engine_options)


class AsyncJobService:
    """Durable jobs for asyncio callers: the methods of :class:`~admission.jobs.JobService`
    that an engine awaits, each the service's own code with its statements awaited.

    ``store`` is a job store (:func:`open_job_store`, or a
    :class:`~admission.jobs.MemoryJobStore`); the keyword options mean what
    they mean to the synchronous service, which is ``sync`` (its step
    handlers and runner stay synchronous).
    """

    def __init__(self, store: JobStore, **options: Any) -> None:
        self.sync = JobService(store, **options)

    enqueue = awaiting(JobService.enqueue)
    enqueue_all = awaiting(JobService.enqueue_all)
    claim = awaiting(JobService.claim)
    claim_next = awaiting(JobService.claim_next)
    heartbeat = awaiting(JobService.heartbeat)
    checkpoint = awaiting(JobService.checkpoint)
    record_result = awaiting(JobService.record_result)
    complete = awaiting(JobService.complete)
    fail = awaiting(JobService.fail)
    pause = awaiting(JobService.pause)
    resume = awaiting(JobService.resume)
    stop = awaiting(JobService.stop)
    cancel = awaiting(JobService.cancel)
    resolve = awaiting(JobService.resolve)
    status = awaiting(JobService.status)
    events = awaiting(JobService.events)
    checkpoints = awaiting(JobService.checkpoints)
    counts = awaiting(JobService.counts)
    # export_snapshot is left out: its fsyncs would hold the event loop.
    snapshot = awaiting(JobService.snapshot)
    dispose = awaiting(JobService.dispose)


class AsyncDurableWorker:
    """The durable worker's intake for asyncio callers: accept, read back, status.

    ``sync`` is the :class:`~admission.worker.DurableWorker`; make one with
    :meth:`open`, which opens (or checks) the queue's pinned scope.  The
    write cycle (``run_once``) sends to a synchronous target and stays with
    the synchronous worker.
    """

    def __init__(self, sync: DurableWorker) -> None:
        self.sync = sync

    @classmethod
    async def open(cls, store: WorkerStore, scope: Scope, **options: Any) -> AsyncDurableWorker:
        """A worker on ``store``'s queue for ``scope``
        (``options`` as for :class:`~admission.worker.DurableWorker`)."""
        return cls(await run_sync(DurableWorker, store, scope, **options))

    accept = awaiting(DurableWorker.accept)
    get = awaiting(DurableWorker.get)
    find = awaiting(DurableWorker.find)
    events = awaiting(DurableWorker.events)
    status = awaiting(DurableWorker.status)


class AsyncOutboxRelay:
    """The outbox relay for asyncio callers: :meth:`pump` moves entries from the event log into
    a worker's intake, in the worker store's transaction, awaited.

    ``store`` is the receipt store holding the event log (an
    :class:`~admission.aio.AsyncStore` or a synchronous store), ``worker``
    an :class:`AsyncDurableWorker`; the keyword options mean what they mean
    to :class:`~admission.worker.OutboxRelay`, which is ``sync``.
    """

    def __init__(self, store: AsyncStore | Any, worker: AsyncDurableWorker, **options: Any) -> None:
        events = store.sync if isinstance(store, AsyncStore) else store
        self.sync = OutboxRelay(events, worker.sync, **options)

    cursor = awaiting(OutboxRelay.cursor)
    pump = awaiting(OutboxRelay.pump)
