"""PostgreSQL's fresh admission in few round trips (``admission/sql/_fused.py``).

The store's own transaction begins in the lock's pipeline and a fresh
admission's rows go in one statement sent with ``COMMIT``.  These tests hold
it to the rules of any transaction: an error in that statement commits
nothing of it (not the instance row made for it, not the command), the
connection is sound and out of autocommit afterwards however the transaction
ended, and the rows are the ones the statements one by one write.  The round
trips of a fresh admission, a retry and a batch are counted from libpq's trace.
An exchange larger than the socket's send buffer is sent whole and answered,
on the sync and the async store, without either side waiting on the other.
"""

from __future__ import annotations

import asyncio
import os
import re
import socket
import threading
import uuid
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import event, func, select, text

import admission.sql._connections
from admission.aio import AsyncAdmissionService, open_store, run_sync
from admission.errors import RunStateError, StorageError
from admission.intent import receipt_token
from admission.receipts import AdmissionService, BatchCommand, CommandRow, Decision, EventRow, UpdateRow
from admission.sql import SqlStore, create_admission_engine, metadata
from admission.sql._greenlet import wait

NOW = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)


def _counts(store: SqlStore) -> dict[str, int]:
    with store.engine.connect() as conn:
        return {
            t.name: int(conn.execute(select(func.count()).select_from(t)).scalar_one())
            for t in metadata.sorted_tables
            if t.name.startswith("workflow_")
        }


def _rows(iid: str, run_id: str | None, event_type: str) -> tuple[CommandRow, UpdateRow, EventRow]:
    command = CommandRow(
        str(uuid.uuid4()), iid, run_id, 1, "update", "approve", "instance", None, f"tok-{uuid.uuid4()}",
        None, b"\xa0", "received", "accepted", None, NOW, "d" * 64, "a" * 64, "v1",
    )  # fmt: skip
    update = UpdateRow(
        str(uuid.uuid4()), command.id, iid, run_id or "", "approve", "accepted", None, None, NOW, None
    )
    event = EventRow("ns", iid, run_id, event_type, command.id, update.id, b"\xa0", NOW)
    return command, update, event


def _failing_write(store: SqlStore, workflow: str, run_id: str | None) -> None:
    """A fresh admission whose fused statement fails (an event type longer than its column) as the
    last write of the store's own transaction, the one sent with ``COMMIT``."""
    with (
        pytest.raises(StorageError),
        store.locked("ns", workflow, created_at=NOW, new_id=str(uuid.uuid4())) as tx,
    ):
        command, update, event = _rows(tx.instance.id, run_id, "x" * 200)
        tx.insert_admitted(command, update if run_id else None, event, last=True)


def _assert_out_of_autocommit(store: SqlStore) -> None:
    """Every write connection the store keeps, and the pool's, is out of autocommit and idle."""
    for held in store._kept.writers.free:  # type: ignore[attr-defined]
        driver = held.proxy.connection.driver_connection
        assert driver.autocommit is False and driver.info.transaction_status == 0
    with store.engine.connect() as conn:
        assert conn.connection.driver_connection.autocommit is False


@pytest.mark.parametrize("first_time", [True, False], ids=["new-instance", "running-instance"])
def test_an_error_in_the_statement_sent_with_commit_leaves_nothing_of_the_transaction(
    pg_store: SqlStore, first_time: bool
) -> None:
    store = pg_store
    service = AdmissionService(store, clock=lambda: NOW)
    workflow = f"wf-{uuid.uuid4()}"
    run_id = None if first_time else service.start_run("ns", workflow).run_id
    before = _counts(store)
    _failing_write(store, workflow, run_id)
    # Nothing: not the command, its update or its event, nor (first time) the instance row.
    assert _counts(store) == before
    _assert_out_of_autocommit(store)
    # The store goes on: the same instance admits, and the rows are there.
    answer = service.admit_update("ns", workflow, "approve", {"n": 1}, request_id="k-1")
    # A fresh update, or with no run yet a fresh refusal (no update row).
    assert answer.decision is Decision.FRESH and (answer.update_id is not None) == (run_id is not None)
    grown = {k: v - before[k] for k, v in _counts(store).items() if v != before[k]}
    expected = {"workflow_commands": 1, "workflow_history_events": 1}
    if run_id:
        expected["workflow_updates"] = 1
    else:
        expected["workflow_instances"] = 1
    assert grown == expected


async def _async_service(url: str) -> tuple[Any, SqlStore, AsyncAdmissionService]:
    """An async store on ``url``, its sync store (the async engine's), and a service on it."""
    store = await open_store(url)
    sync = store.sync
    assert isinstance(sync, SqlStore) and sync.engine.dialect.is_async
    return store, sync, AsyncAdmissionService(store, clock=lambda: NOW)


