"""What the commands table keeps of arguments that arrived in an envelope (docs/http.md).

The HTTP adapter stores arguments in one of two modes, chosen once per app
(``create_app(store_arguments=...)``, ``admission serve --store-envelope``):

- ``"plaintext"`` (the default): the decoded arguments, as their canonical
  encoding, whatever the codec: an ``aes-gcm`` blob is stored decrypted.
- ``"envelope"``: the envelope exactly as received (its ``codec`` and its
  ``blob``, unchanged), as the canonical encoding of its JSON text.  The
  intent digest is still over the decoded plaintext (contract §3), computed
  and then dropped: the database never holds the plaintext of an encrypted
  blob, and whoever reads the arguments back needs the codec's key
  (:func:`open_arguments`).

Pure: no I/O, no clock, no SQLAlchemy.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final, Literal

from admission.errors import InvalidValueError
from admission.http._codecs import Codec, decode_envelope, parse_json_value
from admission.intent._encoding import DEFAULT_MAX_SIZE, Value, canonical_decode
from admission.receipts._sealed import SealedArguments, envelope_text, sealed_max_size

__all__ = [
    "STORE_ARGUMENTS",
    "StoreArguments",
    "admitted_arguments",
    "check_store_arguments",
    "open_arguments",
]

StoreArguments = Literal["plaintext", "envelope"]
"""How the HTTP adapter stores the arguments of a command: decoded, or the envelope as received."""
STORE_ARGUMENTS: Final[tuple[StoreArguments, ...]] = ("plaintext", "envelope")
"""The values ``create_app(store_arguments=...)`` accepts."""


def check_store_arguments(mode: object) -> StoreArguments:
    """``mode`` if it is one of :data:`STORE_ARGUMENTS`; raises ``ValueError`` otherwise."""
    for known in STORE_ARGUMENTS:
        if mode == known and type(mode) is str:
            return known
    raise ValueError(f"store_arguments must be one of {', '.join(STORE_ARGUMENTS)}, not {mode!r}")


def admitted_arguments(
    registry: Mapping[str, Codec], received: Mapping[str, object], mode: StoreArguments
) -> Value | SealedArguments:
    """What the service is given for an envelope ``received`` in a request body.

    The envelope is always decoded (a blob that fails authentication is
    refused, 422, nothing written).  In ``"plaintext"`` mode the result is the
    decoded arguments; in ``"envelope"`` mode it is :class:`SealedArguments`:
    the plaintext for the digest, and the envelope's JSON text to store.
    """
    plaintext = decode_envelope(registry, dict(received))
    if mode == "plaintext":
        return plaintext
    # decode_envelope accepted it, so it has exactly the string members codec and blob.
    codec, blob = received["codec"], received["blob"]
    assert isinstance(codec, str) and isinstance(blob, str)
    return SealedArguments(plaintext, envelope_text(codec, blob))


def open_arguments(registry: Mapping[str, Codec], data: bytes, *, max_size: int = DEFAULT_MAX_SIZE) -> Value:
    """The arguments a command's stored bytes (``workflow_commands.arguments``) hold, in either mode.

    Plaintext rows decode to their list or map.  A row stored in
    ``"envelope"`` mode decodes to a text, the envelope's JSON, which is
    decoded again with ``registry``: an encrypted blob needs the codec that
    holds its key (AES-GCM authenticates, so a wrong key is refused, never
    misread).  Raises :class:`~admission.errors.InvalidValueError` (a
    :class:`~admission.errors.CodecError` for the envelope) naming the field.
    """
    value = canonical_decode(data, max_size=sealed_max_size(max_size))
    if isinstance(value, (list, dict)):
        return value
    if type(value) is not str:
        raise InvalidValueError(
            f"stored arguments must be a list, a map or an envelope, got {type(value).__name__}",
            field="arguments",
            path="",
        )
    return decode_envelope(registry, parse_json_value(value, "arguments"))
