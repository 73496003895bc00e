"""Golden vectors for ``intent-v1``: the format and the one loader.

The vectors in ``admission/intent/vectors/*.json`` are data, written by
``tools/make_vectors.py`` and specified in
``admission/intent/vectors/README.md`` so that a port in another language can
read them exactly.  They ship inside the package
(:func:`~admission.intent.shipped_vectors` finds them).  This module is the
only reader: :func:`load_vectors` checks the shape of every file (a malformed
file is an error, never a silently skipped case), :func:`typed_value` turns a
typed rendering into the Python value, and :func:`load_manifest` reads the
append-only ``MANIFEST``.
Re-deriving the expected outputs is :mod:`admission.intent._verify`.

A digest released in a vector must be recomputed bit-for-bit forever (contract
§3), so a released case never changes: ``MANIFEST`` pins the SHA-256 of each
case's canonical JSON (:func:`case_digest`).
"""

from __future__ import annotations

import datetime
import decimal
import hashlib
import json
import math
import os
import re
import struct
from collections.abc import Callable
from importlib.resources.abc import Traversable
from typing import Final

from admission.intent._encoding import INTENT_VERSION
from admission.intent._location import folder

__all__ = [
    "MANIFEST_NAME",
    "VECTORS_FORMAT",
    "VECTOR_CATEGORIES",
    "VectorFormatError",
    "case_digest",
    "load_manifest",
    "load_vectors",
    "typed_value",
]

VECTORS_FORMAT: Final = "admission-golden-vectors/1"
"""The value of the ``format`` member of every vector file this loader reads."""

VECTOR_CATEGORIES: Final = ("encode", "intent", "keys", "encode_refusals", "decode_refusals")
"""The vector categories, in report order; category ``c`` lives in ``c.json``."""

MANIFEST_NAME: Final = "MANIFEST"
"""The append-only list of released cases, beside the vector files."""

UNSUPPORTED_KINDS: Final = ("set", "frozenset", "decimal", "datetime", "complex", "object")
"""The kinds an ``{"unsupported": kind}`` rendering may name (see admission/intent/vectors/README.md)."""

# Generators expand into Python objects; the bound keeps a corrupt count from
# exhausting memory before anything is checked.
_MAX_COUNT: Final = 1 << 24
_MAX_NEST: Final = 1000
_ID: Final = re.compile(r"[a-z0-9]+(?:[._-][a-z0-9]+)*\Z")
_HEX: Final = re.compile(r"(?:[0-9a-f]{2})*\Z")
_SHA256: Final = re.compile(r"[0-9a-f]{64}\Z")
_INT: Final = re.compile(r"-?(?:0|[1-9][0-9]*)\Z")
_ERROR_CODES: Final = frozenset(
    {"invalid_value", "request_id_invalid", "request_id_reserved", "command_type_invalid"}
)


class VectorFormatError(ValueError):
    """A vector file, a typed value or the MANIFEST does not follow admission/intent/vectors/README.md.

    The message names the file, the case and the member that is wrong.
    """


# --------------------------------------------------------------------------
# Typed values (admission/intent/vectors/README.md, "Typed values").


def _fail(where: str, message: str) -> VectorFormatError:
    return VectorFormatError(f"{where}: {message}")


def _members(
    obj: object, where: str, required: set[str], optional: frozenset[str] = frozenset()
) -> dict[str, object]:
    if not isinstance(obj, dict):
        raise _fail(where, f"expected a JSON object, got {_json_kind(obj)}")
    keys = set(obj)
    missing = required - keys
    if missing:
        raise _fail(where, f"missing member(s) {sorted(missing)}")
    extra = keys - required - optional
    if extra:
        raise _fail(where, f"unexpected member(s) {sorted(extra)}")
    return obj


def _json_kind(obj: object) -> str:
    if obj is None:
        return "null"
    if isinstance(obj, bool):
        return "a boolean"
    if isinstance(obj, int):
        return "a number"
    if isinstance(obj, str):
        return "a string"
    if isinstance(obj, list):
        return "an array"
    return "an object"


