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
from sqlalchemy import Engine, create_engine, func, select

from admission.receipts import Admission, AdmissionService, BatchCommand, Decision
from admission.sql import SqlStore, normalize_url, workflow_commands, workflow_history_events
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
        service.admit_many(_batch(["killed"], WORKFLOWS))
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
    # new_id calls: 4 instance ids before the transaction, then per update item a command id
    # and an update id; call 8 (from 0) is the third item's command id, after two items were written.
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


def test_two_batches_locking_the_same_instances_in_opposite_orders_both_finish(
    db_url: str, observer: Engine
) -> None:
    if db_url.startswith("sqlite"):
        pytest.skip("SQLite has one write lock: two transactions never wait on each other in a cycle")
    store = SqlStore.open(db_url)
    service = AdmissionService(store)
    for workflow in WORKFLOWS:
        service.start_run(NS, workflow)
    store.dispose()
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