def test_the_async_store_rolls_back_the_failed_statement_and_goes_on(pg_url: str) -> None:
    async def main() -> None:
        store, sync, service = await _async_service(pg_url)
        workflow = f"wf-{uuid.uuid4()}"
        run = await service.start_run("ns", workflow)
        before = await run_sync(_counts, sync)
        await run_sync(_failing_write, sync, workflow, run.run_id)
        assert await run_sync(_counts, sync) == before
        answer = await service.admit_update("ns", workflow, "approve", {"n": 1}, request_id="k-1")
        again = await service.admit_update("ns", workflow, "approve", {"n": 1}, request_id="k-1")
        assert (answer.decision, again.decision) == (Decision.FRESH, Decision.RETAINED)
        assert again.update_id == answer.update_id
        await run_sync(_assert_out_of_autocommit, sync)
        await store.dispose()

    asyncio.run(main())


def test_every_ending_of_the_stores_transaction_leaves_the_connection_out_of_autocommit(pg_url: str) -> None:
    # A budget of one: no connection is kept, each transaction goes round the pool's one.
    for connections in (1, 8):
        store = SqlStore.open(pg_url, connections=connections)
        try:
            service = AdmissionService(store)
            workflow = f"wf-{uuid.uuid4()}"
            service.start_run("ns", workflow)  # committed at the block's end
            fresh = service.admit_signal("ns", workflow, "go", [1], request_id="k")  # committed with its rows
            assert service.admit_signal("ns", workflow, "go", [1], request_id="k").retained
            with pytest.raises(RunStateError):  # refused under the lock: rolled back
                service.start_run("ns", workflow)
            batch = service.admit_many([])
            assert fresh.decision is Decision.FRESH and batch == []
            _assert_out_of_autocommit(store)
            # A transaction on the pool's connection is one transaction, not one per statement.
            with store.engine.begin() as conn:
                ids = [conn.execute(text("SELECT txid_current()")).scalar_one() for _ in range(2)]
            assert ids[0] == ids[1]
        finally:
            store.dispose()


def test_a_lost_race_for_the_key_commits_nothing_of_the_command_and_answers_with_the_stored_receipt(
    pg_store: SqlStore,
) -> None:
    store = pg_store
    service = AdmissionService(store, clock=lambda: NOW)
    workflow = f"wf-{uuid.uuid4()}"
    run = service.start_run("ns", workflow)
    first = service.admit_update("ns", workflow, "approve", {"n": 1}, request_id="k-1")
    before = _counts(store)
    with store.locked("ns", workflow, created_at=NOW, new_id="unused") as tx:
        (stored,) = tx.find_commands("update", [receipt_token("update", "k-1"), "k-1"])
        assert stored.id == first.command_id
        command, update, event = _rows(tx.instance.id, run.run_id, "UpdateAccepted")
        taken = replace(command, request_id=stored.request_id, command_sequence=99)
        assert tx.insert_admitted(taken, update, event, last=True) is False
        # Committed (nothing of this admission), then read as the lost race reads it.
        assert [c.id for c in tx.find_commands("update", [stored.request_id or ""])] == [stored.id]
    assert _counts(store) == before
    _assert_out_of_autocommit(store)


def _stored(store: SqlStore, table: str, key: str, value: object, skip: tuple[str, ...]) -> list[object]:
    """A row as the database holds it: each column's type and text, but ``skip``."""
    columns = [c.name for c in metadata.tables[table].c if c.name not in skip]
    selected = ", ".join(f"pg_typeof({c})::text, {c}::text" for c in columns)
    with store.engine.connect() as conn:
        return list(
            conn.execute(text(f"SELECT {selected} FROM {table} WHERE {key} = :v"), {"v": value}).one()
        )


