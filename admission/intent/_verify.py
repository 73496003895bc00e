"""Golden vectors for ``intent-v1``: the verifier.

:func:`verify_vectors` reads the vectors through the one loader
(:mod:`admission.intent._vectors`), re-derives every expected output with the
current code and checks the append-only ``MANIFEST``.  A digest released in a
vector must be recomputed bit-for-bit forever (contract §3), so any case that
moved is reported.
"""

from __future__ import annotations

import hashlib
import math
import os
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib.resources.abc import Traversable
from typing import Final

from admission.errors import AdmissionError
from admission.intent._encoding import (
    DEFAULT_MAX_SIZE,
    INTENT_TAG,
    arguments_digest,
    canonical_decode,
    canonical_encode,
    intent_digest,
    intent_record,
)
from admission.intent._keys import normalize_request_id, receipt_token, validate_request_id
from admission.intent._location import folder
from admission.intent._vectors import (
    MANIFEST_NAME,
    VectorFormatError,
    case_digest,
    load_manifest,
    load_vectors,
    typed_value,
)

__all__ = ["VerifyReport", "verify_vectors"]


@dataclass(frozen=True)
class VerifyReport:
    """What :func:`verify_vectors` found.

    ``counts`` maps each category (file stem) to the number of cases checked;
    ``failures`` has one line per mismatch, ``"<file> <id>: <what differed>"``.
    """

    counts: dict[str, int]
    failures: list[str]

    @property
    def ok(self) -> bool:
        """True when every case re-derived exactly and the MANIFEST holds."""
        return not self.failures


def _same(a: object, b: object) -> bool:
    """Typed equality as the encoding preserves it (tuples as lists, every NaN alike)."""
    ta = list if type(a) is tuple else type(a)
    tb = list if type(b) is tuple else type(b)
    if ta is not tb:
        return False
    if isinstance(a, float) and isinstance(b, float):
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return struct.pack(">d", a) == struct.pack(">d", b)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return a == b


def _max_size(case: dict[str, object]) -> int:
    size = case.get("max_size", DEFAULT_MAX_SIZE)
    assert isinstance(size, int)
    return size


def _error_mismatch(exc: AdmissionError, expected: dict[str, object]) -> str | None:
    got = {"code": exc.code, "field": getattr(exc, "field", None)}
    if "path" in expected:
        got["path"] = getattr(exc, "path", None)
    wrong = [f"{k} {got[k]!r} (expected {expected[k]!r})" for k in expected if got[k] != expected[k]]
    return f"refused with {', '.join(wrong)}: {exc}" if wrong else None


def _expect_refusal(call: Callable[[], object], expected: dict[str, object], what: str) -> Iterator[str]:
    try:
        result = call()
    except AdmissionError as exc:
        mismatch = _error_mismatch(exc, expected)
        if mismatch:
            yield f"{what} {mismatch}"
        return
    except Exception as exc:
        # A crash is not a refusal: a port must reject bad input cleanly.
        yield f"{what} raised {type(exc).__name__} instead of {expected['code']}: {exc}"
        return
    shown = result.hex() if isinstance(result, bytes) else repr(result)
    yield f"{what} accepted (returned {shown[:80]}) but must refuse with {expected['code']}"


def _verify_encode(case: dict[str, object]) -> Iterator[str]:
    value = typed_value(case["value"])
    max_size = _max_size(case)
    expected: bytes | None = bytes.fromhex(str(case["cbor"])) if "cbor" in case else None
    try:
        got: bytes | None = canonical_encode(value, max_size=max_size)
    except AdmissionError as exc:
        got = None
        yield f"encode refused: {exc}"
    if got is not None and expected is not None and got != expected:
        yield f"encode gave {got.hex()[:120]}, expected {expected.hex()[:120]}"
    elif got is not None and expected is None:
        digest = hashlib.sha256(got).hexdigest()
        prefix = str(case["cbor_prefix"])
        if len(got) != case["cbor_length"] or digest != case["cbor_sha256"]:
            yield (
                f"encode gave {len(got)} bytes with sha256 {digest}, "
                f"expected {case['cbor_length']} bytes with {case['cbor_sha256']}"
            )
        elif not got.hex().startswith(prefix):
            yield f"encode starts {got[: len(prefix) // 2].hex()}, expected {prefix}"
        else:
            expected = got  # proven equal to the vector's bytes by length, hash and prefix
    if expected is None:
        return
    # Contract §3: the vector's bytes decode strictly to the value and
    # re-encode to themselves, whatever the encoder did above.
    try:
        decoded = canonical_decode(expected, max_size=max(max_size, len(expected)))
    except AdmissionError as exc:
        yield f"strict decode refused the canonical bytes: {exc}"
        return
    if not _same(decoded, value):
        yield f"strict decode gave {decoded!r:.120}, expected the value {value!r:.120}"
    try:
        again = canonical_encode(decoded, max_size=max(max_size, len(expected)))
    except AdmissionError as exc:
        yield f"re-encoding the decoded value refused: {exc}"
        return
    if again != expected:
        yield f"decode + re-encode gave {again.hex()[:120]}, not the canonical bytes"


