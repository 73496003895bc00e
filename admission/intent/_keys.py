"""Command keys: HTTP-input normalisation, validation, receipt tokens (contract §2).

A key names one logical command across retries.  It is compared byte-exact on
its UTF-8 form: case-sensitive and without Unicode normalisation, so ``a`` and
``A``, or the NFC and NFD forms of one text, are different keys.

Pure: no I/O, no clock, no SQLAlchemy.
"""

from __future__ import annotations

import hashlib
import re
from typing import Final

from admission.errors import InvalidCommandTypeError, InvalidRequestIdError, ReservedRequestIdError

__all__ = [
    "MAX_REQUEST_ID_LENGTH",
    "RESERVED_SIGNAL_PREFIX",
    "TOKEN_PATTERN",
    "normalize_request_id",
    "receipt_token",
    "validate_request_id",
    "validated_token",
]

MAX_REQUEST_ID_LENGTH: Final = 255
"""The longest key, in Unicode code points (not bytes)."""

RESERVED_SIGNAL_PREFIX: Final = "workflow-signal:"
"""Keys with this prefix are reserved for engine-internal signal delivery (contract §2.4)."""

TOKEN_PATTERN: Final = re.compile(r"(signal|update)-v1:[0-9a-f]{64}\Z")
"""What a receipt token looks like; a raw legacy key of this shape is ambiguous (contract §6)."""

_COMMAND_TYPES: Final = frozenset({"signal", "update"})


def normalize_request_id(raw: object) -> str | None:
    """Normalise a key as it arrives over HTTP: strip whitespace; blank means no key.

    This is the only place whitespace is removed (``str.strip()``, contract
    §2.1); the core never trims.  ``None`` stays ``None``.  A value that is not
    a string is refused with :class:`InvalidRequestIdError`.
    """
    if raw is None:
        return None
    if type(raw) is not str:
        raise InvalidRequestIdError(f"must be a string, got {type(raw).__name__}", request_id=raw)
    stripped = raw.strip()
    return stripped or None


def _key_bytes(key: object) -> bytes:
    if type(key) is not str:
        raise InvalidRequestIdError(f"must be a string, got {type(key).__name__}", request_id=key)
    length = len(key)
    if length == 0:
        raise InvalidRequestIdError("must not be empty", request_id=key)
    if length > MAX_REQUEST_ID_LENGTH:
        raise InvalidRequestIdError(
            f"has {length} code points; at most {MAX_REQUEST_ID_LENGTH} are allowed", request_id=key
        )
    try:
        return key.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidRequestIdError(
            f"is not valid Unicode: lone surrogate at index {exc.start}", request_id=key
        ) from None


def _check_command_type(command_type: object) -> str:
    if type(command_type) is not str or command_type not in _COMMAND_TYPES:
        raise InvalidCommandTypeError(command_type)
    return command_type


def validate_request_id(key: object, command_type: str) -> str:
    """Check a caller's key for a command of ``command_type`` and return it unchanged.

    Refuses (before any write) a non-string, an empty key, more than 255 code
    points, or lone surrogates (:class:`InvalidRequestIdError`, contract
    §2.3), and a signal key starting with ``workflow-signal:``
    (:class:`ReservedRequestIdError`, contract §2.4).
    """
    _validated(key, command_type)
    assert isinstance(key, str)
    return key


def _validated(key: object, command_type: str) -> bytes:
    """The UTF-8 bytes of a caller's key, after the checks of :func:`validate_request_id`."""
    _check_command_type(command_type)
    raw = _key_bytes(key)
    assert isinstance(key, str)
    if command_type == "signal" and key.startswith(RESERVED_SIGNAL_PREFIX):
        raise ReservedRequestIdError(
            f"keys starting with {RESERVED_SIGNAL_PREFIX!r} are reserved for engine-internal signals",
            request_id=key,
        )
    return raw


def validated_token(key: object, command_type: str) -> tuple[str, str]:
    """:func:`validate_request_id` and :func:`receipt_token` of a caller's key, encoded once."""
    token = _token(command_type, _validated(key, command_type))
    assert isinstance(key, str)
    return key, token


def receipt_token(command_type: str, key: str) -> str:
    """The stored receipt token: ``<type>-v1:`` + hex SHA-256 of the key's UTF-8 bytes.

    The key is checked for length and valid Unicode; the reserved signal prefix
    is not refused here, because the engine's own internal signals need tokens
    too (:func:`validate_request_id` guards caller input).
    """
    return _token(_check_command_type(command_type), _key_bytes(key))


def _token(prefix: str, raw: bytes) -> str:
    """The token of a key's UTF-8 bytes (:func:`receipt_token`), for a checked command type."""
    return f"{prefix}-v1:{hashlib.sha256(raw).hexdigest()}"
