"""The conformance kit's strategies draw what they promise (issue #16, contract §2, §3).

Every drawn value encodes and comes back typed-equal; every key is valid; the
edges (255 code points, keys differing only past the 255th byte, depth 64,
wide maps, NaN payloads) are reachable, shown with ``find``; pools hold twins.
"""

from __future__ import annotations

import math
import struct
import unicodedata
from collections.abc import Callable
from typing import TypeVar

import pytest
from hypothesis import HealthCheck, Phase, find, given, settings
from hypothesis import strategies as st
from hypothesis.errors import NoSuchExample

from admission.conformance import (
    CommandSpec,
    argument_pools,
    arguments,
    command_keys,
    command_sequences,
    intent_values,
    key_pools,
    same,
    same_value_variants,
    twins,
)
from admission.conformance._strategies import INT_EDGES, MAP_KEYS, SCALARS
from admission.errors import InvalidValueError
from admission.intent import (
    MAX_DEPTH,
    canonical_decode,
    canonical_encode,
    normalize_request_id,
    receipt_token,
    validate_request_id,
)

T = TypeVar("T")

# Pools and sequences draw much per example: on a busy machine the first examples are slow.
SLOW_DRAWS = [HealthCheck.too_slow, HealthCheck.data_too_large]
FAST = settings(max_examples=30, deadline=None, suppress_health_check=SLOW_DRAWS)
# find() looks for a rare edge: enough tries to reach it, no database so that it is found afresh,
# and no shrinking (the first example found shows the edge is reachable; shrinking a 64-deep or
# 300-wide value would take most of the time).
SEARCH = settings(
    max_examples=1000,
    database=None,
    deadline=None,
    phases=[Phase.generate],
    suppress_health_check=list(HealthCheck),
)


def depth(value: object) -> int:
    if isinstance(value, (list, tuple)):
        return 1 + max(map(depth, value), default=0)
    if isinstance(value, dict):
        return 1 + max(map(depth, value.values()), default=0)
    return 0


def leaves(value: object) -> list[object]:
    if isinstance(value, (list, tuple)):
        return [leaf for item in value for leaf in leaves(item)]
    if isinstance(value, dict):
        return [leaf for item in value.values() for leaf in leaves(item)]
    return [value]


def reach_all(strategy: st.SearchStrategy[T], checks: dict[str, Callable[[T], bool]]) -> None:
    """Draw until every check has held for some example (one search for many edges)."""
    missing = set(checks)

    def covered(example: T) -> bool:
        missing.difference_update([name for name in missing if checks[name](example)])
        return not missing

    try:
        find(strategy, covered, settings=SEARCH)
    except NoSuchExample:
        pytest.fail(f"never drawn in {SEARCH.max_examples} examples: {sorted(missing)}")


def float_bits(value: float) -> bytes:
    return struct.pack(">d", value)


# -- values ----------------------------------------------------------------------------------


@FAST
@given(intent_values())
def test_every_intent_value_encodes_and_round_trips(value: object) -> None:
    encoded = canonical_encode(value)
    assert same(canonical_decode(encoded), value)
    assert depth(value) <= MAX_DEPTH


@FAST
@given(arguments())
def test_every_arguments_value_is_a_list_or_map_within_the_limits(value: object) -> None:
    assert type(value) in (list, dict)
    assert same(canonical_decode(canonical_encode(value)), value)


@FAST
@given(intent_values(max_depth=3, max_size=4096), arguments(max_depth=2, max_size=1024))
def test_values_and_arguments_keep_within_a_smaller_depth_and_size(value: object, args: object) -> None:
    assert depth(value) <= 3 and len(canonical_encode(value)) <= 4096
    assert depth(args) <= 2 and len(canonical_encode(args)) <= 1024


def test_a_value_nests_exactly_to_the_depth_limit_and_one_more_level_is_refused() -> None:
    deepest = find(intent_values(), lambda v: depth(v) == MAX_DEPTH, settings=SEARCH)
    with pytest.raises(InvalidValueError, match="deeper than 64"):
        canonical_encode([deepest])
    # Inside arguments the surrounding list or map is the first level.
    assert depth(find(arguments(), lambda v: depth(v) == MAX_DEPTH, settings=SEARCH)) == MAX_DEPTH