def _intent_inputs(case: dict[str, object]) -> tuple[str, object, object, object]:
    command_type = case["command_type"]
    assert isinstance(command_type, str)
    return (
        command_type,
        typed_value(case["name"]),
        typed_value(case["arguments"]),
        typed_value(case["target"]),
    )


def _verify_intent(case: dict[str, object]) -> Iterator[str]:
    command_type, name, arguments, target = _intent_inputs(case)
    max_size = _max_size(case)
    try:
        record = intent_record(command_type, name, arguments, target, max_size=max_size)  # type: ignore[arg-type]
        digest = intent_digest(command_type, name, arguments, target, max_size=max_size)  # type: ignore[arg-type]
        args_digest = arguments_digest(arguments, max_size=max_size)
    except AdmissionError as exc:
        yield f"intent refused: {exc}"
        return
    if record.hex() != case["record"]:
        yield f"record {record.hex()[:120]}, expected {str(case['record'])[:120]}"
    if digest != case["intent_digest"]:
        yield f"intent_digest {digest}, expected {case['intent_digest']}"
    if hashlib.sha256(record).hexdigest() != digest:
        yield "intent_digest is not the SHA-256 of the record"
    if args_digest != case["arguments_digest"]:
        yield f"arguments_digest {args_digest}, expected {case['arguments_digest']}"
    # The record is not decoded whole: the limits apply to the arguments, so a
    # record around arguments 64 deep is 65 deep and the strict decoder refuses
    # it.  Its parts are checked instead: the fixed head, the arguments' own
    # canonical bytes (which decode strictly), the target.
    front = b"\x85" + b"".join(canonical_encode(part) for part in (INTENT_TAG, command_type, name))
    back = canonical_encode(target)
    middle = record[len(front) : len(record) - len(back)]
    if not (record.startswith(front) and record.endswith(back) and len(record) >= len(front) + len(back)):
        yield "the record is not [tag, type, name, arguments, target]"
        return
    if hashlib.sha256(middle).hexdigest() != args_digest:
        yield "arguments_digest is not the SHA-256 of the arguments' bytes inside the record"
    try:
        decoded = canonical_decode(middle, max_size=max(max_size, len(middle)))
    except AdmissionError as exc:
        yield f"strict decode refused the arguments' bytes: {exc}"
        return
    if not _same(decoded, arguments):
        yield f"the record's arguments decode to {decoded!r:.120}, not the arguments"


def _verify_intent_relations(cases: list[dict[str, object]]) -> Iterator[str]:
    """``same_intent_as`` links are the only equal digests in the file (contract §3 examples)."""
    by_id = {str(c["id"]): c for c in cases}
    groups: dict[object, list[str]] = {}
    root: dict[str, str] = {}
    for case in cases:
        case_id = str(case["id"])
        groups.setdefault(case["intent_digest"], []).append(case_id)
        link = case.get("same_intent_as")
        if link is None:
            root[case_id] = case_id
            continue
        if link not in root:
            root[case_id] = case_id
            yield f"intent.json {case_id}: same_intent_as must name an earlier case, got {link!r}"
            continue
        root[case_id] = root[str(link)]
        if by_id[str(link)]["intent_digest"] != case["intent_digest"]:
            yield f"intent.json {case_id}: intent_digest differs from {link}, which it must equal"
    for ids in groups.values():
        roots = {root.get(i, i) for i in ids}
        if len(roots) > 1:
            others = ", ".join(ids[1:])
            yield f"intent.json {ids[0]}: equal intent_digest to {others} without a same_intent_as link"


def _verify_key(case: dict[str, object]) -> Iterator[str]:
    command_type = str(case["command_type"])
    key = typed_value(case["key"])
    validate = case["validate"]
    assert isinstance(validate, dict)
    if "error" in validate:
        yield from _expect_refusal(
            lambda: validate_request_id(key, command_type), validate["error"], "validate_request_id"
        )
    else:
        try:
            returned = validate_request_id(key, command_type)
        except AdmissionError as exc:
            yield f"validate_request_id refused: {exc}"
        else:
            if returned != key:
                yield f"validate_request_id returned {returned!r:.80}, not the key unchanged"
    token = case["receipt_token"]
    assert isinstance(token, dict)
    if "error" in token:
        yield from _expect_refusal(lambda: receipt_token(command_type, key), token["error"], "receipt_token")  # type: ignore[arg-type]
        return
    try:
        got = receipt_token(command_type, key)  # type: ignore[arg-type]
    except AdmissionError as exc:
        yield f"receipt_token refused: {exc}"
        return
    if got != token["token"]:
        yield f"receipt_token {got}, expected {token['token']}"
    # The token is defined from the key's UTF-8 bytes (contract §2.5).
    assert isinstance(key, str)
    if got != f"{command_type}-v1:{hashlib.sha256(key.encode('utf-8')).hexdigest()}":
        yield "receipt_token is not <type>-v1: + SHA-256 of the key's UTF-8 bytes"


