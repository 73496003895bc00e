"""PostgreSQL behind a real PgBouncer in transaction mode (tests/support/pgbouncer.py).

What goes wrong without admission's ``pooler`` setting (psycopg's prepared
statements go missing when a client's next transaction gets another server
session), that the setting cures it, that a store's traffic really goes
through PgBouncer's transaction pool, and the setting's typed errors.  The
contract suites and the race tests run through PgBouncer as a whole under
``ADMISSION_TEST_POOLER=pgbouncer`` (a CI step of its own, .ci/run).
"""

from __future__ import annotations

import json
import os
import pwd
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import psycopg
import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url

from admission.errors import InputError, StorageError
from admission.receipts import AdmissionService, Decision
from admission.sql import (
    POOLER_PARAMETER,
    SqlStore,
    create_admission_engine,
    create_async_admission_engine,
    create_awaited_engine,
    pooler_of,
)
from tests.support.backends import POOLED, POOLER, SQL_BACKENDS, PostgresPool
from tests.support.pgbouncer import PgBouncer
from tests.support.pgserver import server_account
from tests.support.processes import ROOT

needs_postgresql = pytest.mark.skipif(
    "postgresql" not in SQL_BACKENDS, reason="PgBouncer stands in front of PostgreSQL"
)

PREPARED_AFTER = 6
"""Runs of one statement on one psycopg connection after which psycopg has prepared it by name
on the server session (its ``prepare_threshold`` is 5; a rollback starts the count again, so it
is the store's autocommit reads and committed writes that get there)."""

NS = "tenant-pooled"


@pytest.fixture
def database(postgres_pool: PostgresPool) -> str:
    """The name of a fresh database at the head revision."""
    name = make_url(postgres_pool.direct(postgres_pool.fresh_database())).database
    assert name
    return name


@pytest.fixture
def stores() -> Iterator[list[SqlStore]]:
    opened: list[SqlStore] = []
    yield opened
    for store in opened:
        store.dispose()


def _retry_read(store: SqlStore) -> list[object]:
    """The read that answers a retry: one statement on the store's autocommit read connection."""
    return list(store.read_receipts(NS, "wf", "signal", ["k-1"]))


def _read_while_another_client_holds_the_session(
    bouncer: PgBouncer, database: str, store: SqlStore, holder: SqlStore
) -> None:
    for _ in range(PREPARED_AFTER):
        assert _retry_read(store) == []
    # PgBouncer has lent every transaction so far the one server session it has for the database ...
    assert len(_server_ports(bouncer, database)) == 1
    with holder.begin() as held:
        held.execute(text("SELECT 1"))  # ... which another client's transaction now holds,
        assert _retry_read(store) == []  # so this read runs on a new one.


@needs_postgresql
def test_without_the_pooler_setting_a_prepared_statement_goes_missing_behind_pgbouncer(
    postgres_pool: PostgresPool, database: str, stores: list[SqlStore]
) -> None:
    bouncer = postgres_pool.pgbouncer()
    store, holder = (SqlStore.open(bouncer.url_for(database)) for _ in range(2))
    stores += [store, holder]
    with pytest.raises(StorageError) as caught:
        _read_while_another_client_holds_the_session(bouncer, database, store, holder)
    # psycopg had prepared the read as "_pg3_0" on the first session and now executes it by name.
    cause = caught.value.__cause__
    assert isinstance(getattr(cause, "orig", cause), psycopg.errors.InvalidSqlStatementName)
    assert "does not exist" in str(caught.value)
    assert "admission_pooler=transaction" in str(caught.value)  # what to do about it


@needs_postgresql
def test_with_the_pooler_setting_nothing_is_prepared_and_any_server_session_serves(
    postgres_pool: PostgresPool, database: str, stores: list[SqlStore]
) -> None:
    bouncer = postgres_pool.pgbouncer()
    store, holder = (SqlStore.open(postgres_pool.pooled(database)) for _ in range(2))
    stores += [store, holder]
    assert pooler_of(store.engine) == "transaction"
    _read_while_another_client_holds_the_session(bouncer, database, store, holder)
    assert len(_server_ports(bouncer, database)) >= 2


def _xacts(bouncer: PgBouncer, database: str) -> Decimal:
    rows = [r["total_xact_count"] for r in bouncer.show("STATS") if r["database"] == database]
    return rows[0] if rows else Decimal(0)


def _server_ports(bouncer: PgBouncer, database: str) -> set[int]:
    """The local ports of PgBouncer's server connections to ``database``."""
    return {int(r["local_port"]) for r in bouncer.show("SERVERS") if r["database"] == database}