@pytest.mark.filterwarnings("ignore:Generating overly large repr")
def test_values_reach_wide_maps_long_text_and_the_odd_characters() -> None:
    def texts(value: object) -> list[str]:
        return [leaf for leaf in leaves(value) if type(leaf) is str]

    reach_all(
        intent_values(),
        {
            # The head of a map of 256 entries or more has a two-byte length argument.
            "wide map": lambda v: type(v) is dict and len(v) >= 256 and canonical_encode(v)[0] == 0xB9,
            "long text or bytes": lambda v: type(v) in (str, bytes) and len(v) >= 2**16 - 1,  # type: ignore[arg-type]
            "NUL": lambda v: any("\x00" in t for t in texts(v)),
            "4-byte character": lambda v: any(ord(c) > 0xFFFF for t in texts(v) for c in t),
            "combining mark": lambda v: any(unicodedata.combining(c) for t in texts(v) for c in t),
            "tuple": lambda v: type(v) is tuple,
        },
    )


def test_scalars_reach_the_int_and_float_edges() -> None:
    def is_int(edge: int) -> Callable[[object], bool]:
        return lambda v: type(v) is int and v == edge

    checks = {
        f"int {edge}": is_int(edge)
        for edge in (2**63 - 1, -(2**63), 0, 23, 24, -25, 255, 256, 65535, 65536, 2**32)
    }
    assert all(int(name[4:]) in INT_EDGES for name in checks)
    checks |= {
        "-0.0": lambda v: type(v) is float and float_bits(v) == float_bits(-0.0),
        "subnormal": lambda v: type(v) is float and 0 < abs(v) < 2.2250738585072014e-308,
        "-inf": lambda v: v == -math.inf,
        "max finite": lambda v: v == 1.7976931348623157e308,
        # A NaN that is not the usual quiet NaN: another payload or the sign bit set.
        "odd NaN": lambda v: type(v) is float and math.isnan(v) and float_bits(v) != float_bits(math.nan),
        "bytes": lambda v: type(v) is bytes,
        "None": lambda v: v is None,
        "bool": lambda v: v is True,
    }
    reach_all(SCALARS, checks)


def test_map_keys_reach_the_orders_a_careless_encoder_confuses() -> None:
    reach_all(
        st.dictionaries(MAP_KEYS, st.none()),
        {
            # "aa" sorts before "b" by bytes, after it by length first.
            "aa, b": lambda m: {"aa", "b"} <= m.keys(),
            # "\U00010000" sorts after "\ue000" by UTF-8 bytes, before it by UTF-16 units.
            "astral, private use": lambda m: {"\ue000", "\U00010000"} <= m.keys(),
            "prefix": lambda m: {"a", "aa"} <= m.keys(),
        },
    )


# -- keys ------------------------------------------------------------------------------------


def assert_valid_key(key: str) -> None:
    assert validate_request_id(key, "signal") == key
    assert validate_request_id(key, "update") == key
    stripped = normalize_request_id(key)
    if stripped is not None:  # what an HTTP target keeps is a valid key too
        validate_request_id(stripped, "signal")


@settings(max_examples=100, deadline=None, suppress_health_check=SLOW_DRAWS)
@given(command_keys())
def test_every_command_key_is_valid_for_signals_and_updates(key: str) -> None:
    assert_valid_key(key)


def test_keys_reach_255_code_points_nul_whitespace_and_both_normal_forms() -> None:
    reach_all(
        command_keys(),
        {
            "255 ASCII": lambda k: len(k) == 255 and k.isascii(),
            "255 four-byte": lambda k: len(k) == 255 and len(k.encode()) == 1020,
            "254": lambda k: len(k) == 254,
            "NUL": lambda k: "\x00" in k,
            "surrounding whitespace": lambda k: k != k.strip() != "",
            "whitespace only": lambda k: k.strip() == "",
            "NFD": lambda k: unicodedata.normalize("NFC", k) != k,
            "NFC": lambda k: k.isascii() is False and unicodedata.normalize("NFD", k) != k,
            "4-byte": lambda k: any(ord(c) > 0xFFFF for c in k),
            "upper case": lambda k: k.isupper(),
        },
    )


def differ_only_past_byte_255(a: str, b: str) -> bool:
    x, y = a.encode(), b.encode()
    return x != y and x[:255] == y[:255]


