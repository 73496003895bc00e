"""Waits for an update's completion: few at once, backed off, and ended with their caller.

A request sent with ``wait_for: "completed"`` re-reads its receipt until the
update completes or fails, or its timeout passes.  Three bounds keep the
waits cheap (docs/http.md, "Waiting for completion"):

- the delay between two reads doubles from the first interval up to a cap
  (:func:`poll_delays`), so a wait of ``T`` seconds reads about ``T / cap``
  times, not ``T / first``;
- a wait ends as soon as the server learns that its client has gone
  (ASGI ``http.disconnect``): nobody is left to answer;
- an app holds at most ``max_waits`` waits at once (:class:`WaitSlots`); a
  request that would wait past that is refused before it is admitted.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Iterator, MutableMapping
from typing import Any, Final, TypeVar

import anyio
from starlette.responses import JSONResponse

from admission.http._limits import DEFAULT_MAX_WAITS, check_max_waits
from admission.http._serving import AwaitedService
from admission.receipts._rules import Admission

__all__ = [
    "MAX_POLL_INTERVAL_SECONDS",
    "WaitSlots",
    "poll_delays",
    "too_many_waits",
    "wait_for_completion",
    "wait_until",
]

MAX_POLL_INTERVAL_SECONDS: Final = 0.5
"""The longest delay between two reads of a waited-for receipt (unless the first is longer)."""

_T = TypeVar("_T")
_Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]


def poll_delays(first: float, cap: float = MAX_POLL_INTERVAL_SECONDS) -> Iterator[float]:
    """The delays before each read of a waited-for receipt: ``first``, doubling, then ``cap`` for ever.

    A ``cap`` below ``first`` is read as ``first``: the delay never shrinks.
    """
    ceiling = max(first, cap)
    delay = first
    while True:
        yield delay
        delay = min(delay * 2, ceiling)


class WaitSlots:
    """The waits one app holds at once, and their bound; the app keeps it as ``app.state.waits``.

    ``active`` is the number of requests holding a slot now: a request takes
    one before its update is admitted and gives it back when its answer is
    ready (or its client has gone).  The event loop is single-threaded, so a
    plain counter is exact.
    """

    def __init__(self, limit: int = DEFAULT_MAX_WAITS) -> None:
        self.limit = check_max_waits(limit)
        self.active = 0

    def try_acquire(self) -> bool:
        """Take a slot; false, and nothing taken, when all ``limit`` are held."""
        if self.active >= self.limit:
            return False
        self.active += 1
        return True

    def release(self) -> None:
        """Give a slot back."""
        if self.active < 1:
            raise RuntimeError("released a wait slot that was not held")
        self.active -= 1


async def wait_until(
    poll: Callable[[], Awaitable[_T | None]],
    receive: _Receive | None,
    *,
    timeout: float,
    delays: Iterator[float],
    clock: Callable[[], float],
) -> _T | None:
    """Call ``poll`` after each of ``delays`` until it answers, ``timeout`` passes, or the client leaves.

    ``receive`` is the request's ASGI receive, once the body has been read:
    its next message is ``http.disconnect`` when the client goes.  ``None``
    when the client has gone or the timeout passed first.
    """
    deadline = clock() + timeout
    found: _T | None = None
    async with anyio.create_task_group() as group:
        if receive is not None:

            async def watch(receive: _Receive) -> None:
                while (await receive())["type"] != "http.disconnect":
                    pass
                group.cancel_scope.cancel()  # ends the polls below, mid-sleep or after a read

            group.start_soon(watch, receive)
        for delay in delays:
            left = deadline - clock()
            if left <= 0:
                break
            await anyio.sleep(min(delay, left))
            found = await poll()
            if found is not None:
                break
        group.cancel_scope.cancel()
    return found


async def wait_for_completion(
    service: AwaitedService,
    answer: Admission,
    key: str,
    *,
    timeout: float,
    receive: _Receive | None,
    delays: Iterator[float],
    clock: Callable[[], float],
) -> Admission:
    """``answer``, an accepted update, as it stands when it completes or fails; else unchanged.

    Unchanged when ``timeout`` passes first or the client leaves.  Each read
    is awaited (``_serving``) and holds no transaction between reads.
    """

    async def poll() -> Admission | None:
        now = await service.receipt(answer.namespace, answer.workflow_id, "update", key)
        if now is not None and now.command_id == answer.command_id and now.outcome != "accepted":
            # The admission's own answer (fresh stays fresh), with the state it reached.
            return dataclasses.replace(
                answer,
                outcome=now.outcome,
                update_status=now.update_status,
                result=now.result,
                failure=now.failure,
            )
        return None

    done = await wait_until(poll, receive, timeout=timeout, delays=delays, clock=clock)
    return answer if done is None else done


def too_many_waits(limit: int) -> JSONResponse:
    """The 503 for a request that would wait past ``limit``: retryable, and nothing was written."""
    body = {
        "reason": "too_many_waits",
        "message": f"the server already waits for {limit} updates; nothing was recorded, retry later",
        "max_waits": limit,
        "retryable": True,
    }
    return JSONResponse(body, status_code=503, headers={"Retry-After": "1"})
