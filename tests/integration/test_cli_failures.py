"""The command line fails as documented: one line on stderr, the documented exit code, no traceback,
no password; and every hint it prints is a command that works."""

from __future__ import annotations

import ast
import json
import os
import re
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from admission.sql import HEAD_REVISION, masked_url
from tests.support.backends import PostgresPool, database_url, sqlite_url

ROOT = Path(__file__).resolve().parents[2]
PASSWORD = "s3cr3t-pw"
DOWN = f"postgresql://u:{PASSWORD}@127.0.0.1:1/x"
"""A PostgreSQL server that is not there: nothing listens on port 1."""
SCOPE = {"tenant": "t1"}


def run(
    *args: str,
    cwd: Path,
    env: dict[str, str] | None = None,
    closed_stdout: bool = False,
) -> subprocess.CompletedProcess[str]:
    """``python -m admission ARGS`` as a user runs it; ``closed_stdout``: its reader has already gone."""
    environment = {k: v for k, v in os.environ.items() if k != "ADMISSION_DB"}
    environment.update(env or {})
    command = [sys.executable, "-m", "admission", *args]
    if not closed_stdout:
        return subprocess.run(command, capture_output=True, text=True, cwd=cwd, env=environment, timeout=120)
    read_end, write_end = os.pipe()
    os.close(read_end)  # as `admission ... | head -c1` once head has exited
    try:
        result = subprocess.run(
            command,
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            cwd=cwd,
            env=environment,
            timeout=120,
        )
    finally:
        os.close(write_end)
    return subprocess.CompletedProcess(result.args, result.returncode, "", result.stderr)


# -- no traceback, ever ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def place(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """What the table's command lines name: databases, files, and a folder that hides psycopg."""
    base = tmp_path_factory.mktemp("cli-failures")
    (base / "a-directory").mkdir()
    (base / "latin-1.json").write_bytes(b'{"tenant": "t\xe9"}')  # valid JSON, not UTF-8
    (base / "scope.json").write_text(json.dumps(SCOPE), encoding="utf-8")
    (base / "record.json").write_text(json.dumps({**SCOPE, "source_key": "k"}), encoding="utf-8")
    (base / "not-sqlite.db").write_text("just text, " * 200, encoding="utf-8")
    # A package named psycopg that cannot be imported, first on the path: psycopg not installed.
    (base / "no-psycopg" / "psycopg").mkdir(parents=True)
    (base / "no-psycopg" / "psycopg" / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'psycopg'\", name='psycopg')\n", encoding="utf-8"
    )
    vectors = base / "vectors"
    vectors.mkdir()
    source = next((ROOT / "admission" / "intent" / "vectors").glob("*.json"))
    (vectors / source.name).write_bytes(source.read_bytes().replace(b"}", b"}\xff", 1))
    unknown = sqlite_url(base)
    with sqlite3.connect(unknown.removeprefix("sqlite:///")) as conn:
        conn.execute("UPDATE admission_alembic_version SET version_num = 'admission_f00d'")
    return {
        "dir": str(base / "a-directory"),
        "latin1": str(base / "latin-1.json"),
        "scope": str(base / "scope.json"),
        "record": str(base / "record.json"),
        "not_sqlite": str(base / "not-sqlite.db"),
        "no_psycopg": str(base / "no-psycopg"),
        "vectors": str(vectors),
        "db": sqlite_url(base),
        "unknown": unknown,
        "target": str(base / "target.sqlite3"),
        "down": DOWN,
        "pw": PASSWORD,
        "cwd": str(base),
    }


@dataclass(frozen=True)
class Case:
    """One command line that must fail as documented."""

    argv: list[str]
    code: int
    env: dict[str, str] = field(default_factory=dict)
    closed_stdout: bool = False


