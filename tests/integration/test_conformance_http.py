"""The conformance kit over HTTP, run as a user runs it: ``admission conformance --http URL``.

The target is ``admission serve`` in its own process on a fresh database
(SQLite and PostgreSQL), reached over a real socket with nothing set up
beforehand: the kit starts its own runs through the lifecycle routes.  A broken
server is ``admission serve`` behind a rewriting HTTP proxy (it answers every
retained receipt as fresh); the kit must catch it with a shrunk sequence, and
``--replay`` must bring the same failure back.  Example counts are small: each
case here checks the machinery around the kit, not the contract at length
(the longer runs are marked ``extra``).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from admission.cli import main
from tests.integration.test_http import free_port, serving
from tests.integration.test_serve_auth import create_token
from tests.support.backends import SQL_BACKENDS, PostgresPool, database_url, sqlite_url
from tests.support.processes import ROOT

EXIT_TARGET = 12


def conformance(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if k != "ADMISSION_TOKEN"}
    return subprocess.run(
        [sys.executable, "-m", "admission", "conformance", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env={**environment, **(env or {})},
    )


@pytest.fixture(scope="module")
def sqlite_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``admission serve`` on a fresh SQLite file (at the head revision, nothing else)."""
    with serving(sqlite_url(tmp_path_factory.mktemp("conformance-sqlite"))) as (base, _):
        yield base


