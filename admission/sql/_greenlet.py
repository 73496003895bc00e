"""Awaiting from synchronous code that runs in a greenlet (SQLAlchemy's asyncio extension).

The one implementation of ``wait``: :mod:`admission.aio` re-exports it, and
the SQL stores use it where they drive an asyncio driver's own connection
(psycopg's pipeline on the async path, ``admission/sql/_receipts.py``).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Awaitable
from typing import Any, TypeVar

from admission.errors import InputError

__all__ = ["greenlets", "wait"]

R = TypeVar("R")


def greenlets() -> Any:
    """SQLAlchemy's greenlet concurrency module, or :class:`InputError` naming what to install."""
    # SQLAlchemy imports without greenlet and fails only on first use, with a message about
    # itself: the check names what to install instead.
    if importlib.util.find_spec("greenlet") is None:
        raise InputError(
            "the async service needs greenlet (pip install 'admission[asyncio]')", field="asyncio"
        )
    from sqlalchemy.util import concurrency

    return concurrency


def wait(awaitable: Awaitable[R]) -> R:
    """From synchronous code run by :func:`admission.aio.run_sync`, await ``awaitable`` on the loop;
    its result."""
    result: R = greenlets().await_only(awaitable)
    return result
