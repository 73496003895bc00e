"""Hypothesis strategies and a typed equality shared by the property tests.

They are the conformance kit's own (``admission.conformance``), under the names the tests use.
``VALUES`` and ``ARGUMENTS`` leave room for one level of nesting around them (a test that puts a
value in a map, or arguments in the intent record, stays within the depth limit of 64).
"""

from __future__ import annotations

from admission.conformance import same
from admission.conformance._strategies import (
    FLOAT_BITS,
    FLOATS,
    INT64,
    SCALARS,
    TEXT,
    arguments,
    intent_values,
)
from admission.conformance._strategies import MAP_KEYS as KEYS
from admission.intent import MAX_DEPTH

VALUES = intent_values(max_depth=MAX_DEPTH - 1)
ARGUMENTS = arguments(max_depth=MAX_DEPTH - 1)

__all__ = ["ARGUMENTS", "FLOATS", "FLOAT_BITS", "INT64", "KEYS", "SCALARS", "TEXT", "VALUES", "same"]
