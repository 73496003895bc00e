"""Test-run settings and the storage fixtures shared by every test module."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from admission.receipts import MemoryStore, Store
from admission.sql import SqlStore, create_awaited_engine
from tests.support.aio import ASYNC, AwaitedService, backend_url_for, base_backend, is_async_item, run_in_loop
from tests.support.backends import SQL_BACKENDS, PostgresPool, database_url, open_store
from tests.support.jobkit import JobStores

# "ci" runs more examples than a developer's default run, derandomised so a
# failure on CI reproduces; HYPOTHESIS_PROFILE picks another.
settings.register_profile(
    "ci",
    max_examples=400,
    derandomize=True,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", max_examples=100, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))


def pytest_configure(config: pytest.Config) -> None:
    """Register the marker of the suites that also run on async stores."""
    config.addinivalue_line(
        "markers",
        "async_stores(*backends): the suite also runs on async stores (memory-async, sqlite-async, "
        "postgresql-async; tests/support/aio.py); backends, if given, limit which",
    )
    config.addinivalue_line(
        "markers",
        "extra: long; left out of the default run and run by ADMISSION_TEST_SET=extra (CI's own step)",
    )


STORE_VARIANTS = ["memory", *SQL_BACKENDS, *(b + ASYNC for b in ["memory", *SQL_BACKENDS])]
"""The receipt store's variants: memory and each SQL backend, then each through the async service."""

BACKEND_VARIANTS = ["memory", *SQL_BACKENDS, *(b + ASYNC for b in SQL_BACKENDS)]
"""A port's variants: memory and each SQL backend, then each SQL backend on an asyncio engine."""


TEST_SET = os.environ.get("ADMISSION_TEST_SET", "default")
if TEST_SET not in ("default", "extra"):
    raise RuntimeError(f"ADMISSION_TEST_SET must be default or extra, not {TEST_SET!r}")
"""``extra`` runs only what the default run leaves out to stay short: the tests marked ``extra``
(the soak, the migration and upgrade suites) and the async variants that a suite's
``async_stores(...)`` does not name.  CI runs them as a step of their own (.ci/run)."""


def _extra(item: pytest.Item) -> bool:
    return item.get_closest_marker("extra") is not None or (is_async_item(item) and _async_left_out(item))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Keep the async variants only in the suites marked ``async_stores``, on the backends it names;
    leave the extra tests to ``ADMISSION_TEST_SET=extra``, which runs only them."""
    if TEST_SET == "extra":
        dropped = [i for i in items if not _extra(i)]
    else:
        dropped = [i for i in items if _extra(i) or (is_async_item(i) and not _async_kept(i))]
    for item in items:
        if is_async_item(item):
            # A thread of the test's that reached the async store (a statement outside the
            # greenlet) fails the test, rather than a warning after it passed.
            item.add_marker(pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning"))
    if dropped:
        gone = set(map(id, dropped))
        config.hook.pytest_deselected(items=dropped)
        items[:] = [i for i in items if id(i) not in gone]


def _async_left_out(item: pytest.Item) -> bool:
    """An async variant of a marked suite on a backend its marker does not name."""
    return item.get_closest_marker("async_stores") is not None and not _async_kept(item)


def _async_kept(item: pytest.Item) -> bool:
    marker = item.get_closest_marker("async_stores")
    if marker is None:
        return False
    if not marker.args:
        return True
    params = item.callspec.params  # type: ignore[attr-defined]
    return any(base_backend(str(params.get(name, ""))) in marker.args for name in ("store", "backend"))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> bool | None:
    """Run an async variant whole inside ``admission.aio.run_sync`` on a loop of its own."""
    if not is_async_item(item):
        return None
    run_in_loop(item, nextitem)
    return True


@pytest.fixture(scope="session")
def postgres_pool() -> Iterator[PostgresPool]:
    """The session's PostgreSQL server, started on first use."""
    pool = PostgresPool()
    yield pool
    pool.stop()


@pytest.fixture(params=SQL_BACKENDS)
def sql_backend(request: pytest.FixtureRequest) -> str:
    """Each SQL backend the ``ADMISSION_TEST_BACKEND`` switch selects."""
    return str(request.param)


@pytest.fixture
def fresh_head(sql_backend: str, postgres_pool: PostgresPool, tmp_path: Path) -> dict[str, Any]:
    """A snapshot of a fresh database at the head: where each revision's new tables are declared."""
    from admission.sql import create_admission_engine
    from tests.support.snapshot import snapshot

    (tmp_path / "head").mkdir()
    engine = create_admission_engine(database_url(sql_backend, postgres_pool, tmp_path / "head"))
    try:
        return snapshot(engine)
    finally:
        engine.dispose()


@pytest.fixture
def db_url(sql_backend: str, postgres_pool: PostgresPool, tmp_path: Path) -> str:
    """A fresh database at the head revision on the backend under test."""
    return database_url(sql_backend, postgres_pool, tmp_path)


@pytest.fixture(params=STORE_VARIANTS)
def store(request: pytest.FixtureRequest, postgres_pool: PostgresPool, tmp_path: Path) -> Iterator[Store]:
    """The contract suite's store: the in-memory reference, and each selected SQL backend
    (and, for a suite marked ``async_stores``, each on the async path)."""
    name = str(request.param)
    with pytest.MonkeyPatch.context() as patch:
        if name.endswith(ASYNC) and hasattr(request.module, "AdmissionService"):
            # Every answer the suite checks comes through AsyncAdmissionService.
            patch.setattr(request.module, "AdmissionService", AwaitedService)
        if base_backend(name) == "memory":
            yield MemoryStore()
            return
        url = database_url(base_backend(name), postgres_pool, tmp_path)
        if name == f"sqlite{ASYNC}":
            # What admission.aio.open_store runs SQLite on: sqlite3 on the loop's thread,
            # the wait for another writer's lock awaited (the worker and job suites'
            # async variants run on aiosqlite, where every statement is awaited).
            engine = create_awaited_engine(url)
            yield SqlStore(engine)
            engine.dispose()
            return
        for opened in open_store(str(backend_url_for(name, url))):
            # An async variant's statements are awaited (tests/support/aio.py).
            assert opened.engine.dialect.is_async == name.endswith(ASYNC)
            yield opened


@pytest.fixture(params=BACKEND_VARIANTS)
def backend(request: pytest.FixtureRequest) -> str:
    """Each backend a port's contract suite runs on: memory, and each selected SQL backend."""
    return str(request.param)


@pytest.fixture
def backend_url(backend: str, postgres_pool: PostgresPool, tmp_path: Path) -> str | None:
    """A fresh database at the head revision for an SQL backend (an asyncio driver's URL
    for an async variant); ``None`` for memory."""
    if backend == "memory":
        return None
    return backend_url_for(backend, database_url(base_backend(backend), postgres_pool, tmp_path))


@pytest.fixture
def job_stores(backend: str, backend_url: str | None) -> Iterator[JobStores]:
    """The job contract suite's stores: the in-memory reference, and each selected SQL backend."""
    stores = JobStores(backend, backend_url)
    yield stores
    stores.close()


SUMMARY_LINES: list[str] = []
"""Lines a test module wants in the run's summary (for example, how many
state-machine steps ran per backend), so CI logs keep them."""


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Print the lines tests left in ``SUMMARY_LINES``."""
    for line in SUMMARY_LINES:
        terminalreporter.write_line(line)