def _string(obj: object, where: str) -> str:
    if not isinstance(obj, str):
        raise _fail(where, f"expected a string, got {_json_kind(obj)}")
    return obj


def _hex(obj: object, where: str) -> bytes:
    text = _string(obj, where)
    if not _HEX.match(text):
        raise _fail(where, "expected lowercase hex with an even number of digits")
    return bytes.fromhex(text)


def _sha256(obj: object, where: str) -> str:
    text = _string(obj, where)
    if not _SHA256.match(text):
        raise _fail(where, "expected 64 lowercase hex digits")
    return text


def _count(obj: object, where: str, minimum: int = 0, maximum: int = _MAX_COUNT) -> int:
    # bool is an int in Python but never a count in JSON.
    if type(obj) is not int:
        raise _fail(where, f"expected an integer, got {_json_kind(obj)}")
    if not minimum <= obj <= maximum:
        raise _fail(where, f"expected an integer in [{minimum}, {maximum}], got {obj}")
    return obj


def _repeat_count(obj: object, unit_length: int, where: str) -> int:
    count = _count(obj, f"{where}.count")
    # Repeats can nest; the product, not each count, is what costs memory.
    if unit_length * count > _MAX_COUNT:
        raise _fail(where, f"expands to more than {_MAX_COUNT} characters or bytes")
    return count


def _list(obj: object, where: str) -> list[object]:
    if not isinstance(obj, list):
        raise _fail(where, f"expected an array, got {_json_kind(obj)}")
    return obj


def _float_text(value: float) -> str:
    """The informative rendering of a float: Python's ``float.hex()``, or nan/inf with a sign."""
    if math.isnan(value):
        return "-nan" if math.copysign(1.0, value) < 0 else "nan"
    if math.isinf(value):
        return "-inf" if value < 0 else "inf"
    return value.hex()


def _unsupported(kind: str) -> object:
    # One Python stand-in per kind; a port picks its own unsupported type.
    if kind == "set":
        return {1, 2}
    if kind == "frozenset":
        return frozenset({1})
    if kind == "decimal":
        return decimal.Decimal("1.10")
    if kind == "datetime":
        return datetime.datetime(2024, 1, 2, 3, 4, 5, tzinfo=datetime.UTC)
    if kind == "complex":
        return complex(1.0, 2.0)
    return object()


_SINGLE_KINDS: Final = frozenset(
    {"null", "bool", "int", "bytes", "list", "tuple", "map", "unsupported", "text_code_points"}
)


def _typed_text(obj: object, where: str) -> str:
    value = typed_value(obj, where)
    if type(value) is not str:
        raise _fail(where, "expected a typed text value (text, text_code_points or text_repeat)")
    return value


def typed_value(obj: object, where: str = "value") -> object:
    """The Python value of a typed rendering (admission/intent/vectors/README.md, "Typed values").

    Raises :class:`VectorFormatError` naming ``where`` when the rendering is
    malformed or inconsistent (for example ``text`` and ``utf8`` disagree).
    """
    if not isinstance(obj, dict) or not obj:
        raise _fail(where, f"expected a typed value (a JSON object), got {_json_kind(obj)}")
    tags = set(obj)
    if tags & _SINGLE_KINDS:
        if len(tags) != 1:
            raise _fail(where, f"a typed value has exactly one kind, got members {sorted(tags)}")
        (kind,) = tags
        return _single(kind, obj[kind], f"{where}.{kind}")
    if "float" in tags:
        _members(obj, where, {"float", "float_bits"})
        bits = _hex(obj["float_bits"], f"{where}.float_bits")
        if len(bits) != 8:
            raise _fail(where, "float_bits must be 16 hex digits (IEEE 754 binary64, big-endian)")
        (number,) = struct.unpack(">d", bits)
        if _string(obj["float"], f"{where}.float") != _float_text(number):
            raise _fail(
                where, f"float {obj['float']!r} does not match float_bits (expected {_float_text(number)!r})"
            )
        return number
    if "text" in tags:
        _members(obj, where, {"text", "utf8"})
        text = _string(obj["text"], f"{where}.text")
        try:
            encoded = text.encode("utf-8")
        except UnicodeEncodeError:
            raise _fail(where, "text with lone surrogates must be given as text_code_points") from None
        if encoded != _hex(obj["utf8"], f"{where}.utf8"):
            raise _fail(where, "text and utf8 disagree")
        return text
    if "text_repeat" in tags:
        _members(obj, where, {"text_repeat", "count"})
        unit = _typed_text(obj["text_repeat"], f"{where}.text_repeat")
        return unit * _repeat_count(obj["count"], len(unit), where)
    if "bytes_repeat" in tags:
        _members(obj, where, {"bytes_repeat", "count"})
        chunk = _hex(obj["bytes_repeat"], f"{where}.bytes_repeat")
        return chunk * _repeat_count(obj["count"], len(chunk), where)
    if "list_repeat" in tags:
        _members(obj, where, {"list_repeat", "count"})
        item = typed_value(obj["list_repeat"], f"{where}.list_repeat")
        return [item] * _count(obj["count"], f"{where}.count")
    if "map_numbered" in tags:
        return _map_numbered(obj, where)
    if "nest_list" in tags or "nest_map" in tags:
        return _nest(obj, where)
    raise _fail(where, f"unknown typed value kind {sorted(tags)}")


