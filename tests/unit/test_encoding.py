"""The canonical encoding ``intent-v1`` (contract §3): exact bytes, strict decoding, refusals."""

from __future__ import annotations

import copy
import enum
import math
import pickle
import struct
from collections import OrderedDict
from decimal import Decimal

import cbor2
import pytest
from hypothesis import assume, example, given
from hypothesis import strategies as st

from admission import (
    InvalidValueError,
    arguments_digest,
    canonical_decode,
    canonical_encode,
    intent_digest,
    intent_record,
)
from admission.errors import AdmissionError, InvalidCommandTypeError
from tests.support.strategies import ARGUMENTS, KEYS, SCALARS, VALUES, same

NAN_WITH_PAYLOAD = struct.unpack(">d", bytes.fromhex("7ff0000000000001"))[0]
NEGATIVE_NAN = struct.unpack(">d", bytes.fromhex("fff8000000000000"))[0]


# -- the contract §3 table, row by row ------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, "f6"),
        (False, "f4"),
        (True, "f5"),
        (0, "00"),
        (23, "17"),
        (24, "1818"),
        (-1, "20"),
        (-24, "37"),
        (-25, "3818"),
        (255, "18ff"),
        (256, "190100"),
        (65535, "19ffff"),
        (65536, "1a00010000"),
        (2**32 - 1, "1affffffff"),
        (2**32, "1b0000000100000000"),
        (2**63 - 1, "1b7fffffffffffffff"),
        (-(2**63), "3b7fffffffffffffff"),
        (1.0, "fb3ff0000000000000"),
        (0.0, "fb0000000000000000"),
        (-0.0, "fb8000000000000000"),
        (1.5, "fb3ff8000000000000"),
        (5e-324, "fb0000000000000001"),
        (float("nan"), "f97e00"),
        (NAN_WITH_PAYLOAD, "f97e00"),
        (NEGATIVE_NAN, "f97e00"),
        (float("inf"), "f97c00"),
        (float("-inf"), "f9fc00"),
        ("", "60"),
        ("a", "6161"),
        ("é", "62c3a9"),
        ("\U0001f600", "64f09f9880"),
        (b"", "40"),
        (b"\x00\xff", "4200ff"),
        ([], "80"),
        ((1, "a"), "82016161"),
        ([1, [2, 3]], "8201820203"),
        ({}, "a0"),
        ({"b": 2, "a": 1}, "a2616101616202"),
        ({"b": 1, "aa": 2}, "a2626161026162" + "01"),
        ({"aa": 1, "a": 2, "b": 3}, "a3616102626161016162" + "03"),
    ],
)
def test_table_rows_encode_to_exact_bytes(value: object, expected: str) -> None:
    assert canonical_encode(value).hex() == expected


def test_bool_is_never_an_int_and_one_is_not_one_point_zero() -> None:
    encodings = {canonical_encode(v) for v in (1, 1.0, "1", True, b"1")}
    assert len(encodings) == 5
    assert canonical_encode(0.0) != canonical_encode(-0.0)
    assert canonical_encode({"a": 1, "b": 2}) == canonical_encode({"b": 2, "a": 1})


def test_map_order_is_raw_utf8_bytes_not_length_first() -> None:
    # Length-first (RFC 7049 canonical) would put "b" before "aa".
    assert canonical_encode({"b": 0, "aa": 0}).hex() == "a2" + "62616100" + "616200"
    # U+FFFF sorts before U+10000 in UTF-8; UTF-16 code units would disagree.
    assert canonical_encode({"\U00010000": 0, "\uffff": 0}).hex() == "a2" + "63efbfbf00" + "64f090808000"


def test_strings_are_not_normalised() -> None:
    nfc, nfd = "\u00e9", "e\u0301"
    assert canonical_encode(nfc) != canonical_encode(nfd)


# -- refusals name the path -------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "path", "fragment"),
    [
        ({"items": [0, 0, 0, {"price": Decimal("1.5")}]}, "$.items[3].price", "Decimal"),
        ([2**63], "$[0]", "int64"),
        ([-(2**63) - 1], "$[0]", "int64"),
        ({"a": {1: "x"}}, "$.a", "map keys must be str"),
        ({"ok": ["\ud800"]}, "$.ok[0]", "lone surrogate"),
        ({"\udfff": 1}, "$", "lone surrogate"),
        ({"weird key": {"x": {1, 2}}}, '$["weird key"].x', "set"),
        ([bytearray(b"x")], "$[0]", "bytearray"),
        ({"e": [enum.IntEnum("E", "A").A]}, "$.e[0]", "not encodable"),
        (OrderedDict(a=1), "$", "OrderedDict"),
    ],
)
def test_refusal_names_the_path_of_the_offending_value(value: object, path: str, fragment: str) -> None:
    with pytest.raises(InvalidValueError) as info:
        canonical_encode(value)
    assert info.value.path == path
    assert fragment in info.value.reason
    assert path in str(info.value)
    assert isinstance(info.value, ValueError) and isinstance(info.value, AdmissionError)
    assert info.value.code == "invalid_value"


