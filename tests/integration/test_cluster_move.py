"""The event log across a move to another PostgreSQL cluster (docs/event-log.md, "Moving to another cluster").

Every event stores ``txid_current()`` of the cluster that wrote it.  A dump and
restore (or a logical-replication copy) lands on a cluster whose counter is
lower: a reader's cursor is then ahead of every id the new cluster hands out,
and the events written there sort behind it.  These tests move a real
database with ``pg_dump | psql`` (and another by logical replication) to a
fresh server, show what the unguarded query would have returned (nothing:
the new events skipped for good), that
every reader now fails with ``EventLogMovedError`` instead, and that after
``admission db rebase-events`` each reader resumes with every event it had
not read, exactly once, and none it had.
"""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine, func, insert, literal, select, text, tuple_

from admission import EventLogMovedError, StateError, StorageError
from admission.cli import main
from admission.receipts import AdmissionService, EventCursor
from admission.sql import (
    SqlStore,
    SqlWorkerStore,
    create_admission_engine,
    outbox_cursors,
    rebase_event_log,
    upgrade,
    workflow_history_events,
    workflow_instances,
)
from admission.worker import DurableWorker, OutboxRelay, Scope, record_outbox
from tests.integration.test_cli_failures import as_argv, hint_in
from tests.support.backends import SQL_BACKENDS, PostgresPool, sqlite_url
from tests.support.pgserver import PostgresServer
from tests.support.processes import WAIT

ROOT = Path(__file__).resolve().parents[2]
SCOPE = {"tenant": "t1", "account": "a1"}
events = workflow_history_events
NOW = datetime(2026, 1, 1, tzinfo=UTC)

# Hands out ``count`` transaction ids in one statement: each subtransaction
# that writes gets an id of its own (about 40 000 a second; a loop of
# autocommit ``SELECT txid_current()`` manages about 1 000 on the same machine).
BURN_IDS = """DO $$ BEGIN
  CREATE TEMP TABLE burn (i int);
  FOR i IN 1..{count} LOOP
    BEGIN INSERT INTO burn VALUES (i); RAISE EXCEPTION 'burn'; EXCEPTION WHEN raise_exception THEN NULL; END;
  END LOOP;
  DROP TABLE burn;
END $$"""


def _need_postgresql() -> None:
    if "postgresql" not in SQL_BACKENDS:
        pytest.skip("ADMISSION_TEST_BACKEND excludes PostgreSQL")


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "admission", *args], capture_output=True, text=True, cwd=ROOT, timeout=120
    )


def next_tx_id(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text("SELECT txid_snapshot_xmax(txid_current_snapshot())")).scalar_one())


def unguarded(engine: Engine, after: EventCursor) -> list[int]:
    """The read as it was before the guard: positions after ``after`` in cursor order."""
    query = (
        select(events.c.position)
        .where(
            tuple_(events.c.tx_id, events.c.position) > tuple_(literal(after.tx_id), literal(after.position)),
            events.c.tx_id < func.txid_snapshot_xmin(func.txid_current_snapshot()),
        )
        .order_by(events.c.tx_id, events.c.position)
    )
    with engine.connect() as conn:
        return list(conn.execute(query).scalars())


def outbox(store: SqlStore, source_key: str, connection: object | None = None) -> int:
    """Append one outbox entry (committed unless ``connection`` is the caller's); its position."""
    if connection is not None:
        return record_outbox(
            store, connection, "ns", "wf", target="crm", source_key=source_key, content=SCOPE
        ).position
    with store.begin() as conn:
        return record_outbox(
            store, conn, "ns", "wf", target="crm", source_key=source_key, content=SCOPE
        ).position


def relay_for(store: SqlStore) -> OutboxRelay:
    worker = DurableWorker(SqlWorkerStore(store.engine), Scope.parse(SCOPE), file_lock=False)
    return OutboxRelay(store, worker, target="crm", consumer="crm-relay")


