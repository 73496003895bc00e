"""The optional C encoder ``admission.intent._speedups`` against the pure-Python reference.

The Python walk in ``admission.intent._encoding`` defines the bytes.  The extension
must return exactly those bytes for every value Python accepts and ``None``
for every value Python refuses; the public functions then re-run Python for
the error.  These tests compare the two on generated values, allowed and not.
"""

from __future__ import annotations

import enum
import gc
import importlib.util
import math
import os
import struct
import subprocess
import sys
import time
import tracemalloc
from collections import OrderedDict, namedtuple
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from admission import (
    InvalidValueError,
    arguments_digest,
    canonical_encode,
    intent_digest,
    intent_record,
)
from admission.intent import _encoding as encoding
from tests.support.strategies import FLOAT_BITS, INT64, KEYS, VALUES

try:
    from admission.intent import _speedups
except ImportError:
    _speedups = None  # type: ignore[assignment]

requires_extension = pytest.mark.skipif(
    _speedups is None,
    reason="admission.intent._speedups not importable (not built, or ADMISSION_PURE_PYTHON set)",
)

MAX = encoding.DEFAULT_MAX_SIZE
REFUSED = "refused"


def c_outcome(value: object, max_size: int = MAX) -> bytes | str:
    result = _speedups.encode(value, max_size)
    return REFUSED if result is None else result


def python_outcome(value: object, max_size: int = MAX) -> bytes | str:
    try:
        return encoding._python_encode(value, max_size)
    except InvalidValueError:
        return REFUSED


def public_outcome(fn: Callable[[], object]) -> object:
    """What a public function gives: its result, or its error's full content."""
    try:
        return fn()
    except InvalidValueError as exc:
        return ("error", type(exc), str(exc), exc.field, exc.path, exc.reason, exc.offset)


def assert_same(value: object, max_size: int = MAX) -> None:
    expected = python_outcome(value, max_size)
    assert c_outcome(value, max_size) == expected
    # The public function gives the same bytes, or the same error as pure Python.
    accelerated = public_outcome(lambda: canonical_encode(value, max_size=max_size))
    pure = public_outcome(lambda: encoding._python_encode(value, max_size))
    assert accelerated == pure


# -- strategies ---------------------------------------------------------------------------

# Values at and just past every head-size boundary and the int64 range.
BOUNDARIES = [0, 23, 24, 255, 256, 65535, 65536, 2**32 - 1, 2**32, 2**63 - 1]
BOUNDARY_INTS = st.sampled_from(
    [s * b + d for b in BOUNDARIES for d in (-1, 0, 1) for s in (1, -1)]
    + [-(2**63), -(2**63) - 1, 2**63, 2**64, -(2**64), 10**30, -(10**30)]
)
STRING_LENGTHS = st.sampled_from([0, 1, 22, 23, 24, 25, 254, 255, 256, 257, 65534, 65535, 65536, 65537])
CHARS = st.sampled_from(["x", "\x7f", "\x80", "\xe9", "\u07ff", "\u0800", "\u20ac", "\uffff", "\U0001f600"])
BIG_TEXT = st.one_of(
    st.tuples(STRING_LENGTHS, CHARS).map(lambda t: t[1] * t[0]),
    # Mixed widths, so the UTF-8 length crosses a boundary the character count does not.
    st.tuples(STRING_LENGTHS, CHARS).map(lambda t: "a" * max(t[0] - 2, 0) + t[1]),
)
BIG_BYTES = STRING_LENGTHS.map(lambda n: b"\xab" * n)
NANS = st.integers(min_value=1, max_value=2**52 - 1).flatmap(
    lambda payload: st.sampled_from([0x7FF0000000000000, 0xFFF0000000000000]).map(
        lambda base: struct.unpack(">d", (base | payload).to_bytes(8, "big"))[0]
    )
)
SPECIAL_FLOATS = st.sampled_from(
    [
        0.0,
        -0.0,
        5e-324,
        -5e-324,
        2.2250738585072014e-308,
        1.7976931348623157e308,
        math.inf,
        -math.inf,
        math.nan,
    ]
)
ODD_KEYS = st.sampled_from(
    [
        "",
        "a",
        "aa",
        "b",
        "\x00",
        "\x7f",
        "\x80",
        "\xe9",
        "\u07ff",
        "\u0800",
        "\ud7ff",
        "\ue000",
        "\uffff",
        "\U00010000",
        "\U0010ffff",
        "a\x00",
        "A",
        "Z",
        "\u00ff\u0100",
    ]
)
ALLOWED_KEYS = st.one_of(KEYS, ODD_KEYS, BIG_TEXT.filter(lambda s: len(s) < 300))