def nested(levels: int) -> list[object]:
    value: list[object] = []
    for _ in range(levels - 1):
        value = [value]
    return value


def test_depth_64_is_accepted_and_65_refused() -> None:
    assert canonical_decode(canonical_encode(nested(64))) == nested(64)
    with pytest.raises(InvalidValueError, match="deeper than 64") as info:
        canonical_encode(nested(65))
    assert info.value.path == "$" + "[0]" * 64
    deep_bytes = b"\x81" * 64 + b"\x80"
    with pytest.raises(InvalidValueError, match="deeper than 64"):
        canonical_decode(deep_bytes)
    assert canonical_decode(deep_bytes[1:]) == nested(64)


def test_size_limit_is_configurable_and_default_one_mib() -> None:
    assert len(canonical_encode("x" * (2**20 - 5))) == 2**20
    with pytest.raises(InvalidValueError, match="exceeds the limit"):
        canonical_encode("x" * (2**20 - 4))
    assert canonical_encode(b"x" * 10, max_size=11)
    with pytest.raises(InvalidValueError, match="limit of 10 bytes"):
        canonical_encode(b"x" * 10, max_size=10)
    with pytest.raises(InvalidValueError, match="exceed the limit"):
        canonical_decode(canonical_encode(b"x" * 10), max_size=10)


def test_shared_references_cannot_expand_without_bound() -> None:
    value: list[object] = []
    for _ in range(60):
        value = [value, value]
    with pytest.raises(InvalidValueError, match="exceeds the limit"):
        canonical_encode(value)


def test_errors_pickle_with_their_data() -> None:
    with pytest.raises(InvalidValueError) as info:
        canonical_encode({"a": [1, {2}]})
    copied = pickle.loads(pickle.dumps(info.value))
    assert type(copied) is InvalidValueError
    assert (copied.path, copied.field, copied.reason, str(copied)) == (
        info.value.path,
        info.value.field,
        info.value.reason,
        str(info.value),
    )


# -- strict decoding ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("hex_bytes", "fragment"),
    [
        ("1817", "shortest"),
        ("190017", "shortest"),
        ("1900ff", "shortest"),
        ("1a0000ffff", "shortest"),
        ("1b00000000ffffffff", "shortest"),
        ("3817", "shortest"),
        ("1b8000000000000000", "int64"),
        ("3b8000000000000000", "int64"),
        ("a2616201616100", "not sorted"),
        ("a2616201626161" + "02", "not sorted"),
        ("a2616101616102", "duplicate"),
        ("a10101", "text string"),
        ("9f01ff", "indefinite"),
        ("bf616101ff", "indefinite"),
        ("7f6161ff", "indefinite"),
        ("5f4101ff", "indefinite"),
        ("ff", "break"),
        ("c001", "tags"),
        ("c249010000000000000000", "tags"),
        ("f7", "undefined"),
        ("e0", "simple"),
        ("f820", "simple"),
        ("f93c00", "half-precision"),
        ("f98000", "half-precision"),
        ("fa3f800000", "single-precision"),
        ("fb7ff8000000000000", "3-byte form"),
        ("fb7ff0000000000000", "3-byte form"),
        ("62c328", "UTF-8"),
        ("63eda080", "UTF-8"),
        ("62c0af", "UTF-8"),
        ("61ff", "UTF-8"),
        ("0000", "trailing"),
        ("", "truncated"),
        ("19ff", "truncated"),
        ("6261", "truncated"),
        ("8201", "truncated"),
        ("fb3ff0", "truncated"),
        ("1c", "reserved"),
        ("1e", "reserved"),
        ("9b7fffffffffffffff", "truncated"),
    ],
)
def test_strict_decoder_refuses_non_canonical_bytes(hex_bytes: str, fragment: str) -> None:
    with pytest.raises(InvalidValueError, match=fragment) as info:
        canonical_decode(bytes.fromhex(hex_bytes))
    assert info.value.field == "data"


def test_decoder_refusal_names_the_path_and_offset() -> None:
    data = canonical_encode({"items": [0, 0, 0, {"price": 1.0}]})
    bad = data.replace(bytes.fromhex("fb3ff0000000000000"), bytes.fromhex("fa3f800000"))
    with pytest.raises(InvalidValueError) as info:
        canonical_decode(bad)
    assert info.value.path == "$.items[3].price"
    assert info.value.offset == bad.index(bytes.fromhex("fa3f800000"))