def _verify_normalize(case: dict[str, object]) -> Iterator[str]:
    raw = typed_value(case["raw"])
    expected = case["normalized"]
    assert isinstance(expected, dict)
    if "error" in expected:
        yield from _expect_refusal(
            lambda: normalize_request_id(raw), expected["error"], "normalize_request_id"
        )
        return
    try:
        got = normalize_request_id(raw)
    except AdmissionError as exc:
        yield f"normalize_request_id refused: {exc}"
        return
    want = typed_value(expected["value"])
    if not _same(got, want):
        yield f"normalize_request_id gave {got!r:.80}, expected {want!r:.80}"


def _verify_keys(case: dict[str, object]) -> Iterator[str]:
    if case["op"] == "key":
        yield from _verify_key(case)
    else:
        yield from _verify_normalize(case)


def _verify_encode_refusal(case: dict[str, object]) -> Iterator[str]:
    error = case["error"]
    assert isinstance(error, dict)
    max_size = _max_size(case)
    if case["op"] == "encode":
        value = typed_value(case["value"])
        yield from _expect_refusal(lambda: canonical_encode(value, max_size=max_size), error, "encode")
        return
    command_type, name, arguments, target = _intent_inputs(case)
    yield from _expect_refusal(
        lambda: intent_record(command_type, name, arguments, target, max_size=max_size),  # type: ignore[arg-type]
        error,
        "intent_record",
    )
    yield from _expect_refusal(
        lambda: intent_digest(command_type, name, arguments, target, max_size=max_size),  # type: ignore[arg-type]
        error,
        "intent_digest",
    )
    if error.get("field") == "arguments":
        # The arguments alone are refused the same way by their own digest.
        yield from _expect_refusal(
            lambda: arguments_digest(arguments, max_size=max_size), error, "arguments_digest"
        )


def _verify_decode_refusal(case: dict[str, object]) -> Iterator[str]:
    data = bytes.fromhex(str(case["cbor"]))
    error = case["error"]
    assert isinstance(error, dict)
    max_size = _max_size(case)
    yield from _expect_refusal(lambda: canonical_decode(data, max_size=max_size), error, "decode")


_VERIFIERS: Final[dict[str, Callable[[dict[str, object]], Iterator[str]]]] = {
    "encode": _verify_encode,
    "intent": _verify_intent,
    "keys": _verify_keys,
    "encode_refusals": _verify_encode_refusal,
    "decode_refusals": _verify_decode_refusal,
}


def _verify_manifest(root: Traversable, vectors: dict[str, list[dict[str, object]]]) -> Iterator[str]:
    path = root / MANIFEST_NAME
    if not path.is_file():
        yield f"{MANIFEST_NAME}: missing; every released case must be listed (run tools/make_vectors.py)"
        return
    try:
        entries = load_manifest(path)
    except (VectorFormatError, UnicodeDecodeError) as exc:
        yield f"{MANIFEST_NAME}: {exc}"
        return
    present = {
        (f"{category}.json", str(case["id"])): case for category, cases in vectors.items() for case in cases
    }
    listed = set()
    for file_name, case_id, digest in entries:
        listed.add((file_name, case_id))
        case = present.get((file_name, case_id))
        if case is None:
            yield (
                f"{file_name} {case_id}: listed in {MANIFEST_NAME} but missing "
                "(released cases are never removed)"
            )
        elif case_digest(case) != digest:
            yield (
                f"{file_name} {case_id}: changed after release ({MANIFEST_NAME} sha256 {digest}, "
                f"now {case_digest(case)}); add a new case instead"
            )
    for file_name, case_id in present:
        if (file_name, case_id) not in listed:
            yield (
                f"{file_name} {case_id}: not listed in {MANIFEST_NAME} "
                "(run tools/make_vectors.py to append it)"
            )


def verify_vectors(directory: str | os.PathLike[str] | Traversable | None = None) -> VerifyReport:
    """Re-derive every vector in ``directory`` with the current code and check the MANIFEST.

    Without ``directory``, the vectors that ship with the package
    (:func:`~admission.intent.shipped_vectors`): the installed code checked
    against the installed vectors.

    Encode cases are encoded, strictly decoded and re-encoded; intent cases
    give the record and both digests; key cases the validation outcome and the
    receipt token (or the refusal code); refusal cases must be refused with the
    expected error code, field and (for encoding) path.  A malformed file is
    reported as a failure rather than raised, so a caller can print it.
    """
    root = folder(directory)
    try:
        vectors = load_vectors(root)
    except VectorFormatError as exc:
        return VerifyReport(counts={}, failures=[f"malformed vectors: {exc}"])
    counts: dict[str, int] = {}
    failures: list[str] = []
    for category, cases in vectors.items():
        for case in cases:
            try:
                problems = list(_VERIFIERS[category](case))
            except Exception as exc:
                problems = [f"unexpected {type(exc).__name__}: {exc}"]
            failures.extend(f"{category}.json {case['id']}: {problem}" for problem in problems)
        counts[category] = len(cases)
    failures.extend(_verify_intent_relations(vectors["intent"]))
    failures.extend(_verify_manifest(root, vectors))
    return VerifyReport(counts=counts, failures=failures)