def _single(kind: str, raw: object, where: str) -> object:
    if kind == "null":
        if raw is not None:
            raise _fail(where, "must be null")
        return None
    if kind == "bool":
        if not isinstance(raw, bool):
            raise _fail(where, "must be true or false")
        return raw
    if kind == "int":
        text = _string(raw, where)
        if not _INT.match(text) or text == "-0":
            raise _fail(where, "an int is a decimal string: optional '-', no leading zeros, no '-0'")
        return int(text)
    if kind == "bytes":
        return _hex(raw, where)
    if kind == "text_code_points":
        points = _list(raw, where)
        chars = [chr(_count(p, f"{where}[{i}]", 0, 0x10FFFF)) for i, p in enumerate(points)]
        text = "".join(chars)
        if not any(0xD800 <= ord(c) <= 0xDFFF for c in text):
            # One rendering per value: valid Unicode is written as text + utf8.
            raise _fail(where, "text_code_points is only for text with surrogate code points; use text")
        return text
    if kind == "list":
        return [typed_value(item, f"{where}[{i}]") for i, item in enumerate(_list(raw, where))]
    if kind == "tuple":
        return tuple(typed_value(item, f"{where}[{i}]") for i, item in enumerate(_list(raw, where)))
    if kind == "map":
        return _map(raw, where)
    kind_name = _string(raw, where)
    if kind_name not in UNSUPPORTED_KINDS:
        raise _fail(where, f"unknown unsupported kind {kind_name!r}; known: {list(UNSUPPORTED_KINDS)}")
    return _unsupported(kind_name)


_KEY_TYPES: Final = (type(None), bool, int, float, str, bytes)


def _map(raw: object, where: str) -> dict[object, object]:
    entries = _list(raw, where)
    result: dict[object, object] = {}
    for i, entry in enumerate(entries):
        pair = _list(entry, f"{where}[{i}]")
        if len(pair) != 2:
            raise _fail(f"{where}[{i}]", "a map entry is a [key, value] pair")
        key = typed_value(pair[0], f"{where}[{i}][0]")
        if type(key) not in _KEY_TYPES:
            raise _fail(f"{where}[{i}][0]", "a map key must be a scalar typed value")
        if key in result:
            # Python equates 1, 1.0 and True; a vector must not rely on which survives.
            raise _fail(f"{where}[{i}][0]", "duplicate map key")
        result[key] = typed_value(pair[1], f"{where}[{i}][1]")
    return result