class Color(enum.IntEnum):
    RED = 1


class Text(str):
    pass


class Number(int):
    pass


class Real(float):
    pass


class Mapping(dict):  # type: ignore[type-arg]
    pass


class Items(list):  # type: ignore[type-arg]
    pass


Pair = namedtuple("Pair", "a b")  # a tuple subclass, on purpose

LONE_SURROGATES = st.sampled_from(
    ["\ud800", "\udfff", "a\udc00", "\U0001f600\ud83d", "\xe9\udfff", "\u20ac\ud800x"]
)
BAD_SCALARS = st.one_of(
    st.sampled_from(
        [
            2**63,
            -(2**63) - 1,
            2**100,
            Color.RED,
            Number(1),
            Real(1.5),
            Text("a"),
            bytearray(b"x"),
            memoryview(b"x"),
            Decimal("1.5"),
            1j,
            object(),
            {1, 2},
            frozenset(),
            OrderedDict(a=1),
            Mapping(a=1),
            Items([1]),
            Pair(1, 2),
            range(3),
            ...,
            NotImplemented,
            type,
        ]
    ),
    LONE_SURROGATES,
)
BAD_KEYS = st.one_of(
    st.sampled_from([1, 0, -1, 1.5, None, True, b"a", (1,), Text("a"), Color.RED]), LONE_SURROGATES
)
GOOD_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    INT64,
    BOUNDARY_INTS.filter(lambda n: -(2**63) <= n < 2**63),
    FLOAT_BITS,
    SPECIAL_FLOATS,
    NANS,
    st.text(max_size=10).filter(lambda s: s.isprintable()),
    st.binary(max_size=30),
)


def containers(children: st.SearchStrategy[Any], keys: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(
        st.lists(children, max_size=5),
        st.lists(children, max_size=4).map(tuple),
        st.dictionaries(keys, children, max_size=5),
        # Larger maps: sorted differently from the small ones.
        st.dictionaries(keys, GOOD_SCALARS, min_size=15, max_size=60),
    )


# Only values the encoder accepts (bar the size limit).
GOOD = st.recursive(
    st.one_of(GOOD_SCALARS, BIG_TEXT, BIG_BYTES),
    lambda children: containers(children, ALLOWED_KEYS),
    max_leaves=30,
)


def with_bad_key(args: tuple[dict[Any, Any], Any, Any]) -> dict[Any, Any]:
    base, key, value = args
    mixed = dict(base)
    mixed[key] = value
    return mixed


# Mostly good values with refused things mixed in at any depth.
MIXED = st.recursive(
    st.one_of(GOOD_SCALARS, GOOD_SCALARS, BAD_SCALARS, BIG_TEXT),
    lambda children: st.one_of(
        containers(children, ALLOWED_KEYS),
        st.tuples(st.dictionaries(ALLOWED_KEYS, children, max_size=4), BAD_KEYS, children).map(with_bad_key),
    ),
    max_leaves=30,
)


def wrap(value: object, levels: int, shape: int) -> object:
    """``value`` inside ``levels`` containers: lists, tuples, maps or a mix."""
    for level in range(levels):
        kind = (shape >> (level % 8)) & 3 if shape else 0
        if kind == 0:
            value = [value]
        elif kind == 1:
            value = (value,)
        elif kind == 2:
            value = {"k": value}
        else:
            value = [1, {"\xe9": value, "a": None}]
    return value


# Nesting around the depth limit: 64 containers are accepted, 65 refused.
DEEP = st.builds(
    wrap,
    st.one_of(GOOD_SCALARS, st.just([]), st.just({}), st.just(()), MIXED),
    st.integers(min_value=58, max_value=67),
    st.integers(min_value=0, max_value=255),
)

SLOW = [HealthCheck.too_slow, HealthCheck.data_too_large]
SIZES = st.one_of(st.just(MAX), st.integers(min_value=1, max_value=400))


# -- the extension is built where it should be -----------------------------------------


def test_ci_builds_the_extension() -> None:
    """CI compiles the extension: a silent fall back to pure Python there is a failure."""
    if not os.environ.get("CI"):
        pytest.skip("outside CI the extension is optional")
    if os.environ.get("ADMISSION_PURE_PYTHON", "") not in ("", "0"):
        pytest.skip("ADMISSION_PURE_PYTHON asks for the pure-Python encoder")
    if _speedups is None:
        pytest.fail("admission.intent._speedups is not importable in CI: the C extension did not build")
    assert encoding.ACCELERATED


# -- differential: the C encoder against the reference ------------------------------------


@requires_extension
@settings(max_examples=400, deadline=None, suppress_health_check=SLOW)
@given(value=GOOD, max_size=SIZES)
def test_accepted_values_encode_identically(value: object, max_size: int) -> None:
    assert_same(value, max_size)


@requires_extension
@settings(max_examples=400, deadline=None, suppress_health_check=SLOW)
@given(value=MIXED, max_size=SIZES)
@example(value={1: "x"}, max_size=MAX)
@example(value={"a": 1, 2: "x"}, max_size=MAX)
@example(value={"\ud800": 1}, max_size=MAX)
@example(value=["\U0001f600\udfff"], max_size=MAX)
@example(value=[2**63], max_size=MAX)
@example(value=[-(2**63) - 1], max_size=MAX)
@example(value=[Color.RED], max_size=MAX)
@example(value=OrderedDict(a=1), max_size=MAX)
def test_mixed_values_encode_identically_or_are_both_refused(value: object, max_size: int) -> None:
    assert_same(value, max_size)


@requires_extension
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=DEEP)
def test_nesting_near_the_depth_limit(value: object) -> None:
    assert_same(value)


