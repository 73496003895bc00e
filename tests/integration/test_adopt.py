"""Adopting a database an older engine left with admission's tables and no stamp (issue 12).

The legacy fixture (``tools/legacy_fixtures.py``) with ``stamp="none"`` is what
an engine that never used alembic left: revision 0001's receipt tables, every
legacy receipt shape, and no version table.  ``db check`` answers exit 6 and
names the adoption command; ``db upgrade --adopt`` compares the tables with
revision 0001 and, as they match, stamps and upgrades them, changing exactly
the declared delta (full snapshots before and after, as
``test_legacy_upgrade.py`` checks the stamped upgrade).  Copies drifted with
plain DDL are refused with every difference listed, exit 7, and a full
snapshot that shows nothing changed.
"""

from __future__ import annotations

import copy
import json
import pickle
import re
import sqlite3
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine, make_url, text

from admission.errors import SchemaDriftError, SchemaRevisionError, UnstampedSchemaError
from admission.receipts import AdmissionService
from admission.sql import (
    ADOPTED_REVISION,
    HEAD_REVISION,
    VERSION_TABLE,
    SqlStore,
    adopt,
    create_admission_engine,
    upgrade,
)
from admission.sql._revisions import version_table_of
from tests.integration.test_legacy_upgrade import NEW_COLUMNS, NEW_TABLES, cli, declared_delta
from tests.support.backends import PostgresPool, database_url
from tests.support.snapshot import diff_snapshots, snapshot
from tools.legacy_fixtures import LegacyManifest, build_legacy_database

# Long: CI runs it in its step of extra tests (ADMISSION_TEST_SET=extra, .ci/run).
pytestmark = pytest.mark.extra

LEGACY_TABLES = (
    "workflow_commands",
    "workflow_history_events",
    "workflow_instances",
    "workflow_runs",
    "workflow_updates",
)
"""Revision 0001's tables, as the unstamped refusal lists them."""

EXIT_SCHEMA, EXIT_UNSTAMPED, EXIT_DRIFTED = 3, 6, 7


@pytest.fixture
def empty_url(sql_backend: str, postgres_pool: PostgresPool, tmp_path: Path) -> str:
    """A fresh database on the backend under test, with no schema at all."""
    return database_url(sql_backend, postgres_pool, tmp_path, migrated=False)


@pytest.fixture
def unstamped(empty_url: str) -> tuple[str, LegacyManifest]:
    """Revision 0001's tables and every legacy shape, with no version table anywhere."""
    return empty_url, build_legacy_database(empty_url, stamp="none")


@pytest.fixture
def engine(unstamped: tuple[str, LegacyManifest]) -> Iterator[Engine]:
    engine = create_admission_engine(unstamped[0])
    yield engine
    engine.dispose()


def adopted_delta(before: dict[str, Any], head: dict[str, Any]) -> dict[str, Any]:
    """The stamped upgrade's declared delta, for a database that had no stamp to move."""
    # declared_delta removes the legacy stamp an earlier build left; here there was none.
    stamped = copy.deepcopy(before)
    stamped["tables"]["alembic_version"] = {"rows": [{"version_num": "0001"}]}
    return declared_delta(stamped, head)


def scratch_schemas(engine: Engine) -> list[str]:
    """Schemas the PostgreSQL reference was built in, if any was left behind."""
    if engine.dialect.name != "postgresql":
        return []
    with engine.connect() as conn:
        query = text("SELECT nspname FROM pg_namespace WHERE nspname LIKE 'admission_adopt_%'")
        return list(conn.execute(query).scalars())


# -- the unstamped database is named as such ---------------------------------------------------------


def test_db_check_on_unstamped_tables_exits_6_and_names_the_adoption_command(
    unstamped: tuple[str, LegacyManifest],
) -> None:
    url, _ = unstamped
    check = cli(url, "db", "check")
    assert check.returncode == EXIT_UNSTAMPED, check.stderr
    report = json.loads(check.stdout)
    assert (report["revision"], report["ok"]) == (None, False)
    assert "admission db upgrade --adopt" in report["message"]
    assert "no admission schema" not in report["message"]
    assert all(table in report["message"] for table in LEGACY_TABLES)


