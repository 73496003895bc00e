"""``admission db check --deep`` and ``admission.sql.audit``: a tampered byte, a deleted event or a
row that names nothing is found and named; a clean database is clean; nothing is ever written.

Each attack is made on a database a real history filled (signals, updates, closed, continued and
pruned runs, a rolled-back admission, the outbox, the worker and durable jobs), directly in SQL, as
an operator's mistake or a disk's would make it, on SQLite and PostgreSQL.
"""

from __future__ import annotations

import json
import sqlite3
import uuid
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, delete, event, func, insert, select, update

from admission.jobs import Job
from admission.receipts import AdmissionService
from admission.sql import (
    AuditReport,
    SqlStore,
    SqlWorkerStore,
    audit,
    create_admission_engine,
    upgrade,
    workflow_commands,
    workflow_history_events,
)
from admission.worker import DurableWorker, Scope, SqliteTarget, record_outbox
from tests.integration.test_cli_failures import run
from tests.support.backends import PostgresPool, database_url, sqlite_url
from tests.support.jobkit import ManualClock, open_jobs
from tests.support.snapshot import diff_snapshots, snapshot
from tools.legacy_fixtures import build_legacy_database

SCOPE = Scope.parse({"tenant": "t1", "account": "a1", "page": "p1", "form": "f1"})
SECRET_ARGUMENT = "4111-1111-1111-1111"
"""An argument value no output may show."""
SECRET_KEY = "key-that-is-a-secret"
"""A literal command key no output may show."""


class Clock:
    """Wall time that moves one second per call, from a fixed start (``jump`` moves it further)."""

    def __init__(self) -> None:
        self.now = datetime(2026, 1, 1, tzinfo=UTC)

    def __call__(self) -> datetime:
        self.now += timedelta(seconds=1)
        return self.now

    def jump(self, days: int) -> None:
        self.now += timedelta(days=days)


@dataclass(frozen=True)
class History:
    """What :func:`fill` made: the ids the attacks aim at."""

    secret_command: str
    applied_signal: str
    outbox_position: int


def fill(url: str, tmp: Path) -> History:
    """A history with every kind of row: the audit of it must find nothing."""
    clock = Clock()
    store = SqlStore.open(url)
    service = AdmissionService(store, clock=clock)
    try:
        # A run that is closed long ago and pruned, with a run-less refusal before it.
        service.admit_signal("ns", "old", "early", {}, request_id="before-any-run")
        service.start_run("ns", "old")
        service.admit_update("ns", "old", "u", {"n": 1}, request_id="old-u")
        service.close_run("ns", "old", "completed")
        clock.jump(40)
        # Nothing was written in those 40 days: the clock-lead cap is lifted to prune.
        assert service.prune(30, dry_run=True, max_clock_lead=None).counts.events > 0  # rolled back
        assert service.prune(30, max_clock_lead=None).counts.events > 0
        # An open run: keyed and unkeyed signals, updates accepted, completed and failed.
        service.start_run("ns", "wf")
        secret = service.admit_signal("ns", "wf", "pay", {"card": SECRET_ARGUMENT}, request_id=SECRET_KEY)
        applied = service.admit_signal("ns", "wf", "go", [1, 2.5, None])
        service.apply_signal("ns", "wf", applied.command_id)  # type: ignore[arg-type]
        done = service.admit_update("ns", "wf", "approve", {"amount": 12.5}, request_id="u-1")
        service.complete_update("ns", "wf", done.update_id, {"ok": True})  # type: ignore[arg-type]
        failed = service.admit_update("ns", "wf", "approve", {"amount": 13}, request_id="u-2")
        service.fail_update("ns", "wf", failed.update_id, "no")  # type: ignore[arg-type]
        service.admit_update("ns", "wf", "pending", {}, request_id="u-3")
        run_id = service.admit_signal("ns", "wf", "x", {}).run_id
        service.admit_signal("ns", "wf", "targeted", {}, request_id="t-1", run_id=run_id)
        # A closed run with commands pending at closure, then a refusal; a continued run.
        service.start_run("ns", "closed")
        service.admit_signal("ns", "closed", "late", {}, request_id="s-late")
        service.admit_update("ns", "closed", "late", {}, request_id="u-late")
        service.close_run("ns", "closed", "failed")
        service.admit_signal("ns", "closed", "after", {}, request_id="s-after")
        service.start_run("ns", "chain")
        service.admit_signal("ns", "chain", "handed", {"k": "v"}, request_id="h-1")
        service.continue_as_new("ns", "chain")
        # A rolled-back admission (PostgreSQL keeps its position consumed), and the outbox.
        with pytest.raises(RuntimeError), store.begin() as conn:
            service.admit_signal("ns", "wf", "lost", {}, request_id="lost", connection=conn)
            raise RuntimeError("the caller's transaction failed")
        with store.begin() as conn:
            service.admit_signal("ns", "wf", "lead", {"id": 1}, request_id="r-1", connection=conn)
            entry = record_outbox(
                store,
                conn,
                "ns",
                "wf",
                target="crm",
                source_key="lead-1",
                content={**SCOPE.as_dict(), "source_key": "lead-1", "payload": {"n": 1}},
            )
        service.admit_signal("ns", "wf", "last", {})  # the outbox entry is not the newest event
        # The durable worker and durable jobs.
        worker = DurableWorker(SqlWorkerStore(store.engine), SCOPE, file_lock=False)
        worker.accept({**SCOPE.as_dict(), "source_key": "lead-9", "payload": {"n": 9}})
        target = SqliteTarget(tmp / "target.sqlite3")
        worker.run_once(target)
        target.close()
    finally:
        store.dispose()
    jobs = open_jobs(url, ManualClock())
    try:
        jobs.enqueue(Job("j1", "tenant-a", "count", {"steps": 2}))
        jobs.enqueue(Job("j2", "tenant-a", "count", {"steps": 1}, depends_on=("j1",)))
        lease = jobs.claim("j1").lease
        assert lease is not None
        jobs.checkpoint(lease, 1, {"sum": 1})
        jobs.record_result(lease, {"sum": 3})
        jobs.complete(lease)
    finally:
        jobs.dispose()
    assert secret.command_id is not None and applied.command_id is not None
    return History(secret.command_id, applied.command_id, entry.position)