@pytest.mark.parametrize("with_update", [True, False], ids=["update", "signal"])
@pytest.mark.parametrize("nulls", [True, False], ids=["nulls", "values"])
def test_the_fused_statement_stores_the_rows_the_statements_one_by_one_store(
    pg_store: SqlStore, with_update: bool, nulls: bool
) -> None:
    service = AdmissionService(pg_store, clock=lambda: NOW)
    workflow = f"wf-{uuid.uuid4()}"
    run_id = service.start_run("ns", workflow).run_id
    written = []
    for fused, sequence in ((True, 1), (False, 2)):
        with pg_store.locked("ns", workflow, created_at=NOW, new_id="unused") as tx:
            command, update, event = _rows(tx.instance.id, run_id, "UpdateAccepted")
            command = replace(command, command_sequence=sequence)
            if nulls:
                command = replace(command, context=None, intent_digest=None, request_id=None)
                event = replace(event, run_id=None, update_id=None)
            else:
                command = replace(command, requested_run_id=run_id, rejection_reason="r")
                update = replace(update, result=b"\x00\xff", failure="f", completed_at=NOW)
            event = replace(event, command_id=command.id, update_id=update.id if with_update else None)
            kept = update if with_update else None
            if fused:
                assert tx.insert_admitted(command, kept, event, last=True)
            else:
                assert tx.insert_command(command)
                if kept is not None:
                    tx.insert_update(kept)
                tx.append_event(event)
            written.append((command, update))
    (one, _), (two, _) = written
    ids = ("id", "command_sequence", "request_id")
    assert _stored(pg_store, "workflow_commands", "id", one.id, ids) == _stored(
        pg_store, "workflow_commands", "id", two.id, ids
    )
    skip = ("position", "tx_id", "command_id", "update_id")
    events = [_stored(pg_store, "workflow_history_events", "command_id", c.id, skip) for c in (one, two)]
    assert events[0] == events[1]
    with pg_store.engine.connect() as conn:
        linked = conn.execute(
            text("SELECT command_id, update_id FROM workflow_history_events WHERE command_id IN (:a, :b)"),
            {"a": one.id, "b": two.id},
        ).all()
    expected = {(c.id, u.id if with_update else None) for c, u in written}
    assert set(map(tuple, linked)) == expected
    if with_update:
        updates = [
            _stored(pg_store, "workflow_updates", "id", u.id, ("id", "command_id")) for _, u in written
        ]
        assert updates[0] == updates[1]


@pytest.mark.parametrize("level", ["SERIALIZABLE", None])
def test_the_begin_sent_with_the_lock_keeps_the_engines_isolation_level(
    pg_url: str, level: str | None
) -> None:
    options = {} if level is None else {"isolation_level": level}
    store = SqlStore(create_admission_engine(pg_url, **options))
    try:
        with store.locked("ns", f"wf-{uuid.uuid4()}", created_at=NOW, new_id=str(uuid.uuid4())) as tx:
            conn = tx._conn  # type: ignore[attr-defined]
            shown = conn.execute(text("SHOW transaction_isolation")).scalar_one()
        assert shown == ("read committed" if level is None else level.lower())
    finally:
        store.dispose()


def test_round_trips_of_a_fresh_admission_a_retry_and_a_batch(pg_url: str, tmp_path: Any) -> None:
    # Counted from libpq's own trace of every connection the store uses: each Sync (a pipeline's
    # end, or one statement's) and each simple Query waits for the server once.
    store = SqlStore.open(pg_url)
    path = tmp_path / "libpq.trace"
    with path.open("w") as trace:

        @event.listens_for(store.engine, "checkout")
        def traced(dbapi: Any, record: Any, proxy: Any) -> None:
            dbapi.pgconn.trace(trace.fileno())

        def round_trips(action: Any) -> int:
            start = path.stat().st_size
            action()
            sent = path.read_text()[start:]
            return len(re.findall(r"\tF\t\d+\t(?:Sync|Query)\b", sent))

        try:
            service = AdmissionService(store)
            service.start_run("ns", "wf")
            batch = [
                BatchCommand("signal", "ns", f"wf-{n % 4}", "s", [n], request_id=f"b-{n}") for n in range(8)
            ]
            counts = {
                "fresh": round_trips(lambda: service.admit_signal("ns", "wf", "s", [1], request_id="k")),
                "retry": round_trips(lambda: service.admit_signal("ns", "wf", "s", [1], request_id="k")),
                "batch": round_trips(lambda: service.admit_many(batch)),
                "batch again": round_trips(lambda: service.admit_many(batch)),
            }
        finally:
            store.dispose()
    # Fresh: BEGIN with the lock and the key's receipts, the rows with COMMIT.  A retry: the same
    # first round trip, the lock not taken, then a COMMIT of its own (nothing written).  A batch:
    # BEGIN with its locks, its keys' lookup, its rows with COMMIT; all retries: nothing written,
    # so the transaction's end is a COMMIT of its own.
    assert counts == {"fresh": 2, "retry": 2, "batch": 3, "batch again": 3}


def _writer(store: SqlStore) -> Any:
    """The driver connection of the store's one idle kept write connection."""
    (held,) = store._kept.writers.free  # type: ignore[attr-defined]
    return held.connection


