"""The hot path's driver-level statements: stored exactly as Core stores, read back the same.

``admission.sql`` runs its hot statements on the DBAPI cursor (``RawStatement``) and
answers retries from kept autocommit connections (``Kept.read``).  These
tests hold them to what SQLAlchemy Core would do: every column written raw is
stored byte for byte like the same value written through Core, rows read raw
convert to the same values, and the read connections survive a fork, a
broken connection and threads.
"""

from __future__ import annotations

import itertools
import os
import threading
import uuid
from dataclasses import fields, replace
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import func, insert, literal, select, text

import admission.sql
import admission.sql._connections
from admission.errors import StorageError
from admission.intent import receipt_token
from admission.receipts import Admission, AdmissionService, CommandRow, Decision, EventRow, UpdateRow
from admission.sql import SqlStore, workflow_commands, workflow_history_events, workflow_updates

ARGS = {"order_id": "o-1", "amount": 3}
ZONES = [UTC, timezone(timedelta(hours=5, minutes=30)), timezone(-timedelta(hours=8))]
_TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=8)
_MAYBE_TEXT = st.none() | _TEXT
_MAYBE_BYTES = st.none() | st.binary(max_size=40)
_WHEN = st.datetimes(
    min_value=datetime(1971, 1, 1), max_value=datetime(2200, 1, 1), timezones=st.sampled_from(ZONES)
)


def _stored_form(store: SqlStore, table: str, columns: list[str], key: str, value: object) -> list[object]:
    """How the database holds each column of a row: type and literal (SQLite) or text (PostgreSQL)."""
    if store.postgres:
        selected = ", ".join(f"pg_typeof({c})::text, {c}::text" for c in columns)
    else:
        selected = ", ".join(f"typeof({c}), quote({c})" for c in columns)
    with store.engine.connect() as conn:
        row = conn.execute(text(f"SELECT {selected} FROM {table} WHERE {key} = :v"), {"v": value}).one()
    return list(row)