def test_the_store_and_every_command_refuse_unstamped_tables_naming_adoption(
    unstamped: tuple[str, LegacyManifest], engine: Engine
) -> None:
    url, _ = unstamped
    before = snapshot(engine)
    with pytest.raises(UnstampedSchemaError) as refused:
        SqlStore.open(url)
    assert isinstance(refused.value, SchemaRevisionError)
    assert "admission db upgrade --adopt" in str(refused.value)
    assert (refused.value.tables, refused.value.revision) == (LEGACY_TABLES, None)
    copied = pickle.loads(pickle.dumps(refused.value))
    assert (type(copied), copied.code, copied.tables) == (
        UnstampedSchemaError,
        "schema_unstamped",
        LEGACY_TABLES,
    )

    receipt = cli(
        url, "receipt", "order-1001", "--namespace", "acme", "--type", "update", "--request-id", "x"
    )
    assert receipt.returncode == EXIT_UNSTAMPED and receipt.stdout == ""
    assert receipt.stderr.count("\n") == 1 and "--adopt" in receipt.stderr
    # A plain upgrade would try to create the tables again: it is refused the same way.
    plain = cli(url, "db", "upgrade")
    assert plain.returncode == EXIT_UNSTAMPED and "--adopt" in plain.stderr
    assert diff_snapshots(before, snapshot(engine)) == []


def test_an_empty_database_keeps_its_answer(empty_url: str) -> None:
    check = cli(empty_url, "db", "check")
    assert check.returncode == EXIT_SCHEMA
    assert "no admission schema" in json.loads(check.stdout)["message"]
    with pytest.raises(SchemaRevisionError) as refused:
        SqlStore.open(empty_url)
    assert not isinstance(refused.value, UnstampedSchemaError)


# -- adoption changes exactly the declared delta -----------------------------------------------------


def test_adopt_changes_only_the_declared_delta_and_the_store_answers_a_legacy_key(
    unstamped: tuple[str, LegacyManifest], engine: Engine, fresh_head: dict[str, Any]
) -> None:
    url, manifest = unstamped
    before = snapshot(engine)
    assert "alembic_version" not in before["tables"] and VERSION_TABLE not in before["tables"]

    result = cli(url, "db", "upgrade", "--adopt")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["from_revision"] is None
    assert (report["adopted"], report["revision"]) == (ADOPTED_REVISION, HEAD_REVISION)
    assert report["tables"] == list(LEGACY_TABLES)

    after = snapshot(engine)
    assert diff_snapshots(adopted_delta(before, fresh_head), after) == []
    # Said as the raw difference: the new tables aside, only workflow_commands, the event log's new
    # column and the stamp.
    lines = [
        line
        for line in diff_snapshots(before, after)
        if not line.startswith(
            tuple(f"{kind}.{name}" for kind in ("tables", "sequences") for name in NEW_TABLES)
        )
    ]
    commands = len(before["tables"]["workflow_commands"]["rows"])
    events = len(before["tables"]["workflow_history_events"]["rows"])
    # 0002's columns, the column order, their values in every row; 0006's key and index; 0007's
    # column, the column order, its value in every row; the stamp.
    expected = len(NEW_COLUMNS) + 1 + len(NEW_COLUMNS) * commands + 2 + 1 + 1 + events + 1
    assert len(lines) == expected, "\n".join(lines)
    touched = (
        "tables.workflow_commands.",
        "tables.workflow_history_events.",
        f"tables.{VERSION_TABLE}: added",
    )
    assert all(line.startswith(touched) for line in lines), "\n".join(lines)
    assert all("compact_payload" in line for line in lines if line.startswith(touched[1])), "\n".join(lines)
    assert after["tables"][VERSION_TABLE]["rows"] == [{"version_num": HEAD_REVISION}]
    assert scratch_schemas(engine) == []

    assert cli(url, "db", "check").returncode == 0
    store = SqlStore.open(url)
    try:
        service = AdmissionService(store)
        for case in manifest.cases:
            answer = service.receipt(case.namespace, case.workflow_id, case.command_type, case.key)
            assert answer is not None and answer.request_id == case.key, case.case_id
            if case.expected == "retained_unverified":
                assert (answer.command_id, answer.intent_verified) == (case.command_id, False), case.case_id
    finally:
        store.dispose()


def test_adopt_then_nothing_more_to_adopt(unstamped: tuple[str, LegacyManifest], engine: Engine) -> None:
    url, _ = unstamped
    assert cli(url, "db", "upgrade", "--adopt").returncode == 0
    adopted = snapshot(engine)
    again = cli(url, "db", "upgrade", "--adopt")
    assert again.returncode == EXIT_SCHEMA and again.stdout == ""
    assert "nothing to adopt" in again.stderr and HEAD_REVISION in again.stderr
    assert diff_snapshots(adopted, snapshot(engine)) == []


