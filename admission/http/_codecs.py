"""Payload codecs: how a command's arguments travel in an HTTP body.

An envelope is the JSON object ``{"codec": NAME, "blob": TEXT}``.  The codec
turns the blob back into a typed value; admission then digests that value, so
the intent digest is ALWAYS over the decoded plaintext (contract §3): two
encryptions of the same arguments under different nonces are one intent, and
a retry of either is retained.

Three codecs:

- ``json`` (:class:`JsonCodec`): the blob is JSON text, parsed so that ``1``
  and ``1.0`` stay apart, ``-0.0`` keeps its sign, ``NaN`` / ``Infinity``
  survive, and duplicate object keys are refused.  JSON cannot carry bytes.
- ``cbor`` (:class:`CborCodec`): the blob is standard base64 of the canonical
  ``intent-v1`` CBOR of the value, decoded strictly (non-canonical bytes are
  refused, see ``docs/encoding.md``).
- ``aes-gcm`` (:class:`AesGcmCodec`): the blob is base64 of a 12-byte random
  nonce followed by the AES-GCM ciphertext and tag of the inner codec's bytes
  (canonical CBOR by default).  The application supplies the key; a blob that
  fails authentication is refused like any other bad input.

Every refusal is a :class:`CodecError`, an :class:`InvalidValueError` with
``field="input"``, so the HTTP adapter answers 422 ``input_invalid`` and
writes nothing.

Pure: no I/O, no clock, no SQLAlchemy.  Randomness (the AES-GCM nonce) is a
parameter.  ``cryptography`` is imported only when an :class:`AesGcmCodec` is
built, so the core stays importable without the ``http`` extra.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import secrets
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Final, Protocol, runtime_checkable

from admission.errors import AdmissionError, CodecError, InvalidValueError
from admission.intent._encoding import DEFAULT_MAX_SIZE, Value, canonical_decode, canonical_encode

__all__ = [
    "AES_GCM_NONCE_SIZE",
    "AesGcmCodec",
    "BytesCodec",
    "CborCodec",
    "Codec",
    "CodecRegistry",
    "JsonCodec",
    "codecs_from",
    "decode_envelope",
    "default_codecs",
    "envelope",
    "parse_json_value",
    "render_json_value",
]

AES_GCM_NONCE_SIZE: Final = 12
"""The nonce length of the ``aes-gcm`` codec, in bytes (the size AES-GCM is defined for)."""

_AES_GCM_AAD_PREFIX: Final = b"admission/aes-gcm/v1:"


@runtime_checkable
class Codec(Protocol):
    """A payload codec: a name and a reversible text form of a typed value."""

    name: str

    def encode(self, value: Value) -> str:
        """The envelope's ``blob`` text for ``value``."""
        ...

    def decode(self, blob: str) -> Value:
        """The value of a ``blob``; raises :class:`CodecError` if it is refused."""
        ...


@runtime_checkable
class BytesCodec(Codec, Protocol):
    """A codec that also has a byte form, so that another codec (encryption) can wrap it."""

    def encode_bytes(self, value: Value) -> bytes:
        """The byte form of ``value``."""
        ...

    def decode_bytes(self, data: bytes) -> Value:
        """The value of a byte form; raises :class:`CodecError` if it is refused."""
        ...


# -- json ----------------------------------------------------------------------------------


def parse_json_value(text: str, field: str = "--args") -> Value:
    """Parse JSON so that the typed value survives exactly.

    ``1`` stays an int and ``1.0`` a float, ``-0.0`` keeps its sign, and
    ``NaN`` / ``Infinity`` / ``-Infinity`` are accepted as floats.  Duplicate
    object keys are refused (a JSON parser would keep the last one silently,
    and the digest would cover a value the caller may not have meant), and
    so is a number too large for a 64-bit float (``1e400``: Python would read
    it as infinity, the intent of ``Infinity``, which the caller did not
    write).  Refusals are :class:`InvalidValueError` naming ``field``.
    """

    def finite_float(literal: str) -> float:
        number = float(literal)
        if math.isinf(number):
            shown = literal if len(literal) <= 40 else f"{literal[:40]}..."
            raise InvalidValueError(
                f"the number {shown} is too large for a 64-bit float (write Infinity if that is meant)",
                field=field,
                path="",
            )
        return number

    def refuse_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        result: dict[str, Any] = {}
        for key, value in pairs:
            if key in result:
                raise InvalidValueError(f"duplicate object key {key!r}", field=field, path="")
            result[key] = value
        return result

    if type(text) is not str:
        raise InvalidValueError(f"must be JSON text, got {type(text).__name__}", field=field, path="")
    try:
        value: Value = json.loads(text, object_pairs_hook=refuse_duplicates, parse_float=finite_float)
    except InvalidValueError:
        raise
    except json.JSONDecodeError as exc:
        reason = f"not valid JSON ({exc.msg} at char {exc.pos})"
        raise InvalidValueError(reason, field=field, path="") from None
    except RecursionError:
        raise InvalidValueError("nested too deeply", field=field, path="") from None
    except ValueError as exc:
        # Python refuses integers of more than 4300 digits (int_max_str_digits).
        raise InvalidValueError(f"not acceptable JSON ({exc})", field=field, path="") from None
    return value


