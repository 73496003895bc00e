"""Seeded runs that do not depend on what the process imported before them.

Hypothesis (6.131 and later) mixes into what it draws, now and then, the
constants it finds in the *local* modules loaded in the process: a
project's own code, outside site-packages and tests.  Which modules are
loaded depends on what ran before in that process, so the same seed made
different cases in a test suite than alone, and a replay record did not
always replay.  :func:`without_local_constants` makes hypothesis draw
without them while the kit runs: the same seed, options and examples make
the same cases in any process.  Hypothesis's own constants (the nasty
floats, integers and strings it always tries) stay.

The switch is hypothesis's module-level function of those constants and its
cache of them, which are not public: where they are not found (an older
hypothesis without local constants, or a newer one that moved them) the run
goes on as hypothesis made it.  It is process-wide while it lasts, so a
hypothesis test in another thread of the process draws without them too.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["without_local_constants"]


@contextmanager
def without_local_constants() -> Iterator[None]:
    """While the block runs, hypothesis draws no constant taken from local modules."""
    try:
        from hypothesis.internal.conjecture import providers
    except ImportError:  # pragma: no cover - a hypothesis laid out otherwise
        yield
        return
    local: Any = getattr(providers, "_get_local_constants", None)
    cache: Any = getattr(getattr(providers, "CONSTANTS_CACHE", None), "cache", None)
    constants: Any = getattr(providers, "Constants", None)
    if local is None or cache is None or constants is None:
        yield
        return
    none = constants()
    providers._get_local_constants = lambda: none
    # The cache holds each kind's constants as last computed, local ones included.
    cache.clear()
    try:
        yield
    finally:
        providers._get_local_constants = local
        cache.clear()