def test_decoder_refuses_what_is_not_bytes() -> None:
    with pytest.raises(InvalidValueError, match="must be bytes"):
        canonical_decode("f6")  # type: ignore[arg-type]


# -- intent records and digests -------------------------------------------------------


def test_intent_record_is_the_canonical_five_element_array() -> None:
    record = intent_record("update", "approve", {"amount": 1.5}, "run-1")
    assert record == canonical_encode(["admission/intent/v1", "update", "approve", {"amount": 1.5}, "run-1"])
    assert canonical_decode(record) == ["admission/intent/v1", "update", "approve", {"amount": 1.5}, "run-1"]
    assert intent_record("signal", "go", []) == canonical_encode(
        ["admission/intent/v1", "signal", "go", [], None]
    )


def test_intent_digest_distinguishes_every_part() -> None:
    base = intent_digest("update", "approve", {"amount": 1}, None)
    assert base == intent_digest("update", "approve", {"amount": 1})
    assert len(base) == 64 and base == base.lower()
    others = [
        intent_digest("signal", "approve", {"amount": 1}),
        intent_digest("update", "Approve", {"amount": 1}),
        intent_digest("update", "approve", {"amount": 1.0}),
        intent_digest("update", "approve", {"amount": "1"}),
        intent_digest("update", "approve", {"amount": 1}, "run-1"),
        intent_digest("update", "approve", [1]),
    ]
    assert len({base, *others}) == 7


@pytest.mark.parametrize(
    ("call", "error", "field"),
    [
        (lambda: intent_digest("query", "x", []), InvalidCommandTypeError, "command_type"),
        (lambda: intent_digest("signal", "", []), InvalidValueError, "name"),
        (lambda: intent_digest("signal", 3, []), InvalidValueError, "name"),
        (lambda: intent_digest("signal", "x\ud800", []), InvalidValueError, "name"),
        (lambda: intent_digest("signal", "x", [], ""), InvalidValueError, "target"),
        (lambda: intent_digest("signal", "x", [], 7), InvalidValueError, "target"),
        (lambda: intent_digest("signal", "x", "not a list"), InvalidValueError, "arguments"),
        (lambda: intent_digest("signal", "x", None), InvalidValueError, "arguments"),
        (lambda: intent_digest("signal", "x", [{1}]), InvalidValueError, "arguments"),
        (lambda: arguments_digest(5), InvalidValueError, "arguments"),
    ],
)
def test_intent_refusals_name_the_field(call: object, error: type[Exception], field: str) -> None:
    with pytest.raises(error) as info:
        call()  # type: ignore[operator]
    assert getattr(info.value, "field") == field  # noqa: B009


def test_intent_limits_apply_to_the_arguments_not_the_envelope() -> None:
    intent_digest("signal", "x", nested(64))
    with pytest.raises(InvalidValueError, match="deeper than 64"):
        intent_digest("signal", "x", nested(65))
    assert intent_digest("signal", "x", [b"x" * 8], max_size=10)
    with pytest.raises(InvalidValueError, match="limit"):
        intent_digest("signal", "x", [b"x" * 9], max_size=10)


def test_arguments_digest_is_sha256_of_the_arguments_encoding() -> None:
    import hashlib

    arguments = {"b": [1, 2.5], "a": None}
    assert arguments_digest(arguments) == hashlib.sha256(canonical_encode(arguments)).hexdigest()


# -- properties -----------------------------------------------------------------------


@given(VALUES)
def test_encoding_is_deterministic(value: object) -> None:
    assert canonical_encode(value) == canonical_encode(copy.deepcopy(value))


@given(VALUES)
def test_decode_inverts_encode(value: object) -> None:
    assert same(canonical_decode(canonical_encode(value)), value)


@given(VALUES)
def test_an_independent_cbor_decoder_reads_the_same_value(value: object) -> None:
    # cbor2 is not canonical about floats or ordering, but it must read our
    # bytes as the same value: the bytes are plain CBOR.
    assert same(cbor2.loads(canonical_encode(value)), value)


@given(st.dictionaries(KEYS, VALUES, max_size=8), st.randoms(use_true_random=False))
def test_map_insertion_order_never_changes_bytes(mapping: dict[str, object], rnd: object) -> None:
    items = list(mapping.items())
    rnd.shuffle(items)  # type: ignore[attr-defined]
    assert canonical_encode(dict(items)) == canonical_encode(mapping)


