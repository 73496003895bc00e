"""The connection budget: the most connections one store holds in one process, kept and pooled together.

An engine admission makes gets a pool of exactly the budget (``pool_size=N``,
``max_overflow=0``); the store's kept readers and writers are checked out of
that pool (``admission/sql/_connections.py``), so the pool's bound is the
store's.  The budget comes from ``connections=N`` or the URL's
``?admission_connections=N``, taken out of the URL before the driver sees it
so that the command line's ``--db`` can set it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from sqlalchemy.engine import URL

from admission.errors import InputError

__all__ = ["CONNECTIONS_PARAMETER", "DEFAULT_CONNECTIONS", "POOL_KEYWORDS", "apply_budget"]

DEFAULT_CONNECTIONS: Final = 8
"""The connection budget of a store's engine when none is given: the most connections one store
holds in one process, kept and pooled together (``docs/operations.md``)."""

CONNECTIONS_PARAMETER: Final = "admission_connections"
"""The URL query parameter that sets the connection budget (``?admission_connections=4``); admission
takes it out of the URL before the driver sees it, so the command line's ``--db`` can set it."""

POOL_KEYWORDS: Final = frozenset({"pool_size", "max_overflow", "poolclass"})
"""Engine options with which a caller bounds the pool itself, instead of a budget."""


def apply_budget(url: URL, connections: object, kwargs: dict[str, Any]) -> URL:
    """``url`` without the budget's parameter; ``kwargs`` given the pool's bound (checked first)."""
    budget = _budget(url, connections, kwargs)
    if budget is not None:
        kwargs["pool_size"], kwargs["max_overflow"] = budget, 0
    return url.difference_update_query([CONNECTIONS_PARAMETER])


_NOT_A_BUDGET: Final = (
    f"the connection budget (connections, ?{CONNECTIONS_PARAMETER}=) must be a positive integer"
)


def _budget(url: URL, keyword: object, kwargs: Mapping[str, Any]) -> int | None:
    """The connection budget from the keyword or the URL (checked), ``None`` when the caller
    bounds the pool itself (``pool_size``, ``max_overflow``, ``poolclass``)."""
    given = url.query.get(CONNECTIONS_PARAMETER)
    if keyword is not None and given is not None:
        raise InputError(
            f"give the connection budget once: connections= or ?{CONNECTIONS_PARAMETER}=", field="connections"
        )
    if given is not None:
        text = given if isinstance(given, str) else ",".join(given)
        if not text.isdecimal() or not text.isascii():
            raise InputError(_NOT_A_BUDGET, field="connections")
        keyword = int(text)
    if keyword is None:
        if POOL_KEYWORDS & kwargs.keys():
            return None
        return DEFAULT_CONNECTIONS
    if not isinstance(keyword, int) or isinstance(keyword, bool) or keyword < 1:
        raise InputError(_NOT_A_BUDGET, field="connections")
    if POOL_KEYWORDS & kwargs.keys():
        raise InputError(
            "give the connection budget once: connections=, or the pool's own pool_size and max_overflow",
            field="connections",
        )
    return keyword
