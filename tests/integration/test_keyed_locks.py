"""PostgreSQL: a keyed command's lock and its key's receipts in one round trip (``admission/sql/_keyed.py``).

The lock is taken only while no receipt holds the key.  A retry must
therefore answer while another transaction holds the instance's lock (as the
read before the lock answered it), on the sync and the async service; a
first-time key still waits for the lock and then sees what the holder
committed; and the rare case where the lock's test saw a receipt that the read
after it no longer finds still takes the lock and decides.
"""

from __future__ import annotations

import asyncio
import re
import threading
from typing import Any

import pytest
from sqlalchemy import event, func, select, text

from admission.aio import AsyncAdmissionService, open_store
from admission.receipts import AdmissionService, Decision
from admission.sql import SqlStore, create_admission_engine
from admission.sql._raw import RawStatement
from admission.sql._receipt_queries import signal_receipt_reads
from admission.sql._schema import workflow_commands

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


def test_a_receipt_gone_between_the_locks_test_and_the_read_after_it_takes_the_lock_and_decides(
    pg_store: SqlStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    service = AdmissionService(pg_store)
    service.start_run("ns", "wf")
    first = service.admit_signal("ns", "wf", "go", [1], request_id="k")
    # The read after the lock's test finds nothing, as after a prune committed in between.
    nothing = RawStatement(
        signal_receipt_reads(lambda query: query.where(text("false"))), pg_store.engine.dialect
    )
    monkeypatch.setattr(pg_store._raw, "signal_receipts", nothing)
    again = service.admit_signal("ns", "wf", "go", [1], request_id="k")
    assert again.retained and again.command_id == first.command_id
    with pg_store.engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(workflow_commands)).scalar_one() == 1


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