@requires_extension
@given(value=VALUES)
def test_shared_strategy_values(value: object) -> None:
    assert_same(value)


@requires_extension
@pytest.mark.parametrize(
    "value",
    [
        None,
        True,
        False,
        0,
        -1,
        23,
        24,
        -24,
        -25,
        2**63 - 1,
        -(2**63),
        2**63,
        -(2**63) - 1,
        0.0,
        -0.0,
        5e-324,
        math.nan,
        -math.nan,
        math.inf,
        -math.inf,
        "",
        "x" * 23,
        "x" * 24,
        "\xe9" * 128,
        "\U0001f600" * 64,
        "\ud800",
        b"",
        b"\x00" * 65536,
        [],
        (),
        {},
        [[[]]],
        {"b": 1, "aa": 2, "a": 3, "": 4},
        {"\U00010000": 0, "\uffff": 0, "\ue000": 0, "\ud7ff": 0, "\x7f": 0, "\x80": 0},
        {"b": 1, 1: 2},
        {(1,): 1},
        {Text("a"): 1},
        [bytearray()],
        [{1, 2}],
        [Color.RED],
        True.__class__,
        Number(5),
        Real(0.5),
        Mapping(),
        Items(),
        Pair(1, 2),
    ],
)
def test_edge_values(value: object) -> None:
    assert_same(value)


@requires_extension
def test_depth_limit_exactly() -> None:
    for wrapper in (lambda v: [v], lambda v: (v,), lambda v: {"k": v}):
        value: object = 0
        for _ in range(64):
            value = wrapper(value)
        assert c_outcome(value) == python_outcome(value) != REFUSED
        value = []
        for _ in range(63):
            value = wrapper(value)
        assert c_outcome(value) == python_outcome(value) != REFUSED  # 64 containers
        assert c_outcome(wrapper(value)) == python_outcome(wrapper(value)) == REFUSED  # 65


@requires_extension
def test_every_size_limit_around_the_exact_size() -> None:
    value = {
        "items": [{"sku": f"SKU-{i:05d}", "tags": ["a", "bb"], "price": i / 3} for i in range(40)],
        "blob": b"\x01" * 300,
        "name": "Zo\xeb" * 90,
    }
    size = len(encoding._python_encode(value))
    for max_size in [*range(1, 40), *range(size - 400, size + 3)]:
        assert c_outcome(value, max_size) == python_outcome(value, max_size), max_size
    assert c_outcome(value, size) != REFUSED
    assert c_outcome(value, size - 1) == REFUSED
    # A limit past the address space is simply no limit.
    assert _speedups.encode(value, 2**200) == encoding._python_encode(value)


