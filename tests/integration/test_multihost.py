"""A multi-host URL (failover: several servers, the one that accepts writes is used) works wherever
admission takes a URL: the engines, the async store, the caller's-transaction check, the command line.

Both spellings are accepted: SQLAlchemy's (``?host=a:1&host=b:2``) and libpq's
(``?host=a,b&port=1,2``), with ``target_session_attrs=read-write``.  The URLs
here name a port where nothing listens first and the real server second, so
a connection that did not try the hosts in turn would fail.  The whole
failover, with a real standby promoted, is ``test_failover.py``.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

from admission.aio import AsyncAdmissionService, open_store
from admission.errors import InputError, StorageError
from admission.receipts import AdmissionService, Decision
from admission.sql import SqlStore, async_url, create_admission_engine, masked_url, normalize_url
from tests.support.backends import SQL_BACKENDS, PostgresPool
from tests.support.pgserver import free_port

ROOT = Path(__file__).resolve().parents[2]
PASSWORD = "pw-multi-7d1e-never-shown"


def sqlalchemy_form(db: str, endpoints: list[tuple[str, int]], password: str | None = None) -> str:
    who = "postgres" if password is None else f"postgres:{password}"
    hosts = "&".join(f"host={h}:{p}" for h, p in endpoints)
    return f"postgresql://{who}@/{db}?{hosts}&target_session_attrs=read-write"


def libpq_form(db: str, endpoints: list[tuple[str, int]], password: str | None = None) -> str:
    who = "postgres" if password is None else f"postgres:{password}"
    hosts, ports = ",".join(h for h, _ in endpoints), ",".join(str(p) for _, p in endpoints)
    return f"postgresql://{who}@/{db}?host={hosts}&port={ports}&target_session_attrs=read-write"


FORMS: dict[str, Callable[..., str]] = {"sqlalchemy": sqlalchemy_form, "libpq": libpq_form}


@pytest.mark.parametrize("form", FORMS)
def test_the_url_helpers_keep_every_host_and_hide_the_password(form: str) -> None:
    endpoints = [("10.0.0.1", 5432), ("10.0.0.2", 5433)]
    url = FORMS[form]("db", endpoints, PASSWORD)
    for made in (normalize_url(url), async_url(url)):
        parsed = make_url(made)
        assert parsed.password == PASSWORD and parsed.database == "db"
        assert {k: v for k, v in parsed.query.items()} == dict(make_url(url).query)
    assert make_url(normalize_url(url)).drivername == "postgresql+psycopg"
    assert make_url(async_url(url)).drivername == "postgresql+psycopg_async"
    for shown in (masked_url(url), masked_url(normalize_url(url))):
        assert PASSWORD not in shown and ":***@" in shown
        assert make_url(shown).query == make_url(url).query
    in_query = f"postgresql://postgres@/db?host=a:1&host=b:2&password={PASSWORD}"
    assert PASSWORD not in masked_url(in_query) and "password=***" in masked_url(in_query)


@pytest.fixture
def server_port(postgres_pool: PostgresPool) -> tuple[str, int]:
    if "postgresql" not in SQL_BACKENDS:
        pytest.skip("needs PostgreSQL (ADMISSION_TEST_BACKEND)")
    url = make_url(postgres_pool.fresh_database())
    assert url.host is not None and url.port is not None and url.database is not None
    return url.database, url.port


def endpoints(port: int) -> list[tuple[str, int]]:
    """A port where nothing listens first, then the server: the client must move on to the second."""
    return [("127.0.0.1", free_port()), ("127.0.0.1", port)]


@pytest.mark.parametrize("form", FORMS)
def test_a_store_admits_through_either_form(form: str, server_port: tuple[str, int]) -> None:
    db, port = server_port
    url = FORMS[form](db, endpoints(port), PASSWORD)
    store = SqlStore.open(url)
    try:
        service = AdmissionService(store)
        service.start_run("ns", "wf")
        first = service.admit_signal("ns", "wf", "go", {"n": 1}, request_id="k1")
        again = service.admit_signal("ns", "wf", "go", {"n": 1}, request_id="k1")
        assert first.decision is Decision.FRESH
        assert again.retained and again.command_id == first.command_id
        with store.engine.connect() as conn:
            assert conn.execute(text("SELECT inet_server_port()")).scalar() == port
    finally:
        store.dispose()


@pytest.mark.parametrize("form", FORMS)
def test_the_async_store_admits_through_either_form(form: str, server_port: tuple[str, int]) -> None:
    db, port = server_port

    async def admit() -> tuple[str | None, str | None]:
        store = await open_store(FORMS[form](db, endpoints(port)))
        try:
            service = AsyncAdmissionService(store)
            await service.start_run("ns", "wf")
            first = await service.admit_update("ns", "wf", "set", {"n": 1}, request_id="u1")
            again = await service.admit_update("ns", "wf", "set", {"n": 1}, request_id="u1")
            assert first.decision is Decision.FRESH and again.retained
            return first.command_id, again.command_id
        finally:
            await store.dispose()

    first, again = asyncio.run(admit())
    assert first == again is not None


def test_a_caller_session_on_the_same_servers_in_another_form_or_order_is_joined(
    server_port: tuple[str, int],
) -> None:
    db, port = server_port
    hosts = endpoints(port)
    store = SqlStore.open(sqlalchemy_form(db, hosts))
    same = [libpq_form(db, hosts), sqlalchemy_form(db, hosts[::-1], PASSWORD), libpq_form(db, hosts[::-1])]
    other = [
        sqlalchemy_form(db, hosts[1:]),  # one of the servers only: not the same list
        sqlalchemy_form(db, [hosts[0], ("127.0.0.1", free_port())]),
        sqlalchemy_form("postgres", hosts),
    ]
    try:
        service = AdmissionService(store)
        service.start_run("ns", "wf")
        for n, url in enumerate(same):
            engine = create_admission_engine(url)
            try:
                with Session(engine) as session:
                    answer = service.admit_signal(
                        "ns", "wf", "go", [n], request_id=f"s{n}", connection=session
                    )
                    session.commit()
                assert answer.decision is Decision.FRESH
            finally:
                engine.dispose()
        for n, url in enumerate(other):
            engine = create_admission_engine(url)
            try:
                with Session(engine) as session, pytest.raises(InputError) as caught:
                    service.admit_signal("ns", "wf", "go", [n], request_id=f"o{n}", connection=session)
                assert caught.value.field == "connection"
            finally:
                engine.dispose()
        assert service.receipt("ns", "wf", "signal", "o0") is None
    finally:
        store.dispose()


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if k != "ADMISSION_DB"}
    command = [sys.executable, "-m", "admission", *args]
    return subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=environment, timeout=120)


def test_the_command_line_takes_either_form_and_never_prints_the_password(
    server_port: tuple[str, int],
) -> None:
    db, port = server_port
    store = SqlStore.open(sqlalchemy_form(db, endpoints(port)))
    AdmissionService(store).start_run("ns", "wf")
    store.dispose()
    steps = [
        (sqlalchemy_form, ["signal", "wf", "go", "--namespace", "ns", "--request-id", "k"]),
        (libpq_form, ["db", "check"]),
    ]
    for form, args in steps:
        result = run_cli("--db", form(db, endpoints(port), PASSWORD), *args)
        assert result.returncode == 0, (args, result.stderr)
        assert PASSWORD not in result.stdout + result.stderr
    assert ":***@" in result.stdout and "target_session_attrs=read-write" in result.stdout
    # Every server down: the documented unavailable exit, one line, still no password.
    down = sqlalchemy_form(db, [("127.0.0.1", free_port()), ("127.0.0.1", free_port())], PASSWORD)
    result = run_cli("--db", down, "db", "check")
    assert result.returncode == 5 and result.stdout == ""
    assert result.stderr.startswith("admission: the database is unavailable")
    assert result.stderr.count("\n") == 1 and PASSWORD not in result.stderr


def test_a_store_on_servers_that_are_all_down_fails_as_storage(server_port: tuple[str, int]) -> None:
    db, _ = server_port
    down = libpq_form(db, [("127.0.0.1", free_port()), ("127.0.0.1", free_port())], PASSWORD)
    with pytest.raises(StorageError) as caught:
        SqlStore.open(down)
    assert PASSWORD not in str(caught.value)
