"""The caller's transaction, in the forms engines hold it (guide §6): a Connection, a Session, and
through the async service an AsyncConnection and an AsyncSession.

Admission joins the caller's transaction and neither commits nor rolls it
back: what the caller rolls back leaves nothing, what it commits keeps
everything together with the caller's own rows, and nothing is seen by
anyone else before the caller's commit.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Column, Engine, MetaData, String, Table, func, insert, select, update
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, create_async_engine
from sqlalchemy.orm import Session

from admission.aio import (
    AsyncAdmissionService,
    AsyncDurableWorker,
    caller_engine,
    open_store,
    open_worker_store,
    run_sync,
)
from admission.errors import InputError
from admission.receipts import Admission, AdmissionService, BatchCommand, Decision, MemoryStore
from admission.sql import (
    SqlStore,
    SqlWorkerStore,
    create_admission_engine,
    create_async_admission_engine,
    metadata,
)
from admission.worker import DurableWorker, Scope
from tests.support.backends import SQL_BACKENDS, PostgresPool, database_url, sqlite_url

NS, WF = "tenant-a", "order-42"
SCOPE = Scope.parse({"tenant": "t1", "account": "a1", "page": "p1", "form": "f1"})

host = MetaData()
orders = Table("engine_orders", host, Column("id", String(36), primary_key=True), Column("state", String(32)))
"""A table of the engine's own, in the same database."""


def counts(engine: Engine) -> dict[str, int]:
    """Rows in every admission table and the engine's own, read on a connection of their own."""
    tables = [*metadata.sorted_tables, orders]
    with engine.connect() as conn:
        return {t.name: int(conn.execute(select(func.count()).select_from(t)).scalar_one()) for t in tables}


Execute = Callable[[Any], object]

GROWN = {
    "workflow_commands": 2,
    "workflow_updates": 1,
    "workflow_history_events": 4,
    "worker_records": 1,
    "worker_events": 1,
    "engine_orders": 1,
}
"""What one engine step commits: two commands, one update, four events (received, accepted,
applied, completed), one worker record and its event, and the caller's own row."""


@contextmanager
def caller_transaction(form: str, store: SqlStore, *, commit: bool) -> Iterator[tuple[object, Execute]]:
    """The caller's transaction in ``form``, begun as an engine would (deferred on SQLite), ended by
    the caller: committed or rolled back.  Yields the handle admission gets and the caller's execute."""
    if form == "connection":
        with store.engine.connect() as conn:
            transaction = conn.begin()
            yield conn, conn.execute
            assert transaction.is_active, "admission ended the caller's transaction"
            transaction.commit() if commit else transaction.rollback()
    else:
        with Session(store.engine) as session:
            yield session, session.execute
            assert session.in_transaction(), "admission ended the caller's transaction"
            session.commit() if commit else session.rollback()


@pytest.fixture
def store(db_url: str) -> Iterator[SqlStore]:
    store = SqlStore.open(db_url)
    host.create_all(store.engine)
    yield store
    store.dispose()