WORKER = ["--scope", "{scope}", "--db", "{db}"]
CASES: dict[str, Case] = {
    # The database URL.
    "malformed URL": Case(["--db", "notaurl", "db", "check"], 2),
    "a port that is not a number": Case(["db", "upgrade", "--db", "postgresql://u:{pw}@h:port/x"], 2),
    "unknown dialect": Case(["--db", "foo://u:{pw}@h/x", "db", "check"], 2),
    "unknown driver": Case(["--db", "postgresql+nosuchdriver://u:{pw}@h/x", "start", "wf"], 2),
    "psycopg not installed": Case(["--db", "{down}", "db", "check"], 2, env={"PYTHONPATH": "{no_psycopg}"}),
    "psycopg not installed, signal": Case(
        ["signal", "wf", "go", "--db", "{down}"], 2, env={"PYTHONPATH": "{no_psycopg}"}
    ),
    "unreachable server: db check": Case(["--db", "{down}", "db", "check"], 5),
    "unreachable server: db upgrade": Case(["db", "upgrade", "--db", "{down}"], 5),
    "unreachable server: db downgrade": Case(["db", "downgrade", "0003", "--db", "{down}"], 5),
    "unreachable server: signal": Case(["--db", "{down}", "signal", "wf", "go"], 5),
    "unreachable server: prune": Case(["prune", "--db", "{down}"], 5),
    "unreachable server: worker": Case(["worker", "status", "--scope", "{scope}", "--db", "{down}"], 5),
    "unreachable server: jobs": Case(["jobs", "status", "--db", "{down}"], 5),
    "unreachable server: demo": Case(["demo", "--db", "{down}"], 5),
    "unreachable server: serve": Case(["serve", "--db", "{down}"], 5),
    "password in the query": Case(["--db", "postgresql://u@127.0.0.1:1/x?password={pw}", "db", "check"], 5),
    "directory as SQLite: db check": Case(["--db", "sqlite:///{dir}", "db", "check"], 5),
    "directory as SQLite: db upgrade": Case(["db", "upgrade", "--db", "sqlite:///{dir}"], 5),
    "directory as SQLite: start": Case(["start", "wf", "--db", "sqlite:///{dir}"], 5),
    "directory as SQLite: worker": Case(
        ["worker", "status", "--scope", "{scope}", "--db", "sqlite:///{dir}"], 5
    ),
    "directory as SQLite: jobs": Case(["jobs", "status", "--db", "sqlite:///{dir}"], 5),
    "SQLite in a missing folder": Case(["db", "upgrade", "--db", "sqlite:///{dir}/missing/x.sqlite3"], 5),
    "database at an unknown revision: downgrade": Case(["db", "downgrade", "0003", "--db", "{unknown}"], 3),
    "database at an unknown revision: start": Case(["start", "wf", "--db", "{unknown}"], 3),
    # Files the commands read or write.
    "--scope not UTF-8": Case(["worker", "status", "--scope", "{latin1}", "--db", "{db}"], 2),
    "--scope a directory": Case(["worker", "status", "--scope", "{dir}", "--db", "{db}"], 2),
    "--record not UTF-8": Case(["worker", "accept", *WORKER, "--record", "{latin1}"], 2),
    "--snapshot not UTF-8": Case(
        ["worker", "observe", *WORKER, "--record", "{record}", "--snapshot", "{latin1}"], 2
    ),
    "--target not SQLite": Case(["worker", "once", *WORKER, "--target", "{not_sqlite}"], 5),
    "--target a directory": Case(["worker", "once", *WORKER, "--target", "{dir}"], 5),
    "--lock a directory": Case(["worker", "once", *WORKER, "--target", "{target}", "--lock", "{dir}"], 2),
    "--lock in a missing folder": Case(
        ["worker", "start", *WORKER, "--target", "{target}", "--lock", "{dir}/missing/x.lock"], 2
    ),
    "--export into a missing folder": Case(
        ["worker", "status", *WORKER, "--export", "{dir}/missing/x.json"], 2
    ),
    "a vector file not UTF-8": Case(["vectors", "verify", "{vectors}"], 1),
    # The command line itself.
    "an argument not UTF-8": Case(["jobs", "status", "\udcff", "--db", "{db}"], 2),
    "an option's value not UTF-8": Case(["worker", "status", *WORKER, "--queue", "q\udcff"], 2),
    "a URL where no argument goes": Case(["db", "check", "postgresql://u:{pw}@h/x"], 2),
    "an unknown revision": Case(["db", "upgrade", "--revision", "nosuch", "--db", "{db}"], 2),
    "an unknown revision to downgrade to": Case(["db", "downgrade", "nosuch", "--db", "{db}"], 2),
    "an unknown choice": Case(["close", "wf", "--status", "bogus", "--db", "{db}"], 2),
    "demo with no callers": Case(["demo", "--workers", "0"], 2),
    # Standard output closed early: quiet, 141.
    "closed stdout: intent": Case(["intent", "--type", "signal", "--name", "n"], 141, closed_stdout=True),
    "closed stdout: db check": Case(["db", "check", "--db", "{db}"], 141, closed_stdout=True),
    "closed stdout: history": Case(["history", "wf", "--db", "{db}"], 141, closed_stdout=True),
    # The help too, however long it is (argparse alone would pass over a failed write).
    "closed stdout: --help": Case(["worker", "once", "--help"], 141, closed_stdout=True),
    "closed stdout: short --help": Case(["vectors", "--help"], 141, closed_stdout=True),
}