def _new_instance(store: SqlStore) -> tuple[AdmissionService, str, str]:
    service = AdmissionService(store)
    workflow = f"wf-{uuid.uuid4()}"
    run = service.start_run("raw", workflow)
    return service, workflow, run.run_id


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    when=_WHEN,
    run=st.booleans(),
    texts=st.lists(_TEXT, min_size=5, max_size=5),
    optional=st.lists(_MAYBE_TEXT, min_size=5, max_size=5),
    blobs=st.lists(_MAYBE_BYTES, min_size=3, max_size=3),
)
def test_rows_written_on_the_driver_are_stored_exactly_as_core_stores_them(
    db_url: str,
    when: datetime,
    run: bool,
    texts: list[str],
    optional: list[str | None],
    blobs: list[bytes | None],
) -> None:
    store = SqlStore.open(db_url)
    try:
        _, workflow, run_id = _new_instance(store)
        with store.locked("raw", workflow, created_at=when, new_id="unused") as tx:
            iid = tx.instance.id
            base = CommandRow(
                id="",
                instance_id=iid,
                run_id=run_id if run else None,
                command_sequence=0,
                command_type=texts[0],
                name=texts[1],
                target_scope=texts[2],
                requested_run_id=optional[0],
                request_id=None,
                context=blobs[0],
                arguments=blobs[1],
                status=texts[3],
                outcome=texts[4],
                rejection_reason=optional[1],
                created_at=when,
                intent_digest=optional[2],
                arguments_digest=optional[3],
                intent_encoding=optional[4],
            )
            raw = replace(base, id=str(uuid.uuid4()), command_sequence=1001, request_id=f"raw-{uuid.uuid4()}")
            core = replace(
                base, id=str(uuid.uuid4()), command_sequence=1002, request_id=f"core-{uuid.uuid4()}"
            )
            assert tx.insert_command(raw)  # the driver-level ON CONFLICT insert
            conn = tx._conn  # type: ignore[attr-defined]
            conn.execute(insert(workflow_commands), vars(core))
            event = EventRow("raw", iid, raw.run_id, texts[0], raw.id, optional[0], blobs[2] or b"", when)
            written = tx.append_event(event)  # the driver-level insert
            tx_id = func.txid_current() if store.postgres else literal(0)
            core_event = {k: v for k, v in vars(event).items() if k not in ("position", "tx_id")}
            position = conn.execute(
                insert(workflow_history_events)
                .values(tx_id=tx_id)
                .returning(workflow_history_events.c.position),
                {**core_event, "command_id": core.id},
            ).scalar_one()
        same = [c.name for c in workflow_commands.c if c.name not in ("id", "command_sequence", "request_id")]
        assert _stored_form(store, "workflow_commands", same, "id", raw.id) == _stored_form(
            store, "workflow_commands", same, "id", core.id
        )
        event_columns = [
            c.name for c in workflow_history_events.c if c.name not in ("position", "command_id")
        ]
        assert _stored_form(
            store, "workflow_history_events", event_columns, "position", written.position
        ) == (_stored_form(store, "workflow_history_events", event_columns, "position", position))
        # The event's tx_id is the transaction's (docs/event-log.md), as Core's insert records it.
        with store.engine.connect() as conn:
            stored = conn.execute(
                text("SELECT tx_id FROM workflow_history_events WHERE position IN (:a, :b)"),
                {"a": written.position, "b": position},
            ).scalars()
            assert list(stored) == [written.tx_id] * 2
    finally:
        store.dispose()


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    microsecond=st.integers(0, 999_999),
    seconds=st.integers(0, 10**9),
    key=st.text(
        st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), min_size=1, max_size=20
    ).filter(lambda k: not k.startswith("workflow-signal:")),
    kind=st.sampled_from(["signal", "update"]),
)
def test_receipts_read_on_the_driver_equal_what_core_reads(
    db_url: str, microsecond: int, seconds: int, key: str, kind: str
) -> None:
    now = datetime(2001, 1, 1, tzinfo=UTC) + timedelta(seconds=seconds, microseconds=microsecond)
    store = SqlStore.open(db_url)
    try:
        service, workflow, _ = _new_instance(store)
        service = AdmissionService(store, clock=lambda: now)
        admit = service.admit_signal if kind == "signal" else service.admit_update
        first = admit("raw", workflow, "n", ARGS, request_id=key)
        assert first.decision is Decision.FRESH
        token = receipt_token(kind, key)
        ((unlocked, update),) = store.read_receipts("raw", workflow, kind, [token, key])
        with store.engine.connect() as conn:
            core = dict(
                conn.execute(select(workflow_commands).where(workflow_commands.c.id == unlocked.id))
                .mappings()
                .one()
            )
        for blob in ("context", "arguments"):
            core[blob] = None if core[blob] is None else bytes(core[blob])
        core["created_at"] = admission.sql.as_utc(core["created_at"])
        assert unlocked == CommandRow(**core)  # the read of a retry, on the driver
        with store.locked("raw", workflow, created_at=now, new_id="unused") as tx:
            (locked,) = tx.find_commands(kind, [token, key])
            assert vars(locked) == vars(unlocked)  # and the lock's own read
            assert update == (tx.update_for_command(locked.id) if kind == "update" else None)
        assert unlocked.created_at == now and unlocked.created_at.tzinfo is UTC
        again = admit("raw", workflow, "n", ARGS, request_id=key)
        assert again.decision is Decision.RETAINED
        assert again.received_at == first.received_at == now
        assert again.command_id == first.command_id
        # Answers are built without Admission.__init__: every field is there,
        # and the value equals the one __init__ builds.
        for answer in (first, again):
            assert set(vars(answer)) == {f.name for f in fields(Admission)}
            assert Admission(**vars(answer)) == answer
    finally:
        store.dispose()


def _reader_backend_pid(store: SqlStore) -> Any:
    def backend(_connection: Any, cursor: Any) -> Any:
        cursor.execute("SELECT pg_backend_pid()" if store.postgres else "SELECT 1")
        return cursor.fetchall()[0][0]

    return store._kept.read(store.engine, backend)  # type: ignore[attr-defined]


