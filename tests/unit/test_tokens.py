"""Bearer tokens and the namespace header, as pure values: parsing, matching, encoding."""

from __future__ import annotations

import hmac
import inspect
import json
import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import admission.http
from admission.errors import InvalidValueError
from admission.http import (
    WILDCARD,
    AuthenticationError,
    AuthRequest,
    BearerTokens,
    NamespaceForbiddenError,
    Principal,
    TokenFileError,
    TokenGrant,
    _tokens,
    decode_namespace,
    encode_namespace,
    mint_token,
    read_token_file,
    token_digest,
)

TOKEN_A = "adm_" + "a" * 64
TOKEN_B = "adm_" + "b" * 64


def tokens() -> BearerTokens:
    return BearerTokens(
        [
            TokenGrant("engine-a", token_digest(TOKEN_A), ("a", "über")),
            TokenGrant("operator", token_digest(TOKEN_B), (WILDCARD,)),
        ]
    )


def request(namespace: str, authorization: str | None) -> AuthRequest:
    headers = {} if authorization is None else {"authorization": authorization}
    return AuthRequest(namespace, headers)


def test_the_http_face_is_pinned() -> None:
    assert sorted(admission.http.__all__) == sorted(
        [
            "AES_GCM_NONCE_SIZE",
            "DEFAULT_MAX_BODY_BYTES",
            "DEFAULT_MAX_WAITS",
            "DEFAULT_NAMESPACE",
            "MAX_TOKEN_FILE_BYTES",
            "MAX_WAIT_SECONDS",
            "NAMESPACE_HEADER",
            "REQUEST_ID_HEADER",
            "STORE_ARGUMENTS",
            "StoreArguments",
            "open_arguments",
            "TOKEN_PREFIX",
            "WILDCARD",
            "AccessError",
            "AdmissionAnswer",
            "AesGcmCodec",
            "AuthRequest",
            "AuthenticationError",
            "Authorizer",
            "BearerTokens",
            "BytesCodec",
            "CborCodec",
            "Codec",
            "CodecRegistry",
            "Envelope",
            "ErrorBody",
            "JsonCodec",
            "NamespaceForbiddenError",
            "Principal",
            "SignalRequest",
            "TokenFileError",
            "TokenGrant",
            "UpdateRequest",
            "codecs_from",
            "create_app",
            "decode_envelope",
            "decode_namespace",
            "default_codecs",
            "encode_namespace",
            "envelope",
            "is_engine_path",
            "mint_token",
            "parse_json_value",
            "principal_in",
            "read_token_file",
            "render_json_value",
            "token_digest",
        ]
    )
    for name in admission.http.__all__:
        obj = getattr(admission.http, name)
        if inspect.isclass(obj) or inspect.isfunction(obj):
            assert inspect.getdoc(obj), name


# -- minting and matching -----------------------------------------------------------------


def test_a_minted_token_is_the_prefix_and_the_hex_of_32_random_bytes() -> None:
    assert mint_token(lambda n: bytes(range(n))) == "adm_" + bytes(range(32)).hex()
    with pytest.raises(ValueError, match="returned 3 bytes"):
        mint_token(lambda n: b"abc")


def test_a_granted_token_is_let_into_its_namespaces_only() -> None:
    authorize = tokens()
    assert authorize(request("a", f"Bearer {TOKEN_A}")) == Principal("engine-a")
    assert authorize(request("über", f"bearer {TOKEN_A}")) == Principal("engine-a")  # scheme: any case
    with pytest.raises(NamespaceForbiddenError) as refused:
        authorize(request("b", f"Bearer {TOKEN_A}"))
    assert (refused.value.namespace, refused.value.principal, refused.value.status) == ("b", "engine-a", 403)
    assert TOKEN_A not in str(refused.value)
    # The wildcard grants every namespace, including one literally named "*".
    for namespace in ("a", "b", "*", "über"):
        assert authorize(request(namespace, f"Bearer {TOKEN_B}")) == Principal("operator")


