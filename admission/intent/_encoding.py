"""Canonical encoding ``intent-v1``, its strict decoder, and the digests (contract §3).

The bytes are a deterministic subset of CBOR (RFC 8949) defined by the
contract and by ``docs/encoding.md``; this module is the reference
implementation.  A digest stored today must be recomputed bit-for-bit by every
future version and by ports in other languages, so nothing here may change
the bytes of a value it already accepts: a change is a new encoding version.

The encoder is written for speed on the admission hot path: one recursive walk
that validates and writes at once, dispatching on exact types, with the path
of a refused value rebuilt only while an error unwinds.

The optional C extension ``admission.intent._speedups`` produces the same bytes
faster.  The Python walk stays the definition and the fallback: the extension
only answers "these bytes" or "refused", and on a refusal the Python walk is
run to raise the precise :class:`InvalidValueError`.  Without the extension
(no compiler at install time, or ``ADMISSION_PURE_PYTHON=1`` in the
environment) everything works the same, only slower; :data:`ACCELERATED` says
which is in use.

Pure: no I/O, no clock, no SQLAlchemy.
"""

from __future__ import annotations

import hashlib
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, TypeAlias

from admission.errors import InvalidCommandTypeError, InvalidValueError

__all__ = [
    "ACCELERATED",
    "DEFAULT_MAX_SIZE",
    "INTENT_TAG",
    "INTENT_VERSION",
    "MAX_DEPTH",
    "EncodedIntent",
    "Value",
    "arguments_digest",
    "canonical_decode",
    "canonical_encode",
    "encode_intent",
    "intent_digest",
    "intent_record",
]

Value: TypeAlias = (
    "bool | int | float | str | bytes | list[Value] | tuple[Value, ...] | dict[str, Value] | None"
)
"""A value the canonical encoding accepts (tuples decode as lists)."""

INTENT_VERSION: Final = "intent-v1"
"""The name of this encoding and digest scheme, as recorded with every digest."""

INTENT_TAG: Final = "admission/intent/v1"
"""The first element of every intent record (contract §3)."""

MAX_DEPTH: Final = 64
"""Containers may nest at most this deep; the 65th level is refused."""

DEFAULT_MAX_SIZE: Final = 1 << 20
"""Default bound on the encoded size of a value, in bytes (1 MiB)."""

COMMAND_TYPES: Final = ("signal", "update")

_INT64_MAX: Final = (1 << 63) - 1
_NAN: Final = b"\xf9\x7e\x00"
_POS_INF: Final = b"\xf9\x7c\x00"
_NEG_INF: Final = b"\xf9\xfc\x00"
_pack_float: Final = struct.Struct(">Bd").pack
_unpack_double: Final = struct.Struct(">d").unpack_from
_IDENTIFIER: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def _load_accelerator() -> Callable[[object, int], bytes | None] | None:
    # The C extension is optional: without a compiler at install time it is
    # absent and the pure walk is used.  Setting the environment variable
    # ADMISSION_PURE_PYTHON (to anything but "" or "0") makes the extension
    # refuse to load, for debugging, comparing the two and testing the fallback;
    # the extension reads it so that this module stays free of I/O.
    try:
        from admission.intent import _speedups
    except ImportError:
        return None
    return _speedups.encode


_accelerated_encode: Final = _load_accelerator()

ACCELERATED: Final = _accelerated_encode is not None
"""Whether the C extension ``admission.intent._speedups`` encodes (the bytes are the same either way)."""


def _head(major: int, n: int) -> bytes:
    """The initial byte(s) of an item: major type and shortest argument (RFC 8949 §4.2.1)."""
    mt = major << 5
    if n < 24:
        return bytes((mt | n,))
    if n < 0x100:
        return bytes((mt | 24, n))
    if n < 0x10000:
        return struct.pack(">BH", mt | 25, n)
    if n < 0x100000000:
        return struct.pack(">BI", mt | 26, n)
    return struct.pack(">BQ", mt | 27, n)


# Heads for the small lengths that make up most of a payload, built once.
_UINT_HEAD: Final = tuple(_head(0, n) for n in range(256))
_NINT_HEAD: Final = tuple(_head(1, n) for n in range(256))
_BYTES_HEAD: Final = tuple(_head(2, n) for n in range(256))
_TEXT_HEAD: Final = tuple(_head(3, n) for n in range(256))
_ARRAY_HEAD: Final = tuple(_head(4, n) for n in range(256))
_MAP_HEAD: Final = tuple(_head(5, n) for n in range(256))


