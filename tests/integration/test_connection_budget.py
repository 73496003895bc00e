"""The connection budget: one store never holds more connections than its budget, counted for real.

Connections are counted as the database sees them: every DBAPI connection
the store's engine makes (its ``connect`` event) and every one closed (the
pool's ``close`` and ``close_detached`` events, or the connection object
collected); on PostgreSQL also the server's own sessions of the database
(``pg_stat_activity``), sampled from another connection while the load
runs.  The load is many threads (or asyncio tasks) admitting, retrying and
reading on one store, far more of them than the budget.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
import weakref
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, event

import admission.sql._connections
from admission.aio import AsyncAdmissionService, AsyncStore, run_sync
from admission.errors import InputError
from admission.receipts import AdmissionService, Decision
from admission.sql import (
    DEFAULT_CONNECTIONS,
    SqlJobStore,
    SqlStore,
    SqlWorkerStore,
    create_admission_engine,
    create_async_admission_engine,
    create_awaited_engine,
)
from tests.support.backends import PostgresPool

NS = "budget"
ARGS = {"n": 1}


class Census:
    """The connections an engine holds: made minus closed, and the most held at once; on
    PostgreSQL also the server process of each connection it made."""

    def __init__(self, engine: Engine) -> None:
        self._mutex = threading.Lock()
        self._open: set[int] = set()
        self._pids: list[int] = []
        self.made = 0
        self.peak = 0
        event.listen(engine, "connect", self._connected)
        event.listen(engine, "close", self._closed)
        event.listen(engine, "close_detached", lambda dbapi: self._gone(id(dbapi)))

    def _connected(self, dbapi: Any, _record: object) -> None:
        key = id(dbapi)
        # psycopg's connection, or the async adapter's around it.
        info = getattr(getattr(dbapi, "_connection", dbapi), "info", None)
        with self._mutex:
            if info is not None and hasattr(info, "backend_pid"):
                self._pids.append(info.backend_pid)
            self.made += 1
            self._open.add(key)
            self.peak = max(self.peak, len(self._open))
        # A connection dropped without a close still ends when it is collected (one that cannot
        # be weakly referenced is counted out by its close event alone).
        with suppress(TypeError):
            weakref.finalize(dbapi, self._gone, key)

    def _closed(self, dbapi: Any, _record: object) -> None:
        self._gone(id(dbapi))

    def _gone(self, key: int) -> None:
        with self._mutex:
            self._open.discard(key)

    @property
    def held(self) -> int:
        with self._mutex:
            return len(self._open)

    @property
    def pids(self) -> list[int]:
        """The server processes of every connection the engine made (PostgreSQL)."""
        with self._mutex:
            return list(self._pids)


class Sessions:
    """The server's sessions of one engine, sampled from an admin connection until stopped.

    Only the engine's own server processes count: a session the test's fixtures closed just
    before (creating or migrating the database) is listed until its backend has exited, and on
    a busy machine that can take a while."""

    def __init__(self, pool: PostgresPool, url: str, census: Census) -> None:
        import psycopg

        server = pool.start()
        self._census = census
        self._database = url.rsplit("/", 1)[1]
        self._admin = psycopg.connect(**server.conninfo("postgres"), autocommit=True)
        self._stop = threading.Event()
        self.samples: list[int] = []
        self._thread = threading.Thread(target=self._sample)

    def _sample(self) -> None:
        query = "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND pid = ANY(%s)"
        while not self._stop.is_set():
            found = self._admin.execute(query, (self._database, self._census.pids)).fetchone()
            (count,) = found  # type: ignore[misc]
            self.samples.append(int(count))
            self._stop.wait(0.002)

    def __enter__(self) -> Sessions:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)
        self._admin.close()


@contextmanager
def _sessions(pool: PostgresPool, url: str, postgres: bool, census: Census) -> Iterator[Sessions | None]:
    if not postgres:
        yield None
        return
    with Sessions(pool, url, census) as sessions:
        yield sessions


@pytest.fixture(autouse=True)
def _no_replanning(monkeypatch: pytest.MonkeyPatch) -> None:
    # A reader replaced on schedule (REPLAN_AFTER) closes its session and opens another: the
    # client holds no more, but the server lists the old one until its backend has exited,
    # which would blur pg_stat_activity's count.  The load here stays below the first quota.
    monkeypatch.setattr(admission.sql._connections, "REPLAN_AFTER", (10**9,))


def _load(service: AdmissionService, workflows: list[str], thread: int) -> list[Decision]:
    decisions = []
    for i in range(6):
        workflow = workflows[(thread + i) % len(workflows)]
        key = f"t{thread}-{i}"
        decisions.append(service.admit_signal(NS, workflow, "n", ARGS, request_id=key).decision)
        decisions.append(service.admit_signal(NS, workflow, "n", ARGS, request_id=key).decision)
        assert service.receipt(NS, workflow, "signal", key) is not None
        if i % 3 == 0:
            service.history(NS, workflow)  # a pooled read
    return decisions


@pytest.mark.parametrize("given", ["default", "url"])
def test_32_threads_admitting_and_retrying_never_hold_more_connections_than_the_budget(
    db_url: str, postgres_pool: PostgresPool, given: str
) -> None:
    url = db_url if given == "default" else f"{db_url}?admission_connections=3"
    budget = DEFAULT_CONNECTIONS if given == "default" else 3
    engine = create_admission_engine(url)
    census = Census(engine)
    store = SqlStore(engine)
    assert store.connections == budget
    service = AdmissionService(store)
    workflows = [f"wf-{n}" for n in range(4)]
    for workflow in workflows:
        service.start_run(NS, workflow)
    errors: list[BaseException] = []
    decisions: list[Decision] = []
    start = threading.Barrier(32)

    def run(thread: int) -> None:
        try:
            start.wait(30)
            decisions.extend(_load(service, workflows, thread))
        except BaseException as exc:  # reported below, in the test's thread
            errors.append(exc)

    try:
        with _sessions(postgres_pool, db_url, store.postgres, census) as sessions:
            threads = [threading.Thread(target=run, args=(n,)) for n in range(32)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(300)
        assert errors == []
        assert decisions.count(Decision.FRESH) == decisions.count(Decision.RETAINED) == 32 * 6
        # The load used more than one connection at once, and never more than the budget.
        assert 2 <= census.peak <= budget
        if sessions is not None:
            assert sessions.samples and 1 <= max(sessions.samples) <= budget
    finally:
        store.dispose()
    assert census.held == 0


def test_40_tasks_on_the_async_store_never_hold_more_connections_than_the_budget(
    db_url: str, postgres_pool: PostgresPool
) -> None:
    async def main() -> tuple[int, list[int] | None]:
        # As open_store makes it, with the census listening before the first connection.
        engine = create_awaited_engine(f"{db_url}?admission_connections=4")
        census = Census(engine)
        sync = await run_sync(SqlStore, engine)
        assert sync.connections == 4
        store = AsyncStore(sync)
        service = AsyncAdmissionService(store)
        workflows = [f"wf-{n}" for n in range(4)]
        for workflow in workflows:
            await service.start_run(NS, workflow)

        async def one(task: int) -> None:
            for i in range(4):
                workflow, key = workflows[(task + i) % len(workflows)], f"a{task}-{i}"
                first = await service.admit_signal(NS, workflow, "n", ARGS, request_id=key)
                again = await service.admit_signal(NS, workflow, "n", ARGS, request_id=key)
                assert first.decision is Decision.FRESH and again.decision is Decision.RETAINED
                assert again.command_id == first.command_id

        try:
            with _sessions(postgres_pool, db_url, sync.postgres, census) as sessions:
                await asyncio.gather(*(one(task) for task in range(40)))
        finally:
            await store.dispose()
        return census.peak, None if sessions is None else sessions.samples

    peak, samples = asyncio.run(main())
    assert 1 <= peak <= 4
    if samples is not None:  # PostgreSQL: the server saw the engine's sessions, never more than 4
        assert samples and 1 <= max(samples) <= 4


def test_the_url_parameter_reaches_the_pool_and_never_the_driver(db_url: str) -> None:
    engine = create_admission_engine(f"{db_url}?admission_connections=5")
    try:
        assert engine.pool.size() == 5 and engine.pool._max_overflow == 0  # type: ignore[attr-defined]
        assert "admission_connections" not in engine.url.query
        with engine.connect():
            pass  # the driver accepted the URL it was given
    finally:
        engine.dispose()
    keyword = create_admission_engine(db_url, connections=2)
    assert keyword.pool.size() == 2
    keyword.dispose()
    awaited = create_awaited_engine(f"{db_url}?admission_connections=6")
    assert awaited.pool.size() == 6
    awaited.dispose()
    # The worker's and the job runner's stores take every connection from their engine's pool.
    for opened in (
        SqlWorkerStore.open(f"{db_url}?admission_connections=2"),
        SqlJobStore.open(db_url, connections=3),
    ):
        assert opened.engine.pool._max_overflow == 0  # type: ignore[attr-defined]
        assert opened.engine.pool.size() == (2 if isinstance(opened, SqlWorkerStore) else 3)
        opened.dispose()


def test_a_user_made_engine_keeps_its_own_pools_bound_and_its_stores_share_it(db_url: str) -> None:
    engine = create_admission_engine(db_url, pool_size=3, max_overflow=2)
    store, other = SqlStore(engine), SqlStore(engine)
    try:
        assert store.connections == other.connections == 5
        kept = store._kept  # type: ignore[attr-defined]
        assert kept.writers.cap + kept.readers.cap == 4
        # Two stores on one engine keep one set of connections: 4 of the 5, not 4 each.
        assert other._kept is kept  # type: ignore[attr-defined]
    finally:
        store.dispose()


@pytest.mark.parametrize("bad", ["0", "-1", "x", "2.5", "8&admission_connections=9"])
def test_a_bad_budget_in_the_url_is_refused_naming_the_field_and_opens_nothing(
    tmp_path: Path, bad: str
) -> None:
    path = tmp_path / "never.sqlite3"
    for make in (create_admission_engine, create_awaited_engine):
        with pytest.raises(InputError) as refused:
            make(f"sqlite:///{path}?admission_connections={bad}")
        assert refused.value.field == "connections"
    with pytest.raises(InputError) as refused:
        create_async_admission_engine(f"sqlite:///{path}?admission_connections={bad}")
    assert refused.value.field == "connections"
    with pytest.raises(InputError) as refused:
        SqlStore.open(f"sqlite:///{path}?admission_connections={bad}")
    assert refused.value.field == "connections"
    assert not path.exists()


@pytest.mark.parametrize("bad", [0, -3, "4", 2.0, True, None])
def test_a_bad_budget_keyword_is_refused_naming_the_field_and_opens_nothing(tmp_path: Path, bad: Any) -> None:
    path = tmp_path / "never.sqlite3"
    given: dict[str, Any] = {"connections": bad} if bad is not None else {"connections": 2, "pool_size": 4}
    with pytest.raises(InputError) as refused:
        SqlStore.open(f"sqlite:///{path}", **given)
    assert refused.value.field == "connections"
    with pytest.raises(InputError) as twice:
        create_admission_engine(f"sqlite:///{path}?admission_connections=2", connections=2)
    assert twice.value.field == "connections"
    assert not path.exists()


def test_a_budget_of_one_keeps_nothing_and_still_admits(db_url: str) -> None:
    store = SqlStore.open(db_url, connections=1)
    service = AdmissionService(store)
    try:
        workflow = f"wf-{uuid.uuid4()}"
        service.start_run(NS, workflow)
        first = service.admit_signal(NS, workflow, "n", ARGS, request_id="k")
        again = service.admit_signal(NS, workflow, "n", ARGS, request_id="k")
        assert (first.decision, again.decision) == (Decision.FRESH, Decision.RETAINED)
        assert store._kept.writers.count == store._kept.readers.count == 0  # type: ignore[attr-defined]
    finally:
        store.dispose()
