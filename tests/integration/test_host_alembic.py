"""Inside a host's alembic: the recipe in ``alembic/`` run on both backends, in both orders.

The recipe is a small host project's alembic environment that includes
admission's packaged revisions (``version_locations``) and makes its own
revision depend on the ``admission`` branch.  Each test drives it as a user
would, with ``python -m alembic -c alembic/alembic.ini``, and the admission
command line, as separate processes:

- on a fresh database, ``alembic upgrade heads`` builds both histories;
- host first: the host's alembic builds the database, then admission's own
  commands find their revision among the host's heads;
- admission first: ``admission db upgrade`` builds admission's tables and
  writes a receipt, then the host's alembic takes the stamp over;
- a database an earlier build stamped in ``alembic_version`` joins the host;
- the host's autogenerate proposes nothing about admission's tables.

And without the recipe: a host that keeps its own alembic history in
``alembic_version`` and admission's own commands leave each other alone.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import Engine, inspect, text

from admission.receipts import AdmissionService
from admission.sql import (
    HEAD_REVISION,
    VERSION_TABLE,
    SqlStore,
    create_admission_engine,
    metadata,
    normalize_url,
)
from tests.support.backends import SQL_BACKENDS, PostgresPool, database_url
from tests.support.processes import admission_cli as admission
from tests.support.snapshot import diff_snapshots, snapshot
from tools.legacy_fixtures import build_legacy_database

# Long: CI runs it in its step of extra tests (ADMISSION_TEST_SET=extra, .ci/run).
pytestmark = pytest.mark.extra

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "alembic"
HOST_REVISION = "5f0c2a9e7d13"
HOST_TABLE = "engine_schedules"


def alembic(url: str, *args: str, recipe: Path = RECIPE) -> subprocess.CompletedProcess[str]:
    """The host's alembic, run from the host project as its users run it."""
    command = [sys.executable, "-m", "alembic", "-c", str(recipe / "alembic.ini"), "-x", f"db={url}", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=recipe)


@pytest.fixture
def url(sql_backend: str, postgres_pool: PostgresPool, tmp_path: Path) -> str:
    """An empty database; with the psycopg driver named, as a host's URL would."""
    return normalize_url(database_url(sql_backend, postgres_pool, tmp_path, migrated=False))


def heads(engine: Engine, table: str = "alembic_version") -> set[str]:
    with engine.connect() as conn:
        return set(conn.execute(text(f"SELECT version_num FROM {table}")).scalars())


def tables(engine: Engine) -> set[str]:
    with engine.connect() as conn:
        return set(inspect(conn).get_table_names())


def admit_once(url: str, key: str, *, start: bool = True) -> tuple[str, bool, str | None]:
    """Admit one keyed signal (starting the run first): (decision, retained, command id)."""
    store = SqlStore.open(url)
    try:
        service = AdmissionService(store)
        if start:
            service.start_run("ns", "wf")
        answer = service.admit_signal("ns", "wf", "go", [1], request_id=key)
        return str(answer.decision), answer.retained, answer.command_id
    finally:
        store.dispose()


def autogenerate_proposes_nothing(url: str, tmp_path: Path) -> None:
    check = alembic(url, "check")
    assert check.returncode == 0, check.stdout + check.stderr
    assert "No new upgrade operations detected" in check.stdout + check.stderr
    # The same, as a host developer sees it: the revision autogenerate writes is empty.
    recipe = tmp_path / "recipe"
    shutil.copytree(RECIPE, recipe, ignore=shutil.ignore_patterns("__pycache__"))
    made = alembic(url, "revision", "--autogenerate", "--head", "engine@head", "-m", "nothing", recipe=recipe)
    assert made.returncode == 0, made.stderr
    (written,) = [p for p in (recipe / "versions").glob("*nothing.py")]
    body = written.read_text()
    assert "def upgrade() -> None:" in body and "op." not in body, body
    assert not any(name in body for name in metadata.tables)


def test_a_fresh_database_gets_both_histories_from_upgrade_heads(url: str, tmp_path: Path) -> None:
    result = alembic(url, "upgrade", "heads")
    assert result.returncode == 0, result.stderr
    engine = create_admission_engine(url)
    try:
        assert heads(engine) == {HOST_REVISION, HEAD_REVISION}
        assert {HOST_TABLE, *metadata.tables} <= tables(engine)
        assert VERSION_TABLE not in tables(engine)  # admission's head is the host's to keep
    finally:
        engine.dispose()
    autogenerate_proposes_nothing(url, tmp_path)


