"""``admission token`` and ``serve --tokens``, run as a user runs them: real processes, real sockets."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from admission.http import token_digest
from admission.receipts import AdmissionService
from admission.sql import SqlStore
from tests.integration.test_http import free_port, serving
from tests.support.backends import sqlite_url
from tests.support.processes import ROOT


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "admission", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
    )


def create_token(path: Path, name: str, *namespaces: str) -> str:
    words = [word for namespace in namespaces for word in ("--namespace", namespace)]
    result = cli("token", "create", "--name", name, *words, "--file", str(path))
    assert result.returncode == 0, result.stderr
    printed = json.loads(result.stdout)
    assert (printed["name"], printed["namespaces"]) == (name, list(namespaces))
    token = printed["token"]
    assert isinstance(token, str) and token.startswith("adm_") and len(token) == 68
    return token


def test_token_create_prints_the_token_once_and_writes_only_its_hash(tmp_path: Path) -> None:
    path = tmp_path / "tokens.json"
    first = create_token(path, "engine-a", "a", "über")
    second = create_token(path, "engine-b", "b")
    assert first != second
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    text = path.read_text(encoding="utf-8")
    assert first not in text and second not in text
    data = json.loads(text)
    assert data == {
        "version": 1,
        "tokens": [
            {"name": "engine-a", "sha256": token_digest(first), "namespaces": ["a", "über"]},
            {"name": "engine-b", "sha256": token_digest(second), "namespaces": ["b"]},
        ],
    }
    assert [p.name for p in tmp_path.iterdir()] == ["tokens.json"]  # no temporary file left behind
    listed = cli("token", "list", env={"ADMISSION_TOKENS": str(path)})
    assert listed.returncode == 0, listed.stderr
    assert token_digest(first) not in listed.stdout
    assert [t["name"] for t in json.loads(listed.stdout)["tokens"]] == ["engine-a", "engine-b"]
    revoked = cli("token", "revoke", "--name", "engine-a", "--file", str(path))
    assert revoked.returncode == 0, revoked.stderr
    assert [t["name"] for t in json.loads(path.read_text())["tokens"]] == ["engine-b"]
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--name", "engine-a", "--namespace", "a"], "already has a token named 'engine-a'"),
        (["--name", "new", "--namespace", ""], "--namespace: must be a non-empty string"),
        (["--name", "new", "--namespace", "a", "--namespace", "a"], "--namespace: 'a' is listed twice"),
        (["--name", "", "--namespace", "a"], "--name: must be 1 to 255 characters"),
    ],
)
def test_token_create_refuses_bad_input_and_leaves_the_file(
    tmp_path: Path, args: list[str], message: str
) -> None:
    path = tmp_path / "tokens.json"
    create_token(path, "engine-a", "a")
    before = path.read_bytes()
    result = cli("token", "create", *args, "--file", str(path))
    assert (result.returncode, result.stdout) == (2, "")
    assert message in result.stderr and "Traceback" not in result.stderr
    assert path.read_bytes() == before


def malformed_files() -> dict[str, tuple[bytes, str]]:
    token = "adm_" + "9" * 64
    digest = token_digest(token)
    return {
        "not-json": (b'{"tokens": [', "--tokens: not JSON: Expecting value at line 1"),
        "bad-hash": (
            b'{"tokens": [{"name": "a", "sha256": "XYZ", "namespaces": ["a"]}]}',
            "tokens[0].sha256",
        ),
        "clear-token": (
            json.dumps(
                {"tokens": [{"name": "a", "token": token, "sha256": digest, "namespaces": ["a"]}]}
            ).encode(),
            "tokens[0].token: unknown member",
        ),
        "duplicate-hash": (
            json.dumps(
                {
                    "tokens": [
                        {"name": "a", "sha256": digest, "namespaces": ["a"]},
                        {"name": "b", "sha256": digest, "namespaces": ["b"]},
                    ]
                }
            ).encode(),
            "tokens[1].sha256: the same token hash is listed twice",
        ),
        "not-utf8": (b'{"tokens": [], "x": "\xff"}', "not UTF-8"),
    }


@pytest.mark.parametrize("case", ["not-json", "bad-hash", "clear-token", "duplicate-hash", "not-utf8"])
def test_serve_refuses_a_malformed_token_file_before_listening(tmp_path: Path, case: str) -> None:
    content, message = malformed_files()[case]
    path = tmp_path / "tokens.json"
    path.write_bytes(content)
    path.chmod(0o600)
    port = str(free_port())
    result = cli("--db", sqlite_url(tmp_path), "serve", "--port", port, "--tokens", str(path))
    assert (result.returncode, result.stdout) == (2, ""), result.stderr
    assert result.stderr.startswith("admission: --tokens: ") and message in result.stderr
    assert "Traceback" not in result.stderr
    assert "9" * 64 not in result.stderr and token_digest("adm_" + "9" * 64) not in result.stderr


def test_serve_refuses_a_token_file_others_may_write(tmp_path: Path) -> None:
    path = tmp_path / "tokens.json"
    create_token(path, "engine-a", "a")
    path.chmod(0o666)
    result = cli("--db", sqlite_url(tmp_path), "serve", "--port", str(free_port()), "--tokens", str(path))
    assert result.returncode == 2 and "writable by its group or others" in result.stderr


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.0.2.1", "example.com", ""])
def test_serve_refuses_a_non_loopback_address_without_tokens(tmp_path: Path, host: str) -> None:
    result = cli("--db", sqlite_url(tmp_path), "serve", "--host", host, "--port", str(free_port()))
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr.startswith("admission: --host: ") and "--insecure-no-auth" in result.stderr
    assert "Traceback" not in result.stderr


def test_serve_refuses_tokens_and_insecure_no_auth_together(tmp_path: Path) -> None:
    path = tmp_path / "tokens.json"
    create_token(path, "engine-a", "a")
    result = cli("--db", sqlite_url(tmp_path), "serve", "--tokens", str(path), "--insecure-no-auth")
    assert result.returncode == 2 and "--insecure-no-auth: cannot be given with --tokens" in result.stderr


def test_serve_on_every_address_starts_when_insecure_no_auth_says_so(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path)
    with serving(url, "--host", "0.0.0.0", "--insecure-no-auth") as (base, announced):
        assert announced["auth"] == "none" and announced["serving"].startswith("http://0.0.0.0:")
        with httpx.Client(base_url=base) as http:
            answer = http.post("/api/workflows/wf-1/signal/go", json={}, headers={"X-Namespace": "any"})
        assert answer.status_code == 409  # an answer (no open run), not a refusal: no authentication


def test_serve_with_tokens_answers_401_403_and_202_over_a_real_socket(tmp_path: Path, db_url: str) -> None:
    path = tmp_path / "tokens.json"
    token = create_token(path, "engine-a", "a", "über")
    store = SqlStore.open(db_url)
    service = AdmissionService(store)
    try:
        for namespace in ("a", "b", "über"):
            service.start_run(namespace, "wf-1")
        signal_path = "/api/workflows/wf-1/signal/go"
        access_log = ("--access-log", "--log-level", "debug")
        command = (*access_log, "--host", "127.0.0.1")
        with serving(db_url, *command, env={"ADMISSION_TOKENS": str(path)}) as (base, announced):
            assert (announced["auth"], announced["tokens"]) == ("bearer-tokens", 1)
            with httpx.Client(base_url=base) as http:

                def send(namespace: str, auth: str | None) -> httpx.Response:
                    headers = {"X-Namespace": namespace}
                    if auth is not None:
                        headers["Authorization"] = auth
                    return http.post(signal_path, json={"request_id": f"k-{namespace}"}, headers=headers)

                anonymous = send("a", None)
                wrong = send("a", "Bearer adm_" + "0" * 64)
                other_namespace = send("b", f"Bearer {token}")
                allowed = send("a", f"Bearer {token}")
                encoded = send("%C3%BCber", f"Bearer {token}")
        assert anonymous.status_code == 401 and anonymous.headers["www-authenticate"].startswith("Bearer")
        assert wrong.status_code == 401 and 'error="invalid_token"' in wrong.headers["www-authenticate"]
        assert (other_namespace.status_code, other_namespace.json()["reason"]) == (403, "namespace_forbidden")
        assert allowed.status_code == 202 and encoded.status_code == 202
        assert encoded.json()["namespace"] == "über"
        assert service.receipt("a", "wf-1", "signal", "k-a") is not None
        assert service.receipt("b", "wf-1", "signal", "k-b") is None
        assert service.receipt("über", "wf-1", "signal", "k-%C3%BCber") is not None
    finally:
        store.dispose()


def test_neither_the_token_nor_its_hash_reaches_the_servers_output(tmp_path: Path) -> None:
    path = tmp_path / "tokens.json"
    token = create_token(path, "engine-a", "a")
    url = sqlite_url(tmp_path)
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "admission",
        "--db",
        url,
        "serve",
        "--port",
        str(port),
        "--tokens",
        str(path),
    ]
    command += ["--access-log", "--log-level", "debug"]
    server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert server.stdout is not None
        first = server.stdout.readline()
        assert json.loads(first)["auth"] == "bearer-tokens"
        base = f"http://127.0.0.1:{port}"
        with httpx.Client(base_url=base) as http:
            for _ in range(600):
                try:
                    http.get("/openapi.json")
                    break
                except httpx.TransportError:
                    assert server.poll() is None
                    time.sleep(0.05)
            for auth in (f"Bearer {token}", f"Bearer {token}x", f"Basic {token}"):
                response = http.post(
                    "/api/workflows/wf-1/signal/go",
                    json={},
                    headers={"X-Namespace": "b", "Authorization": auth},
                )
                assert response.status_code in (401, 403)
                assert token not in response.text
    finally:
        server.send_signal(signal.SIGTERM)
        out, err = server.communicate(timeout=30)
    # The access log (uvicorn writes it on stdout) shows the path and the status, not the headers.
    assert '"POST /api/workflows/wf-1/signal/go HTTP/1.1" 403' in out, out
    for secret in (token, token_digest(token), token[4:]):
        assert secret not in first + out + err


def test_serve_keeps_the_connection_alive_across_admissions_and_refusals(tmp_path: Path) -> None:
    # One socket for every request: an admission, its retry (both on the direct path)
    # and a refusal the framework answers (duplicate members), in that order.
    import http.client

    url = sqlite_url(tmp_path)
    store = SqlStore.open(url)
    try:
        AdmissionService(store).start_run("default", "wf-1")
    finally:
        store.dispose()
    with serving(url) as (base, _announced):
        host, port = base.removeprefix("http://").rsplit(":", 1)
        connection = http.client.HTTPConnection(host, int(port), timeout=60)
        try:
            connection.connect()
            opened = connection.sock
            answers = []
            for body in (
                b'{"request_id": "k1"}',
                b'{"request_id": "k1"}',
                b'{"request_id": "a", "request_id": "b"}',
            ):
                connection.request(
                    "POST",
                    "/api/workflows/wf-1/signal/go",
                    body=body,
                    headers={"Content-Type": "application/json"},
                )
                response = connection.getresponse()
                answers.append((response.status, json.loads(response.read())))
                assert response.getheader("connection") != "close"
            assert connection.sock is opened, "a request went over a new connection"
        finally:
            connection.close()
    assert [status for status, _ in answers] == [202, 202, 422]
    assert [answers[0][1]["retained"], answers[1][1]["retained"]] == [False, True]
    assert answers[2][1]["field"] == "body"