@pytest.fixture
def filled(db_url: str, tmp_path: Path) -> tuple[str, History]:
    return db_url, fill(db_url, tmp_path)


@pytest.fixture
def engine(filled: tuple[str, History]) -> Iterator[Engine]:
    engine = create_admission_engine(filled[0])
    yield engine
    engine.dispose()


def kinds(report: AuditReport) -> set[tuple[str, str, str]]:
    """(kind, table, the row's first key value) of every finding."""
    return {(f.kind, f.table, str(next(iter(f.key.values())))) for f in report.findings}


def change(engine: Engine, statement: Any, rows: int = 1) -> None:
    with engine.begin() as conn:
        assert conn.execute(statement).rowcount == rows


def event_of(engine: Engine, command_id: str, event_type: str) -> int:
    events = workflow_history_events
    with engine.connect() as conn:
        return int(
            conn.execute(
                select(events.c.position).where(
                    events.c.command_id == command_id, events.c.event_type == event_type
                )
            ).scalar_one()
        )


# -- a clean database ---------------------------------------------------------------------------------


def test_a_database_with_every_kind_of_row_is_clean(engine: Engine) -> None:
    report = audit(engine)
    assert report.findings == () and report.ok and not report.truncated
    with engine.connect() as conn:
        commands, events = (
            conn.execute(select(func.count()).select_from(table)).scalar_one()
            for table in (workflow_commands, workflow_history_events)
        )
    assert report.rows["workflow_commands"] == commands == 13  # every command read, each once
    assert report.rows["workflow_history_events.payload"] == events
    assert report.rows["worker_job_checkpoints.state"] == 1


def test_the_audit_writes_nothing(engine: Engine) -> None:
    change(
        engine, delete(workflow_history_events).where(workflow_history_events.c.event_type == "RunClosed"), 2
    )
    before = snapshot(engine)
    assert not audit(engine, batch_size=1).ok  # one row per round trip: every table streamed
    assert diff_snapshots(before, snapshot(engine)) == []


def test_batches_of_one_find_what_one_batch_finds(engine: Engine, filled: tuple[str, History]) -> None:
    change(engine, delete(workflow_commands).where(workflow_commands.c.id == filled[1].applied_signal))
    assert kinds(audit(engine, batch_size=1)) == kinds(audit(engine)) != set()


