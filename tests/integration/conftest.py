"""Fixtures the integration tests share: a service and an engine over the database of ``db_url``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import Engine

from admission.receipts import AdmissionService
from admission.sql import SqlStore, create_admission_engine


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
