"""Hypothesis strategies for the retry contract: intent values, command keys, command sequences.

The values cover every type of the canonical encoding (contract §3) and its
edges: ints at the int64 bounds and at every change of CBOR argument length,
floats by their bits (NaNs of any sign and payload, subnormals, ``-0.0``),
text with NUL, 4-byte characters and combining marks, maps whose keys sort
differently by UTF-8 bytes than by length or by UTF-16 units, nesting that
reaches the depth limit and maps wide enough to need two-byte lengths.  The
keys cover contract §2: case and normalisation twins, NUL, 4-byte characters,
exactly 255 code points, and keys that only differ past the 255th byte.

Pools (:func:`key_pools`, :func:`argument_pools`) are small on purpose, so
that keys and arguments repeat within one example and retries really happen,
and always hold a twin pair: two values a careless implementation confuses.

Pure: no clock, no I/O; every choice is a hypothesis draw.
"""

from __future__ import annotations

import copy
import math
import string
import struct
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final, Literal

from hypothesis import strategies as st

from admission.conformance._spellings import same_value_variants
from admission.intent import (
    DEFAULT_MAX_SIZE,
    MAX_DEPTH,
    MAX_REQUEST_ID_LENGTH,
    RESERVED_SIGNAL_PREFIX,
    canonical_encode,
)

__all__ = [
    "ARGUMENTS",
    "FLOATS",
    "FLOAT_BITS",
    "FLOAT_EDGES",
    "INT64",
    "INTS",
    "INT_EDGES",
    "MAP_KEYS",
    "SCALARS",
    "TEXT",
    "VALUES",
    "CommandSpec",
    "argument_pools",
    "arguments",
    "command_keys",
    "command_sequences",
    "intent_values",
    "key_pools",
    "twins",
]

# -- scalars ---------------------------------------------------------------------------------


def _int_edges() -> tuple[int, ...]:
    edges = {0, 1, -1, 2**63 - 1, -(2**63)}
    # RFC 8949 §3: the argument of a head grows at 24, 256, 2^16 and 2^32; both sides of each
    # step, as unsigned (major type 0) and as negative (major type 1, encoded as -1 - n).
    for step in (24, 256, 2**16, 2**32):
        for n in (step - 1, step):
            edges.update((n, -1 - n))
    # Past 2^53 a double no longer holds every int: a port that parses JSON numbers as doubles
    # merges these.
    edges.update((2**53, 2**53 + 1, -(2**53) - 1))
    return tuple(sorted(edges))


INT64: Final = st.integers(min_value=-(2**63), max_value=2**63 - 1)
"""Every int the encoding accepts (contract §3: int64, no bignums)."""
INT_EDGES: Final = _int_edges()
"""The ints at the int64 bounds, 0, ±1 and both sides of every CBOR argument-length step."""
INTS: Final = st.one_of(st.sampled_from(INT_EDGES), INT64)
"""The int edges and the whole int64 range."""


def _from_bits(bits: int) -> float:
    value: float = struct.unpack(">d", bits.to_bytes(8, "big"))[0]
    return value


FLOAT_BITS: Final = st.integers(min_value=0, max_value=2**64 - 1).map(_from_bits)
"""Floats by their bits, so NaNs with any sign and payload, subnormals and ``-0.0`` turn up,
not only the values a float strategy favours."""
FLOAT_EDGES: Final = tuple(
    _from_bits(bits)
    for bits in (
        0x0000000000000000,  # 0.0
        0x8000000000000000,  # -0.0
        0x0000000000000001,  # the smallest subnormal
        0x8000000000000001,
        0x000FFFFFFFFFFFFF,  # the largest subnormal
        0x0010000000000000,  # the smallest normal
        0x7FEFFFFFFFFFFFFF,  # the largest finite
        0xFFEFFFFFFFFFFFFF,
        0x7FF0000000000000,  # +inf
        0xFFF0000000000000,  # -inf
        0x7FF8000000000000,  # the quiet NaN, both signs
        0xFFF8000000000000,
        0x7FF0000000000001,  # a signalling NaN
        0x7FFFFFFFFFFFFFFF,  # the NaN with every payload bit set
        0x3FF0000000000000,  # 1.0 and the next float up
        0x3FF0000000000001,
        0x4340000000000000,  # 2^53
    )
)
"""Floats at the edges of binary64: ±0.0, subnormals, ±max, ±inf, NaNs of both signs and several
payloads (all NaNs encode as ``f97e00``, contract §3)."""
FLOATS: Final = st.one_of(st.sampled_from(FLOAT_EDGES), st.floats(), FLOAT_BITS)
"""The float edges, the usual float strategy and floats by their bits."""

