"""Atomicity, exclusivity and crash safety of admission, shown with real racing OS processes (contract §4).

Every test here starts worker processes with the ``spawn`` start method; each
worker opens its own :class:`SqlStore` on the test's database and its own
:class:`AdmissionService`, waits on a shared barrier so that the calls really
overlap, and sends its answers back as plain dicts (``Admission.to_dict()``).
The parent checks the answers against the rows in the database, counted with
SQLAlchemy.  The one-new-key race also runs on the async path: each worker
then admits through :class:`~admission.aio.AsyncAdmissionService` over
:func:`admission.aio.open_store` (aiosqlite, psycopg's async connection).
Crashes are real: a worker is killed with SIGKILL, either after its
transaction committed (a lost response) or while it holds the admission
lock (a writer that dies mid-transaction).
"""

from __future__ import annotations

import asyncio
import itertools
import multiprocessing
import os
import queue
import random
import signal
import time
import traceback
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, func, select

from admission.aio import AsyncAdmissionService, open_store
from admission.intent import receipt_token
from admission.receipts import AdmissionService
from admission.sql import (
    SqlStore,
    normalize_url,
    workflow_commands,
    workflow_history_events,
    workflow_instances,
    workflow_updates,
)
from tests.support.backends import PostgresPool
from tests.support.processes import WAIT, running

CTX = multiprocessing.get_context("spawn")
NS = "tenant-race"
PROCESSES = 8
"""Upper bound for any wait on a worker: only a hang ever reaches it."""


# -- worker processes (module-level so that ``spawn`` can import them) -----------------------------


def _send(service: AdmissionService, step: dict[str, Any]) -> dict[str, object]:
    admit = service.admit_signal if step["kind"] == "signal" else service.admit_update
    answer = admit(step["ns"], step["wf"], step["name"], step["args"], request_id=step["key"])
    return answer.to_dict()


def _report_failure(results: Any) -> None:
    results.put({"pid": os.getpid(), "error": traceback.format_exc()})


def _run_plan(db_url: str, plan: list[dict[str, Any]], path: str, barrier: Any, results: Any) -> None:
    """Send each step of ``plan``; a step with ``sync`` first waits for every worker at the barrier."""
    if path == "async":
        asyncio.run(_run_plan_async(db_url, plan, barrier, results))
        return
    store = SqlStore.open(db_url)
    service = AdmissionService(store)
    try:
        store.find_instance(NS, "warm-up")  # connect before the race, not during it
        for step in plan:
            if step.get("sync"):
                barrier.wait(WAIT)
            started = time.monotonic()
            answer = _send(service, step)
            ended = time.monotonic()
            results.put(
                {"pid": os.getpid(), "step": step, "answer": answer, "started": started, "ended": ended}
            )
    finally:
        store.dispose()


async def _run_plan_async(db_url: str, plan: list[dict[str, Any]], barrier: Any, results: Any) -> None:
    """:func:`_run_plan` through the async service on an async engine (the barrier blocks the
    loop, which runs nothing else meanwhile)."""
    store = await open_store(db_url)
    service = AsyncAdmissionService(store)
    try:
        await store.find_instance(NS, "warm-up")  # connect before the race, not during it
        for step in plan:
            if step.get("sync"):
                barrier.wait(WAIT)
            admit = service.admit_signal if step["kind"] == "signal" else service.admit_update
            started = time.monotonic()
            answer = await admit(step["ns"], step["wf"], step["name"], step["args"], request_id=step["key"])
            ended = time.monotonic()
            results.put(
                {
                    "pid": os.getpid(),
                    "step": step,
                    "answer": answer.to_dict(),
                    "started": started,
                    "ended": ended,
                }
            )
    finally:
        await store.dispose()


def _pool_worker(inbox: Any, barrier: Any, results: Any) -> None:
    """A worker of :class:`WorkerPool`: run each job it is given, then say ``done``."""
    parent = multiprocessing.parent_process()
    while True:
        try:
            job = inbox.get(timeout=1)
        except queue.Empty:
            if parent is not None and not parent.is_alive():
                return
            continue
        if job is None:
            return
        try:
            _run_plan(*job, barrier, results)
        except BaseException:
            _report_failure(results)
            barrier.abort()
        results.put({"pid": os.getpid(), "done": True})