@pytest.mark.parametrize("commit", [True, False], ids=["commit", "rollback"])
@pytest.mark.parametrize("form", ["connection", "session"])
def test_admission_inside_the_callers_transaction_ends_as_the_caller_ends_it(
    store: SqlStore, form: str, commit: bool
) -> None:
    service = AdmissionService(store)
    worker = DurableWorker(SqlWorkerStore(store.engine), SCOPE, file_lock=False)
    service.start_run(NS, WF)
    before = counts(store.engine)
    with caller_transaction(form, store, commit=commit) as (handle, execute):
        execute(insert(orders).values(id="o-42", state="new"))
        signal = service.admit_signal(NS, WF, "ship", ["dhl"], request_id="ship-42", connection=handle)
        approve = service.admit_update(
            NS, WF, "approve", {"n": 1}, request_id="approve-42", connection=handle
        )
        assert (signal.decision, approve.decision) == (Decision.FRESH, Decision.FRESH)
        assert signal.command_id is not None and approve.update_id is not None
        service.apply_signal(NS, WF, signal.command_id, connection=handle)
        # The caller writes on after admission: its transaction is still open and still its own.
        execute(update(orders).where(orders.c.id == "o-42").values(state="approved"))
        done = service.complete_update(NS, WF, approve.update_id, {"approved": True}, connection=handle)
        assert done.http_status == 200
        worker.accept({**SCOPE.as_dict(), "source_key": "o-42", "payload": {"n": 1}}, connection=handle)
        # Nothing is committed before the caller commits: another connection sees the old state.
        assert counts(store.engine) == before
        assert service.receipt(NS, WF, "signal", "ship-42") is None
    after = counts(store.engine)
    retry = service.admit_update(NS, WF, "approve", {"n": 1}, request_id="approve-42")
    if not commit:
        assert after == before
        assert retry.decision is Decision.FRESH  # the key stayed free
        return
    assert {name: after[name] - before[name] for name in after if after[name] != before[name]} == GROWN
    assert retry.retained and retry.result == {"approved": True}
    with store.engine.connect() as conn:
        assert conn.execute(select(orders.c.state)).scalar_one() == "approved"
    kinds = [e.event_type for e in service.history(NS, WF)]
    assert kinds[-4:] == ["SignalReceived", "UpdateAccepted", "SignalApplied", "UpdateCompleted"]


def test_a_handle_that_is_no_transaction_is_refused_naming_connection_and_writes_nothing(
    store: SqlStore, db_url: str, sql_backend: str, postgres_pool: PostgresPool, tmp_path: Path
) -> None:
    service = AdmissionService(store)
    service.start_run(NS, WF)
    worker = DurableWorker(SqlWorkerStore(store.engine), SCOPE, file_lock=False)
    before = counts(store.engine)
    (tmp_path / "other").mkdir()
    elsewhere = create_admission_engine(database_url(sql_backend, postgres_pool, tmp_path / "other"))
    # On PostgreSQL an engine in autocommit gives a session no transaction at all (admission's
    # SQLite engine begins one whatever the isolation level says).
    autocommit = create_admission_engine(db_url, isolation_level="AUTOCOMMIT")
    refused: list[tuple[str, object]] = [("object", object())]
    with store.engine.connect() as idle, store.engine.connect() as loose:
        loose.execution_options(isolation_level="AUTOCOMMIT")
        loose.begin()
        refused += [("connection outside a transaction", idle), ("connection in autocommit", loose)]
        with Session(elsewhere) as foreign, Session() as unbound, Session(autocommit) as unguarded:
            refused += [("session on another database", foreign), ("session without a bind", unbound)]
            if sql_backend == "postgresql":
                refused.append(("session on an engine in autocommit", unguarded))
            for what, handle in refused:
                with pytest.raises(InputError) as info:
                    service.admit_signal(NS, WF, "go", [], request_id="k", connection=handle)
                assert info.value.field == "connection", what
            assert not foreign.in_transaction()
    elsewhere.dispose()
    autocommit.dispose()
    with pytest.raises(InputError) as info:
        worker.accept({**SCOPE.as_dict(), "source_key": "k", "payload": {}}, connection=object())
    assert info.value.field == "connection"
    assert counts(store.engine) == before


def test_an_async_session_given_to_the_synchronous_service_is_refused(store: SqlStore) -> None:
    async_engine = create_async_engine("sqlite+aiosqlite://")
    with pytest.raises(InputError, match="AsyncAdmissionService") as info:
        AdmissionService(store).admit_signal(NS, WF, "go", [], connection=AsyncSession(async_engine))
    assert info.value.field == "connection"


