"""Golden vectors (admission/intent/vectors/): the files verify, tampering is caught, generation is exact."""

from __future__ import annotations

import copy as copy_module
import hashlib
import json
import math
import os
import shutil
import struct
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cbor2
import pytest

import admission.intent._vectors as vectors_module
import admission.intent._verify as verify_module
from admission.intent import shipped_vectors
from admission.intent._vectors import (
    MANIFEST_NAME,
    VECTOR_CATEGORIES,
    VectorFormatError,
    case_digest,
    load_vectors,
    typed_value,
)
from admission.intent._verify import verify_vectors

REPO = Path(__file__).resolve().parents[2]
VECTORS = REPO / "admission" / "intent" / "vectors"
GENERATOR = REPO / "tools" / "make_vectors.py"


def same(a: object, b: object) -> bool:
    """Typed equality for the cross-checks: NaN equals NaN, -0.0 is not 0.0, maps unordered."""
    ta = list if type(a) is tuple else type(a)
    tb = list if type(b) is tuple else type(b)
    if ta is not tb:
        return False
    if isinstance(a, float) and isinstance(b, float):
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return struct.pack(">d", a) == struct.pack(">d", b)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return a == b


# -- the committed vectors ----------------------------------------------------------------


def test_committed_vectors_verify_and_meet_the_minimum_counts() -> None:
    report = verify_vectors(VECTORS)
    assert report.failures == []
    assert report.ok
    assert list(report.counts) == list(VECTOR_CATEGORIES)
    assert all(count > 0 for count in report.counts.values()), report.counts
    assert sum(report.counts.values()) >= 150


def test_committed_vectors_verify_with_the_pure_python_encoder_too() -> None:
    # The C accelerator, when built, is what verify_vectors() exercised above; the
    # pure walk is the definition and must agree with the same files.
    script = (
        "import json, admission.intent._verify as v, admission.intent._encoding as e;"
        f"r = v.verify_vectors({str(VECTORS)!r});"
        "print(json.dumps({'accelerated': e.ACCELERATED, 'failures': r.failures}))"
    )
    env = {**os.environ, "ADMISSION_PURE_PYTHON": "1"}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    result = json.loads(done.stdout)
    assert result == {"accelerated": False, "failures": []}


def test_the_shipped_vectors_are_the_committed_ones_and_verify_by_default() -> None:
    # Compared by content, so this holds for an editable and a regular install alike.
    assert load_vectors() == load_vectors(VECTORS)
    for name in (*(f"{c}.json" for c in VECTOR_CATEGORIES), MANIFEST_NAME, "README.md"):
        assert shipped_vectors().joinpath(name).read_bytes() == (VECTORS / name).read_bytes(), name
    report = verify_vectors()
    assert report.ok, report.failures[:5]
    assert report.counts == verify_vectors(VECTORS).counts


def test_the_top_level_vectors_folder_holds_no_second_copy() -> None:
    # One source of truth: the top-level folder only points at the package data.
    assert sorted(p.name for p in (REPO / "vectors").iterdir()) == ["README.md"]
    assert "admission/intent/vectors" in (REPO / "vectors" / "README.md").read_text("utf-8")


def test_vectors_inside_a_zip_are_read_and_verified_as_resources(tmp_path: Path) -> None:
    # A package imported from a zip hands out zipfile.Path resources, not files.
    archive = tmp_path / "vectors.zip"
    with zipfile.ZipFile(archive, "w") as zipped:
        for path in sorted(VECTORS.iterdir()):
            zipped.write(path, f"vectors/{path.name}")
    with zipfile.ZipFile(archive) as zipped:
        inside = zipfile.Path(zipped, "vectors/")
        assert load_vectors(inside) == load_vectors(VECTORS)
        assert vectors_module.load_manifest(inside / MANIFEST_NAME) == vectors_module.load_manifest(
            VECTORS / MANIFEST_NAME
        )
        assert verify_vectors(inside).ok