class _Refusal(Exception):
    """Raised inside the walk; containers add their path segment while it unwinds."""

    def __init__(self, reason: str, offset: int | None = None, *, whole: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.offset = offset
        # A size refusal is about the whole value, not the item that happened
        # to cross the bound: its path is always "$".
        self.whole = whole
        self.segments: list[int | str] = []

    def error(self, field: str) -> InvalidValueError:
        path = "$" if self.whole else _render_path(reversed(self.segments))
        return InvalidValueError(self.reason, field=field, path=path, offset=self.offset)


def _render_path(segments: object) -> str:
    parts = ["$"]
    for seg in segments:  # type: ignore[attr-defined]
        if isinstance(seg, int):
            parts.append(f"[{seg}]")
        elif _IDENTIFIER.match(seg):
            parts.append(f".{seg}")
        else:
            parts.append("[" + _quote(seg) + "]")
    return "".join(parts)


def _quote(key: str) -> str:
    # A path must be printable even when the key is not valid Unicode.
    return '"' + key.encode("unicode_escape", "backslashreplace").decode("ascii").replace('"', '\\"') + '"'


def _type_name(value: object) -> str:
    return type(value).__qualname__


def _encode_item(value: object, out: bytearray, depth: int, limit: int) -> None:
    """Append the canonical encoding of ``value`` to ``out``.

    ``limit`` is the absolute length ``out`` may reach; it is checked at every
    container so that a small structure sharing references (``[x, x]`` nested
    deeply) cannot expand without bound before the size check.
    """
    t = type(value)
    if t is str:
        try:
            raw = value.encode("utf-8")  # type: ignore[attr-defined]
        except UnicodeEncodeError as exc:
            raise _Refusal(f"text contains a lone surrogate at index {exc.start}") from None
        n = len(raw)
        out += _TEXT_HEAD[n] if n < 256 else _head(3, n)
        out += raw
    elif t is int:
        if value >= 0:  # type: ignore[operator]
            if value < 256:  # type: ignore[operator]
                out += _UINT_HEAD[value]  # type: ignore[call-overload]
            elif value <= _INT64_MAX:  # type: ignore[operator]
                out += _head(0, value)  # type: ignore[arg-type]
            else:
                raise _Refusal("integer above the int64 range (2^63-1); bignums are not encoded")
        else:
            n = -1 - value  # type: ignore[operator]
            if n < 256:
                out += _NINT_HEAD[n]
            elif n <= _INT64_MAX:
                out += _head(1, n)
            else:
                raise _Refusal("integer below the int64 range (-2^63); bignums are not encoded")
    elif t is dict:
        if depth >= MAX_DEPTH:
            raise _Refusal(f"nesting deeper than {MAX_DEPTH} levels")
        if len(out) > limit:
            raise _Refusal("encoded size exceeds the limit", whole=True)
        n = len(value)  # type: ignore[arg-type]
        out += _MAP_HEAD[n] if n < 256 else _head(5, n)
        try:
            keys = sorted(value)  # type: ignore[call-overload]
        except TypeError:
            keys = list(value)  # type: ignore[call-overload]
        depth += 1
        for key in keys:
            if type(key) is not str:
                raise _Refusal(f"map key {key!r} is {_type_name(key)}; map keys must be str")
            # Code-point order equals the raw UTF-8 byte order the contract
            # asks for, because lone surrogates are refused here.
            try:
                raw = key.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise _Refusal(f"map key {key!r} contains a lone surrogate at index {exc.start}") from None
            n = len(raw)
            out += _TEXT_HEAD[n] if n < 256 else _head(3, n)
            out += raw
            try:
                _encode_item(value[key], out, depth, limit)  # type: ignore[index]
            except _Refusal as refusal:
                refusal.segments.append(key)
                raise
    elif t is list or t is tuple:
        if depth >= MAX_DEPTH:
            raise _Refusal(f"nesting deeper than {MAX_DEPTH} levels")
        if len(out) > limit:
            raise _Refusal("encoded size exceeds the limit", whole=True)
        n = len(value)  # type: ignore[arg-type]
        out += _ARRAY_HEAD[n] if n < 256 else _head(4, n)
        item = None
        try:
            depth += 1
            for item in value:  # type: ignore[attr-defined]
                _encode_item(item, out, depth, limit)
        except _Refusal as refusal:
            # Identity finds the failing element: an equal object earlier in
            # the list would have failed first.
            refusal.segments.append(next(i for i, x in enumerate(value) if x is item))  # type: ignore[arg-type, var-annotated]
            raise
    elif t is float:
        if value - value == 0.0:  # type: ignore[operator]
            out += _pack_float(0xFB, value)
        elif value != value:
            out += _NAN
        elif value > 0:  # type: ignore[operator]
            out += _POS_INF
        else:
            out += _NEG_INF
    elif t is bool:
        out += b"\xf5" if value else b"\xf4"
    elif value is None:
        out += b"\xf6"
    elif t is bytes:
        n = len(value)  # type: ignore[arg-type]
        out += _BYTES_HEAD[n] if n < 256 else _head(2, n)
        out += value  # type: ignore[arg-type]
    else:
        raise _Refusal(
            f"{_type_name(value)} is not encodable"
            " (allowed: None, bool, int, float, str, bytes, list, tuple, dict)"
        )


def _encode_into(value: object, out: bytearray, max_size: int, field: str) -> None:
    start = len(out)
    try:
        _encode_item(value, out, 0, start + max_size)
        if len(out) - start > max_size:
            raise _Refusal("encoded size exceeds the limit", whole=True)
    except _Refusal as refusal:
        if refusal.whole:
            refusal.reason = f"encoded size exceeds the limit of {max_size} bytes"
        raise refusal.error(field) from None


def _python_encode(value: object, max_size: int = DEFAULT_MAX_SIZE) -> bytes:
    """The pure-Python reference encoder, bypassing the C extension.

    The same bytes and the same :class:`InvalidValueError` as
    :func:`canonical_encode`; kept callable so that tests can compare the two.
    """
    _check_max_size(max_size)
    out = bytearray()
    _encode_into(value, out, max_size, "value")
    return bytes(out)


def _encode(value: object, max_size: int, field: str) -> bytes:
    """The encoding of ``value``: by the C extension if present, else (or to explain a refusal) in Python."""
    if _accelerated_encode is not None:
        encoded = _accelerated_encode(value, max_size)
        if encoded is not None:
            return encoded
    # Refused by the extension, or no extension: the Python walk raises the
    # precise error (and is the definition of the bytes should the two disagree).
    out = bytearray()
    _encode_into(value, out, max_size, field)
    return bytes(out)


def _check_max_size(max_size: int) -> None:
    if type(max_size) is not int or max_size < 1:
        raise ValueError(f"max_size must be a positive int, got {max_size!r}")


def canonical_encode(value: object, *, max_size: int = DEFAULT_MAX_SIZE) -> bytes:
    """Encode ``value`` in the canonical ``intent-v1`` form (contract §3).

    Raises :class:`InvalidValueError` naming the path of the first refused
    value (a non-encodable type, an int outside int64, a non-str map key, a
    lone surrogate, nesting deeper than 64, or more than ``max_size`` bytes).
    Nothing is returned on refusal.
    """
    _check_max_size(max_size)
    return _encode(value, max_size, "value")


def _text_field(value: object, field: str) -> bytes:
    if type(value) is not str:
        raise InvalidValueError(f"must be str, got {_type_name(value)}", field=field, path="")
    if not value:
        raise InvalidValueError("must not be empty", field=field, path="")
    try:
        raw = value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidValueError(
            f"contains a lone surrogate at index {exc.start}", field=field, path=""
        ) from None
    return _head(3, len(raw)) + raw


_RECORD_PREFIX: Final = b"\x85" + _head(3, len(INTENT_TAG)) + INTENT_TAG.encode("ascii")
_TYPE_ITEMS: Final = {t: _head(3, len(t)) + t.encode("ascii") for t in COMMAND_TYPES}


@dataclass(frozen=True)
class EncodedIntent:
    """A command's intent, encoded once: the bytes a receipt stores and both digests."""

    arguments: bytes
    """The canonical encoding of the arguments alone."""
    record: bytes
    """The canonical encoding of the intent record."""
    digest: str
    """The intent digest: lowercase hex SHA-256 of ``record``."""
    arguments_digest: str
    """Lowercase hex SHA-256 of ``arguments``."""


def _check_arguments(arguments: object) -> None:
    if type(arguments) not in (list, tuple, dict):
        raise InvalidValueError(f"must be a list or a map, got {_type_name(arguments)}", field="arguments")


def _encode_record(
    command_type: str, name: str, arguments: object, target: str | None, max_size: int
) -> tuple[bytes, bytes]:
    """(arguments bytes, record bytes), with the arguments encoded once."""
    _check_max_size(max_size)
    type_item = _TYPE_ITEMS.get(command_type) if type(command_type) is str else None
    if type_item is None:
        raise InvalidCommandTypeError(command_type)
    name_item = _text_field(name, "name")
    target_item = b"\xf6" if target is None else _text_field(target, "target")
    _check_arguments(arguments)
    encoded = _encode(arguments, max_size, "arguments")
    return encoded, b"".join((_RECORD_PREFIX, type_item, name_item, encoded, target_item))


def intent_record(
    command_type: str,
    name: str,
    arguments: object,
    target: str | None = None,
    *,
    max_size: int = DEFAULT_MAX_SIZE,
) -> bytes:
    """The canonical bytes of the intent record (contract §3).

    The record is the 5-element array ``["admission/intent/v1", command_type,
    name, arguments, target]``.  ``arguments`` must be a list or a map; the
    depth and size limits apply to the arguments themselves, not to the
    surrounding record.  ``target`` is ``None`` for instance scope or the
    selected run id for run scope.
    """
    return _encode_record(command_type, name, arguments, target, max_size)[1]


def intent_digest(
    command_type: str,
    name: str,
    arguments: object,
    target: str | None = None,
    *,
    max_size: int = DEFAULT_MAX_SIZE,
) -> str:
    """Lowercase hex SHA-256 of :func:`intent_record` (contract §3)."""
    return hashlib.sha256(_encode_record(command_type, name, arguments, target, max_size)[1]).hexdigest()


def encode_intent(
    command_type: str,
    name: str,
    arguments: object,
    target: str | None = None,
    *,
    max_size: int = DEFAULT_MAX_SIZE,
) -> EncodedIntent:
    """Encode an intent once and return its bytes and digests (what admission stores)."""
    encoded, record = _encode_record(command_type, name, arguments, target, max_size)
    return EncodedIntent(
        encoded, record, hashlib.sha256(record).hexdigest(), hashlib.sha256(encoded).hexdigest()
    )


def arguments_digest(arguments: object, *, max_size: int = DEFAULT_MAX_SIZE) -> str:
    """Lowercase hex SHA-256 of the canonical encoding of ``arguments`` alone.

    Kept beside the intent digest so that a conflict can say whether the
    arguments differ (contract §3).  ``arguments`` must be a list or a map.
    """
    _check_max_size(max_size)
    _check_arguments(arguments)
    return hashlib.sha256(_encode(arguments, max_size, "arguments")).hexdigest()


# --------------------------------------------------------------------------
# Strict decoding: exactly the bytes the encoder produces, nothing else.


def _read_argument(data: bytes, pos: int, ai: int) -> tuple[int, int]:
    """Read the argument of the item whose initial byte is at ``pos``.

    Refuses indefinite lengths, reserved additional information, truncation and
    any argument not in its shortest form.
    """
    if ai < 24:
        return ai, pos + 1
    if ai > 27:
        raise _Refusal(
            "indefinite length is not allowed" if ai == 31 else f"reserved additional information {ai}",
            pos,
        )
    width = 1 << (ai - 24)
    end = pos + 1 + width
    if end > len(data):
        raise _Refusal("truncated: the item's argument runs past the end", pos)
    arg = int.from_bytes(data[pos + 1 : end], "big")
    if arg < (24 if width == 1 else 1 << (4 * width)):
        raise _Refusal(f"argument {arg} is not in its shortest form", pos)
    return arg, end


_Decoded: TypeAlias = "tuple[Value, int]"


def _decode_simple(data: bytes, pos: int, ai: int) -> _Decoded:
    if ai == 20:
        return False, pos + 1
    if ai == 21:
        return True, pos + 1
    if ai == 22:
        return None, pos + 1
    if ai == 25:
        half = data[pos + 1 : pos + 3]
        if len(half) < 2:
            raise _Refusal("truncated half-precision float", pos)
        if half == b"\x7e\x00":
            return float("nan"), pos + 3
        if half == b"\x7c\x00":
            return float("inf"), pos + 3
        if half == b"\xfc\x00":
            return float("-inf"), pos + 3
        raise _Refusal("half-precision float other than f97e00 (NaN), f97c00 (+inf), f9fc00 (-inf)", pos)
    if ai == 27:
        if pos + 9 > len(data):
            raise _Refusal("truncated double-precision float", pos)
        (number,) = _unpack_double(data, pos + 1)
        if number - number != 0.0:
            raise _Refusal("NaN and infinities must use their 3-byte form, not 8 bytes", pos)
        return number, pos + 9
    if ai == 26:
        raise _Refusal("single-precision floats are not allowed; finite floats are 8 bytes", pos)
    if ai == 23:
        raise _Refusal("the simple value 'undefined' is not allowed", pos)
    if ai == 31:
        raise _Refusal("unexpected break code (indefinite lengths are not allowed)", pos)
    raise _Refusal("simple values other than false, true and null are not allowed", pos)


def _decode_item(data: bytes, pos: int, depth: int) -> _Decoded:
    if pos >= len(data):
        raise _Refusal("truncated: expected another item", pos)
    initial = data[pos]
    major = initial >> 5
    ai = initial & 0x1F
    if major == 7:
        return _decode_simple(data, pos, ai)
    if major == 6:
        raise _Refusal("tags are not allowed", pos)
    arg, body = _read_argument(data, pos, ai)
    if major == 0:
        if arg > _INT64_MAX:
            raise _Refusal("integer above the int64 range", pos)
        return arg, body
    if major == 1:
        if arg > _INT64_MAX:
            raise _Refusal("integer below the int64 range", pos)
        return -1 - arg, body
    if major == 2 or major == 3:
        end = body + arg
        if end > len(data):
            raise _Refusal("truncated: string runs past the end", pos)
        chunk = bytes(data[body:end])
        if major == 2:
            return chunk, end
        try:
            return chunk.decode("utf-8"), end
        except UnicodeDecodeError as exc:
            raise _Refusal(f"invalid UTF-8 at byte {body + exc.start}", pos) from None
    if depth >= MAX_DEPTH:
        raise _Refusal(f"nesting deeper than {MAX_DEPTH} levels", pos)
    # Every item takes at least one byte: a count larger than what is left is
    # refused before any allocation.
    if arg > len(data) - body:
        raise _Refusal(f"truncated: {arg} items announced, fewer bytes remain", pos)
    if major == 4:
        items: list[Value] = []
        index = 0
        try:
            for index in range(arg):  # noqa: B007 - the index names the path on refusal
                item, body = _decode_item(data, body, depth + 1)
                items.append(item)
        except _Refusal as refusal:
            refusal.segments.append(index)
            raise
        return items, body
    result: dict[str, Value] = {}
    previous = b""
    key: str | None = None
    try:
        for index in range(arg):
            key_pos = body
            if body >= len(data):
                raise _Refusal("truncated: expected a map key", body)
            if data[body] >> 5 != 3:
                raise _Refusal("map key must be a text string", body)
            key_len, key_start = _read_argument(data, body, data[body] & 0x1F)
            key_end = key_start + key_len
            if key_end > len(data):
                raise _Refusal("truncated: map key runs past the end", body)
            raw_key = bytes(data[key_start:key_end])
            if index and raw_key <= previous:
                raise _Refusal(
                    "duplicate map key"
                    if raw_key == previous
                    else "map keys not sorted by their UTF-8 bytes",
                    key_pos,
                )
            try:
                key = raw_key.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise _Refusal(f"invalid UTF-8 in map key at byte {key_start + exc.start}", key_pos) from None
            previous = raw_key
            result[key], body = _decode_item(data, key_end, depth + 1)
            key = None
    except _Refusal as refusal:
        if key is not None:
            refusal.segments.append(key)
        raise
    return result, body


def canonical_decode(data: bytes, *, max_size: int = DEFAULT_MAX_SIZE) -> Value:
    """Decode canonical ``intent-v1`` bytes, refusing anything not canonical.

    Accepts exactly the bytes :func:`canonical_encode` produces: for every
    accepted input, ``canonical_encode(canonical_decode(data)) == data``.
    Raises :class:`InvalidValueError` (``field="data"``) with the byte offset
    and the path of the refused item otherwise.
    """
    _check_max_size(max_size)
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise InvalidValueError(f"must be bytes, got {_type_name(data)}", field="data", path="")
    buf = bytes(data)
    if len(buf) > max_size:
        raise InvalidValueError(
            f"{len(buf)} bytes exceed the limit of {max_size} bytes", field="data", path=""
        )
    try:
        value, end = _decode_item(buf, 0, 0)
    except _Refusal as refusal:
        raise refusal.error("data") from None
    if end != len(buf):
        raise InvalidValueError(
            f"{len(buf) - end} trailing bytes after the value", field="data", path="", offset=end
        )
    return value
