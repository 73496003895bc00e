"""The words one example speaks: its key pool and its argument pool, and their twins.

Each example draws a small pool of keys and one of arguments, so that retries
meet earlier keys often and the values that a careless implementation
confuses stand side by side: ``1`` and ``1.0``, ``0.0`` and ``-0.0``, NFC and
NFD text, a key and its case, normalisation or whitespace twin.
"""

from __future__ import annotations

import math
import unicodedata
from collections.abc import Sequence
from typing import Final

from hypothesis import strategies as st

from admission.intent._encoding import canonical_encode

__all__ = [
    "ARGUMENTS",
    "KEYS",
    "NAMES",
    "argument_pool",
    "argument_twins",
    "key_pool",
    "key_twins",
    "same_encoding",
]

KEYS: Final[tuple[str, ...]] = ("k1", "K1", "k2", "\u00e9", "e\u0301", " k2")
"""The fixed key pool: keys are case-sensitive and never normalised by the core (NFC ``é`` and
NFD ``é`` are two keys; so are ``" k2"`` and ``"k2"`` unless the target strips keys)."""
ARGUMENTS: Final[tuple[object, ...]] = (
    [],
    [1],
    [1.0],
    [True],
    [0.0],
    [-0.0],
    ["1"],
    {"a": 1, "b": 2},
    {"b": 2, "a": 1},
    {"aa": None, "b": [b"\x00"]},
)
"""The fixed argument pool: encodings differ pairwise, except the two maps written in another
order, which are one value."""
NAMES: Final = ("approve", "reject")
"""Command names."""


def key_pool() -> st.SearchStrategy[tuple[str, ...]]:
    """An example's key pool."""
    return st.just(KEYS)


def argument_pool() -> st.SearchStrategy[tuple[object, ...]]:
    """An example's argument pool."""
    return st.just(ARGUMENTS)


def _loose(value: object) -> object:
    """What a careless implementation might take for the value's identity: numbers as floats
    (``True`` = ``1`` = ``1.0``, ``0.0`` = ``-0.0``), text in NFC, lists for tuples, maps unordered."""
    if isinstance(value, (bool, int, float)):
        number = float(value)
        return "nan" if math.isnan(number) else (0.0 if number == 0 else number)
    if isinstance(value, str):
        return unicodedata.normalize("NFC", value)
    if isinstance(value, bytes):
        return ("bytes", value)
    if isinstance(value, (list, tuple)):
        return tuple(_loose(v) for v in value)
    if isinstance(value, dict):
        return ("map", tuple(sorted((repr(_loose(k)), repr(_loose(v))) for k, v in value.items())))
    return repr(value)


def _encoding(value: object) -> bytes | None:
    try:
        return canonical_encode(value)
    except Exception:  # a pool value the encoding refuses has no twin: it is its own
        return None


def same_encoding(value: object, pool: Sequence[object]) -> list[object]:
    """The spellings in ``pool`` with ``value``'s canonical encoding (a map in another order)."""
    encoded = _encoding(value)
    return [v for v in pool if _encoding(v) == encoded] or [value]


def argument_twins(value: object, pool: Sequence[object]) -> list[object]:
    """The values of ``pool`` a careless implementation would take for ``value`` but whose
    canonical encoding differs (``[1]`` for ``[1.0]``, ``[-0.0]`` for ``[0.0]``)."""
    encoded, loose = _encoding(value), _loose(value)
    return [v for v in pool if _encoding(v) != encoded and _loose(v) == loose]


def key_twins(key: str, pool: Sequence[str]) -> list[str]:
    """The keys of ``pool`` that differ from ``key`` only by case, Unicode normalisation or
    surrounding whitespace."""

    def fold(k: str) -> str:
        return unicodedata.normalize("NFC", k.strip()).casefold()

    return [k for k in pool if k != key and fold(k) == fold(key)]