def _map_numbered(obj: object, where: str) -> dict[object, object]:
    members = _members(obj, where, {"map_numbered", "key_prefix", "key_width", "value", "insertion"})
    count = _count(members["map_numbered"], f"{where}.map_numbered")
    prefix = _string(members["key_prefix"], f"{where}.key_prefix")
    if not all(" " <= c <= "~" for c in prefix):
        raise _fail(where, "key_prefix must be printable ASCII")
    width = _count(members["key_width"], f"{where}.key_width", 1, 20)
    if count and len(str(count - 1)) > width:
        raise _fail(where, "key_width is too small for count")
    insertion = members["insertion"]
    if insertion not in ("ascending", "descending"):
        raise _fail(where, "insertion must be 'ascending' or 'descending'")
    value = typed_value(members["value"], f"{where}.value")
    order = range(count) if insertion == "ascending" else range(count - 1, -1, -1)
    return {f"{prefix}{i:0{width}d}": value for i in order}


def _nest(obj: object, where: str) -> object:
    is_map = isinstance(obj, dict) and "nest_map" in obj
    kind = "nest_map" if is_map else "nest_list"
    required = {kind, "key"} if is_map else {kind}
    members = _members(obj, where, required, frozenset({"leaf"}))
    depth = _count(members[kind], f"{where}.{kind}", 1, _MAX_NEST)
    key = _typed_text(members["key"], f"{where}.key") if is_map else ""
    has_leaf = "leaf" in members
    leaf = typed_value(members["leaf"], f"{where}.leaf") if has_leaf else None
    # The innermost container holds the leaf, or nothing when there is no leaf.
    value: object = ({key: leaf} if has_leaf else {}) if is_map else ([leaf] if has_leaf else [])
    for _ in range(depth - 1):
        value = {key: value} if is_map else [value]
    return value


# --------------------------------------------------------------------------
# Files, cases and the MANIFEST.


def _load_json(path: Traversable) -> object:
    raw = path.read_bytes()
    try:
        text = raw.decode("ascii")
    except UnicodeDecodeError as exc:
        raise _fail(path.name, f"not plain ASCII (byte {exc.start}); write with ensure_ascii") from None

    def no_duplicates(pairs: list[tuple[str, object]]) -> dict[str, object]:
        result: dict[str, object] = {}
        for key, value in pairs:
            if key in result:
                raise _fail(path.name, f"duplicate JSON member {key!r}")
            result[key] = value
        return result

    def no_float(token: str) -> object:
        # Every number in a vector is exact: values are typed strings.
        raise _fail(path.name, f"non-integer JSON number {token}; numbers are typed strings")

    try:
        return json.loads(
            text, object_pairs_hook=no_duplicates, parse_float=no_float, parse_constant=no_float
        )
    except json.JSONDecodeError as exc:
        raise _fail(
            path.name, f"not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"
        ) from None


_COMMON: Final = frozenset({"id", "description"})


def _error(obj: object, where: str, *, path_allowed: bool) -> dict[str, object]:
    members = _members(obj, where, {"code", "field"}, frozenset({"path"}) if path_allowed else frozenset())
    if members["code"] not in _ERROR_CODES:
        raise _fail(where, f"unknown error code {members['code']!r}; known: {sorted(_ERROR_CODES)}")
    _string(members["field"], f"{where}.field")
    if "path" in members:
        _string(members["path"], f"{where}.path")
    return members


def _outcome(obj: object, where: str, ok_member: str, ok_check: Callable[[object, str], object]) -> None:
    if not isinstance(obj, dict) or len(obj) != 1 or not ({ok_member, "error"} & set(obj)):
        raise _fail(where, f"expected {{{ok_member!r}: ...}} or {{'error': ...}}")
    if "error" in obj:
        _error(obj["error"], f"{where}.error", path_allowed=False)
    else:
        ok_check(obj[ok_member], f"{where}.{ok_member}")


def _accepted(obj: object, where: str) -> object:
    if obj is not True:
        raise _fail(where, "must be true")
    return obj


def _check_encode(case: dict[str, object], where: str) -> None:
    full = "cbor" in case
    required = {"value", "cbor"} if full else {"value", "cbor_sha256", "cbor_length", "cbor_prefix"}
    _members(case, where, set(_COMMON) | required, frozenset({"max_size"}))
    typed_value(case["value"], f"{where}.value")
    if full:
        _hex(case["cbor"], f"{where}.cbor")
    else:
        _sha256(case["cbor_sha256"], f"{where}.cbor_sha256")
        _count(case["cbor_length"], f"{where}.cbor_length", 1, 1 << 31)
        _hex(case["cbor_prefix"], f"{where}.cbor_prefix")
    if "max_size" in case:
        _count(case["max_size"], f"{where}.max_size", 1, 1 << 31)