def _prepared_by_admission(driver: Any) -> list[tuple[str, datetime]]:
    """The statements ``_wire`` prepared on ``driver``'s session, with when."""
    rows = driver.execute(
        "SELECT name, prepare_time FROM pg_prepared_statements WHERE name LIKE '\\_admission\\_%'"
    ).fetchall()
    driver.commit()
    return [(str(name), when) for name, when in rows]


def test_a_session_that_lost_its_prepared_statements_prepares_them_again_in_the_next_admission(
    pg_store: SqlStore,
) -> None:
    # psycopg runs DEALLOCATE ALL when it rolls back a transaction while it holds
    # statements of its own; admission's statements go with them.
    service = AdmissionService(pg_store)
    run = service.start_run("ns", "wf-lost")
    first = service.admit_signal("ns", "wf-lost", "go", {"n": 1}, request_id="k1")
    driver = _writer(pg_store)
    before = _prepared_by_admission(driver)
    # start_run's lock and lookup; the keyed lock, the key's receipts and the fused write
    assert len(before) == 5
    driver.execute("DEALLOCATE ALL")
    driver.commit()
    again = service.admit_signal("ns", "wf-lost", "go", {"n": 2}, request_id="k2")
    after = _prepared_by_admission(driver)
    assert (first.decision, again.decision) == (Decision.FRESH, Decision.FRESH)
    assert again.command_sequence == first.command_sequence + 1 and again.run_id == run.run_id
    assert len(after) == 4 and not {name for name, _ in after} & {name for name, _ in before}
    assert _counts(pg_store)["workflow_commands"] == 2
    _assert_out_of_autocommit(pg_store)
    # A receipt's read, on a kept read connection in autocommit, is not sent again: a read
    # connection's statements go missing only behind a pooler admission was not told of
    # (tests/integration/test_pgbouncer.py), which the error names.  The next read prepares anew.
    assert service.receipt("ns", "wf-lost", "signal", "k2") is not None
    (reader,) = pg_store._kept.readers.free  # type: ignore[attr-defined]
    reader.connection.execute("DEALLOCATE ALL")
    with pytest.raises(StorageError, match="admission_pooler=transaction"):
        service.receipt("ns", "wf-lost", "signal", "k2")
    retry = service.receipt("ns", "wf-lost", "signal", "k2")
    assert retry is not None and retry.decision is Decision.RETAINED and retry.command_id == again.command_id


