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
import importlib
import sys
import threading
from collections.abc import Callable, Coroutine
from typing import Any, Concatenate, ParamSpec, TypeVar

from admission.sql._greenlet import greenlets, wait

__all__ = ["awaiting", "run_sync", "wait"]

P = ParamSpec("P")
R = TypeVar("R")


class _Done:
    """What a worker greenlet hands back when its call has ended (an awaitable means: await this)."""

    __slots__ = ("error", "value")

    def __init__(self, value: object, error: BaseException | None) -> None:
        self.value, self.error = value, error


class _Workers(threading.local):
    """Each thread's idle worker greenlets, kept for the next call.

    A new greenlet for every call (what ``greenlet_spawn`` does) costs more
    than the synchronous retained admission it runs measured here (some 50 µs
    against 120): Python allocates each new greenlet's frame stack afresh.  A
    worker runs one call after another; one is made only when every kept one
    is suspended in a call of its own.
    """

    def __init__(self) -> None:
        self.idle: list[Any] = []


_workers = _Workers()


def _work(call: Callable[[], object]) -> None:
    """A worker greenlet's body: run each call it is given, hand back how it ended, wait for the next."""
    module = _greenlet_module()
    while True:
        try:
            done = _Done(call(), None)
        except module.GreenletExit:
            raise  # the worker itself is being collected
        except BaseException as exc:
            done = _Done(None, exc)
        call = module.getcurrent().parent.switch(done)


@functools.cache
def _worker_class() -> Any:
    module = _greenlet_module()

    class Worker(module.greenlet):  # type: ignore[misc,name-defined]
        # SQLAlchemy's await_() (wait()) runs in a greenlet that carries this mark: it hands
        # the awaitable to the greenlet's parent, the loop's, which run_sync awaits.
        __sqlalchemy_greenlet_provider__ = True

    return Worker


@functools.cache
def _greenlet_module() -> Any:
    greenlets()  # names what to install when greenlet is missing
    return importlib.import_module("greenlet")


async def run_sync(fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R:
    """Run synchronous admission code on the event loop; its statements on an async engine are awaited.

    The code runs in a greenlet: where it reaches :func:`wait` (every statement on an engine
    made by ``create_async_engine`` does), the awaitable is awaited here, on the loop, and
    the code resumes with its result; an exception raised there (a cancellation too) is
    raised where it waited.  The caller's context variables are the code's.
    """
    module = _greenlet_module()
    current = module.getcurrent()
    worker = _workers.idle.pop() if _workers.idle else _worker_class()(_work, current)
    worker.parent = current
    worker.gr_context = current.gr_context
    result = worker.switch(functools.partial(fn, *args, **kwargs))
    while not isinstance(result, _Done):
        try:
            value = await result
        except BaseException:
            result = worker.throw(*sys.exc_info())
        else:
            result = worker.switch(value)
    _workers.idle.append(worker)
    if result.error is not None:
        raise result.error
    done: R = result.value  # type: ignore[assignment]
    return done


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