def test_every_case_is_listed_in_the_manifest_with_its_digest() -> None:
    vectors = load_vectors(VECTORS)
    listed = vectors_module.load_manifest(VECTORS / MANIFEST_NAME)
    expected = [
        (f"{c}.json", str(case["id"]), case_digest(case)) for c in VECTOR_CATEGORIES for case in vectors[c]
    ]
    assert sorted(listed) == sorted(expected)


def test_encode_vectors_decode_to_the_value_in_an_independent_decoder() -> None:
    for case in load_vectors(VECTORS)["encode"]:
        if "cbor" not in case:
            continue
        value = typed_value(case["value"])
        decoded = cbor2.loads(bytes.fromhex(str(case["cbor"])))
        assert same(decoded, value), case["id"]


def test_intent_records_decode_to_the_intent_array_in_an_independent_decoder() -> None:
    for case in load_vectors(VECTORS)["intent"]:
        record = bytes.fromhex(str(case["record"]))
        expected = [
            "admission/intent/v1",
            case["command_type"],
            typed_value(case["name"]),
            typed_value(case["arguments"]),
            typed_value(case["target"]),
        ]
        assert same(cbor2.loads(record), expected), case["id"]
        assert hashlib.sha256(record).hexdigest() == case["intent_digest"], case["id"]


def test_the_vectors_cover_what_the_contract_names() -> None:
    vectors = load_vectors(VECTORS)
    encode = {str(c["id"]): c for c in vectors["encode"]}
    assert encode["enc.int.pos.9223372036854775807"]["cbor"] == "1b7fffffffffffffff"
    assert encode["enc.int.neg.9223372036854775808"]["cbor"] == "3b7fffffffffffffff"
    assert encode["enc.float.neg-0"]["cbor"] == "fb8000000000000000"
    assert encode["enc.map.bytewise-not-length-first"]["cbor"] == "a2626161016162" + "00"
    assert all(encode[f"enc.float.nan.{n}"]["cbor"] == "f97e00" for n in ("negative", "signaling", "payload"))
    for boundary in (23, 24, 255, 256, 65535, 65536):
        for kind in ("text", "bytes", "list", "map"):
            assert f"enc.{kind}.len.{boundary}" in encode
    keys = {str(c["id"]): c for c in vectors["keys"]}
    assert keys["key.four-byte-255"]["validate"] == {"accepted": True}
    assert keys["key.four-byte-256"]["validate"] == {
        "error": {"code": "request_id_invalid", "field": "request_id"}
    }
    assert keys["key.reserved-signal"]["validate"]["error"]["code"] == "request_id_reserved"  # type: ignore[index]
    assert keys["key.nfc"]["receipt_token"] != keys["key.nfd"]["receipt_token"]
    refusals = {str(c["id"]): c for c in vectors["encode_refusals"]}
    assert refusals["encref.int.contract-path"]["error"]["path"] == "$.items[3].price"  # type: ignore[index]


# -- typed values --------------------------------------------------------------------------


def test_typed_floats_are_built_from_their_bits() -> None:
    neg_zero = typed_value({"float": "-0x0.0p+0", "float_bits": "8000000000000000"})
    assert isinstance(neg_zero, float)
    assert struct.pack(">d", neg_zero).hex() == "8000000000000000"
    nan = typed_value({"float": "-nan", "float_bits": "fff0000000000001"})
    assert isinstance(nan, float)
    assert math.isnan(nan)
    assert math.copysign(1.0, nan) == -1.0