def _kept_reader(store: SqlStore) -> Any:
    """The driver connection of the store's one idle kept reader."""
    (held,) = store._kept.readers.free  # type: ignore[attr-defined]
    return held.connection


def _next_read_connection(store: SqlStore) -> Any:
    """The driver connection the store's next receipt read takes: on SQLite its idle writer, if
    any (it keeps its page cache across its own commits), else its one idle kept reader."""
    writers = store._kept.writers.free  # type: ignore[attr-defined]
    if not store.postgres and writers:
        return writers[-1].connection
    return _kept_reader(store)


def test_a_read_connection_the_server_ended_is_replaced_before_use_and_a_broken_one_fails_one_read(
    db_url: str,
) -> None:
    store = SqlStore.open(db_url)
    try:
        service, workflow, _ = _new_instance(store)
        service.admit_signal("raw", workflow, "n", ARGS, request_id="k")
        keys = [receipt_token("signal", "k"), "k"]
        assert len(store.read_receipts("raw", workflow, "signal", keys)) == 1
        if store.postgres:
            # The server ends the session: the kept reader's socket says so, and it is
            # replaced before the next read, which never fails (no round trip spent to learn it).
            pid = _reader_backend_pid(store)
            with store.engine.connect() as conn:
                assert conn.execute(text("SELECT pg_terminate_backend(:p, 30000)"), {"p": pid}).scalar_one()
            assert len(store.read_receipts("raw", workflow, "signal", keys)) == 1
            assert _reader_backend_pid(store) != pid
        else:
            # A connection closed under the store (nothing a check could see first) fails one read.
            _next_read_connection(store).close()
            with pytest.raises(StorageError) as failed:
                store.read_receipts("raw", workflow, "signal", keys)
            assert failed.value.__cause__ is not None
        assert len(store.read_receipts("raw", workflow, "signal", keys)) == 1
        assert len(store.read_receipts("raw", workflow, "signal", keys)) == 1
    finally:
        store.dispose()