# -- the attacks --------------------------------------------------------------------------------------


def test_a_tampered_argument_byte_is_a_digest_finding_naming_the_command(
    engine: Engine, filled: tuple[str, History]
) -> None:
    command = filled[1].secret_command
    commands = workflow_commands
    with engine.connect() as conn:
        stored = bytes(
            conn.execute(select(commands.c.arguments).where(commands.c.id == command)).scalar_one()
        )
    tampered = stored.replace(b"4111", b"4112")  # still canonical: only the digests can tell
    assert tampered != stored
    change(engine, update(commands).where(commands.c.id == command).values(arguments=tampered))
    report = audit(engine)
    assert kinds(report) == {
        ("arguments_digest_mismatch", "workflow_commands", command),
        ("intent_digest_mismatch", "workflow_commands", command),
    }
    assert not report.ok
    shown = json.dumps(report.to_dict())
    # The tampered value whole, not its four digits: a command's random id may hold "4112".
    tampered_argument = SECRET_ARGUMENT.replace("4111", "4112")
    assert SECRET_ARGUMENT not in shown and tampered_argument not in shown and SECRET_KEY not in shown


def test_a_tampered_name_or_target_is_an_intent_digest_finding(
    engine: Engine, filled: tuple[str, History]
) -> None:
    command = filled[1].secret_command
    change(engine, update(workflow_commands).where(workflow_commands.c.id == command).values(name="refund"))
    assert kinds(audit(engine)) == {("intent_digest_mismatch", "workflow_commands", command)}


def test_a_swapped_context_is_a_context_finding(engine: Engine, filled: tuple[str, History]) -> None:
    # The receipt of one key made to answer another: the context no longer gives the token.
    command = filled[1].secret_command
    commands = workflow_commands
    with engine.connect() as conn:
        other = conn.execute(
            select(commands.c.context)
            .where(commands.c.context.is_not(None), commands.c.id != command)
            .limit(1)
        ).scalar_one()
    change(engine, update(commands).where(commands.c.id == command).values(context=other))
    assert kinds(audit(engine)) == {("context_mismatch", "workflow_commands", command)}


def test_a_deleted_admission_event_is_a_missing_event_finding(
    engine: Engine, filled: tuple[str, History], sql_backend: str
) -> None:
    command = filled[1].secret_command
    position = event_of(engine, command, "SignalReceived")
    change(engine, delete(workflow_history_events).where(workflow_history_events.c.position == position))
    found = kinds(audit(engine))
    assert ("missing_event", "workflow_commands", command) in found
    # SQLite hands positions out under its write lock, so the hole itself is a finding too; a
    # PostgreSQL sequence leaves holes for every rolled-back transaction (docs/event-log.md, "Gaps").
    gaps = {f for f in found if f[0] == "event_gap"}
    assert gaps == (
        {("event_gap", "workflow_history_events", str(position))} if sql_backend == "sqlite" else set()
    )
    assert found - gaps == {("missing_event", "workflow_commands", command)}


def test_a_deleted_state_event_is_a_missing_event_finding(
    engine: Engine, filled: tuple[str, History]
) -> None:
    signal = filled[1].applied_signal
    position = event_of(engine, signal, "SignalApplied")
    change(engine, delete(workflow_history_events).where(workflow_history_events.c.position == position))
    assert ("missing_event", "workflow_commands", signal) in kinds(audit(engine))


def test_a_deleted_outbox_entry_is_a_gap_on_sqlite(
    engine: Engine, filled: tuple[str, History], sql_backend: str
) -> None:
    # Nothing else names an outbox entry: only the positions can tell it is gone, and only where a
    # rolled-back transaction gives its position back (SQLite).
    position = filled[1].outbox_position
    change(engine, delete(workflow_history_events).where(workflow_history_events.c.position == position))
    expected = {("event_gap", "workflow_history_events", str(position))} if sql_backend == "sqlite" else set()
    assert kinds(audit(engine)) == expected