def test_a_write_connection_due_to_plan_again_prepares_admissions_statements_anew(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(admission.sql._connections, "REPLAN_AFTER", (4,))
    store = SqlStore.open(pg_url)
    try:
        service = AdmissionService(store)
        service.start_run("ns", "wf-replan")  # the connection's first use
        prepared, names = [], []
        for i in range(2, 7):
            driver = _writer(store)
            (started,) = driver.execute("SELECT clock_timestamp()").fetchone()
            driver.commit()
            answer = service.admit_signal("ns", "wf-replan", "go", {"n": i}, request_id=f"k{i}")
            assert answer.decision is Decision.FRESH
            statements = _prepared_by_admission(driver)
            prepared.append(min(when for _, when in statements) > started)
            names.append(sorted(name for name, _ in statements))
        # Only the fourth use (the third admission) found them all dropped and prepared them again.
        assert prepared == [False, False, True, False, False]
        # Under the names they had: the store knew they were dropped and did not find them missing
        # (start_run's lock, prepared at the first use, is not prepared again by an admission).
        assert set(names[2]) < set(names[1]) and len(names[2]) == 4
    finally:
        store.dispose()


def _drop_prepared_of_async_writer(store: SqlStore) -> int:
    """``DEALLOCATE ALL`` on the async store's idle write connection; how many of admission's
    statements it held."""
    (held,) = store._kept.writers.free  # type: ignore[attr-defined]
    driver = held.proxy.connection.driver_connection
    cursor = wait(
        driver.execute("SELECT count(*) FROM pg_prepared_statements WHERE name LIKE '\\_admission\\_%'")
    )
    ((count,),) = wait(cursor.fetchall())
    wait(driver.execute("DEALLOCATE ALL"))
    wait(driver.commit())
    return int(count)


def test_the_async_store_prepares_its_statements_again_after_a_session_lost_them(pg_url: str) -> None:
    async def main() -> None:
        store, sync, service = await _async_service(pg_url)
        await service.start_run("ns", "wf-async-lost")
        first = await service.admit_signal("ns", "wf-async-lost", "go", {"n": 1}, request_id="k1")
        assert await run_sync(_drop_prepared_of_async_writer, sync) >= 3
        again = await service.admit_signal("ns", "wf-async-lost", "go", {"n": 2}, request_id="k2")
        assert (first.decision, again.decision) == (Decision.FRESH, Decision.FRESH)
        assert again.command_sequence == first.command_sequence + 1
        assert (await run_sync(_counts, sync))["workflow_commands"] == 2
        await run_sync(_assert_out_of_autocommit, sync)
        await store.dispose()

    asyncio.run(main())


def test_plans_made_again_twice_while_psycopg_prepares_only_between_keep_admitting(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The first DEALLOCATE ALL comes while psycopg holds no statement of its own (single
    # admissions go through _wire), the second after batches made it prepare some: psycopg
    # must forget those too, or its next batch names a statement the session no longer has.
    monkeypatch.setattr(admission.sql._connections, "REPLAN_AFTER", (3, 14))
    store = SqlStore.open(pg_url)
    try:
        service = AdmissionService(store)
        service.start_run("ns", "wf-twice")
        for i in range(2, 4):
            assert (
                service.admit_signal("ns", "wf-twice", "go", {}, request_id=f"s{i}").decision
                is Decision.FRESH
            )
        for i in range(4, 17):  # the fourteenth use is a batch's, after psycopg prepared its statements
            batch = [
                BatchCommand("signal", "ns", "wf-twice", "go", {}, request_id=f"b{i}-{j}") for j in range(2)
            ]
            assert [a.decision for a in service.admit_many(batch)] == [Decision.FRESH] * 2
        assert _counts(store)["workflow_commands"] == 2 + 13 * 2
    finally:
        store.dispose()


BIG = 512 * 1024
"""Bytes of each argument of the large batch below: 32 of them are more than twice a socket's
send buffer on loopback."""


def _big_batch(workflow: str) -> list[BatchCommand]:
    """32 signals to ``workflow``, each with an argument of :data:`BIG` bytes."""
    return [
        BatchCommand("signal", "ns", workflow, "s", [n, "x" * BIG], request_id=f"big-{n}") for n in range(32)
    ]


def _send_buffer(store: SqlStore) -> int:
    """The send buffer of a connection of ``store`` to its server, in bytes."""
    proxy = store.engine.raw_connection()
    try:
        with socket.socket(fileno=os.dup(proxy.dbapi_connection.pgconn.socket)) as sock:  # type: ignore[union-attr]
            return int(sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF))
    finally:
        proxy.close()


def _within(seconds: float, action: Callable[[], Any]) -> Any:
    """``action()`` in a thread of its own, which must end within ``seconds``: an exchange that
    deadlocks (each side waiting for the other to read) fails the test instead of hanging it."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = action()
        except BaseException as exc:  # raised again below, in the test's thread
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"no answer after {seconds} s: the exchange deadlocked"
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def test_an_exchange_larger_than_the_socket_takes_at_once_is_sent_whole_and_answered(pg_url: str) -> None:
    # An exchange goes out in one flush when it fits the socket's buffer; a larger one is sent as
    # the socket drains, the server's results read meanwhile (admission/sql/_wire.py).
    store = SqlStore.open(pg_url)
    try:
        service = AdmissionService(store)
        workflow = f"wf-{uuid.uuid4()}"
        service.start_run("ns", workflow)
        batch = _big_batch(workflow)
        answers = _within(120, lambda: service.admit_many(batch))
        assert 2 * _send_buffer(store) < 32 * BIG
        assert [getattr(a, "decision", a) for a in answers] == [Decision.FRESH] * 32
        again = service.admit_many(batch)
        assert [getattr(a, "decision", a) for a in again] == [Decision.RETAINED] * 32
        assert [a.command_id for a in again] == [a.command_id for a in answers]  # type: ignore[union-attr]
        stored = store.read_history(store.find_instance("ns", workflow).id)  # type: ignore[union-attr]
        assert len([e for e in stored if e.event_type == "SignalReceived"]) == 32
    finally:
        store.dispose()


def test_the_async_store_sends_an_exchange_larger_than_the_socket_takes_at_once(pg_url: str) -> None:
    async def main() -> None:
        store, _sync, service = await _async_service(pg_url)
        workflow = f"wf-{uuid.uuid4()}"
        await service.start_run("ns", workflow)
        batch = _big_batch(workflow)
        try:
            answers = await asyncio.wait_for(service.admit_many(batch), 120)
            assert [getattr(a, "decision", a) for a in answers] == [Decision.FRESH] * 32
            again = await service.admit_many(batch)
            assert [getattr(a, "decision", a) for a in again] == [Decision.RETAINED] * 32
        finally:
            await store.dispose()

    asyncio.run(main())