@pytest.fixture(scope="module", params=SQL_BACKENDS)
def server(
    request: pytest.FixtureRequest, postgres_pool: PostgresPool, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """``admission serve`` on a fresh database of each backend; SQLite's is the module's one."""
    backend = str(request.param)
    if backend == "sqlite":
        yield request.getfixturevalue("sqlite_server")
        return
    url = database_url(backend, postgres_pool, tmp_path_factory.mktemp("conformance"))
    with serving(url) as (base, _):
        yield base


class _Rewriting(BaseHTTPRequestHandler):
    """Forwards to the upstream server; rewrites the answers as the server's ``mode`` says."""

    upstream: str = ""
    mode: str = ""
    client: httpx.Client

    def log_message(self, format: str, *args: object) -> None:
        pass

    def _forward(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(length) if length else None
        if self.mode == "no-lifecycle" and not any(
            part in self.path for part in ("/signal/", "/update/", "/receipts/")
        ):
            self._answer(404, {"reason": "not_found", "message": "Not Found"})
            return
        headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length")}
        response = self.client.request(self.command, self.upstream + self.path, content=body, headers=headers)
        answer = response.json()
        if self.mode == "fresh-retries" and isinstance(answer, dict) and answer.get("retained") is True:
            answer["retained"] = False  # the broken server: a retry answered as fresh
        self._answer(response.status_code, answer)

    def _answer(self, status: int, body: object) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = _forward


@contextlib.contextmanager
def rewriting_proxy(upstream: str, mode: str) -> Iterator[str]:
    """An HTTP proxy on loopback in front of ``upstream`` that rewrites its answers (``mode``)."""
    with httpx.Client() as client:
        handler = type("Handler", (_Rewriting,), {"upstream": upstream, "mode": mode, "client": client})
        proxy = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        thread = threading.Thread(target=proxy.serve_forever, daemon=True)
        thread.start()
        try:
            yield f"http://127.0.0.1:{proxy.server_address[1]}"
        finally:
            proxy.shutdown()
            proxy.server_close()
            thread.join()


def report_of(path: Path) -> dict[str, object]:
    report = json.loads(path.read_text(encoding="utf-8"))
    assert isinstance(report, dict)
    return report


def test_admission_serve_conforms_over_http(server: str, tmp_path: Path) -> None:
    saved = tmp_path / "report.json"
    result = conformance(
        "--http", server, "--examples", "6", "--steps", "15", "--seed", "7", "--report", str(saved)
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stderr == ""
    assert "every answer agreed with the model" in result.stdout
    report = report_of(saved)
    assert report["ok"] is True and report["seed"] == 7 and report["failure"] is None
    assert set(report["capabilities"]) == {"lifecycle", "progress"}  # type: ignore[arg-type]
    rules = report["rules"]
    assert isinstance(rules, dict) and len(rules) >= 4 and all(count > 0 for count in rules.values())
    for rule in rules:  # the report names every rule it ran, with its count
        assert rule in result.stdout
    assert isinstance(report["examples"], int) and report["examples"] >= 6


@pytest.mark.parametrize("mode", [("--lost-responses",), ("--concurrency", "3")], ids=["lost", "concurrent"])
def test_the_lost_response_and_concurrent_modes_pass_against_admission_serve(
    sqlite_server: str, mode: tuple[str, ...], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    saved = tmp_path / "report.json"
    args = (
        "--http",
        sqlite_server,
        "--examples",
        "4",
        "--steps",
        "15",
        "--seed",
        "3",
        "--report",
        str(saved),
    )
    code, out, err = run_main(capsys, *args, *mode)
    assert code == 0, out + err
    options = report_of(saved)["options"]
    assert isinstance(options, dict)
    assert options["lost_responses"] is (mode[0] == "--lost-responses")
    assert options["concurrency"] == (3 if mode[0] == "--concurrency" else 1)


def test_a_server_with_tokens_is_checked_with_the_token_from_the_environment_or_a_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    tokens = tmp_path / "tokens.json"
    token = create_token(tokens, "kit", "conformance-a", "conformance-b")
    token_file = tmp_path / "token"
    token_file.write_text(token + "\n", encoding="utf-8")
    with serving(sqlite_url(tmp_path), "--tokens", str(tokens)) as (base, _):
        monkeypatch.delenv("ADMISSION_TOKEN", raising=False)
        code, out, err = run_main(
            capsys, "--http", base, "--examples", "1", "--steps", "5", "--token-file", str(token_file)
        )
        assert code == 0, out + err

        monkeypatch.setenv("ADMISSION_TOKEN", token)
        code, out, err = run_main(capsys, "--http", base, "--examples", "2", "--steps", "10", "--seed", "1")
        assert code == 0, out + err
        assert token not in out + err

        # A namespace the token is not granted: 403, the server answered outside what the kit can use.
        code, out, err = run_main(capsys, "--http", base, "--namespace", "other")
        assert code == EXIT_TARGET and out == "" and "403" in err and token not in err

        wrong = "adm_" + "0" * 64
        monkeypatch.setenv("ADMISSION_TOKEN", wrong)
        code, out, err = run_main(capsys, "--http", base, "--examples", "2")
        assert code == EXIT_TARGET and out == ""
        [line] = err.splitlines()
        assert line.startswith("admission: ") and "401" in line and "unauthenticated" in line
        assert wrong not in line

        # The whole command, as a user runs it, without a token: one line, no traceback.
        refused = conformance("--http", base, "--examples", "2")
        assert refused.returncode == EXIT_TARGET and refused.stdout == ""
        assert "401" in refused.stderr and len(refused.stderr.splitlines()) == 1


def run_main(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["conformance", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_an_unreachable_target_is_one_line_and_its_own_exit_code(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_main(capsys, "--http", f"http://127.0.0.1:{free_port()}", "--examples", "2")
    assert code == EXIT_TARGET and out == ""
    [line] = err.splitlines()
    assert line.startswith("admission: ") and "could not be reached" in line


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (("--http", "ftp://example.org"), "--http"),
        (("--http", "http://127.0.0.1:1", "--examples", "0"), "--examples"),
        (("--http", "http://127.0.0.1:1", "--concurrency", "0"), "--concurrency"),
        (("--http", "http://127.0.0.1:1", "--replay", "/nonexistent/replay.json"), "--replay"),
        (("--http", "http://127.0.0.1:1", "--replay", "r.json", "--seed", "1"), "--replay"),
        (("--http", "http://127.0.0.1:1", "--token-file", "/nonexistent/token"), "--token-file"),
    ],
)
def test_bad_usage_exits_2_naming_the_option(
    capsys: pytest.CaptureFixture[str], args: tuple[str, ...], field: str
) -> None:
    code, out, err = run_main(capsys, *args)
    assert code == 2 and out == ""
    [line] = err.splitlines()
    assert line.startswith(f"admission: {field}")


def test_a_token_on_the_command_line_is_refused_and_not_echoed(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_main(capsys, "--http", "http://127.0.0.1:1", "--token", "adm_secret")
    assert code == 2 and out == ""
    assert err.startswith("admission: --token:") and "ADMISSION_TOKEN" in err
    assert "adm_secret" not in err


def test_a_server_without_lifecycle_routes_is_checked_without_the_lifecycle_rules(
    sqlite_server: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    saved = tmp_path / "report.json"
    with rewriting_proxy(sqlite_server, "no-lifecycle") as url:
        code, out, err = run_main(
            capsys, "--http", url, "--examples", "3", "--seed", "5", "--report", str(saved)
        )
    assert code == 0, out + err
    assert report_of(saved)["capabilities"] == []
    assert "lacks clock, history, lifecycle, progress, prune" in out


@pytest.mark.extra  # shrinking over HTTP takes a while; the runner's tests replay in memory by default
def test_a_server_that_answers_retries_as_fresh_is_caught_shrunk_and_replayed(
    sqlite_server: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    saved = tmp_path / "report.json"
    with rewriting_proxy(sqlite_server, "fresh-retries") as url:
        caught = conformance(
            "--http", url, "--examples", "50", "--steps", "10", "--seed", "11", "--report", str(saved)
        )
        assert caught.returncode == 1, caught.stdout + caught.stderr
        assert caught.stderr == ""
        assert "DISAGREEMENT" in caught.stdout and "minimal failing sequence:" in caught.stdout
        failure = report_of(saved)["failure"]
        assert isinstance(failure, dict)
        assert failure["sequence"] and failure["trace"] and failure["message"]
        replay = failure["replay"]
        assert isinstance(replay, dict) and replay["seed"] == 11 and replay["blob"]
        first_line = str(failure["message"]).splitlines()[0]

        # The replay record, saved from the printed report, and the --report file: both replay it.
        printed = caught.stdout.split("--replay FILE):\n", 1)[1].strip()
        record = tmp_path / "replay.json"
        record.write_text(printed, encoding="utf-8")
        assert json.loads(printed) == replay
        for source in (record, saved):
            code, out, err = run_main(capsys, "--http", url, "--replay", str(source))
            assert code == 1, out + err
            assert "replay: the recorded failure came back" in out and first_line in out

    # Against the real server the same case agrees: the failure was the proxy's.
    code, out, err = run_main(capsys, "--http", sqlite_server, "--replay", str(record))
    assert code == 0, out + err
    assert "did NOT come back" in out


@pytest.mark.extra
@pytest.mark.parametrize(
    "mode", [(), ("--lost-responses",), ("--concurrency", "3")], ids=["plain", "lost", "concurrent"]
)
def test_admission_serve_conforms_over_http_at_length(server: str, mode: tuple[str, ...]) -> None:
    # One mode per run: the kit sends a keyed admission either twice (lost) or at once from N clients.
    result = conformance("--http", server, "--examples", "60", *mode)
    assert result.returncode == 0, result.stdout + result.stderr