# No lone surrogates: they are refused.  The same set as ``codec="utf-8"``, which costs
# hypothesis seconds per process to work out (every code point encoded); the category
# table is cached.
_CHARACTERS: Final = st.characters(exclude_categories=["Cs"])
TEXT: Final = st.text(alphabet=_CHARACTERS, max_size=30)
"""Text of any valid code points (never a lone surrogate)."""
# Precomposed letters whose NFD form differs (the Angstrom sign is its own NFC twin's NFD).
_COMPOSABLE: Final = ("\u00e9", "\u00c5", "\u212b", "\u00f1", "\u00fc", "\u1e69", "\u1e9b\u0323", "\uac00")
_TEXT_EDGES: Final = (
    *("", "\x00", "a\x00b", "\U0001f600", "\U00010000", "\U0010ffff", "\uffff", "\ufeff", "\u0301"),
    *("e\u0301", "A\u030a", *_COMPOSABLE),
    # The text head grows at 24 and 256 bytes (RFC 8949 §3).
    *("a" * 23, "a" * 24, "a" * 255, "a" * 256, "\u00e9" * 12, "\U0001f600" * 64),
)
_TEXTS: Final = st.one_of(st.sampled_from(_TEXT_EDGES), TEXT)
_BYTES: Final = st.one_of(
    st.sampled_from((b"", b"\x00", b"\xff", b"x" * 23, b"x" * 24, b"x" * 255, b"x" * 256)),
    st.binary(max_size=40),
)
# The lengths where the head grows to 3 bytes; one leaf of this size at most per value.
_LONG: Final = st.tuples(st.sampled_from((2**16 - 1, 2**16)), st.booleans()).map(
    lambda spec: b"\x00" * spec[0] if spec[1] else "\U0001f600" * (spec[0] // 4) + "a" * (spec[0] % 4)
)

# Keys that sort differently by raw UTF-8 bytes (the contract's order) than by length first
# (RFC 7049's canonical order, RFC 8949's order of encoded keys: "b" before "aa"), and than by
# UTF-16 code units ("\U00010000" before "\ue000" there, after it here); prefixes sort first.
_MAP_KEY_EDGES: Final = (
    *("", "a", "aa", "ab", "b", "A", "a\x00", "\x00", "\u00e9", "e\u0301"),
    *("\ud7ff", "\ue000", "\uffff", "\U00010000", "\U0010ffff"),
)
MAP_KEYS: Final = st.one_of(st.sampled_from(_MAP_KEY_EDGES), TEXT)
"""Map keys: the ordering edges and any text."""
SCALARS: Final = st.one_of(st.none(), st.booleans(), INTS, FLOATS, _TEXTS, _BYTES)
"""Every scalar type of the encoding, with its edges."""

# -- nested values ---------------------------------------------------------------------------


def _depth(value: object) -> int:
    """How many containers deep ``value`` nests (a scalar is 0, ``[]`` is 1)."""
    if isinstance(value, (list, tuple)):
        return 1 + max(map(_depth, value), default=0)
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    return 0


def _containers(children: st.SearchStrategy[object]) -> st.SearchStrategy[object]:
    return st.one_of(
        st.lists(children, max_size=6),
        st.lists(children, max_size=4).map(tuple),
        st.dictionaries(MAP_KEYS, children, max_size=6),
    )


@st.composite
def _deep(draw: st.DrawFn, core: st.SearchStrategy[object], max_depth: int) -> object:
    """A value of ``core`` at the end of a path of containers, often exactly ``max_depth`` deep."""
    value = draw(core)
    room = max_depth - _depth(value)
    if room <= 0:
        return value
    levels = draw(st.one_of(st.just(room), st.integers(1, room)))
    sibling = draw(SCALARS)
    key = draw(MAP_KEYS)
    # A short pattern of container kinds, repeated along the path: a few draws, not one per level,
    # so a 64-deep value costs hypothesis little of its budget per example.
    pattern = draw(st.lists(st.integers(0, 4), min_size=1, max_size=4))
    for kind in (pattern[level % len(pattern)] for level in range(levels)):
        if kind == 0:
            value = [value]
        elif kind == 1:
            value = (sibling, value)
        elif kind == 2:
            value = [value, sibling]
        elif kind == 3:
            value = {key: value}
        else:
            value = {key: value, key + "~": sibling}
    return value


@st.composite
def _wide(draw: st.DrawFn, core: st.SearchStrategy[object]) -> object:
    """A map (or list) of 23 to 300 entries: the head's length argument grows at 24 and 256."""
    size = draw(st.one_of(st.sampled_from((23, 24, 255, 256)), st.integers(24, 300)))
    fillers = draw(st.lists(SCALARS, min_size=1, max_size=4))
    items = [fillers[i % len(fillers)] for i in range(size)]
    items[draw(st.integers(0, size - 1))] = draw(core)
    if draw(st.booleans()):
        return items
    # Decimal suffixes make byte order differ from numeric order ("k10" before "k2").
    stem = draw(st.sampled_from(("k", "", "\u00e9", "\U0001f600", "a\x00")))
    return {f"{stem}{i}": item for i, item in enumerate(items)}


def _fits(max_size: int) -> Callable[[object], bool]:
    def fits(value: object) -> bool:
        return len(canonical_encode(value)) <= max_size

    return fits


def intent_values(
    max_leaves: int = 40, *, max_depth: int = MAX_DEPTH, max_size: int = DEFAULT_MAX_SIZE
) -> st.SearchStrategy[object]:
    """Intent values of every type the canonical encoding knows (contract §3), with its edges.

    None, bools, ints across int64 (and its edges), floats (by their bits too), text (NUL,
    4-byte characters, combining marks; never a lone surrogate), bytes, lists, tuples and maps
    with str keys (keys that sort differently by UTF-8 bytes than by length or UTF-16 units,
    prefix keys), nested up to ``max_leaves`` leaves; sometimes a path of containers exactly
    ``max_depth`` deep, a map or list of 23 to 300 entries, or a 64 KiB text or bytes value
    (when ``max_size`` leaves room for it).  Every value encodes in at most ``max_size`` bytes.
    """
    if not 0 <= max_depth <= MAX_DEPTH:
        raise ValueError(f"max_depth must be within 0..{MAX_DEPTH}, got {max_depth}")
    if max_size < 1:
        raise ValueError(f"max_size must be positive, got {max_size}")
    # The values are small enough for the default bound by construction; below it, check.
    fits = _fits(max_size) if max_size < DEFAULT_MAX_SIZE else None
    long: tuple[st.SearchStrategy[object], ...] = (_LONG,) if max_size > 2**16 + 8 else ()
    if max_depth == 0:
        scalars = st.one_of(SCALARS, *long)
        return scalars.filter(fits) if fits else scalars
    core = st.recursive(SCALARS, _containers, max_leaves=max_leaves)
    if max_depth < MAX_DEPTH:
        core = core.filter(lambda value: _depth(value) <= max_depth)
    shallow = core.filter(lambda value: _depth(value) < max_depth)
    edges = (_deep(core, max_depth), _wide(shallow), *long)
    # Mostly ordinary values; each edge about one draw in ten.  Index 0 first, so a failing
    # example shrinks towards an ordinary value.
    values = st.sampled_from(range(7 + len(edges))).flatmap(
        lambda branch: core if branch < 7 else edges[branch - 7]
    )
    return values.filter(fits) if fits else values


def arguments(
    max_leaves: int = 40, *, max_depth: int = MAX_DEPTH, max_size: int = DEFAULT_MAX_SIZE
) -> st.SearchStrategy[list[object] | dict[str, object]]:
    """Arguments: a list or a map of :func:`intent_values` (contract §3).

    At most ``max_depth`` deep (the list or map itself is the first level; the intent record
    around it does not count) and encoded in at most ``max_size`` bytes.
    """
    if not 1 <= max_depth <= MAX_DEPTH:
        raise ValueError(f"max_depth must be within 1..{MAX_DEPTH}, got {max_depth}")
    inner = intent_values(max_leaves, max_depth=max_depth - 1, max_size=max_size)
    both = st.one_of(st.lists(inner, max_size=5), st.dictionaries(MAP_KEYS, inner, max_size=5))
    return both.filter(_fits(max_size)) if max_size < DEFAULT_MAX_SIZE else both


VALUES: Final = intent_values()
""":func:`intent_values` with its defaults."""
ARGUMENTS: Final = arguments()
""":func:`arguments` with its defaults."""
# Pools hold several arguments and a machine draws one pool per example: few leaves each.
_SMALL_ARGUMENTS: Final = st.one_of(
    st.lists(intent_values(4, max_depth=MAX_DEPTH - 1), max_size=3),
    st.dictionaries(MAP_KEYS, intent_values(4, max_depth=MAX_DEPTH - 1), max_size=3),
)

# -- command keys ----------------------------------------------------------------------------

_ASCII: Final = string.ascii_letters + string.digits + "-_.:/"
_SHORT_ASCII: Final = st.text(alphabet=_ASCII, min_size=1, max_size=16)
# What ``str.strip()`` removes at HTTP input (contract §2.1): Unicode whitespace, not only ASCII.
_WHITESPACE: Final = ("", " ", "\t", "\n", "\r\n", "\u00a0", "\u2003", "\u3000", "\x1c")
_FILLS: Final = ("a", "\x00", "\u00e9", "\u20ac", "\U0001f600")  # 1, 1, 2, 3 and 4 UTF-8 bytes
_KEY_EDGES: Final = (
    *("k1", "K1", "\x00", "a\x00", "\x00" * MAX_REQUEST_ID_LENGTH, "\U0010ffff", "\U0001f600"),
    *("e\u0301", "\u00e9", "\u212b", "\u00c5", "A\u030a", " ", "\t \n", " k1", "k1 "),
    # Near misses of the reserved signal prefix (contract §2.4): all ordinary keys.
    *("workflow-signal", "Workflow-Signal:1", "workflow-signal;1", "x" + RESERVED_SIGNAL_PREFIX),
    "\U0001f600" * MAX_REQUEST_ID_LENGTH,
)


def _valid_key(key: str) -> bool:
    # The stripped form is checked too: an HTTP target strips before it validates.
    return (
        0 < len(key) <= MAX_REQUEST_ID_LENGTH
        and not key.startswith(RESERVED_SIGNAL_PREFIX)
        and not key.strip().startswith(RESERVED_SIGNAL_PREFIX)
    )


def _of_length(spec: tuple[str, str, int]) -> str:
    stem, fill, length = spec
    stem = stem[:length]
    return stem + fill * (length - len(stem))


def _normal_forms(text: str) -> tuple[str, str]:
    return unicodedata.normalize("NFC", text), unicodedata.normalize("NFD", text)


# NFC and NFD forms of one text holding a composable letter: they always differ.
_NORMAL_FORM_TWINS: Final = st.tuples(st.text(_CHARACTERS, max_size=6), st.sampled_from(_COMPOSABLE)).map(
    lambda spec: _normal_forms("".join(spec))
)


_EDGE_LENGTH_KEYS: Final = st.tuples(
    st.text(_CHARACTERS, max_size=8), st.sampled_from(_FILLS), st.sampled_from((1, 254, 255))
).map(_of_length)
_NORMAL_FORM_KEYS: Final = st.tuples(
    st.text(_CHARACTERS, max_size=8), st.sampled_from(_COMPOSABLE), st.sampled_from((0, 1))
).map(lambda spec: _normal_forms(spec[0] + spec[1])[spec[2]])


_PADDED_KEYS: Final = st.tuples(st.sampled_from(_WHITESPACE), _SHORT_ASCII, st.sampled_from(_WHITESPACE)).map(
    "".join
)


def command_keys() -> st.SearchStrategy[str]:
    """Valid command keys (contract §2.2): 1 to 255 code points of valid Unicode.

    Short ASCII and its case variants, NFC and NFD forms, 4-byte characters, NUL, keys of
    exactly 1, 254 and 255 code points (255 four-byte characters too), keys with surrounding
    whitespace and whitespace-only keys (valid in the core; an HTTP target strips them, and a
    blank key is no key there), near misses of the reserved prefix.  Never a key that starts
    with ``workflow-signal:``, stripped or not, so every key is valid for signals and updates.
    """
    return st.one_of(
        st.sampled_from(_KEY_EDGES),
        _SHORT_ASCII,
        _SHORT_ASCII.map(str.swapcase),
        _NORMAL_FORM_KEYS,
        _EDGE_LENGTH_KEYS,
        _PADDED_KEYS,
        st.text(st.characters(min_codepoint=0x10000), min_size=1, max_size=8),
        st.text(_CHARACTERS, min_size=1, max_size=40),
    ).filter(_valid_key)


def _prefix_twins(spec: tuple[str, str, str, str, int]) -> tuple[str, str]:
    stem, fill, last_a, last_b, length = spec
    prefix = _of_length((stem, fill, length - 1))
    return prefix + last_a, prefix + last_b


_KEY_TWINS: Final = st.one_of(
    # Case: a and A are two keys.
    st.text(st.sampled_from(string.ascii_letters), min_size=1, max_size=12).map(
        lambda s: (s.lower(), s.upper())
    ),
    # Normalisation: NFC and NFD forms of one text are two keys.
    _NORMAL_FORM_TWINS,
    # Whitespace: two keys in the core, one key where HTTP input strips them.
    st.tuples(st.sampled_from(_WHITESPACE[1:]), _SHORT_ASCII, st.sampled_from(_WHITESPACE)).map(
        lambda spec: ("".join(spec), spec[1])
    ),
    # 255 code points differing only in the last one; with multi-byte fills they share far more
    # than 255 bytes of UTF-8 (a store that cuts keys at 255 bytes merges them).
    st.tuples(
        st.text(_CHARACTERS, max_size=8),
        st.sampled_from(_FILLS),
        st.sampled_from(("a", "\u00e9", "\U0001f600")),
        st.sampled_from(("b", "\u00e8", "\U0001f601")),
        st.sampled_from((MAX_REQUEST_ID_LENGTH, 200, 129)),
    ).map(_prefix_twins),
    # 254 and 255 code points sharing the first 254.
    st.tuples(st.text(_CHARACTERS, max_size=8), st.sampled_from(_FILLS), st.sampled_from(_FILLS)).map(
        lambda spec: (_of_length((spec[0], spec[1], 254)), _of_length((spec[0], spec[1], 254)) + spec[2])
    ),
).filter(lambda pair: pair[0] != pair[1] and _valid_key(pair[0]) and _valid_key(pair[1]))


@st.composite
def key_pools(draw: st.DrawFn, min_size: int = 3, max_size: int = 5) -> list[str]:
    """A small list of distinct valid keys for one example, holding at least one twin pair.

    The twins are keys a careless implementation confuses: case variants, NFC and NFD forms,
    a key with surrounding whitespace and the key stripped, two 255-code-point keys differing
    only in the last code point (or only past 255 bytes of UTF-8), a 254-code-point key and
    its 255-code-point extension.  Keep pools small so that keys repeat within an example.
    """
    if not 2 <= min_size <= max_size:
        raise ValueError(f"need 2 <= min_size <= max_size, got {min_size}, {max_size}")
    pool = list(draw(_KEY_TWINS))
    target = draw(st.integers(min_size, max_size))
    for key in draw(st.lists(command_keys(), min_size=target - 2, max_size=target - 2)):
        if key not in pool:
            pool.append(key)
    filler = 0
    while len(pool) < target:  # a drawn key repeated one already in the pool
        filler += 1
        if (key := f"pool-{filler}") not in pool:
            pool.append(key)
    return list(draw(st.permutations(pool)))


# -- twins: values that look alike and differ canonically ------------------------------------

_NAN: Final = st.sampled_from(tuple(f for f in FLOAT_EDGES if math.isnan(f)))
_EXACT_INTS: Final = st.integers(-(2**53), 2**53)  # ints a double holds exactly


def _next_up(value: float) -> tuple[object, object]:
    return value, math.nextafter(value, math.inf)


_NAMED_TWINS: Final[tuple[tuple[object, object], ...]] = (
    *((1, 1.0), (0.0, -0.0), (True, 1), (False, 0), ("1", 1), (b"a", "a"), ("\u00e9", "e\u0301")),
    *(([], {}), ("", b""), ("", None), (2**53, 2**53 + 1), ({"a": 1}, {"a": 1.0}), (math.nan, None)),
)
# The pairs a careless implementation most often merges.
_GENERIC_TWINS: Final = st.one_of(
    _EXACT_INTS.map(lambda n: (n, float(n))),
    st.tuples(MAP_KEYS, _EXACT_INTS).map(lambda spec: ({spec[0]: spec[1]}, {spec[0]: float(spec[1])})),
    _NORMAL_FORM_TWINS,
    TEXT.map(lambda text: (text.encode("utf-8"), text)),
    SCALARS.map(lambda value: ([value], value)),
    _NAN.map(lambda nan: (nan, None)),
    # One ulp apart: a port that prints floats with too few digits merges them.
    FLOATS.filter(math.isfinite).map(_next_up),
)
# The named pairs half of the time (a flatmap: one_of would flatten into eight equal branches);
# copies, since a caller may keep or change what it was given.
_BASE_TWINS: Final = st.booleans().flatmap(
    lambda named: st.sampled_from(_NAMED_TWINS).map(copy.deepcopy) if named else _GENERIC_TWINS
)


@st.composite
def _in_context(draw: st.DrawFn, pair: tuple[object, object]) -> tuple[object, object]:
    """Put both values of ``pair`` at the same place of the same lists and maps, 0 to 3 deep."""
    a, b = pair
    for _ in range(draw(st.sampled_from((0, 0, 0, 1, 2, 3)))):  # bare half of the time
        if draw(st.booleans()):
            siblings = draw(st.lists(SCALARS, max_size=3))
            at = draw(st.integers(0, len(siblings)))
            a, b = [*siblings[:at], a, *siblings[at:]], [*siblings[:at], b, *siblings[at:]]
        else:
            others = draw(st.dictionaries(MAP_KEYS, SCALARS, max_size=3))
            key = draw(MAP_KEYS)
            others.pop(key, None)
            a, b = {**others, key: a}, {**others, key: b}
    return (b, a) if draw(st.booleans()) else (a, b)


def twins() -> st.SearchStrategy[tuple[object, object]]:
    """Pairs of values that look alike but differ in canonical encoding (contract §3).

    ``1`` / ``1.0``, ``0.0`` / ``-0.0``, ``True`` / ``1``, ``False`` / ``0``, ``"1"`` / ``1``,
    NFC / NFD text, ``b"a"`` / ``"a"``, ``[x]`` / ``x``, a NaN / ``None``, ``{"a": 1}`` /
    ``{"a": 1.0}``, ``[]`` / ``{}``, ints past 2^53 a double merges, floats one ulp apart;
    sometimes at the same place inside the same lists and maps.  Either order.
    """
    return _BASE_TWINS.flatmap(_in_context)


def _as_arguments(draw: st.DrawFn, pair: tuple[object, object]) -> tuple[object, object]:
    a, b = pair
    if draw(st.booleans()):
        return [a], [b]
    key = draw(MAP_KEYS)
    return {key: a}, {key: b}


@st.composite
def argument_pools(draw: st.DrawFn, min_size: int = 4, max_size: int = 8) -> list[object]:
    """A small list of arguments (lists or maps) for one example, holding a twin pair.

    The twins (:func:`twins`) are wrapped as arguments (``[a]`` / ``[b]`` or ``{k: a}`` /
    ``{k: b}``); the rest are :func:`arguments` with few leaves, so an example stays fast.
    Sometimes another spelling of one entry is added (:func:`same_value_variants`): it is the
    same argument value, and a retry with it must be retained.
    """
    if not 3 <= min_size <= max_size:
        raise ValueError(f"need 3 <= min_size <= max_size, got {min_size}, {max_size}")
    pool = list(_as_arguments(draw, draw(twins())))
    rest = draw(st.lists(_SMALL_ARGUMENTS, min_size=min_size - 3, max_size=max_size - 3))
    pool.extend(rest)
    spellings = same_value_variants(draw(st.sampled_from(pool)))
    pool.append(spellings[-1] if draw(st.booleans()) else draw(_SMALL_ARGUMENTS))
    return list(draw(st.permutations(pool)))


# -- command sequences -----------------------------------------------------------------------


@dataclass(frozen=True)
class CommandSpec:
    """One command of a sequence: what a caller sends (contract §1, §4)."""

    command_type: Literal["signal", "update"]
    name: str
    arguments: object
    """A list or a map (contract §3)."""
    request_id: str | None
    """The command key, or ``None`` for an unkeyed command."""
    run_scope: bool
    """Sent to one selected run (the current one, unless the test chooses otherwise) rather
    than to the instance."""


_NAMES: Final = ("approve", "reject")


@st.composite
def command_sequences(
    draw: st.DrawFn, keys: Sequence[str] | None = None, min_size: int = 1, max_size: int = 20
) -> list[CommandSpec]:
    """Lists of :class:`CommandSpec` for property tests of one's own implementation.

    Keys come from ``keys`` or else from one :func:`key_pools` draw, and arguments from one
    :func:`argument_pools` draw, so that keys repeat with the same and with changed intents.
    """
    pool = list(keys) if keys is not None else draw(key_pools())
    request_ids = st.one_of(st.none(), st.sampled_from(pool), st.sampled_from(pool)) if pool else st.none()
    spec = st.builds(
        CommandSpec,
        command_type=st.sampled_from(("signal", "update")),
        name=st.sampled_from(_NAMES),
        arguments=st.sampled_from(draw(argument_pools())),
        request_id=request_ids,
        run_scope=st.booleans(),
    )
    return draw(st.lists(spec, min_size=min_size, max_size=max_size))
