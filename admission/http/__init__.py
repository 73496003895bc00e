"""The HTTP edge: an ASGI app over the admission service, and the payload codecs.

The codecs are pure and load at once; the app needs the ``http`` extra
(FastAPI) and loads on first use of its names, so that ``admission.client``,
which shares the codecs, stays importable without FastAPI.
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

if TYPE_CHECKING:
    from admission.http._app import (
        DEFAULT_MAX_BODY_BYTES,
        DEFAULT_MAX_WAITS,
        DEFAULT_NAMESPACE,
        MAX_WAIT_SECONDS,
        NAMESPACE_HEADER,
        REQUEST_ID_HEADER,
        AdmissionAnswer,
        Envelope,
        ErrorBody,
        SignalRequest,
        UpdateRequest,
        create_app,
    )

_APP_NAMES = frozenset(
    {
        "DEFAULT_MAX_BODY_BYTES",
        "DEFAULT_MAX_WAITS",
        "DEFAULT_NAMESPACE",
        "MAX_WAIT_SECONDS",
        "NAMESPACE_HEADER",
        "REQUEST_ID_HEADER",
        "AdmissionAnswer",
        "Envelope",
        "ErrorBody",
        "SignalRequest",
        "UpdateRequest",
        "create_app",
    }
)


def __getattr__(name: str) -> object:
    # The app's names, imported on first use: FastAPI is an optional extra.
    if name in _APP_NAMES:
        from admission.http import _app

        return getattr(_app, name)
    raise AttributeError(f"module 'admission.http' has no attribute {name!r}")


__all__ = [
    "AES_GCM_NONCE_SIZE",
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_MAX_WAITS",
    "DEFAULT_NAMESPACE",
    "MAX_WAIT_SECONDS",
    "NAMESPACE_HEADER",
    "REQUEST_ID_HEADER",
    "STORE_ARGUMENTS",
    "AdmissionAnswer",
    "AesGcmCodec",
    "BytesCodec",
    "CborCodec",
    "Codec",
    "CodecRegistry",
    "Envelope",
    "ErrorBody",
    "JsonCodec",
    "SignalRequest",
    "StoreArguments",
    "UpdateRequest",
    "codecs_from",
    "create_app",
    "decode_envelope",
    "default_codecs",
    "envelope",
    "open_arguments",
    "parse_json_value",
    "render_json_value",
]
