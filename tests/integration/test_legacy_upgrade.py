"""Upgrading a legacy database (contract §6): DDL only, nothing backfilled, no existing row changed.

A database an older engine wrote (``tools/legacy_fixtures.py``: revision 0001,
every legacy receipt shape) is snapshotted in full, upgraded through the
command line (``python -m admission --db URL db upgrade``), and snapshotted
again.  The only differences allowed are the declared deltas: revision 0002's
three new nullable columns on ``workflow_commands`` (NULL in every existing
row), the new, empty worker and outbox tables of revision 0003 and job tables
of revisions 0004 and 0005 (exactly as a fresh database at the head has them, with their
sequences on PostgreSQL), revision 0006's dropped foreign key from ``workflow_commands`` to its
run and index by run (the rows copied as they were, on SQLite), and the stamp: ``0001`` leaves
``alembic_version`` (where earlier builds kept it; the table goes) and the head lands in
``admission_alembic_version``.  Every other table, column, index, constraint, row (and, on
PostgreSQL, sequence) is identical.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, text

from admission.errors import SchemaRevisionError
from admission.receipts import AdmissionService, Decision
from admission.sql import HEAD_REVISION, VERSION_TABLE, SqlStore, create_admission_engine
from admission.sql._revisions import version_table_of
from tests.support.backends import SQL_BACKENDS, PostgresPool, database_url
from tests.support.processes import admission_cli as cli
from tests.support.snapshot import diff_snapshots, snapshot, with_compact_payloads, without_command_run_key
from tools.legacy_fixtures import LegacyCase, LegacyManifest, build_legacy_database

# Long: CI runs it in its step of extra tests (ADMISSION_TEST_SET=extra, .ci/run).
pytestmark = pytest.mark.extra

ROOT = Path(__file__).resolve().parents[2]

NEW_COLUMNS = {
    "intent_digest": "VARCHAR(64)",
    "arguments_digest": "VARCHAR(64)",
    "intent_encoding": "VARCHAR(16)",
}
"""Revision 0002's declared delta: these columns, nullable, without defaults, appended."""

NEW_TABLES = (
    "outbox_cursors",
    "worker_events",
    "worker_leases",
    "worker_queues",
    "worker_records",
    "worker_job_attempts",
    "worker_job_checkpoints",
    "worker_job_dependencies",
    "worker_job_events",
    "worker_job_scopes",
    "worker_jobs",
)
"""Revisions 0003 and 0004's declared delta: these tables, new and empty."""


@pytest.fixture
def empty_url(sql_backend: str, postgres_pool: PostgresPool, tmp_path: Path) -> str:
    """A fresh database on the backend under test, with no schema at all."""
    return database_url(sql_backend, postgres_pool, tmp_path, migrated=False)


@pytest.fixture
def legacy(empty_url: str) -> tuple[str, LegacyManifest]:
    """A database an older engine left behind: revision 0001 and every legacy shape."""
    return empty_url, build_legacy_database(empty_url)


@pytest.fixture
def engine(legacy: tuple[str, LegacyManifest]) -> Iterator[Engine]:
    engine = create_admission_engine(legacy[0])
    yield engine
    engine.dispose()


def declared_delta(before: dict[str, Any], head: dict[str, Any]) -> dict[str, Any]:
    """``before`` with exactly the declared changes applied: what ``after`` must equal."""
    # Revision 0006: every row as it was; 0007: one nullable column on the event log.
    expected = with_compact_payloads(without_command_run_key(before), head)
    for name in NEW_TABLES:
        assert name not in expected["tables"] and head["tables"][name]["rows"] == []
        expected["tables"][name] = head["tables"][name]
    for name, state in head["sequences"].items():
        if name.startswith(NEW_TABLES):
            expected["sequences"][name] = state
    commands = expected["tables"]["workflow_commands"]
    # What this dialect reports for a nullable VARCHAR without a default (autoincrement, ...).
    template = commands["columns"]["rejection_reason"]
    assert template["nullable"] and template["default"] is None
    for name, type_text in NEW_COLUMNS.items():
        assert name not in commands["columns"]
        commands["columns"][name] = {**template, "type": type_text, "nullable": True, "default": None}
        commands["column_order"].append(name)
        for row in commands["rows"]:
            row[name] = None
    legacy_stamp = expected["tables"].pop("alembic_version")
    assert legacy_stamp["rows"] == [{"version_num": "0001"}]
    expected["tables"]["admission_alembic_version"] = copy.deepcopy(
        head["tables"]["admission_alembic_version"]
    )
    assert expected["tables"]["admission_alembic_version"]["rows"] == [{"version_num": HEAD_REVISION}]
    return expected