def _json_ready(value: object, path: str) -> object:
    # Checks what JSON can carry; tuples render as arrays (they decode as lists,
    # as in the canonical encoding).
    if value is None or type(value) in (bool, int, float, str):
        return value
    if isinstance(value, (list, tuple)):
        return [_json_ready(v, f"{path}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, dict):
        out: dict[str, object] = {}
        for k, v in value.items():
            if type(k) is not str:
                raise CodecError(
                    f"JSON object keys must be str, got {type(k).__name__}", codec="json", path=path
                )
            out[k] = _json_ready(v, f"{path}.{k}")
        return out
    if type(value) is bytes:
        raise CodecError("bytes cannot be carried by the json codec; use cbor", codec="json", path=path)
    raise CodecError(f"{type(value).__name__} is not encodable", codec="json", path=path)


def render_json_value(value: Value) -> str:
    """JSON text of ``value`` that :func:`parse_json_value` reads back as the same typed value.

    Floats are written with ``repr`` (shortest round-trip form, ``1.0`` stays a
    float, ``-0.0`` keeps its sign); NaN and the infinities as ``NaN`` /
    ``Infinity`` / ``-Infinity``.  Raises :class:`CodecError` for bytes and
    other values JSON cannot carry.
    """
    try:
        return json.dumps(_json_ready(value, "$"), ensure_ascii=False, allow_nan=True, separators=(",", ":"))
    except RecursionError:
        raise CodecError("nested too deeply", codec="json", path="") from None


class JsonCodec:
    """The ``json`` codec: the blob is JSON text (see :func:`parse_json_value`)."""

    name: str = "json"

    def encode(self, value: Value) -> str:
        """JSON text of ``value``; floats round-trip exactly."""
        return render_json_value(value)

    def decode(self, blob: str) -> Value:
        """Parse the JSON text; duplicate keys and malformed text are refused."""
        try:
            return parse_json_value(blob, "input")
        except InvalidValueError as exc:
            raise CodecError(exc.reason, codec=self.name) from None

    def encode_bytes(self, value: Value) -> bytes:
        """UTF-8 of :meth:`encode` (lone surrogates are refused)."""
        try:
            return self.encode(value).encode("utf-8")
        except UnicodeEncodeError:
            raise CodecError("text is not valid Unicode (lone surrogate)", codec=self.name) from None

    def decode_bytes(self, data: bytes) -> Value:
        """Decode UTF-8 JSON bytes."""
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise CodecError("not valid UTF-8", codec=self.name) from None
        return self.decode(text)

    def __repr__(self) -> str:
        return "JsonCodec()"


# -- cbor ----------------------------------------------------------------------------------


def _b64decode(blob: object, codec: str) -> bytes:
    if type(blob) is not str:
        raise CodecError(f"blob must be a string, got {type(blob).__name__}", codec=codec)
    try:
        return base64.b64decode(blob.encode("ascii"), validate=True)
    except (UnicodeEncodeError, binascii.Error, ValueError):
        raise CodecError("blob is not standard base64", codec=codec) from None


def _b64encode(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


class CborCodec:
    """The ``cbor`` codec: the blob is base64 of the canonical ``intent-v1`` CBOR.

    Decoding is strict: the bytes must be exactly what :func:`canonical_encode`
    produces (``max_size`` bounds them).
    """

    name: str = "cbor"

    def __init__(self, *, max_size: int = DEFAULT_MAX_SIZE) -> None:
        self.max_size = max_size

    def encode_bytes(self, value: Value) -> bytes:
        """The canonical CBOR of ``value``."""
        try:
            return canonical_encode(value, max_size=self.max_size)
        except InvalidValueError as exc:
            raise CodecError(exc.reason, codec=self.name, path=exc.path) from None

    def decode_bytes(self, data: bytes) -> Value:
        """Strictly decode canonical CBOR bytes."""
        try:
            return canonical_decode(data, max_size=self.max_size)
        except InvalidValueError as exc:
            where = "" if exc.offset is None else f" (byte {exc.offset})"
            raise CodecError(f"not canonical intent-v1 CBOR{where}: {exc.reason}", codec=self.name) from None

    def encode(self, value: Value) -> str:
        """Base64 of the canonical CBOR of ``value``."""
        return _b64encode(self.encode_bytes(value))

    def decode(self, blob: str) -> Value:
        """Decode base64, then the canonical CBOR."""
        return self.decode_bytes(_b64decode(blob, self.name))

    def __repr__(self) -> str:
        return f"CborCodec(max_size={self.max_size})"


# -- aes-gcm -------------------------------------------------------------------------------


def _random_nonce() -> bytes:
    # A fresh 96-bit nonce from the operating system's CSPRNG for every encryption.
    return secrets.token_bytes(AES_GCM_NONCE_SIZE)


class AesGcmCodec:
    """The ``aes-gcm`` codec: authenticated encryption of the inner codec's bytes.

    ``key`` is a 16-, 24- or 32-byte AES key the application supplies (from
    its secret store; admission never stores it).  ``key_id`` names the key;
    it is bound into the ciphertext as associated data, so a blob made under
    another key id fails authentication even if the key bytes were reused.
    The blob is base64 of ``nonce (12 bytes) || ciphertext || tag (16 bytes)``.
    ``nonce`` returns fresh random nonces (a parameter so tests can fix it).
    Requires the ``cryptography`` package (the ``http`` extra).
    """

    name: str = "aes-gcm"

    def __init__(
        self,
        key: bytes,
        key_id: str,
        inner: BytesCodec | None = None,
        *,
        nonce: Callable[[], bytes] = _random_nonce,
    ) -> None:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        if type(key) is not bytes or len(key) not in (16, 24, 32):
            raise InvalidValueError("must be 16, 24 or 32 bytes", field="key", path="")
        if type(key_id) is not str or not key_id:
            raise InvalidValueError("must be a non-empty str", field="key_id", path="")
        self.key_id = key_id
        self.inner: BytesCodec = CborCodec() if inner is None else inner
        self._aead = AESGCM(key)
        self._nonce = nonce
        self._aad = _AES_GCM_AAD_PREFIX + key_id.encode("utf-8")

    def encode(self, value: Value) -> str:
        """Encrypt the inner codec's bytes of ``value`` under a fresh nonce."""
        nonce = self._nonce()
        if type(nonce) is not bytes or len(nonce) != AES_GCM_NONCE_SIZE:
            raise InvalidValueError(f"must be {AES_GCM_NONCE_SIZE} bytes", field="nonce", path="")
        plaintext = self.inner.encode_bytes(value)
        return _b64encode(nonce + self._aead.encrypt(nonce, plaintext, self._aad))

    def decode(self, blob: str) -> Value:
        """Authenticate and decrypt, then decode with the inner codec."""
        from cryptography.exceptions import InvalidTag

        data = _b64decode(blob, self.name)
        if len(data) < AES_GCM_NONCE_SIZE + 16:
            raise CodecError("blob is too short for a nonce and a tag", codec=self.name)
        try:
            plaintext = self._aead.decrypt(data[:AES_GCM_NONCE_SIZE], data[AES_GCM_NONCE_SIZE:], self._aad)
        except InvalidTag:
            raise CodecError(
                f"blob failed authentication under key {self.key_id!r}", codec=self.name
            ) from None
        return self.inner.decode_bytes(plaintext)

    def __repr__(self) -> str:
        # Never the key.
        return f"AesGcmCodec(key_id={self.key_id!r}, inner={self.inner!r})"


# -- registry and envelopes ----------------------------------------------------------------


class CodecRegistry(Mapping[str, Codec]):
    """The codecs a server accepts, by name (immutable)."""

    def __init__(self, codecs: Iterable[Codec]) -> None:
        table: dict[str, Codec] = {}
        for codec in codecs:
            if not isinstance(codec, Codec):
                raise TypeError(f"not a codec: {codec!r}")
            if codec.name in table:
                raise ValueError(f"two codecs named {codec.name!r}")
            table[codec.name] = codec
        self._codecs = table

    def __getitem__(self, name: str) -> Codec:
        return self._codecs[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._codecs)

    def __len__(self) -> int:
        return len(self._codecs)

    def __repr__(self) -> str:
        return f"CodecRegistry({list(self._codecs.values())!r})"


def codecs_from(*codecs: Codec) -> CodecRegistry:
    """A registry of ``codecs``; with none, the defaults ``json`` and ``cbor``."""
    return CodecRegistry(codecs) if codecs else default_codecs()


def default_codecs() -> CodecRegistry:
    """``json`` and ``cbor``: what a server accepts unless told otherwise."""
    return CodecRegistry([JsonCodec(), CborCodec()])


def envelope(codec: Codec, value: Value) -> dict[str, str]:
    """The envelope ``{"codec": name, "blob": text}`` of ``value``."""
    return {"codec": codec.name, "blob": codec.encode(value)}


def decode_envelope(registry: Mapping[str, Codec], obj: object) -> Value:
    """The value an envelope carries.

    ``obj`` must be an object with exactly the string members ``codec`` and
    ``blob``; the codec must be in ``registry``.  Raises :class:`CodecError`.
    """
    if not isinstance(obj, dict):
        raise CodecError(f"envelope must be an object, got {type(obj).__name__}", codec=None)
    extra = sorted(set(obj) - {"codec", "blob"})
    if extra:
        raise CodecError(f"unknown envelope member {extra[0]!r}", codec=None)
    name, blob = obj.get("codec"), obj.get("blob")
    if type(name) is not str:
        raise CodecError("envelope member 'codec' must be a string", codec=None)
    if type(blob) is not str:
        raise CodecError("envelope member 'blob' must be a string", codec=name)
    codec = registry.get(name)
    if codec is None:
        known = ", ".join(sorted(registry)) or "none"
        raise CodecError(f"codec {name!r} is not accepted here (accepted: {known})", codec=name)
    try:
        return codec.decode(blob)
    except CodecError:
        raise
    except AdmissionError as exc:
        raise CodecError(str(exc), codec=name) from None
