"""Kept and pooled connections after the server ended their sessions, on a real PostgreSQL.

A store's idle connections are checked before use without a round trip (the
socket of a session the server ended reads as closed) and replaced; a
disconnect that still reaches a call drops every idle kept connection at
once.  Here every session of the store is ended while it holds kept readers,
kept writers and pooled connections: by ``pg_terminate_backend``, and by the
server stopping at once (SIGQUIT) and starting again on the same port and
data directory.  Then the same process admits and retries from several
threads, and every failed call is counted.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator

import pytest

from admission.aio import AsyncAdmissionService, open_store
from admission.errors import StorageError
from admission.receipts import AdmissionService, Decision
from admission.sql import SqlStore, create_admission_engine, upgrade
from tests.support.backends import SQL_BACKENDS, PostgresPool
from tests.support.pgserver import PostgresServer

pytestmark = pytest.mark.skipif("postgresql" not in SQL_BACKENDS, reason="PostgreSQL is not in this run")

NS = "health"
ARGS = {"n": 1}
THREADS = 6


def _round(service: AdmissionService, workflows: list[str], label: str) -> tuple[int, int]:
    """Every thread admits, retries and reads one key per workflow; ``(answered, failed)`` calls."""
    answered, failed = [0], [0]
    mutex = threading.Lock()

    def call(action: Callable[[], object]) -> None:
        try:
            action()
            outcome = answered
        except StorageError:  # the retryable answer a lost connection gives (503 storage_unavailable)
            outcome = failed
        with mutex:
            outcome[0] += 1

    def run(thread: int) -> None:
        for workflow in workflows:
            key = f"{label}-{thread}"

            def admit(workflow: str = workflow, key: str = key) -> None:
                # Fresh, or retained when an earlier call of the same key was answered.
                decision = service.admit_signal(NS, workflow, "n", ARGS, request_id=key).decision
                assert decision in (Decision.FRESH, Decision.RETAINED)

            call(admit)
            call(admit)  # the retry
            call(lambda workflow=workflow, key=key: service.receipt(NS, workflow, "signal", key))

    threads = [threading.Thread(target=run, args=(n,)) for n in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    return answered[0], failed[0]


@pytest.fixture
def opened(postgres_pool: PostgresPool) -> Iterator[tuple[SqlStore, AdmissionService, list[str], str]]:
    url = postgres_pool.fresh_database()
    store = SqlStore.open(url)
    service = AdmissionService(store)
    workflows = [f"wf-{n}" for n in range(3)]
    for workflow in workflows:
        service.start_run(NS, workflow)
    try:
        yield store, service, workflows, url.rsplit("/", 1)[1]
    finally:
        store.dispose()


def _terminate_all(server: PostgresServer, database: str) -> int:
    """End every session of ``database`` (waiting until each has exited); how many there were."""
    import psycopg

    with psycopg.connect(**server.conninfo("postgres"), autocommit=True) as admin:
        rows = admin.execute(
            "SELECT pg_terminate_backend(pid, 30000) FROM pg_stat_activity"
            " WHERE datname = %s AND pid <> pg_backend_pid()",
            (database,),
        ).fetchall()
    assert all(ended for (ended,) in rows)
    return len(rows)


def test_after_every_session_is_terminated_the_next_admissions_and_retries_all_succeed(
    opened: tuple[SqlStore, AdmissionService, list[str], str], postgres_pool: PostgresPool
) -> None:
    store, service, workflows, database = opened
    assert _round(service, workflows, "warm") == (THREADS * 3 * 3, 0)
    kept = store._kept  # type: ignore[attr-defined]
    assert kept.writers.count >= 1 and kept.readers.count >= 1  # kept ones are in play
    assert _terminate_all(postgres_pool.start(), database) >= 2
    answered, failed = _round(service, workflows, "after")
    assert (answered, failed) == (THREADS * 3 * 3, 0)
    assert _round(service, workflows, "again") == (THREADS * 3 * 3, 0)


def test_after_every_session_of_the_async_store_is_terminated_its_next_calls_all_succeed(
    postgres_pool: PostgresPool,
) -> None:
    url = postgres_pool.fresh_database()
    database = url.rsplit("/", 1)[1]

    async def calls(service: AsyncAdmissionService, label: str) -> int:
        async def one(task: int) -> int:
            key, failed = f"{label}-{task}", 0
            for kind in ("admit", "retry", "read"):
                try:
                    if kind == "read":
                        assert await service.receipt(NS, "wf", "signal", key) is not None
                    else:
                        await service.admit_signal(NS, "wf", "n", ARGS, request_id=key)
                except StorageError:
                    failed += 1
            return failed

        return sum(await asyncio.gather(*(one(task) for task in range(12))))

    async def main() -> tuple[int, int]:
        store = await open_store(url)
        service = AsyncAdmissionService(store)
        try:
            await service.start_run(NS, "wf")
            warm = await calls(service, "warm")
            await asyncio.to_thread(_terminate_all, postgres_pool.start(), database)
            return warm, await calls(service, "after")
        finally:
            await store.dispose()

    assert asyncio.run(main()) == (0, 0)


def test_after_the_server_restarts_in_place_at_most_one_call_fails_then_all_succeed() -> None:
    server = PostgresServer().start()
    try:
        url = server.create_database("health")
        engine = create_admission_engine(url)
        upgrade(engine)
        engine.dispose()
        store = SqlStore.open(url)
        service = AdmissionService(store)
        workflows = [f"wf-{n}" for n in range(3)]
        try:
            for workflow in workflows:
                service.start_run(NS, workflow)
            assert _round(service, workflows, "warm") == (THREADS * 3 * 3, 0)
            server.restart()  # SIGQUIT: every session ends at once; then crash recovery and ready
            answered, failed = _round(service, workflows, "after")
            assert answered + failed == THREADS * 3 * 3 and failed <= 1
            assert _round(service, workflows, "again") == (THREADS * 3 * 3, 0)
        finally:
            store.dispose()
    finally:
        server.stop()