# -- the upgrade changes exactly the declared delta ------------------------------------------------


def test_cli_upgrade_changes_only_the_declared_delta(
    legacy: tuple[str, LegacyManifest], engine: Engine, fresh_head: dict[str, Any]
) -> None:
    url, manifest = legacy
    before = snapshot(engine)
    assert {t: len(before["tables"][t]["rows"]) for t in manifest.row_counts} == manifest.row_counts
    assert not NEW_COLUMNS.keys() & before["tables"]["workflow_commands"]["columns"].keys()

    result = cli(url, "db", "upgrade")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert (report["from_revision"], report["revision"]) == ("admission_0001", HEAD_REVISION)

    after = snapshot(engine)
    assert diff_snapshots(declared_delta(before, fresh_head), after) == []

    # The same, said as the raw difference: only workflow_commands, the event log's new column
    # and the stamp, and only so much.
    lines = [
        line
        for line in diff_snapshots(before, after)
        if not line.startswith(
            tuple(f"{kind}.{name}" for kind in ("tables", "sequences") for name in NEW_TABLES)
        )
    ]
    commands = len(before["tables"]["workflow_commands"]["rows"])
    events = len(before["tables"]["workflow_history_events"]["rows"])
    # 0002's three columns, the column order, three values a row; 0006's key and index; 0007's
    # column, the column order, a value a row; the stamp.
    assert len(lines) == 3 + 1 + 3 * commands + 2 + 1 + 1 + events + 2, "\n".join(lines)
    assert all(
        line.startswith(
            (
                "tables.workflow_commands.",
                "tables.workflow_history_events.",
                "tables.alembic_version: removed",
                "tables.admission_alembic_version: added",
            )
        )
        for line in lines
    ), "\n".join(lines)
    for row in after["tables"]["workflow_commands"]["rows"]:
        assert (row["intent_digest"], row["arguments_digest"], row["intent_encoding"]) == (None, None, None)
    for name, type_text in NEW_COLUMNS.items():
        column = after["tables"]["workflow_commands"]["columns"][name]
        assert (column["type"], column["nullable"], column["default"]) == (type_text, True, None)


def test_upgrading_again_changes_nothing(legacy: tuple[str, LegacyManifest], engine: Engine) -> None:
    url, _ = legacy
    assert cli(url, "db", "upgrade").returncode == 0
    once = snapshot(engine)
    result = cli(url, "db", "upgrade")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["from_revision"] == HEAD_REVISION
    assert diff_snapshots(once, snapshot(engine)) == []


def test_downgrading_the_untouched_upgrade_restores_the_legacy_database_exactly(
    legacy: tuple[str, LegacyManifest], engine: Engine
) -> None:
    # No receipt was written with a digest, so the downgrade guard lets it through; it must then
    # be the exact inverse of the upgrade (on SQLite too, where dropping a column rebuilds the table).
    url, _ = legacy
    before = snapshot(engine)
    assert cli(url, "db", "upgrade").returncode == 0
    result = cli(url, "db", "downgrade", "0001")
    assert result.returncode == 0, result.stderr[-2000:]
    # The stamp stays where the upgrade moved it (it moves once); everything else is as before.
    after = snapshot(engine)
    moved = after["tables"].pop("admission_alembic_version")
    assert moved["rows"] == [{"version_num": "admission_0001"}]
    assert before["tables"].pop("alembic_version")["rows"] == [{"version_num": "0001"}]
    assert diff_snapshots(before, after) == []