@pytest.mark.parametrize("commit", [True, False], ids=["commit", "rollback"])
def test_a_batch_inside_the_callers_transaction_ends_as_the_caller_ends_it(
    store: SqlStore, commit: bool
) -> None:
    service = AdmissionService(store)
    service.start_run(NS, WF)
    items = [BatchCommand("signal", NS, w, "go", [1], request_id="k") for w in (WF, "other", WF)]
    with caller_transaction("session", store, commit=commit) as (handle, _):
        first, elsewhere, retry = service.admit_many(items, connection=handle)
    assert isinstance(first, Admission) and isinstance(retry, Admission) and isinstance(elsewhere, Admission)
    assert (first.outcome, elsewhere.outcome, retry.retained) == ("received", "run_not_active", True)
    kept = service.receipt(NS, WF, "signal", "k")
    assert (kept is not None and kept.command_id == first.command_id) if commit else kept is None
    assert (service.receipt(NS, "other", "signal", "k") is not None) is commit


def test_a_memory_store_refuses_a_callers_transaction_naming_connection() -> None:
    service = AdmissionService(MemoryStore())
    service.start_run(NS, WF)
    with pytest.raises(InputError) as info:
        service.admit_signal(NS, WF, "go", [], connection=object())
    assert info.value.field == "connection"
    assert [e.event_type for e in service.history(NS, WF)] == ["RunStarted"]


@pytest.mark.skipif("sqlite" not in SQL_BACKENDS, reason="SQLite's write lock is the subject")
@pytest.mark.parametrize("read_first", [False, True], ids=["store.engine", "write_engine-read-first"])
def test_concurrent_sessions_on_sqlite_all_admit_once_they_hold_the_write_lock(
    tmp_path: Path, read_first: bool
) -> None:
    # A transaction that reads, and then writes after a rival's commit, fails as busy: SQLite
    # refuses to move its snapshot forward.  A Session on the store's engine begins deferred, so
    # admission must take the write lock before it reads; one on ``write_engine`` holds it from
    # its first statement, its own read included.  Every admission must succeed, exactly once.
    store = SqlStore.open(sqlite_url(tmp_path))
    host.create_all(store.engine)
    service = AdmissionService(store)
    service.start_run(NS, WF)
    threads, per_thread = 4, 15
    failures: list[BaseException] = []
    start = threading.Barrier(threads)

    def engine_loop(worker: int) -> None:
        start.wait()
        for n in range(per_thread):
            try:
                with Session(store.write_engine if read_first else store.engine) as session, session.begin():
                    if read_first:
                        session.execute(select(func.count()).select_from(orders)).scalar_one()
                    service.admit_signal(
                        NS, WF, "tick", [worker, n], request_id=f"{worker}-{n}", connection=session
                    )
                    session.execute(insert(orders).values(id=f"{worker}-{n}", state="seen"))
            except BaseException as exc:  # collected: the assertion below names them
                failures.append(exc)

    running = [threading.Thread(target=engine_loop, args=(w,)) for w in range(threads)]
    for thread in running:
        thread.start()
    for thread in running:
        thread.join()
    assert failures == []
    total = threads * per_thread
    assert counts(store.engine)["engine_orders"] == total
    commands = metadata.tables["workflow_commands"]
    with store.engine.connect() as conn:
        sequences = conn.execute(select(commands.c.command_sequence)).scalars().all()
    assert sorted(sequences) == list(range(1, total + 1))
    store.dispose()


# -- the async forms: an AsyncConnection and an AsyncSession, through AsyncAdmissionService ------------


@asynccontextmanager
async def async_caller_transaction(
    form: str, engine: AsyncEngine, *, commit: bool
) -> AsyncIterator[tuple[object, Callable[[Any], Awaitable[object]]]]:
    """:func:`caller_transaction` for the async forms, on an async engine over the store's database."""
    if form == "async-connection":
        async with engine.connect() as conn:
            transaction = await conn.begin()
            yield conn, conn.execute
            assert transaction.is_active, "admission ended the caller's transaction"
            await (transaction.commit() if commit else transaction.rollback())
    else:
        async with AsyncSession(engine) as session:
            yield session, session.execute
            assert session.in_transaction(), "admission ended the caller's transaction"
            await (session.commit() if commit else session.rollback())