def _admit_then_hang(db_url: str, step: dict[str, Any], never: Any, results: Any) -> None:
    """Admit (the transaction commits), then wait to be killed: the answer is never reported."""
    try:
        service = AdmissionService(SqlStore.open(db_url))
        answer = _send(service, step)
    except BaseException:
        _report_failure(results)
        return
    never.wait(WAIT)
    # Never reached in a passing test: the parent kills this process first.
    results.put({"pid": os.getpid(), "answer": answer, "late": True})


def _admit_blocking_inside_the_lock(
    db_url: str, step: dict[str, Any], block_at_call: int, inside: Any, never: Any, results: Any
) -> None:
    """Admit with a ``new_id`` that blocks on its ``block_at_call``-th call, inside the transaction.

    ``new_id`` call 0 is the instance id, evaluated before the store opens the
    transaction; call 1 is the command id, under the admission lock before
    anything is written; call 2 (updates only) is the update id, after the
    command row was inserted.  The process is killed while blocked; should it
    ever wake, it exits without committing.
    """
    calls = itertools.count()

    def new_id() -> str:
        if next(calls) == block_at_call:
            inside.set()
            never.wait(WAIT)
            os._exit(3)
        return str(uuid.uuid4())

    try:
        service = AdmissionService(SqlStore.open(db_url), new_id=new_id)
        _send(service, step)
    except BaseException:
        _report_failure(results)


def _admit_when_told(db_url: str, step: dict[str, Any], go: Any, calling: Any, results: Any) -> None:
    """Open the store, wait for ``go``, say ``calling`` and admit once; report the answer."""
    try:
        store = SqlStore.open(db_url)
        service = AdmissionService(store)
        store.find_instance(NS, "warm-up")
        if not go.wait(WAIT):
            raise TimeoutError("never told to go")
        calling.set()
        results.put({"pid": os.getpid(), "answer": _send(service, step)})
        store.dispose()
    except BaseException:
        _report_failure(results)


# -- helpers of the parent ---------------------------------------------------------------------------


def collect(results: Any, count: int) -> list[dict[str, Any]]:
    """``count`` reports from the workers; a worker's exception fails the test with its traceback."""
    reports = [results.get(timeout=WAIT) for _ in range(count)]
    errors = [r["error"] for r in reports if "error" in r]
    assert not errors, "a worker failed:\n" + "\n".join(errors)
    return reports


def max_overlap(reports: list[dict[str, Any]]) -> int:
    """The largest number of calls that were in flight at one instant (CLOCK_MONOTONIC is system-wide)."""
    edges = sorted([(r["started"], 1) for r in reports] + [(r["ended"], -1) for r in reports])
    depth = best = 0
    for _, change in edges:
        depth += change
        best = max(best, depth)
    return best


def token(step: dict[str, Any]) -> str:
    return receipt_token(step["kind"], step["key"])


def instance_id(store: SqlStore, workflow_id: str) -> str:
    instance = store.find_instance(NS, workflow_id)
    assert instance is not None, workflow_id
    return instance.id


def commands_for(db: Engine, step: dict[str, Any]) -> list[dict[str, Any]]:
    """Every ``workflow_commands`` row of the step's instance, type and key, as dicts."""
    query = (
        select(workflow_commands)
        .join(workflow_instances, workflow_instances.c.id == workflow_commands.c.instance_id)
        .where(
            workflow_instances.c.namespace == step["ns"],
            workflow_instances.c.workflow_id == step["wf"],
            workflow_commands.c.command_type == step["kind"],
            workflow_commands.c.request_id == token(step),
        )
    )
    with db.connect() as conn:
        return [dict(r) for r in conn.execute(query).mappings()]


def count_rows(db: Engine, table: Any, *where: Any) -> int:
    with db.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(table).where(*where)).scalar_one())


def table_counts(db: Engine) -> dict[str, int]:
    tables = (workflow_instances, workflow_commands, workflow_updates, workflow_history_events)
    return {t.name: count_rows(db, t) for t in tables}


def aware(value: datetime) -> datetime:
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value


@pytest.fixture
def sql_store(db_url: str) -> Iterator[SqlStore]:
    store = SqlStore.open(db_url)
    yield store
    store.dispose()


@pytest.fixture
def observer(db_url: str, postgres_pool: PostgresPool) -> Iterator[Engine]:
    """A plain engine for looking at the rows; on SQLite its reads take no lock (admission's writes do).
    On PostgreSQL it reads the server itself, also when the test's URL goes through PgBouncer."""
    engine = create_engine(normalize_url(postgres_pool.direct(db_url)))
    yield engine
    engine.dispose()


