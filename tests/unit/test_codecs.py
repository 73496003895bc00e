"""Payload codecs: round trips, strict refusals, AES-GCM authentication, envelopes."""

from __future__ import annotations

import base64
import math
import pickle
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from admission.errors import CodecError, InvalidValueError
from admission.http import (
    AesGcmCodec,
    CborCodec,
    Codec,
    CodecRegistry,
    JsonCodec,
    codecs_from,
    decode_envelope,
    envelope,
    parse_json_value,
    render_json_value,
)
from admission.intent import canonical_encode, intent_digest
from tests.support.strategies import ARGUMENTS, FLOATS, INT64, KEYS, TEXT, VALUES, same

KEY = bytes(range(32))

JSON_SCALARS = st.one_of(st.none(), st.booleans(), INT64, FLOATS, TEXT)
JSON_VALUES = st.recursive(
    JSON_SCALARS,
    lambda children: st.one_of(
        st.lists(children, max_size=6),
        st.lists(children, max_size=4).map(tuple),
        st.dictionaries(KEYS, children, max_size=6),
    ),
    max_leaves=40,
)


# -- json -----------------------------------------------------------------------------------


@settings(max_examples=150)
@given(JSON_VALUES)
def test_json_codec_round_trips_every_json_value_exactly(value: object) -> None:
    codec = JsonCodec()
    decoded = codec.decode(codec.encode(value))  # type: ignore[arg-type]
    assert same(decoded, value)
    # The typed value survives, so the canonical bytes (and any digest) do too.
    assert canonical_encode(decoded) == canonical_encode(value)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("1", 1), ("1.0", 1.0), ("-0.0", -0.0), ("1e300", 1e300), ("[1, 1.0]", [1, 1.0])],
)
def test_json_keeps_ints_and_floats_apart(text: str, expected: object) -> None:
    decoded = parse_json_value(text, "input")
    assert same(decoded, expected)
    assert same(parse_json_value(render_json_value(decoded)), expected)


def test_json_keeps_the_sign_of_negative_zero_and_the_non_finite_floats() -> None:
    decoded = JsonCodec().decode("[-0.0, NaN, Infinity, -Infinity]")
    assert isinstance(decoded, list)
    assert str(decoded[0]) == "-0.0"
    assert decoded[1] != decoded[1]
    assert decoded[2:] == [float("inf"), float("-inf")]
    assert JsonCodec().encode(decoded) == "[-0.0,NaN,Infinity,-Infinity]"


def test_json_refuses_duplicate_object_keys_naming_the_field() -> None:
    with pytest.raises(CodecError) as caught:
        JsonCodec().decode('{"a": 1, "a": 2}')
    assert caught.value.field == "input"
    assert caught.value.codec == "json"
    assert "duplicate object key 'a'" in str(caught.value)


@pytest.mark.parametrize("text", ["", "{", "[1,]", "nul", "'a'", "[" * 100_000, "1" * 5000])
def test_json_refuses_malformed_text_with_a_typed_error(text: str) -> None:
    with pytest.raises(CodecError) as caught:
        JsonCodec().decode(text)
    assert caught.value.field == "input"
    assert isinstance(caught.value, InvalidValueError)


def test_json_cannot_carry_bytes() -> None:
    with pytest.raises(CodecError, match="bytes cannot be carried"):
        JsonCodec().encode({"a": [b"x"]})


@given(
    mantissa=st.integers(1, 9),
    exponent=st.integers(309, 100_000),
    sign=st.sampled_from(["", "-"]),
    where=st.sampled_from(["{}", "[{}]", '{{"price": {}}}']),
)
def test_a_number_too_large_for_a_float_is_refused_not_read_as_infinity(
    mantissa: int, exponent: int, sign: str, where: str
) -> None:
    literal = f"{sign}{mantissa}e{exponent}"
    with pytest.raises(InvalidValueError, match="too large for a 64-bit float") as refused:
        parse_json_value(where.format(literal), "input")
    assert refused.value.field == "input" and refused.value.code == "invalid_value"


