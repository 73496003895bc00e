"""A database URL's password never appears in what the command line prints, when it works too.

The failures are covered in ``test_cli_failures.py``; here every command
succeeds.  The test server trusts loopback connections, so a URL that carries
a password connects all the same, and what each command prints (its JSON,
its SQL, the server's first line and its access log) can be searched for it.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

from tests.support.backends import SQL_BACKENDS, PostgresPool

ROOT = Path(__file__).resolve().parents[2]
PASSWORD = "pw-9f3c-never-shown"


@pytest.fixture
def url(postgres_pool: PostgresPool) -> str:
    if "postgresql" not in SQL_BACKENDS:
        pytest.skip("needs PostgreSQL (ADMISSION_TEST_BACKEND)")
    plain = make_url(postgres_pool.fresh_database(migrated=False))
    return plain.set(password=PASSWORD).render_as_string(hide_password=False)


def run(*args: str) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if k != "ADMISSION_DB"}
    command = [sys.executable, "-m", "admission", *args]
    return subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=environment, timeout=120)


def test_no_command_prints_the_password_of_a_url_that_works(url: str) -> None:
    steps = [
        ["db", "upgrade", "--sql", "--db", url],
        ["db", "upgrade", "--db", url],
        ["--db", url, "db", "check"],
        ["start", "wf", "--namespace", "ns", "--db", url],
        ["signal", "wf", "go", "--namespace", "ns", "--request-id", "k", "--db", url],
        ["history", "wf", "--namespace", "ns", "--db", url],
    ]
    for step in steps:
        result = run(*step)
        assert result.returncode == 0, (step, result.stderr)
        assert PASSWORD not in result.stdout + result.stderr, step
    # The URL with the password came in; what went out says ***.
    assert "***@" in run("db", "check", "--db", url).stdout


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_serve_prints_neither_the_password_nor_does_its_log(url: str) -> None:
    pytest.importorskip("uvicorn")
    httpx = pytest.importorskip("httpx")
    assert run("db", "upgrade", "--db", url).returncode == 0
    port = free_port()
    command = [sys.executable, "-m", "admission", "--db", url, "serve", "--port", str(port), "--access-log"]
    server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        first = server.stdout.readline() if server.stdout else ""
        assert '"serving"' in first and "***" in first
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(f"http://127.0.0.1:{port}/api/workflows/wf/receipt", headers={"X-Namespace": "ns"})
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "the server did not answer"
                time.sleep(0.1)
    finally:
        server.terminate()
        out, err = server.communicate(timeout=30)
    assert "GET /api/workflows/wf/receipt" in out + err  # the access log was written, and searched
    assert PASSWORD not in first + out + err
