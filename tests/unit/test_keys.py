"""Command keys (contract §2): normalisation, validation, receipt tokens."""

from __future__ import annotations

import hashlib
import pickle
import unicodedata
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from admission import (
    InvalidRequestIdError,
    ReservedRequestIdError,
    normalize_request_id,
    receipt_token,
    validate_request_id,
)
from admission.errors import InvalidCommandTypeError
from admission.intent import TOKEN_PATTERN
from admission.intent._keys import validated_token

VALID_KEYS = st.text(alphabet=st.characters(exclude_categories=("Cs",)), min_size=1, max_size=255)


def test_token_is_type_prefix_and_sha256_of_the_utf8_key() -> None:
    assert receipt_token("signal", "test") == (
        "signal-v1:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
    )
    assert receipt_token("update", "test").startswith("update-v1:9f86d081")


def test_keys_are_case_sensitive_and_not_normalised() -> None:
    assert receipt_token("update", "a") != receipt_token("update", "A")
    nfc = unicodedata.normalize("NFC", "café")
    nfd = unicodedata.normalize("NFD", "café")
    assert nfc != nfd
    assert receipt_token("update", nfc) != receipt_token("update", nfd)


def test_length_counts_code_points_not_bytes() -> None:
    four_byte = "\U0001f600" * 255
    assert len(four_byte.encode()) == 1020
    assert validate_request_id(four_byte, "update") == four_byte
    with pytest.raises(InvalidRequestIdError, match="256 code points") as info:
        validate_request_id(four_byte + "\U0001f600", "update")
    assert info.value.code == "request_id_invalid"
    assert info.value.field == "request_id"


@pytest.mark.parametrize("key", ["", "\ud800", "a\udfffb", None, 5, b"key"])
def test_invalid_keys_are_refused_with_a_typed_error(key: object) -> None:
    with pytest.raises(InvalidRequestIdError) as info:
        validate_request_id(key, "signal")
    assert info.value.code == "request_id_invalid"
    assert "request_id" in str(info.value)
    with pytest.raises(InvalidRequestIdError):
        receipt_token("signal", key)  # type: ignore[arg-type]


def test_nul_and_control_characters_are_valid_key_content() -> None:
    assert validate_request_id("a\x00b", "signal") == "a\x00b"
    assert receipt_token("signal", "a\x00b") == "signal-v1:" + hashlib.sha256(b"a\x00b").hexdigest()


def test_reserved_prefix_is_refused_for_caller_signals_only() -> None:
    key = "workflow-signal:abc"
    with pytest.raises(ReservedRequestIdError) as info:
        validate_request_id(key, "signal")
    assert info.value.code == "request_id_reserved"
    assert info.value.request_id == key
    assert validate_request_id(key, "update") == key
    # The engine's own signals still need their tokens.
    assert receipt_token("signal", key).startswith("signal-v1:")


def test_the_core_never_trims() -> None:
    assert validate_request_id(" a ", "signal") == " a "
    assert receipt_token("signal", " a ") != receipt_token("signal", "a")


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (None, None),
        ("", None),
        ("   ", None),
        ("\t\n", None),
        (" a ", "a"),
        ("\u3000k\u2003", "k"),
        ("a b", "a b"),
    ],
)
def test_http_normalisation_strips_and_blank_means_no_key(raw: str | None, expected: str | None) -> None:
    assert normalize_request_id(raw) == expected


def test_http_normalisation_refuses_non_strings() -> None:
    with pytest.raises(InvalidRequestIdError, match="must be a string"):
        normalize_request_id(42)


def test_unknown_command_type_is_refused() -> None:
    with pytest.raises(InvalidCommandTypeError) as info:
        receipt_token("query", "k")  # type: ignore[arg-type]
    assert info.value.code == "command_type_invalid"
    with pytest.raises(InvalidCommandTypeError):
        validate_request_id("k", "Signal")


def test_key_errors_pickle_with_their_data() -> None:
    with pytest.raises(ReservedRequestIdError) as info:
        validate_request_id("workflow-signal:x", "signal")
    copied = pickle.loads(pickle.dumps(info.value))
    assert (type(copied), copied.request_id, copied.code, str(copied)) == (
        ReservedRequestIdError,
        "workflow-signal:x",
        "request_id_reserved",
        str(info.value),
    )


@given(VALID_KEYS, st.sampled_from(["signal", "update"]))
def test_every_valid_key_has_a_well_formed_token(key: str, command_type: str) -> None:
    token = receipt_token(command_type, key)
    assert TOKEN_PATTERN.match(token)
    assert token == f"{command_type}-v1:" + hashlib.sha256(key.encode()).hexdigest()


@given(VALID_KEYS, VALID_KEYS)
def test_distinct_keys_have_distinct_tokens(a: str, b: str) -> None:
    assert (receipt_token("update", a) == receipt_token("update", b)) == (a == b)


@given(st.text(min_size=256, max_size=300))
def test_keys_over_255_code_points_are_refused(key: str) -> None:
    with pytest.raises(InvalidRequestIdError):
        validate_request_id(key, "update")


@given(st.text(max_size=40))
def test_normalised_keys_are_stripped_or_none(raw: str) -> None:
    normalised = normalize_request_id(raw)
    assert normalised == (raw.strip() or None)
    if normalised is not None:
        assert normalised == normalised.strip()


def _outcome(call: Callable[[], object]) -> object:
    try:
        return call()
    except (InvalidRequestIdError, ReservedRequestIdError, InvalidCommandTypeError) as exc:
        return (type(exc), str(exc))


ANY_KEYS = st.one_of(
    st.text(max_size=260),
    st.sampled_from(["", "workflow-signal:x", "a\ud800b", "x" * 256]),
    st.builds(lambda key: "workflow-signal:" + key, st.text(max_size=8)),
    st.integers(),
    st.none(),
)


@given(ANY_KEYS, st.sampled_from(["signal", "update", "query", ""]))
def test_the_key_and_its_token_at_once_are_validation_then_the_token(key: object, command_type: str) -> None:
    # The service's one-step form: the same refusal, or the same key and token, as the two steps.
    expected = _outcome(
        lambda: (
            validate_request_id(key, command_type),
            receipt_token(command_type, validate_request_id(key, command_type)),
        )
    )
    assert _outcome(lambda: validated_token(key, command_type)) == expected