@given(st.floats(allow_nan=False, allow_infinity=False))
def test_every_finite_float_still_reads_back_exactly(value: float) -> None:
    assert same(parse_json_value(repr(value)), value)
    assert same(parse_json_value(render_json_value([value])), [value])


def test_infinity_written_as_such_is_still_a_float() -> None:
    assert parse_json_value("[Infinity, -Infinity]") == [math.inf, -math.inf]


def test_parse_json_value_keeps_the_cli_field_name() -> None:
    with pytest.raises(InvalidValueError, match=r"^--args: duplicate object key 'k'"):
        parse_json_value('{"k": 1, "k": 1}')


# -- cbor -----------------------------------------------------------------------------------


@settings(max_examples=150)
@given(VALUES)
def test_cbor_codec_round_trips_every_value_through_base64(value: object) -> None:
    codec = CborCodec()
    blob = codec.encode(value)  # type: ignore[arg-type]
    assert base64.b64decode(blob, validate=True) == canonical_encode(value)
    assert same(codec.decode(blob), value)


@pytest.mark.parametrize(
    ("blob", "why"),
    [
        ("not base64!", "base64"),
        ("AQ", "base64"),  # missing padding
        (base64.b64encode(bytes.fromhex("1817")).decode(), "canonical"),  # 23 in a 2-byte head
        (base64.b64encode(bytes.fromhex("a2616101616102")).decode(), "canonical"),  # duplicate key
        (base64.b64encode(bytes.fromhex("0000")).decode(), "trailing"),
        ("", "canonical"),
    ],
)
def test_cbor_codec_refuses_what_is_not_canonical(blob: str, why: str) -> None:
    with pytest.raises(CodecError, match=why) as caught:
        CborCodec().decode(blob)
    assert caught.value.field == "input"


def test_cbor_codec_honours_its_size_limit() -> None:
    blob = CborCodec().encode(["x" * 200])
    with pytest.raises(CodecError, match="exceed"):
        CborCodec(max_size=100).decode(blob)


# -- aes-gcm --------------------------------------------------------------------------------


@settings(max_examples=60)
@given(ARGUMENTS)
def test_two_encryptions_are_different_blobs_of_one_intent(arguments: object) -> None:
    codec = AesGcmCodec(KEY, "k1")
    first, second = codec.encode(arguments), codec.encode(arguments)  # type: ignore[arg-type]
    assert first != second  # fresh nonces
    one, two = codec.decode(first), codec.decode(second)
    assert same(one, arguments) and same(two, arguments)
    assert intent_digest("update", "u", one) == intent_digest("update", "u", two)


@settings(max_examples=60)
@given(st.data())
def test_any_changed_byte_fails_authentication(data: st.DataObject) -> None:
    codec = AesGcmCodec(KEY, "k1")
    raw = bytearray(base64.b64decode(codec.encode({"amount": 12.5, "to": "acct"})))
    index = data.draw(st.integers(0, len(raw) - 1))
    raw[index] ^= data.draw(st.integers(1, 255))
    with pytest.raises(CodecError, match="authentication") as caught:
        codec.decode(base64.b64encode(bytes(raw)).decode())
    assert caught.value.field == "input"


def test_another_key_or_key_id_fails_authentication() -> None:
    blob = AesGcmCodec(KEY, "k1").encode([1])
    with pytest.raises(CodecError, match="authentication"):
        AesGcmCodec(bytes(32), "k1").decode(blob)
    with pytest.raises(CodecError, match="authentication"):
        AesGcmCodec(KEY, "k2").decode(blob)
    assert AesGcmCodec(KEY, "k1").decode(blob) == [1]


def test_a_fixed_nonce_gives_the_documented_layout() -> None:
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    nonce = b"\x07" * 12
    blob = AesGcmCodec(KEY, "k1", nonce=lambda: nonce).encode({"a": 1})
    raw = base64.b64decode(blob)
    assert raw[:12] == nonce
    plain = AESGCM(KEY).decrypt(nonce, raw[12:], b"admission/aes-gcm/v1:k1")
    assert plain == canonical_encode({"a": 1})


