"""The HTTP edge: an ASGI app over the admission service, the payload codecs, and who may call it.

The codecs and the authorisation values (bearer tokens, the hook's request
and principal, the namespace header's encoding) are pure and load at once;
the app needs the ``http`` extra (FastAPI) and loads on first use of its
names, so that ``admission.client``, which shares the codecs, stays
importable without FastAPI.
"""

from typing import TYPE_CHECKING

from admission.http._codecs import (
    AES_GCM_NONCE_SIZE,
    AesGcmCodec,
    BytesCodec,
    CborCodec,
    Codec,
    CodecRegistry,
    JsonCodec,
    codecs_from,
    decode_envelope,
    default_codecs,
    envelope,
    parse_json_value,
    render_json_value,
)
from admission.http._stored import STORE_ARGUMENTS, StoreArguments, open_arguments
from admission.http._token_file import MAX_TOKEN_FILE_BYTES, read_token_file
from admission.http._tokens import (
    DEFAULT_NAMESPACE,
    NAMESPACE_HEADER,
    TOKEN_PREFIX,
    WILDCARD,
    AccessError,
    AuthenticationError,
    Authorizer,
    AuthRequest,
    BearerTokens,
    NamespaceForbiddenError,
    Principal,
    TokenFileError,
    TokenGrant,
    decode_namespace,
    encode_namespace,
    mint_token,
    token_digest,
)

if TYPE_CHECKING:
    from admission.http._app import (
        DEFAULT_MAX_BODY_BYTES,
        DEFAULT_MAX_WAITS,
        DEFAULT_NAMESPACE,
        MAX_WAIT_SECONDS,
        REQUEST_ID_HEADER,
        AdmissionAnswer,
        Envelope,
        ErrorBody,
        SignalRequest,
        UpdateRequest,
        create_app,
    )
    from admission.http._auth import principal_in
    from admission.http._lifecycle import is_engine_path

_APP_NAMES = frozenset(
    {
        "DEFAULT_MAX_BODY_BYTES",
        "DEFAULT_MAX_WAITS",
        "DEFAULT_NAMESPACE",
        "MAX_WAIT_SECONDS",
        "REQUEST_ID_HEADER",
        "AdmissionAnswer",
        "Envelope",
        "ErrorBody",
        "SignalRequest",
        "UpdateRequest",
        "create_app",
    }
)
_AUTH_NAMES = frozenset({"principal_in"})
_LIFECYCLE_NAMES = frozenset({"is_engine_path"})


def __getattr__(name: str) -> object:
    # The app's names, imported on first use: FastAPI is an optional extra.
    if name in _APP_NAMES:
        from admission.http import _app

        return getattr(_app, name)
    if name in _AUTH_NAMES:
        from admission.http import _auth

        return getattr(_auth, name)
    if name in _LIFECYCLE_NAMES:
        from admission.http import _lifecycle

        return getattr(_lifecycle, name)
    raise AttributeError(f"module 'admission.http' has no attribute {name!r}")


__all__ = [
    "AES_GCM_NONCE_SIZE",
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_MAX_WAITS",
    "DEFAULT_NAMESPACE",
    "MAX_TOKEN_FILE_BYTES",
    "MAX_WAIT_SECONDS",
    "NAMESPACE_HEADER",
    "REQUEST_ID_HEADER",
    "STORE_ARGUMENTS",
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
    "StoreArguments",
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
    "open_arguments",
    "parse_json_value",
    "principal_in",
    "read_token_file",
    "render_json_value",
    "token_digest",
]
