"""The SQL stores on an async engine: many tasks on one store, cancellation, the engine's configuration.

The contract suites run on the async stores too (``tests/support/aio.py``);
these tests show what only the async path has: tasks that interleave on one
loop thread (each read borrows its own connection), a task cancelled while it
holds the admission lock, and the engine's URL mapping and SQLite guard.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import sqlite3
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import text

from admission.aio import (
    AsyncAdmissionService,
    AsyncDurableWorker,
    AsyncJobService,
    AsyncOutboxRelay,
    AsyncStore,
    open_job_store,
    open_store,
    open_worker_store,
    run_sync,
    wait,
)
from admission.errors import InputError, SchemaRevisionError, StorageError
from admission.jobs import Job
from admission.receipts import Decision
from admission.sql import (
    SqlStore,
    async_url,
    create_admission_engine,
    create_async_admission_engine,
)
from admission.sql._connections import REPLAN_AFTER
from admission.worker import Scope, record_outbox
from tests.support.backends import SQL_BACKENDS, sqlite_url

NS = "tenant-aio"
WORKFLOWS = [f"wf-{n}" for n in range(4)]
TASKS = 40
SCOPE = Scope.parse({"tenant": "t1", "account": "a1", "page": "p1", "form": "f1"})


@pytest.mark.parametrize("driver", ["default", "asyncio driver"])
def test_many_tasks_reading_and_admitting_on_one_async_store_get_their_own_answers(
    db_url: str, driver: str
) -> None:
    # SQLite's default runs sqlite3 on the loop's thread; its asyncio driver is aiosqlite
    # (PostgreSQL has one path: psycopg's AsyncConnection).
    url = db_url if driver == "default" else async_url(db_url)

    async def main() -> None:
        store = await open_store(url)
        service = AsyncAdmissionService(store)
        try:
            runs = {wf: (await service.start_run(NS, wf)).run_id for wf in WORKFLOWS}

            async def one(n: int) -> tuple[int, str, str]:
                wf, key = WORKFLOWS[n % len(WORKFLOWS)], f"key-{n}"
                kind = service.admit_signal if n % 2 else service.admit_update
                first = await kind(NS, wf, "pay", {"n": n}, request_id=key)
                receipt = await service.receipt(NS, wf, "signal" if n % 2 else "update", key)
                again = await kind(NS, wf, "pay", {"n": n}, request_id=key)
                changed = await kind(NS, wf, "pay", {"n": n + 1000}, request_id=key)
                assert first.decision is Decision.FRESH and first.run_id == runs[wf]
                assert receipt is not None and receipt.command_id == first.command_id
                assert receipt.request_id == key and receipt.retained
                assert again.decision is Decision.RETAINED and again.command_id == first.command_id
                assert changed.decision is Decision.CONFLICT and changed.conflict == ("arguments",)
                return n, wf, first.command_id

            answers = await asyncio.gather(*(one(n) for n in range(TASKS)))
            assert len({command for _, _, command in answers}) == TASKS
            for wf in WORKFLOWS:
                history = await service.history(NS, wf)
                mine = {command for _, w, command in answers if w == wf}
                assert {e.command_id for e in history if e.command_id is not None} == mine
            readers = store.sync._kept.readers  # type: ignore[attr-defined]
            if not store.sync.engine.dialect.is_async:  # type: ignore[attr-defined]
                # sqlite3 on the loop's thread: a read never yields, so one connection serves all
                # (the idle writer, or a reader while a task's transaction holds the writer).
                assert readers.count <= 1
                return
            # The reads overlapped (more than one connection was lent at once), within the bound.
            assert 2 <= readers.count <= readers.cap
            if not store.sync.postgres:  # type: ignore[attr-defined]
                return  # SQLite keeps no plan made for the tables as they were (REPLAN_AFTER)
            # One task reading on and on (on a store of its own, whose reads all take one
            # connection): that connection is replaced when its statements are due to be planned
            # again (REPLAN_AFTER), and the answers stay right.
            reader = await open_store(url)
            reading = AsyncAdmissionService(reader)
            try:
                for n in range(REPLAN_AFTER[0] + 10):
                    key = f"key-{n % TASKS}"
                    kind = "signal" if n % TASKS % 2 else "update"
                    found = await reading.receipt(NS, WORKFLOWS[n % TASKS % len(WORKFLOWS)], kind, key)
                    assert found is not None and found.command_id == answers[n % TASKS][2]
                    if n == 0:
                        first = [held.connection for held in reader.sync._kept.readers.free]  # type: ignore[attr-defined]
                [held] = reader.sync._kept.readers.free  # type: ignore[attr-defined]
                assert len(first) == 1 and held.connection is not first[0]
            finally:
                await reader.dispose()
        finally:
            await store.dispose()

    asyncio.run(main())


def test_a_task_cancelled_inside_the_lock_rolls_back_and_releases_it(db_url: str) -> None:
    async def main() -> None:
        store = await open_store(db_url)
        service = AsyncAdmissionService(store)
        assert isinstance(store.sync, SqlStore)
        locked = asyncio.Event()

        def hold() -> None:
            now = datetime(2026, 12, 1, tzinfo=UTC)
            # The first lock of a new instance inserts its row inside the transaction.
            with store.sync.locked(NS, "wf-held", created_at=now, new_id="held-instance"):
                locked.set()
                wait(asyncio.Event().wait())  # until cancelled

        try:
            holder = asyncio.create_task(run_sync(hold))
            await locked.wait()
            holder.cancel()
            with pytest.raises(asyncio.CancelledError):
                await holder
            assert await store.find_instance(NS, "wf-held") is None
            # The lock is free: the same instance is admitted at once.
            await service.start_run(NS, "wf-held")
            answer = await service.admit_signal(NS, "wf-held", "go", [], request_id="k")
            assert answer.decision is Decision.FRESH
        finally:
            await store.dispose()

    asyncio.run(main())


def test_the_async_engine_takes_the_same_urls_and_refuses_the_same_ones(tmp_path: Path) -> None:
    assert async_url("sqlite:///a.db") == "sqlite+aiosqlite:///a.db"
    assert async_url("postgres://u:secret@h/db") == "postgresql+psycopg_async://u:secret@h/db"
    assert async_url("postgresql+psycopg_async://h/db") == "postgresql+psycopg_async://h/db"
    with pytest.raises(InputError) as refused:
        create_async_admission_engine("postgresql+pg8000://u:hunter2@h/db")
    assert refused.value.field == "url" and "hunter2" not in str(refused.value)
    with pytest.raises(InputError) as unparsed:
        create_async_admission_engine("not a url")
    assert unparsed.value.field == "url"
    with pytest.raises(InputError) as schema:
        create_async_admission_engine(f"sqlite:///{tmp_path / 'x.db'}", schema="tenant")
    assert schema.value.field == "schema"
    with pytest.raises(StorageError, match="in-memory"):
        create_async_admission_engine("sqlite://")


def test_the_async_engine_on_sqlite_is_configured_as_the_sync_one(tmp_path: Path) -> None:
    async def main() -> None:
        url = f"sqlite:///{tmp_path / 'pragmas.sqlite3'}"
        engine = create_async_admission_engine(url)
        try:
            async with engine.connect() as conn:
                values = [
                    (await conn.execute(text(f"PRAGMA {name}"))).scalar()
                    for name in ("journal_mode", "synchronous", "foreign_keys", "busy_timeout")
                ]
            assert values == ["wal", 2, 1, 30_000]
        finally:
            await engine.dispose()

    asyncio.run(main())


def test_an_unmigrated_database_is_refused_on_open(tmp_path: Path) -> None:
    async def main() -> None:
        with pytest.raises(SchemaRevisionError):
            await open_store(f"sqlite:///{tmp_path / 'empty.sqlite3'}")

    asyncio.run(main())


@pytest.mark.skipif("sqlite" not in SQL_BACKENDS, reason="ADMISSION_TEST_BACKEND excludes SQLite")
def test_a_sqlite_file_replaced_under_an_async_store_is_refused(tmp_path: Path) -> None:
    db_url = sqlite_url(tmp_path)
    path = Path(db_url.removeprefix("sqlite:///"))
    copy = tmp_path / "copy.sqlite3"
    engine = create_admission_engine(db_url)
    engine.dispose()
    shutil.copyfile(path, copy)

    async def main() -> None:
        store = await open_store(db_url)
        service = AsyncAdmissionService(store)
        try:
            await service.start_run(NS, "wf")
            await service.admit_signal(NS, "wf", "go", [], request_id="before")
            os.replace(copy, path)
            with pytest.raises(StorageError, match="no longer the file"):
                await service.admit_signal(NS, "wf", "go", [], request_id="after")
            with pytest.raises(StorageError):
                await service.receipt(NS, "wf", "signal", "before")
        finally:
            await store.dispose()

    asyncio.run(main())


def test_the_worker_intake_relay_and_job_service_on_async_stores(db_url: str, tmp_path: Path) -> None:
    async def main() -> None:
        receipts: AsyncStore = await open_store(db_url)
        workers = await open_worker_store(db_url)
        jobs = AsyncJobService(await open_job_store(db_url), clock=lambda: 1000.0)
        try:
            worker = await AsyncDurableWorker.open(workers, SCOPE, queue="aio", file_lock=False)
            record = {**SCOPE.as_dict(), "source_key": "r-1", "payload": {"x": 1}}
            accepted = await asyncio.gather(*(worker.accept(record) for _ in range(5)))
            assert sorted(intake.outcome for intake in accepted) == ["accepted"] + ["duplicate"] * 4
            assert len({intake.write_id for intake in accepted}) == 1
            assert (await worker.find("r-1")).write_id == accepted[0].write_id

            service = AsyncAdmissionService(receipts)
            await service.start_run(NS, "wf-outbox")
            record_two = {**SCOPE.as_dict(), "source_key": "r-2", "payload": {"x": 2}}
            await run_sync(
                record_outbox,
                receipts.sync,
                None,
                NS,
                "wf-outbox",
                target="target-a",
                source_key="r-2",
                content=record_two,
            )
            relay = AsyncOutboxRelay(receipts, worker, target="target-a")
            report = await relay.pump()
            assert report.accepted == 1 and report.read >= 1
            assert (await relay.pump()).accepted == 0
            assert (await worker.find("r-2")).source_key == "r-2"

            batch = [
                Job("j1", "s1", "count", {"n": 1}),
                Job("j2", "s1", "count", {"n": 2}, depends_on=("j1",)),
            ]
            results = await jobs.enqueue_all(batch)
            assert [(r.job_id, r.outcome) for r in results] == [("j1", "enqueued"), ("j2", "enqueued")]
            assert [r.outcome for r in await jobs.enqueue_all(batch)] == ["duplicate", "duplicate"]
            claims = await asyncio.gather(*(jobs.claim_next("s1") for _ in range(3)))
            won = [c for c in claims if c is not None and c.outcome == "claimed"]
            assert [c.job_id for c in won] == ["j1"]  # j2 waits for j1; j1 is claimed once
            assert (await jobs.status("j1")).state == "running"
            snapshot = await jobs.snapshot("s1")
            shown = [(j["job_id"], j["state"]) for j in snapshot["jobs"]]
            assert shown == [("j1", "running"), ("j2", "blocked")]
        finally:
            await receipts.dispose()
            await run_sync(workers.dispose)
            await jobs.dispose()

    asyncio.run(main())


@pytest.mark.skipif("sqlite" not in SQL_BACKENDS, reason="ADMISSION_TEST_BACKEND excludes SQLite")
def test_the_example_of_docs_async_runs() -> None:
    page = Path(__file__).resolve().parents[2] / "docs" / "async.md"
    [block] = re.findall(r"^```python\n(.*?)^```", page.read_text(encoding="utf-8"), re.MULTILINE | re.DOTALL)
    exec(compile(block, "docs/async.md", "exec"), {"__name__": "docs.async"})


def test_a_sqlite_writer_waiting_for_another_writers_lock_leaves_the_loop_free(tmp_path: Path) -> None:
    # SQLite's default async path runs sqlite3 on the loop's thread: SQLite's own busy
    # handler would hold the loop for as long as another writer holds the lock.  The wait
    # is awaited instead: other tasks run, and the admission goes through once the lock is free.
    url = sqlite_url(tmp_path)
    other = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None)

    async def main() -> None:
        store = await open_store(url)
        service = AsyncAdmissionService(store)
        try:
            await service.start_run(NS, "wf")
            other.execute("BEGIN IMMEDIATE")  # another writer holds the lock
            admitting = asyncio.create_task(service.admit_signal(NS, "wf", "go", {}, request_id="k"))
            ticks = 0
            while ticks < 20:
                await asyncio.sleep(0.005)
                ticks += 1
                # A loop held by the busy handler would run no tick until the admission gave up.
                assert not admitting.done()
            other.execute("COMMIT")
            answer = await admitting
            assert answer.decision is Decision.FRESH
            assert (await service.receipt(NS, "wf", "signal", "k")) is not None
        finally:
            await store.dispose()

    try:
        asyncio.run(main())
    finally:
        other.close()
