"""Failover with nothing lost: a real primary SIGKILLed under load, its synchronous standby promoted.

A primary and a synchronous standby (``synchronous_commit=on``,
``synchronous_standby_names`` naming it) stream on loopback
(``tests/support/replication.py``).  Client processes admit keyed signals and
updates through a multi-host URL (``target_session_attrs=read-write``), each
logging every call (``tests/support/failover.py``); another process follows
the event log with its cursor.  Mid-load the primary's whole process group is
SIGKILLed and the standby promoted; the clients carry on, retrying a key that
failed until it is answered.  Then, on the new primary: every key answered is
stored exactly once and a retry answers it retained with its original ids;
the calls in flight at the kill failed as retryable ``StorageError``\\ s; the
follower read every event row exactly once, in order, as a whole read after
the failover finds them; and each process failed at most once after the new
primary accepted connections.  A second test shows the job and worker leases
survive the failover with their fencing: an owner cut off (SIGSTOPped) across
it cannot write once a new owner has claimed.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from sqlalchemy import func, select

from admission.errors import FencedError, LeaseHeldError
from admission.jobs import JobService
from admission.receipts import AdmissionService, Decision, EventCursor
from admission.sql import (
    SqlJobStore,
    SqlStore,
    SqlWorkerStore,
    create_admission_engine,
    upgrade,
    workflow_commands,
)
from admission.worker import DurableWorker, Scope, SqliteTarget
from tests.support import failover
from tests.support.backends import SQL_BACKENDS
from tests.support.jobkit import ManualClock
from tests.support.pgserver import PostgresError
from tests.support.processes import WAIT, running
from tests.support.replication import ReplicatedCluster

pytestmark = pytest.mark.extra

CTX = multiprocessing.get_context("spawn")
CLIENTS = 4
BEFORE = 20
"""Calls each client has answered before the kill."""
AFTER = 20
"""Calls each client answers after the new primary accepts connections, before the clients stop."""


@pytest.fixture
def cluster() -> Iterator[ReplicatedCluster]:
    if "postgresql" not in SQL_BACKENDS:
        pytest.skip("needs PostgreSQL (ADMISSION_TEST_BACKEND)")
    cluster = ReplicatedCluster()
    try:
        cluster.start()
        cluster.add_standby("standby", synchronous=True)
    except PostgresError as exc:
        cluster.stop()
        if os.environ.get("CI"):
            pytest.fail(f"the replicated cluster could not be started: {exc}", pytrace=False)
        pytest.skip(f"the replicated cluster could not be started: {exc}")
    yield cluster
    cluster.stop()


def migrated(cluster: ReplicatedCluster) -> str:
    url = cluster.create_database("admission")
    engine = create_admission_engine(url)
    upgrade(engine)
    engine.dispose()
    return url


def wait_for(condition: Any, what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not condition():
        assert time.monotonic() < deadline, f"waited {WAIT:.0f}s for {what}"
        time.sleep(0.02)


def _lock_waiters(watcher: Any) -> int:
    """Sessions of the database waiting for a lock (the held instance row's)."""
    row = watcher.execute(
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE datname = current_database() AND wait_event_type = 'Lock'"
    ).fetchone()
    return int(row[0])


def test_admissions_survive_a_primary_killed_under_load(cluster: ReplicatedCluster, tmp_path: Path) -> None:
    url = migrated(cluster)
    setup = SqlStore.open(url)
    for index in range(CLIENTS):
        AdmissionService(setup).start_run(failover.NS, f"wf{index}")
    setup.dispose()
    logs = [tmp_path / f"client-{i}.jsonl" for i in range(CLIENTS)]
    stop, follower_stop, follower_log = (
        tmp_path / "stop",
        tmp_path / "follower-stop",
        tmp_path / "events.jsonl",
    )
    # Both spellings of the multi-host URL: SQLAlchemy's for even clients, libpq's for odd ones.
    hosts, ports = zip(*((server.host, str(server.port)) for server in cluster.servers), strict=True)
    libpq = f"postgresql://postgres@/admission?host={','.join(hosts)}&port={','.join(ports)}"
    urls = [url, f"{libpq}&target_session_attrs=read-write"]
    clients = [
        CTX.Process(target=failover.admit_until_stopped, args=(urls[i % 2], i, str(logs[i]), str(stop)))
        for i in range(CLIENTS)
    ]
    frozen = clients[CLIENTS // 2 :]
    follower = CTX.Process(
        target=failover.follow_event_log, args=(url, str(follower_log), str(follower_stop))
    )

    def answered(log: Path, since: float = 0.0) -> int:
        return sum(1 for line in failover.read_lines(log) if "error" not in line and line["start"] >= since)

    with running(*clients, follower):
        wait_for(lambda: all(answered(log) >= BEFORE for log in logs), "answers before the kill")
        # Half the clients are frozen across the failover: every connection they keep goes stale
        # unused, and is first used again after the new primary accepts connections.
        for client in frozen:
            os.kill(client.pid, signal.SIGSTOP)
        # One call is surely in flight at the kill: client 0's next admission waits for the
        # instance lock that this session holds, until the primary dies under both.
        assert cluster.primary is not None
        conninfo = cluster.primary.conninfo("admission")
        holder, watcher = psycopg.connect(**conninfo), psycopg.connect(**conninfo, autocommit=True)
        holder.execute(
            "SELECT id FROM workflow_instances WHERE namespace = %s AND workflow_id = 'wf0' FOR UPDATE",
            (failover.NS,),
        )
        # pg_stat_activity is read afresh per transaction: on its own autocommit session.
        wait_for(lambda: _lock_waiters(watcher) >= 1, "a call waiting for the held instance lock")
        killed_at = time.time()
        try:
            cluster.kill_primary()
            cluster.promote("standby")
            ready_at = time.time()  # pg_promote() waited; a new connection found it out of recovery
        finally:
            for client in frozen:
                os.kill(client.pid, signal.SIGCONT)
            for session in (holder, watcher):
                with contextlib.suppress(psycopg.Error):
                    session.close()
        wait_for(lambda: all(answered(log, ready_at) >= AFTER for log in logs), "answers after the failover")
        stop.touch()
        for client in clients:
            client.join(WAIT)
        assert [client.exitcode for client in clients] == [0] * CLIENTS
        follower_stop.touch()
    assert follower.exitcode == 0

    calls = {i: failover.read_lines(log) for i, log in enumerate(logs)}
    every = [call for lines in calls.values() for call in lines]
    # Every failure was a retryable storage error (the HTTP face answers it 503 storage_unavailable).
    assert {(c["error"], c["retryable"]) for c in every if "error" in c} <= {("storage", True)}
    first_answer: dict[str, dict[str, Any]] = {}
    for call in every:
        if "error" not in call:
            assert call["key"] not in first_answer, (
                "a key answered twice: the client moves on after an answer"
            )
            first_answer[call["key"]] = call
    failed_keys = {c["key"] for c in every if "error" in c}
    assert failed_keys <= set(first_answer), "every key that failed was retried until it was answered"

    fresh_before = [c for c in first_answer.values() if c["end"] < killed_at]
    assert all(c["decision"] == Decision.FRESH for c in fresh_before)
    in_flight = [c for c in every if "error" in c and c["start"] < killed_at < c["end"]]
    assert len(in_flight) >= 1, "no call was in flight at the kill"
    assert all((c["error"], c["retryable"]) == ("storage", True) for c in in_flight)
    resolved_as = Counter(first_answer[c["key"]]["decision"] for c in in_flight)

    # On the new primary: one command per key, and every retry answers retained with the original ids.
    store = SqlStore.open(url)
    try:
        service = AdmissionService(store)
        for key, first in first_answer.items():
            index = int(key[1:].split("-")[0])
            again = failover.admit(service, f"wf{index}", first["kind"], key)
            assert again.decision is Decision.RETAINED, key
            assert again.command_id == first["command_id"], key
        with store.engine.connect() as conn:
            commands = conn.execute(select(func.count()).select_from(workflow_commands)).scalar_one()
            distinct = conn.execute(select(func.count(workflow_commands.c.id.distinct()))).scalar_one()
        assert commands == distinct == len(first_answer)
        whole_log = [(e.tx_id, e.position) for e in store.read_events(EventCursor(), 1_000_000)]
    finally:
        store.dispose()

    # The follower crossed the failover with its cursor and read what a whole read finds, once, in order.
    followed = [(r["tx_id"], r["position"]) for r in failover.read_lines(follower_log) if "error" not in r]
    assert followed == whole_log == sorted(set(whole_log))
    # One event per admission (SignalReceived or UpdateAccepted) and one per run started: none lost,
    # none doubled by a retry.
    assert len(whole_log) == len(first_answer) + CLIENTS
    follower_failures = sum(1 for r in failover.read_lines(follower_log) if "error" in r)

    failed_after = {
        i: sum(1 for c in lines if "error" in c and c["start"] >= ready_at) for i, lines in calls.items()
    }
    report = {
        "frozen": [CLIENTS // 2 + i for i in range(len(frozen))],
        "kill_to_promoted_seconds": round(ready_at - killed_at, 2),
        "fresh_before_kill": len(fresh_before),
        "in_flight": len(in_flight),
        "in_flight_resolved_as": dict(resolved_as),
        "failed_calls": sum(1 for c in every if "error" in c),
        "failed_after_ready_per_process": failed_after,
        "keys": len(first_answer),
        "events_read": len(followed),
        "follower_failures": follower_failures,
    }
    print(f"\nfailover tallies: {report}")
    assert max(failed_after.values()) <= 1, report


def test_leases_keep_their_fencing_across_a_failover(cluster: ReplicatedCluster, tmp_path: Path) -> None:
    url = migrated(cluster)
    target = tmp_path / "target.sqlite3"
    results, go = CTX.Queue(), CTX.Queue()
    owner = CTX.Process(target=failover.hold_leases, args=(url, str(target), results, go))
    with running(owner):
        held = results.get(timeout=WAIT)
        os.kill(held["pid"], signal.SIGSTOP)  # the old owner is cut off across the failover
        try:
            cluster.kill_primary()
            cluster.promote("standby")
            # The claims made on the old primary are on the new one: both are still held.
            clock = ManualClock()
            jobs = JobService(SqlJobStore.open(url), clock=clock, lease_seconds=5.0, owner="new-owner")
            first = jobs.claim(failover.JOB)
            assert (first.outcome, first.reason) == ("not_claimable", "lease_live")
            engine = create_admission_engine(url)
            worker = DurableWorker(
                SqlWorkerStore(engine),
                Scope.parse(failover.SCOPE),
                queue=failover.QUEUE,
                holder="new-owner",
                file_lock=False,
                lease_ttl=5.0,
                monotonic=clock,
            )
            with pytest.raises(LeaseHeldError) as held_by:
                worker.claim()
            assert (held_by.value.holder, held_by.value.token) == ("old-owner", held["token"])
            # The new owner watches both leases stand still for a whole lease, then claims.
            clock.advance(5.0)
            claim = jobs.claim(failover.JOB)
            assert claim.outcome == "claimed" and claim.lease is not None
            assert claim.lease.fence > held["fence"]
            token = worker.claim()
            assert token > held["token"]
        finally:
            os.kill(held["pid"], signal.SIGCONT)
        go.put("write")
        answers = results.get(timeout=WAIT)["answers"]
    assert owner.exitcode == 0
    assert {name: code for name, (code, _) in answers.items()} == {
        "job_heartbeat": "job_fenced",
        "job_checkpoint": "job_fenced",
        "job_complete": "job_fenced",
        "worker_cycle": FencedError.code,
        "worker_renew": FencedError.code,
    }
    # Nothing of the old owner's landed: the new owner holds both, the record was never sent.
    assert jobs.status(failover.JOB).state == "running" and jobs.checkpoints(failover.JOB) == []
    jobs.heartbeat(claim.lease)
    assert worker.get(held["write_id"]).state == "prepared"
    assert not target.exists() or SqliteTarget(target).write_ids() == []
    report = worker.run_once(SqliteTarget(target))
    assert report.token == token and SqliteTarget(target).write_ids() == [held["write_id"]]
    failures = {name: count for name, (_, count) in answers.items()}
    print(f"\nold owner's storage failures before its fenced answers: {failures}")
    jobs.dispose()
    engine.dispose()
