"""Test-run settings and the storage fixtures shared by every test module."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from admission.receipts import MemoryStore, Store
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


@pytest.fixture(params=["memory", *SQL_BACKENDS])
def store(request: pytest.FixtureRequest, postgres_pool: PostgresPool, tmp_path: Path) -> Iterator[Store]:
    """The contract suite's store: the in-memory reference, and each selected SQL backend."""
    if request.param == "memory":
        yield MemoryStore()
        return
    yield from open_store(database_url(str(request.param), postgres_pool, tmp_path))


@pytest.fixture(params=["memory", *SQL_BACKENDS])
def backend(request: pytest.FixtureRequest) -> str:
    """Each backend a port's contract suite runs on: memory, and each selected SQL backend."""
    return str(request.param)


@pytest.fixture
def backend_url(backend: str, postgres_pool: PostgresPool, tmp_path: Path) -> str | None:
    """A fresh database at the head revision for an SQL backend; ``None`` for memory."""
    return None if backend == "memory" else database_url(backend, postgres_pool, tmp_path)


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