# -- revision checks: refused before, working after ------------------------------------------------------


def test_store_refuses_the_legacy_revision_until_upgraded(legacy: tuple[str, LegacyManifest]) -> None:
    url, manifest = legacy
    with pytest.raises(SchemaRevisionError) as refused:
        SqlStore.open(url)
    assert "admission db upgrade" in str(refused.value) and "alembic_version" in str(refused.value)
    assert refused.value.revision == "admission_0001"

    assert cli(url, "db", "upgrade").returncode == 0
    store = SqlStore.open(url)
    try:
        case = next(c for c in manifest.cases if c.expected == "retained_unverified")
        answer = AdmissionService(store).receipt(
            case.namespace, case.workflow_id, case.command_type, case.key
        )
        assert answer is not None and answer.command_id == case.command_id
    finally:
        store.dispose()


def test_db_check_exits_3_before_and_0_after(legacy: tuple[str, LegacyManifest]) -> None:
    url, _ = legacy
    before = cli(url, "db", "check")
    assert before.returncode == 3, before.stderr
    report = json.loads(before.stdout)
    assert (report["revision"], report["head"], report["ok"]) == ("admission_0001", HEAD_REVISION, False)
    assert "admission db upgrade" in report["message"]

    assert cli(url, "db", "upgrade").returncode == 0
    after = cli(url, "db", "check")
    assert after.returncode == 0, after.stderr
    assert json.loads(after.stdout)["revision"] == HEAD_REVISION


def _stamp(engine: Engine, revision: str) -> None:
    # As a later admission would leave it: in admission's own version table.
    with engine.begin() as conn:
        conn.execute(text("DROP TABLE alembic_version"))
        version_table_of(VERSION_TABLE).create(conn)
        conn.execute(text(f"INSERT INTO {VERSION_TABLE} (version_num) VALUES (:r)"), {"r": revision})


def test_an_unknown_revision_is_refused_clearly_and_left_alone(
    legacy: tuple[str, LegacyManifest], engine: Engine
) -> None:
    url, _ = legacy
    _stamp(engine, "admission_0099")
    stamped = snapshot(engine)

    with pytest.raises(SchemaRevisionError) as refused:
        SqlStore.open(url)
    assert "'admission_0099'" in str(refused.value) and "does not know" in str(refused.value)
    assert refused.value.revision == "admission_0099"

    check = cli(url, "db", "check")
    assert check.returncode == 3
    assert "admission_0099" in json.loads(check.stdout)["message"]
    admit = cli(url, "receipt", "order-1001", "--namespace", "acme", "--type", "update", "--request-id", "x")
    assert admit.returncode == 3 and admit.stdout == ""
    assert "admission_0099" in admit.stderr and "Traceback" not in admit.stderr

    upgrade = cli(url, "db", "upgrade")
    assert upgrade.returncode != 0
    assert diff_snapshots(stamped, snapshot(engine)) == []


def test_db_upgrade_of_an_unknown_revision_says_so_in_one_line(
    legacy: tuple[str, LegacyManifest], engine: Engine
) -> None:
    url, _ = legacy
    _stamp(engine, "admission_0099")
    upgrade = cli(url, "db", "upgrade")
    assert upgrade.returncode == 3
    assert "admission_0099" in upgrade.stderr and "Traceback" not in upgrade.stderr


# -- the fixture -----------------------------------------------------------------------------------------


def test_the_fixture_builder_is_deterministic(
    sql_backend: str, postgres_pool: PostgresPool, tmp_path: Path
) -> None:
    snapshots = []
    manifests = []
    for _ in range(2):
        url = database_url(sql_backend, postgres_pool, tmp_path, migrated=False)
        manifests.append(build_legacy_database(url))
        engine = create_admission_engine(url)
        snapshots.append(snapshot(engine))
        engine.dispose()
    assert diff_snapshots(snapshots[0], snapshots[1]) == []
    assert snapshots[0] == snapshots[1]
    assert manifests[0].to_dict() == manifests[1].to_dict()


