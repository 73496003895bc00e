"""Alembic owns the schema: revisions 0001 to 0006, shipped inside the package."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import inspect

from admission.errors import InputError, StorageError
from admission.sql import (
    HEAD_REVISION,
    KNOWN_REVISIONS,
    VERSION_TABLE,
    alembic_config,
    create_admission_engine,
    downgrade,
    masked_url,
    metadata,
    revision_of,
    upgrade,
)
from tests.support.backends import PostgresPool, database_url

# Long: CI runs it in its step of extra tests (ADMISSION_TEST_SET=extra, .ci/run).
pytestmark = pytest.mark.extra

ROOT = Path(__file__).resolve().parents[2]


def fresh_engine(backend: str, pool: PostgresPool, tmp_path: Path):  # type: ignore[no-untyped-def]
    return create_admission_engine(database_url(backend, pool, tmp_path, migrated=False))


def test_revisions_are_0001_to_0007_and_head_is_what_the_code_reads(tmp_path: Path) -> None:
    engine = create_admission_engine(f"sqlite:///{tmp_path / 'x.sqlite3'}")
    script = ScriptDirectory.from_config(alembic_config(engine))
    chain = [rev.revision for rev in reversed(list(script.walk_revisions()))]
    assert chain == list(KNOWN_REVISIONS) == [f"admission_000{n}" for n in range(1, 8)]
    assert script.get_current_head() == HEAD_REVISION


def test_upgrade_head_equals_the_declared_tables(
    sql_backend: str, postgres_pool: PostgresPool, tmp_path: Path
) -> None:
    engine = fresh_engine(sql_backend, postgres_pool, tmp_path)
    assert upgrade(engine) == HEAD_REVISION
    with engine.connect() as conn:
        context = MigrationContext.configure(
            conn, opts={"compare_type": True, "compare_server_default": True, "version_table": VERSION_TABLE}
        )
        assert compare_metadata(context, metadata) == []
    engine.dispose()


def test_0001_has_no_intent_columns_and_0002_adds_them_nullable(
    sql_backend: str, postgres_pool: PostgresPool, tmp_path: Path
) -> None:
    engine = fresh_engine(sql_backend, postgres_pool, tmp_path)
    upgrade(engine, "0001")
    with engine.connect() as conn:
        columns = {c["name"]: c for c in inspect(conn).get_columns("workflow_commands")}
    assert "request_id" in columns and columns["request_id"]["nullable"]
    assert not {"intent_digest", "arguments_digest", "intent_encoding"} & columns.keys()
    upgrade(engine)
    with engine.connect() as conn:
        columns = {c["name"]: c for c in inspect(conn).get_columns("workflow_commands")}
    assert all(columns[c]["nullable"] for c in ("intent_digest", "arguments_digest", "intent_encoding"))
    engine.dispose()


def test_downgrade_is_refused_once_new_format_receipts_exist(
    sql_backend: str, postgres_pool: PostgresPool, tmp_path: Path
) -> None:
    from admission.receipts import AdmissionService
    from admission.sql import SqlStore

    engine = fresh_engine(sql_backend, postgres_pool, tmp_path)
    upgrade(engine)
    service = AdmissionService(SqlStore(engine))
    service.start_run("ns", "wf")
    service.admit_signal("ns", "wf", "go", [], request_id="k")
    with pytest.raises(RuntimeError, match="refusing to downgrade"):
        downgrade(engine, "0001")
    assert revision_of(engine) == HEAD_REVISION
    assert downgrade(engine, "0001", allow_unsafe=True) == "admission_0001"
    engine.dispose()


@pytest.mark.parametrize("url", ["notaurl", "nosuch://x", "postgresql://u:pw@h:port/x"])
def test_an_unusable_url_is_refused_as_input_keeping_the_cause(url: str) -> None:
    with pytest.raises(InputError) as caught:
        create_admission_engine(url)
    assert caught.value.field == "url"
    assert caught.value.__cause__ is not None


def test_a_database_that_cannot_be_opened_is_a_storage_error(tmp_path: Path) -> None:
    engine = create_admission_engine(f"sqlite:///{tmp_path / 'no-such-dir' / 'x.sqlite3'}")
    with pytest.raises(StorageError):
        revision_of(engine)
    with pytest.raises(StorageError):
        upgrade(engine)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://u:s3cr3t@h:5432/x", "postgresql://u:***@h:5432/x"),
        ("postgresql+psycopg://u:a/b:c@h/x", "postgresql+psycopg://u:***@h/x"),
        ("postgresql://u@h/x", "postgresql://u@h/x"),
        ("sqlite:////tmp/x.sqlite3", "sqlite:////tmp/x.sqlite3"),
        ("notaurl", "***"),
    ],
)
def test_masked_url_hides_only_the_password(url: str, shown: str) -> None:
    assert masked_url(url) == shown


def test_the_cli_upgrades_a_database(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'cli.sqlite3'}"
    for args, code in [(["db", "check"], 3), (["db", "upgrade"], 0), (["db", "check"], 0)]:
        result = subprocess.run(
            [sys.executable, "-m", "admission", "--db", url, *args],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == code, result.stderr
    assert HEAD_REVISION in result.stdout


def test_the_wheel_ships_the_migrations(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(ROOT)],
        check=True,
        timeout=600,
    )
    wheel = next(tmp_path.glob("admission-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    for required in (
        "admission/sql/migrations/env.py",
        "admission/sql/migrations/script.py.mako",
        "admission/sql/migrations/versions/0001_receipts.py",
        "admission/sql/migrations/versions/0002_intent.py",
        "admission/sql/migrations/versions/0003_worker.py",
        "admission/sql/migrations/versions/0004_jobs.py",
        "admission/sql/migrations/versions/0005_job_backoff.py",
        "admission/py.typed",
    ):
        assert required in names, required


@pytest.mark.parametrize("step", ["upgrade", "downgrade"])
def test_an_unknown_target_revision_is_refused_as_input_and_changes_nothing(
    step: str, sql_backend: str, postgres_pool: PostgresPool, tmp_path: Path
) -> None:
    engine = fresh_engine(sql_backend, postgres_pool, tmp_path)
    upgrade(engine, "0002")
    with pytest.raises(InputError) as refused:
        (upgrade if step == "upgrade" else downgrade)(engine, "nosuch")
    assert refused.value.field == "revision" and "nosuch" in str(refused.value)
    assert revision_of(engine) == "admission_0002"
    engine.dispose()


def test_a_stamp_an_earlier_build_left_at_the_head_moves_once_and_nothing_else_changes(
    sql_backend: str, postgres_pool: PostgresPool, tmp_path: Path, fresh_head: dict[str, Any]
) -> None:
    from sqlalchemy import text

    from admission.errors import SchemaRevisionError
    from admission.receipts import AdmissionService
    from admission.sql import SqlStore, check_revision
    from admission.sql._revisions import HOST_VERSION_TABLE, version_table_of
    from tests.support.snapshot import (
        diff_snapshots,
        snapshot,
        with_compact_payloads,
        without_command_run_key,
    )

    engine = fresh_engine(sql_backend, postgres_pool, tmp_path)
    upgrade(engine)
    service = AdmissionService(SqlStore(engine))
    service.start_run("ns", "wf")
    first = service.admit_signal("ns", "wf", "go", [1], request_id="k")
    downgrade(engine, "0004")  # the head of the builds that stamped alembic_version
    # As an earlier build at 0004 left it: the stamp in alembic_version, under the old id.
    with engine.begin() as conn:
        version_table_of(VERSION_TABLE).drop(conn)
        version_table_of(HOST_VERSION_TABLE).create(conn)
        conn.execute(text("INSERT INTO alembic_version (version_num) VALUES ('0004')"))
    before = snapshot(engine)
    with engine.connect() as conn, pytest.raises(SchemaRevisionError, match="admission db upgrade"):
        check_revision(conn)

    assert upgrade(engine) == HEAD_REVISION
    after = snapshot(engine)
    assert before["tables"].pop("alembic_version")["rows"] == [{"version_num": "0004"}]
    assert after["tables"].pop(VERSION_TABLE)["rows"] == [{"version_num": HEAD_REVISION}]
    jobs = after["tables"]["worker_jobs"]  # revision 0005's column, on a table with no rows
    del jobs["columns"]["not_before"]
    jobs["column_order"].remove("not_before")
    # And revisions 0006's and 0007's.
    assert diff_snapshots(with_compact_payloads(without_command_run_key(before), fresh_head), after) == []
    moved = snapshot(engine)
    assert upgrade(engine) == HEAD_REVISION  # once: a second upgrade finds nothing to move
    assert diff_snapshots(moved, snapshot(engine)) == []
    again = AdmissionService(SqlStore(engine)).admit_signal("ns", "wf", "go", [1], request_id="k")
    assert again.retained and again.command_id == first.command_id
    engine.dispose()


def test_0005_adds_not_before_leaving_every_job_as_it_was_and_its_downgrade_drops_only_it(
    sql_backend: str, postgres_pool: PostgresPool, tmp_path: Path
) -> None:
    from sqlalchemy import text

    from admission.jobs import Job, JobService
    from admission.sql import SqlJobStore
    from tests.support.snapshot import diff_snapshots, snapshot

    engine = fresh_engine(sql_backend, postgres_pool, tmp_path)
    upgrade(engine, "0004")
    with engine.begin() as conn:  # a job an 0004 build left waiting for its retry
        conn.execute(text("INSERT INTO worker_job_scopes VALUES ('s', 1, '2026-01-01 00:00:00+00:00')"))
        conn.execute(
            text(
                "INSERT INTO worker_jobs (job_id, scope, position, kind, payload, content, state, reason, "
                "max_attempts, attempts, fence, beat, paused, cancel_requested, stop_requested, "
                "checkpoint_step, created_at, updated_at) VALUES ('old', 's', 1, 'count', :bytes, :bytes, "
                "'retry_wait', 'retryable_failure', 3, 1, 1, 2, false, false, false, 0, "
                "'2026-01-01 00:00:00+00:00', '2026-01-01 00:00:00+00:00')"
            ),
            {"bytes": b"\xf6"},
        )
    before = snapshot(engine)
    assert upgrade(engine, "0005") == "admission_0005"
    after = snapshot(engine)
    jobs_after = after["tables"]["worker_jobs"]
    assert jobs_after["columns"]["not_before"]["nullable"]
    assert [row.pop("not_before") for row in jobs_after["rows"]] == [None]
    del jobs_after["columns"]["not_before"]
    jobs_after["column_order"].remove("not_before")
    for state in (before, after):
        state["tables"].pop(VERSION_TABLE)
    assert diff_snapshots(before, after) == []

    assert upgrade(engine) == HEAD_REVISION
    service = JobService(SqlJobStore(engine))
    claimed = service.claim_next("s")  # no backoff recorded: claimable as it was
    assert claimed is not None and claimed.job_id == "old" and claimed.lease is not None
    service.fail(claimed.lease, "again", retryable=True)
    service.enqueue(Job("new", "s", "count"))
    assert service.status("old").not_before is not None
    assert downgrade(engine, "0004") == "admission_0004"  # not refused: an older build retries at once
    with engine.connect() as conn:
        columns = {c["name"] for c in inspect(conn).get_columns("worker_jobs")}
        states = {str(r[0]): str(r[1]) for r in conn.execute(text("SELECT job_id, state FROM worker_jobs"))}
    assert "not_before" not in columns and states == {"old": "retry_wait", "new": "queued"}
    assert upgrade(engine) == HEAD_REVISION
    engine.dispose()


def test_0006_drops_only_the_commands_key_to_their_run_and_its_index_and_downgrade_puts_them_back(
    sql_backend: str, postgres_pool: PostgresPool, tmp_path: Path, fresh_head: dict[str, Any]
) -> None:
    from sqlalchemy import text

    from admission.errors import StorageError
    from admission.receipts import AdmissionService
    from admission.sql import SqlStore, audit
    from tests.support.snapshot import (
        diff_snapshots,
        snapshot,
        with_compact_payloads,
        without_command_run_key,
    )

    engine = fresh_engine(sql_backend, postgres_pool, tmp_path)
    assert upgrade(engine) == HEAD_REVISION
    service = AdmissionService(SqlStore(engine))
    run = service.start_run("ns", "wf")
    first = service.admit_signal("ns", "wf", "go", [1], request_id="k")
    update = service.admit_update("ns", "wf", "set", {"x": 1}, request_id="u", run_id=run.run_id)
    service.admit_signal("ns", "wf", "go", [2])  # no key
    service.close_run("ns", "wf", "completed")
    refused = service.admit_signal("ns", "wf", "go", [3], request_id="late")  # after the run closed
    assert downgrade(engine, "0005") == "admission_0005"
    at_0005 = snapshot(engine)
    commands = at_0005["tables"]["workflow_commands"]
    run_key = commands["foreign_keys"]["fk_workflow_commands_run_id_workflow_runs"]
    assert run_key["referred_table"] == "workflow_runs"
    assert commands["indexes"]["ix_workflow_commands_run_id"]["columns"] == ["run_id"]
    assert len(commands["rows"]) == 4

    assert upgrade(engine) == HEAD_REVISION
    at_head = snapshot(engine)
    at_0005["tables"][VERSION_TABLE]["rows"] = [{"version_num": HEAD_REVISION}]
    # Every row (the receipts above, the update pointing at its command) and every other element as it was.
    # (and 0007's column: the payloads its downgrade made whole stay whole)
    assert diff_snapshots(with_compact_payloads(without_command_run_key(at_0005), fresh_head), at_head) == []
    assert audit(engine).ok
    again = AdmissionService(SqlStore(engine))
    assert again.admit_signal("ns", "wf", "go", [1], request_id="k").command_id == first.command_id
    retried = again.admit_update("ns", "wf", "set", {"x": 1}, request_id="u", run_id=run.run_id)
    assert retried.retained and retried.command_id == update.command_id
    assert again.admit_signal("ns", "wf", "go", [3], request_id="late").command_id == refused.command_id

    # A command naming a run that is gone: the downgrade would break the key, so it is refused.
    with engine.begin() as conn:
        gone = text("UPDATE workflow_commands SET run_id = 'gone' WHERE id = :id")
        conn.execute(gone, {"id": first.command_id})
    # The deep check holds the reference the key held.
    findings = [(f.kind, f.table, f.detail) for f in audit(engine).findings]
    assert findings == [("dangling_reference", "workflow_commands", "run_id names no row of workflow_runs")]
    kept = snapshot(engine)
    with pytest.raises(StorageError, match=r"foreign keys|fk_workflow_commands_run_id_workflow_runs"):
        downgrade(engine, "0005")
    assert diff_snapshots(kept, snapshot(engine)) == []
    engine.dispose()


def test_0007_s_downgrade_makes_every_compact_payload_whole_and_is_refused_without_a_command(
    sql_backend: str, postgres_pool: PostgresPool, tmp_path: Path
) -> None:
    from sqlalchemy import text

    from admission.receipts import AdmissionService
    from admission.sql import SqlStore, audit
    from tests.support.snapshot import diff_snapshots, snapshot

    engine = fresh_engine(sql_backend, postgres_pool, tmp_path)
    assert upgrade(engine) == HEAD_REVISION
    store = SqlStore(engine)
    service = AdmissionService(store)
    run = service.start_run("ns", "wf")
    service.admit_signal("ns", "wf", "go", [1], request_id="k")
    service.admit_signal("ns", "wf", "go", [2])  # no key
    accepted = service.admit_update("ns", "wf", "set", {"x": 1}, request_id="u", run_id=run.run_id)
    assert accepted.update_id is not None
    service.release_update("ns", "wf", accepted.update_id, failure="boom")  # the row forgets "u"
    service.close_run("ns", "wf", "completed")  # the pending signals' rows get a reason
    refused = service.admit_signal("ns", "wf", "go", [3], request_id="late")  # no open run
    instance = store.find_instance("ns", "wf")
    assert instance is not None
    read = [(e.position, e.payload) for e in store.read_history(instance.id)]

    def stored() -> list[tuple[int, bytes]]:
        with engine.connect() as conn:
            rows = conn.execute(
                text("SELECT position, payload FROM workflow_history_events ORDER BY position")
            )
            return [(int(p), bytes(b)) for p, b in rows]

    assert stored() != read  # four admission events kept compact
    assert downgrade(engine, "0006") == "admission_0006"
    with engine.connect() as conn:
        assert "compact_payload" not in {
            c["name"] for c in inspect(conn).get_columns("workflow_history_events")
        }
    assert stored() == read  # each whole again, as the store read it
    assert upgrade(engine) == HEAD_REVISION
    assert [(e.position, e.payload) for e in store.read_history(instance.id)] == read
    assert audit(engine).ok

    # A compact event whose command is gone cannot be made whole: refused, nothing changed.
    again = service.admit_signal("ns", "wf", "go", [4], request_id="after")
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM workflow_commands WHERE id = :id"), {"id": again.command_id})
    kept = snapshot(engine)
    with pytest.raises(Exception, match="no command row to make their payloads whole from"):
        downgrade(engine, "0006")
    assert diff_snapshots(kept, snapshot(engine)) == []
    assert refused.command_id is not None
    store.dispose()
    engine.dispose()