def test_threads_read_on_lent_connections_and_keep_no_more_than_the_readers_share(db_url: str) -> None:
    store = SqlStore.open(db_url)
    try:
        service, workflow, _ = _new_instance(store)
        for i in range(4):
            service.admit_signal("raw", workflow, "n", ARGS, request_id=f"k{i}")
        errors: list[BaseException] = []

        def read(i: int) -> None:
            try:
                for _ in range(50):
                    found = store.read_receipts("raw", workflow, "signal", [receipt_token("signal", f"k{i}")])
                    assert [row.request_id for row, _ in found] == [receipt_token("signal", f"k{i}")]
            except BaseException as exc:  # reported below, in the test's thread
                errors.append(exc)

        threads = [threading.Thread(target=read, args=(i % 4,)) for i in range(12)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert errors == []
        readers = store._kept.readers  # type: ignore[attr-defined]
        writers = store._kept.writers  # type: ignore[attr-defined]
        assert readers.count == len(readers.free) <= readers.cap
        assert writers.count == len(writers.free) <= writers.cap
        # On SQLite the idle writer reads too (one of the threads at a time).
        assert store.postgres <= (readers.count >= 1)
        assert len({id(held.connection) for held in readers.free}) == len(readers.free)
    finally:
        store.dispose()


def test_a_forked_child_reads_on_its_own_connection_and_leaves_the_parents_working(db_url: str) -> None:
    store = SqlStore.open(db_url)
    try:
        service, workflow, _ = _new_instance(store)
        service.admit_signal("raw", workflow, "n", ARGS, request_id="k")
        keys = [receipt_token("signal", "k"), "k"]
        (before,) = store.read_receipts("raw", workflow, "signal", keys)  # opens the parent's connection
        parent_backend = _reader_backend_pid(store)
        child = os.fork()
        if child == 0:  # pragma: no cover - runs in the child; its exit status is the verdict
            code = 1
            try:
                child_backend = _reader_backend_pid(store)
                (found,) = store.read_receipts("raw", workflow, "signal", keys)
                ok = found == before and (not store.postgres or child_backend != parent_backend)
                store.dispose()  # must not close the parent's connection
                code = 0 if ok else 2
            finally:
                os._exit(code)
        _, status = os.waitpid(child, 0)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
        # The parent's own connection still works, and is still the same session.
        assert store.read_receipts("raw", workflow, "signal", keys) == [before]
        assert _reader_backend_pid(store) == parent_backend
    finally:
        store.dispose()


def test_a_refused_driver_level_write_is_a_storage_error_naming_the_constraint_and_writes_nothing(
    db_url: str,
) -> None:
    store = SqlStore.open(db_url)
    try:
        service, workflow, _ = _new_instance(store)
        service.admit_signal("raw", workflow, "n", ARGS, request_id="k")
        now = datetime.now(UTC)
        refused = None
        try:
            with store.locked("raw", workflow, created_at=now, new_id="unused") as tx:
                (row,) = tx.find_commands("signal", [receipt_token("signal", "k")])
                tx.append_event(EventRow("raw", tx.instance.id, row.run_id, "Probe", None, None, b"", now))
                # Same sequence as an existing command: the unique constraint refuses it.
                tx.insert_command(replace(row, id=str(uuid.uuid4()), request_id="other"))
        except StorageError as exc:
            refused = exc
        assert refused is not None
        assert refused.constraint is not None and "command_sequence" in refused.constraint
        assert [e.event_type for e in store.read_history(first_instance(store, workflow))].count("Probe") == 0
    finally:
        store.dispose()


def first_instance(store: SqlStore, workflow: str) -> str:
    instance = store.find_instance("raw", workflow)
    assert instance is not None
    return instance.id


def test_a_read_connection_is_replaced_after_its_quota_of_reads_and_the_old_one_closed(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(admission.sql._connections, "REPLAN_AFTER", (3,))
    store = SqlStore.open(db_url)
    try:
        if not store.postgres:
            pytest.skip("SQLite keeps no plan made for the tables as they were: nothing to replace")
        service, workflow, _ = _new_instance(store)
        service.admit_signal("raw", workflow, "n", ARGS, request_id="k")
        keys = [receipt_token("signal", "k"), "k"]
        connections = []
        for _ in range(7):
            (found,) = store.read_receipts("raw", workflow, "signal", keys)
            assert found[0].request_id == keys[0]
            connections.append(_kept_reader(store))
        # Each connection serves at most 3 reads (the admission's own read
        # counts too), in one run, and is closed once replaced.
        runs = [list(group) for _, group in itertools.groupby(connections, key=id)]
        assert len(runs) >= 2 and all(len(run) <= 3 for run in runs)
        assert len({id(run[0]) for run in runs}) == len(runs)
        for run in runs[:-1]:
            with pytest.raises(Exception, match="closed"):
                run[0].cursor().execute("SELECT 1")
    finally:
        store.dispose()


def test_write_connections_drop_their_prepared_statements_on_schedule_and_keep_answering_right(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(admission.sql._connections, "REPLAN_AFTER", (7,))
    store = SqlStore.open(db_url)
    try:
        service, workflow, _ = _new_instance(store)
        # (connection, its count of locked transactions) -> statements prepared in it
        prepared: dict[tuple[int, int], int] = {}
        due: list[tuple[int, int]] = []
        for i in range(2, 300):
            # 28 transactions at least; on PostgreSQL until three were due.  The pool may
            # hand the caller's transactions to more than one connection (it takes the
            # oldest idle one, and a second is opened whenever one is out when asked for),
            # and each connection keeps its own count.
            if i >= 30 and (not store.postgres or len(due) >= 3):
                break
            with store.begin() as conn:
                fresh = service.admit_signal("raw", workflow, "n", ARGS, request_id=f"k{i}", connection=conn)
                assert fresh.decision is Decision.FRESH
                if store.postgres:
                    count = conn.exec_driver_sql("SELECT count(*) FROM pg_prepared_statements").scalar_one()
                    uses = conn.connection.info[admission.sql._connections.USES]
                    key = (id(conn.connection.dbapi_connection), uses)
                    prepared[key] = int(count)
                    due = [key for key in prepared if key[1] % 7 == 0]
            again = service.admit_signal("raw", workflow, "n", ARGS, request_id=f"k{i}")
            assert again.decision is Decision.RETAINED and again.command_id == fresh.command_id
        if store.postgres:
            # The locked transactions that were due (7, 14, 21, ... of their connection)
            # started by dropping them all; in between, psycopg prepared the hot statements again.
            assert len(due) >= 3 and all(prepared[key] == 0 for key in due)
            assert max(prepared.values()) > 0
    finally:
        store.dispose()


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    when=_WHEN, texts=st.lists(_TEXT, min_size=4, max_size=4), actor=_MAYBE_TEXT, fence=st.integers(0, 2**62)
)
def test_bulk_inserted_rows_are_stored_exactly_as_core_stores_them(
    db_url: str, when: datetime, texts: list[str], actor: str | None, fence: int
) -> None:
    from admission.sql import worker_events

    store = SqlStore.open(db_url)
    keys = ["queue", "write_id", "event_type", "from_state", "to_state", "reason", "actor", "fence"]
    keys.append("recorded_at")
    columns = [c for c in keys if c != "write_id"]
    bulk = admission.sql.BulkInsert(worker_events, store.engine.dialect, keys)
    try:
        row = dict(zip(["event_type", "from_state", "to_state", "reason"], texts, strict=True))
        row.update(queue="q", actor=actor, fence=fence, recorded_at=when)
        raw_id, core_id = f"raw-{uuid.uuid4().hex[:24]}", f"core-{uuid.uuid4().hex[:24]}"
        with store.engine.begin() as conn:
            bulk.insert(conn, [{**row, "write_id": raw_id}, {**row, "write_id": f"{raw_id}-2"}])
            conn.execute(insert(worker_events).values(**row, write_id=core_id))
        raw = _stored_form(store, "worker_events", columns, "write_id", raw_id)
        assert raw == _stored_form(store, "worker_events", columns, "write_id", core_id)
        assert raw == _stored_form(store, "worker_events", columns, "write_id", f"{raw_id}-2")
    finally:
        store.dispose()


def test_a_bulk_insert_the_database_refuses_is_a_storage_error_at_the_boundary_and_writes_nothing(
    db_url: str,
) -> None:
    from admission.sql import worker_events, wrap_exceptions

    store = SqlStore.open(db_url)
    keys = ["queue", "write_id", "event_type"]
    bulk = admission.sql.BulkInsert(worker_events, store.engine.dialect, keys)
    try:
        with pytest.raises(StorageError), wrap_exceptions(store.engine.dialect), store.engine.begin() as conn:
            # recorded_at is NOT NULL and not given: the driver refuses the batch.
            bulk.insert(conn, [{"queue": "q", "write_id": "w", "event_type": "x"}])
        with store.engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM worker_events")).scalar_one() == 0
    finally:
        store.dispose()


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(when=_WHEN, state=_TEXT, fence=st.integers(0, 2**62), shared=st.booleans())
def test_bulk_updated_rows_are_stored_exactly_as_core_stores_them(
    db_url: str, when: datetime, state: str, fence: int, shared: bool
) -> None:
    from sqlalchemy import bindparam, update

    from admission.sql import worker_leases, worker_queues, worker_records

    store = SqlStore.open(db_url)
    queue = f"q-{uuid.uuid4().hex[:12]}"
    records = worker_records.c
    statement = (
        update(worker_records)
        .where(records.write_id == bindparam("match"))
        .values(state=bindparam("new_state"), updated_at=bindparam("now"), fence=bindparam("new_fence"))
        .values(attempts=records.attempts + 1)
    )
    bulk = admission.sql.BulkStatement(statement, store.engine.dialect)
    ids = [f"w-{uuid.uuid4().hex[:20]}" for _ in range(3)]
    try:
        with store.engine.begin() as conn:
            conn.execute(insert(worker_queues).values(queue=queue, scope=b"s", created_at=when))
            # The fencing trigger accepts the lease's current token.
            conn.execute(insert(worker_leases).values(queue=queue, token=fence, heartbeat=0))
            for write_id in ids:
                conn.execute(
                    insert(worker_records).values(
                        write_id=write_id,
                        queue=queue,
                        tenant="t",
                        source_key=write_id,
                        content=b"c",
                        state="prepared",
                        attempts=0,
                        created_at=when,
                        updated_at=when,
                    )
                )
        values = {"new_state": state, "now": when, "new_fence": fence}
        with store.engine.begin() as conn:
            rows: list[dict[str, Any]] = [{"match": ids[0]}, {"match": ids[1]}, {"match": "absent"}]
            if shared:
                changed = bulk.execute(conn, rows, values)
            else:
                changed = bulk.execute(conn, [{**row, **values} for row in rows])
            assert changed == 2  # the rows each parameter set changed, summed
            conn.execute(
                update(worker_records)
                .where(records.write_id == ids[2])
                .values(state=state, updated_at=when, fence=fence, attempts=records.attempts + 1)
            )
        columns = ["state", "updated_at", "fence", "attempts"]
        core = _stored_form(store, "worker_records", columns, "write_id", ids[2])
        assert _stored_form(store, "worker_records", columns, "write_id", ids[0]) == core
        assert _stored_form(store, "worker_records", columns, "write_id", ids[1]) == core
    finally:
        store.dispose()


def test_a_bulk_statement_the_database_refuses_raises_as_core_and_writes_nothing(db_url: str) -> None:
    from sqlalchemy import bindparam, update
    from sqlalchemy.exc import IntegrityError

    from admission.sql import worker_queues

    store = SqlStore.open(db_url)
    when = datetime(2026, 1, 1, tzinfo=UTC)
    bulk = admission.sql.BulkStatement(
        update(worker_queues).where(worker_queues.c.queue == bindparam("match")).values(scope=bindparam("s")),
        store.engine.dialect,
    )
    try:
        with store.engine.begin() as conn:
            conn.execute(insert(worker_queues).values(queue="q", scope=b"before", created_at=when))
        with pytest.raises(IntegrityError), store.engine.begin() as conn:
            # scope is NOT NULL: the second parameter set is refused, and the first is rolled back.
            bulk.execute(conn, [{"match": "q", "s": b"after"}, {"match": "q", "s": None}])
        with store.engine.connect() as conn:
            assert conn.execute(text("SELECT scope FROM worker_queues")).scalar_one() == b"before"
    finally:
        store.dispose()


# -- the kept write connections (_Writers) --------------------------------------------------------


def _connects(store: SqlStore) -> list[int]:
    """A counter of the DBAPI connections the store's engine makes from now on."""
    from sqlalchemy import event

    made = [0]

    @event.listens_for(store.engine, "connect")
    def _count(_dbapi: object, _record: object) -> None:
        made[0] += 1

    return made


def _kept_backend(store: SqlStore) -> Any:
    (held,) = store._kept.writers.free  # type: ignore[attr-defined]
    dbapi = held.proxy.connection.dbapi_connection
    if not store.postgres:
        return dbapi
    return dbapi.info.backend_pid


def test_locked_transactions_reuse_a_kept_connection(db_url: str) -> None:
    store = SqlStore.open(db_url)
    try:
        service, workflow, _ = _new_instance(store)
        service.admit_signal("raw", workflow, "n", ARGS, request_id="warm")
        made = _connects(store)
        for i in range(20):
            answer = service.admit_signal("raw", workflow, "n", ARGS, request_id=f"k{i}")
            assert answer.decision is Decision.FRESH
            service.admit_update("raw", workflow, "u", ARGS, request_id=f"u{i}")
        assert made[0] == 0
        assert len(store._kept.writers.free) == 1  # type: ignore[attr-defined]
    finally:
        store.dispose()


def test_a_kept_write_connection_the_server_ended_is_replaced_and_a_broken_one_fails_one_admission(
    db_url: str,
) -> None:
    store = SqlStore.open(db_url)
    try:
        service, workflow, _ = _new_instance(store)
        service.admit_signal("raw", workflow, "n", ARGS)
        broken = _kept_backend(store)
        if store.postgres:
            # Ended by the server: seen on its socket before use, replaced, and nothing fails.
            with store.engine.connect() as conn:
                terminate = text("SELECT pg_terminate_backend(:p, 30000)")
                assert conn.execute(terminate, {"p": broken}).scalar_one()
            assert service.admit_signal("raw", workflow, "n", ARGS).decision is Decision.FRESH
            signals = 3
        else:
            broken.close()
            with pytest.raises(StorageError):
                service.admit_signal("raw", workflow, "n", ARGS)  # unkeyed: straight to the lock
            assert store._kept.writers.free == []  # type: ignore[attr-defined]
            signals = 2
        assert service.admit_signal("raw", workflow, "n", ARGS).decision is Decision.FRESH
        assert _kept_backend(store) != broken
        assert len(store.read_history(first_instance(store, workflow))) == 1 + signals
    finally:
        store.dispose()


def test_more_threads_than_kept_connections_all_admit_and_no_more_are_kept(db_url: str) -> None:
    store = SqlStore.open(db_url)
    try:
        service = AdmissionService(store)
        writers = store._kept.writers  # type: ignore[attr-defined]
        workflows = [f"wf-{uuid.uuid4()}" for _ in range(writers.cap + 4)]
        for workflow in workflows:
            service.start_run("raw", workflow)
        errors: list[BaseException] = []
        decisions: list[Decision] = []

        def admit(workflow: str) -> None:
            try:
                for i in range(10):
                    answer = service.admit_signal("raw", workflow, "n", ARGS, request_id=f"k{i}")
                    decisions.append(answer.decision)
            except BaseException as exc:  # reported below, in the test's thread
                errors.append(exc)

        threads = [threading.Thread(target=admit, args=(w,)) for w in workflows]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert errors == []
        assert decisions == [Decision.FRESH] * (10 * len(workflows))
        assert 1 <= len(writers.free) == writers.count <= writers.cap
    finally:
        store.dispose()


def test_a_forked_child_admits_on_its_own_write_connection_and_leaves_the_parents_working(
    db_url: str,
) -> None:
    store = SqlStore.open(db_url)
    try:
        service, workflow, _ = _new_instance(store)
        service.admit_signal("raw", workflow, "n", ARGS, request_id="parent-1")
        parent = _kept_backend(store)
        child = os.fork()
        if child == 0:  # pragma: no cover - runs in the child; its exit status is the verdict
            code = 1
            try:
                answer = service.admit_signal("raw", workflow, "n", ARGS, request_id="child")
                ok = answer.decision is Decision.FRESH and _kept_backend(store) != parent
                store.dispose()  # must not close the parent's connections
                code = 0 if ok else 2
            finally:
                os._exit(code)
        _, status = os.waitpid(child, 0)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
        again = service.admit_signal("raw", workflow, "n", ARGS, request_id="parent-2")
        assert again.decision is Decision.FRESH and _kept_backend(store) == parent
        keys = [receipt_token("signal", "child"), "child"]
        assert len(store.read_receipts("raw", workflow, "signal", keys)) == 1
    finally:
        store.dispose()


def test_dispose_closes_the_kept_write_connections(db_url: str) -> None:
    store = SqlStore.open(db_url)
    service, workflow, _ = _new_instance(store)
    service.admit_signal("raw", workflow, "n", ARGS)
    (held,) = store._kept.writers.free  # type: ignore[attr-defined]
    store.dispose()
    assert held.proxy.closed and store._kept.writers.free == []  # type: ignore[attr-defined]


def test_a_lookup_of_many_values_finds_what_one_lookup_per_key_finds(db_url: str) -> None:
    # LockedInstance.find_commands with more than a key's two values (token and raw key) reads
    # them in one statement; it must find, in the same order, what a lookup per key finds.
    store = SqlStore.open(db_url)
    service = AdmissionService(store)
    try:
        service.start_run("ns", "many")
        keys = [f"many-{n}" for n in range(6)]
        for key in keys[:4]:
            service.admit_signal("ns", "many", "s", [key], request_id=key)
        values = [v for key in keys for v in (receipt_token("signal", key), key)]
        now = datetime.now(UTC)
        with store.locked("ns", "many", created_at=now, new_id=str(uuid.uuid4())) as tx:
            together = tx.find_commands("signal", values)
            alone = [
                c for i in range(0, len(values), 2) for c in tx.find_commands("signal", values[i : i + 2])
            ]
        assert [c.id for c in together] == [c.id for c in alone] and len(together) == 4
    finally:
        store.dispose()


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    when=_WHEN,
    texts=st.lists(_TEXT, min_size=5, max_size=5),
    optional=st.lists(_MAYBE_TEXT, min_size=6, max_size=6),
    blobs=st.lists(_MAYBE_BYTES, min_size=4, max_size=4),
    completed=st.none() | _WHEN,
)
def test_a_batchs_rows_written_together_are_stored_exactly_as_core_stores_them(
    db_url: str,
    when: datetime,
    texts: list[str],
    optional: list[str | None],
    blobs: list[bytes | None],
    completed: datetime | None,
) -> None:
    # insert_admitted_many: one executemany per table on SQLite, one statement of column
    # arrays sent in binary on PostgreSQL; every column stored as Core stores it.
    store = SqlStore.open(db_url)
    try:
        _, workflow, run_id = _new_instance(store)
        with store.locked("raw", workflow, created_at=when, new_id="unused") as tx:
            iid = tx.instance.id

            def admitted(tag: str, sequence: int) -> tuple[CommandRow, UpdateRow, EventRow]:
                command = CommandRow(
                    str(uuid.uuid4()), iid, run_id, sequence, texts[0], texts[1], texts[2], optional[0],
                    f"{tag}-{uuid.uuid4()}", blobs[0], blobs[1], texts[3], texts[4], optional[1], when,
                    optional[2], optional[3], optional[4],
                )  # fmt: skip
                update = UpdateRow(
                    str(uuid.uuid4()), command.id, iid, run_id, texts[1], texts[3], blobs[2], optional[5],
                    when, completed,
                )  # fmt: skip
                event = EventRow("raw", iid, run_id, texts[0], command.id, update.id, blobs[3] or b"", when)
                return command, update, event

            batch = [admitted("raw", 2001), admitted("raw", 2002)]
            assert tx.insert_admitted_many(batch)
            core = admitted("core", 2003)
            conn = tx._conn  # type: ignore[attr-defined]
            conn.execute(insert(workflow_commands), vars(core[0]))
            conn.execute(insert(workflow_updates), vars(core[1]))
            tx_id = func.txid_current() if store.postgres else literal(0)
            core_event = {k: v for k, v in vars(core[2]).items() if k not in ("position", "tx_id")}
            conn.execute(insert(workflow_history_events).values(tx_id=tx_id), core_event)
        unique = ("id", "command_id", "update_id", "request_id", "command_sequence", "position")
        for table, key, which in ((workflow_commands, "id", 0), (workflow_updates, "id", 1)):
            columns = [c.name for c in table.c if c.name not in unique]
            forms = [_stored_form(store, table.name, columns, key, rows[which].id) for rows in (*batch, core)]
            assert forms[0] == forms[1] == forms[2]
        columns = [c.name for c in workflow_history_events.c if c.name not in unique]
        forms = [
            _stored_form(store, "workflow_history_events", columns, "command_id", rows[0].id)
            for rows in (*batch, core)
        ]
        assert forms[0] == forms[1] == forms[2]
        # The events in the order of the batch's items, before what the transaction wrote next.
        with store.engine.connect() as conn:
            logged = conn.execute(
                select(workflow_history_events.c.command_id)
                .where(workflow_history_events.c.instance_id == iid)
                .order_by(workflow_history_events.c.position)
            ).scalars()
            assert list(logged)[-3:] == [batch[0][0].id, batch[1][0].id, core[0].id]
    finally:
        store.dispose()
