#!/usr/bin/env python3
"""Write the golden vectors of ``intent-v1`` (admission/intent/vectors/README.md).

Usage: ``python tools/make_vectors.py [OUTDIR] [--base-manifest PATH]``

Every expected output is derived by running admission's own functions, and is
then cross-checked three ways before anything is written: against the
outcome the contract asks for (stated here, by hand, beside each case),
against a small independent encoder in this file, and against an independent
CBOR decoder (``cbor2``).  A disagreement stops the run with nothing written.

The output is deterministic: the same code writes byte-identical files.  The
vectors are append-only once released: the MANIFEST given by
``--base-manifest`` (default: ``admission/intent/vectors/MANIFEST``) lists the
released cases; if one of them would change or disappear, the run stops.  New
cases are appended to the MANIFEST.  So: never edit or reorder a case below,
only add new ones at the end of a category's list.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import struct
import sys
import unicodedata
from collections.abc import Callable
from pathlib import Path

# Derive from the definition: the pure-Python walk of admission.intent._encoding.  The
# optional C accelerator must reproduce these bytes; the verifier checks it
# against the vectors, so it must not also be their source.
os.environ["ADMISSION_PURE_PYTHON"] = "1"

import cbor2

from admission import (
    DEFAULT_MAX_SIZE,
    AdmissionError,
    arguments_digest,
    canonical_decode,
    canonical_encode,
    intent_digest,
    intent_record,
    normalize_request_id,
    receipt_token,
    validate_request_id,
)
from admission.intent import ACCELERATED, INTENT_TAG, INTENT_VERSION
from admission.intent._vectors import (
    MANIFEST_NAME,
    VECTOR_CATEGORIES,
    VECTORS_FORMAT,
    case_digest,
    load_manifest,
    load_vectors,
    typed_value,
)

REPO = Path(__file__).resolve().parents[1]
# The one copy of the vectors: package data, so they install with the code.
# Written into the checkout, never into wherever admission is installed.
VECTORS = REPO / "admission" / "intent" / "vectors"

# Encodings up to this size are stored in full; larger ones by length, SHA-256
# and prefix (admission/intent/vectors/README.md, "encode").
INLINE_LIMIT = 1024
PREFIX_BYTES = 32

FILE_DESCRIPTIONS = {
    "encode": "Values and their canonical intent-v1 encoding (contract §3). Every cbor must also "
    "decode strictly to the value and re-encode to itself.",
    "intent": "Intent records and digests: command type, canonical name, arguments, target (contract §3).",
    "keys": "Command keys: validation, receipt tokens, HTTP-input normalisation (contract §2).",
    "encode_refusals": "Values the encoder and the intent record must refuse, with the error field and "
    "path (contract §3).",
    "decode_refusals": "Byte strings the strict decoder must refuse (contract §3).",
}


class GenerationError(Exception):
    """A derived vector disagrees with a cross-check; nothing is written."""


def check(condition: bool, message: str) -> None:
    if not condition:
        raise GenerationError(message)


# --------------------------------------------------------------------------
# Rendering Python values as typed JSON (the inverse of admission.intent._vectors.typed_value).


def float_text(value: float) -> str:
    if math.isnan(value):
        return "-nan" if math.copysign(1.0, value) < 0 else "nan"
    if math.isinf(value):
        return "-inf" if value < 0 else "inf"
    return value.hex()


UNSUPPORTED_NAMES = {
    "set": "set",
    "frozenset": "frozenset",
    "Decimal": "decimal",
    "datetime": "datetime",
    "complex": "complex",
    "object": "object",
}


def render(value: object) -> dict[str, object]:
    """The typed rendering of a Python value."""
    if value is None:
        return {"null": None}
    if type(value) is bool:
        return {"bool": value}
    if type(value) is int:
        return {"int": str(value)}
    if type(value) is float:
        return {"float": float_text(value), "float_bits": struct.pack(">d", value).hex()}
    if type(value) is str:
        try:
            return {"text": value, "utf8": value.encode("utf-8").hex()}
        except UnicodeEncodeError:
            return {"text_code_points": [ord(c) for c in value]}
    if type(value) is bytes:
        return {"bytes": value.hex()}
    if type(value) is list:
        return {"list": [render(item) for item in value]}
    if type(value) is tuple:
        return {"tuple": [render(item) for item in value]}
    if type(value) is dict:
        return {"map": [[render(k), render(v)] for k, v in value.items()]}
    return {"unsupported": UNSUPPORTED_NAMES[type(value).__name__]}


def text(value: str) -> dict[str, object]:
    return render(value)


def text_repeat(unit: str, count: int) -> dict[str, object]:
    return {"text_repeat": render(unit), "count": count}


def bytes_repeat(unit: bytes, count: int) -> dict[str, object]:
    return {"bytes_repeat": unit.hex(), "count": count}


def list_repeat(item: object, count: int) -> dict[str, object]:
    return {"list_repeat": render(item), "count": count}


def map_numbered(count: int, value: object, prefix: str = "k", width: int = 5) -> dict[str, object]:
    # Inserted in descending order so that a port must sort at scale too.
    return {
        "map_numbered": count,
        "key_prefix": prefix,
        "key_width": width,
        "value": render(value),
        "insertion": "descending",
    }


def nest_list(depth: int, leaf: object = ..., *, has_leaf: bool = True) -> dict[str, object]:
    rendering: dict[str, object] = {"nest_list": depth}
    if has_leaf:
        rendering["leaf"] = render(leaf)
    return rendering


def nest_map(depth: int, key: str, leaf: object) -> dict[str, object]:
    return {"nest_map": depth, "key": render(key), "leaf": render(leaf)}


def same(a: object, b: object, *, ordered: bool = False) -> bool:
    """Typed equality; ``ordered`` also compares map insertion order (for renderings)."""
    ta = list if type(a) is tuple else type(a)
    tb = list if type(b) is tuple else type(b)
    if ta is not tb:
        return False
    if isinstance(a, float) and isinstance(b, float):
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return struct.pack(">d", a) == struct.pack(">d", b)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same(x, y, ordered=ordered) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        if ordered and list(a) != list(b):
            return False
        return a.keys() == b.keys() and all(same(a[k], b[k], ordered=ordered) for k in a)
    if ta.__name__ in UNSUPPORTED_NAMES:
        return True
    return a == b


def from_rendering(rendering: dict[str, object], value: object = ...) -> object:
    """The value the loader reads from ``rendering``; equal to ``value`` when that is given."""
    loaded = typed_value(json.loads(json.dumps(rendering, ensure_ascii=True)))
    if value is not ...:
        check(
            same(loaded, value, ordered=True),
            f"rendering {str(rendering)[:80]} does not load as {value!r:.80}",
        )
    return loaded


# --------------------------------------------------------------------------
# An independent encoder and the cbor2 cross-check.


def ref_head(major: int, n: int) -> bytes:
    if n < 24:
        return bytes([major << 5 | n])
    for ai, width in ((24, 1), (25, 2), (26, 4), (27, 8)):
        if n < 1 << (8 * width):
            return bytes([major << 5 | ai]) + n.to_bytes(width, "big")
    raise GenerationError("argument too large")


def ref_encode(value: object) -> bytes:
    """Contract §3, written again from the table without looking at admission.intent._encoding."""
    if value is None:
        return b"\xf6"
    if value is True:
        return b"\xf5"
    if value is False:
        return b"\xf4"
    if type(value) is int:
        check(-(2**63) <= value < 2**63, "ref_encode: int outside int64")
        return ref_head(0, value) if value >= 0 else ref_head(1, -1 - value)
    if type(value) is float:
        if math.isnan(value):
            return bytes.fromhex("f97e00")
        if math.isinf(value):
            return bytes.fromhex("f97c00" if value > 0 else "f9fc00")
        return b"\xfb" + struct.pack(">d", value)
    if type(value) is str:
        raw = value.encode("utf-8")
        return ref_head(3, len(raw)) + raw
    if type(value) is bytes:
        return ref_head(2, len(value)) + value
    if isinstance(value, (list, tuple)) and type(value) in (list, tuple):
        return ref_head(4, len(value)) + b"".join(ref_encode(x) for x in value)
    if type(value) is dict:
        entries = sorted((k.encode("utf-8"), v) for k, v in value.items())
        return ref_head(5, len(entries)) + b"".join(
            ref_head(3, len(k)) + k + ref_encode(v) for k, v in entries
        )
    raise GenerationError(f"ref_encode: {type(value).__name__}")


def cbor2_agrees(data: bytes, value: object) -> None:
    decoded = cbor2.loads(data)
    check(same(decoded, value), f"cbor2 reads {data.hex()[:60]} as {decoded!r:.80}, not {value!r:.80}")


# --------------------------------------------------------------------------
# encode.json


def make_encode() -> list[dict[str, object]]:
    cases: list[dict[str, object]] = []

    def enc(
        cid: str,
        description: str,
        value: object = ...,
        *,
        rendering: dict[str, object] | None = None,
        expect: str | None = None,
        max_size: int | None = None,
    ) -> None:
        if rendering is None:
            rendering = render(value)
        loaded = from_rendering(rendering, value)
        data = canonical_encode(loaded, max_size=max_size or DEFAULT_MAX_SIZE)
        check(data == ref_encode(loaded), f"{cid}: admission and the reference encoder disagree")
        if expect is not None:
            check(data.hex() == expect, f"{cid}: encodes as {data.hex()}, the contract says {expect}")
        cbor2_agrees(data, loaded)
        decoded = canonical_decode(data, max_size=max(len(data), max_size or DEFAULT_MAX_SIZE))
        check(
            same(decoded, loaded) and canonical_encode(decoded, max_size=len(data)) == data,
            f"{cid}: strict decode does not round-trip",
        )
        case: dict[str, object] = {"id": f"enc.{cid}", "description": description, "value": rendering}
        if max_size is not None:
            case["max_size"] = max_size
        if len(data) <= INLINE_LIMIT:
            case["cbor"] = data.hex()
        else:
            case["cbor_sha256"] = hashlib.sha256(data).hexdigest()
            case["cbor_length"] = len(data)
            case["cbor_prefix"] = data[:PREFIX_BYTES].hex()
        cases.append(case)

    # The §3 table, row by row.
    enc("null", "None is f6.", None, expect="f6")
    enc("false", "False is f4; bool is never an int.", False, expect="f4")
    enc("true", "True is f5; bool is never an int.", True, expect="f5")
    enc("int.0", "Zero: major type 0, argument in the initial byte.", 0, expect="00")
    enc("int.1", "One, as an int (compare enc.float.1: 1 and 1.0 differ).", 1, expect="01")
    enc("int.10", "Ten.", 10, expect="0a")
    for n, hx, note in [
        (23, "17", "the largest argument held in the initial byte"),
        (24, "1818", "the smallest one-byte argument (ai 24)"),
        (25, "1819", "one-byte argument"),
        (100, "1864", "one-byte argument"),
        (255, "18ff", "the largest one-byte argument"),
        (256, "190100", "the smallest two-byte argument (ai 25)"),
        (1000, "1903e8", "two-byte argument"),
        (65535, "19ffff", "the largest two-byte argument"),
        (65536, "1a00010000", "the smallest four-byte argument (ai 26)"),
        (2**32 - 1, "1affffffff", "2^32-1, the largest four-byte argument"),
        (2**32, "1b0000000100000000", "2^32, the smallest eight-byte argument (ai 27)"),
        (2**53, "1b0020000000000000", "2^53: past here a float64 cannot hold every int"),
        (2**53 + 1, "1b0020000000000001", "2^53+1: not representable as a float64, must stay exact"),
        (2**63 - 1, "1b7fffffffffffffff", "2^63-1, the int64 maximum (2^63 is refused)"),
    ]:
        enc(f"int.pos.{n}", f"Int {n}: {note}.", n, expect=hx)
    for n, hx, note in [
        (-1, "20", "argument 0 of major type 1"),
        (-10, "29", "argument 9"),
        (-24, "37", "argument 23, the largest in the initial byte"),
        (-25, "3818", "argument 24, the smallest one-byte argument"),
        (-100, "3863", "one-byte argument"),
        (-256, "38ff", "argument 255, the largest one-byte argument"),
        (-257, "390100", "argument 256, the smallest two-byte argument"),
        (-65536, "39ffff", "argument 65535, the largest two-byte argument"),
        (-65537, "3a00010000", "argument 65536, the smallest four-byte argument"),
        (-(2**32), "3affffffff", "argument 2^32-1, the largest four-byte argument"),
        (-(2**32) - 1, "3b0000000100000000", "argument 2^32, the smallest eight-byte argument"),
        (-(2**53) - 1, "3b0020000000000000", "-2^53-1: not representable as a float64"),
        (-(2**63), "3b7fffffffffffffff", "-2^63, the int64 minimum (-2^63-1 is refused)"),
    ]:
        enc(f"int.neg.{-n}", f"Int {n}: {note}.", n, expect=hx)

    def from_bits(hx: str) -> float:
        return float(struct.unpack(">d", bytes.fromhex(hx))[0])

    for name, value, note in [
        ("1", 1.0, "1.0 is a float: fb + 8 bytes, never shortened to f93c00 (compare enc.int.1)"),
        ("neg-1", -1.0, "-1.0"),
        ("0", 0.0, "0.0: fb + eight zero bytes"),
        ("neg-0", -0.0, "-0.0 keeps its sign bit: fb8000000000000000, not 0.0"),
        ("1.5", 1.5, "1.5, exact in half precision yet still 8 bytes"),
        ("neg-4.1", -4.1, "-4.1"),
        ("0.1", 0.1, "0.1, not exact in binary: the nearest binary64"),
        ("65504", 65504.0, "65504.0, the largest half-precision value, still 8 bytes"),
        ("100000", 100000.0, "100000.0, exact in single precision, still 8 bytes"),
        ("2p53", 9007199254740992.0, "2^53 as a float (compare enc.int.pos.9007199254740992)"),
        ("1e300", 1e300, "1e300"),
        ("next-after-1", 1.0000000000000002, "the float right after 1.0"),
        ("min-subnormal", from_bits("0000000000000001"), "the smallest subnormal, 2^-1074"),
        ("neg-min-subnormal", from_bits("8000000000000001"), "the negative smallest subnormal"),
        ("max-subnormal", from_bits("000fffffffffffff"), "the largest subnormal"),
        ("min-normal", from_bits("0010000000000000"), "the smallest normal, 2^-1022"),
        ("max-finite", from_bits("7fefffffffffffff"), "the largest finite float64"),
        ("neg-max-finite", from_bits("ffefffffffffffff"), "the most negative finite float64"),
    ]:
        enc(f"float.{name}", f"Float {note}.", value, expect="fb" + struct.pack(">d", value).hex())
    for name, bits, note in [
        ("quiet", "7ff8000000000000", "the usual quiet NaN"),
        ("negative", "fff8000000000000", "NaN with the sign bit set"),
        ("payload", "7ff8000000000001", "quiet NaN with payload 1"),
        ("signaling", "7ff0000000000001", "signalling NaN (quiet bit clear, payload 1)"),
        ("signaling-high", "7ff4000000000000", "signalling NaN with a high payload bit"),
        ("all-ones", "7fffffffffffffff", "NaN with every payload bit set"),
        ("negative-all-ones", "ffffffffffffffff", "negative NaN with every payload bit set"),
    ]:
        enc(
            f"float.nan.{name}",
            f"NaN, {note}: every NaN is f97e00 (float_bits gives the input).",
            from_bits(bits),
            expect="f97e00",
        )
    enc("float.inf", "+infinity is f97c00.", math.inf, expect="f97c00")
    enc("float.neg-inf", "-infinity is f9fc00.", -math.inf, expect="f9fc00")

    # Text strings: the length is in UTF-8 bytes, not code points.
    enc("text.empty", "The empty string.", "", expect="60")
    enc("text.a", "One ASCII letter.", "a", expect="6161")
    enc("text.ietf", "RFC 8949 Appendix A example.", "IETF", expect="6449455446")
    enc("text.quote-backslash", "A quote and a backslash.", '"\\', expect="62225c")
    enc("text.u-umlaut", "U+00FC, two UTF-8 bytes.", "\u00fc", expect="62c3bc")
    enc("text.water", "U+6C34, three UTF-8 bytes.", "\u6c34", expect="63e6b0b4")
    enc(
        "text.astral",
        "U+10151, four UTF-8 bytes (a surrogate pair in UTF-16).",
        "\U00010151",
        expect="64f0908591",
    )
    enc("text.emoji", "U+1F600, four UTF-8 bytes.", "\U0001f600", expect="64f09f9880")
    enc("text.max-code-point", "U+10FFFF, the last code point.", "\U0010ffff", expect="64f48fbfbf")
    enc("text.bom", "U+FEFF is kept, not stripped.", "\ufeff", expect="63efbbbf")
    enc("text.nul", "A lone NUL character.", "\x00", expect="6100")
    enc("text.embedded-nul", "NUL inside a string is kept.", "a\x00b", expect="63610062")
    enc("text.control", "Control characters are kept as they are.", "\t\n\r\x7f", expect="64090a0d7f")
    enc("text.nfc", "NFC e-acute (U+00E9): not normalised (compare enc.text.nfd).", "\u00e9", expect="62c3a9")
    enc(
        "text.nfd",
        "NFD e + combining acute (U+0065 U+0301): different bytes from the NFC form.",
        "e\u0301",
        expect="6365cc81",
    )
    for n in (23, 24, 255, 256):
        enc(f"text.len.{n}", f"ASCII text of {n} bytes: head {ref_head(3, n).hex()}.", "a" * n)
    enc(
        "text.len.24-two-byte",
        "12 x U+00E9: 12 code points but 24 bytes, so a one-byte length argument.",
        "\u00e9" * 12,
        expect="7818" + "c3a9" * 12,
    )
    enc("text.len.24-three-byte", "8 x U+20AC: 8 code points, 24 bytes.", "\u20ac" * 8)
    enc("text.len.255-three-byte", "85 x U+20AC: 255 bytes, the largest one-byte length.", "\u20ac" * 85)
    enc(
        "text.len.256-four-byte",
        "64 x U+1F600: 64 code points, 256 bytes, so a two-byte length.",
        "\U0001f600" * 64,
    )
    enc(
        "text.len.65535",
        "ASCII text of 65535 bytes, the largest two-byte length.",
        rendering=text_repeat("a", 65535),
    )
    enc(
        "text.len.65536",
        "ASCII text of 65536 bytes, the smallest four-byte length.",
        rendering=text_repeat("a", 65536),
    )
    enc("text.len.65535-three-byte", "21845 x U+20AC: 65535 bytes.", rendering=text_repeat("\u20ac", 21845))
    enc(
        "text.len.65536-four-byte",
        "16384 x U+1F600: 65536 bytes.",
        rendering=text_repeat("\U0001f600", 16384),
    )
    enc(
        "text.default-max-size",
        "Text of 1048571 bytes: exactly 1 MiB encoded, the default size limit (compare encref.size.default).",
        rendering=text_repeat("a", DEFAULT_MAX_SIZE - 5),
    )

    # Byte strings.
    enc("bytes.empty", "The empty byte string.", b"", expect="40")
    enc("bytes.nul", "One zero byte.", b"\x00", expect="4100")
    enc("bytes.ff", "Bytes 00 ff: not text, no UTF-8 rules.", b"\x00\xff", expect="4200ff")
    enc(
        "bytes.invalid-utf8",
        "Bytes that are not UTF-8 are fine in a byte string.",
        b"\xed\xa0\x80",
        expect="43eda080",
    )
    for n in (23, 24, 255, 256):
        enc(f"bytes.len.{n}", f"{n} bytes: head {ref_head(2, n).hex()}.", bytes(range(256))[:n])
    for n in (65535, 65536):
        enc(f"bytes.len.{n}", f"{n} bytes of 0xab.", rendering=bytes_repeat(b"\xab", n))

    # Arrays.
    enc("list.empty", "The empty list.", [], expect="80")
    enc("list.ints", "A list keeps its order.", [1, 2, 3], expect="83010203")
    enc("list.reversed", "The same items in another order encode differently.", [3, 2, 1], expect="83030201")
    enc(
        "list.nested",
        "RFC 8949 Appendix A: [1, [2, 3], [4, 5]].",
        [1, [2, 3], [4, 5]],
        expect="8301820203820405",
    )
    enc(
        "list.mixed",
        "One of each scalar kind.",
        [None, True, False, 0, -1, 1.5, "", b""],
        expect="88f6f5f40020fb3ff80000000000006040",
    )
    enc(
        "list.tuple",
        "A tuple encodes as a list and decodes as one (ports without tuples may skip this).",
        rendering={"tuple": [render(1), render("a")]},
        expect="82016161",
    )
    for n in (1, 23, 24):
        enc(f"list.len.{n}", f"{n} nulls: head {ref_head(4, n).hex()}.", [None] * n)
    for n in (255, 256, 65535, 65536):
        enc(f"list.len.{n}", f"{n} zeros: head {ref_head(4, n).hex()}.", rendering=list_repeat(0, n))
    enc(
        "list.depth-64",
        "64 nested lists holding 0: the deepest nesting allowed (compare encref.depth.list-65).",
        rendering=nest_list(64, 0),
        expect="81" * 64 + "00",
    )
    enc(
        "list.depth-64-empty",
        "63 nested lists around an empty list: 64 levels.",
        rendering=nest_list(64, has_leaf=False),
        expect="81" * 63 + "80",
    )

    # Maps: definite length, keys sorted by their raw UTF-8 bytes.
    enc("map.empty", "The empty map.", {}, expect="a0")
    enc("map.one", "One entry.", {"a": 1}, expect="a1616101")
    enc("map.reordered", "Inserted b then a; sorted a, b.", {"b": 2, "a": 1}, expect="a2616101616202")
    enc(
        "map.prefix-first",
        "Inserted b, aa, a; a prefix sorts first: a, aa, b.",
        {"b": 3, "aa": 2, "a": 1},
        expect="a3616101626161026162" + "03",
    )
    enc(
        "map.bytewise-not-length-first",
        "Bytewise 'aa' < 'b'; RFC 7049 length-first would put 'b' first.",
        {"b": 0, "aa": 1},
        expect="a2626161016162" + "00",
    )
    enc(
        "map.case",
        "Uppercase sorts before lowercase (0x41 < 0x61): A, B, a, b.",
        {"a": 0, "B": 1, "A": 2, "b": 3},
        expect="a4614102614201616100616203",
    )
    enc("map.empty-key", "The empty key sorts first.", {"a": 1, "": 0}, expect="a26000616101")
    enc(
        "map.nul-keys",
        "NUL keys: '\\x00' < 'a' < 'a\\x00'.",
        {"a\x00": 2, "a": 1, "\x00": 0},
        expect="a3610000616101626100" + "02",
    )
    enc(
        "map.non-ascii",
        "Non-ASCII keys sort by their UTF-8 bytes: e, z, U+00E9.",
        {"\u00e9": 2, "z": 1, "e": 0},
        expect="a3616500617a0162c3a902",
    )
    enc(
        "map.nfc-nfd-keys",
        "NFC and NFD e-acute are two different keys; NFD (65 cc 81) sorts first.",
        {"\u00e9": "nfc", "e\u0301": "nfd"},
        expect="a26365cc8163" + "6e6664" + "62c3a963" + "6e6663",
    )
    enc(
        "map.bmp-vs-astral",
        "U+FFFF (ef bf bf) sorts before U+10000 (f0 90 80 80); UTF-16 code-unit order "
        "would put U+10000 (d800 dc00) first.",
        {"\U00010000": 1, "\uffff": 0},
        expect="a263efbfbf0064f090808001",
    )
    enc(
        "map.private-use-vs-emoji",
        "U+E000 sorts before U+1F600 in UTF-8; UTF-16 order disagrees.",
        {"\U0001f600": 1, "\ue000": 0},
        expect="a263ee80800064f09f988001",
    )
    enc(
        "map.utf16-trap",
        "Keys z, U+00E9, U+FF21, U+1F600, U+10FFFF inserted in reverse.",
        {"\U0010ffff": 4, "\U0001f600": 3, "\uff21": 2, "\u00e9": 1, "z": 0},
    )
    enc("map.key-len-23", "A 23-byte key: head 77.", {"k" * 23: 0})
    enc("map.key-len-24", "A 24-byte key: head 7818.", {"k" * 24: 0})
    enc("map.key-len-256", "A 256-byte key: head 790100.", {"k" * 256: 0})
    enc(
        "map.nested-sorting",
        "Maps inside maps and lists are sorted too.",
        {"z": {"b": 1, "a": 2}, "a": [{"d": 0, "c": 1}]},
    )
    enc(
        "map.all-kinds",
        "Every value kind under one map.",
        {
            "null": None,
            "bool": True,
            "int": -1,
            "float": 1.5,
            "text": "x",
            "bytes": b"\x00",
            "list": [],
            "map": {},
        },
    )
    enc(
        "map.digits",
        "Digit keys sort as text: '10' < '9'.",
        {"9": 0, "10": 1},
        expect="a2623130016139" + "00",
    )
    for n in (23, 24, 255, 256, 65535, 65536):
        enc(
            f"map.len.{n}",
            f"{n} entries k00000.. with value null, inserted in descending order: "
            f"head {ref_head(5, n).hex()}.",
            rendering=map_numbered(n, None),
        )
    enc(
        "map.depth-64",
        "64 nested maps {'a': ...} holding null: the deepest nesting allowed.",
        rendering=nest_map(64, "a", None),
        expect="a16161" * 64 + "f6",
    )
    enc(
        "map.rfc8949-example",
        "RFC 8949 Appendix A: {'a': 1, 'b': [2, 3]}.",
        {"a": 1, "b": [2, 3]},
        expect="a26161016162820203",
    )

    # The size bound: at most max_size bytes.
    enc(
        "size.exact",
        "Encoded size 5 equals max_size 5: accepted (compare encref.size.over).",
        "abcd",
        max_size=5,
        expect="6461626364",
    )
    enc(
        "size.list-exact",
        "A list of 8 bytes with max_size 8.",
        [1, "abcde"],
        max_size=8,
        expect="82016561626364" + "65",
    )
    return cases


# --------------------------------------------------------------------------
# intent.json


def make_intent() -> list[dict[str, object]]:
    cases: list[dict[str, object]] = []

    def intent(
        cid: str,
        description: str,
        command_type: str,
        name: str,
        arguments: object = ...,
        target: str | None = None,
        *,
        rendering: dict[str, object] | None = None,
        same_as: str | None = None,
        max_size: int | None = None,
    ) -> None:
        args_rendering = rendering if rendering is not None else render(arguments)
        args = from_rendering(args_rendering, arguments)
        size = max_size or DEFAULT_MAX_SIZE
        record = intent_record(command_type, name, args, target, max_size=size)
        digest = intent_digest(command_type, name, args, target, max_size=size)
        args_digest = arguments_digest(args, max_size=size)
        # Independently: the record is the 5-element array, and the arguments
        # digest hashes exactly the bytes of the fourth element.
        front = b"\x85" + ref_encode(INTENT_TAG) + ref_encode(command_type) + ref_encode(name)
        back = ref_encode(target)
        check(record == front + ref_encode(args) + back, f"{cid}: record differs from the reference encoder")
        check(digest == hashlib.sha256(record).hexdigest(), f"{cid}: digest is not sha256(record)")
        check(
            args_digest == hashlib.sha256(record[len(front) : len(record) - len(back)]).hexdigest(),
            f"{cid}: arguments digest is not sha256 of the arguments' bytes",
        )
        cbor2_agrees(record, [INTENT_TAG, command_type, name, args, target])
        case: dict[str, object] = {
            "id": f"intent.{cid}",
            "description": description,
            "command_type": command_type,
            "name": text(name),
            "arguments": args_rendering,
            "target": render(target),
        }
        if max_size is not None:
            case["max_size"] = max_size
        case.update(record=record.hex(), intent_digest=digest, arguments_digest=args_digest)
        if same_as is not None:
            case["same_intent_as"] = f"intent.{same_as}"
        cases.append(case)

    intent(
        "signal-instance",
        "A signal to the instance (target null) with no arguments.",
        "signal",
        "approve",
        {},
    )
    intent("update-instance", "The same as an update: a different record.", "update", "approve", {})
    intent(
        "signal-run",
        "The signal to one selected run: target is the run id.",
        "signal",
        "approve",
        {},
        "run-0001",
    )
    intent("update-run", "An update to a selected run.", "update", "approve", {}, "run-0001")
    intent("signal-other-run", "Another run id is another target.", "signal", "approve", {}, "run-0002")
    intent("name-case", "Names are case-sensitive: Approve is not approve.", "signal", "Approve", {})
    intent("int-1", "Argument 1 (int).", "signal", "set", [1])
    intent("float-1", "Argument 1.0 (float) differs from 1.", "signal", "set", [1.0])
    intent("text-1", "Argument '1' (text) differs from 1.", "signal", "set", ["1"])
    intent("true", "Argument true differs from 1.", "signal", "set", [True])
    intent("zero", "Argument 0.0.", "update", "set", {"x": 0.0})
    intent("neg-zero", "Argument -0.0 differs from 0.0.", "update", "set", {"x": -0.0})
    intent("map-ab", "Map arguments {a, b}.", "update", "configure", {"a": 1, "b": 2})
    intent(
        "map-ba",
        "The same map inserted b, a: the same intent.",
        "update",
        "configure",
        {"b": 2, "a": 1},
        same_as="map-ab",
    )
    intent("list-12", "List arguments [1, 2].", "signal", "push", [1, 2])
    intent("list-21", "List order matters: [2, 1] differs.", "signal", "push", [2, 1])
    intent(
        "list-as-tuple",
        "A tuple [1, 2] is the same intent as the list (ports without tuples may skip).",
        "signal",
        "push",
        rendering={"tuple": [render(1), render(2)]},
        same_as="list-12",
    )
    order = {
        "customer": {"id": "c-42", "name": "Zoë", "tags": ["vip", "eu"]},
        "items": [{"sku": "A-1", "qty": 2, "price": 9.99}, {"sku": "B-7", "qty": 1, "price": 0.5}],
        "note": None,
        "gift": False,
        "raw": b"\x01\x02",
    }
    intent("nested", "Nested maps and lists of every kind.", "update", "place_order", order, "run-7f3a")
    reordered = {
        "raw": b"\x01\x02",
        "items": [{"price": 9.99, "qty": 2, "sku": "A-1"}, {"qty": 1, "sku": "B-7", "price": 0.5}],
        "gift": False,
        "note": None,
        "customer": {"tags": ["vip", "eu"], "name": "Zoë", "id": "c-42"},
    }
    intent(
        "nested-reordered",
        "The same nested arguments with every map inserted in another order.",
        "update",
        "place_order",
        reordered,
        "run-7f3a",
        same_as="nested",
    )
    intent("empty-list", "Empty list arguments.", "signal", "ping", [])
    intent("empty-map", "Empty map arguments differ from the empty list.", "signal", "ping", {})
    intent(
        "name-nfc",
        "Non-ASCII name in NFC (U+00FC).",
        "signal",
        unicodedata.normalize("NFC", "überweisen"),
        {"amount": 5},
    )
    intent(
        "name-nfd",
        "The same name in NFD (u + U+0308): a different intent, names are not normalised.",
        "signal",
        unicodedata.normalize("NFD", "überweisen"),
        {"amount": 5},
    )
    intent("name-astral", "A name with an astral-plane character.", "update", "\U0001f680launch", ["now"])
    intent(
        "target-non-ascii", "A run id with non-ASCII text.", "signal", "approve", {}, "run-\u00e9\U0001f600"
    )
    intent("nan", "A NaN argument: every NaN is f97e00.", "signal", "measure", {"x": math.nan})
    nan_payload = struct.unpack(">d", bytes.fromhex("fff0000000000001"))[0]
    intent(
        "nan-payload",
        "A negative signalling NaN: the same intent as any other NaN.",
        "signal",
        "measure",
        {"x": nan_payload},
        same_as="nan",
    )
    intent("inf", "Infinities.", "signal", "measure", [math.inf, -math.inf])
    intent("int64-extremes", "The int64 extremes.", "signal", "measure", [2**63 - 1, -(2**63)])
    intent("bytes", "Byte string arguments.", "update", "upload", {"blob": b"\x00\xff\x80"})
    intent(
        "unicode-keys",
        "Argument keys that sort differently in UTF-16.",
        "update",
        "label",
        {"\U00010000": 1, "\uffff": 2, "a": 3},
    )
    intent(
        "args-depth-64",
        "Arguments nested 64 deep are accepted: the limit applies to the arguments, "
        "not the record around them.",
        "signal",
        "deep",
        rendering=nest_list(64, 0),
    )
    intent(
        "args-max-size",
        "Arguments of exactly max_size (6) bytes are accepted; the record is longer.",
        "signal",
        "sized",
        ["abcd"],
        max_size=6,
    )
    return cases


# --------------------------------------------------------------------------
# keys.json


def field_of(code: str) -> str:
    return "command_type" if code == "command_type_invalid" else "request_id"


def make_keys() -> list[dict[str, object]]:
    cases: list[dict[str, object]] = []

    def outcome(
        call: Callable[[], object], ok_member: str, ok: Callable[[object], object]
    ) -> dict[str, object]:
        try:
            result = call()
        except AdmissionError as exc:
            return {"error": {"code": exc.code, "field": exc.field}}  # type: ignore[attr-defined]
        return {ok_member: ok(result)}

    def key(
        cid: str,
        description: str,
        command_type: str,
        value: object = ...,
        *,
        rendering: dict[str, object] | None = None,
        validate: str = "accepted",
        token: str = "token",
    ) -> None:
        """``validate`` / ``token``: the outcome the contract asks for ("accepted", "token" or a code)."""
        rendering = rendering if rendering is not None else render(value)
        loaded = from_rendering(rendering, value)

        def unchanged(returned: object) -> bool:
            check(returned is loaded, f"{cid}: validate_request_id changed the key")
            return True

        validated = outcome(lambda: validate_request_id(loaded, command_type), "accepted", unchanged)
        tokened = outcome(lambda: receipt_token(command_type, loaded), "token", lambda r: r)  # type: ignore[arg-type]
        want_v = (
            {"accepted": True}
            if validate == "accepted"
            else {"error": {"code": validate, "field": field_of(validate)}}
        )
        check(
            validated == want_v, f"{cid}: validate_request_id gives {validated}, the contract says {want_v}"
        )
        if token == "token":
            assert isinstance(loaded, str)
            want = f"{command_type}-v1:{hashlib.sha256(loaded.encode('utf-8')).hexdigest()}"
            check(tokened == {"token": want}, f"{cid}: receipt_token gives {tokened}, expected {want}")
        else:
            want_t = {"error": {"code": token, "field": field_of(token)}}
            check(tokened == want_t, f"{cid}: receipt_token gives {tokened}, the contract says {want_t}")
        cases.append(
            {
                "id": f"key.{cid}",
                "description": description,
                "op": "key",
                "command_type": command_type,
                "key": rendering,
                "validate": validated,
                "receipt_token": tokened,
            }
        )

    key("test", "The key 'test': token signal-v1:9f86... (the contract §2.5 example).", "signal", "test")
    key(
        "test-update",
        "The same key on an update: a different token, an independent receipt (§2.6).",
        "update",
        "test",
    )
    key("lower-a", "The key 'a'.", "signal", "a")
    key("upper-a", "'A' is a different key from 'a' (case-sensitive).", "signal", "A")
    key("uuid", "A typical client key.", "update", "sdk-python-update-0123456789abcdef0123456789abcdef")
    key("nul", "A key containing NUL keeps it: hashed byte-exact.", "signal", "a\x00b")
    key("only-nul", "A key that is one NUL character.", "update", "\x00")
    key("spaces-kept", "The core never trims: ' a ' is its own key (only normalize strips).", "signal", " a ")
    key("nfc", "NFC e-acute (U+00E9).", "signal", "caf\u00e9")
    key(
        "nfd",
        "NFD e + U+0301: a different token from the NFC key (no normalisation).",
        "signal",
        "cafe\u0301",
    )
    key("astral", "One 4-byte character.", "update", "\U0001f600")
    key("max-code-point", "U+10FFFF.", "update", "\U0010ffff")
    key("ascii-255", "255 ASCII characters: the longest key.", "signal", rendering=text_repeat("x", 255))
    key(
        "ascii-256",
        "256 ASCII characters: refused.",
        "signal",
        rendering=text_repeat("x", 256),
        validate="request_id_invalid",
        token="request_id_invalid",
    )
    key(
        "four-byte-255",
        "255 code points of U+1F600 (1020 UTF-8 bytes): accepted, length is in code points.",
        "update",
        rendering=text_repeat("\U0001f600", 255),
    )
    key(
        "four-byte-256",
        "256 code points of U+1F600: refused request_id_invalid.",
        "update",
        rendering=text_repeat("\U0001f600", 256),
        validate="request_id_invalid",
        token="request_id_invalid",
    )
    key("two-byte-255", "255 x U+00E9 (510 bytes): accepted.", "signal", rendering=text_repeat("\u00e9", 255))
    key(
        "nfd-255",
        "85 x (e + U+0301 + U+0301): 255 code points, accepted; NFC would be fewer.",
        "signal",
        rendering=text_repeat("e\u0301\u0301", 85),
    )
    key(
        "empty",
        "The empty key is refused (0 code points).",
        "signal",
        "",
        validate="request_id_invalid",
        token="request_id_invalid",
    )
    key(
        "lone-high-surrogate",
        "A lone high surrogate is not valid Unicode: refused.",
        "signal",
        "\ud800",
        validate="request_id_invalid",
        token="request_id_invalid",
    )
    key(
        "lone-low-surrogate",
        "A lone low surrogate after text: refused.",
        "update",
        "ab\udfff",
        validate="request_id_invalid",
        token="request_id_invalid",
    )
    key(
        "surrogate-pair-code-points",
        "The code points D83D DE00 (a UTF-16 pair written as two code points) are not U+1F600: refused.",
        "signal",
        "\ud83d\ude00",
        validate="request_id_invalid",
        token="request_id_invalid",
    )
    key(
        "not-a-string",
        "A key that is not a string is refused.",
        "signal",
        42,
        validate="request_id_invalid",
        token="request_id_invalid",
    )
    key(
        "null",
        "null is not a key for validate or token (normalize maps it to no key).",
        "update",
        None,
        validate="request_id_invalid",
        token="request_id_invalid",
    )
    key(
        "reserved-signal",
        "A caller's signal with the reserved prefix is refused by validation; the engine "
        "still derives tokens for its own internal signals.",
        "signal",
        "workflow-signal:abc",
        validate="request_id_reserved",
    )
    key(
        "reserved-prefix-only",
        "Just the reserved prefix on a signal.",
        "signal",
        "workflow-signal:",
        validate="request_id_reserved",
    )
    key(
        "reserved-on-update",
        "The reserved prefix is only reserved for signals: accepted on an update.",
        "update",
        "workflow-signal:abc",
    )
    key(
        "reserved-case",
        "The prefix is case-sensitive: Workflow-Signal: is an ordinary key.",
        "signal",
        "Workflow-Signal:abc",
    )
    key(
        "reserved-no-colon",
        "'workflow-signal' without the colon is an ordinary key.",
        "signal",
        "workflow-signal",
    )
    key(
        "reserved-after-space",
        "The core does not trim, so ' workflow-signal:x' does not start with the prefix.",
        "signal",
        " workflow-signal:x",
    )
    key("token-shaped", "A key shaped like a token is still just a key.", "update", "update-v1:" + "0" * 64)
    key(
        "bad-command-type",
        "An unknown command type is refused before the key is looked at.",
        "query",
        "abc",
        validate="command_type_invalid",
        token="command_type_invalid",
    )

    def normalize(
        cid: str, description: str, raw: object, expect: object = ..., *, error: str | None = None
    ) -> None:
        rendering = render(raw)
        loaded = from_rendering(rendering, raw)
        try:
            got: dict[str, object] = {"value": render(normalize_request_id(loaded))}
        except AdmissionError as exc:
            got = {"error": {"code": exc.code, "field": exc.field}}  # type: ignore[attr-defined]
        want = {"error": {"code": error, "field": "request_id"}} if error else {"value": render(expect)}
        check(got == want, f"{cid}: normalize_request_id gives {got}, the contract says {want}")
        cases.append(
            {
                "id": f"norm.{cid}",
                "description": description,
                "op": "normalize",
                "raw": rendering,
                "normalized": got,
            }
        )

    normalize("plain", "A key without surrounding whitespace is unchanged.", "abc", "abc")
    normalize("null", "No key stays no key.", None, None)
    normalize("empty", "The empty string means no key.", "", None)
    normalize("blank", "Only whitespace means no key.", " \t\r\n", None)
    normalize(
        "blank-unicode",
        "Only Unicode spaces (U+3000, U+00A0, U+2028) means no key.",
        "\u3000\u00a0\u2028",
        None,
    )
    normalize("strip-ascii", "Surrounding ASCII whitespace is stripped.", " \t abc \n", "abc")
    normalize("inner-kept", "Inner whitespace is kept.", "  a b\tc  ", "a b\tc")
    normalize("strip-nbsp", "U+00A0 (no-break space) is whitespace.", "\u00a0abc\u00a0", "abc")
    normalize("strip-ideographic", "U+3000 (ideographic space) is whitespace.", "\u3000abc\u3000", "abc")
    normalize(
        "strip-separators",
        "U+1680, U+2000..U+200A, U+2028, U+2029, U+202F, U+205F, U+0085 are whitespace.",
        "\u1680\u2000\u2005\u200a\u2028" + "abc" + "\u2029\u202f\u205f\x85",
        "abc",
    )
    normalize(
        "strip-info-separators",
        "U+001C..U+001F (information separators) are whitespace to str.strip(); "
        "Go's TrimSpace and others keep them.",
        "\x1c\x1dabc\x1e\x1f",
        "abc",
    )
    normalize("strip-vt-ff", "Vertical tab and form feed are whitespace.", "\x0b\x0cabc\x0b\x0c", "abc")
    normalize(
        "keep-zwsp",
        "U+200B (zero-width space) is not whitespace: kept.",
        "\u200babc\u200b",
        "\u200babc\u200b",
    )
    normalize("keep-bom", "U+FEFF (BOM) is not whitespace: kept.", "\ufeffabc", "\ufeffabc")
    normalize(
        "keep-mongolian-vowel-separator",
        "U+180E is not whitespace (since Unicode 6.3): kept.",
        "\u180eabc",
        "\u180eabc",
    )
    normalize("keep-nul", "NUL is not whitespace: kept.", "\x00abc\x00", "\x00abc\x00")
    normalize(
        "no-length-check",
        "Normalising does not validate: 256 characters stay 256 (validation refuses later).",
        " " + "y" * 256 + " ",
        "y" * 256,
    )
    normalize("not-a-string", "A raw value that is not a string is refused.", 7, error="request_id_invalid")
    return cases


# --------------------------------------------------------------------------
# encode_refusals.json


def make_encode_refusals() -> list[dict[str, object]]:
    cases: list[dict[str, object]] = []

    def expect_refusal(cid: str, call: Callable[[], object], code: str, field: str, path: str | None) -> None:
        try:
            call()
        except AdmissionError as exc:
            got = (
                exc.code,
                getattr(exc, "field", None),
                getattr(exc, "path", None) if path is not None else None,
            )
            check(
                got == (code, field, path),
                f"{cid}: refused with {got}, the contract says {(code, field, path)}",
            )
            return
        raise GenerationError(f"{cid}: accepted, the contract says refuse")

    def refuse(
        cid: str,
        description: str,
        value: object = ...,
        path: str = "$",
        *,
        rendering: dict[str, object] | None = None,
        max_size: int | None = None,
    ) -> None:
        rendering = rendering if rendering is not None else render(value)
        loaded = from_rendering(rendering, value)
        size = max_size or DEFAULT_MAX_SIZE
        expect_refusal(cid, lambda: canonical_encode(loaded, max_size=size), "invalid_value", "value", path)
        case: dict[str, object] = {
            "id": f"encref.{cid}",
            "description": description,
            "op": "encode",
            "value": rendering,
        }
        if max_size is not None:
            case["max_size"] = max_size
        case["error"] = {"code": "invalid_value", "field": "value", "path": path}
        cases.append(case)

    def refuse_intent(
        cid: str,
        description: str,
        command_type: str,
        name: object,
        arguments: object = ...,
        target: object = None,
        *,
        code: str = "invalid_value",
        field: str,
        path: str | None,
        rendering: dict[str, object] | None = None,
        max_size: int | None = None,
    ) -> None:
        rendering = rendering if rendering is not None else render(arguments)
        args = from_rendering(rendering, arguments)
        name_value = from_rendering(render(name), name)
        target_value = from_rendering(render(target), target)
        size = max_size or DEFAULT_MAX_SIZE
        for call in (intent_record, intent_digest):
            expect_refusal(
                cid,
                lambda c=call: c(command_type, name_value, args, target_value, max_size=size),  # type: ignore[misc]
                code,
                field,
                path,
            )
        if field == "arguments":
            expect_refusal(cid, lambda: arguments_digest(args, max_size=size), code, field, path)
        case: dict[str, object] = {
            "id": f"encref.{cid}",
            "description": description,
            "op": "intent",
            "command_type": command_type,
            "name": render(name),
            "arguments": rendering,
            "target": render(target),
        }
        if max_size is not None:
            case["max_size"] = max_size
        error: dict[str, object] = {"code": code, "field": field}
        if path is not None:
            error["path"] = path
        case["error"] = error
        cases.append(case)

    refuse("int.2p63", "2^63, one above the int64 maximum: no bignums.", 2**63)
    refuse("int.neg-2p63-1", "-2^63-1, one below the int64 minimum.", -(2**63) - 1)
    refuse("int.2p64", "2^64.", 2**64)
    refuse("int.neg-2p64-1", "-2^64-1, the first value a CBOR negative int cannot hold.", -(2**64) - 1)
    refuse("int.huge", "10^30.", 10**30)
    refuse("int.in-list", "2^63 as the second list item.", [0, 2**63], "$[1]")
    refuse(
        "int.contract-path",
        "The contract's example path: $.items[3].price.",
        {"items": [{"price": 1}, {"price": 2}, {"price": 3}, {"price": 2**63}]},
        "$.items[3].price",
    )
    refuse("key.int", "A map key that is an int.", {1: "a"})
    refuse("key.int-nested", "A non-str key inside a map: the path names the map.", {"a": {1: "x"}}, "$.a")
    refuse("key.bytes", "A map key that is a byte string.", {b"k": 1})
    refuse("key.null", "A map key that is null.", {None: 1})
    refuse("key.bool", "A map key that is a bool.", {True: 1})
    refuse("key.float", "A map key that is a float.", {1.5: 1})
    refuse("key.mixed", "One int key among str keys.", {"a": 1, "b": 2, 3: "c"})
    refuse("text.lone-high-surrogate", "A text that is a lone high surrogate.", "\ud800")
    refuse("text.lone-low-surrogate", "A lone low surrogate inside a list.", ["ok", "a\udfffb"], "$[1]")
    refuse(
        "text.surrogate-pair-code-points",
        "The code points D83D DE00 are two lone surrogates, not U+1F600.",
        {"x": "\ud83d\ude00"},
        "$.x",
    )
    refuse("key.lone-surrogate", "A map key with a lone surrogate: the path names the map.", {"\udfff": 1})
    refuse("key.lone-surrogate-nested", "A nested key with a lone surrogate.", {"ok": {"\ud800x": 1}}, "$.ok")
    refuse(
        "depth.list-65",
        "65 nested lists: one level too deep; the path names the 65th list.",
        rendering=nest_list(65, 0),
        path="$" + "[0]" * 64,
    )
    refuse(
        "depth.list-65-empty",
        "64 nested lists around an empty list: 65 levels.",
        rendering=nest_list(65, has_leaf=False),
        path="$" + "[0]" * 64,
    )
    refuse("depth.map-65", "65 nested maps.", rendering=nest_map(65, "a", None), path="$" + ".a" * 64)
    refuse(
        "depth.in-map",
        "A map holding 64 nested lists is 65 levels.",
        {"deep": from_rendering(nest_list(64, 0))},
        "$.deep" + "[0]" * 63,
    )
    for kind, python in [
        ("set", {1, 2}),
        ("frozenset", frozenset({1})),
        ("decimal", typed_value({"unsupported": "decimal"})),
        ("datetime", typed_value({"unsupported": "datetime"})),
        ("complex", complex(1, 2)),
        ("object", typed_value({"unsupported": "object"})),
    ]:
        refuse(
            f"unsupported.{kind}",
            f"An unsupported type ({kind}): ports use their own unsupported type.",
            rendering={"unsupported": kind},
            path="$",
        )
        del python
    refuse(
        "unsupported.contract-path",
        "A Decimal price: the contract's $.items[3].price example.",
        rendering={
            "map": [
                [
                    text("items"),
                    {
                        "list": [
                            render(0),
                            render(0),
                            render(0),
                            {"map": [[text("price"), {"unsupported": "decimal"}]]},
                        ]
                    },
                ]
            ]
        },
        path="$.items[3].price",
    )
    refuse(
        "unsupported.in-list",
        "An unsupported value in a list.",
        rendering={"list": [render(None), {"unsupported": "set"}]},
        path="$[1]",
    )
    # Path rendering (admission/intent/vectors/README.md, "Paths").
    refuse(
        "path.space", 'A key that is not an identifier is quoted: $["a b"].', {"a b": [2**64]}, '$["a b"][0]'
    )
    refuse("path.digit-first", "An identifier may not start with a digit.", {"1a": 2**64}, '$["1a"]')
    refuse("path.underscore", "Identifiers are [A-Za-z_][A-Za-z0-9_]*.", {"_x9": 2**64}, "$._x9")
    refuse("path.empty-key", "The empty key is quoted.", {"": 2**64}, '$[""]')
    refuse("path.quote", 'A quote in a key is escaped as \\".', {'q"': 2**64}, '$["q\\""]')
    refuse("path.backslash", "A backslash in a key is escaped as \\\\.", {"a\\b": 2**64}, '$["a\\\\b"]')
    refuse("path.latin1", "Non-ASCII below U+0100 is \\xNN.", {"\u00e9": 2**64}, '$["\\xe9"]')
    refuse("path.bmp", "Other BMP characters are \\uNNNN.", {"\u20ac": 2**64}, '$["\\u20ac"]')
    refuse("path.astral", "Astral characters are \\UNNNNNNNN.", {"\U0001f600": 2**64}, '$["\\U0001f600"]')
    refuse(
        "path.control", "Tab, newline and NUL are \\t, \\n, \\x00.", {"\t\n\x00": 2**64}, '$["\\t\\n\\x00"]'
    )
    refuse("path.deep", "Indexes and keys chain.", {"a": [{"b": [0, {"c d": 2**64}]}]}, '$.a[0].b[1]["c d"]')
    refuse(
        "path.first-in-canonical-order",
        "Two refused values: the first in canonical order (key 'a') is named.",
        rendering={"map": [[text("b"), render(2**64)], [text("a"), {"unsupported": "set"}]]},
        path="$.a",
    )
    refuse("size.over", "5 encoded bytes with max_size 4 (compare enc.size.exact).", "abcd", max_size=4)
    refuse("size.list-over", "A list of 8 bytes with max_size 7.", [1, "abcde"], max_size=7)
    refuse(
        "size.default",
        "1 MiB + 1 byte with the default limit (compare enc.text.default-max-size).",
        rendering=text_repeat("a", DEFAULT_MAX_SIZE - 4),
    )

    refuse_intent(
        "intent.args-int",
        "Arguments must be a list or a map, not an int.",
        "signal",
        "set",
        1,
        field="arguments",
        path="$",
    )
    refuse_intent(
        "intent.args-text",
        "Arguments must be a list or a map, not text.",
        "signal",
        "set",
        "x",
        field="arguments",
        path="$",
    )
    refuse_intent(
        "intent.args-null",
        "Arguments must be a list or a map, not null.",
        "update",
        "set",
        None,
        field="arguments",
        path="$",
    )
    refuse_intent(
        "intent.args-bytes",
        "Arguments must be a list or a map, not bytes.",
        "update",
        "set",
        b"",
        field="arguments",
        path="$",
    )
    refuse_intent(
        "intent.args-value",
        "A refused value inside the arguments names its path.",
        "update",
        "set",
        {"n": 2**63},
        field="arguments",
        path="$.n",
    )
    refuse_intent(
        "intent.args-depth-65",
        "Arguments nested 65 deep.",
        "signal",
        "deep",
        rendering=nest_list(65, 0),
        field="arguments",
        path="$" + "[0]" * 64,
    )
    refuse_intent(
        "intent.args-size",
        "Arguments of 7 bytes with max_size 6.",
        "signal",
        "sized",
        ["abcde"],
        max_size=6,
        field="arguments",
        path="$",
    )
    refuse_intent("intent.name-empty", "An empty name is refused.", "signal", "", {}, field="name", path="")
    refuse_intent("intent.name-not-text", "A name must be text.", "signal", 5, {}, field="name", path="")
    refuse_intent(
        "intent.name-surrogate",
        "A name with a lone surrogate.",
        "update",
        "go\ud800",
        {},
        field="name",
        path="",
    )
    refuse_intent(
        "intent.target-empty",
        "An empty run id is refused (null means instance scope).",
        "signal",
        "approve",
        {},
        "",
        field="target",
        path="",
    )
    refuse_intent(
        "intent.target-not-text",
        "A run id must be text (or null for instance scope).",
        "signal",
        "approve",
        {},
        7,
        field="target",
        path="",
    )
    refuse_intent(
        "intent.target-surrogate",
        "A run id with a lone surrogate.",
        "update",
        "approve",
        {},
        "run-\udc00",
        field="target",
        path="",
    )
    refuse_intent(
        "intent.command-type",
        "Only 'signal' and 'update' are command types.",
        "query",
        "approve",
        {},
        code="command_type_invalid",
        field="command_type",
        path=None,
    )
    refuse_intent(
        "intent.command-type-case",
        "Command types are case-sensitive.",
        "Signal",
        "approve",
        {},
        code="command_type_invalid",
        field="command_type",
        path=None,
    )
    return cases


# --------------------------------------------------------------------------
# decode_refusals.json

ACCEPTS = "accepts"  # cbor2 reads it (well-formed, not canonical)
REJECTS = "rejects"  # cbor2 refuses it too (malformed)


def make_decode_refusals() -> list[dict[str, object]]:
    cases: list[dict[str, object]] = []

    def refuse(
        cid: str, description: str, hx: str, lenient: str | None, *, max_size: int | None = None
    ) -> None:
        """``lenient``: what the independent decoder cbor2 does with it (None: not checked)."""
        data = bytes.fromhex(hx)
        try:
            canonical_decode(data, max_size=max_size or DEFAULT_MAX_SIZE)
        except AdmissionError as exc:
            check(
                (exc.code, getattr(exc, "field", None)) == ("invalid_value", "data"),
                f"{cid}: refused as {exc}",
            )
        else:
            raise GenerationError(f"{cid}: {hx} decoded, the contract says refuse")
        if lenient is not None:
            try:
                cbor2.loads(data)
                got = ACCEPTS
            except Exception:  # cbor2 raises several types; any refusal counts
                got = REJECTS
            check(got == lenient, f"{cid}: cbor2 {got} {hx}, expected it {lenient}")
        case: dict[str, object] = {"id": f"decref.{cid}", "description": description, "cbor": hx}
        if max_size is not None:
            case["max_size"] = max_size
        case["error"] = {"code": "invalid_value", "field": "data"}
        cases.append(case)

    # Non-shortest arguments, at every width.
    for hx, note in [
        ("1800", "0 with a one-byte argument"),
        ("1817", "23 with a one-byte argument"),
        ("190000", "0 with a two-byte argument"),
        ("1900ff", "255 with a two-byte argument"),
        ("1a00000000", "0 with a four-byte argument"),
        ("1a0000ffff", "65535 with a four-byte argument"),
        ("1b0000000000000000", "0 with an eight-byte argument"),
        ("1b00000000ffffffff", "2^32-1 with an eight-byte argument"),
        ("3800", "-1 with a one-byte argument"),
        ("3817", "-24 with a one-byte argument"),
        ("3900ff", "-256 with a two-byte argument"),
        ("3a0000ffff", "-65536 with a four-byte argument"),
        ("3b00000000ffffffff", "-2^32 with an eight-byte argument"),
        ("780161", "text 'a' with a one-byte length"),
        ("79000161", "text 'a' with a two-byte length"),
        ("7a0000000161", "text 'a' with a four-byte length"),
        ("7b000000000000000161", "text 'a' with an eight-byte length"),
        ("5801ff", "bytes ff with a one-byte length"),
        ("5b000000000000000100", "one byte with an eight-byte length"),
        ("9800", "the empty list with a one-byte count"),
        ("990000", "the empty list with a two-byte count"),
        ("b800", "the empty map with a one-byte count"),
        ("ba00000000", "the empty map with a four-byte count"),
        ("a178016100", "map key 'a' with a one-byte length"),
    ]:
        refuse(f"non-shortest.{hx}", f"Non-shortest argument: {note}.", hx, ACCEPTS)
    # Maps.
    refuse("map.unsorted", "Keys b, a: not sorted.", "a2616201616100", ACCEPTS)
    refuse(
        "map.length-first",
        "Keys b, aa: RFC 7049 length-first order, not bytewise.",
        "a26162006261610" + "1",
        ACCEPTS,
    )
    refuse("map.prefix-after", "Keys aa, a: a prefix must come first.", "a26261610161610" + "0", ACCEPTS)
    refuse(
        "map.utf16-order",
        "Keys U+10000, U+FFFF: UTF-16 order, not UTF-8.",
        "a264f09080800063efbfbf01",
        ACCEPTS,
    )
    refuse("map.duplicate", "Key a twice.", "a2616100616101", ACCEPTS)
    refuse("map.duplicate-equal-values", "Key a twice with equal values.", "a2616100616100", ACCEPTS)
    refuse("map.int-key", "An int key.", "a10102", ACCEPTS)
    refuse("map.bytes-key", "A byte-string key.", "a1416100", ACCEPTS)
    refuse("map.null-key", "A null key.", "a1f600", ACCEPTS)
    refuse("map.array-key", "An array key.", "a18000", None)
    refuse("map.unsorted-nested", "An unsorted map inside a list.", "8101a2616201616100", ACCEPTS)
    # Indefinite lengths and break.
    refuse("indefinite.list", "Indefinite-length empty list.", "9fff", ACCEPTS)
    refuse("indefinite.list-items", "Indefinite-length list [1].", "9f01ff", ACCEPTS)
    refuse("indefinite.map", "Indefinite-length empty map.", "bfff", ACCEPTS)
    refuse("indefinite.map-items", "Indefinite-length map {a: 1}.", "bf616101ff", ACCEPTS)
    refuse("indefinite.text", "Indefinite-length text of one chunk 'a'.", "7f6161ff", ACCEPTS)
    refuse("indefinite.bytes", "Indefinite-length bytes of one chunk.", "5f4100ff", ACCEPTS)
    refuse("break.alone", "A lone break byte.", "ff", REJECTS)
    refuse("break.in-list", "A break inside a definite list.", "81ff", REJECTS)
    # Tags.
    refuse("tag.0", "Tag 0 (date/time string).", "c074323031332d30332d32315432303a30343a30305a", ACCEPTS)
    refuse("tag.1", "Tag 1 (epoch time).", "c11a514b67b0", ACCEPTS)
    refuse("tag.2-bignum", "Tag 2 (unsigned bignum) for 1: no bignums.", "c24101", ACCEPTS)
    refuse("tag.2-bignum-2p64", "Tag 2 bignum 2^64.", "c249010000000000000000", ACCEPTS)
    refuse("tag.3-bignum", "Tag 3 (negative bignum).", "c34100", ACCEPTS)
    refuse("tag.self-describe", "Tag 55799 (self-described CBOR) around 0.", "d9d9f700", ACCEPTS)
    refuse("tag.nested", "A tag inside a list.", "81c100", ACCEPTS)
    # Simple values.
    refuse("simple.undefined", "undefined (f7).", "f7", ACCEPTS)
    refuse("simple.0", "Simple value 0 (e0).", "e0", ACCEPTS)
    refuse("simple.16", "Simple value 16 (f0).", "f0", ACCEPTS)
    refuse("simple.19", "Simple value 19 (f3).", "f3", ACCEPTS)
    refuse("simple.32", "Simple value 32 in two bytes (f8 20).", "f820", ACCEPTS)
    refuse("simple.255", "Simple value 255 (f8 ff).", "f8ff", ACCEPTS)
    refuse("simple.false-two-byte", "false in the two-byte form (f8 14): not well-formed.", "f814", REJECTS)
    # Floats: only fb finite, and the three 3-byte specials.
    refuse("half.1", "Half-precision 1.0 (f93c00): finite floats are 8 bytes.", "f93c00", ACCEPTS)
    refuse("half.neg-0", "Half-precision -0.0 (f98000).", "f98000", ACCEPTS)
    refuse("half.0", "Half-precision 0.0 (f90000).", "f90000", ACCEPTS)
    refuse("half.subnormal", "Half-precision subnormal (f90001).", "f90001", ACCEPTS)
    refuse(
        "half.nan-payload",
        "Half-precision NaN with another payload (f97e01): only f97e00.",
        "f97e01",
        ACCEPTS,
    )
    refuse("half.nan-negative", "Half-precision negative NaN (f9fe00).", "f9fe00", ACCEPTS)
    refuse("half.nan-signaling", "Half-precision signalling NaN (f97c01).", "f97c01", ACCEPTS)
    refuse("single.1", "Single-precision 1.0.", "fa3f800000", ACCEPTS)
    refuse("single.0", "Single-precision 0.0.", "fa00000000", ACCEPTS)
    refuse("single.nan", "Single-precision NaN.", "fa7fc00000", ACCEPTS)
    refuse("single.inf", "Single-precision infinity.", "fa7f800000", ACCEPTS)
    refuse("double.nan", "NaN in 8 bytes: must be f97e00.", "fb7ff8000000000000", ACCEPTS)
    refuse("double.nan-negative", "Negative NaN in 8 bytes.", "fbfff8000000000000", ACCEPTS)
    refuse("double.nan-payload", "NaN with payload in 8 bytes.", "fb7ff0000000000001", ACCEPTS)
    refuse("double.inf", "+infinity in 8 bytes: must be f97c00.", "fb7ff0000000000000", ACCEPTS)
    refuse("double.neg-inf", "-infinity in 8 bytes: must be f9fc00.", "fbfff0000000000000", ACCEPTS)
    # Invalid UTF-8.
    for hx, note in [
        ("62c080", "overlong NUL (c0 80)"),
        ("62c1bf", "overlong two-byte form (c1 bf)"),
        ("63e08080", "overlong three-byte form (e0 80 80)"),
        ("64f0808080", "overlong four-byte form (f0 80 80 80)"),
        ("63eda080", "the surrogate U+D800 (ed a0 80)"),
        ("63edbfbf", "the surrogate U+DFFF (ed bf bf)"),
        ("66eda0bdedb880", "a surrogate pair in CESU-8 (ed a0 bd ed b8 80)"),
        ("64f4908080", "above U+10FFFF (f4 90 80 80)"),
        ("65f888808080", "a five-byte sequence"),
        ("61ff", "the byte ff"),
        ("61fe", "the byte fe"),
        ("6180", "a lone continuation byte"),
        ("61c3", "a truncated two-byte sequence"),
        ("62e282", "a truncated three-byte sequence"),
        ("63f09f98", "a truncated four-byte sequence"),
        ("6361c361", "a lead byte followed by ASCII"),
    ]:
        refuse(f"utf8.{hx}", f"Invalid UTF-8 in text: {note}.", hx, REJECTS)
    refuse("utf8.map-key", "Invalid UTF-8 in a map key (ff).", "a161ff00", REJECTS)
    # Trailing bytes.
    refuse("trailing.int", "0 followed by 0.", "0000", ACCEPTS)
    refuse("trailing.null", "Two nulls.", "f6f6", ACCEPTS)
    refuse("trailing.list", "An empty list then a byte.", "8000", ACCEPTS)
    refuse("trailing.break", "0 followed by a break byte.", "00ff", ACCEPTS)
    # Truncated inputs.
    for hx, note in [
        ("", "no bytes at all"),
        ("18", "a one-byte argument missing"),
        ("1901", "a two-byte argument cut short"),
        ("1a000000", "a four-byte argument cut short"),
        ("1b00000000000000", "an eight-byte argument cut short"),
        ("6261", "text of 2 bytes with 1 present"),
        ("41", "bytes of 1 with none present"),
        ("81", "a list of 1 with no item"),
        ("8201", "a list of 2 with 1 item"),
        ("a1", "a map of 1 with no entry"),
        ("a16161", "a map key with no value"),
        ("fb3ff0", "a double cut short"),
        ("f97e", "a half cut short"),
        ("5affffffff", "bytes announcing 2^32-1 bytes"),
        ("7b7fffffffffffffff", "text announcing 2^63-1 bytes"),
        ("9bffffffffffffffff", "a list announcing 2^64-1 items"),
        ("bb7fffffffffffffff", "a map announcing 2^63-1 entries"),
    ]:
        refuse(f"truncated.{hx or 'empty'}", f"Truncated: {note}.", hx, REJECTS)
    # Ints outside int64.
    refuse("int.2p63", "2^63: above int64.", "1b8000000000000000", ACCEPTS)
    refuse("int.2p64-1", "2^64-1.", "1bffffffffffffffff", ACCEPTS)
    refuse("int.neg-2p63-1", "-2^63-1: below int64.", "3b8000000000000000", ACCEPTS)
    refuse("int.neg-2p64", "-2^64.", "3bffffffffffffffff", ACCEPTS)
    refuse("int.in-list", "2^63 inside a list.", "811b8000000000000000", ACCEPTS)
    # Reserved additional information 28..30.
    for hx, note in [
        ("1c", "major 0, ai 28"),
        ("1d", "major 0, ai 29"),
        ("1e", "major 0, ai 30"),
        ("3c", "major 1, ai 28"),
        ("5d", "major 2, ai 29"),
        ("7e", "major 3, ai 30"),
        ("9c", "major 4, ai 28"),
        ("bd", "major 5, ai 29"),
        ("fc", "major 7, ai 28"),
        ("fe", "major 7, ai 30"),
        ("1f", "major 0, ai 31 (indefinite is not defined for ints)"),
    ]:
        refuse(f"reserved.{hx}", f"Reserved additional information: {note}.", hx, REJECTS)
    # Depth.
    refuse(
        "depth.list-65",
        "65 nested lists holding 0 (64 are accepted: enc.list.depth-64).",
        "81" * 65 + "00",
        ACCEPTS,
    )
    refuse(
        "depth.list-65-empty", "64 nested lists around an empty list: 65 levels.", "81" * 64 + "80", ACCEPTS
    )
    refuse("depth.map-65", "65 nested maps {'a': ...} holding null.", "a16161" * 65 + "f6", ACCEPTS)
    # Size.
    refuse("size.over", "4 bytes of input with max_size 3.", "43010203", ACCEPTS, max_size=3)
    return cases


# --------------------------------------------------------------------------
# Writing.


def render_file(category: str, cases: list[dict[str, object]]) -> str:
    """One case per line, so that an appended case is a one-line diff."""
    document = {
        "format": VECTORS_FORMAT,
        "encoding": INTENT_VERSION,
        "category": category,
        "description": FILE_DESCRIPTIONS[category],
    }
    lines = ["{"]
    lines += [f"  {json.dumps(k)}: {json.dumps(v, ensure_ascii=True)}," for k, v in document.items()]
    lines.append('  "cases": [')
    for i, case in enumerate(cases):
        comma = "," if i + 1 < len(cases) else ""
        lines.append("    " + json.dumps(case, ensure_ascii=True, separators=(", ", ": ")) + comma)
    lines += ["  ]", "}"]
    result = "\n".join(lines) + "\n"
    check(json.loads(result) == {**document, "cases": cases}, f"{category}: rendering does not parse back")
    return result


MANIFEST_HEADER = """\
# Append-only list of released golden vectors: "<file> <id> <sha256 of the case's canonical JSON>".
# Written by tools/make_vectors.py; a listed case never changes or disappears (README.md beside this file).
"""


def build() -> dict[str, list[dict[str, object]]]:
    makers = {
        "encode": make_encode,
        "intent": make_intent,
        "keys": make_keys,
        "encode_refusals": make_encode_refusals,
        "decode_refusals": make_decode_refusals,
    }
    return {category: makers[category]() for category in VECTOR_CATEGORIES}


def manifest_text(vectors: dict[str, list[dict[str, object]]], base: list[tuple[str, str, str]]) -> str:
    current = {
        (f"{c}.json", str(case["id"])): case_digest(case) for c, cases in vectors.items() for case in cases
    }
    problems = []
    for file_name, case_id, digest in base:
        now = current.get((file_name, case_id))
        if now is None:
            problems.append(f"{file_name} {case_id}: released but no longer generated")
        elif now != digest:
            problems.append(f"{file_name} {case_id}: released with sha256 {digest}, now {now}")
    if problems:
        raise GenerationError(
            "released vectors would change (add new cases instead):\n  " + "\n  ".join(problems)
        )
    listed = {(f, i) for f, i, _ in base}
    lines = [f"{f} {i} {d}" for f, i, d in base]
    lines += [f"{f} {i} {d}" for (f, i), d in current.items() if (f, i) not in listed]
    return MANIFEST_HEADER + "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument(
        "outdir", nargs="?", default=str(VECTORS), help="where to write (default: admission/intent/vectors/)"
    )
    parser.add_argument(
        "--base-manifest",
        default=str(VECTORS / MANIFEST_NAME),
        help="the released MANIFEST to append to (default: the one in admission/intent/vectors/; "
        "ignored if absent)",
    )
    args = parser.parse_args(argv)
    if ACCELERATED:
        print(
            "make_vectors: the C accelerator is loaded; import admission after this module", file=sys.stderr
        )
        return 1
    out = Path(args.outdir)
    base_path = Path(args.base_manifest)
    try:
        vectors = build()
        base = load_manifest(base_path) if base_path.is_file() else []
        files = {f"{c}.json": render_file(c, cases) for c, cases in vectors.items()}
        files[MANIFEST_NAME] = manifest_text(vectors, base)
    except GenerationError as exc:
        print(f"make_vectors: {exc}", file=sys.stderr)
        return 1
    out.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        (out / name).write_bytes(content.encode("ascii"))
    # The one loader must accept what was written.
    loaded = load_vectors(out)
    total = sum(len(cases) for cases in loaded.values())
    counts = ", ".join(f"{c} {len(cases)}" for c, cases in loaded.items())
    print(f"wrote {total} cases to {out}: {counts}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