@requires_extension
@pytest.mark.parametrize("length", [0, 1, 23, 24, 25, 255, 256, 257, 65535, 65536, 65537])
def test_size_limit_at_every_head_boundary(length: int) -> None:
    values: list[object] = ["x" * length, "\xe9" * (length // 2) + "x" * (length % 2), b"y" * length]
    values += [list(range(length)), {f"{i:06d}": None for i in range(length)}]
    values += [length, -length - 1] if length < 65536 else [2**32 - 1, 2**32, -(2**32), -(2**32) - 1]
    for value in values:
        for wrapped in (value, [value], {"k": value}, [1, value, 2]):
            size = len(encoding._python_encode(wrapped))
            for max_size in (size - 2, size - 1, size, size + 1):
                if max_size >= 1:
                    assert c_outcome(wrapped, max_size) == python_outcome(wrapped, max_size)


@requires_extension
def test_large_maps_are_sorted() -> None:
    import random

    keys = [chr(c) * n for c in (0x61, 0x7F, 0x80, 0xE9, 0x800, 0xFFFF, 0x10000) for n in range(1, 6)]
    for seed in range(20):
        random.Random(seed).shuffle(keys)
        value = {k: i for i, k in enumerate(keys)}
        assert_same(value)
        assert_same({f"{random.Random(seed).random()}": [] for _ in range(300)})


@requires_extension
def test_limit_argument_is_checked() -> None:
    with pytest.raises(ValueError):
        _speedups.encode([], -1)
    with pytest.raises(TypeError):
        _speedups.encode([], 1.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        _speedups.encode([])  # type: ignore[call-arg]
    assert _speedups.encode(None, 0) is None
    assert _speedups.encode(None, 1) == b"\xf6"


@requires_extension
@settings(max_examples=100, deadline=None)
@given(
    command_type=st.sampled_from(["signal", "update"]),
    name=st.sampled_from(["approve", "\xe9t\xe9", "x" * 30]),
    arguments=st.one_of(st.lists(MIXED, max_size=4), st.dictionaries(ALLOWED_KEYS, MIXED, max_size=4), MIXED),
    target=st.sampled_from([None, "run-1", "r\xe9"]),
    max_size=SIZES,
)
def test_public_functions_match_the_pure_path(
    command_type: str,
    name: str,
    arguments: object,
    target: str | None,
    max_size: int,
) -> None:
    calls: list[Callable[[], object]] = [
        lambda: canonical_encode(arguments, max_size=max_size),
        lambda: intent_record(command_type, name, arguments, target, max_size=max_size),
        lambda: intent_digest(command_type, name, arguments, target, max_size=max_size),
        lambda: arguments_digest(arguments, max_size=max_size),
    ]
    accelerated = [public_outcome(call) for call in calls]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(encoding, "_accelerated_encode", None)
        pure = [public_outcome(call) for call in calls]
    assert accelerated == pure


# -- bounded work and memory --------------------------------------------------------------


def shared_bomb(levels: int = 60) -> list[object]:
    value: list[object] = []
    for _ in range(levels):
        value = [value, value]
    return value


@requires_extension
def test_shared_references_are_refused_quickly() -> None:
    value = shared_bomb()
    start = time.perf_counter()
    assert _speedups.encode(value, MAX) is None
    assert _speedups.encode(value, 1000) is None
    assert time.perf_counter() - start < 1.0
    with pytest.raises(InvalidValueError, match="exceeds the limit"):
        canonical_encode(value)
    # Below the limit the same sharing encodes, and identically.
    assert_same(shared_bomb(10))


@requires_extension
def test_output_never_outgrows_the_limit() -> None:
    big, bomb = ["x" * 2_000_000], shared_bomb()
    tracemalloc.start()
    try:
        assert _speedups.encode(big, 1000) is None
        assert _speedups.encode(bomb, 50_000) is None
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 200_000


def own_objects(value: object) -> list[object]:
    """The objects that make up ``value``, less the shared singletons whose counts others change."""
    own = []
    for o in all_objects(value):
        if o is None or type(o) is bool:
            continue
        if isinstance(o, int) and -5 <= o <= 256:
            continue  # cached small ints
        if isinstance(o, (str, bytes)) and len(o) <= 1:
            continue  # cached one-character strings
        own.append(o)
    return own


def all_objects(value: object) -> list[object]:
    seen: dict[int, object] = {}
    stack = [value]
    while stack:
        item = stack.pop()
        if id(item) in seen:
            continue
        seen[id(item)] = item
        if type(item) in (list, tuple):
            stack.extend(item)  # type: ignore[arg-type]
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
    return list(seen.values())


LEAK_CASES = [
    {"b": [1, 2.5, "x"], "a": {"\xe9": b"y", "z": (None, True)}, "c": "\U0001f600" * 3},
    {f"k{i:02d}": [i, str(i)] for i in range(40)},  # more entries than the stack array
    {"a": 1, "b": [1, {2, 3}]},  # refused after entries were taken
    {f"k{i:02d}": i for i in range(30)} | {"zz": Decimal(1)},  # refused, heap array
    {"a": 1, 5: 2, "c": 3},  # refused while entries are being collected
    {"a": 1, "b": "\ud800"},  # refused lone surrogate value
    {"a": 1, "\ud800": 2},  # refused lone surrogate key
    [[{"x": [0] * 3}] * 5] * 2 + [2**64],
    shared_bomb(20),  # refused by the size limit below
]


@requires_extension
@pytest.mark.parametrize("value", LEAK_CASES)
def test_no_reference_leaks(value: object) -> None:
    objects = own_objects(value)
    assert objects
    for _ in range(3):
        _speedups.encode(value, 100_000)  # warm up caches (UTF-8 of non-ASCII keys)
    before = [sys.getrefcount(o) for o in objects]
    for _ in range(200):
        _speedups.encode(value, 100_000)
    after = [sys.getrefcount(o) for o in objects]
    assert before == after


@requires_extension
@pytest.mark.parametrize("value", LEAK_CASES)
def test_no_memory_growth(value: object) -> None:
    for _ in range(20):
        _speedups.encode(value, 100_000)
    gc.collect()
    tracemalloc.start()
    try:
        for _ in range(50):
            _speedups.encode(value, 100_000)
        gc.collect()
        first, _ = tracemalloc.get_traced_memory()
        for _ in range(1000):
            _speedups.encode(value, 100_000)
        gc.collect()
        second, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert second - first < 10_000


@requires_extension
def test_result_is_a_fresh_bytes_object() -> None:
    first = _speedups.encode([1, "a"], MAX)
    second = _speedups.encode([1, "a"], MAX)
    assert type(first) is bytes and first == second == b"\x82\x01\x61\x61"
    assert hash(first) == hash(b"\x82\x01\x61\x61")


# -- the fallback -------------------------------------------------------------------------


SCRIPT = """
import sys
{prelude}
from admission import canonical_encode, intent_digest, InvalidValueError
from admission.intent import _encoding as encoding
value = {{"b": [1, -2.5, "\\xe9", b"x", None, True], "a": {{"\\U00010000": float("nan")}}}}
print(encoding.ACCELERATED)
print(canonical_encode(value).hex())
print(intent_digest("update", "approve", value, "run-1"))
try:
    canonical_encode({{"a": [1, {{2}}]}})
except InvalidValueError as exc:
    print(exc.path, exc.reason)
"""


def run_script(prelude: str = "", **env: str) -> list[str]:
    environ = {k: v for k, v in os.environ.items() if k != "ADMISSION_PURE_PYTHON"} | env
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT.format(prelude=prelude)],
        env=environ,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.splitlines()


def test_the_pure_fallback_gives_the_same_results() -> None:
    # Built or not, whatever ADMISSION_PURE_PYTHON says in this process.
    built = str(importlib.util.find_spec("admission.intent._speedups") is not None)
    default = run_script()
    pure = run_script(ADMISSION_PURE_PYTHON="1")
    # The extension missing altogether (as where no compiler was found).
    missing = run_script(prelude="sys.modules['admission.intent._speedups'] = None")
    assert pure[0] == missing[0] == "False"
    assert default[0] == built
    assert default[1:] == pure[1:] == missing[1:]
    assert default[3].startswith("$.a[1] set is not encodable (allowed: None,")
    assert run_script(ADMISSION_PURE_PYTHON="0")[0] == built