@pytest.mark.parametrize(
    ("authorization", "invalid"),
    [
        (None, False),
        ("", False),
        (f"Basic {TOKEN_A}", False),
        ("Bearer", False),
        (f"Bearer {TOKEN_A} extra", False),
        ("Bearer adm_" + "c" * 64, True),
        (f"Bearer {TOKEN_A[:-1]}", True),
        (f"Bearer {token_digest(TOKEN_A)}", True),  # the stored hash is not a token
    ],
)
def test_no_token_or_an_unknown_one_is_unauthenticated(authorization: str | None, invalid: bool) -> None:
    with pytest.raises(AuthenticationError) as refused:
        tokens()(request("a", authorization))
    assert (refused.value.status, refused.value.code, refused.value.invalid) == (
        401,
        "unauthenticated",
        invalid,
    )
    assert TOKEN_A not in str(refused.value)


def test_every_grant_is_compared_with_hmac_compare_digest(monkeypatch: pytest.MonkeyPatch) -> None:
    compared: list[tuple[str, str]] = []
    compare = hmac.compare_digest

    def spy(left: str, right: str) -> bool:
        compared.append((left, right))
        return compare(left, right)

    monkeypatch.setattr(_tokens.hmac, "compare_digest", spy)
    authorize = tokens()
    assert authorize(request("a", f"Bearer {TOKEN_A}")) == Principal("engine-a")
    # Both grants were compared, though the first matched: no early exit.
    digests = [grant.sha256 for grant in authorize.grants]
    assert compared == [(digest, token_digest(TOKEN_A)) for digest in digests]


@given(st.lists(st.binary(min_size=32, max_size=32), min_size=1, max_size=6, unique=True), st.data())
def test_a_token_is_found_exactly_when_its_hash_is_listed(secrets: list[bytes], data: st.DataObject) -> None:
    minted = [mint_token(lambda _n, s=s: s) for s in secrets]  # type: ignore[misc]
    listed = data.draw(st.lists(st.sampled_from(minted), unique=True))
    authorize = BearerTokens(TokenGrant(f"t{i}", token_digest(t), ("ns",)) for i, t in enumerate(listed))
    for token in minted:
        grant = authorize.grant_for(token)
        assert (grant is not None) == (token in listed)
        assert grant is None or grant.sha256 == token_digest(token)


# -- the file format ------------------------------------------------------------------------


def test_a_token_file_round_trips_and_holds_no_token() -> None:
    text = tokens().to_json()
    assert TOKEN_A not in text and TOKEN_B not in text
    assert json.loads(text)["version"] == 1
    again = BearerTokens.from_json(text)
    assert again.grants == tokens().grants
    # The version may be left out, as in a hand-written file.
    assert BearerTokens.from_json(json.dumps({"tokens": []})).grants == ()