def test_an_event_whose_command_is_gone_is_an_orphan_event(
    engine: Engine, filled: tuple[str, History]
) -> None:
    signal = filled[1].applied_signal
    received, applied = event_of(engine, signal, "SignalReceived"), event_of(engine, signal, "SignalApplied")
    change(engine, delete(workflow_commands).where(workflow_commands.c.id == signal))
    assert kinds(audit(engine)) == {
        ("orphan_event", "workflow_history_events", str(received)),
        ("orphan_event", "workflow_history_events", str(applied)),
    }


def test_an_extra_event_naming_no_command_is_an_orphan_event(engine: Engine) -> None:
    events = workflow_history_events
    with engine.begin() as conn:
        row = (
            conn.execute(select(events).where(events.c.event_type == "SignalReceived").limit(1))
            .mappings()
            .one()
        )
        values = {k: v for k, v in row.items() if k != "position"}
        position = conn.execute(
            insert(events).values({**values, "command_id": str(uuid.uuid4())}).returning(events.c.position)
        ).scalar_one()
    assert kinds(audit(engine)) == {("orphan_event", "workflow_history_events", str(position))}


def test_a_second_admission_event_is_a_duplicate(engine: Engine, filled: tuple[str, History]) -> None:
    events, command = workflow_history_events, filled[1].secret_command
    with engine.begin() as conn:
        row = conn.execute(select(events).where(events.c.command_id == command)).mappings().first()
        assert row is not None
        conn.execute(insert(events).values({k: v for k, v in row.items() if k != "position"}))
    assert kinds(audit(engine)) == {("duplicate_event", "workflow_commands", command)}


def test_findings_beyond_the_limit_are_counted_not_listed(engine: Engine) -> None:
    change(
        engine, delete(workflow_history_events).where(workflow_history_events.c.event_type == "RunClosed"), 2
    )
    report = audit(engine, max_findings=1)
    assert len(report.findings) == 1 and report.truncated and report.counts["missing_event"] >= 2


# -- a legacy database ----------------------------------------------------------------------------------


def test_an_upgraded_legacy_database_has_only_unverifiable_notes(
    sql_backend: str, postgres_pool: PostgresPool, tmp_path: Path
) -> None:
    url = database_url(sql_backend, postgres_pool, tmp_path, migrated=False)
    manifest = build_legacy_database(url)
    engine = create_admission_engine(url)
    try:
        upgrade(engine)
        report = audit(engine, max_findings=100_000)
    finally:
        engine.dispose()
    assert report.ok
    assert set(report.counts) == {"unverifiable"}
    assert report.counts["unverifiable"] == manifest.to_dict()["row_counts"]["workflow_commands"]
    assert {f.severity for f in report.findings} == {"note"}


# -- the command line ---------------------------------------------------------------------------------


def test_db_check_deep_answers_0_on_a_clean_database_and_8_with_findings(
    filled: tuple[str, History], engine: Engine, tmp_path: Path
) -> None:
    url = filled[0]
    plain = run("db", "check", "--db", url, cwd=tmp_path)
    assert plain.returncode == 0 and set(json.loads(plain.stdout)) == {"database", "revision", "head", "ok"}
    clean = run("db", "check", "--deep", "--db", url, cwd=tmp_path)
    assert clean.returncode == 0 and clean.stderr == ""
    assert json.loads(clean.stdout)["ok"] is True and json.loads(clean.stdout)["findings"] == []
    command = filled[1].secret_command
    change(engine, update(workflow_commands).where(workflow_commands.c.id == command).values(name="refund"))
    found = run("db", "check", "--deep", "--db", url, cwd=tmp_path)
    assert found.returncode == 8
    assert found.stderr == (
        "admission: the audit found faults (intent_digest_mismatch 1); "
        "each finding is listed on standard output\n"
    )
    shown = json.loads(found.stdout)
    assert shown["ok"] is False and shown["counts"] == {"intent_digest_mismatch": 1}
    assert shown["findings"] == [
        {
            "kind": "intent_digest_mismatch",
            "severity": "error",
            "table": "workflow_commands",
            "key": {"id": command},
            "detail": "command_type, name, target and arguments do not hash to intent_digest",
        }
    ]
    assert SECRET_ARGUMENT not in found.stdout and SECRET_KEY not in found.stdout
    # db check without --deep keeps its answer: the revision, not the rows.
    assert run("db", "check", "--db", url, cwd=tmp_path).returncode == 0


