"""Spellings of one intent value: typed equality, and other spellings with the same encoding.

The canonical encoding (contract §3) makes some Python values one value: a
tuple and the list with the same items, two maps with their entries inserted
in another order, two NaNs.  :func:`same` is the equality it preserves, and
:func:`same_value_variants` writes a value in its other spellings.

Pure: no clock, no I/O.
"""

from __future__ import annotations

import math
import struct

__all__ = ["same", "same_value_variants"]


def same(a: object, b: object) -> bool:
    """Typed equality: the equality the canonical encoding preserves.

    ``True`` is not ``1``, ``1`` is not ``1.0``, ``0.0`` is not ``-0.0``, every
    NaN equals every NaN, a tuple equals the list with the same items, and maps
    compare without regard to order.
    """
    ta: type = list if type(a) is tuple else type(a)
    tb: type = list if type(b) is tuple else type(b)
    if ta is not tb:
        return False
    if isinstance(a, float) and isinstance(b, float):
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return a == b


def _respell(value: object, reverse_maps: bool, flip_sequences: bool, other_nans: bool) -> object:
    if type(value) is float and other_nans and math.isnan(value):
        bits = int.from_bytes(struct.pack(">d", value), "big")
        other: float = struct.unpack(">d", (bits ^ (1 << 63)).to_bytes(8, "big"))[0]
        return other  # the same NaN with the other sign: still f97e00
    if isinstance(value, (list, tuple)):
        items = [_respell(item, reverse_maps, flip_sequences, other_nans) for item in value]
        return (list if (type(value) is tuple) == flip_sequences else tuple)(items)
    if isinstance(value, dict):
        entries = [(k, _respell(item, reverse_maps, flip_sequences, other_nans)) for k, item in value.items()]
        return dict(reversed(entries) if reverse_maps else entries)
    return value


def _spelling(value: object) -> object:
    """What tells two spellings apart: container types, map insertion order, float bits."""
    if type(value) is float:
        return ("float", struct.pack(">d", value))
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(map(_spelling, value)))
    if isinstance(value, dict):
        return ("dict", tuple((key, _spelling(item)) for key, item in value.items()))
    return (type(value).__name__, value)


def same_value_variants(value: object) -> list[object]:
    """Other spellings of ``value`` with the same canonical encoding, ``value`` itself first.

    Maps with their entries in reverse insertion order, tuples for lists and lists for tuples,
    NaNs of the other sign, recursively, alone and together.  A scalar without another
    spelling gives ``[value]``.
    """
    variants = [value]
    seen = {_spelling(value)}
    for flags in ((True, False, False), (False, True, False), (False, False, True), (True, True, True)):
        variant = _respell(value, *flags)
        if (spelling := _spelling(variant)) not in seen:
            seen.add(spelling)
            variants.append(variant)
    return variants
