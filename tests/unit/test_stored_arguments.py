"""The two stored forms of arguments (``admission.http._stored``): each reads back as it was sent."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from admission.errors import CodecError, InvalidValueError
from admission.http import AesGcmCodec, CborCodec, JsonCodec, codecs_from, envelope, open_arguments
from admission.http._stored import admitted_arguments, check_store_arguments
from admission.intent import canonical_encode
from admission.receipts import SealedArguments, sealed_max_size
from admission.receipts._sealed import intent_and_stored
from tests.support.strategies import ARGUMENTS, same

KEY = bytes(range(32))
CODECS = codecs_from(JsonCodec(), CborCodec(), AesGcmCodec(KEY, "k1"))


@settings(max_examples=100, deadline=None)
@given(arguments=ARGUMENTS, name=st.sampled_from(["cbor", "aes-gcm"]))
def test_an_envelope_stored_as_received_opens_to_its_plaintext_with_the_same_digest(
    arguments: Any, name: str
) -> None:
    received = envelope(CODECS[name], arguments)
    sealed = admitted_arguments(CODECS, received, "envelope")
    assert isinstance(sealed, SealedArguments)
    encoded, stored = intent_and_stored("update", "pay", sealed, None, 1 << 20)
    plain, plain_stored = intent_and_stored("update", "pay", arguments, None, 1 << 20)
    assert (encoded.digest, encoded.arguments_digest) == (plain.digest, plain.arguments_digest)
    assert stored != plain_stored and plain_stored == canonical_encode(arguments)
    assert received["blob"].encode("ascii") in stored  # the blob exactly as received
    assert same(open_arguments(CODECS, stored), arguments)
    assert same(open_arguments(CODECS, plain_stored), arguments)


@settings(max_examples=100, deadline=None)
@given(arguments=ARGUMENTS)
def test_plaintext_mode_gives_the_service_the_decoded_arguments(arguments: Any) -> None:
    assert same(admitted_arguments(CODECS, envelope(CODECS["cbor"], arguments), "plaintext"), arguments)


def test_plain_arguments_shaped_like_an_envelope_are_never_opened_as_one() -> None:
    # A caller's arguments that look like another tenant's envelope stay plain
    # arguments: only a stored text is read as an envelope, and arguments are
    # always a list or a map.
    lookalike = envelope(CODECS["aes-gcm"], {"card": "4111 1111 1111 1111"})
    _, stored = intent_and_stored("signal", "note", lookalike, None, 1 << 20)
    assert open_arguments(CODECS, stored) == lookalike


def test_a_stored_envelope_opens_only_with_its_key() -> None:
    sealed = admitted_arguments(CODECS, envelope(CODECS["aes-gcm"], [1]), "envelope")
    _, stored = intent_and_stored("signal", "note", sealed, None, 1 << 20)
    with pytest.raises(CodecError, match="failed authentication"):
        open_arguments(codecs_from(AesGcmCodec(bytes(32), "k1")), stored)
    with pytest.raises(CodecError, match="not accepted here"):
        open_arguments(codecs_from(), stored)


@pytest.mark.parametrize("value", [None, 5, b"raw", True])
def test_stored_bytes_of_no_known_form_are_refused_naming_the_field(value: object) -> None:
    with pytest.raises(InvalidValueError) as refused:
        open_arguments(CODECS, canonical_encode(value))
    assert refused.value.field == "arguments"


def test_a_stored_text_that_is_not_an_envelope_is_refused() -> None:
    with pytest.raises(InvalidValueError):
        open_arguments(CODECS, canonical_encode("not json"))
    with pytest.raises(CodecError, match="unknown envelope member"):
        open_arguments(CODECS, canonical_encode('{"codec":"json","blob":"[]","x":1}'))


def test_the_sealed_bound_holds_an_envelope_of_arguments_at_the_bound() -> None:
    # The largest arguments the default bound admits, encrypted and enveloped, fit the stored bound.
    big = ["x" * ((1 << 20) - 16)]
    assert len(canonical_encode(big)) <= 1 << 20
    sealed = admitted_arguments(CODECS, envelope(CODECS["aes-gcm"], big), "envelope")
    _, stored = intent_and_stored("signal", "note", sealed, None, 1 << 20)
    assert len(stored) <= sealed_max_size(1 << 20)


@pytest.mark.parametrize("mode", ["Envelope", "cipher", None, b"envelope"])
def test_an_unknown_store_mode_is_refused(mode: object) -> None:
    with pytest.raises(ValueError, match="store_arguments must be one of"):
        check_store_arguments(mode)