@pytest.mark.parametrize(
    ("argv", "code"),
    [
        (["--db", "notaurl"], 2),
        (["--db", "postgresql://u:s3cr3t-pw@127.0.0.1:1/x"], 5),
        (["--db", "sqlite:///{tmp}"], 5),
        (["--db", "sqlite:///{tmp}/db.sqlite3", "--max-findings", "-1"], 2),
        (["--db", "sqlite:///{tmp}/db.sqlite3", "--max-findings", "many"], 2),
    ],
)
def test_db_check_deep_fails_in_one_line_with_its_exit_code(
    argv: list[str], code: int, tmp_path: Path
) -> None:
    result = run("db", "check", "--deep", *[a.format(tmp=tmp_path) for a in argv], cwd=tmp_path)
    assert result.returncode == code, result.stderr
    assert "Traceback" not in result.stderr and result.stderr.count("\n") == 1
    assert result.stderr.startswith("admission: ") and "s3cr3t-pw" not in result.stderr + result.stdout


def test_db_check_deep_on_a_database_not_at_the_head_answers_3_and_audits_nothing(tmp_path: Path) -> None:
    result = run("db", "check", "--deep", "--db", f"sqlite:///{tmp_path / 'empty.sqlite3'}", cwd=tmp_path)
    assert result.returncode == 3 and "findings" not in json.loads(result.stdout)


def test_the_audit_reads_one_snapshot_while_others_write(engine: Engine, filled: tuple[str, History]) -> None:
    # Once the audit has read its first table, another process admits two commands; the tables
    # read after it must not show them (REPEATABLE READ; one read transaction on SQLite).
    with engine.connect() as conn:
        events_before = conn.execute(select(func.count()).select_from(workflow_history_events)).scalar_one()
    writer = SqlStore.open(filled[0])
    written: list[str] = []

    def meanwhile(_conn: object, _cursor: object, statement: str, *_rest: object) -> None:
        if not written and "workflow_commands" in statement:
            service = AdmissionService(writer)
            written.append(str(service.admit_signal("ns", "wf", "meanwhile", {}).command_id))
            written.append(str(service.admit_update("ns", "wf", "meanwhile", {}).command_id))

    event.listen(engine, "after_cursor_execute", meanwhile)
    try:
        report = audit(engine)
    finally:
        event.remove(engine, "after_cursor_execute", meanwhile)
        writer.dispose()
    assert len(written) == 2
    assert report.ok, report.findings
    assert report.rows["workflow_history_events.payload"] == events_before
    assert audit(engine).rows["workflow_history_events.payload"] == events_before + 2


def test_sqlite_text_in_a_blob_column_and_bytes_not_utf8_are_findings_not_driver_errors(
    tmp_path: Path,
) -> None:
    # SQLite keeps each value's own type: replace() on the arguments stores TEXT in the BLOB column,
    # and a CAST stores bytes that are not UTF-8 as a name.  The driver would refuse to read either
    # (quoting the value); the audit reads them as stored and finds the digests wrong.
    url = sqlite_url(tmp_path)
    history = fill(url, tmp_path)
    with closing(sqlite3.connect(url.removeprefix("sqlite:///"))) as conn, conn:
        conn.execute(
            "UPDATE workflow_commands SET arguments = replace(arguments, '4111', '4112') WHERE id = ?",
            (history.secret_command,),
        )
        conn.execute(
            "UPDATE workflow_commands SET name = CAST(X'ff6e' AS TEXT) WHERE id = ?",
            (history.applied_signal,),
        )
    result = run("db", "check", "--deep", "--db", url, cwd=tmp_path)
    assert result.returncode == 8, result.stderr
    found = {(f["kind"], f["key"]["id"]) for f in json.loads(result.stdout)["findings"]}
    assert found == {
        ("arguments_digest_mismatch", history.secret_command),
        ("intent_digest_mismatch", history.secret_command),
        ("intent_digest_mismatch", history.applied_signal),
    }
    assert "4112" not in result.stdout + result.stderr


def test_the_command_line_lists_as_many_findings_as_the_library() -> None:
    from admission.cli import build_parser
    from admission.sql import DEFAULT_MAX_FINDINGS

    assert build_parser().parse_args(["db", "check", "--deep"]).max_findings == DEFAULT_MAX_FINDINGS