@given(VALUES, VALUES)
@example(1, 1.0)
@example(0.0, -0.0)
@example(1, True)
@example("1", 1)
@example(b"a", "a")
@example(0, False)
@example(float("nan"), NAN_WITH_PAYLOAD)
def test_equal_bytes_exactly_when_typed_values_are_equal(a: object, b: object) -> None:
    assert (canonical_encode(a) == canonical_encode(b)) == same(a, b)


@given(SCALARS)
def test_values_differing_in_type_encode_differently(value: object) -> None:
    variants: list[object] = [value]
    if type(value) is int:
        variants += [float(value), str(value), bool(value) if value in (0, 1) else None]
    elif type(value) is float and not math.isnan(value):
        variants += [-value, str(value), value.hex().encode()]
        if value.is_integer() and -(2**63) <= value < 2**63:
            variants.append(int(value))
    elif type(value) is str:
        variants += [value.encode(), [value]]
    assume(len(variants) > 1)
    distinct = [v for v in variants if not any(same(v, w) for w in variants if w is not v)]
    assert len({canonical_encode(v) for v in distinct}) == len(distinct)


POISONS = st.sampled_from([{1, 2}, 2**63, -(2**63) - 1, "\ud800", Decimal(1), bytearray(b"x"), object()])


@st.composite
def poisoned(draw: st.DrawFn) -> tuple[object, str]:
    """A valid value with one refused value planted at a known path."""
    poison = draw(POISONS)
    steps = draw(st.lists(st.one_of(st.integers(0, 3), st.sampled_from(["a", "b c", "é"])), max_size=5))
    value: object = poison
    path = ""
    for step in reversed(steps):
        if isinstance(step, int):
            filler = draw(st.lists(SCALARS, min_size=step, max_size=step))
            value = [*filler, value]
            path = f"[{step}]" + path
        else:
            others = draw(st.dictionaries(st.sampled_from(["x", "y", "zz"]), SCALARS, max_size=2))
            value = {**others, step: value}
            path = (
                f".{step}" if step.isidentifier() and step.isascii() else f'["{step}"]'.replace("é", "\\xe9")
            ) + path
    return value, "$" + path


@given(poisoned())
def test_a_refusal_never_returns_output_and_names_the_planted_path(case: tuple[object, str]) -> None:
    value, path = case
    with pytest.raises(InvalidValueError) as info:
        canonical_encode(value)
    assert info.value.path == path


@given(VALUES.map(canonical_encode), st.data())
def test_mutated_canonical_bytes_decode_only_when_canonical(data: bytes, draw: st.DataObject) -> None:
    position = draw.draw(st.integers(0, len(data)))
    choice = draw.draw(st.sampled_from(["flip", "insert", "delete"]))
    byte = draw.draw(st.integers(0, 255))
    if choice == "flip" and position < len(data):
        mutated = data[:position] + bytes((byte,)) + data[position + 1 :]
    elif choice == "delete" and position < len(data):
        mutated = data[:position] + data[position + 1 :]
    else:
        mutated = data[:position] + bytes((byte,)) + data[position:]
    check_decoder_contract(mutated)


@given(st.binary(max_size=64))
@example(b"\x81" * 70)
@example(b"\x9b\xff\xff\xff\xff\xff\xff\xff\xff")
@example(b"\xbb\x00\x00\x00\x01\x00\x00\x00\x00")
def test_arbitrary_bytes_decode_to_a_canonical_value_or_raise_the_typed_error(data: bytes) -> None:
    check_decoder_contract(data)


def check_decoder_contract(data: bytes) -> None:
    try:
        value = canonical_decode(data)
    except InvalidValueError:
        return
    assert canonical_encode(value) == data


@given(ARGUMENTS)
def test_intent_digest_equals_sha256_of_the_encoded_record(arguments: object) -> None:
    import hashlib

    record = canonical_encode(["admission/intent/v1", "update", "n", arguments, None])
    assert intent_record("update", "n", arguments) == record
    assert intent_digest("update", "n", arguments) == hashlib.sha256(record).hexdigest()


@given(
    ARGUMENTS, st.sampled_from(["signal", "update"]), st.one_of(st.none(), st.text(min_size=1, max_size=5))
)
def test_encode_intent_agrees_with_the_separate_functions(
    arguments: object, command_type: str, target: str | None
) -> None:
    import hashlib

    from admission import encode_intent

    assume(target is None or "\ud800" not in target)
    encoded = encode_intent(command_type, "n", arguments, target)
    assert encoded.record == intent_record(command_type, "n", arguments, target)
    assert encoded.digest == intent_digest(command_type, "n", arguments, target)
    assert encoded.arguments == canonical_encode(arguments)
    assert (
        encoded.arguments_digest
        == arguments_digest(arguments)
        == hashlib.sha256(encoded.arguments).hexdigest()
    )