def _check_intent(case: dict[str, object], where: str) -> None:
    _members(
        case,
        where,
        set(_COMMON)
        | {"command_type", "name", "arguments", "target", "record", "intent_digest", "arguments_digest"},
        frozenset({"max_size", "same_intent_as"}),
    )
    _string(case["command_type"], f"{where}.command_type")
    for member in ("name", "arguments", "target"):
        typed_value(case[member], f"{where}.{member}")
    _hex(case["record"], f"{where}.record")
    _sha256(case["intent_digest"], f"{where}.intent_digest")
    _sha256(case["arguments_digest"], f"{where}.arguments_digest")
    if "max_size" in case:
        _count(case["max_size"], f"{where}.max_size", 1, 1 << 31)
    if "same_intent_as" in case:
        _string(case["same_intent_as"], f"{where}.same_intent_as")


def _check_keys(case: dict[str, object], where: str) -> None:
    op = case.get("op") if isinstance(case, dict) else None
    if op == "key":
        _members(case, where, set(_COMMON) | {"op", "command_type", "key", "validate", "receipt_token"})
        _string(case["command_type"], f"{where}.command_type")
        typed_value(case["key"], f"{where}.key")
        _outcome(case["validate"], f"{where}.validate", "accepted", _accepted)
        _outcome(case["receipt_token"], f"{where}.receipt_token", "token", _string)
    elif op == "normalize":
        _members(case, where, set(_COMMON) | {"op", "raw", "normalized"})
        typed_value(case["raw"], f"{where}.raw")
        _outcome(case["normalized"], f"{where}.normalized", "value", typed_value)
    else:
        raise _fail(where, "op must be 'key' or 'normalize'")


def _check_encode_refusal(case: dict[str, object], where: str) -> None:
    op = case.get("op")
    if op == "encode":
        _members(case, where, set(_COMMON) | {"op", "value", "error"}, frozenset({"max_size"}))
        typed_value(case["value"], f"{where}.value")
    elif op == "intent":
        _members(
            case,
            where,
            set(_COMMON) | {"op", "command_type", "name", "arguments", "target", "error"},
            frozenset({"max_size"}),
        )
        _string(case["command_type"], f"{where}.command_type")
        for member in ("name", "arguments", "target"):
            typed_value(case[member], f"{where}.{member}")
    else:
        raise _fail(where, "op must be 'encode' or 'intent'")
    if "max_size" in case:
        _count(case["max_size"], f"{where}.max_size", 1, 1 << 31)
    error = _error(case["error"], f"{where}.error", path_allowed=True)
    if error["code"] == "invalid_value" and "path" not in error:
        raise _fail(f"{where}.error", "an invalid_value refusal names its path")


def _check_decode_refusal(case: dict[str, object], where: str) -> None:
    _members(case, where, set(_COMMON) | {"cbor", "error"}, frozenset({"max_size"}))
    _hex(case["cbor"], f"{where}.cbor")
    if "max_size" in case:
        _count(case["max_size"], f"{where}.max_size", 1, 1 << 31)
    _error(case["error"], f"{where}.error", path_allowed=False)


_CHECKS: Final[dict[str, Callable[[dict[str, object], str], None]]] = {
    "encode": _check_encode,
    "intent": _check_intent,
    "keys": _check_keys,
    "encode_refusals": _check_encode_refusal,
    "decode_refusals": _check_decode_refusal,
}


