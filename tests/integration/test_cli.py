"""The ``admission`` command line, run as a user runs it: a separate process."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from admission import intent_digest, receipt_token
from admission.intent import shipped_vectors

ROOT = Path(__file__).resolve().parents[2]
VECTORS = ROOT / "admission" / "intent" / "vectors"


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


@pytest.mark.parametrize("args", [["--version"], ["--help"], ["intent", "--type", "signal", "--name", "n"]])
def test_commands_without_a_database_start_without_sqlalchemy(args: list[str]) -> None:
    code = (
        "import contextlib, io, sys\n"
        "from admission.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
        f"    main({args!r})\n"
        "print(sorted(m for m in ('sqlalchemy', 'alembic', 'fastapi') if m in sys.modules))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_the_worker_commands_keep_their_fault_choices() -> None:
    result = run("worker", "once", "--scope", "s.json", "--fault", "bogus")
    assert result.returncode == 2
    assert "choose from 'outage', 'timeout', 'crash-after-write'" in result.stderr


@pytest.mark.parametrize(
    ("args", "code"),
    [
        (["--db", "nosuch://x", "db", "check"], 2),
        (["--db", "notaurl", "signal", "wf", "go"], 2),
        (["--db", "sqlite:////nonexistent-dir/x.db", "db", "upgrade"], 5),
        (["--db", "postgresql://u:s3cr3t-pw@127.0.0.1:1/x", "db", "check"], 5),
        (["--db", "postgresql://u:s3cr3t-pw@127.0.0.1:1/x", "signal", "wf", "go"], 5),
        (["--db", "postgresql://u:s3cr3t-pw@127.0.0.1:1/x", "worker", "status", "--scope", "{scope}"], 5),
    ],
)
def test_a_database_it_cannot_use_is_one_line_without_the_password(
    tmp_path: Path, args: list[str], code: int
) -> None:
    scope = tmp_path / "scope.json"
    scope.write_text('{"tenant": "t"}', encoding="utf-8")
    result = run(*(a.format(scope=scope) for a in args))
    assert result.returncode == code, result.stderr
    assert result.stdout == ""
    assert result.stderr.startswith("admission: ")
    assert result.stderr.count("\n") == 1, result.stderr
    assert "s3cr3t" not in result.stderr


def test_vectors_verify_passes_on_the_shipped_vectors() -> None:
    result = run("vectors", "verify", str(VECTORS))
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["ok"] is True
    assert report["total"] >= 150


def test_vectors_verify_without_a_folder_checks_the_installed_vectors_from_any_directory(
    tmp_path: Path,
) -> None:
    result = run("vectors", "verify", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["ok"] is True
    assert report["directory"] == str(shipped_vectors())
    assert report["total"] == json.loads(run("vectors", "verify", str(VECTORS)).stdout)["total"]


def test_vectors_verify_refuses_a_folder_that_does_not_exist(tmp_path: Path) -> None:
    result = run("vectors", "verify", str(tmp_path / "absent"))
    assert result.returncode == 2
    assert result.stderr.startswith("admission: ")
    assert result.stderr.count("\n") == 1, result.stderr


def test_vectors_verify_exits_nonzero_on_a_mismatch(tmp_path: Path) -> None:
    copy = tmp_path / "vectors"
    shutil.copytree(VECTORS, copy)
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


# -- commands on a database ---------------------------------------------------------------


def run_db(url: str, *args: str) -> tuple[int, object, str]:
    result = run("--db", url, *args)
    payload = json.loads(result.stdout) if result.stdout.strip() else None
    return result.returncode, payload, result.stderr


def test_a_database_below_head_is_refused_naming_the_upgrade_command(tmp_path: Path) -> None:
    code, payload, stderr = run_db(f"sqlite:///{tmp_path / 'new.sqlite3'}", "start", "wf")
    assert code == 3 and payload is None
    assert "admission db upgrade" in stderr


def test_cli_lifecycle_with_exit_codes(db_url: str) -> None:
    assert run_db(db_url, "signal", "wf", "go")[0] == 4
    code, run_info, _ = run_db(db_url, "start", "wf")
    assert code == 0
    code, first, _ = run_db(
        db_url, "update", "wf", "approve", "--args", '{"amount": -0.0}', "--request-id", "k"
    )
    assert code == 0 and first["outcome"] == "accepted" and first["retained"] is False  # type: ignore[index]
    code, again, _ = run_db(
        db_url,
        "update",
        "wf",
        "approve",
        "--args-cbor",
        "a166616d6f756e74fb8000000000000000",
        "--request-id",
        "k",
    )
    assert code == 0 and again["retained"] is True and again["command_id"] == first["command_id"]  # type: ignore[index]
    code, conflict, _ = run_db(
        db_url, "update", "wf", "approve", "--args", '{"amount": 0.0}', "--request-id", "k"
    )
    assert code == 9 and conflict["conflict"] == ["arguments"]  # type: ignore[index]
    code, done, _ = run_db(db_url, "complete-update", "wf", first["update_id"], "--result", "[1, NaN]")  # type: ignore[index]
    assert code == 0 and done["http_status"] == 200  # type: ignore[index]
    code, receipt, _ = run_db(db_url, "receipt", "wf", "--type", "update", "--request-id", "k")
    assert code == 0 and receipt["update_status"] == "completed"  # type: ignore[index]
    code, _, _ = run_db(db_url, "signal", "wf", "go", "--run", "other-run")
    assert code == 4
    code, history, _ = run_db(db_url, "history", "wf")
    assert [e["event_type"] for e in history] == [  # type: ignore[union-attr]
        "CommandRejected",
        "RunStarted",
        "UpdateAccepted",
        "UpdateCompleted",
        "CommandRejected",
    ]
    assert run_info["status"] == "open"  # type: ignore[index]


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["--args", "{bad"], "--args"),
        (["--request-id", ""], "request_id"),
        (["--args", "[1]", "--args-cbor", "80"], "--args"),
        (["--args", '{"x": {"y": 18446744073709551616}}'], "$.x.y"),
    ],
)
def test_cli_bad_admission_input_writes_nothing(db_url: str, args: list[str], field: str) -> None:
    run_db(db_url, "start", "wf")
    code, payload, stderr = run_db(db_url, "signal", "wf", "go", *args)
    assert code == 2 and payload is None and field in stderr
    assert len(run_db(db_url, "history", "wf")[1]) == 1  # type: ignore[arg-type]


def test_demo_tells_its_story_and_checks_itself(tmp_path: Path) -> None:
    result = run("--db", f"sqlite:///{tmp_path / 'demo.sqlite3'}", "demo")
    assert result.returncode == 0, result.stderr
    assert "retained: true" in result.stdout and "request_id_conflict" in result.stdout
    assert "1 fresh, 7 retained" in result.stdout