def test_typed_generators_expand_as_documented() -> None:
    leaf = {"int": "7"}
    assert typed_value({"nest_list": 2, "leaf": leaf}) == [[7]]
    assert typed_value({"nest_list": 2}) == [[]]
    key = {"text": "a", "utf8": "61"}
    assert typed_value({"nest_map": 2, "key": key, "leaf": leaf}) == {"a": {"a": 7}}
    assert typed_value({"text_repeat": key, "count": 3}) == "aaa"
    assert typed_value({"bytes_repeat": "ab", "count": 2}) == b"\xab\xab"
    assert typed_value({"list_repeat": leaf, "count": 2}) == [7, 7]
    numbered = typed_value(
        {
            "map_numbered": 3,
            "key_prefix": "k",
            "key_width": 2,
            "value": {"null": None},
            "insertion": "descending",
        }
    )
    assert isinstance(numbered, dict)
    assert list(numbered) == ["k02", "k01", "k00"]
    assert typed_value({"text_code_points": [97, 0xD800]}) == "a\ud800"
    assert typed_value({"map": [[{"int": "1"}, {"null": None}]]}) == {1: None}


@pytest.mark.parametrize(
    ("rendering", "fragment"),
    [
        ({"int": "01"}, "decimal string"),
        ({"int": 1}, "expected a string"),
        ({"text": "a", "utf8": "62"}, "text and utf8 disagree"),
        ({"text": "\ud800", "utf8": ""}, "text_code_points"),
        ({"text_code_points": [97]}, "only for text with surrogate"),
        ({"float": "0x1.0p+0", "float_bits": "0000000000000000"}, "does not match float_bits"),
        ({"bytes": "ABCD"}, "lowercase hex"),
        ({"bool": 1}, "true or false"),
        ({"null": None, "bool": True}, "exactly one kind"),
        ({"map": [[{"int": "1"}, {"null": None}], [{"bool": True}, {"null": None}]]}, "duplicate map key"),
        ({"map": [[{"list": []}, {"null": None}]]}, "scalar"),
        ({"unsupported": "generator"}, "unknown unsupported kind"),
        ({"list_repeat": {"null": None}, "count": -1}, "integer in"),
        ({"vector": []}, "unknown typed value kind"),
    ],
)
def test_malformed_typed_values_are_refused_clearly(rendering: object, fragment: str) -> None:
    with pytest.raises(VectorFormatError, match="here") as info:
        typed_value(rendering, "here")
    assert fragment in str(info.value)


# -- the loader refuses malformed files -----------------------------------------------------


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    target = tmp_path / "vectors"
    shutil.copytree(VECTORS, target)
    return target


def read(directory: Path, category: str) -> dict[str, object]:
    document: dict[str, object] = json.loads((directory / f"{category}.json").read_text("ascii"))
    return document


def write(directory: Path, category: str, document: dict[str, object]) -> None:
    (directory / f"{category}.json").write_text(json.dumps(document, ensure_ascii=True, indent=1), "ascii")


