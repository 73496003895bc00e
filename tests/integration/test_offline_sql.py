"""Offline SQL for review: ``admission db upgrade --sql`` prints what the upgrade runs, and runs nothing.

For each starting point (an empty database, revisions 0001, 0002 and 0004, a legacy
database whose stamp an earlier build left in ``alembic_version``), two
databases are made alike.  One gets the SQL that ``python -m admission --db
URL db upgrade --sql`` prints, run by hand (``sqlite3``'s ``executescript``,
or psycopg); its twin is upgraded online by ``admission db upgrade``.  Their
full snapshots (``tests/support/snapshot.py``: every table, column, index,
constraint, row and sequence) must be identical, with the head in
``admission_alembic_version``.  The snapshot does not see triggers or
functions, so the fencing trigger is compared in the catalog and made to
refuse a stale-fence write.  Printing the SQL changes nothing.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, make_url, text
from sqlalchemy.exc import DBAPIError

from admission.sql import (
    HEAD_REVISION,
    VERSION_TABLE,
    constraint_name,
    create_admission_engine,
    schema_of,
    upgrade,
    upgrade_sql,
)
from admission.sql._revisions import version_table_of
from tests.support.backends import SQL_BACKENDS, PostgresPool, database_url
from tests.support.processes import admission_cli as cli
from tests.support.snapshot import diff_snapshots, snapshot
from tools.legacy_fixtures import build_legacy_database

# Long: CI runs it in its step of extra tests (ADMISSION_TEST_SET=extra, .ci/run).
pytestmark = pytest.mark.extra

ROOT = Path(__file__).resolve().parents[2]

STARTS = ("empty", "0001", "0002", "0004", "legacy")
"""Where the two databases start: no schema, an own stamp at 0001, 0002 or 0004, a legacy 0001 with rows."""


def printed_sql(url: str, *args: str) -> str:
    result = cli(url, "db", "upgrade", "--sql", *args)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    return result.stdout


def run_by_hand(url: str, sql: str) -> None:
    """Run ``sql`` as a DBA would: through the driver alone, on a session admission did not set up."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        assert parsed.database is not None
        with sqlite3.connect(parsed.database) as conn:
            conn.executescript(sql)
        conn.close()
        return
    import psycopg

    libpq = parsed.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(libpq, autocommit=True) as conn:
        conn.execute(sql)


def start_at(url: str, start: str) -> None:
    if start == "legacy":
        build_legacy_database(url)
    elif start != "empty":
        engine = create_admission_engine(url)
        upgrade(engine, start)
        engine.dispose()


@dataclass
class Twins:
    """Two databases at the same start: ``hand`` for the printed SQL, ``online`` for ``db upgrade``."""

    hand: str
    online: str

    def engines(self) -> tuple[Engine, Engine]:
        return create_admission_engine(self.hand), create_admission_engine(self.online)


@pytest.fixture
def empty_urls(sql_backend: str, postgres_pool: PostgresPool, tmp_path: Path) -> Twins:
    return Twins(
        database_url(sql_backend, postgres_pool, tmp_path, migrated=False),
        database_url(sql_backend, postgres_pool, tmp_path, migrated=False),
    )


@pytest.fixture
def engines() -> Iterator[list[Engine]]:
    opened: list[Engine] = []
    yield opened
    for engine in opened:
        engine.dispose()


def routines(engine: Engine) -> dict[str, str]:
    """Triggers (and, on PostgreSQL, functions) by name, as the catalog defines them."""
    with engine.connect() as conn:
        if conn.dialect.name == "sqlite":
            rows = conn.execute(text("SELECT name, sql FROM sqlite_master WHERE type = 'trigger'"))
            return {f"trigger {name}": sql for name, sql in rows}
        triggers = conn.execute(
            text(
                "SELECT t.tgname, pg_get_triggerdef(t.oid) FROM pg_trigger t "
                "JOIN pg_class c ON c.oid = t.tgrelid "
                "WHERE NOT t.tgisinternal AND c.relnamespace = current_schema()::regnamespace"
            )
        )
        functions = conn.execute(
            text(
                "SELECT p.proname, pg_get_functiondef(p.oid) FROM pg_proc p "
                "WHERE p.pronamespace = current_schema()::regnamespace"
            )
        )
        return {
            **{f"trigger {name}": definition for name, definition in triggers},
            **{f"function {name}": definition for name, definition in functions},
        }


