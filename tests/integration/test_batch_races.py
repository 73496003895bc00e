"""Batch admission under real processes: a batch killed inside its transaction leaves nothing, and
two batches over the same instances in opposite orders both finish (no deadlock), each key once.

Workers are spawned processes, each with its own :class:`SqlStore` on the test's database (SQLite
or PostgreSQL); the parent counts rows with a plain engine.
"""

from __future__ import annotations

import itertools
import multiprocessing
import os
import signal
import traceback
import uuid
from collections import Counter
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, func, insert, select

from admission import receipt_token
from admission.receipts import Admission, AdmissionService, BatchCommand, Decision
from admission.sql import SqlStore, normalize_url, workflow_commands, workflow_history_events
from admission.sql._receipts import _SqlLocked
from tests.support.backends import PostgresPool
from tests.support.processes import WAIT, running

CTX = multiprocessing.get_context("spawn")
NS = "tenant-batch"
WORKFLOWS = [f"wf-{i}" for i in range(4)]
ROUNDS = 6


def _batch(keys: list[str], workflows: list[str]) -> list[BatchCommand]:
    return [
        BatchCommand("update", NS, workflow, "approve", {"key": key}, request_id=key)
        for key in keys
        for workflow in workflows
    ]


def _admit_and_block(db_url: str, block_at_call: int, inside: Any, never: Any, errors: Any) -> None:
    """Admit a batch with a ``new_id`` that blocks, inside the transaction, on call ``block_at_call``."""
    calls = itertools.count()

    def new_id() -> str:
        if next(calls) == block_at_call:
            inside.set()
            never.wait(WAIT)
            os._exit(3)
        return str(uuid.uuid4())

    try:
        service = AdmissionService(SqlStore.open(db_url), new_id=new_id)
        # The first workflow's item comes twice: the second, its retry, reads the key again, so
        # the first is written then (a batch writes its rows together when something reads).
        service.admit_many(_batch(["killed"], WORKFLOWS[:1]) + _batch(["killed"], WORKFLOWS))
    except BaseException:
        errors.put(traceback.format_exc())


def _admit_rounds(db_url: str, workflows: list[str], barrier: Any, results: Any) -> None:
    """Each round: wait for the other process, then admit the round's keys over ``workflows``."""
    try:
        service = AdmissionService(SqlStore.open(db_url))
        for round_ in range(ROUNDS):
            barrier.wait(WAIT)
            answers = service.admit_many(_batch([f"round-{round_}"], workflows))
            results.put([(a.workflow_id, a.request_id, str(a.decision)) for a in answers])  # type: ignore[union-attr]
    except BaseException:
        results.put(traceback.format_exc())


@pytest.fixture
def observer(db_url: str, postgres_pool: PostgresPool) -> Any:
    engine = create_engine(normalize_url(postgres_pool.direct(db_url)))
    yield engine
    engine.dispose()


def _count(engine: Engine, table: Any, *where: Any) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(table).where(*where)).scalar_one())


def test_a_batch_killed_inside_its_transaction_leaves_nothing_and_releases_its_locks(
    db_url: str, observer: Engine
) -> None:
    store = SqlStore.open(db_url)
    service = AdmissionService(store)
    for workflow in WORKFLOWS:
        service.start_run(NS, workflow)
    commands, events = _count(observer, workflow_commands), _count(observer, workflow_history_events)
    # new_id calls: 4 instance ids before the transaction, then per fresh update item a command
    # id and an update id (the retries take none); call 8 (from 0) is the third workflow's
    # command id, after the first workflow's rows were written and the second's decided.
    inside, never, errors = CTX.Event(), CTX.Event(), CTX.Queue()
    holder = CTX.Process(target=_admit_and_block, args=(db_url, 8, inside, never, errors))
    with running(holder):
        assert inside.wait(WAIT), errors.get(timeout=1)
        holder.kill()
        holder.join(WAIT)
    assert holder.exitcode == -signal.SIGKILL
    assert (_count(observer, workflow_commands), _count(observer, workflow_history_events)) == (
        commands,
        events,
    )
    # The locks died with it: the same batch is now admitted, every item fresh.
    answers = service.admit_many(_batch(["killed"], WORKFLOWS))
    assert [a.decision for a in answers if isinstance(a, Admission)] == [Decision.FRESH] * len(WORKFLOWS)
    store.dispose()


