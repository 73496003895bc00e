"""Fixtures the integration tests share: a service and an engine over the database of ``db_url``,
and a PostgreSQL database (and store) for the tests that are about PostgreSQL alone."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

from admission.receipts import AdmissionService
from admission.sql import SqlStore, create_admission_engine
from tests.support.backends import PostgresPool, database_url


@pytest.fixture
def service(db_url: str) -> Iterator[AdmissionService]:
    """An :class:`AdmissionService` over a fresh database (SQLite or PostgreSQL, by ``db_url``)."""
    store = SqlStore.open(db_url)
    try:
        yield AdmissionService(store)
    finally:
        store.dispose()


@pytest.fixture
def engine(db_url: str) -> Iterator[Engine]:
    """An engine on the same database, to read what was stored directly."""
    engine = create_admission_engine(db_url)
    try:
        yield engine
    finally:
        engine.dispose()


@pytest.fixture
def pg_url(postgres_pool: PostgresPool, tmp_path: Path) -> str:
    """A fresh PostgreSQL database at the head revision, whatever ``ADMISSION_TEST_BACKEND`` says."""
    return database_url("postgresql", postgres_pool, tmp_path)


@pytest.fixture
def pg_store(pg_url: str) -> Iterator[SqlStore]:
    """A :class:`SqlStore` on :func:`pg_url`'s database."""
    store = SqlStore.open(pg_url)
    yield store
    store.dispose()