def assert_the_fence_refuses_a_stale_write(engine: Engine) -> None:
    """The fencing trigger is there and works: a record's fence must be its queue's lease token."""
    now = "2026-12-01 00:00:00+00:00"
    with engine.begin() as conn:
        conn.execute(
            text("INSERT INTO worker_queues (queue, scope, created_at) VALUES ('q', :scope, :now)"),
            {"scope": b"{}", "now": now},
        )
        conn.execute(
            text("INSERT INTO worker_leases (queue, token, heartbeat) VALUES ('q', 2, 0)"),
        )
        conn.execute(
            text(
                "INSERT INTO worker_records (write_id, queue, tenant, source_key, content, state, "
                "attempts, fence, created_at, updated_at) "
                "VALUES ('w', 'q', 't', 'k', :content, 'prepared', 0, 2, :now, :now)"
            ),
            {"content": b"{}", "now": now},
        )
        conn.execute(text("UPDATE worker_records SET attempts = 1 WHERE write_id = 'w'"))
    with pytest.raises(DBAPIError) as refused, engine.begin() as conn:
        conn.execute(text("UPDATE worker_records SET attempts = 2, fence = 1 WHERE write_id = 'w'"))
    assert constraint_name(refused.value.orig or refused.value) == "worker_fence"
    with engine.connect() as conn:
        assert conn.execute(text("SELECT attempts, fence FROM worker_records")).one() == (1, 2)


def at_head(state: dict[str, Any]) -> bool:
    stamped = state["tables"].get(VERSION_TABLE, {}).get("rows")
    return stamped == [{"version_num": HEAD_REVISION}] and "alembic_version" not in state["tables"]


# -- the printed SQL, run by hand, makes the database the online upgrade makes -------------------------


@pytest.mark.parametrize("start", STARTS)
def test_the_printed_sql_run_by_hand_gives_what_the_online_upgrade_gives(
    start: str, empty_urls: Twins, engines: list[Engine]
) -> None:
    for url in (empty_urls.hand, empty_urls.online):
        start_at(url, start)
    hand, online = empty_urls.engines()
    engines.extend((hand, online))
    before = snapshot(hand)
    assert diff_snapshots(before, snapshot(online)) == []

    sql = printed_sql(empty_urls.hand)
    assert diff_snapshots(before, snapshot(hand)) == [], "--sql changed the database"
    upgraded = cli(empty_urls.online, "db", "upgrade")
    assert upgraded.returncode == 0, upgraded.stderr

    run_by_hand(empty_urls.hand, sql)
    after = snapshot(hand)
    assert diff_snapshots(snapshot(online), after) == []
    assert at_head(after)
    assert routines(hand) == routines(online)
    assert any(name.startswith("trigger worker_records_fence") for name in routines(hand))
    assert_the_fence_refuses_a_stale_write(hand)


@pytest.mark.parametrize("start", STARTS)
def test_the_printed_sql_starts_at_the_revision_read_from_the_database(
    start: str, empty_urls: Twins, engines: list[Engine]
) -> None:
    start_at(empty_urls.hand, start)
    sql = printed_sql(empty_urls.hand)
    first = sql.splitlines()[0]
    read = {"empty": "no revision", "legacy": "admission_0001"}.get(start, f"admission_{start}")
    assert first.startswith("-- admission db upgrade") and f"from {read} (read from the database)" in first
    ran = [line for line in sql.splitlines() if line.startswith("-- Running upgrade ")]
    steps = {"empty": 7, "0001": 6, "legacy": 6, "0002": 5, "0004": 3}[start]
    assert len(ran) == steps and ran[-1].endswith(f"-> {HEAD_REVISION}")
    # Moving a legacy stamp is part of the script, before the first revision, as online.
    moved = "DROP TABLE alembic_version"
    assert (moved in sql) == (start == "legacy")
    if start == "legacy":
        assert sql.index(moved) < sql.index("-- Running upgrade")
    # 0002 adds nullable columns: a plain ALTER TABLE, never a table rebuild (on SQLite too).
    if start in ("empty", "0001", "legacy"):
        assert "ALTER TABLE workflow_commands ADD COLUMN intent_digest VARCHAR(64);" in sql
    # 0005 adds one nullable column to worker_jobs, in place as well.
    assert "ALTER TABLE worker_jobs ADD COLUMN not_before " in sql
    assert "_alembic_tmp" not in sql
    # 0006 drops the commands' key to their run: in place on PostgreSQL; on SQLite a rebuild
    # of plain statements (the run by hand, compared below, copies every row).
    if empty_urls.hand.startswith("sqlite"):
        rebuilt = "_admission_0006_workflow_commands"
        assert f"INSERT INTO {rebuilt} (" in sql
        assert f"ALTER TABLE {rebuilt} RENAME TO workflow_commands;" in sql
    else:
        dropped = "ALTER TABLE workflow_commands DROP CONSTRAINT fk_workflow_commands_run_id_workflow_runs;"
        assert dropped in sql
    # 0007 adds one nullable column to the event log, in place (no copy of the log on SQLite).
    assert "ALTER TABLE workflow_history_events ADD COLUMN compact_payload " in sql
    # One transaction around it all, as online.
    lines = sql.splitlines()
    assert lines.count("BEGIN;") == lines.count("COMMIT;") == 1 and sql.rstrip().endswith("COMMIT;")


