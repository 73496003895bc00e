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

from admission.conformance._strategies import argument_pools, key_pools, same_value_variants
from admission.errors import AdmissionError
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

NAMES: Final = ("approve", "reject")
"""Command names."""
PREFIX: Final = 128
"""Keys sharing this many first code points are twins (prefix twins of the pools reach 255)."""


KEYS: Final[tuple[str, ...]] = ("k1", "K1", "k2", "\u00e9", "e\u0301", " k2")
"""A small fixed key pool with case, normalisation and whitespace twins."""
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
"""A small fixed argument pool: encodings differ pairwise, except the two maps written in
another order, which are one value."""


# The fixed pool comes first: hypothesis shrinks towards it, so a failure that any pool shows
# shrinks in seconds to one spoken in short words; the drawn pools (hundreds of choices each)
# are shrunk only when the failure needs them.


def key_pool() -> st.SearchStrategy[tuple[str, ...]]:
    """An example's key pool: 3 to 5 valid keys holding a twin pair (case, NFC/NFD, surrounding
    whitespace, 255-code-point prefix twins; :func:`~admission.conformance.key_pools`), or
    :data:`KEYS`."""
    return st.one_of(st.just(KEYS), key_pools().map(tuple))


def argument_pool() -> st.SearchStrategy[tuple[object, ...]]:
    """An example's argument pool: a few arguments holding a twin pair (``1`` / ``1.0``,
    ``0.0`` / ``-0.0``, NFC / NFD text ...; :func:`~admission.conformance.argument_pools`), or
    :data:`ARGUMENTS`."""
    return st.one_of(st.just(ARGUMENTS), argument_pools().map(tuple))


def _number(value: float) -> object:
    return "nan" if math.isnan(value) else float(f"{value:.9g}") + 0.0


def _loose(value: object) -> object:
    """What a careless implementation might take for the value's identity: numbers (and
    numeric text) as rounded floats (``True`` = ``1`` = ``1.0``, ``0.0`` = ``-0.0``), NaN as
    nothing, text in NFC, bytes as text, a one-item list as its item, maps unordered."""
    if value is None:
        return "nan"
    if isinstance(value, (bool, int, float)):
        return _number(float(value))
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if isinstance(value, str):
        try:
            return _number(float(value))
        except (ValueError, OverflowError):
            return unicodedata.normalize("NFC", value)
    if isinstance(value, (list, tuple)):
        return _loose(value[0]) if len(value) == 1 else ("list", tuple(_loose(v) for v in value))
    if isinstance(value, dict):
        if not value:
            return ("list", ())
        # Sorted by their repr, never nested reprs: those escape the text inside at every level.
        return ("map", tuple(sorted(((_loose(k), _loose(v)) for k, v in value.items()), key=repr)))
    return repr(value)


def _encoding(value: object) -> bytes | None:
    try:
        return canonical_encode(value)
    except AdmissionError:  # a value the encoding refuses has no twin: it is its own
        return None


def same_encoding(value: object, pool: Sequence[object]) -> list[object]:
    """Spellings of ``value`` with its canonical encoding: those in ``pool``, and others
    (maps in another order, tuples for lists; :func:`~admission.conformance.same_value_variants`)."""
    encoded = _encoding(value)
    return [*(v for v in pool if _encoding(v) == encoded), *same_value_variants(value)]


def argument_twins(value: object, pool: Sequence[object]) -> list[object]:
    """The values of ``pool`` a careless implementation would take for ``value`` but whose
    canonical encoding differs (``[1]`` for ``[1.0]``, ``[-0.0]`` for ``[0.0]``)."""
    encoded, loose = _encoding(value), _loose(value)
    return [v for v in pool if _encoding(v) != encoded and _loose(v) == loose]


def key_twins(key: str, pool: Sequence[str]) -> list[str]:
    """The keys of ``pool`` that differ from ``key`` only by case, Unicode normalisation or
    surrounding whitespace, or that share a long prefix with it (a store that cuts keys
    short merges them)."""

    def fold(k: str) -> str:
        return unicodedata.normalize("NFC", k.strip()).casefold()

    def long_prefix(k: str) -> bool:
        return min(len(k), len(key)) >= PREFIX and k[:PREFIX] == key[:PREFIX]

    return [k for k in pool if k != key and (fold(k) == fold(key) or long_prefix(k))]