SHA = token_digest(TOKEN_A)


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("", "file"),
        ("[]", "file"),
        ('{"tokens": [], "tokens": []}', "file"),
        ('{"tokens": {}}', "tokens"),
        ('{"version": 2, "tokens": []}', "version"),
        ('{"version": true, "tokens": []}', "version"),
        ('{"tokens": [], "extra": 1}', "extra"),
        ('{"tokens": ["x"]}', "tokens[0]"),
        ('{"tokens": [{"name": "a", "namespaces": ["a"]}]}', "tokens[0].sha256"),
        (
            f'{{"tokens": [{{"name": "a", "sha256": "{SHA.upper()}", "namespaces": ["a"]}}]}}',
            "tokens[0].sha256",
        ),
        (f'{{"tokens": [{{"name": "a", "sha256": "{SHA}", "namespaces": []}}]}}', "tokens[0].namespaces"),
        (f'{{"tokens": [{{"name": "a", "sha256": "{SHA}", "namespaces": "a"}}]}}', "tokens[0].namespaces"),
        (
            f'{{"tokens": [{{"name": "a", "sha256": "{SHA}", "namespaces": [""]}}]}}',
            "tokens[0].namespaces[0]",
        ),
        (
            f'{{"tokens": [{{"name": "a", "sha256": "{SHA}", "namespaces": ["a", "a"]}}]}}',
            "tokens[0].namespaces[1]",
        ),
        (f'{{"tokens": [{{"name": "", "sha256": "{SHA}", "namespaces": ["a"]}}]}}', "tokens[0].name"),
        (f'{{"tokens": [{{"name": "a\\n", "sha256": "{SHA}", "namespaces": ["a"]}}]}}', "tokens[0].name"),
        (
            f'{{"tokens": [{{"name": "a", "sha256": "{SHA}", "namespaces": ["a"], "token": "{TOKEN_A}"}}]}}',
            "tokens[0].token",
        ),
        (
            f'{{"tokens": [{{"name": "a", "sha256": "{SHA}", "namespaces": ["a"]}},'
            f' {{"name": "a", "sha256": "{token_digest(TOKEN_B)}", "namespaces": ["a"]}}]}}',
            "tokens[1].name",
        ),
        (
            f'{{"tokens": [{{"name": "a", "sha256": "{SHA}", "namespaces": ["a"]}},'
            f' {{"name": "b", "sha256": "{SHA}", "namespaces": ["a"]}}]}}',
            "tokens[1].sha256",
        ),
    ],
)
def test_a_malformed_token_file_is_refused_naming_the_place_never_a_value(text: str, field: str) -> None:
    with pytest.raises(TokenFileError) as refused:
        BearerTokens.from_json(text)
    assert refused.value.field == field
    assert SHA not in str(refused.value) and TOKEN_A not in str(refused.value)


def test_reading_a_token_file_refuses_one_others_may_write(tmp_path: Path) -> None:
    path = tmp_path / "tokens.json"
    path.write_text(tokens().to_json(), encoding="utf-8")
    path.chmod(0o600)
    assert read_token_file(path).grants == tokens().grants
    path.chmod(0o620)
    with pytest.raises(TokenFileError, match="writable by its group or others"):
        read_token_file(path)
    path.chmod(0o600)
    path.write_bytes(b'{"tokens": [], "x": "\xff"}')
    with pytest.raises(TokenFileError, match="not UTF-8"):
        read_token_file(path)
    with pytest.raises(TokenFileError, match="cannot read"):
        read_token_file(tmp_path / "missing.json")
    if Path(os.devnull).exists():
        with pytest.raises(TokenFileError, match="not a regular file"):
            read_token_file(os.devnull)


# -- the namespace header -------------------------------------------------------------------


NAMESPACES = st.text(st.characters(exclude_categories=["Cs"]), min_size=1, max_size=40)


@given(NAMESPACES)
def test_every_namespace_round_trips_through_the_header(namespace: str) -> None:
    sent = encode_namespace(namespace)
    assert sent.isascii() and sent.isprintable() and " " not in sent
    assert decode_namespace([sent.encode("ascii")]) == namespace


@given(st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E, exclude_characters="%"), min_size=1))
def test_an_ascii_namespace_without_percent_is_sent_unchanged(namespace: str) -> None:
    assert encode_namespace(namespace) == namespace


def test_the_header_absent_is_the_default_namespace() -> None:
    assert decode_namespace([]) == "default"
    assert decode_namespace([b"%C3%BCber"]) == "über"
    assert decode_namespace([b"50%25"]) == "50%"


@pytest.mark.parametrize(
    ("values", "words"),
    [
        ([b"\xfcber"], "raw non-ASCII"),  # über in Latin-1
        (["über".encode()], "raw non-ASCII"),  # über in UTF-8, unencoded
        ([b"100%"], "starts no %XX escape"),
        ([b"%zz"], "starts no %XX escape"),
        ([b"%FCber"], "not UTF-8"),  # percent-encoded Latin-1
        ([b"a", b"b"], "sent 2 times"),
    ],
)
def test_a_namespace_header_that_cannot_be_read_is_refused(values: list[bytes], words: str) -> None:
    with pytest.raises(InvalidValueError) as refused:
        decode_namespace(values)
    assert refused.value.field == "namespace"
    assert "X-Namespace" in str(refused.value) and words in str(refused.value)