def test_the_fixture_rows_are_the_same_on_every_backend(postgres_pool: PostgresPool, tmp_path: Path) -> None:
    if len(SQL_BACKENDS) < 2:
        pytest.skip("needs both backends (ADMISSION_TEST_BACKEND=all)")
    rows = {}
    for backend in SQL_BACKENDS:
        url = database_url(backend, postgres_pool, tmp_path, migrated=False)
        build_legacy_database(url)
        engine = create_admission_engine(url)
        rows[backend] = {name: table["rows"] for name, table in snapshot(engine)["tables"].items()}
        engine.dispose()
    assert rows["sqlite"] == rows["postgresql"]


def test_the_fixture_script_prints_its_summary_and_refuses_a_used_database(empty_url: str) -> None:
    script = [sys.executable, str(ROOT / "tools" / "legacy_fixtures.py"), empty_url]
    result = subprocess.run(script, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["revision"] == "0001"
    assert summary["cases"] == len(summary["case_lines"]) > 0
    again = subprocess.run(script, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert again.returncode != 0 and "not empty" in again.stderr


def test_the_fixture_has_every_legacy_shape_in_every_run_state(legacy: tuple[str, LegacyManifest]) -> None:
    _, manifest = legacy
    matrix = manifest.matrix()
    for shape in ("raw-key", "token", "two-rows", "legacy-token", "modern-raw"):
        for state in ("open", "completed", "continued"):
            assert matrix[shape][state].get("update", 0) > 0, (shape, state)
            if shape != "raw-key":
                assert matrix[shape][state].get("signal", 0) > 0, (shape, state)
    retained = [c for c in manifest.cases if c.expected == "retained_unverified"]
    assert {c.outcome for c in retained} == {"received", "accepted", "completed", "failed"}
    completed = [c for c in retained if c.outcome == "completed"]
    assert {c.stored_result is None for c in completed} == {True, False}
    assert any(c.stored_result == "f6" for c in completed)
    assert any(c.result is not None for c in completed)
    assert {c.target is None for c in retained} == {True, False}
    assert {c.namespace for c in manifest.cases} == {"acme", "globex"}
    assert any(not c.key.isascii() for c in manifest.cases)
    keys = {(c.namespace, c.workflow_id, c.command_type, c.key) for c in manifest.cases}
    assert len(keys) == len(manifest.cases)
    assert any(
        a[:3] == b[:3] and a[3] != b[3] and a[3].casefold() == b[3].casefold() for a in keys for b in keys
    ), "two keys that differ only in case"
    assert len(manifest.unkeyed) >= 3


# -- after the upgrade, the legacy rows answer as contract §4/§6 says, and nothing is written ------------


def _check_answer(case: LegacyCase, answer: Any) -> None:
    where = f"{case.case_id} ({case.command_type} {case.key!r})"
    assert answer is not None, where
    assert answer.request_id == case.key, where
    if case.expected == "ambiguous":
        assert answer.decision is Decision.AMBIGUOUS, (where, answer)
        assert (answer.ambiguity, answer.http_status, answer.command_id) == (case.ambiguity, 409, None), where
        return
    assert answer.decision is Decision.RETAINED, (where, answer)
    assert (answer.retained, answer.intent_verified) == (True, False), where
    got = (
        answer.command_id,
        answer.run_id,
        answer.command_sequence,
        answer.update_id,
        answer.outcome,
        answer.http_status,
        answer.result,
        answer.failure,
        answer.target_scope,
    )
    want = (
        case.command_id,
        case.run_id,
        case.command_sequence,
        case.update_id,
        case.outcome,
        case.http_status,
        case.result,
        case.failure,
        "run" if case.target else "instance",
    )
    assert got == want, where


def test_legacy_receipts_answer_as_the_manifest_says_and_nothing_is_written(
    legacy: tuple[str, LegacyManifest], engine: Engine
) -> None:
    url, manifest = legacy
    assert cli(url, "db", "upgrade").returncode == 0
    upgraded = snapshot(engine)
    store = SqlStore.open(url)
    service = AdmissionService(store)
    admit = {"signal": service.admit_signal, "update": service.admit_update}
    try:
        for case in manifest.cases:
            _check_answer(
                case, service.receipt(case.namespace, case.workflow_id, case.command_type, case.key)
            )
            # A retry with the stored name and target (arguments are never compared on a legacy row).
            retry = admit[case.command_type](
                case.namespace,
                case.workflow_id,
                case.name,
                {"not": "compared"},
                request_id=case.key,
                run_id=case.target,
            )
            _check_answer(case, retry)
            other = admit[case.command_type](
                case.namespace, case.workflow_id, case.name + "-renamed", [], request_id=case.key
            )
            if case.expected == "ambiguous":
                assert other.decision is Decision.AMBIGUOUS, case.case_id
            else:
                assert other.decision is Decision.CONFLICT, case.case_id
                assert other.retained_command_id == case.command_id, case.case_id
                expected_parts = ("name", "target") if case.target else ("name",)
                assert (other.conflict, other.intent_verified) == (expected_parts, False), case.case_id
        for instance in manifest.instances:
            history = service.history(instance.namespace, instance.workflow_id)
            assert history and all(isinstance(e.payload, dict) for e in history)
    finally:
        store.dispose()
    assert diff_snapshots(upgraded, snapshot(engine)) == []


def _retry_every_case(url: str, cases: list[dict[str, Any]], barrier: Any, out: Any) -> None:
    """One of four processes: the same changed-input retry of every legacy receipt, in step."""
    store = SqlStore.open(url)
    service = AdmissionService(store)
    try:
        for case in cases:
            barrier.wait(timeout=60)
            admit = service.admit_signal if case["command_type"] == "signal" else service.admit_update
            for arguments, name in (({"changed": True}, case["name"]), ([], case["name"] + "-renamed")):
                answer = admit(
                    case["namespace"],
                    case["workflow_id"],
                    name,
                    arguments,
                    request_id=case["key"],
                    run_id=case["target"] if name == case["name"] else None,
                )
                out.put((case["case_id"], name == case["name"], answer.to_dict()))
    finally:
        store.dispose()


def test_four_concurrent_changed_input_retries_of_every_legacy_receipt_agree_and_write_nothing(
    legacy: tuple[str, LegacyManifest], engine: Engine
) -> None:
    import multiprocessing

    url, manifest = legacy
    assert cli(url, "db", "upgrade").returncode == 0
    before = snapshot(engine)
    context = multiprocessing.get_context("spawn")
    barrier, out = context.Barrier(4), context.Queue()
    cases = [
        {
            k: getattr(c, k)
            for k in ("case_id", "namespace", "workflow_id", "command_type", "key", "name", "target")
        }
        for c in manifest.cases
    ]
    workers = [context.Process(target=_retry_every_case, args=(url, cases, barrier, out)) for _ in range(4)]
    for worker in workers:
        worker.start()
    answers: dict[tuple[str, bool], list[dict[str, Any]]] = {}
    for _ in range(4 * 2 * len(cases)):
        case_id, same_name, answer = out.get(timeout=120)
        answers.setdefault((case_id, same_name), []).append(answer)
    for worker in workers:
        worker.join(timeout=60)
        assert worker.exitcode == 0
    by_id = {c.case_id: c for c in manifest.cases}
    for (case_id, same_name), four in answers.items():
        assert len(four) == 4 and all(a == four[0] for a in four), case_id
        case = by_id[case_id]
        if case.expected == "ambiguous":
            assert four[0]["outcome"] == "request_id_ambiguous", case_id
        elif same_name:
            # Changed arguments on a legacy receipt: nothing proves them, so it is retained, unverified.
            assert (four[0]["retained"], four[0]["intent_verified"], four[0]["command_id"]) == (
                True,
                False,
                case.command_id,
            ), case_id
        else:
            assert four[0]["outcome"] == "request_id_conflict" and "name" in four[0]["conflict"], case_id
    assert diff_snapshots(before, snapshot(engine)) == []
