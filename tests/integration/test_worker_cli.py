"""``admission worker`` on the command line: JSON out, typed refusals and their exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.support.backends import sqlite_url

ROOT = Path(__file__).resolve().parents[2]
SCOPE = {"tenant": "t1", "account": "a1", "page": "p1", "form": "f1"}


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "admission", "worker", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )


def test_accept_refusals_observe_resolve_and_status(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path)
    scope = tmp_path / "scope.json"
    scope.write_text(json.dumps(SCOPE))
    base = ["--db", url, "--scope", str(scope)]
    target = ["--target", str(tmp_path / "target.sqlite3")]

    def record_file(name: str, value: object) -> str:
        path = tmp_path / name
        path.write_text(json.dumps(value))
        return str(path)

    good = record_file("good.json", {**SCOPE, "source_key": "lead-1", "payload": {"a": 1}})
    accepted = cli("accept", *base, "--record", good)
    assert accepted.returncode == 0, accepted.stderr
    write_id = json.loads(accepted.stdout)["write_id"]
    assert json.loads(cli("accept", *base, "--record", good).stdout)["outcome"] == "duplicate"

    changed = cli("accept", *base, "--record", record_file("c.json", {**SCOPE, "source_key": "lead-1"}))
    assert changed.returncode == 9 and json.loads(changed.stdout)["outcome"] == "conflict"
    missing_key = cli("accept", *base, "--record", record_file("m.json", dict(SCOPE)))
    assert missing_key.returncode == 2 and "source_key:" in missing_key.stderr
    outside = cli(
        "accept", *base, "--record", record_file("o.json", {**SCOPE, "page": "p9", "source_key": "z"})
    )
    assert outside.returncode == 4 and "page" in outside.stderr
    assert cli("accept", *base, "--record", str(tmp_path / "none.json")).returncode == 2

    timed_out = cli("once", *base, *target, "--fault", "timeout")
    assert timed_out.returncode == 0 and json.loads(timed_out.stdout)["uncertain"] == 1
    resolved = cli(
        "resolve",
        *base,
        "--write-id",
        write_id,
        "--decision",
        "confirm",
        "--actor",
        "ops",
        "--reason",
        "row seen",
    )
    assert resolved.returncode == 0, resolved.stderr
    assert json.loads(resolved.stdout)["state"] == "confirmed"
    again = cli(
        "resolve", *base, "--write-id", write_id, "--decision", "confirm", "--actor", "o", "--reason", "r"
    )
    assert again.returncode == 4  # no longer uncertain

    snapshot = record_file("snap.json", {"stage": "won"})
    observed = cli("observe", *base, "--record", good, "--snapshot", snapshot)
    assert json.loads(observed.stdout)["changed"] is True
    assert cli("poll-status", *base, *target, "--poll-limit", "0").returncode == 2

    export = tmp_path / "status.json"
    status = cli("status", *base, "--export", str(export))
    assert status.returncode == 0
    assert json.loads(status.stdout) == json.loads(export.read_text())
    assert json.loads(status.stdout)["counts"]["confirmed"] == 1

    other = tmp_path / "other.json"
    other.write_text(json.dumps({**SCOPE, "form": "f2"}))
    assert cli("status", "--db", url, "--scope", str(other)).returncode == 4

    started = cli("start", *base, *target, "--cycles", "2", "--interval", "0")
    lines = [json.loads(line) for line in started.stdout.splitlines()]
    assert [line.get("cycle") for line in lines[:2]] == [1, 2] and lines[-1]["stopped"] is True


def test_the_outage_fault_retries_until_the_attempts_run_out_and_nothing_reaches_the_target(
    tmp_path: Path,
) -> None:
    url = sqlite_url(tmp_path)
    scope = tmp_path / "scope.json"
    scope.write_text(json.dumps(SCOPE))
    base = ["--db", url, "--scope", str(scope)]
    target_path = tmp_path / "target.sqlite3"
    record = tmp_path / "r.json"
    record.write_text(json.dumps({**SCOPE, "source_key": "lead-1", "payload": {"a": 1}}))
    assert cli("accept", *base, "--record", str(record)).returncode == 0
    reports = []
    for _ in range(3):  # the default bound of attempts (contract §1)
        once = cli("once", *base, "--target", str(target_path), "--fault", "outage")
        assert once.returncode == 0, once.stderr
        reports.append(json.loads(once.stdout))
    # A before-write error is the one failure that permits another send (contract §2).
    assert [(r["retried"], r["failed_safe"]) for r in reports] == [(1, 0), (1, 0), (0, 1)]
    counts = json.loads(cli("status", *base).stdout)["counts"]
    assert counts["failed_safe"] == 1 and not counts.get("uncertain")
    import sqlite3

    with sqlite3.connect(target_path) as conn:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        rows = sum(conn.execute(f'SELECT count(*) FROM "{t}"').fetchone()[0] for t in tables)
    conn.close()
    assert rows == 0