def test_a_target_revision_bounds_the_script(empty_urls: Twins, engines: list[Engine]) -> None:
    start_at(empty_urls.hand, "0001")
    start_at(empty_urls.online, "0001")
    sql = printed_sql(empty_urls.hand, "--revision", "0003")
    assert "-> admission_0003" in sql and "admission_0004" not in sql
    assert cli(empty_urls.online, "db", "upgrade", "--revision", "0003").returncode == 0
    run_by_hand(empty_urls.hand, sql)
    hand, online = empty_urls.engines()
    engines.extend((hand, online))
    assert diff_snapshots(snapshot(online), snapshot(hand)) == []
    assert snapshot(hand)["tables"][VERSION_TABLE]["rows"] == [{"version_num": "admission_0003"}]


def test_at_the_head_the_script_runs_nothing(empty_urls: Twins, engines: list[Engine]) -> None:
    start_at(empty_urls.hand, HEAD_REVISION.removeprefix("admission_"))
    hand = create_admission_engine(empty_urls.hand)
    engines.append(hand)
    before = snapshot(hand)
    sql = printed_sql(empty_urls.hand)
    statements = [line for line in sql.splitlines() if line and not line.startswith("--")]
    assert statements == ["BEGIN;", "COMMIT;"]
    run_by_hand(empty_urls.hand, sql)
    assert diff_snapshots(before, snapshot(hand)) == []


# -- refusals ------------------------------------------------------------------------------------------


def test_an_unknown_stamp_is_refused_in_one_line_and_nothing_printed(
    empty_urls: Twins, engines: list[Engine]
) -> None:
    hand = create_admission_engine(empty_urls.hand)
    engines.append(hand)
    with hand.begin() as conn:
        version_table_of(VERSION_TABLE).create(conn)
        conn.execute(text(f"INSERT INTO {VERSION_TABLE} (version_num) VALUES ('admission_0099')"))
    before = snapshot(hand)
    result = cli(empty_urls.hand, "db", "upgrade", "--sql")
    assert result.returncode == 3 and result.stdout == ""
    assert "admission_0099" in result.stderr and len(result.stderr.splitlines()) == 1
    assert diff_snapshots(before, snapshot(hand)) == []


def test_an_unknown_target_revision_is_refused_as_input(empty_urls: Twins) -> None:
    result = cli(empty_urls.hand, "db", "upgrade", "--sql", "--revision", "0042")
    assert result.returncode == 2 and result.stdout == ""
    assert "0042" in result.stderr and "Traceback" not in result.stderr


# -- a PostgreSQL schema -------------------------------------------------------------------------------


@pytest.fixture
def schema_twins(postgres_pool: PostgresPool, engines: list[Engine]) -> tuple[Engine, Engine]:
    if "postgresql" not in SQL_BACKENDS:
        pytest.skip("a schema applies to PostgreSQL only (ADMISSION_TEST_BACKEND excludes it)")
    hand = create_admission_engine(postgres_pool.fresh_database(migrated=False), schema="tenant_a")
    online = create_admission_engine(postgres_pool.fresh_database(migrated=False), schema="tenant_a")
    engines.extend((hand, online))
    return hand, online


@pytest.mark.parametrize("start", ["empty", "0002"])
def test_with_a_schema_the_script_creates_it_and_works_in_it(
    start: str, schema_twins: tuple[Engine, Engine]
) -> None:
    hand, online = schema_twins
    if start != "empty":
        upgrade(hand, start)
        upgrade(online, start)
    sql = upgrade_sql(hand)
    assert 'CREATE SCHEMA IF NOT EXISTS "tenant_a";' in sql
    assert sql.index('SET LOCAL search_path TO "tenant_a";') < sql.index("-- Running upgrade")
    upgrade(online)
    # By hand on a session whose search_path admission did not set: the script sets its own.
    run_by_hand(hand.url.render_as_string(hide_password=False), sql)
    assert schema_of(hand) == "tenant_a"
    after = snapshot(hand)
    assert diff_snapshots(snapshot(online), after) == []
    assert at_head(after)
    assert routines(hand) == routines(online)
    assert_the_fence_refuses_a_stale_write(hand)
    with hand.connect() as conn:
        public = conn.execute(text("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'")).scalar_one()
    assert public == 0, "the script left tables outside the schema"
