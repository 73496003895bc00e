"""Backends for the storage tests: the in-memory store, SQLite and a real PostgreSQL.

One switch picks the backends for the whole run: ``ADMISSION_TEST_BACKEND``
is ``sqlite``, ``postgresql`` or ``all`` (the default: both).  The in-memory
reference store joins the contract suite whatever the switch says.

PostgreSQL is started by the tests themselves (``tests/support/pgserver.py``); under
CI a server that cannot be found, installed or started fails the run, it is
never skipped.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

from admission.sql import SqlStore, create_admission_engine, upgrade
from tests.support.pgserver import PostgresServer

SWITCH = os.environ.get("ADMISSION_TEST_BACKEND", "all")
if SWITCH not in ("all", "sqlite", "postgresql"):
    raise RuntimeError(f"ADMISSION_TEST_BACKEND must be all, sqlite or postgresql, not {SWITCH!r}")
SQL_BACKENDS = ["sqlite", "postgresql"] if SWITCH == "all" else [SWITCH]
TEMPLATE = "admission_template"
_counter = itertools.count()


class PostgresPool:
    """One server for the session; each test gets a fresh database cloned from a migrated template."""

    def __init__(self) -> None:
        self.server: PostgresServer | None = None
        self.error: BaseException | None = None
        self.template_ready = False

    def start(self) -> PostgresServer:
        if self.server is None and self.error is None:
            try:
                self.server = PostgresServer().start()
            except BaseException as exc:
                self.error = exc
        if self.server is None:
            message = f"PostgreSQL could not be started: {self.error!r}"
            if os.environ.get("CI"):
                pytest.fail(message, pytrace=False)
            pytest.skip(message)
        return self.server

    def fresh_database(self, migrated: bool = True) -> str:
        server = self.start()
        if migrated and not self.template_ready:
            engine = create_admission_engine(server.create_database(TEMPLATE))
            upgrade(engine)
            engine.dispose()
            self.template_ready = True
        name = f"t{os.getpid()}_{next(_counter)}"
        return server.create_database(name, template=TEMPLATE if migrated else "template0")

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()


def sqlite_url(directory: Path, migrated: bool = True) -> str:
    url = f"sqlite:///{directory / f'admission-{next(_counter)}.sqlite3'}"
    if migrated:
        engine = create_admission_engine(url)
        upgrade(engine)
        engine.dispose()
    return url


def database_url(backend: str, pool: PostgresPool, directory: Path, *, migrated: bool = True) -> str:
    """A fresh database on ``backend``, at the head revision unless ``migrated`` is false."""
    if backend == "sqlite":
        return sqlite_url(directory, migrated)
    return pool.fresh_database(migrated)


def open_store(url: str) -> Iterator[SqlStore]:
    store = SqlStore.open(url)
    try:
        yield store
    finally:
        store.dispose()


def engine_for(url: str) -> Engine:
    return create_admission_engine(url)
