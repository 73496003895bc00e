"""The ``admission`` command line, run as a user runs it: a separate process."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from admission import intent_digest, receipt_token

ROOT = Path(__file__).resolve().parents[1]


def run(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "admission", *args], capture_output=True, text=True, cwd=cwd, timeout=120
    )


def test_intent_prints_token_and_digest_as_json() -> None:
    result = run(
        "intent",
        "--type",
        "update",
        "--name",
        "approve",
        "--args",
        '{"amount": 12.5}',
        "--request-id",
        "order-42",
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["intent_digest"] == intent_digest("update", "approve", {"amount": 12.5})
    assert report["receipt_token"] == receipt_token("update", "order-42")
    assert report["request_id"] == "order-42"
    assert report["encoding"] == "intent-v1"


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("[-0.0]", [-0.0]),
        ("[NaN]", [float("nan")]),
        ("[1]", [1]),
        ("[1.0]", [1.0]),
        ('{"a": Infinity}', {"a": float("inf")}),
    ],
)
def test_json_arguments_keep_their_types(text: str, value: object) -> None:
    result = run("intent", "--type", "signal", "--name", "n", "--args", text)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["intent_digest"] == intent_digest("signal", "n", value)


def test_cbor_arguments_are_accepted_in_hex() -> None:
    result = run("intent", "--type", "signal", "--name", "n", "--args-cbor", "81fb8000000000000000")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["intent_digest"] == intent_digest("signal", "n", [-0.0])


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["--args", '{"a": 1, "a": 2}'], "--args"),
        (["--args", "{not json"], "--args"),
        (["--args", "5"], "arguments"),
        (["--args", "[18446744073709551616]"], "arguments at $[0]"),
        (["--args-cbor", "zz"], "--args-cbor"),
        (["--args-cbor", "81fa3f800000"], "--args-cbor"),
        (["--request-id", "workflow-signal:x"], "request_id"),
        (["--request-id", "x" * 256], "request_id"),
    ],
)
def test_bad_input_exits_2_naming_the_field(args: list[str], field: str) -> None:
    result = run("intent", "--type", "signal", "--name", "n", *args)
    assert result.returncode == 2
    assert field in result.stderr
    assert result.stdout == ""


def test_vectors_verify_passes_on_the_shipped_vectors() -> None:
    result = run("vectors", "verify", str(ROOT / "vectors"))
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["ok"] is True
    assert report["total"] >= 150


def test_vectors_verify_exits_nonzero_on_a_mismatch(tmp_path: Path) -> None:
    copy = tmp_path / "vectors"
    shutil.copytree(ROOT / "vectors", copy)
    intent_file = next(p for p in copy.glob("*.json") if "intent" in p.name)
    text = intent_file.read_text()
    digest = json.loads(text)
    cases = digest["cases"] if isinstance(digest, dict) else digest
    original = cases[0]["intent_digest"]
    intent_file.write_text(text.replace(original, "0" * 64, 1))
    result = run("vectors", "verify", str(copy))
    assert result.returncode == 1
    assert json.loads(result.stdout)["ok"] is False
    assert result.stderr.strip()