def tamper(
    directory: Path, category: str, case_id: str, change: Callable[[dict[str, Any]], None], *, rerelease: bool
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Edit one case in place: (before, after).  ``rerelease`` also rewrites its MANIFEST line."""
    document = read(directory, category)
    cases = document["cases"]
    assert isinstance(cases, list)
    (case,) = [c for c in cases if c["id"] == case_id]
    before = copy_module.deepcopy(case)
    change(case)
    write(directory, category, document)
    if rerelease:
        manifest = directory / MANIFEST_NAME
        prefix = f"{category}.json {case_id} "
        lines = manifest.read_text("ascii").split("\n")
        lines = [prefix + case_digest(case) if line.startswith(prefix) else line for line in lines]
        manifest.write_text("\n".join(lines), "ascii")
    return before, case


@pytest.mark.parametrize(
    ("mutate", "fragment"),
    [
        (lambda t: t.replace('"enc.null"', '"enc.null", "id": "x"', 1), "duplicate JSON member 'id'"),
        (lambda t: t.replace('"int": "0"', '"int": 0.0', 1), "non-integer JSON number"),
        (lambda t: t.replace('"cbor": "f6"', '"cbor": "F6"', 1), "lowercase hex"),
        (
            lambda t: t.replace('"cbor": "f6"', '"cbor": "f6", "extra": 1', 1),
            "unexpected member(s) ['extra']",
        ),
        (lambda t: t.replace(', "cbor": "f6"', "", 1), "missing member(s)"),
        (lambda t: t.replace('"id": "enc.null"', '"id": "Enc Null"', 1), "must match"),
        (lambda t: t.replace('"id": "enc.false"', '"id": "enc.null"', 1), "duplicate id"),
        (
            lambda t: t.replace('"admission-golden-vectors/1"', '"admission-golden-vectors/2"', 1),
            "format must be",
        ),
        (lambda t: t.replace('"None is f6."', '"  "', 1), "description must not be blank"),
        (lambda t: t.replace("None is f6.", "None is f6 \u2013 always.", 1), "not plain ASCII"),
        (lambda t: t[:-5], "not valid JSON"),
    ],
)
def test_the_loader_refuses_a_malformed_file_with_a_clear_error(copy: Path, mutate, fragment: str) -> None:  # type: ignore[no-untyped-def]
    path = copy / "encode.json"
    path.write_bytes(mutate(path.read_text("ascii")).encode("utf-8"))
    with pytest.raises(VectorFormatError) as info:
        load_vectors(copy)
    assert "encode.json" in str(info.value)
    assert fragment in str(info.value)
    # verify_vectors() reports the same problem instead of raising, for the CLI.
    report = verify_vectors(copy)
    assert not report.ok
    assert len(report.failures) == 1
    assert fragment in report.failures[0]


def test_the_loader_refuses_missing_and_unknown_files(copy: Path) -> None:
    (copy / "keys.json").rename(copy / "keys2.json")
    with pytest.raises(VectorFormatError, match=r"unknown vector file\(s\) \['keys2.json'\]"):
        load_vectors(copy)
    (copy / "keys2.json").unlink()
    with pytest.raises(VectorFormatError, match=r"missing vector file\(s\) \['keys.json'\]"):
        load_vectors(copy)


def test_the_loader_names_the_case_of_a_malformed_typed_value(copy: Path) -> None:
    document = read(copy, "intent")
    cases = document["cases"]
    assert isinstance(cases, list)
    cases[2]["target"] = {"text": "run-0001", "utf8": "00"}
    write(copy, "intent", document)
    with pytest.raises(
        VectorFormatError, match=r"intent.json intent.signal-run.target: text and utf8 disagree"
    ):
        load_vectors(copy)


# -- tampering is caught, exactly --------------------------------------------------------


def test_a_changed_intent_digest_is_reported_exactly(copy: Path) -> None:
    before, _ = tamper(
        copy, "intent", "intent.signal-instance", lambda c: c.update(intent_digest="0" * 64), rerelease=True
    )
    assert verify_vectors(copy).failures == [
        f"intent.json intent.signal-instance: intent_digest {before['intent_digest']}, expected {'0' * 64}"
    ]


def test_a_changed_encoding_is_reported_exactly(copy: Path) -> None:
    tamper(copy, "encode", "enc.int.pos.24", lambda c: c.update(cbor="1819"), rerelease=True)
    # Both directions see it: the encoder disagrees, and the bytes decode to another value.
    assert verify_vectors(copy).failures == [
        "encode.json enc.int.pos.24: encode gave 1818, expected 1819",
        "encode.json enc.int.pos.24: strict decode gave 25, expected the value 24",
    ]


def test_a_changed_large_encoding_digest_is_reported_exactly(copy: Path) -> None:
    before, _ = tamper(
        copy, "encode", "enc.map.len.65536", lambda c: c.update(cbor_sha256="f" * 64), rerelease=True
    )
    assert verify_vectors(copy).failures == [
        f"encode.json enc.map.len.65536: encode gave {before['cbor_length']} bytes with sha256 "
        f"{before['cbor_sha256']}, expected {before['cbor_length']} bytes with {'f' * 64}"
    ]


def test_a_changed_token_is_reported_exactly(copy: Path) -> None:
    wrong = "signal-v1:" + "1" * 64
    before, _ = tamper(
        copy, "keys", "key.upper-a", lambda c: c.update(receipt_token={"token": wrong}), rerelease=True
    )
    assert verify_vectors(copy).failures == [
        f"keys.json key.upper-a: receipt_token {before['receipt_token']['token']}, expected {wrong}"
    ]


def test_an_accepted_key_claimed_refused_is_reported(copy: Path) -> None:
    refused = {"error": {"code": "request_id_invalid", "field": "request_id"}}
    tamper(copy, "keys", "key.four-byte-255", lambda c: c.update(validate=refused), rerelease=True)
    (failure,) = verify_vectors(copy).failures
    assert failure.startswith("keys.json key.four-byte-255: validate_request_id accepted")


def test_a_changed_refusal_path_is_reported_exactly(copy: Path) -> None:
    tamper(
        copy,
        "encode_refusals",
        "encref.int.contract-path",
        lambda c: c["error"].update(path="$.items[2].price"),
        rerelease=True,
    )
    (failure,) = verify_vectors(copy).failures
    assert failure.startswith(
        "encode_refusals.json encref.int.contract-path: encode refused with path '$.items[3].price' "
        "(expected '$.items[2].price')"
    )


def test_canonical_bytes_in_the_decode_refusals_are_reported(copy: Path) -> None:
    tamper(copy, "decode_refusals", "decref.non-shortest.1800", lambda c: c.update(cbor="00"), rerelease=True)
    assert verify_vectors(copy).failures == [
        "decode_refusals.json decref.non-shortest.1800: decode accepted (returned 0) "
        "but must refuse with invalid_value"
    ]


def test_a_broken_same_intent_link_is_reported(copy: Path) -> None:
    tamper(
        copy, "intent", "intent.list-21", lambda c: c.update(same_intent_as="intent.list-12"), rerelease=True
    )
    assert verify_vectors(copy).failures == [
        "intent.json intent.list-21: intent_digest differs from intent.list-12, which it must equal"
    ]


def test_an_edited_released_case_is_reported_even_if_it_still_verifies(copy: Path) -> None:
    before, after = tamper(
        copy, "encode", "enc.null", lambda c: c.update(description="None is f6, reworded."), rerelease=False
    )
    assert verify_vectors(copy).failures == [
        f"encode.json enc.null: changed after release (MANIFEST sha256 {case_digest(before)}, "
        f"now {case_digest(after)}); add a new case instead"
    ]


def test_a_changed_hex_without_rerelease_is_reported_twice(copy: Path) -> None:
    before, after = tamper(copy, "encode", "enc.true", lambda c: c.update(cbor="f4"), rerelease=False)
    assert verify_vectors(copy).failures == [
        "encode.json enc.true: encode gave f5, expected f4",
        "encode.json enc.true: strict decode gave False, expected the value True",
        f"encode.json enc.true: changed after release (MANIFEST sha256 {case_digest(before)}, "
        f"now {case_digest(after)}); add a new case instead",
    ]


def test_a_deleted_case_is_reported_exactly(copy: Path) -> None:
    document = read(copy, "keys")
    cases = document["cases"]
    assert isinstance(cases, list)
    document["cases"] = [c for c in cases if c["id"] != "key.upper-a"]
    write(copy, "keys", document)
    assert verify_vectors(copy).failures == [
        "keys.json key.upper-a: listed in MANIFEST but missing (released cases are never removed)"
    ]


def test_an_unlisted_case_is_reported(copy: Path) -> None:
    document = read(copy, "encode")
    cases = document["cases"]
    assert isinstance(cases, list)
    cases.append({"id": "enc.new", "description": "Not yet released.", "value": {"int": "2"}, "cbor": "02"})
    write(copy, "encode", document)
    assert verify_vectors(copy).failures == [
        "encode.json enc.new: not listed in MANIFEST (run tools/make_vectors.py to append it)"
    ]


def test_a_missing_manifest_is_reported(copy: Path) -> None:
    (copy / MANIFEST_NAME).unlink()
    assert verify_vectors(copy).failures == [
        "MANIFEST: missing; every released case must be listed (run tools/make_vectors.py)"
    ]


def test_a_lenient_decoder_fails_the_decode_refusals(monkeypatch: pytest.MonkeyPatch) -> None:
    def lenient(data: bytes, *, max_size: int = 0) -> object:
        return cbor2.loads(data)

    monkeypatch.setattr(verify_module, "canonical_decode", lenient)
    report = verify_vectors(VECTORS)
    assert not report.ok
    assert (
        "decode_refusals.json decref.map.unsorted: decode accepted (returned {'b': 1, 'a': 0})"
        in "\n".join(report.failures)
    )


# -- the generator ------------------------------------------------------------------------


def run_generator(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(GENERATOR), *args], capture_output=True, text=True, cwd=REPO)


def test_the_generator_reproduces_the_committed_files_byte_for_byte(tmp_path: Path) -> None:
    done = run_generator(str(tmp_path))
    assert done.returncode == 0, done.stderr
    generated = sorted(p.name for p in tmp_path.iterdir())
    assert generated == sorted([*(f"{c}.json" for c in VECTOR_CATEGORIES), MANIFEST_NAME])
    for name in generated:
        assert (tmp_path / name).read_bytes() == (VECTORS / name).read_bytes(), name


def test_the_generator_refuses_to_change_a_released_case(tmp_path: Path) -> None:
    manifest = tmp_path / "MANIFEST.released"
    text = (VECTORS / MANIFEST_NAME).read_text("ascii")
    line = next(line for line in text.split("\n") if line.startswith("encode.json enc.null "))
    manifest.write_text(text.replace(line, "encode.json enc.null " + "0" * 64), "ascii")
    out = tmp_path / "out"
    done = run_generator(str(out), "--base-manifest", str(manifest))
    assert done.returncode == 1
    assert "encode.json enc.null: released with sha256 " + "0" * 64 in done.stderr
    assert not out.exists()


def test_the_generator_appends_new_cases_after_the_released_ones(tmp_path: Path) -> None:
    text = (VECTORS / MANIFEST_NAME).read_text("ascii")
    released = [line for line in text.split("\n") if line and not line.startswith("#")]
    base = tmp_path / "MANIFEST.released"
    # Pretend only the keys were released so far: everything else is new.
    base.write_text("\n".join(line for line in released if line.startswith("keys.json ")) + "\n", "ascii")
    done = run_generator(str(tmp_path / "out"), "--base-manifest", str(base))
    assert done.returncode == 0, done.stderr
    lines = [
        line
        for line in (tmp_path / "out" / MANIFEST_NAME).read_text("ascii").split("\n")
        if line and line[0] != "#"
    ]
    keys = [line for line in released if line.startswith("keys.json ")]
    assert lines[: len(keys)] == keys
    assert sorted(lines) == sorted(released)


def test_an_encoder_that_leaves_large_maps_unsorted_fails_exactly_the_large_map_vectors(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = verify_module.canonical_encode

    def sorts_small_maps_only(value: object, *, max_size: int = 1 << 20) -> bytes:
        if type(value) is dict and len(value) > 16:
            return cbor2.dumps(value)  # insertion order, otherwise the same bytes
        return real(value, max_size=max_size)

    monkeypatch.setattr(verify_module, "canonical_encode", sorts_small_maps_only)
    failing = {line.split(":")[0] for line in verify_vectors(VECTORS).failures}
    assert failing == {f"encode.json enc.map.len.{n}" for n in (23, 24, 255, 256, 65535, 65536)}
