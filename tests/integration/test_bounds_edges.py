"""Values no backend can store, through the edges: HTTP 422 ``input_invalid`` and CLI exit 2.

The reported cases: a command name holding NUL or 256 characters, a run id
of 37 characters (past its column, within the 255 of a name), a worker
``source_key`` or tenant holding NUL.  Each was admitted on SQLite and a
retryable 503 / storage error on PostgreSQL; now each is refused naming
the field, nothing written, on both.
"""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest
from sqlalchemy import Engine

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

from admission.http import create_app
from admission.receipts import AdmissionService
from admission.sql import SqlStore
from tests.support.snapshot import diff_snapshots, snapshot

pytestmark = pytest.mark.filterwarnings("ignore:Using `httpx` with `starlette.testclient`")

ROOT = Path(__file__).resolve().parents[2]
NS = "tenant-a"
RUN = "r1"


@pytest.fixture
def client(db_url: str) -> Iterator[TestClient]:
    store = SqlStore.open(db_url)
    service = AdmissionService(store)
    service.start_run(NS, "wf-1", run_id=RUN)
    yield TestClient(create_app(service), raise_server_exceptions=False)
    store.dispose()


@pytest.mark.parametrize(
    ("path", "field"),
    [
        (f"/api/workflows/wf-1/signal/{quote('a' + chr(0) + 'b')}", "name"),
        (f"/api/workflows/wf-1/update/{'n' * 256}", "name"),
        (f"/api/workflows/wf-1/runs/{'r' * 37}/signal/go", "run_id"),
        (f"/api/workflows/wf-1/runs/{'r' * 37}/update/go", "run_id"),
        (f"/api/workflows/{quote('w' + chr(0))}/signal/go", "workflow_id"),
    ],
    ids=["nul-name", "256-name", "37-run-signal", "37-run-update", "nul-workflow"],
)
def test_over_http_a_value_no_backend_stores_is_a_422_naming_it_and_writes_nothing(
    client: TestClient, engine: Engine, path: str, field: str
) -> None:
    before = snapshot(engine)
    for key in ("k1", None):
        body = {"request_id": key}
        response = client.post(path, json=body, headers={"X-Namespace": NS})
        assert response.status_code == 422, response.text
        answer = response.json()
        assert (answer["reason"], answer["field"]) == ("input_invalid", field), answer
    assert diff_snapshots(before, snapshot(engine)) == []


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "admission", *args], capture_output=True, text=True, cwd=ROOT, timeout=120
    )


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["start", "wf-2", "--run-id", "r" * 37], "run_id"),
        (["signal", "wf-1", "n" * 256, "--request-id", "k1"], "name"),
        (["update", "wf-1", "go", "--run", "r" * 37], "run_id"),
    ],
    ids=["start-37-run", "signal-256-name", "update-37-run"],
)
def test_on_the_command_line_a_value_no_backend_stores_exits_2_naming_it_and_writes_nothing(
    db_url: str, engine: Engine, args: list[str], field: str
) -> None:
    AdmissionService(SqlStore(engine)).start_run("default", "wf-1", run_id=RUN)
    before = snapshot(engine)
    result = run("--db", db_url, *args)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert field in result.stderr and "Traceback" not in result.stderr
    assert diff_snapshots(before, snapshot(engine)) == []


@pytest.mark.parametrize("field", ["source_key", "tenant"])
def test_worker_accept_refuses_nul_in_a_source_key_or_tenant_with_exit_2_and_writes_nothing(
    db_url: str, engine: Engine, tmp_path: Path, field: str
) -> None:
    def accept(scope: dict[str, str], record: dict[str, object]) -> subprocess.CompletedProcess[str]:
        (tmp_path / "scope.json").write_text(json.dumps(scope))
        (tmp_path / "record.json").write_text(json.dumps(record))
        files = ["--scope", str(tmp_path / "scope.json"), "--record", str(tmp_path / "record.json")]
        return run("worker", "accept", "--db", db_url, *files, "--lock", str(tmp_path / "worker.lock"))

    # A first record opens the queue (pinning its scope), so the refused one is all that is left to write.
    assert accept({"tenant": "t1"}, {"tenant": "t1", "source_key": "k0"}).returncode == 0
    scope = {"tenant": "t\x00" if field == "tenant" else "t1"}
    record = {**scope, "source_key": "k\x00" if field == "source_key" else "k1", "payload": {"a": 1}}
    before = snapshot(engine)
    result = accept(scope, record)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert field in result.stderr and "Traceback" not in result.stderr
    assert diff_snapshots(before, snapshot(engine)) == []