def is_twin_pair(a: str, b: str) -> bool:
    return (
        a.lower() == b.lower()
        or unicodedata.normalize("NFC", a) == unicodedata.normalize("NFC", b)
        or a.strip() == b.strip()
        or (len(a) == len(b) and a[:-1] == b[:-1])
        or differ_only_past_byte_255(a, b)
        or a[:254] == b[:254]
    )


@settings(max_examples=60, deadline=None, suppress_health_check=SLOW_DRAWS)
@given(key_pools())
def test_key_pools_hold_distinct_valid_keys_and_a_twin_pair(pool: list[str]) -> None:
    assert 3 <= len(pool) <= 5
    assert len(set(pool)) == len(pool)
    for key in pool:
        assert_valid_key(key)
    assert any(is_twin_pair(a, b) for i, a in enumerate(pool) for b in pool[i + 1 :])
    # Distinct keys are distinct receipts: their tokens differ too.
    assert len({receipt_token("update", key) for key in pool}) == len(pool)


def test_every_kind_of_key_twin_turns_up_in_pools() -> None:
    kinds: dict[str, Callable[[str, str], bool]] = {
        "case": lambda a, b: a.lower() == b.lower(),
        "normal form": lambda a, b: unicodedata.normalize("NFC", a) == unicodedata.normalize("NFC", b),
        "whitespace": lambda a, b: a.strip() == b.strip(),
        "last of 255": lambda a, b: len(a) == len(b) == 255 and a[:-1] == b[:-1],
        "past byte 255": lambda a, b: len(a) < 255 and differ_only_past_byte_255(a, b),
        "254 and 255": lambda a, b: {len(a), len(b)} == {254, 255} and a[:254] == b[:254],
    }

    def holder(twin: Callable[[str, str], bool]) -> Callable[[list[str]], bool]:
        return lambda pool: any(twin(a, b) for a in pool for b in pool if a != b)

    reach_all(key_pools(), {name: holder(twin) for name, twin in kinds.items()})


def test_key_pools_refuse_sizes_that_cannot_hold_a_twin_pair() -> None:
    with pytest.raises(ValueError, match="min_size"):
        find(key_pools(min_size=1), lambda pool: True)


# -- twins and spellings ---------------------------------------------------------------------


@settings(max_examples=100, deadline=None, suppress_health_check=SLOW_DRAWS)
@given(twins())
def test_twins_differ_in_canonical_encoding(pair: tuple[object, object]) -> None:
    a, b = pair
    assert canonical_encode(a) != canonical_encode(b)
    assert not same(a, b)


def unwrapped(pair: tuple[object, object]) -> tuple[object, object]:
    """The two values that differ, out of the lists and maps the pair shares."""
    a, b = pair
    while True:
        if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
            places: list[object] = [i for i in range(len(a)) if not same(a[i], b[i])]
        elif isinstance(a, dict) and isinstance(b, dict) and a.keys() == b.keys():
            places = [k for k in a if not same(a[k], b[k])]
        else:
            return a, b
        if len(places) != 1:
            return a, b
        a, b = a[places[0]], b[places[0]]  # type: ignore[index]


def test_the_named_twins_turn_up_bare_and_nested() -> None:
    named: list[tuple[object, object]] = [
        (1, 1.0), (0.0, -0.0), (True, 1), (False, 0), ("1", 1), (b"a", "a"), ("\u00e9", "e\u0301"),
        ([], {}),
    ]  # fmt: skip

    def holder(a: object, b: object) -> Callable[[tuple[object, object]], bool]:
        def holds(pair: tuple[object, object]) -> bool:
            x, y = unwrapped(pair)
            return (same(x, a) and same(y, b)) or (same(x, b) and same(y, a))

        return holds

    def nan_and_none(pair: tuple[object, object]) -> bool:
        x, y = unwrapped(pair)
        return {type(x), type(y)} == {float, type(None)} and (x != x or y != y)

    checks = {f"{a!r} / {b!r}": holder(a, b) for a, b in named}
    checks["NaN / None"] = nan_and_none
    checks["{k: n} / {k: float(n)}"] = lambda pair: (
        type(pair[0]) is dict
        and type(pair[1]) is dict
        and len(pair[0]) == 1
        and pair[0].keys() == pair[1].keys()
        and {type(v) for v in [*pair[0].values(), *pair[1].values()]} == {int, float}
    )
    checks["[x] / x"] = lambda pair: pair[0] == [pair[1]] or pair[1] == [pair[0]]
    checks["nested in a map"] = lambda pair: type(pair[0]) is dict and len(pair[0]) > 1
    checks["nested in a list"] = lambda pair: type(pair[0]) is list and len(pair[0]) > 1
    reach_all(twins(), checks)


