"""The front door for asyncio: :class:`~admission.receipts.Once`'s own code, awaited.

:class:`AsyncOnce` holds a synchronous :class:`~admission.receipts.Once` over the
async service's ``sync`` service and runs it through
:func:`~admission.aio.run_sync`; a decorated ``async def`` handler is awaited
from inside with :func:`~admission.aio.wait`.  So admission, the takeover, the
completion and the failure policy are one implementation for both paths
(``docs/once.md``).
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any, ParamSpec, TypeVar

from admission.aio._bridge import run_sync, wait
from admission.aio._service import AsyncAdmissionService
from admission.intent._encoding import Value
from admission.receipts._once import Attempt, Once, OnFailure, failure_name

__all__ = ["AsyncAttempt", "AsyncOnce"]

P = ParamSpec("P")
R = TypeVar("R")


class AsyncAttempt:
    """An :class:`~admission.receipts.Attempt` for ``async with``: ``done``, ``result`` and
    ``update_id`` as there, :meth:`complete` awaited."""

    def __init__(self, attempt: Attempt) -> None:
        self.sync = attempt

    @property
    def done(self) -> bool:
        """True when the key already has a completed update (``result`` is its value)."""
        return self.sync.done

    @property
    def result(self) -> Value:
        """The recorded result, once ``done``."""
        return self.sync.result

    @property
    def update_id(self) -> str:
        """The update this attempt admitted or found."""
        return self.sync.update_id

    async def complete(self, value: object) -> Value:
        """Record ``value`` as the update's result (see :meth:`Attempt.complete`)."""
        return await run_sync(self.sync.complete, value)


class AsyncOnce:
    """Runs ``async def`` handlers once per command key, over an :class:`AsyncAdmissionService`.

    The options mean what they mean to :class:`~admission.receipts.Once`, which is ``sync``.
    """

    def __init__(
        self,
        service: AsyncAdmissionService,
        *,
        namespace: str,
        workflow_id: str | None = None,
        in_progress_expiry: timedelta | None = None,
        on_failure: OnFailure = "keep",
        describe: Callable[[BaseException], str] = failure_name,
    ) -> None:
        self.sync = Once(
            service.sync,
            namespace=namespace,
            workflow_id=workflow_id,
            in_progress_expiry=in_progress_expiry,
            on_failure=on_failure,
            describe=describe,
        )

    @asynccontextmanager
    async def attempt(self, name: str, key: str, arguments: object) -> AsyncIterator[AsyncAttempt]:
        """``async with once.attempt(name, key, arguments) as attempt``: see :meth:`Once.attempt`."""
        attempt = await run_sync(self.sync.begin, name, key, arguments)
        try:
            yield AsyncAttempt(attempt)
        except Exception as exc:
            await run_sync(self.sync.end, attempt, exc)
            raise
        await run_sync(self.sync.end, attempt, None)

    def __call__(
        self, name: str | None = None, *, key_param: str = "key", key: Callable[..., str] | None = None
    ) -> Callable[[Callable[P, Awaitable[R]]], Callable[P, Coroutine[Any, Any, Value]]]:
        """Decorate an ``async def`` handler so that it runs once per command key (see
        :meth:`Once.__call__`); the decorated coroutine function returns the recorded result."""

        def decorate(handler: Callable[P, Awaitable[R]]) -> Callable[P, Coroutine[Any, Any, Value]]:
            # The synchronous front door reads the handler's signature through
            # __wrapped__ and awaits it, from its greenlet, on the caller's loop.
            @functools.wraps(handler)
            def awaited(*args: P.args, **kwargs: P.kwargs) -> R:
                return wait(handler(*args, **kwargs))

            once = self.sync(name, key_param=key_param, key=key)(awaited)

            @functools.wraps(handler)
            async def call(*args: P.args, **kwargs: P.kwargs) -> Value:
                return await run_sync(once, *args, **kwargs)

            return call

        return decorate