def test_host_first_then_admission_finds_its_revision_among_the_hosts_heads(url: str) -> None:
    assert alembic(url, "upgrade", "heads").returncode == 0
    check = admission(url, "db", "check")
    assert check.returncode == 0, check.stdout + check.stderr
    assert json.loads(check.stdout)["revision"] == HEAD_REVISION
    # Already at the head: admission's upgrade has nothing to do and touches nothing.
    engine = create_admission_engine(url)
    try:
        before = snapshot(engine)
        again = admission(url, "db", "upgrade")
        assert again.returncode == 0, again.stderr
        assert diff_snapshots(before, snapshot(engine)) == []
    finally:
        engine.dispose()
    assert admit_once(url, "k1")[:2] == ("fresh", False)
    assert alembic(url, "current").returncode == 0


def test_admission_first_then_the_host_takes_the_stamp_over(url: str, tmp_path: Path) -> None:
    assert admission(url, "db", "upgrade").returncode == 0
    decision, retained, command_id = admit_once(url, "k1")
    assert (decision, retained) == ("fresh", False)
    engine = create_admission_engine(url)
    try:
        assert heads(engine, VERSION_TABLE) == {HEAD_REVISION}
        before = snapshot(engine)

        result = alembic(url, "upgrade", "heads")
        assert result.returncode == 0, result.stderr
        assert heads(engine) == {HOST_REVISION, HEAD_REVISION}
        after = snapshot(engine)
    finally:
        engine.dispose()
    # Exactly: admission's own version table went, the host's version table and table came.
    assert set(before["tables"]) - set(after["tables"]) == {VERSION_TABLE}
    assert set(after["tables"]) - set(before["tables"]) == {"alembic_version", HOST_TABLE}
    for name in metadata.tables:
        assert diff_snapshots(before["tables"][name], after["tables"][name]) == [], name
    assert admit_once(url, "k1", start=False) == ("retained", True, command_id)
    assert admission(url, "db", "check").returncode == 0
    autogenerate_proposes_nothing(url, tmp_path)


def test_a_database_an_earlier_build_stamped_joins_the_host(url: str) -> None:
    manifest = build_legacy_database(url)  # 0001 in alembic_version, as earlier builds left it
    result = alembic(url, "upgrade", "heads")
    assert result.returncode == 0, result.stderr
    engine = create_admission_engine(url)
    try:
        assert heads(engine) == {HOST_REVISION, HEAD_REVISION}
    finally:
        engine.dispose()
    case = next(c for c in manifest.cases if c.expected == "retained_unverified")
    store = SqlStore.open(url)
    try:
        answer = AdmissionService(store).receipt(
            case.namespace, case.workflow_id, case.command_type, case.key
        )
        assert answer is not None and answer.command_id == case.command_id
    finally:
        store.dispose()


def test_admission_leaves_a_hosts_own_alembic_history_alone(url: str) -> None:
    # A host that never included admission: its own head in alembic_version.
    engine = create_admission_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(text("CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL PRIMARY KEY)"))
            conn.execute(text("INSERT INTO alembic_version VALUES ('1975ea83b712')"))
        upgraded = admission(url, "db", "upgrade")
        assert upgraded.returncode == 0, upgraded.stderr
        assert heads(engine) == {"1975ea83b712"}
        assert heads(engine, VERSION_TABLE) == {HEAD_REVISION}
        assert admission(url, "db", "check").returncode == 0
    finally:
        engine.dispose()


# -- a PostgreSQL schema of the user's choice ------------------------------------------------------


@pytest.fixture
def pg_url(postgres_pool: PostgresPool) -> str:
    if "postgresql" not in SQL_BACKENDS:
        pytest.skip("PostgreSQL is not selected (ADMISSION_TEST_BACKEND)")
    return postgres_pool.fresh_database(migrated=False)


def schema_tables(engine: Engine, schema: str) -> set[str]:
    with engine.connect() as conn:
        return set(inspect(conn).get_table_names(schema=schema))