def wrapped_alike(a: object, b: object) -> bool:
    """Two arguments holding one value each at the same place: ``[x]``/``[y]`` or ``{k: x}``/``{k: y}``."""
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) == 1
    return isinstance(a, dict) and isinstance(b, dict) and len(a) == 1 and a.keys() == b.keys()


@settings(max_examples=25, deadline=None, suppress_health_check=SLOW_DRAWS)
@given(argument_pools())
def test_argument_pools_hold_arguments_and_a_twin_pair(pool: list[object]) -> None:
    assert 4 <= len(pool) <= 8
    assert all(type(a) in (list, tuple, dict) for a in pool)
    encodings = [canonical_encode(a) for a in pool]
    assert any(
        wrapped_alike(pool[i], pool[j]) and encodings[i] != encodings[j]
        for i in range(len(pool))
        for j in range(i + 1, len(pool))
    )


def test_argument_pools_sometimes_hold_two_spellings_of_one_value() -> None:
    def respelled(pool: list[object]) -> bool:
        return any(
            canonical_encode(a) == canonical_encode(b) and repr(a) != repr(b) for a in pool for b in pool
        )

    find(argument_pools(), respelled, settings=SEARCH)


@FAST
@given(intent_values())
def test_same_value_variants_encode_equal_and_start_with_the_value(value: object) -> None:
    variants = same_value_variants(value)
    assert variants[0] is value
    assert {canonical_encode(v) for v in variants} == {canonical_encode(value)}


def test_same_value_variants_respell_maps_sequences_and_nans() -> None:
    value = {"a": [1, (2.0,)], "b": math.nan}
    variants = same_value_variants(value)
    assert [list(v) for v in variants if isinstance(v, dict)][1] == ["b", "a"]
    assert any(isinstance(v, dict) and type(v["a"]) is tuple and type(v["a"][1]) is list for v in variants)
    assert any(isinstance(v, dict) and float_bits(v["b"]) != float_bits(math.nan) for v in variants)
    assert same_value_variants(7) == [7]


# -- command sequences -----------------------------------------------------------------------


@settings(max_examples=20, deadline=None, suppress_health_check=SLOW_DRAWS)
@given(command_sequences())
def test_command_sequences_are_valid_commands(sequence: list[CommandSpec]) -> None:
    assert 1 <= len(sequence) <= 20
    for spec in sequence:
        assert spec.command_type in ("signal", "update")
        if spec.request_id is not None:
            validate_request_id(spec.request_id, spec.command_type)
        assert type(spec.arguments) in (list, tuple, dict)
        canonical_encode(spec.arguments)


@pytest.mark.filterwarnings("ignore:Generating overly large repr")
def test_command_sequences_repeat_keys_with_changed_intents() -> None:
    def repeats(sequence: list[CommandSpec]) -> bool:
        keyed = [s for s in sequence if s.request_id is not None]
        return any(
            a.request_id == b.request_id and canonical_encode(a.arguments) != canonical_encode(b.arguments)
            for i, a in enumerate(keyed)
            for b in keyed[i + 1 :]
        )

    find(command_sequences(), repeats, settings=SEARCH)
    fixed = find(command_sequences(keys=["k"], min_size=5), lambda s: s[0].request_id == "k", settings=SEARCH)
    assert {s.request_id for s in fixed} <= {"k", None}


@settings(max_examples=15, deadline=None, suppress_health_check=SLOW_DRAWS)
@given(command_sequences(min_size=10))
def test_most_long_sequences_send_one_key_twice(sequence: list[CommandSpec]) -> None:
    keys = [s.request_id for s in sequence if s.request_id is not None]
    # Keys come from one pool of at most 5: no more than 5 distinct keys in a sequence, so a
    # sequence with more keyed commands repeats a key.
    assert len(set(keys)) <= 5
    if len(keys) > 5:
        assert len(set(keys)) < len(keys)
