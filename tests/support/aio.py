"""The async variants of the contract suites: the same tests, every statement awaited on a loop.

A suite marked ``async_stores`` also runs on ``memory-async``,
``sqlite-async`` and ``postgresql-async``.  For those, the whole test (its
fixtures, its body and their teardown) runs inside
:func:`admission.aio.run_sync` on an event loop of its own: the SQL stores
are opened on an asyncio engine (``sqlite+aiosqlite``,
``postgresql+psycopg_async``), so each of their statements is awaited on
the loop, and a statement reached outside the greenlet fails loudly
(``MissingGreenlet``) instead of running synchronously.  In the receipt
suites, ``AdmissionService`` is replaced by :class:`AwaitedService`, whose
every method awaits the real :class:`~admission.aio.AsyncAdmissionService`:
each answer the suite checks has come through the async service.
"""

from __future__ import annotations

import asyncio
import inspect
from typing import Any

import pytest

from admission.aio import AsyncAdmissionService, run_sync, wait
from admission.sql import async_url

ASYNC: str = "-async"
"""The suffix of an async variant's backend name."""


def base_backend(backend: str) -> str:
    """``sqlite`` for ``sqlite-async``; a synchronous backend's name unchanged."""
    return backend.removesuffix(ASYNC)


def backend_url_for(backend: str, url: str | None) -> str | None:
    """The URL a suite opens for ``backend``: an asyncio driver's for an async variant."""
    return None if url is None else (async_url(url) if backend.endswith(ASYNC) else url)


def is_async_item(item: pytest.Item) -> bool:
    """Whether ``item`` is an async variant of a test."""
    callspec = getattr(item, "callspec", None)
    if callspec is None:
        return False
    return any(isinstance(value, str) and value.endswith(ASYNC) for value in callspec.params.values())


class AwaitedService:
    """A synchronous face on :class:`~admission.aio.AsyncAdmissionService` for the suites' bodies.

    Built as ``AdmissionService`` is; each service method awaits the async
    service's coroutine on the loop (the test body runs in a greenlet), and
    every other attribute is the synchronous service's own (``store``).
    """

    def __init__(self, store: Any, **options: Any) -> None:
        self.aio = AsyncAdmissionService(store, **options)

    def __getattr__(self, name: str) -> Any:
        method = getattr(AsyncAdmissionService, name, None)
        if method is None or not inspect.iscoroutinefunction(method):
            return getattr(self.aio.sync, name)
        awaited = getattr(self.aio, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            return wait(awaited(*args, **kwargs))

        return call


def run_in_loop(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """Run ``item``'s whole protocol (setup, call, teardown, reports) in a greenlet on a new loop."""
    from _pytest.runner import runtestprotocol

    item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
    with asyncio.Runner() as runner:
        runner.run(run_sync(runtestprotocol, item, nextitem=nextitem, log=True))
    item.ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)


class AsyncTwins:
    """Async services over the databases of synchronous ones, for apps served in a test.

    The app awaits the async service on its own loop (as ``admission serve``
    does); the test sets up and checks through the synchronous service on the
    same database.  Each store is opened and checked on a loop of its own and
    its connections closed, so the app's loop opens its own; :meth:`close`
    closes what the app's loop opened.
    """

    def __init__(self) -> None:
        self._stores: list[Any] = []

    def twin(self, service: Any) -> AsyncAdmissionService:
        """The async service on ``service``'s database (its store is a ``SqlStore``)."""
        from admission.aio import open_store

        url = service.store.engine.url.render_as_string(hide_password=False)

        async def opened() -> Any:
            store = await open_store(url)
            await store.dispose()
            return store

        store = asyncio.run(opened())
        self._stores.append(store)
        return AsyncAdmissionService(store)

    def close(self) -> None:
        """Close every twin's connections."""
        for store in self._stores:
            asyncio.run(store.dispose())
        self._stores.clear()
