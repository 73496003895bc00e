"""PostgreSQL: a keyed command's lock and its key's receipts in one round trip (``admission/sql/_keyed.py``).

The lock is taken only while no receipt holds the key.  A retry must
therefore answer while another transaction holds the instance's lock (as the
read before the lock answered it), on the sync and the async service; a
first-time key still waits for the lock and then sees what the holder
committed; a retry's transaction holds no lock and no transaction id, seen from
another session while it is open; the rare case where the lock's test saw a
receipt that the read after it no longer finds has the store itself take the
lock and decide; and on SQLite the call is the plain lock.
"""

from __future__ import annotations

import asyncio
import re
import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Connection, event, func, make_url, select, text
from sqlalchemy.exc import OperationalError

from admission import receipt_token
from admission.aio import AsyncAdmissionService, open_store
from admission.receipts import AdmissionService, Decision
from admission.receipts._service import time_ordered_id, utc_now
from admission.sql import SqlStore, create_admission_engine
from admission.sql._raw import RawStatement
from admission.sql._receipt_queries import signal_receipt_reads
from admission.sql._schema import workflow_commands
from tests.support.backends import PostgresPool, database_url

pytestmark = pytest.mark.filterwarnings("error")


class _HeldLock:
    """Another session holding the instance's row lock until released."""

    def __init__(self, url: str, workflow_id: str) -> None:
        self.engine = create_admission_engine(url)
        self.conn = self.engine.connect()
        self.conn.execute(
            text("SELECT id FROM workflow_instances WHERE namespace = 'ns' AND workflow_id = :wf FOR UPDATE"),
            {"wf": workflow_id},
        ).one()

    def release(self, commit: bool = False) -> None:
        if commit:
            self.conn.commit()
        self.conn.close()
        self.engine.dispose()


def _started(action: Any) -> tuple[threading.Thread, list[Any]]:
    """``action`` running on a thread of its own, and the list its result is put in."""
    result: list[Any] = []
    thread = threading.Thread(target=lambda: result.append(action()), daemon=True)
    thread.start()
    return thread, result


@pytest.mark.parametrize("command_type", ["signal", "update"])
def test_a_retry_answers_while_another_transaction_holds_the_instances_lock(
    pg_url: str, pg_store: SqlStore, command_type: str
) -> None:
    service = AdmissionService(pg_store)
    assert pg_store.keyed_locks
    service.start_run("ns", "wf")
    admit = service.admit_signal if command_type == "signal" else service.admit_update
    first = admit("ns", "wf", "go", [1], request_id="k")
    held = _HeldLock(pg_url, "wf")
    try:
        retry, answers = _started(lambda: admit("ns", "wf", "go", [1], request_id="k"))
        retry.join(20)
        assert not retry.is_alive(), "the retry waited for the instance's lock"
        assert answers[0].retained and answers[0].command_id == first.command_id
        # A first-time key waits for the lock.
        fresh, admitted = _started(lambda: admit("ns", "wf", "go", [2], request_id="new"))
        fresh.join(0.5)
        assert fresh.is_alive()
    finally:
        held.release()
    fresh.join(20)
    assert admitted and admitted[0].decision is Decision.FRESH


def test_an_async_retry_answers_while_another_transaction_holds_the_instances_lock(pg_url: str) -> None:
    async def main() -> None:
        store = await open_store(pg_url)
        assert isinstance(store.sync, SqlStore) and store.sync.engine.dialect.is_async
        assert store.sync.keyed_locks
        service = AsyncAdmissionService(store)
        await service.start_run("ns", "wf")
        first = await service.admit_update("ns", "wf", "go", [1], request_id="k")
        held = _HeldLock(pg_url, "wf")
        try:
            again = await asyncio.wait_for(service.admit_update("ns", "wf", "go", [1], request_id="k"), 20)
        finally:
            held.release()
            await store.dispose()
        assert again.retained and again.update_id == first.update_id

    asyncio.run(main())


def test_a_first_time_key_that_waited_for_the_lock_answers_with_what_the_holder_committed(
    pg_url: str, pg_store: SqlStore
) -> None:
    service = AdmissionService(pg_store)
    service.start_run("ns", "wf")
    holder = _HeldLock(pg_url, "wf")
    waiting = threading.Thread(
        target=lambda: answers.append(service.admit_signal("ns", "wf", "go", [1], request_id="k")),
        daemon=True,
    )
    answers: list[Any] = []
    waiting.start()
    waiting.join(0.5)
    assert waiting.is_alive()  # its lock's test saw no receipt: it waits for the lock
    # The holder admits the same key in its own transaction and commits: only the read after
    # the lock can find that receipt.
    other = SqlStore(holder.engine)
    stored = AdmissionService(other).admit_signal(
        "ns", "wf", "go", [1], request_id="k", connection=holder.conn
    )
    assert stored.decision is Decision.FRESH
    holder.release(commit=True)
    waiting.join(20)
    assert answers and answers[0].retained and answers[0].command_id == stored.command_id
    with pg_store.engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(workflow_commands)).scalar_one() == 1


def _keyed(store: SqlStore, key: str) -> Any:
    """``store.locked_unless_retained`` for a signal's ``key`` on instance ``ns/wf``."""
    return store.locked_unless_retained(
        "ns",
        "wf",
        "signal",
        [receipt_token("signal", key), key],
        created_at=utc_now(),
        new_id=time_ordered_id(),
    )