def load_vectors(
    directory: str | os.PathLike[str] | Traversable | None = None,
) -> dict[str, list[dict[str, object]]]:
    """Read every vector file in ``directory``: category -> cases, in file order.

    Without ``directory``, the vectors that ship with the package
    (:func:`~admission.intent.shipped_vectors`).

    This is the one loader (admission/intent/vectors/README.md).  It requires
    exactly the files ``<category>.json`` for :data:`VECTOR_CATEGORIES`,
    plain-ASCII JSON with no duplicate members and no non-integer numbers, the
    documented members for each case, well-formed typed values, and ids
    unique across all files.
    Raises :class:`VectorFormatError` with the file, case and member otherwise.
    """
    root = folder(directory)
    if not root.is_dir():
        raise VectorFormatError(f"{root}: not a directory")
    present = {p.name for p in root.iterdir() if p.name.endswith(".json")}
    expected = {f"{c}.json" for c in VECTOR_CATEGORIES}
    if present - expected:
        raise VectorFormatError(f"{root}: unknown vector file(s) {sorted(present - expected)}")
    if expected - present:
        raise VectorFormatError(f"{root}: missing vector file(s) {sorted(expected - present)}")
    result: dict[str, list[dict[str, object]]] = {}
    seen: dict[str, str] = {}
    for category in VECTOR_CATEGORIES:
        name = f"{category}.json"
        document = _members(
            _load_json(root / name), name, {"format", "encoding", "category", "description", "cases"}
        )
        if document["format"] != VECTORS_FORMAT:
            raise _fail(name, f"format must be {VECTORS_FORMAT!r}, got {document['format']!r}")
        if document["encoding"] != INTENT_VERSION:
            raise _fail(name, f"encoding must be {INTENT_VERSION!r}, got {document['encoding']!r}")
        if document["category"] != category:
            raise _fail(name, f"category must be {category!r} (the file stem), got {document['category']!r}")
        _string(document["description"], f"{name}.description")
        cases: list[dict[str, object]] = []
        for index, case in enumerate(_list(document["cases"], f"{name}.cases")):
            where = f"{name} cases[{index}]"
            if not isinstance(case, dict):
                raise _fail(where, f"expected a JSON object, got {_json_kind(case)}")
            case_id = _string(case.get("id"), f"{where}.id")
            if not _ID.match(case_id):
                raise _fail(where, f"id {case_id!r} must match {_ID.pattern}")
            where = f"{name} {case_id}"
            if case_id in seen:
                raise _fail(where, f"duplicate id (also in {seen[case_id]})")
            seen[case_id] = name
            if not _string(case.get("description"), f"{where}.description").strip():
                raise _fail(where, "description must not be blank")
            _CHECKS[category](case, where)
            cases.append(case)
        result[category] = cases
    return result


def case_digest(case: dict[str, object]) -> str:
    """The SHA-256 that ``MANIFEST`` pins for a case (admission/intent/vectors/README.md, "Append-only").

    Computed over the case's canonical JSON: members sorted by name, no
    whitespace, ASCII with ``\\uXXXX`` escapes (Python's ``json.dumps`` with
    ``sort_keys=True, separators=(",", ":"), ensure_ascii=True``).
    """
    text = json.dumps(case, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode("ascii")).hexdigest()


_MANIFEST_LINE: Final = re.compile(r"([a-z_]+\.json) (\S+) ([0-9a-f]{64})\Z")


def load_manifest(path: str | os.PathLike[str] | Traversable) -> list[tuple[str, str, str]]:
    """Read a MANIFEST: ``(file, id, sha256)`` per released case, in release order.

    Blank lines and lines starting with ``#`` are comments.  Raises
    :class:`VectorFormatError` on a malformed or repeated entry.
    """
    entries: list[tuple[str, str, str]] = []
    seen: set[tuple[str, str]] = set()
    text = folder(path).read_text(encoding="ascii")
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip() or line.startswith("#"):
            continue
        match = _MANIFEST_LINE.match(line)
        if match is None:
            raise VectorFormatError(
                f"{MANIFEST_NAME} line {number}: expected '<file> <id> <sha256>', got {line!r}"
            )
        file_name, case_id, digest = match.groups()
        if (file_name, case_id) in seen:
            raise VectorFormatError(f"{MANIFEST_NAME} line {number}: {file_name} {case_id} listed twice")
        seen.add((file_name, case_id))
        entries.append((file_name, case_id, digest))
    return entries