def test_a_schema_holds_every_table_and_two_schemas_are_apart(pg_url: str) -> None:
    for schema in ("tenant_a", "tenant_b"):
        result = admission(pg_url, "--schema", schema, "db", "upgrade")
        assert result.returncode == 0, result.stderr
    engine = create_admission_engine(pg_url)
    try:
        assert schema_tables(engine, "public") == set()
        for schema in ("tenant_a", "tenant_b"):
            assert schema_tables(engine, schema) == {*metadata.tables, VERSION_TABLE}
    finally:
        engine.dispose()
    answers = {}
    for schema in ("tenant_a", "tenant_b"):
        store = SqlStore.open(pg_url, schema=schema)
        try:
            service = AdmissionService(store)
            service.start_run("ns", "wf")
            first = service.admit_signal("ns", "wf", "go", [1], request_id="k")
            again = service.admit_signal("ns", "wf", "go", [1], request_id="k")
            answers[schema] = (first.retained, again.retained, again.command_id == first.command_id)
        finally:
            store.dispose()
    # The same key is fresh in each schema: nothing of one is visible from the other.
    assert answers == {"tenant_a": (False, True, True), "tenant_b": (False, True, True)}
    check = admission(pg_url, "--schema", "tenant_a", "db", "check")
    assert check.returncode == 0, check.stdout + check.stderr
    # Without the schema, the default one has no admission schema at all.
    assert admission(pg_url, "db", "check").returncode == 3


@pytest.mark.parametrize(
    ("schema", "says"),
    [("Tenant", "lower-case"), ("1x", "lower-case"), ("a;drop", "lower-case"), ("x" * 64, "1 to 63")],
)
def test_a_bad_schema_name_is_refused_before_anything(pg_url: str, schema: str, says: str) -> None:
    result = admission(pg_url, "--schema", schema, "db", "upgrade")
    assert result.returncode == 2, result.stderr
    assert says in result.stderr and "schema" in result.stderr and "Traceback" not in result.stderr
    engine = create_admission_engine(pg_url)
    try:
        with engine.connect() as conn:
            assert inspect(conn).get_schema_names() == ["information_schema", "public"]
    finally:
        engine.dispose()


def test_a_schema_on_sqlite_is_refused(tmp_path: Path) -> None:
    result = admission(f"sqlite:///{tmp_path / 'x.sqlite3'}", "--schema", "tenant_a", "db", "upgrade")
    assert result.returncode == 2 and "PostgreSQL only" in result.stderr
    assert not (tmp_path / "x.sqlite3").exists()


def test_tables_with_no_stamp_are_refused_by_the_host_until_adopted(url: str) -> None:
    build_legacy_database(url, stamp="none")
    engine = create_admission_engine(url)
    try:
        before = snapshot(engine)
        refused = alembic(url, "upgrade", "heads")
        assert refused.returncode != 0 and "admission db upgrade --adopt" in refused.stderr
        assert diff_snapshots(before, snapshot(engine)) == []
        assert admission(url, "db", "upgrade", "--adopt").returncode == 0
        result = alembic(url, "upgrade", "heads")
        assert result.returncode == 0, result.stderr
        assert heads(engine) == {HOST_REVISION, HEAD_REVISION}
    finally:
        engine.dispose()


def test_a_host_kept_stamp_behind_the_head_is_the_hosts_to_upgrade(url: str) -> None:
    engine = create_admission_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(text("CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL PRIMARY KEY)"))
            conn.execute(text("INSERT INTO alembic_version VALUES ('1975ea83b712'), ('admission_0003')"))
        before = snapshot(engine)
        check = admission(url, "db", "check")
        assert check.returncode == 3 and "alembic upgrade heads" in json.loads(check.stdout)["message"]
        upgraded = admission(url, "db", "upgrade")
        assert upgraded.returncode == 3 and "alembic upgrade heads" in upgraded.stderr
        assert diff_snapshots(before, snapshot(engine)) == []
    finally:
        engine.dispose()


def test_a_stamp_in_both_places_is_refused_naming_both(url: str) -> None:
    assert admission(url, "db", "upgrade").returncode == 0
    engine = create_admission_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(text("CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL PRIMARY KEY)"))
            conn.execute(text("INSERT INTO alembic_version VALUES ('admission_0003')"))
        check = admission(url, "db", "check")
        assert check.returncode == 3, check.stderr
        message = check.stderr + check.stdout
        assert "stamped twice" in message and HEAD_REVISION in message and "admission_0003" in message
    finally:
        engine.dispose()