def test_adopt_to_0001_only_stamps(unstamped: tuple[str, LegacyManifest], engine: Engine) -> None:
    url, _ = unstamped
    before = snapshot(engine)
    result = cli(url, "db", "upgrade", "--adopt", "--revision", "0001")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["revision"] == ADOPTED_REVISION
    after = snapshot(engine)
    assert after["tables"].pop(VERSION_TABLE)["rows"] == [{"version_num": ADOPTED_REVISION}]
    assert diff_snapshots(before, after) == []
    assert json.loads(cli(url, "db", "upgrade").stdout)["revision"] == HEAD_REVISION


def test_a_failure_after_the_stamp_leaves_nothing_behind(
    unstamped: tuple[str, LegacyManifest], engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    from alembic import command

    real_upgrade = command.upgrade

    def upgrade_then_fail(config: Any, revision: str, **options: Any) -> None:
        real_upgrade(config, revision, **options)
        raise RuntimeError("injected after the upgrade, before the commit")

    monkeypatch.setattr(command, "upgrade", upgrade_then_fail)
    before = snapshot(engine)
    with pytest.raises(RuntimeError, match="injected"):
        adopt(engine)
    assert diff_snapshots(before, snapshot(engine)) == []


def test_adopt_refuses_a_stamped_or_an_empty_database(
    empty_url: str, sql_backend: str, postgres_pool: PostgresPool, tmp_path: Path
) -> None:
    empty = cli(empty_url, "db", "upgrade", "--adopt")
    assert empty.returncode == EXIT_SCHEMA and "none of admission's tables" in empty.stderr
    engine = create_admission_engine(empty_url)
    try:
        assert snapshot(engine)["tables"] == {}
    finally:
        engine.dispose()

    (tmp_path / "legacy").mkdir()
    legacy_url = database_url(sql_backend, postgres_pool, tmp_path / "legacy", migrated=False)
    build_legacy_database(legacy_url, stamp="legacy")
    engine = create_admission_engine(legacy_url)
    try:
        before = snapshot(engine)
        stamped = cli(legacy_url, "db", "upgrade", "--adopt")
        assert stamped.returncode == EXIT_SCHEMA
        assert "nothing to adopt" in stamped.stderr and "alembic_version" in stamped.stderr
        assert diff_snapshots(before, snapshot(engine)) == []
    finally:
        engine.dispose()


def test_adopt_leaves_a_hosts_tables_and_version_table_alone(
    unstamped: tuple[str, LegacyManifest], engine: Engine
) -> None:
    url, _ = unstamped
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE orders (id INTEGER PRIMARY KEY, note VARCHAR(10))"))
        conn.execute(text("INSERT INTO orders (id, note) VALUES (1, 'kept')"))
        version_table_of("alembic_version").create(conn)
        conn.execute(text("INSERT INTO alembic_version (version_num) VALUES ('host_0007')"))
    before = snapshot(engine)
    result = cli(url, "db", "upgrade", "--adopt")
    assert result.returncode == 0, result.stderr
    after = snapshot(engine)
    for table in ("orders", "alembic_version"):
        assert diff_snapshots(before["tables"][table], after["tables"][table]) == [], table


def test_adopt_in_a_schema_of_the_users_choice(sql_backend: str, postgres_pool: PostgresPool) -> None:
    if sql_backend != "postgresql":
        pytest.skip("a schema applies to PostgreSQL only")
    url = postgres_pool.fresh_database(migrated=False)
    engine = create_admission_engine(url, schema="tenant_a")
    try:
        _bare_unstamped(engine)
        report = adopt(engine)
        assert (report.tables, report.revision) == (LEGACY_TABLES, HEAD_REVISION)
        assert scratch_schemas(engine) == []
    finally:
        engine.dispose()
    public = create_admission_engine(url)
    try:
        assert snapshot(public)["tables"] == {}  # everything stayed in tenant_a
    finally:
        public.dispose()


# -- drifted copies are refused, every difference listed, nothing changed -------------------------------


@dataclass(frozen=True)
class Drift:
    """One change an operator or an older engine might have made by hand, in plain DDL."""

    name: str
    sqlite: Callable[[sqlite3.Connection], None]
    postgresql: str
    expected: str
    """A regular expression for the one difference line it must produce."""


def _script(sql: str) -> Callable[[sqlite3.Connection], None]:
    def run(conn: sqlite3.Connection) -> None:
        conn.executescript(sql)

    return run


def _rebuild(table: str, old: str, new: str) -> Callable[[sqlite3.Connection], None]:
    """SQLite's own recipe for a change ALTER TABLE cannot make: a new table, copied, renamed."""

    def rebuild(conn: sqlite3.Connection) -> None:
        (sql,) = conn.execute(
            "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)
        ).fetchone()
        indexes = [
            row[0]
            for row in conn.execute(
                "SELECT sql FROM sqlite_master WHERE type = 'index' AND tbl_name = ? AND sql IS NOT NULL",
                (table,),
            )
        ]
        edited = re.sub(old, new, sql)
        assert edited != sql, (table, old)
        conn.execute("PRAGMA foreign_keys = OFF")
        conn.execute("BEGIN")
        # SQLite keeps the name as written: quoted once the table has been renamed.
        conn.execute(re.sub(rf'^CREATE TABLE "?{table}"? \(', f"CREATE TABLE {table}_rebuilt (", edited))
        conn.execute(f"INSERT INTO {table}_rebuilt SELECT * FROM {table}")
        conn.execute(f"DROP TABLE {table}")
        conn.execute(f"ALTER TABLE {table}_rebuilt RENAME TO {table}")
        for index in indexes:
            conn.execute(index)
        conn.execute("COMMIT")

    return rebuild


DRIFTS = {
    drift.name: drift
    for drift in (
        Drift(
            "missing index",
            _script("DROP INDEX ix_workflow_commands_run_id"),
            "DROP INDEX ix_workflow_commands_run_id",
            r"workflow_commands: index ix_workflow_commands_run_id: missing",
        ),
        Drift(
            "extra column",
            _script("ALTER TABLE workflow_instances ADD COLUMN note VARCHAR(40)"),
            "ALTER TABLE workflow_instances ADD COLUMN note VARCHAR(40)",
            r"workflow_instances: column note: not in revision 0001",
        ),
        Drift(
            "wider run id",
            _rebuild("workflow_runs", r"\bid VARCHAR\(36\) NOT NULL", "id VARCHAR(64) NOT NULL"),
            "ALTER TABLE workflow_runs ALTER COLUMN id TYPE VARCHAR(64)",
            r"workflow_runs: column id: type VARCHAR\(64\), revision 0001 has VARCHAR\(36\)",
        ),
        Drift(
            "wider request_id",
            _rebuild("workflow_commands", r"request_id VARCHAR\(191\)", "request_id VARCHAR(255)"),
            "ALTER TABLE workflow_commands ALTER COLUMN request_id TYPE VARCHAR(255)",
            r"workflow_commands: column request_id: type VARCHAR\(255\), revision 0001 has VARCHAR\(191\)",
        ),
        Drift(
            "nullable update name",
            _rebuild("workflow_updates", r"\bname VARCHAR\(255\) NOT NULL", "name VARCHAR(255)"),
            "ALTER TABLE workflow_updates ALTER COLUMN name DROP NOT NULL",
            r"workflow_updates: column name: nullable yes, revision 0001 has no",
        ),
        Drift(
            "missing table",
            _script("DROP TABLE workflow_history_events"),
            "DROP TABLE workflow_history_events",
            r"workflow_history_events: table missing",
        ),
        Drift(
            "request lookup not unique",
            _script(
                "DROP INDEX workflow_commands_request_lookup; CREATE INDEX workflow_commands_request_lookup "
                "ON workflow_commands (instance_id, command_type, request_id)"
            ),
            "DROP INDEX workflow_commands_request_lookup; CREATE INDEX workflow_commands_request_lookup "
            "ON workflow_commands (instance_id, command_type, request_id)",
            r"workflow_commands: index workflow_commands_request_lookup: unique no, revision 0001 has yes",
        ),
        Drift(
            "status default",
            _rebuild(
                "workflow_runs",
                r"\bstatus VARCHAR\(16\) NOT NULL",
                "status VARCHAR(16) DEFAULT 'open' NOT NULL",
            ),
            "ALTER TABLE workflow_runs ALTER COLUMN status SET DEFAULT 'open'",
            r"workflow_runs: column status: default 'open'.*, revision 0001 has none",
        ),
        Drift(
            "missing foreign key",
            _rebuild(
                "workflow_updates",
                r",\s*CONSTRAINT fk_workflow_updates_run_id_workflow_runs FOREIGN KEY\(run_id\) "
                r"REFERENCES workflow_runs \(id\)",
                "",
            ),
            "ALTER TABLE workflow_updates DROP CONSTRAINT fk_workflow_updates_run_id_workflow_runs",
            r"workflow_updates: foreign key fk_workflow_updates_run_id_workflow_runs: missing",
        ),
        Drift(
            "missing unique constraint",
            _rebuild(
                "workflow_instances",
                r",\s*CONSTRAINT uq_workflow_instances_namespace_workflow_id "
                r"UNIQUE \(namespace, workflow_id\)",
                "",
            ),
            "ALTER TABLE workflow_instances DROP CONSTRAINT uq_workflow_instances_namespace_workflow_id",
            r"workflow_instances: unique constraint uq_workflow_instances_namespace_workflow_id: missing",
        ),
        Drift(
            "extra check constraint",
            _rebuild(
                "workflow_runs",
                r"\n\)$",
                ", \n\tCONSTRAINT ck_workflow_runs_run_number CHECK (run_number > 0)\n)",
            ),
            "ALTER TABLE workflow_runs ADD CONSTRAINT ck_workflow_runs_run_number CHECK (run_number > 0)",
            r"workflow_runs: check constraint ck_workflow_runs_run_number: not in revision 0001",
        ),
    )
}
"""Drifts on distinct elements, so any of them can be made together and each still shows once."""


def apply_drift(url: str, drift: Drift) -> None:
    if make_url(url).get_backend_name() == "sqlite":
        conn = sqlite3.connect(str(make_url(url).database), isolation_level=None)
        try:
            drift.sqlite(conn)
        finally:
            conn.close()
        return
    engine = create_admission_engine(url)
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql(drift.postgresql)
    finally:
        engine.dispose()


def assert_refused_listing(url: str, engine: Engine, drifts: list[Drift]) -> None:
    """``db upgrade --adopt`` exits 7, lists exactly these drifts' differences, and changes nothing."""
    before = snapshot(engine)
    result = cli(url, "db", "upgrade", "--adopt")
    assert result.returncode == EXIT_DRIFTED, result.stderr
    differences = json.loads(result.stdout)["differences"]
    assert len(differences) == len(drifts), differences
    for drift in drifts:
        assert any(re.fullmatch(drift.expected, line) for line in differences), (drift.name, differences)
    assert result.stderr.count("\n") == 1 and "nothing was changed" in result.stderr
    assert diff_snapshots(before, snapshot(engine)) == []
    assert scratch_schemas(engine) == []


@pytest.mark.parametrize("name", sorted(DRIFTS))
def test_a_drifted_copy_is_refused_with_the_difference_and_left_alone(
    name: str, unstamped: tuple[str, LegacyManifest], engine: Engine
) -> None:
    url, _ = unstamped
    apply_drift(url, DRIFTS[name])
    assert_refused_listing(url, engine, [DRIFTS[name]])
    with pytest.raises(SchemaDriftError) as refused:
        adopt(engine)
    assert refused.value.compared_with == ADOPTED_REVISION and len(refused.value.differences) == 1
    copied = pickle.loads(pickle.dumps(refused.value))
    assert (type(copied), copied.code, copied.differences) == (
        SchemaDriftError,
        "schema_drift",
        refused.value.differences,
    )


def _bare_unstamped(engine: Engine) -> None:
    """Revision 0001's tables without rows or stamp: the fixture's shape, cheaper to build."""
    upgrade(engine, "0001")
    with engine.begin() as conn:
        version_table_of(VERSION_TABLE).drop(conn)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(names=st.lists(st.sampled_from(sorted(DRIFTS)), min_size=1, max_size=4, unique=True))
def test_any_set_of_drifts_is_refused_and_each_is_listed_once(
    names: list[str], sql_backend: str, postgres_pool: PostgresPool, tmp_path: Path
) -> None:
    url = database_url(sql_backend, postgres_pool, tmp_path, migrated=False)
    engine = create_admission_engine(url)
    try:
        _bare_unstamped(engine)
        for name in names:
            apply_drift(url, DRIFTS[name])
        assert_refused_listing(url, engine, [DRIFTS[name] for name in names])
    finally:
        engine.dispose()
