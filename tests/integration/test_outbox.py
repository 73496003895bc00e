"""The outbox relay: progress and effect commit together, shown by killing a real relay process."""

from __future__ import annotations

import multiprocessing
import signal
import time
from pathlib import Path

from sqlalchemy import func, select

from admission.sql import SqlStore, SqlWorkerStore, outbox_cursors, worker_events, worker_records
from admission.worker import DurableWorker, OutboxRelay, Scope, record_outbox
from tests.support.processes import WAIT, running

CTX = multiprocessing.get_context("spawn")
SCOPE = {"tenant": "t1", "account": "a1"}


def _relay_then_hang(url: str, ready: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    store = SqlStore.open(url)
    worker = DurableWorker(SqlWorkerStore(store.engine), Scope.parse(SCOPE), file_lock=False)

    def hang(point: str) -> None:
        ready.put(point)  # accepted inside the open transaction; the parent kills us now
        while True:
            time.sleep(60)

    OutboxRelay(store, worker, target="crm", hook=hang).pump()


def counts(store: SqlStore) -> tuple[int, int]:
    with store.engine.connect() as conn:
        records = conn.execute(select(func.count()).select_from(worker_records)).scalar_one()
        cursors = conn.execute(select(func.count()).select_from(outbox_cursors)).scalar_one()
    return int(records), int(cursors)


def test_a_relay_killed_between_accept_and_commit_leaves_neither(db_url: str, tmp_path: Path) -> None:
    store = SqlStore.open(db_url)
    with store.begin() as conn:
        record_outbox(store, conn, "ns", "wf", target="crm", source_key="lead", content=SCOPE)
    ready = CTX.Queue()
    relay = CTX.Process(target=_relay_then_hang, args=(db_url, ready))
    with running(relay):
        assert ready.get(timeout=WAIT) == "before_commit"
        relay.kill()
        relay.join(WAIT)
    assert relay.exitcode == -signal.SIGKILL
    assert counts(store) == (0, 0)  # neither the record nor the cursor move survived
    worker = DurableWorker(SqlWorkerStore(store.engine), Scope.parse(SCOPE), file_lock=False)
    again = OutboxRelay(store, worker, target="crm")
    assert again.pump().accepted == 1
    assert again.pump().read == 0
    assert counts(store) == (1, 1)
    store.dispose()


def test_an_entry_the_intake_refuses_is_recorded_and_passed_over(db_url: str) -> None:
    store = SqlStore.open(db_url)
    worker = DurableWorker(SqlWorkerStore(store.engine), Scope.parse(SCOPE), file_lock=False)
    with store.begin() as conn:
        record_outbox(
            store, conn, "ns", "wf", target="crm", source_key="x", content={**SCOPE, "tenant": "t2"}
        )
        record_outbox(store, conn, "ns", "wf", target="crm", source_key="y", content=SCOPE)
    report = OutboxRelay(store, worker, target="crm").pump()
    assert (report.read, report.refused, report.accepted) == (2, 1, 1)
    with store.engine.connect() as conn:
        refused = (
            conn.execute(select(worker_events.c.reason).where(worker_events.c.event_type == "intake_refused"))
            .scalars()
            .all()
        )
    assert len(refused) == 1 and "tenant" in refused[0]
    store.dispose()