@pytest.mark.parametrize("started", [True, False], ids=["existing", "created-by-the-batches"])
def test_two_batches_locking_the_same_instances_in_opposite_orders_both_finish(
    db_url: str, observer: Engine, started: bool
) -> None:
    if db_url.startswith("sqlite"):
        pytest.skip("SQLite has one write lock: two transactions never wait on each other in a cycle")
    if started:
        store = SqlStore.open(db_url)
        service = AdmissionService(store)
        for workflow in WORKFLOWS:
            service.start_run(NS, workflow)
        store.dispose()
    # Not started: the first round's two batches both create the four instances (each then
    # refuses the updates, which have no run: one refusal per key, and the other batch's retry).
    barrier, results = CTX.Barrier(2), CTX.Queue()
    forward = CTX.Process(target=_admit_rounds, args=(db_url, WORKFLOWS, barrier, results))
    backward = CTX.Process(target=_admit_rounds, args=(db_url, WORKFLOWS[::-1], barrier, results))
    with running(forward, backward):
        reports = [results.get(timeout=WAIT) for _ in range(2 * ROUNDS)]
    failures = [r for r in reports if isinstance(r, str)]
    assert not failures, "\n".join(failures)
    decisions = Counter((wf, key, decision) for report in reports for wf, key, decision in report)
    for round_ in range(ROUNDS):
        for workflow in WORKFLOWS:
            key = f"round-{round_}"
            # Each key: one fresh admission, and the other batch's item is its retry.
            assert decisions[(workflow, key, "fresh")] == 1
            assert decisions[(workflow, key, "retained")] == 1
    assert _count(observer, workflow_commands) == ROUNDS * len(WORKFLOWS)


def test_a_key_written_outside_the_locks_before_a_batch_writes_is_answered_from_what_was_written(
    db_url: str, observer: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    if db_url.startswith("sqlite"):
        pytest.skip("SQLite has one writer: nothing is written between a batch's lookup and its rows")
    store = SqlStore.open(db_url)
    service = AdmissionService(store)
    for workflow in WORKFLOWS:
        service.start_run(NS, workflow)
    outside: list[str] = []
    write = _SqlLocked.insert_admitted_many

    def after_an_outside_write(self: _SqlLocked, admitted: Any, **options: Any) -> bool:
        if not outside:
            # A writer that skips the admission lock (no foreign-key check, so no wait on the
            # locked instance) commits the first item's key between the lookup and the writes.
            command = admitted[0][0]
            outside.append(str(uuid.uuid4()))
            with observer.begin() as conn:
                conn.exec_driver_sql("SET LOCAL session_replication_role = replica")
                row = {**vars(command), "id": outside[0], "command_sequence": command.command_sequence + 1000}
                conn.execute(insert(workflow_commands).values(row))
        return write(self, admitted, **options)

    monkeypatch.setattr(_SqlLocked, "insert_admitted_many", after_an_outside_write)
    answers = service.admit_many(_batch(["outside"], WORKFLOWS))
    store.dispose()
    assert all(isinstance(a, Admission) for a in answers)
    first, *rest = answers
    assert isinstance(first, Admission)
    # The batch was rolled back and decided again: the first key's answer is the row written outside.
    assert (first.decision, first.command_id) == (Decision.RETAINED, outside[0])
    assert [a.decision for a in rest if isinstance(a, Admission)] == [Decision.FRESH] * (len(WORKFLOWS) - 1)
    # Each key once: the row written outside and the three the batch wrote, nothing of its first try.
    stored = select(workflow_commands.c.id).where(
        workflow_commands.c.request_id == receipt_token("update", "outside")
    )
    with observer.connect() as conn:
        assert sorted(conn.execute(stored).scalars()) == sorted(
            a.command_id for a in answers if isinstance(a, Admission)
        )