@needs_postgresql
def test_a_stores_admissions_run_through_pgbouncer_in_transaction_mode(postgres_pool: PostgresPool) -> None:
    url = postgres_pool.fresh_database()
    database = make_url(postgres_pool.direct(url)).database
    assert database
    bouncer = postgres_pool.pgbouncer()
    if POOLER:
        # The pooled run (ADMISSION_TEST_POOLER=pgbouncer): every test's URL is this one.
        assert make_url(url).port == bouncer.port and url.endswith(POOLED)
    else:
        url = postgres_pool.pooled(database)
    assert {r["key"]: r["value"] for r in bouncer.show("CONFIG")}["pool_mode"] == "transaction"
    before = _xacts(bouncer, database)
    store = SqlStore.open(url)
    try:
        service = AdmissionService(store)
        service.start_run(NS, "wf")
        answers = [service.admit_signal(NS, "wf", "go", {"n": n}, request_id=f"k-{n}") for n in range(20)]
        assert {a.decision for a in answers} == {Decision.FRESH}
        retried = [service.admit_signal(NS, "wf", "go", {"n": n}, request_id=f"k-{n}") for n in range(20)]
        assert [a.command_id for a in retried] == [a.command_id for a in answers]
        # 20 admissions in a transaction each, 20 retries read in one statement each, and the run.
        assert _xacts(bouncer, database) - before >= 41
        (pool,) = [r for r in bouncer.show("POOLS") if r["database"] == database]
        assert pool["pool_mode"] == "transaction"
        # The server sees the store only through PgBouncer's own server connections.
        ports = _server_ports(bouncer, database)
        with psycopg.connect(**postgres_pool.start().conninfo(database)) as direct:
            seen = direct.execute(
                "SELECT client_port FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
                (database,),
            ).fetchall()
        ports |= _server_ports(bouncer, database)
        assert seen and {port for (port,) in seen} <= ports
    finally:
        store.dispose()


@needs_postgresql
def test_pgbouncer_runs_as_the_servers_account_and_leaves_nothing_behind(postgres_pool: PostgresPool) -> None:
    bouncer = PgBouncer(postgres_pool.start()).start()
    root, port = bouncer.root, bouncer.port
    assert root is not None and port is not None
    try:
        status = Path(f"/proc/{bouncer.pid}/status").read_text()
        uid = int(next(line for line in status.splitlines() if line.startswith("Uid:")).split()[1])
        account = server_account()
        assert uid == (os.geteuid() if account is None else account.pw_uid)
        if account is not None:
            assert pwd.getpwuid(uid).pw_name != "root"
    finally:
        bouncer.stop()
    assert not root.exists()
    assert not _listening(port)


@needs_postgresql
def test_a_killed_test_process_leaves_no_pgbouncer_behind(postgres_pool: PostgresPool) -> None:
    """SIGKILL skips atexit: the watchdog ends PgBouncer and removes its directory."""
    server = postgres_pool.start()
    script = textwrap.dedent(
        f"""
        import json, time
        from tests.support.pgbouncer import PgBouncer
        from tests.support.pgserver import PostgresServer
        server = PostgresServer()
        server.port = {server.port}  # the test's running server, not started again here
        bouncer = PgBouncer(server).start()
        print(json.dumps({{"pid": bouncer.pid, "port": bouncer.port, "root": str(bouncer.root)}}), flush=True)
        time.sleep(600)
        """
    )
    child = subprocess.Popen(
        [sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
        assert line, child.stderr.read() if child.stderr else ""
        info = json.loads(line)
        assert _listening(info["port"])
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and (Path(info["root"]).exists() or _listening(info["port"])):
        time.sleep(0.1)
    assert not _listening(info["port"])
    assert not Path(info["root"]).exists()
    assert not Path(f"/proc/{info['pid']}").exists()


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


@pytest.mark.parametrize(
    ("url", "options", "field"),
    [
        ("postgresql://u@h/db?admission_pooler=session", {}, "pooler"),
        ("postgresql://u@h/db", {"pooler": "statement"}, "pooler"),
        ("postgresql://u@h/db?admission_pooler=transaction", {"pooler": "other"}, "pooler"),
        ("postgresql://u@h/db?admission_pooler=transaction&admission_pooler=transaction", {}, "pooler"),
        ("sqlite:///admission.sqlite3?admission_pooler=transaction", {}, "pooler"),
        ("postgresql://u@h/db?admission_pooler=transaction", {"schema": "tenant_a"}, "schema"),
    ],
)
def test_a_pooler_that_cannot_be_used_is_an_input_error_naming_the_field(
    url: str, options: dict[str, str], field: str
) -> None:
    for create in (create_admission_engine, create_async_admission_engine, create_awaited_engine):
        with pytest.raises(InputError) as caught:
            create(url, **options)
        assert caught.value.field == field


def test_the_pooler_parameter_never_reaches_the_driver() -> None:
    for create in (create_admission_engine, create_awaited_engine):
        engine = create(f"postgresql://u:secret@h/db?sslmode=disable&{POOLER_PARAMETER}=transaction")
        try:
            assert pooler_of(engine) == "transaction"
            assert dict(engine.url.query) == {"sslmode": "disable"}
        finally:
            engine.dispose()
    direct = create_admission_engine("postgresql://u@h/db")
    assert pooler_of(direct) is None
    direct.dispose()