def _session_state(url: str) -> tuple[bool, bool]:
    """From another session: whether the store's session that is idle in a transaction holds a
    transaction id, and whether the instance's row lock is free."""
    with _Probe(url) as conn:
        (xid,) = conn.execute(
            text(
                "SELECT backend_xid IS NOT NULL FROM pg_stat_activity WHERE datname = current_database()"
                " AND state = 'idle in transaction' AND pid <> pg_backend_pid()"
            )
        ).one()
        try:
            conn.execute(
                text("SELECT 1 FROM workflow_instances WHERE workflow_id = 'wf' FOR UPDATE NOWAIT")
            ).one()
            free = True
        except OperationalError as exc:
            assert "could not obtain lock" in str(exc)
            free = False
        conn.rollback()
    return xid, free


class _Probe:
    """A connection of another session, closed with its engine."""

    def __init__(self, url: str) -> None:
        self.engine = create_admission_engine(url)

    def __enter__(self) -> Connection:
        self.conn = self.engine.connect()
        return self.conn

    def __exit__(self, *exc: object) -> None:
        self.conn.close()
        self.engine.dispose()


def test_a_retrys_transaction_takes_no_lock_and_no_transaction_id_and_a_fresh_keys_takes_both(
    pg_url: str, pg_store: SqlStore
) -> None:
    service = AdmissionService(pg_store)
    service.start_run("ns", "wf")
    first = service.admit_signal("ns", "wf", "go", [1], request_id="k")
    with _keyed(pg_store, "k") as found:
        # The transaction is still open here: the retry's answer was read in it.
        assert isinstance(found, list) and [c.id for c, _ in found] == [first.command_id]
        assert _session_state(pg_url) == (False, True)
    with _keyed(pg_store, "new") as locked:
        assert not isinstance(locked, list)
        assert locked.find_commands("signal", [receipt_token("signal", "new"), "new"]) == []
        assert _session_state(pg_url) == (True, False)


def test_a_receipt_gone_between_the_locks_test_and_the_read_after_it_takes_the_lock_and_decides(
    pg_url: str, pg_store: SqlStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    service = AdmissionService(pg_store)
    service.start_run("ns", "wf")
    first = service.admit_signal("ns", "wf", "go", [1], request_id="k")
    # The read after the lock's test finds nothing, as after a prune committed in between.
    nothing = RawStatement(
        signal_receipt_reads(lambda query: query.where(text("false"))), pg_store.engine.dialect
    )
    monkeypatch.setattr(pg_store._raw, "signal_receipts", nothing)
    # The store itself takes the lock (not an empty answer that leaves it to the service).
    with _keyed(pg_store, "k") as locked:
        assert not isinstance(locked, list)
        assert _session_state(pg_url) == (True, False)
        (under_lock,) = locked.find_commands("signal", [receipt_token("signal", "k"), "k"])
        assert under_lock.id == first.command_id
    again = service.admit_signal("ns", "wf", "go", [1], request_id="k")
    assert again.retained and again.command_id == first.command_id
    with pg_store.engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(workflow_commands)).scalar_one() == 1


def test_on_sqlite_it_is_the_plain_lock(tmp_path: Path, postgres_pool: PostgresPool) -> None:
    url = database_url("sqlite", postgres_pool, tmp_path)
    store = SqlStore.open(url)
    try:
        assert not store.keyed_locks
        service = AdmissionService(store)
        service.start_run("ns", "wf")
        first = service.admit_signal("ns", "wf", "go", [1], request_id="k")
        with _keyed(store, "k") as locked:
            # A locked instance even for a retained key, which it finds under the lock.
            assert not isinstance(locked, list)
            (found,) = locked.find_commands("signal", [receipt_token("signal", "k"), "k"])
            assert found.id == first.command_id
            # The write lock is held: another writer is refused at once.
            other = sqlite3.connect(str(make_url(url).database), timeout=0)
            try:
                with pytest.raises(sqlite3.OperationalError, match="locked"):
                    other.execute("BEGIN IMMEDIATE")
            finally:
                other.close()
    finally:
        store.dispose()


def test_the_path_follows_the_share_of_retries(pg_store: SqlStore, tmp_path: Any) -> None:
    # While retries are rare a keyed admission reads its key in the lock's round trip (a fresh
    # key: two round trips on one connection); after a run of retries the key is read first,
    # without a transaction (a retry: one round trip), and fresh keys bring the first way back.
    service = AdmissionService(pg_store)
    path = tmp_path / "libpq.trace"
    with path.open("w") as trace:

        @event.listens_for(pg_store.engine, "checkout")
        def traced(dbapi: Any, record: Any, proxy: Any) -> None:
            dbapi.pgconn.trace(trace.fileno())

        service.start_run("ns", "wf")

        def round_trips(key: str) -> int:
            start = path.stat().st_size
            service.admit_signal("ns", "wf", "go", [1], request_id=key)
            return len(re.findall(r"\tF\t\d+\t(?:Sync|Query)\b", path.read_text()[start:]))

        assert [round_trips(k) for k in ("a", "a")] == [2, 2]
        retries = [round_trips("a") for _ in range(20)]
        assert retries[0] == 2 and retries[-1] == 1
        fresh = [round_trips(f"new-{n}") for n in range(20)]
        assert fresh[0] == 3 and fresh[-1] == 2
