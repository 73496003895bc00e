"""A real streaming replica with its replay paused answers final retries, and only those (extra set).

A primary and one streaming standby (``tests/support/replication.py``).  Before
the pause: updates completed, signals applied and keyed refusals (final), an
update accepted and a signal received (pending).  Replay is paused
(``pg_wal_replay_pause()``); then the pending update completes, the signal is
applied and new keys are admitted and completed on the primary.  Every retry
through the store with the replica is compared, byte for byte, with the
answer of a primary-only store; the final ones admitted before the pause
come from the replica, the rest from the primary.  Then the load of N final
retries is measured on both servers (``pg_stat_database``: transactions and
rows returned), with and without the replica, and written to the run's summary.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from typing import Any

import pytest

from admission.receipts import Admission, AdmissionService
from admission.sql import SqlStore, create_admission_engine, upgrade
from admission.sql._replica import ReplicaCounts
from tests.conftest import SUMMARY_LINES
from tests.support.pgserver import PostgresServer
from tests.support.replication import ReplicatedCluster

pytestmark = pytest.mark.extra

NS = "ns"
DB = "replicated"
N = int(os.environ.get("REPLICA_LOAD_RETRIES", 500))


def wire(answer: Admission | None) -> str:
    return "null" if answer is None else json.dumps(answer.to_dict(), ensure_ascii=False, default=str)


@pytest.fixture(scope="module")
def cluster() -> Iterator[ReplicatedCluster]:
    try:
        started = ReplicatedCluster().start()
    except Exception as exc:
        if os.environ.get("CI"):
            pytest.fail(f"a replicated cluster could not be started: {exc!r}", pytrace=False)
        pytest.skip(f"a replicated cluster could not be started: {exc!r}")
    try:
        assert started.primary is not None
        engine = create_admission_engine(started.primary.create_database(DB))
        upgrade(engine)
        engine.dispose()
        started.add_standby("replica", synchronous=False)
        started.wait_replayed("replica")
        yield started
    finally:
        started.stop()


def database_stats(server: PostgresServer) -> tuple[int, int]:
    """(transactions committed, rows returned) of the test database on ``server``, once every other
    session has ended (a backend writes its counts out when it exits)."""
    import psycopg

    with psycopg.connect(**server.conninfo(DB), autocommit=True) as conn:
        for _ in range(400):
            others = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()"
                " AND backend_type = 'client backend'",
                (DB,),
            ).fetchone()
            if others is not None and others[0] == 0:
                break
            time.sleep(0.05)
        conn.execute("SELECT pg_stat_clear_snapshot()")
        row = conn.execute(
            "SELECT xact_commit, tup_returned FROM pg_stat_database WHERE datname = %s", (DB,)
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def test_a_paused_replica_answers_final_retries_and_the_primary_everything_else(
    cluster: ReplicatedCluster,
) -> None:
    primary_server, standby = cluster.primary, cluster.server("replica")
    assert primary_server is not None
    primary = AdmissionService(SqlStore.open(primary_server.url_for(DB)))
    replicated_store = SqlStore.open(primary_server.url_for(DB), read_url=standby.url_for(DB))
    replicated = AdmissionService(replicated_store)
    sent: dict[str, list[tuple[str, str, dict[str, Any], str | None]]] = {}

    def send(
        group: str, kind: str, workflow: str, arguments: dict[str, Any], run_id: str | None = None
    ) -> Admission:
        key = f"{group}-{len(sent.setdefault(group, []))}"
        sent[group].append((kind, workflow, arguments, run_id))
        admit = primary.admit_update if kind == "update" else primary.admit_signal
        return admit(NS, workflow, "cmd", arguments, request_id=key, run_id=run_id)

    try:
        for i in range(3):
            primary.start_run(NS, f"w{i}")
        old_run = primary.start_run(NS, "closed").run_id
        primary.continue_as_new(NS, "closed")
        pending_update = None
        for i in range(3):
            done = send("completed", "update", f"w{i}", {"n": i})
            assert done.update_id is not None
            primary.complete_update(NS, f"w{i}", done.update_id, {"r": i})
            applied = send("applied", "signal", f"w{i}", {"n": i})
            assert applied.command_id is not None
            primary.apply_signal(NS, f"w{i}", applied.command_id)
            send("refused", "signal", "closed", {"n": i}, run_id=old_run)
        pending_update = send("pending", "update", "w0", {"p": 1})
        pending_signal = send("received", "signal", "w1", {"p": 1})
        cluster.wait_replayed("replica")
        cluster.pause_replay("replica")

        # After the pause: the pending ones move on, new keys arrive; the replica sees none of it.
        assert pending_update.update_id is not None and pending_signal.command_id is not None
        primary.complete_update(NS, "w0", pending_update.update_id, {"late": True})
        primary.apply_signal(NS, "w1", pending_signal.command_id)
        for i in range(3):
            late = send("late", "update", f"w{i}", {"n": i})
            assert late.update_id is not None
            primary.complete_update(NS, f"w{i}", late.update_id, None)

        answered_by: dict[str, ReplicaCounts] = {}
        for group, commands in sent.items():
            before = replicated_store.replica_counts()
            assert before is not None
            for index, (kind, workflow, arguments, run_id) in enumerate(commands):
                key = f"{group}-{index}"
                admit = replicated.admit_update if kind == "update" else replicated.admit_signal
                truth_admit = primary.admit_update if kind == "update" else primary.admit_signal
                answer = admit(NS, workflow, "cmd", arguments, request_id=key, run_id=run_id)
                truth = truth_admit(NS, workflow, "cmd", arguments, request_id=key, run_id=run_id)
                assert wire(answer) == wire(truth), (group, key)
                assert answer.retained
            after = replicated_store.replica_counts()
            assert after is not None
            answered_by[group] = ReplicaCounts(
                after.answered - before.answered, after.primary - before.primary, 0
            )
        assert answered_by == {
            "completed": ReplicaCounts(3, 0, 0),
            "applied": ReplicaCounts(3, 0, 0),
            "refused": ReplicaCounts(3, 0, 0),
            "pending": ReplicaCounts(0, 1, 0),  # accepted in the copy: the primary says completed
            "received": ReplicaCounts(0, 1, 0),  # received in the copy: the primary says applied
            "late": ReplicaCounts(0, 3, 0),  # not in the copy at all
        }
        late_answer = replicated.admit_update(NS, "w0", "cmd", {"p": 1}, request_id="pending-0")
        assert late_answer.outcome == "completed" and late_answer.result == {"late": True}
    finally:
        primary.store.dispose()  # type: ignore[attr-defined]
        replicated_store.dispose()

    # The load of N final retries, with and without the replica.
    figures = {}
    for label, read_url in (("primary only", None), ("with replica", standby.url_for(DB))):
        before = database_stats(primary_server), database_stats(standby)
        store = SqlStore.open(primary_server.url_for(DB), read_url=read_url)
        service = AdmissionService(store)
        for i in range(N):
            service.admit_update(NS, f"w{i % 3}", "cmd", {"n": i % 3}, request_id=f"completed-{i % 3}")
        counts = store.replica_counts()
        store.dispose()
        after = database_stats(primary_server), database_stats(standby)
        figures[label] = {
            "primary_xact": after[0][0] - before[0][0],
            "primary_rows": after[0][1] - before[0][1],
            "replica_xact": after[1][0] - before[1][0],
            "replica_rows": after[1][1] - before[1][1],
            "answered_by_replica": 0 if counts is None else counts.answered,
        }
    SUMMARY_LINES.append(f"replica load over {N} final retries: {json.dumps(figures)}")
    cluster.resume_replay("replica")
    alone, shared = figures["primary only"], figures["with replica"]
    assert shared["answered_by_replica"] == N
    # Without the replica every retry is a read on the primary; with it, the primary sees only
    # opening the store (the revision check), and the replica takes the reads.
    assert alone["primary_xact"] >= N and alone["replica_xact"] < N // 10
    assert shared["primary_xact"] < N // 10 and shared["replica_xact"] >= N