def test_aes_gcm_can_wrap_the_json_codec() -> None:
    codec = AesGcmCodec(KEY, "k1", inner=JsonCodec())
    assert same(codec.decode(codec.encode([1, 1.0, -0.0])), [1, 1.0, -0.0])


def test_a_decrypted_blob_must_still_be_canonical() -> None:
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    nonce = b"\x01" * 12
    sealed = nonce + AESGCM(KEY).encrypt(nonce, bytes.fromhex("1817"), b"admission/aes-gcm/v1:k1")
    with pytest.raises(CodecError, match="canonical"):
        AesGcmCodec(KEY, "k1").decode(base64.b64encode(sealed).decode())


@pytest.mark.parametrize("blob", ["", "AAAA", "!!!!"])
def test_short_or_malformed_aes_gcm_blobs_are_refused(blob: str) -> None:
    with pytest.raises(CodecError):
        AesGcmCodec(KEY, "k1").decode(blob)


@pytest.mark.parametrize(("key", "key_id", "field"), [(b"short", "k", "key"), (KEY, "", "key_id")])
def test_bad_keys_are_refused_naming_the_field(key: bytes, key_id: str, field: str) -> None:
    with pytest.raises(InvalidValueError) as caught:
        AesGcmCodec(key, key_id)
    assert caught.value.field == field


def test_the_key_never_appears_in_the_repr() -> None:
    assert KEY.hex() not in repr(AesGcmCodec(KEY, "k1"))
    assert repr(KEY) not in repr(AesGcmCodec(KEY, "k1"))


# -- registry and envelopes -----------------------------------------------------------------


@settings(max_examples=60)
@given(ARGUMENTS, st.sampled_from(["cbor", "aes-gcm"]))
def test_an_envelope_decodes_to_the_value_it_carries(arguments: object, name: str) -> None:
    registry = codecs_from(JsonCodec(), CborCodec(), AesGcmCodec(KEY, "k1"))
    wrapped = envelope(registry[name], arguments)  # type: ignore[arg-type]
    assert set(wrapped) == {"codec", "blob"} and wrapped["codec"] == name
    assert same(decode_envelope(registry, wrapped), arguments)


@pytest.mark.parametrize(
    ("obj", "why"),
    [
        ([], "must be an object"),
        ({"codec": "json"}, "'blob' must be a string"),
        ({"blob": "[]"}, "'codec' must be a string"),
        ({"codec": "json", "blob": "[]", "key_id": "x"}, "unknown envelope member 'key_id'"),
        ({"codec": "yaml", "blob": "[]"}, "not accepted here"),
        ({"codec": "aes-gcm", "blob": "AAAA"}, "not accepted here"),
        ({"codec": "json", "blob": 5}, "'blob' must be a string"),
    ],
)
def test_malformed_envelopes_are_refused(obj: object, why: str) -> None:
    with pytest.raises(CodecError, match=why) as caught:
        decode_envelope(codecs_from(), obj)
    assert caught.value.field == "input"


def test_the_default_registry_is_json_and_cbor() -> None:
    assert sorted(codecs_from()) == ["cbor", "json"]
    assert all(isinstance(c, Codec) for c in codecs_from().values())


def test_a_registry_refuses_two_codecs_of_one_name() -> None:
    with pytest.raises(ValueError, match="two codecs"):
        CodecRegistry([JsonCodec(), JsonCodec()])


def test_codec_errors_pickle_with_their_data() -> None:
    error = CodecError("blob failed authentication", codec="aes-gcm")
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is CodecError
    assert (copy.codec, copy.field, copy.code, str(copy)) == ("aes-gcm", "input", "input_invalid", str(error))


def test_the_codecs_module_does_not_need_cryptography_until_aes_gcm_is_used() -> None:
    code = (
        "import sys; import admission, admission.http._codecs as c; c.JsonCodec().decode('[1]');"
        "print(*(m in sys.modules for m in ('cryptography', 'sqlalchemy', 'fastapi', 'httpx')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False"] * 4
