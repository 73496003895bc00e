"""Backends for the storage tests: the in-memory store, SQLite and a real PostgreSQL.

One switch picks the backends for the whole run: ``ADMISSION_TEST_BACKEND``
is ``sqlite``, ``postgresql`` or ``all`` (the default: both).  The in-memory
reference store joins the contract suite whatever the switch says.

PostgreSQL is started by the tests themselves (``tests/support/pgserver.py``); under
CI a server that cannot be found, installed or started fails the run, it is
never skipped.

A second switch puts a pooler in front of it: ``ADMISSION_TEST_POOLER=pgbouncer``
hands every test a PostgreSQL URL through a real PgBouncer in transaction mode
(``tests/support/pgbouncer.py``) with ``admission_pooler=transaction``; the
databases are still created, and the template migrated, on the server itself.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

from admission.sql import SqlStore, create_admission_engine, upgrade
from tests.support.pgbouncer import PgBouncer
from tests.support.pgserver import PostgresServer

SWITCH = os.environ.get("ADMISSION_TEST_BACKEND", "all")
if SWITCH not in ("all", "sqlite", "postgresql"):
    raise RuntimeError(f"ADMISSION_TEST_BACKEND must be all, sqlite or postgresql, not {SWITCH!r}")
SQL_BACKENDS = ["sqlite", "postgresql"] if SWITCH == "all" else [SWITCH]
POOLER = os.environ.get("ADMISSION_TEST_POOLER", "")
if POOLER not in ("", "pgbouncer"):
    raise RuntimeError(f"ADMISSION_TEST_POOLER must be pgbouncer or unset, not {POOLER!r}")
POOLED = "?admission_pooler=transaction"
"""What a URL through PgBouncer carries: admission then keeps nothing on a server session."""
TEMPLATE = "admission_template"
_counter = itertools.count()


class PostgresPool:
    """One server for the session; each test gets a fresh database cloned from a migrated template."""

    def __init__(self) -> None:
        self.server: PostgresServer | None = None
        self.error: BaseException | None = None
        self.bouncer: PgBouncer | None = None
        self.bouncer_error: BaseException | None = None
        self.template_ready = False

    def start(self) -> PostgresServer:
        if self.server is None and self.error is None:
            try:
                self.server = PostgresServer().start()
            except BaseException as exc:
                self.error = exc
        if self.server is None:
            _missing(f"PostgreSQL could not be started: {self.error!r}")
        assert self.server is not None
        return self.server

    def pgbouncer(self) -> PgBouncer:
        """The session's PgBouncer in front of the server, started on first use."""
        server = self.start()
        if self.bouncer is None and self.bouncer_error is None:
            try:
                self.bouncer = PgBouncer(server).start()
            except BaseException as exc:
                self.bouncer_error = exc
        if self.bouncer is None:
            _missing(f"PgBouncer could not be started: {self.bouncer_error!r}")
        assert self.bouncer is not None
        return self.bouncer

    def pooled(self, name: str) -> str:
        """The URL of database ``name`` through PgBouncer, for admission behind a transaction pooler."""
        return self.pgbouncer().url_for(name) + POOLED

    def direct(self, url: str) -> str:
        """``url`` on the server itself (a URL through PgBouncer made direct; any other unchanged)."""
        if self.bouncer is None or self.server is None or not url.endswith(POOLED):
            return url
        name = url.removesuffix(POOLED).rpartition("/")[2]
        return self.server.url_for(name)

    def fresh_database(self, migrated: bool = True) -> str:
        server = self.start()
        if migrated and not self.template_ready:
            engine = create_admission_engine(server.create_database(TEMPLATE))
            upgrade(engine)
            engine.dispose()
            self.template_ready = True
        name = f"t{os.getpid()}_{next(_counter)}"
        url = server.create_database(name, template=TEMPLATE if migrated else "template0")
        return self.pooled(name) if POOLER else url

    def stop(self) -> None:
        if self.bouncer is not None:
            self.bouncer.stop()
        if self.server is not None:
            self.server.stop()


def _missing(message: str) -> None:
    """A real part that could not be had: a failure under CI, a skip elsewhere."""
    if os.environ.get("CI"):
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


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
