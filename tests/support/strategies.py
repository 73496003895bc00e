"""Hypothesis strategies and a typed equality shared by the property tests."""

from __future__ import annotations

import math
import struct

from hypothesis import strategies as st

INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
# Floats by their bits, so NaNs with any sign and payload, subnormals and -0.0
# all turn up, not only the values a float strategy favours.
FLOAT_BITS = st.integers(min_value=0, max_value=2**64 - 1).map(
    lambda bits: struct.unpack(">d", bits.to_bytes(8, "big"))[0]
)
FLOATS = st.one_of(st.floats(allow_nan=True, allow_infinity=True), FLOAT_BITS)
TEXT = st.text(alphabet=st.characters(exclude_categories=("Cs",)), max_size=30)
KEYS = st.one_of(
    TEXT,
    st.sampled_from(["", "a", "aa", "b", "é", "\uffff", "\U00010000", "\x00", "A"]),
)
SCALARS = st.one_of(st.none(), st.booleans(), INT64, FLOATS, TEXT, st.binary(max_size=40))
VALUES = st.recursive(
    SCALARS,
    lambda children: st.one_of(
        st.lists(children, max_size=6),
        st.lists(children, max_size=4).map(tuple),
        st.dictionaries(KEYS, children, max_size=6),
    ),
    max_leaves=40,
)
ARGUMENTS = st.one_of(st.lists(VALUES, max_size=5), st.dictionaries(KEYS, VALUES, max_size=5))


def same(a: object, b: object) -> bool:
    """Typed equality: the equality the canonical encoding preserves.

    ``True`` is not ``1``, ``1`` is not ``1.0``, ``0.0`` is not ``-0.0``, every
    NaN equals every NaN, a tuple equals the list with the same items, and maps
    compare without regard to order.
    """
    ta, tb = type(a), type(b)
    if ta is tuple:
        ta = list
    if tb is tuple:
        tb = list
    if ta is not tb:
        return False
    if ta is float:
        assert isinstance(a, float) and isinstance(b, float)
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)
    if ta is list:
        assert isinstance(a, (list, tuple)) and isinstance(b, (list, tuple))
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if ta is dict:
        assert isinstance(a, dict) and isinstance(b, dict)
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return a == b