@pytest.mark.parametrize("commit", [True, False], ids=["commit", "rollback"])
@pytest.mark.parametrize("form", ["async-connection", "async-session"])
def test_async_admission_inside_the_callers_transaction_ends_as_the_caller_ends_it(
    db_url: str, form: str, commit: bool
) -> None:
    async def main() -> None:
        store = await open_store(db_url)
        sync_store = store.sync
        assert isinstance(sync_store, SqlStore)
        await run_sync(host.create_all, sync_store.engine)
        # The caller's engine: for the connection, one of its own on the same URL (its
        # transactions begin deferred on SQLite); for the session, caller_engine's.
        own = create_async_admission_engine(db_url) if form == "async-connection" else caller_engine(store)
        engine = own
        service = AsyncAdmissionService(store)
        worker = await AsyncDurableWorker.open(await open_worker_store(db_url), SCOPE, file_lock=False)
        await service.start_run(NS, WF)
        before = await run_sync(counts, sync_store.engine)
        async with async_caller_transaction(form, engine, commit=commit) as (handle, execute):
            await execute(insert(orders).values(id="o-42", state="new"))
            signal = await service.admit_signal(
                NS, WF, "ship", ["dhl"], request_id="ship-42", connection=handle
            )
            approve = await service.admit_update(
                NS, WF, "approve", {"n": 1}, request_id="approve-42", connection=handle
            )
            assert (signal.decision, approve.decision) == (Decision.FRESH, Decision.FRESH)
            assert signal.command_id is not None and approve.update_id is not None
            await service.apply_signal(NS, WF, signal.command_id, connection=handle)
            await execute(update(orders).where(orders.c.id == "o-42").values(state="approved"))
            await service.complete_update(NS, WF, approve.update_id, {"approved": True}, connection=handle)
            await worker.accept(
                {**SCOPE.as_dict(), "source_key": "o-42", "payload": {"n": 1}}, connection=handle
            )
            assert await run_sync(counts, sync_store.engine) == before
        after = await run_sync(counts, sync_store.engine)
        retry = await service.admit_update(NS, WF, "approve", {"n": 1}, request_id="approve-42")
        if commit:
            assert {
                name: after[name] - before[name] for name in after if after[name] != before[name]
            } == GROWN
            assert retry.retained and retry.result == {"approved": True}
        else:
            assert after == before and retry.decision is Decision.FRESH
        await run_sync(worker.sync.store.dispose)
        await own.dispose()
        await store.dispose()

    asyncio.run(main())


def test_async_forms_outside_a_transaction_or_on_another_database_are_refused_naming_connection(
    db_url: str, sql_backend: str, postgres_pool: PostgresPool, tmp_path: Path
) -> None:
    (tmp_path / "other").mkdir()
    other_url = database_url(sql_backend, postgres_pool, tmp_path / "other")

    async def main() -> None:
        store = await open_store(db_url)
        service = AsyncAdmissionService(store)
        await service.start_run(NS, WF)
        elsewhere = create_async_admission_engine(other_url)
        history = await service.history(NS, WF)
        mine = caller_engine(store)
        async with mine.connect() as idle, AsyncSession(elsewhere) as foreign:
            for what, handle in [("connection outside a transaction", idle), ("session elsewhere", foreign)]:
                with pytest.raises(InputError) as info:
                    await service.admit_signal(NS, WF, "go", [], request_id="k", connection=handle)
                assert info.value.field == "connection", what
        assert await service.history(NS, WF) == history
        await elsewhere.dispose()
        await mine.dispose()
        await store.dispose()

    asyncio.run(main())