def dump(url: str) -> list[str]:
    """Everything in a SQLite database, as SQL: equal dumps, nothing written."""
    with sqlite3.connect(url.removeprefix("sqlite:///")) as conn:
        return list(conn.iterdump())


@pytest.mark.parametrize("name", list(CASES))
def test_a_failure_is_one_line_and_its_exit_code_never_a_traceback(name: str, place: dict[str, str]) -> None:
    case = CASES[name]
    argv = [a.format(**place) for a in case.argv]
    env = {k: v.format(**place) for k, v in case.env.items()}
    before = dump(place["db"])
    result = run(*argv, cwd=Path(place["cwd"]), env=env, closed_stdout=case.closed_stdout)
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == case.code, result.stderr
    if case.closed_stdout:
        assert result.stderr == ""  # the reader went away on purpose: nothing to report
    else:
        assert result.stderr.count("\n") == 1 and result.stderr.endswith("\n"), result.stderr
        assert result.stderr.startswith(("admission: ", "malformed vectors: ")), result.stderr
    if case.code in (2, 3, 5):
        assert result.stdout == ""
    assert PASSWORD not in result.stdout + result.stderr
    assert dump(place["db"]) == before  # refused, so nothing written
    assert not (Path(place["cwd"]) / "admission.sqlite3").exists()  # --db was used, wherever it was written


def test_psycopg_missing_names_the_extra_that_installs_it(place: dict[str, str]) -> None:
    result = run("--db", DOWN, "db", "check", cwd=Path(place["cwd"]), env={"PYTHONPATH": place["no_psycopg"]})
    assert result.stderr == (
        "admission: the database driver is not installed: No module named 'psycopg' "
        "(pip install 'admission[postgresql]')\n"
    )


def test_a_url_given_where_no_argument_goes_is_echoed_masked(place: dict[str, str]) -> None:
    result = run("db", "check", f"postgresql://u:{PASSWORD}@h/x", cwd=Path(place["cwd"]))
    assert (
        result.stderr == "admission: unrecognized arguments: postgresql://u:***@h/x; see `admission --help`\n"
    )


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (
            "postgresql://u@h/x?password=s3cr3t&sslmode=require",
            "postgresql://u@h/x?password=***&sslmode=require",
        ),
        (
            "postgresql://u:pw@h/x?sslmode=require&PassWord=s3cr3t",
            "postgresql://u:***@h/x?PassWord=***&sslmode=require",
        ),
    ],
)
def test_masked_url_masks_a_password_in_the_query(url: str, shown: str) -> None:
    assert masked_url(url) == shown


# -- --db after the command, on a real database -------------------------------------------------------------


def test_db_after_the_command_reaches_that_database(
    sql_backend: str, postgres_pool: PostgresPool, tmp_path: Path
) -> None:
    url = database_url(sql_backend, postgres_pool, tmp_path, migrated=False)
    steps = [
        (["db", "check"], 3),
        (["db", "upgrade"], 0),
        (["db", "check"], 0),
        (["start", "wf"], 0),
        (["signal", "wf", "go", "--request-id", "k"], 0),
        (["history", "wf"], 0),
    ]
    for words, code in steps:
        result = run(*words, "--db", url, cwd=tmp_path)
        assert result.returncode == code, (words, result.stderr)
    assert [e["event_type"] for e in json.loads(result.stdout)] == ["RunStarted", "SignalReceived"]
    assert not (tmp_path / "admission.sqlite3").exists()


def test_db_downgrade_to_base_leaves_a_database_that_upgrades_again(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path)
    assert run("db", "downgrade", "base", "--db", url, cwd=tmp_path).returncode == 0
    check = run("db", "check", "--db", url, cwd=tmp_path)
    assert check.returncode == 3 and json.loads(check.stdout)["revision"] is None
    assert run("db", "upgrade", "--db", url, cwd=tmp_path).returncode == 0
    assert json.loads(run("db", "check", "--db", url, cwd=tmp_path).stdout)["ok"] is True


# -- every hint is a command that works -----------------------------------------------------------------


HINT = re.compile(r"`(admission [^`]+)`")
"""A command the package tells its user to run, as its messages write it: in backquotes."""


def hints_in_the_source() -> set[str]:
    """Every ``admission ...`` command in a string the package can print (docstrings and other bare
    strings are never printed)."""
    found: set[str] = set()
    for path in (ROOT / "admission").rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        bare = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in bare:
                found.update(HINT.findall(node.value))
    return found


def hint_in(text: str) -> str:
    [hint] = HINT.findall(text)
    assert hint in hints_in_the_source()  # what is printed is what the source says
    return hint


def as_argv(hint: str, url: str, revision: str = "") -> list[str]:
    words = hint.split()
    assert words[0] == "admission"
    return [{"URL": url, "REVISION": revision}.get(w, w) for w in words[1:]]


