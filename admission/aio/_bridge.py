"""Admission's synchronous rules on an event loop: the rules run as they are, only I/O is awaited.

The async service does not copy the service, the run lifecycle or the
stores into ``async def`` twins.  It runs the same synchronous code in a
greenlet (SQLAlchemy's asyncio extension does the same for its own ``Session``):
when that code reaches a statement on an engine made by
:func:`sqlalchemy.ext.asyncio.create_async_engine`, the driver's coroutine is
awaited on the event loop and the greenlet resumes with its result.  Between
two statements nothing blocks the loop, and no thread pool is involved
(aiosqlite keeps one thread per SQLite connection, as the driver does for
every caller).  The only difference between the two paths is the awaiting.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Coroutine
from typing import Any, Concatenate, ParamSpec, TypeVar

from admission.sql._greenlet import greenlets, wait

__all__ = ["awaiting", "run_sync", "wait"]

P = ParamSpec("P")
R = TypeVar("R")


async def run_sync(fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R:
    """Run synchronous admission code on the event loop; its statements on an async engine are awaited."""
    concurrency = greenlets()
    result: R = await concurrency.greenlet_spawn(functools.partial(fn, *args, **kwargs))
    return result


def awaiting(
    method: Callable[Concatenate[Any, P], R],
) -> Callable[Concatenate[Any, P], Coroutine[Any, Any, R]]:
    """The awaitable twin of a synchronous method, for a class whose ``sync`` attribute holds the original.

    ``AsyncAdmissionService.admit_update = awaiting(AdmissionService.admit_update)`` keeps the
    signature and the docstring; calling it runs ``self.sync``'s method of that name (so a port's
    protocol names the method and the implementation runs) through :func:`run_sync`.
    """
    name = method.__name__

    @functools.wraps(method)
    async def call(self: Any, /, *args: P.args, **kwargs: P.kwargs) -> R:
        bound: Callable[P, R] = getattr(self.sync, name)
        return await run_sync(bound, *args, **kwargs)

    return call
