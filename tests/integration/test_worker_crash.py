"""The worker's crash safety, shown by killing real OS processes (issue 6 item 8, contract §2, §3).

Each test runs ``python -m admission worker ...`` as separate processes.  A
test hook (``ADMISSION_WORKER_STOP_AT``) makes the worker pause at one named
point of a send and create a marker file; the test then SIGKILLs it exactly
there, or deletes the marker to let it go on.  After a restart: the target
never holds a duplicate ``write_id``, no accepted record is lost, a record
that crashed in flight ends ``uncertain`` and is settled only by readback.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import Engine

from admission.sql import SqlWorkerStore, create_admission_engine
from admission.testing import CRASH_EXIT_CODE
from admission.worker import CRASH_POINTS, DurableWorker, Scope, SqliteTarget
from tests.support.backends import SQL_BACKENDS, PostgresPool, sqlite_url
from tests.support.processes import WAIT

ROOT = Path(__file__).resolve().parents[2]
SCOPE = {"tenant": "t1", "account": "a1", "page": "p1", "form": "f1"}


class Setup:
    """Files of one crash scenario, and the CLI run against them."""

    def __init__(self, db_url: str, tmp_path: Path) -> None:
        self.db_url = db_url
        self.tmp = tmp_path
        self.scope = tmp_path / "scope.json"
        self.scope.write_text(json.dumps(SCOPE))
        self.target_path = tmp_path / "target.sqlite3"
        self.target = SqliteTarget(self.target_path)
        self.marker = tmp_path / "stopped"
        self.postgres = db_url.startswith("postgresql")

    def argv(self, command: str, *extra: str) -> list[str]:
        args = [sys.executable, "-m", "admission", "worker", command, "--db", self.db_url]
        args += ["--scope", str(self.scope), "--lease-ttl", "0.3", "--wait", "5"]
        if command in ("once", "start", "poll-status"):
            args += ["--target", str(self.target_path)]
        return [*args, *extra]

    def env(self, stop_at: str | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("ADMISSION_WORKER_")}
        if stop_at is not None:
            env["ADMISSION_WORKER_STOP_AT"] = stop_at
            env["ADMISSION_WORKER_STOP_MARKER"] = str(self.marker)
        return env

    def run(self, command: str, *extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.argv(command, *extra), capture_output=True, text=True, timeout=WAIT, cwd=ROOT, env=self.env()
        )

    def accept(self, key: str) -> str:
        """Accept in this process: the crashes under test are the worker's, not the producer's."""
        engine = create_admission_engine(self.db_url)
        try:
            worker = DurableWorker(SqlWorkerStore(engine), Scope.parse(SCOPE), file_lock=False)
            return worker.accept({**SCOPE, "source_key": key, "payload": {"key": key}}).write_id
        finally:
            engine.dispose()

    def accept_by_cli(self, key: str) -> str:
        path = self.tmp / f"{key}.json"
        path.write_text(json.dumps({**SCOPE, "source_key": key, "payload": {"key": key}}))
        result = self.run("accept", "--record", str(path))
        assert result.returncode == 0, result.stderr
        return str(json.loads(result.stdout)["write_id"])

    def spawn_stopping_at(self, point: str) -> subprocess.Popen[str]:
        self.marker.unlink(missing_ok=True)
        process = subprocess.Popen(
            self.argv("once"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env=self.env(point),
        )
        deadline = time.monotonic() + WAIT
        while not self.marker.exists():
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                _, err = process.communicate()
                raise AssertionError(f"the worker never reached {point}: {err}")
            time.sleep(0.02)
        return process

    def states(self) -> dict[str, str]:
        engine = create_admission_engine(self.db_url)
        try:
            worker = DurableWorker(SqlWorkerStore(engine), Scope.parse(SCOPE), file_lock=False)
            return {str(r["write_id"]): str(r["state"]) for r in worker.status()["records"]}  # type: ignore[attr-defined]
        finally:
            engine.dispose()

    def events(self, write_id: str) -> list[str]:
        engine: Engine = create_admission_engine(self.db_url)
        try:
            worker = DurableWorker(SqlWorkerStore(engine), Scope.parse(SCOPE), file_lock=False)
            return [str(e["event_type"]) for e in worker.events(write_id)]
        finally:
            engine.dispose()

    def assert_no_duplicates(self) -> None:
        ids = self.target.write_ids()
        assert len(ids) == len(set(ids)) and self.target.duplicate_attempts() == 0


@pytest.fixture
def setup(db_url: str, tmp_path: Path) -> Setup:
    return Setup(db_url, tmp_path)


# What the first record is right after the kill, whether the target has it, and the end
# states of the first and second records.  A record is confirmed in the commit that puts the
# next one in flight, so a kill right after that commit leaves the second record in flight
# without having been sent: uncertain, and (its readback empty) it stays so.
AFTER_KILL = {
    "before_dispatch": ("prepared", False, "confirmed", "confirmed"),
    "after_in_flight": ("in_flight", False, "uncertain", "confirmed"),
    "after_target_commit": ("in_flight", True, "confirmed", "confirmed"),
    "after_confirm": ("confirmed", True, "confirmed", "uncertain"),
}


@pytest.mark.parametrize("point", CRASH_POINTS)
def test_sigkill_at_each_step_of_a_send_then_restart(setup: Setup, point: str) -> None:
    ids = [setup.accept(f"lead-{i}") for i in range(3)]
    first = ids[0]
    process = setup.spawn_stopping_at(point)
    process.send_signal(signal.SIGKILL)
    process.communicate(timeout=WAIT)
    assert process.returncode == -signal.SIGKILL

    state, landed, final, second = AFTER_KILL[point]
    assert setup.states()[first] == state
    assert (first in setup.target.write_ids()) is landed

    for _ in range(2):  # restart, then once more: nothing changes any further
        result = setup.run("once")
        assert result.returncode == 0, result.stderr
    states = setup.states()
    assert set(states) == set(ids)  # no accepted record is lost
    assert (states[first], states[ids[1]], states[ids[2]]) == (final, second, "confirmed")
    setup.assert_no_duplicates()
    if state == "in_flight":
        # Crashed in flight: found uncertain, then settled only by readback (or not at all).
        events = setup.events(first)
        assert "crash_found" in events
        assert ("readback_found" in events) is landed
        assert events.count("dispatch") == 1
    assert sorted(setup.target.write_ids()) == sorted(i for i in ids if states[i] == "confirmed")


def test_the_crash_after_write_fault_exits_73_and_a_restart_reconciles_by_readback(setup: Setup) -> None:
    write_id = setup.accept_by_cli("lead")
    crashed = setup.run("once", "--fault", "crash-after-write")
    assert crashed.returncode == CRASH_EXIT_CODE, crashed.stderr
    assert setup.states()[write_id] == "in_flight" and setup.target.write_ids() == [write_id]
    result = setup.run("once")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert (report["recovered"], report["reconciled"], report["sent"]) == (1, 1, 0)
    assert setup.states()[write_id] == "confirmed"
    assert setup.events(write_id) == ["accepted", "dispatch", "crash_found", "readback_found"]
    setup.assert_no_duplicates()


def test_a_second_local_worker_cannot_start_while_the_first_lives(tmp_path: Path) -> None:
    # The file lock is the local (SQLite) worker's ownership; PostgreSQL is fenced below.
    setup = Setup(sqlite_url(tmp_path), tmp_path)
    setup.accept("lead")
    first = subprocess.Popen(
        setup.argv("start", "--interval", "0.2"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=setup.env(),
    )
    try:
        assert first.stdout is not None
        assert json.loads(first.stdout.readline())["cycle"] == 1  # it owns the queue now
        second = setup.run("once")
        assert second.returncode == 11, second.stderr
        assert "another worker holds" in second.stderr
        first.send_signal(signal.SIGTERM)
        out, err = first.communicate(timeout=WAIT)
        assert first.returncode == 0, err
        assert json.loads(out.strip().splitlines()[-1])["stopped"] is True
    finally:
        if first.poll() is None:
            first.kill()
            first.communicate()
    after = setup.run("once")
    assert after.returncode == 0, after.stderr


@pytest.mark.skipif("postgresql" not in SQL_BACKENDS, reason="ADMISSION_TEST_BACKEND excludes PostgreSQL")
def test_an_old_lease_holders_late_write_is_refused_by_postgresql(
    postgres_pool: PostgresPool, tmp_path: Path
) -> None:
    # Leases with fencing tokens are the several-machines ownership: PostgreSQL.
    setup = Setup(postgres_pool.fresh_database(), tmp_path)
    write_id = setup.accept("lead")
    old = setup.spawn_stopping_at("after_in_flight")  # token 1, paused: its heartbeat stands still
    try:
        claim = setup.run("poll-status")  # another machine: waits out the ttl, claims token 2
        assert claim.returncode == 0, claim.stderr
        setup.marker.unlink()  # the old owner wakes up and writes late
        _, err = old.communicate(timeout=WAIT)
    finally:
        if old.poll() is None:
            old.kill()
            old.communicate()
    assert old.returncode == 11, err
    assert "fencing token 1" in err
    assert setup.states()[write_id] == "in_flight"  # its confirm was refused
    assert setup.target.write_ids() == [write_id]  # though its request landed
    result = setup.run("once")
    assert result.returncode == 0, result.stderr
    assert setup.states()[write_id] == "confirmed"
    assert setup.events(write_id)[-2:] == ["crash_found", "readback_found"]
    setup.assert_no_duplicates()