def accepted_keys(store: SqlStore) -> list[str]:
    return sorted(r.source_key for r in SqlWorkerStore(store.engine).records("default"))


# -- the guard, on the session's server: fast ----------------------------------------------------


@pytest.fixture
def pg_url(postgres_pool: PostgresPool) -> str:
    _need_postgresql()
    return postgres_pool.fresh_database()


def test_a_cursor_at_or_past_the_servers_next_transaction_id_raises_and_reads_nothing(pg_url: str) -> None:
    store = SqlStore.open(pg_url)
    service = AdmissionService(store)
    for i in range(3):
        service.admit_signal("ns", "wf", "s", [], request_id=f"r{i}")
    read = store.read_events(EventCursor(), 10)
    assert len(read) == 3
    # The newest cursor this cluster can produce still reads (nothing after it).
    assert store.read_events(EventCursor(read[-1].tx_id, read[-1].position), 10) == []
    ahead = next_tx_id(store.engine) + 1_000_000
    with pytest.raises(EventLogMovedError) as info:
        store.read_events(EventCursor(ahead, 1), 10)
    error = info.value
    assert (error.code, error.cursor, error.consumer) == ("event_log_moved", (ahead, 1), None)
    assert read[-1].tx_id < error.next_tx_id <= ahead
    assert "admission db rebase-events" in str(error) and "postgresql" not in str(error)
    copy = pickle.loads(pickle.dumps(error))
    assert (type(copy), copy.cursor, copy.next_tx_id, str(copy)) == (
        EventLogMovedError,
        error.cursor,
        error.next_tx_id,
        str(error),
    )
    store.dispose()


def test_a_log_holding_ids_the_server_has_not_handed_out_raises_instead_of_stalling(pg_url: str) -> None:
    # The other half of a move: events whose ids are ahead of the counter would
    # wait behind txid_snapshot_xmin until the counter caught up.
    store = SqlStore.open(pg_url)
    AdmissionService(store).admit_signal("ns", "wf", "s", [], request_id="r")
    ahead = next_tx_id(store.engine) + 1_000_000
    with store.engine.begin() as conn:
        conn.execute(events.update().values(tx_id=ahead))
    assert unguarded(store.engine, EventCursor()) == []  # what a reader used to get: nothing, forever
    with pytest.raises(EventLogMovedError, match=f"holds transaction id {ahead}"):
        store.read_events(EventCursor(), 10)
    store.dispose()


def test_the_relay_names_its_consumer_and_moves_nothing_when_the_log_moved(pg_url: str) -> None:
    store = SqlStore.open(pg_url)
    relay = relay_for(store)
    outbox(store, "k1")
    assert relay.pump().accepted == 1
    before = relay.cursor()
    with store.engine.begin() as conn:  # the cursor as a move leaves it: from a counter far ahead
        conn.execute(outbox_cursors.update().values(tx_id=next_tx_id(store.engine) + 1_000_000))
    outbox(store, "k2")
    moved = relay.cursor()
    with pytest.raises(EventLogMovedError) as info:
        relay.pump()
    assert info.value.consumer == "crm-relay" and "relay 'crm-relay'" in str(info.value)
    assert info.value.cursor == (moved.tx_id, moved.position) != (before.tx_id, before.position)
    assert relay.cursor() == moved and accepted_keys(store) == ["k1"]
    store.dispose()


def with_password(url: str) -> str:
    """``url`` with a password the trust-authenticated test server ignores: it must never be printed."""
    return url.replace("postgres@", "postgres:s3cret-pw@", 1)