def accept_a_worker_record(url: str, tmp_path: Path) -> None:
    scope = tmp_path / "scope.json"
    scope.write_text(json.dumps(SCOPE), encoding="utf-8")
    record = tmp_path / "record.json"
    record.write_text(json.dumps({**SCOPE, "source_key": "lead-1"}), encoding="utf-8")
    accepted = run(
        "worker", "accept", "--scope", str(scope), "--record", str(record), "--db", url, cwd=tmp_path
    )
    assert accepted.returncode == 0, accepted.stderr


def enqueue_a_job(url: str, _tmp_path: Path) -> None:
    from admission.jobs import Job, JobService
    from admission.sql import SqlJobStore

    jobs = JobService(SqlJobStore.open(url))
    try:
        jobs.enqueue(Job("j1", "tenant-a", "count", {"steps": 1}))
    finally:
        jobs.dispose()


def revision(url: str, cwd: Path) -> str | None:
    value: str | None = json.loads(run("db", "check", "--db", url, cwd=cwd).stdout)["revision"]
    return value


def test_the_hints_are_the_ones_exercised_below() -> None:
    # A new hint fails here until a test below makes the package print it and runs it.
    assert hints_in_the_source() == {
        "admission db upgrade --db URL",
        "admission db downgrade REVISION --allow-unsafe --db URL",
        # EventLogMovedError's: run in tests/integration/test_cluster_move.py (a real cluster move).
        "admission db rebase-events --db URL",
    }


def test_the_upgrade_hint_for_a_database_without_the_schema_creates_it(
    sql_backend: str, postgres_pool: PostgresPool, tmp_path: Path
) -> None:
    url = database_url(sql_backend, postgres_pool, tmp_path, migrated=False)
    refused = run("--db", url, "start", "wf", cwd=tmp_path)
    assert refused.returncode == 3
    hinted = run(*as_argv(hint_in(refused.stderr), url), cwd=tmp_path)
    assert hinted.returncode == 0, hinted.stderr
    assert json.loads(hinted.stdout)["revision"] == HEAD_REVISION
    assert run("--db", url, "start", "wf", cwd=tmp_path).returncode == 0  # what was refused now works


def test_the_upgrade_hint_for_an_older_revision_upgrades_to_the_head(
    sql_backend: str, postgres_pool: PostgresPool, tmp_path: Path
) -> None:
    url = database_url(sql_backend, postgres_pool, tmp_path, migrated=False)
    assert run("db", "upgrade", "--revision", "0003", "--db", url, cwd=tmp_path).returncode == 0
    check = run("db", "check", "--db", url, cwd=tmp_path)
    assert check.returncode == 3
    hinted = run(*as_argv(hint_in(json.loads(check.stdout)["message"]), url), cwd=tmp_path)
    assert hinted.returncode == 0, hinted.stderr
    assert json.loads(run("db", "check", "--db", url, cwd=tmp_path).stdout)["ok"] is True


@pytest.mark.parametrize(
    ("fill", "to"),
    [(accept_a_worker_record, "0002"), (enqueue_a_job, "0003")],
    ids=["worker records", "jobs"],
)
def test_the_downgrade_hint_downgrades_what_was_refused(
    fill: Callable[[str, Path], None], to: str, sql_backend: str, db_url: str, tmp_path: Path
) -> None:
    fill(db_url, tmp_path)
    refused = run("db", "downgrade", to, "--db", db_url, cwd=tmp_path)
    assert refused.returncode == 4
    assert revision(db_url, tmp_path) == HEAD_REVISION  # refused: nothing changed
    hinted = run(*as_argv(hint_in(refused.stderr), db_url, to), cwd=tmp_path)
    assert hinted.returncode == 0, hinted.stderr
    assert json.loads(hinted.stdout)["revision"] == f"admission_{to}" == revision(db_url, tmp_path)


@pytest.mark.parametrize(
    ("argv", "usage"),
    [
        (["db", "upgrade", "--bogus"], "usage: admission "),
        (["close", "wf", "--status", "bogus"], "usage: admission close "),
        (["worker", "once", "--fault", "bogus", "--scope", "s.json"], "usage: admission worker once "),
    ],
)
def test_a_refused_command_line_names_a_help_command_that_works(
    argv: list[str], usage: str, tmp_path: Path
) -> None:
    refused = run(*argv, cwd=tmp_path)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1
    [help_command] = re.findall(r"see `(admission [^`]+ --help|admission --help)`", refused.stderr)
    shown = run(*help_command.split()[1:], cwd=tmp_path)
    assert shown.returncode == 0 and shown.stdout.startswith(usage)