class WorkerPool:
    """``size`` spawned worker processes kept for the whole module, so no test pays their start-up.

    A job gives every worker its own plan on one database; each worker opens
    its own store and service for the job and closes them after it.
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self.broken = False
        self.barrier = CTX.Barrier(size)
        self.results = CTX.Queue()
        self.inboxes = [CTX.Queue() for _ in range(size)]
        self.processes = [
            CTX.Process(target=_pool_worker, args=(inbox, self.barrier, self.results), daemon=True)
            for inbox in self.inboxes
        ]

    def run(self, db_url: str, plans: list[list[dict[str, Any]]], path: str = "sync") -> list[dict[str, Any]]:
        """Run one plan per worker, all at once (``path``: ``sync`` or ``async``);
        the reports of every step."""
        assert len(plans) == self.size
        if self.broken:
            pytest.fail("the worker pool hung in an earlier test", pytrace=False)
        for inbox, plan in zip(self.inboxes, plans, strict=True):
            inbox.put((db_url, plan, path))
        reports: list[dict[str, Any]] = []
        done = 0
        while done < self.size:
            try:
                report = self.results.get(timeout=WAIT)
            except queue.Empty:
                self.broken = True
                raise AssertionError(f"the workers hung; {done} of {self.size} finished") from None
            done += bool(report.get("done"))
            reports.append(report)
        errors = [r["error"] for r in reports if "error" in r]
        if errors:
            self.barrier.reset()
        assert not errors, "a worker failed:\n" + "\n".join(errors)
        return [r for r in reports if "step" in r]

    def stop(self) -> None:
        for inbox in self.inboxes:
            inbox.put(None)


@pytest.fixture(scope="module")
def pool() -> Iterator[WorkerPool]:
    workers = WorkerPool(PROCESSES)
    with running(*workers.processes):
        yield workers
        workers.stop()


# -- (a) one new key, eight processes at once ---------------------------------------------------------

ROUNDS = 5
IDENTITY = ("command_id", "run_id", "received_at", "command_sequence")


@pytest.mark.parametrize(
    ("case", "path"),
    [
        ("signal", "sync"),
        ("update", "sync"),
        ("signal-to-new-instance", "sync"),
        ("signal", "async"),
        ("update", "async"),
        ("signal-to-new-instance", "async"),
    ],
)
def test_eight_processes_sending_one_new_key_at_once_admit_exactly_one_command(
    pool: WorkerPool, db_url: str, sql_store: SqlStore, observer: Engine, case: str, path: str
) -> None:
    kind = "update" if case == "update" else "signal"
    new_instance = case == "signal-to-new-instance"
    run_id = None if new_instance else AdmissionService(sql_store).start_run(NS, "wf-a").run_id
    plan = [
        {
            "sync": True,
            "round": n,
            "kind": kind,
            "ns": NS,
            "wf": f"wf-new-{n}" if new_instance else "wf-a",
            "name": "approve",
            "args": {"amount": 12.5, "round": n},
            "key": f"race-{case}-{n}",
        }
        for n in range(ROUNDS)
    ]
    reports = pool.run(db_url, [plan] * PROCESSES, path)
    assert len({r["pid"] for r in reports}) == PROCESSES

    identity = IDENTITY + (("update_id",) if kind == "update" else ())
    overlapped: list[bool] = []
    for step in plan:
        answers = [r["answer"] for r in reports if r["step"]["round"] == step["round"]]
        assert len(answers) == PROCESSES
        assert Counter(a["retained"] for a in answers) == {False: 1, True: PROCESSES - 1}, answers
        assert {tuple(a[f] for f in identity) for a in answers} == {tuple(answers[0][f] for f in identity)}
        assert {(a["request_id"], a["intent_verified"]) for a in answers} == {(step["key"], True)}
        if new_instance:
            # No run can exist: the racing calls created the instance, and the
            # keyed refusal is itself retained (contract §4).
            assert {(a["outcome"], a["http_status"], a["run_id"]) for a in answers} == {
                ("run_not_active", 409, None)
            }
            assert (
                count_rows(observer, workflow_instances, workflow_instances.c.workflow_id == step["wf"]) == 1
            )
        else:
            expected = "received" if kind == "signal" else "accepted"
            assert {(a["outcome"], a["http_status"], a["run_id"]) for a in answers} == {
                (expected, 202, run_id)
            }

        rows = commands_for(observer, step)
        assert [r["id"] for r in rows] == [answers[0]["command_id"]]
        events = workflow_history_events.c.command_id == rows[0]["id"]
        assert count_rows(observer, workflow_history_events, events) == 1
        if kind == "update":
            assert count_rows(observer, workflow_updates, workflow_updates.c.command_id == rows[0]["id"]) == 1
        # Whether the calls of the round really overlapped (checked over the rounds below).
        overlapped.append(max_overlap([r for r in reports if r["step"]["round"] == step["round"]]) >= 2)
    # On two cores the scheduler may run one round's eight calls one after another: the race
    # must have happened in most rounds, not in every one.
    assert sum(overlapped) > len(plan) // 2, overlapped

    # Nothing but the one command per round was written.
    assert count_rows(observer, workflow_commands) == ROUNDS
    command_events = workflow_history_events.c.command_id.is_not(None)
    assert count_rows(observer, workflow_history_events, command_events) == ROUNDS
    if not new_instance:
        sequences = [r["answer"]["command_sequence"] for r in reports if not r["answer"]["retained"]]
        assert sorted(sequences) == list(range(1, ROUNDS + 1))


# -- (b) many keys across many instances ---------------------------------------------------------------

INSTANCES = 10
KEYS = 20
SENDERS = PROCESSES


def test_many_processes_sending_overlapping_keys_to_many_instances_lose_and_double_nothing(
    pool: WorkerPool, db_url: str, sql_store: SqlStore, observer: Engine
) -> None:
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    service = AdmissionService(sql_store)
    workflows = [f"wf-{i:02d}" for i in range(INSTANCES)]
    for wf in workflows:
        service.start_run(NS, wf)
    pairs = [
        {
            "kind": "signal" if k % 2 == 0 else "update",
            "ns": NS,
            "wf": wf,
            "name": f"cmd-{k}",
            "args": [wf, k],
            "key": f"key-{k:02d}",
        }
        for wf in workflows
        for k in range(KEYS)
    ]
    plans: list[list[dict[str, Any]]] = [[] for _ in range(SENDERS)]
    for pair in pairs:  # every pair is sent by at least two processes
        for sender in rng.sample(range(SENDERS), rng.randint(2, 4)):
            plans[sender].append(pair)
    for plan in plans:
        rng.shuffle(plan)
        plan[0] = {**plan[0], "sync": True}
    sent = sum(len(p) for p in plans)

    reports = pool.run(db_url, plans)
    assert len(reports) == sent

    by_pair: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for report in reports:
        by_pair[(report["step"]["wf"], report["step"]["key"])].append(report)
    assert len(by_pair) == len(pairs), f"seed {seed}"
    for pair in pairs:
        answered = by_pair[(pair["wf"], pair["key"])]
        assert len({r["pid"] for r in answered}) == len(answered) >= 2, f"seed {seed}"
        assert len({r["answer"]["command_id"] for r in answered}) == 1, f"seed {seed}: {answered}"
        assert sorted(r["answer"]["retained"] for r in answered) == [False] + [True] * (len(answered) - 1)
        rows = commands_for(observer, pair)
        assert [r["id"] for r in rows] == [answered[0]["answer"]["command_id"]], f"seed {seed}"

    assert count_rows(observer, workflow_commands) == len(pairs)
    with observer.connect() as conn:
        per_command = conn.execute(
            select(workflow_history_events.c.command_id, func.count())
            .where(workflow_history_events.c.command_id.is_not(None))
            .group_by(workflow_history_events.c.command_id)
        ).all()
        sequences = conn.execute(
            select(workflow_commands.c.instance_id, workflow_commands.c.command_sequence)
        ).all()
    assert len(per_command) == len(pairs) and {n for _, n in per_command} == {1}
    by_instance: dict[str, list[int]] = defaultdict(list)
    for instance, sequence in sequences:
        by_instance[instance].append(sequence)
    assert set(by_instance) == {instance_id(sql_store, wf) for wf in workflows}
    for numbers in by_instance.values():
        assert sorted(numbers) == list(range(1, KEYS + 1)), f"seed {seed}"


# -- (c) crashes: a lost response, and a writer killed inside its transaction ------------------------


def wait_until(condition: Any, what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


@pytest.mark.parametrize("kind", ["signal", "update"])
def test_retry_after_a_response_lost_to_sigkill_returns_the_committed_receipt_and_writes_nothing(
    db_url: str, sql_store: SqlStore, observer: Engine, kind: str
) -> None:
    service = AdmissionService(sql_store)
    run_id = service.start_run(NS, "wf-a").run_id
    step = {"kind": kind, "ns": NS, "wf": "wf-a", "name": "approve", "args": {"n": 1}, "key": f"lost-{kind}"}
    never, results = CTX.Event(), CTX.Queue()
    worker = CTX.Process(target=_admit_then_hang, args=(db_url, step, never, results))
    with running(worker):
        wait_until(lambda: commands_for(observer, step) or not worker.is_alive(), "the committed row")
        assert worker.is_alive(), collect(results, 1)
        worker.kill()
        worker.join(WAIT)
    assert worker.exitcode == -signal.SIGKILL
    assert results.empty()  # the answer really was lost

    [row] = commands_for(observer, step)
    before = table_counts(observer)
    # The retry, from this (another) process.
    again = (service.admit_signal if kind == "signal" else service.admit_update)(
        NS, "wf-a", "approve", {"n": 1}, request_id=step["key"]
    )
    assert again.retained and again.intent_verified
    assert (again.command_id, again.run_id, again.received_at, again.command_sequence) == (
        row["id"],
        row["run_id"],
        aware(row["created_at"]),
        row["command_sequence"],
    )
    assert again.run_id == run_id
    if kind == "update":
        with observer.connect() as conn:
            update_id = conn.execute(
                select(workflow_updates.c.id).where(workflow_updates.c.command_id == row["id"])
            ).scalar_one()
        assert (again.update_id, again.update_status) == (update_id, "accepted")
    assert table_counts(observer) == before
    assert commands_for(observer, step) == [row]


@pytest.mark.parametrize(
    ("kind", "block_at_call"),
    [("signal", 1), ("update", 2)],
    ids=["signal-killed-before-writing", "update-killed-after-writing-the-command-row"],
)
def test_writer_killed_inside_its_transaction_commits_nothing_and_releases_the_lock(
    db_url: str, sql_store: SqlStore, observer: Engine, kind: str, block_at_call: int
) -> None:
    service = AdmissionService(sql_store)
    run_id = service.start_run(NS, "wf-a").run_id
    step = {"kind": kind, "ns": NS, "wf": "wf-a", "name": "approve", "args": {"n": 1}, "key": f"crash-{kind}"}
    before = table_counts(observer)
    inside, never, go, calling, results = CTX.Event(), CTX.Event(), CTX.Event(), CTX.Event(), CTX.Queue()
    holder = CTX.Process(
        target=_admit_blocking_inside_the_lock, args=(db_url, step, block_at_call, inside, never, results)
    )
    retrier = CTX.Process(target=_admit_when_told, args=(db_url, step, go, calling, results))
    with running(holder, retrier):
        assert inside.wait(WAIT), collect(results, 1)
        # The holder is inside its transaction, under the admission lock.
        go.set()
        assert calling.wait(WAIT), collect(results, 1)
        time.sleep(0.5)
        # The retry waits on the lock; it must not be answered while the holder lives.
        assert results.empty(), collect(results, 1)
        assert holder.is_alive()
        holder.kill()
        holder.join(WAIT)
        # The killed writer's lock is released: the waiting retry now completes
        # (were it stuck, SQLite's 30 s busy timeout would fail it).
        [report] = collect(results, 1)
        retrier.join(WAIT)
    assert holder.exitcode == -signal.SIGKILL and retrier.exitcode == 0

    answer = report["answer"]
    assert (answer["retained"], answer["run_id"], answer["command_sequence"]) == (False, run_id, 1)
    rows = commands_for(observer, step)
    assert [r["id"] for r in rows] == [answer["command_id"]]
    assert (
        count_rows(observer, workflow_history_events, workflow_history_events.c.command_id == rows[0]["id"])
        == 1
    )
    after = table_counts(observer)
    # Exactly the retry's writes: its command, its event and, for an update, the update.
    assert after == {
        **before,
        "workflow_commands": before["workflow_commands"] + 1,
        "workflow_updates": before["workflow_updates"] + (kind == "update"),
        "workflow_history_events": before["workflow_history_events"] + 1,
    }