def test_rebase_refuses_a_log_that_needs_none(pg_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    store = SqlStore.open(pg_url)
    AdmissionService(store).admit_signal("ns", "wf", "s", [], request_id="r")
    before = store.read_events(EventCursor(), 10)
    report = rebase_event_log(store.engine, [EventCursor(before[0].tx_id, before[0].position)])
    assert not report.needed and report.events == 0 and report.sequences == ()
    assert store.read_events(EventCursor(), 10) == before
    assert main(["db", "rebase-events", "--db", with_password(pg_url)]) == 4
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("admission: the event log needs no rebase") and err.count("\n") == 1
    assert "s3cret" not in err
    with pytest.raises(SystemExit) as refused:  # argparse's refusal: one line, exit 2
        main(["db", "rebase-events", "--db", pg_url, "--cursor", "12:x"])
    assert refused.value.code == 2
    assert "--cursor" in capsys.readouterr().err
    store.dispose()


def test_rebase_refuses_a_relay_that_read_events_written_after_the_move(
    pg_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    store = SqlStore.open(pg_url)
    relay = relay_for(store)
    outbox(store, "moved")
    ahead = next_tx_id(store.engine) + 1_000_000
    with store.engine.begin() as conn:  # the moved log, from a counter far ahead
        conn.execute(events.update().values(tx_id=ahead))
    here = outbox(store, "here")
    with store.engine.begin() as conn:  # a relay that started over on the new cluster and read it
        conn.execute(
            insert(outbox_cursors).values(consumer="crm-relay", tx_id=0, position=here, updated_at=NOW)
        )
    before = unguarded(store.engine, EventCursor()), relay.cursor()
    with pytest.raises(StateError, match="consumer crm-relay has read events written on this cluster"):
        rebase_event_log(store.engine)
    assert main(["db", "rebase-events", "--db", pg_url]) == 4
    assert "delete its cursor" in capsys.readouterr().err
    assert (unguarded(store.engine, EventCursor()), relay.cursor()) == before  # nothing changed
    store.dispose()


@pytest.mark.skipif("sqlite" not in SQL_BACKENDS, reason="ADMISSION_TEST_BACKEND excludes SQLite")
def test_sqlite_has_no_transaction_ids_and_nothing_to_rebase(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = sqlite_url(tmp_path)
    store = SqlStore.open(url)
    AdmissionService(store).admit_signal("ns", "wf", "s", [], request_id="r")
    # Any cursor reads by position alone: a copied file keeps its positions.
    assert [e.position for e in store.read_events(EventCursor(10**12, 0), 10)] == [1]
    assert not rebase_event_log(store.engine).needed
    store.dispose()
    assert main(["db", "rebase-events", "--db", url]) == 4
    out, err = capsys.readouterr()
    assert out == "" and "needs no rebase" in err
    # A database not at the head is refused before anything is read (exit 3).
    assert main(["db", "rebase-events", "--db", sqlite_url(tmp_path, migrated=False)]) == 3


# -- the property: after a rebase every known cursor reads exactly what it had not read ------------


@pytest.fixture(scope="module")
def forged_log(postgres_pool: PostgresPool) -> Iterator[SqlStore]:
    """One database whose log the property refills with ids ahead of the server, as a move leaves it."""
    _need_postgresql()
    store = SqlStore.open(postgres_pool.fresh_database())
    AdmissionService(store).admit_signal("ns", "wf", "s", [], request_id="instance")
    yield store
    store.dispose()


# An old log: per event, the gap to the previous transaction id (0: the same
# transaction) and a shuffle of positions, so that (tx_id, position) order and
# position order disagree as concurrent writers make them.
old_logs = st.lists(st.tuples(st.integers(0, 3), st.integers(0, 10**6)), min_size=1, max_size=12)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(log=old_logs, picks=st.lists(st.integers(0, 12), max_size=4), written_here=st.integers(0, 3))
def test_after_a_rebase_every_cursor_reads_exactly_the_events_after_it(
    forged_log: SqlStore, log: list[tuple[int, int]], picks: list[int], written_here: int
) -> None:
    store = forged_log
    with store.engine.begin() as conn:
        conn.execute(outbox_cursors.delete())
        conn.execute(events.delete())
        instance = conn.execute(select(workflow_instances.c.id)).scalar_one()
        base = int(conn.execute(text("SELECT txid_snapshot_xmax(txid_current_snapshot())")).scalar_one())
        tx, rows = base + 10**9, []
        order = sorted(range(len(log)), key=lambda i: log[i][1])  # positions, shuffled against tx order
        for i, (gap, _) in enumerate(log):
            tx += gap
            rows.append({"tx_id": tx, "position": order.index(i) + 1})
        conn.execute(
            insert(events),
            [
                {
                    **row,
                    "namespace": "ns",
                    "instance_id": instance,
                    "run_id": None,
                    "event_type": "old",
                    "command_id": None,
                    "update_id": None,
                    "payload": b"",
                    "recorded_at": NOW,
                }
                for row in rows
            ],
        )
        conn.execute(
            text("SELECT setval(pg_get_serial_sequence('workflow_history_events', 'position'), :n)"),
            {"n": len(rows)},
        )
    old = sorted((r["tx_id"], r["position"]) for r in rows)
    # Cursors where readers stopped: after an event, or before the first.
    cursors = sorted({EventCursor(*old[p - 1]) if p else EventCursor(0, 0) for p in picks if p <= len(old)})
    relays = {f"relay-{i}": c for i, c in enumerate(cursors)}
    with store.engine.begin() as conn:
        for name, c in relays.items():
            conn.execute(
                insert(outbox_cursors).values(
                    consumer=name, tx_id=c.tx_id, position=c.position, updated_at=NOW
                )
            )
    here = [outbox(store, f"here-{i}") for i in range(written_here)]  # after the move, before the rebase
    report = rebase_event_log(store.engine, [EventCursor(0, 0)])
    later = outbox(store, "later")
    assert {name: before for name, before, _ in report.consumers} == relays
    for name, before, after in report.consumers:
        unread = [key[1] for key in old if key > (before.tx_id, before.position)]
        got = [e.position for e in store.read_events(after, 1000)]
        assert sorted(got) == sorted(unread + here + [later]), name
        assert got[-1 - len(here) :] == [*here, later]  # written here: after every moved event, in order
    (start,) = report.cursors
    assert [e.position for e in store.read_events(start[1], 1000)][-1] == later
    assert len(store.read_events(start[1], 1000)) == len(old) + len(here) + 1
    assert not rebase_event_log(store.engine).needed  # idempotent: nothing left to do


# -- a real move: pg_dump | psql to a fresh server ---------------------------------------------------


def move(source: PostgresServer, target: PostgresServer, dbname: str, dump: Path) -> str:
    """Dump ``dbname`` from ``source`` and restore it into a new database on ``target``; its URL."""
    client = {"host": source.host, "user": source.superuser}
    subprocess.run(
        [str(source.bindir / "pg_dump"), "-h", client["host"], "-p", str(source.port), "-U", client["user"],
         "-d", dbname, "-f", str(dump)],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    url = target.create_database(dbname)
    subprocess.run(
        [str(target.bindir / "psql"), "-h", client["host"], "-p", str(target.port), "-U", client["user"],
         "-d", dbname, "-v", "ON_ERROR_STOP=1", "-q", "-f", str(dump)],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    return url


@pytest.mark.extra  # two servers of its own, a dump and a restore: about 20 s
def test_a_dump_and_restore_to_a_fresh_cluster_is_detected_and_rebased_exactly(tmp_path: Path) -> None:
    _need_postgresql()
    with PostgresServer() as old_server, PostgresServer() as new_server:
        old_url = old_server.create_database("app")
        upgrade(engine := create_admission_engine(old_url))
        engine.dispose()
        store = SqlStore.open(old_url)
        with store.engine.connect() as conn:  # the old cluster has lived longer than the new one
            conn.execute(text(BURN_IDS.format(count=5000)))
            conn.commit()
        relay = relay_for(store)
        outbox(store, "e1")
        outbox(store, "e2")
        # Two writers that commit out of order: A takes its id first, B appends
        # and commits, then A appends (a higher position) and commits.
        with store.begin() as a:
            a.execute(text("SELECT txid_current()"))
            b_position = outbox(store, "b")
            a_position = outbox(store, "a", a)
        assert a_position > b_position
        assert relay.pump(limit=3).accepted == 3  # e1, e2 and A: A's id is lower than B's
        cursor = relay.cursor()
        assert cursor.position == a_position
        first = store.read_events(EventCursor(), 1)[0]  # a reader of its own, after e1
        mine = EventCursor(first.tx_id, first.position)
        store.dispose()

        new_url = move(old_server, new_server, "app", tmp_path / "app.sql")
        store = SqlStore.open(new_url)
        relay = relay_for(store)
        assert relay.cursor() == cursor and next_tx_id(store.engine) <= cursor.tx_id
        with pytest.raises(EventLogMovedError) as info:
            relay.pump()
        assert info.value.consumer == "crm-relay" and info.value.cursor == (cursor.tx_id, cursor.position)
        with pytest.raises(EventLogMovedError):
            store.read_events(mine, 10)

        # Written on the new cluster before anyone noticed: the unguarded read
        # after the relay's cursor never returns them, and never would.
        n1, n2 = outbox(store, "n1"), outbox(store, "n2")
        assert unguarded(store.engine, cursor) == [] and unguarded(store.engine, mine) == []
        # A logical-replication copy starts its sequences over: the rebase moves them up.
        with store.engine.begin() as conn:
            conn.execute(
                text("SELECT setval(pg_get_serial_sequence('workflow_history_events', 'position'), 1)")
            )

        # The command the error names, as it names it, with the reader's own cursor too.
        hinted = as_argv(hint_in(str(info.value)), with_password(new_url))
        result = cli(*hinted, "--cursor", f"{mine.tx_id}:{mine.position}")
        assert result.returncode == 0, result.stderr
        assert "s3cret" not in result.stdout + result.stderr
        report = json.loads(result.stdout)
        assert report["rebased"] and report["events"] == 4  # the moved ones; n1 and n2 keep their ids
        ((relay_report),) = report["consumers"]
        assert relay_report["before"] == {"tx_id": cursor.tx_id, "position": cursor.position}
        assert any(s.endswith("workflow_history_events_position_seq") for s in report["sequences"])
        ((mine_report),) = report["cursors"]
        moved_mine = EventCursor(mine_report["after"]["tx_id"], mine_report["after"]["position"])

        # The relay reads B (which it had not read) and the new events, once each.
        n3 = outbox(store, "n3")
        pumped = relay.pump()
        assert (pumped.read, pumped.accepted, pumped.duplicates) == (4, 4, 0)
        assert relay.pump().read == 0
        assert accepted_keys(store) == ["a", "b", "e1", "e2", "n1", "n2", "n3"]
        # The reader of its own resumes after e1: e2, A, B, then what was written here.
        got = [e.position for e in store.read_events(moved_mine, 100)]
        assert got[:1] == [first.position + 1] and sorted(got[1:3]) == sorted([a_position, b_position])
        assert got[3:] == [n1, n2, n3] and n3 > max(n1, n2, a_position)

        again = cli("db", "rebase-events", "--db", new_url)
        assert again.returncode == 4 and "needs no rebase" in again.stderr
        store.dispose()


def psql(server: PostgresServer, dbname: str, *args: str) -> str:
    done = subprocess.run(
        [str(server.bindir / "psql"), "-h", server.host, "-p", str(server.port), "-U", server.superuser,
         "-d", dbname, "-v", "ON_ERROR_STOP=1", "-q", "-At", *args],
        check=True, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    return done.stdout.strip()


def caught_up(old_server: PostgresServer, new_server: PostgresServer, dbname: str) -> bool:
    """Whether every table of the subscription is synchronised and its rows are all on the new side."""
    states = psql(
        new_server, dbname, "-c", "SELECT count(*) FILTER (WHERE srsubstate <> 'r') FROM pg_subscription_rel"
    )
    counts = "SELECT (SELECT count(*) FROM workflow_history_events), (SELECT count(*) FROM outbox_cursors)"
    return states == "0" and psql(old_server, dbname, "-c", counts) == psql(new_server, dbname, "-c", counts)


@pytest.mark.extra  # two servers of its own and a subscription: about 20 s
def test_a_logical_replication_move_is_detected_and_rebased_with_its_sequences(tmp_path: Path) -> None:
    _need_postgresql()
    with PostgresServer(settings={"wal_level": "logical"}) as old_server, PostgresServer() as new_server:
        old_url = old_server.create_database("app")
        upgrade(engine := create_admission_engine(old_url))
        engine.dispose()
        store = SqlStore.open(old_url)
        with store.engine.connect() as conn:
            conn.execute(text(BURN_IDS.format(count=5000)))
            conn.commit()
        relay = relay_for(store)
        for key in ("e1", "e2", "e3"):
            outbox(store, key)
        assert relay.pump(limit=2).accepted == 2
        cursor = relay.cursor()

        # The schema first, then every table by a subscription, as logical replication is set up.
        dump = tmp_path / "schema.sql"
        subprocess.run(
            [str(old_server.bindir / "pg_dump"), "-h", old_server.host, "-p", str(old_server.port),
             "-U", old_server.superuser, "-d", "app", "--schema-only", "-f", str(dump)],
            check=True, capture_output=True, timeout=120,
        )  # fmt: skip
        new_url = new_server.create_database("app")
        psql(new_server, "app", "-f", str(dump))
        psql(old_server, "app", "-c", "CREATE PUBLICATION admission FOR ALL TABLES")
        source = f"host={old_server.host} port={old_server.port} user={old_server.superuser} dbname=app"
        psql(
            new_server,
            "app",
            "-c",
            f"CREATE SUBSCRIPTION admission CONNECTION '{source}' PUBLICATION admission",
        )
        outbox(store, "e4")  # streamed after the initial copy
        # The cut-over: writers and readers stopped, the subscription caught up, then dropped.
        store.dispose()
        deadline = time.monotonic() + WAIT
        while not caught_up(old_server, new_server, "app"):
            assert time.monotonic() < deadline, "the subscription never caught up"
            time.sleep(0.2)
        psql(new_server, "app", "-c", "DROP SUBSCRIPTION admission")

        store = SqlStore.open(new_url)
        relay = relay_for(store)
        assert relay.cursor() == cursor and next_tx_id(store.engine) <= cursor.tx_id
        with pytest.raises(EventLogMovedError, match="relay 'crm-relay'"):
            relay.pump()
        # The sequences did not come along: a write fails loudly on a position already taken.
        with pytest.raises(StorageError):
            outbox(store, "too-early")

        result = cli("db", "rebase-events", "--db", new_url)
        assert result.returncode == 0, result.stderr
        report = json.loads(result.stdout)
        assert report["events"] == 4
        moved = {name.rsplit(".", 1)[-1] for name in report["sequences"]}
        assert {"workflow_history_events_position_seq", "worker_records_id_seq"} <= moved

        later = outbox(store, "n1")
        assert later == 5  # the next position after every moved one, never one given before
        pumped = relay.pump()
        assert (pumped.read, pumped.accepted, pumped.duplicates) == (3, 3, 0)  # e3, e4, n1
        assert accepted_keys(store) == ["e1", "e2", "e3", "e4", "n1"]
        assert cli("db", "rebase-events", "--db", new_url).returncode == 4
        store.dispose()
