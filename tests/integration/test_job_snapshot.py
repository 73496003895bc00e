"""The jobs snapshot on a SQLite file and PostgreSQL (contract §6; docs/jobs.md, "Snapshot").

The exported file is compared field by field with the ``worker_job*`` tables
read directly; it is shown consistent at one instant (a writer commits between
the snapshot's reads, deterministically through an engine hook, and a writer
process checkpoints without pause while many snapshots are taken), and a
reader of the file never sees a part of one, even when the exporting process
is SIGKILLed in the middle of writing it.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, event
from sqlalchemy.engine import Connection

from admission.jobs import Job, JobLease
from admission.sql import SqlJobStore
from admission.sql._job_snapshot import assemble, read_all
from tests.conftest import SUMMARY_LINES
from tests.support.backends import SQL_BACKENDS
from tests.support.jobkit import ManualClock, open_jobs
from tests.support.jobsnapshot import (
    SECRET,
    compare_with_tables,
    history_service,
    mixed_history,
    snapshot_faults,
)
from tests.support.processes import WAIT, admission_cli, running

CTX = multiprocessing.get_context("spawn")

FILE_BACKENDS = [pytest.param(b, marks=[pytest.mark.extra] if b != "sqlite" else []) for b in SQL_BACKENDS]
"""For what is about the file, not the database (a crash mid-export, readers, refused paths): SQLite
in the default run, PostgreSQL in the extra set."""


def test_the_exported_file_holds_every_field_of_every_job_and_checkpoint_as_the_tables_do(
    db_url: str, tmp_path: Path
) -> None:
    clock = ManualClock()
    jobs = history_service(db_url, clock)
    expected = mixed_history(jobs, clock)
    assert isinstance(jobs.store, SqlJobStore)
    engine = jobs.store.engine
    path = tmp_path / "jobs-snapshot.json"
    written = jobs.export_snapshot(path)
    text = path.read_text(encoding="utf-8")
    document = json.loads(text)
    assert document == written
    assert document["format"] == "admission.jobs.snapshot.v1"
    assert {j["job_id"]: j["state"] for j in document["jobs"]} == expected
    assert snapshot_faults(document) == []
    compared = compare_with_tables(engine, document, None)
    # 20 fields of each of the 10 jobs, 8 of the latest attempt of the 6 claimed, 6 of each of 6 checkpoints.
    assert compared == 10 * 20 + 6 * 8 + 6 * 6
    SUMMARY_LINES.append(
        f"jobs snapshot vs tables ({engine.dialect.name}): 10 jobs, 6 checkpoints, {compared} fields equal"
    )
    assert SECRET not in text  # no payload, no recorded result
    # One scope: only its jobs, in queue order, and its counts.
    beta = jobs.export_snapshot(path, scope="beta")
    assert [j["job_id"] for j in beta["jobs"]] == ["b-retry", "b-failed", "b-recovery"]
    assert compare_with_tables(engine, json.loads(path.read_text()), "beta") > 0
    nowhere = jobs.snapshot("nowhere")
    assert (nowhere["scope"], nowhere["jobs"], nowhere["counts"]) == ("nowhere", [], {})
    jobs.dispose()


def test_jobs_status_export_writes_the_file_and_prints_a_one_line_summary(
    db_url: str, tmp_path: Path
) -> None:
    clock = ManualClock()
    jobs = history_service(db_url, clock)
    mixed_history(jobs, clock)
    assert isinstance(jobs.store, SqlJobStore)
    out = tmp_path / "out"
    out.mkdir()
    path = out / "jobs-snapshot.json"
    for scope in (None, "alpha"):
        extra = () if scope is None else ("--scope", scope)
        result = admission_cli(db_url, "jobs", "status", "--export", str(path), *extra)
        assert result.returncode == 0, result.stderr
        assert len(result.stdout.splitlines()) == 1
        summary = json.loads(result.stdout)
        document = json.loads(path.read_text(encoding="utf-8"))
        assert summary == {
            "path": str(path),
            "scope": scope,
            "jobs": len(document["jobs"]),
            "counts": document["counts"],
        }
        assert compare_with_tables(jobs.store.engine, document, scope) > 0
    jobs.dispose()


@pytest.mark.parametrize("sql_backend", FILE_BACKENDS)
def test_jobs_status_export_refuses_a_bad_path_or_scope_in_one_line_and_writes_nothing(
    db_url: str, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    path = out / "jobs-snapshot.json"
    path.write_text("the previous snapshot")
    before = path.read_bytes()
    refusals = [
        (("--export", str(out / "missing" / "s.json")), "--export: the folder"),
        (("--export", str(path), "--scope", "x" * 256), "scope: must be 1..255 characters"),
    ]
    for arguments, message in refusals:
        refused = admission_cli(db_url, "jobs", "status", *arguments)
        assert refused.returncode == 2, refused
        assert message in refused.stderr and "Traceback" not in refused.stderr, refused.stderr
        assert len(refused.stderr.splitlines()) == 1
    assert path.read_bytes() == before
    assert [p.name for p in out.iterdir()] == [path.name]  # no temporary file left


# -- one instant ---------------------------------------------------------------------------------------


def _checkpointed_scope(url: str, scopes: int = 2, steps: int = 2) -> list[JobLease]:
    """One running job per scope, each with ``steps`` checkpoints; their leases."""
    jobs = open_jobs(url)
    leases = []
    for n in range(scopes):
        jobs.enqueue(Job(f"j{n}", f"s{n}", "count", {"steps": 100}))
        lease = jobs.claim(f"j{n}").lease
        assert lease is not None
        for step in range(1, steps + 1):
            jobs.checkpoint(lease, step, step)
        leases.append(lease)
    jobs.dispose()
    return leases


class _Writer:
    """The owners' next checkpoint of every running job, and a new job, committed by another engine
    (another connection) each time it is called: between two reads of a snapshot."""

    def __init__(self, url: str, leases: list[JobLease]) -> None:
        self.jobs = open_jobs(url)
        self.leases = leases
        self.made = 0

    def __call__(self) -> None:
        self.made += 1
        self.jobs.enqueue(Job(f"new{self.made}", "s0", "count", {"steps": 1}))
        for lease in self.leases:
            step = self.jobs.status(lease.job_id).checkpoint_step + 1
            self.jobs.checkpoint(lease, step, step)


def test_a_write_committed_between_the_reads_of_a_snapshot_does_not_show_in_it(db_url: str) -> None:
    """Deterministic: a hook commits a writer's checkpoints and a new job right after the snapshot's
    first read.  The snapshot (one read transaction) shows none of it; the same reads made in a
    transaction each are torn, and the checker says so."""
    writer = _Writer(db_url, _checkpointed_scope(db_url))
    jobs = open_jobs(db_url)
    assert isinstance(jobs.store, SqlJobStore)
    engine = jobs.store.engine

    @contextmanager
    def after_first_read(target: Engine) -> Iterator[None]:
        fired: list[bool] = []

        def hook(conn: Connection, cursor: Any, statement: str, *rest: Any) -> None:
            if not fired and statement.lstrip().upper().startswith("SELECT") and "worker_jobs" in statement:
                fired.append(True)
                writer()

        event.listen(target, "after_cursor_execute", hook)
        try:
            yield
        finally:
            event.remove(target, "after_cursor_execute", hook)
        assert fired

    with after_first_read(engine):
        document = jobs.snapshot()
    assert writer.made == 1
    assert snapshot_faults(document) == []
    steps = {j["job_id"]: j["checkpoint_step"] for j in document["jobs"]}
    assert steps == {"j0": 2, "j1": 2}  # as before the writer's commit
    after = jobs.snapshot()
    assert {j["job_id"]: j["checkpoint_step"] for j in after["jobs"]} == {"j0": 3, "j1": 3, "new1": 0}
    assert snapshot_faults(after) == []

    # The same five reads, each in a transaction of its own: the writer's commit tears them.
    @contextmanager
    def separate() -> Iterator[Connection]:
        with engine.connect() as conn, conn.begin():
            yield conn

    from admission.jobs._snapshot import document as as_document

    with after_first_read(engine):
        torn = as_document(assemble(None, read_all(separate, None)), jobs.now())
    faults = snapshot_faults(torn)
    assert any("checkpoint_step 3, checkpoints [1, 2, 3, 4]" in f for f in faults), faults
    assert any(f.startswith("counts") for f in faults), faults
    writer.jobs.dispose()
    jobs.dispose()


def _checkpointing_writer(url: str, scopes: int, started: Any, stop: Any, results: Any) -> None:
    """Run jobs without pause, one running per scope: claim, checkpoint each step (each one
    transaction: the checkpoint row and the job's step), record, complete; a new job each time."""
    jobs = open_jobs(url)
    made = 0
    while not stop.is_set():
        for scope in range(scopes):
            made += 1
            job_id = f"w{made}"
            jobs.enqueue(Job(job_id, f"s{scope}", "count", {"steps": 4}))
            lease = jobs.claim(job_id).lease
            assert lease is not None
            for step in range(1, 5):
                jobs.checkpoint(lease, step, step)
                started.set()
            if made % 3:
                jobs.record_result(lease, {"sum": 10})
                jobs.complete(lease)
            else:
                jobs.fail(lease, "again", retryable=False)
    results.put(made)
    jobs.dispose()


def _concurrent_exports(db_url: str, tmp_path: Path, wanted: int) -> tuple[int, int]:
    started, stop, results = CTX.Event(), CTX.Event(), CTX.Queue()
    writer = CTX.Process(target=_checkpointing_writer, args=(db_url, 3, started, stop, results))
    jobs = open_jobs(db_url)
    path = tmp_path / "jobs-snapshot.json"
    seen: set[int] = set()
    exports = 0
    with running(writer):
        assert started.wait(WAIT)
        while len(seen) < wanted and exports < 50 * wanted:
            jobs.export_snapshot(path)
            exports += 1
            document = json.loads(path.read_text(encoding="utf-8"))
            assert snapshot_faults(document) == [], document
            seen.add(sum(len(j["checkpoints"]) for j in document["jobs"]))
        stop.set()
    assert writer.exitcode == 0
    assert results.get(timeout=WAIT) > 0
    jobs.dispose()
    assert len(seen) >= wanted, (len(seen), exports)
    SUMMARY_LINES.append(
        f"jobs snapshot under a checkpointing writer ({db_url.partition(':')[0]}): {exports} exports, "
        f"{len(seen)} distinct states, every one whole at one instant"
    )
    return exports, len(seen)


def test_snapshots_taken_while_a_process_checkpoints_hold_together(db_url: str, tmp_path: Path) -> None:
    _concurrent_exports(db_url, tmp_path, wanted=8)


@pytest.mark.extra
def test_many_snapshots_taken_while_a_process_checkpoints_hold_together(db_url: str, tmp_path: Path) -> None:
    _concurrent_exports(db_url, tmp_path, wanted=100)


# -- a crash mid-export, and readers ----------------------------------------------------------------------


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _export_and_die(url: str, path: str, where: str) -> None:
    """Export over ``path``, SIGKILLing this process at ``where`` (patched into this process only)."""
    import admission._files as files

    jobs = open_jobs(url)
    jobs.enqueue(Job("late", "s0", "count", {"steps": 1}))  # the new snapshot differs from the old
    if where == "writing":

        def dump(payload: Any, handle: Any, **options: Any) -> None:
            text = json.dumps(payload, **options)
            handle.write(text[: len(text) // 2])
            handle.flush()
            _die()

        files.json.dump = dump  # type: ignore[assignment]
    elif where in ("fsync", "directory_fsync"):
        calls: list[int] = []
        fsync = os.fsync

        def dying_fsync(fd: int) -> None:
            calls.append(fd)
            if where == "fsync" or len(calls) == 2:
                _die()
            fsync(fd)

        files.os.fsync = dying_fsync  # type: ignore[assignment]
    else:
        assert where == "replace"
        files.os.replace = lambda *_: _die()  # type: ignore[assignment]
    jobs.export_snapshot(path)


@pytest.mark.parametrize("sql_backend", FILE_BACKENDS)
@pytest.mark.parametrize("where", ["writing", "fsync", "replace", "directory_fsync"])
def test_an_export_killed_midway_leaves_the_previous_file_whole(
    db_url: str, tmp_path: Path, where: str
) -> None:
    _checkpointed_scope(db_url, scopes=1)
    jobs = open_jobs(db_url)
    out = tmp_path / "out"
    out.mkdir()
    path = out / "jobs-snapshot.json"
    jobs.export_snapshot(path)
    before = path.read_bytes()
    process = CTX.Process(target=_export_and_die, args=(db_url, str(path), where))
    with running(process):
        pass
    assert process.exitcode == -signal.SIGKILL
    left = [p for p in out.iterdir() if p != path]
    if where == "directory_fsync":
        # Killed after the rename: the file is the new snapshot, whole.
        assert [j["job_id"] for j in json.loads(path.read_text())["jobs"]] == ["j0", "late"]
        assert left == []
    else:
        assert path.read_bytes() == before
        json.loads(path.read_text())
        # The temporary file stays (nothing ran after SIGKILL), beside the file, never in its place.
        assert len(left) == 1 and left[0].name.startswith(".jobs-snapshot.json.") and left[0].suffix == ".tmp"
        if where == "writing":
            with pytest.raises(json.JSONDecodeError):
                json.loads(left[0].read_text())
    written = jobs.export_snapshot(path)
    assert json.loads(path.read_text()) == written
    assert [j["job_id"] for j in written["jobs"]] == ["j0", "late"]
    jobs.dispose()


def _reader(path: str, ready: Any, stop: Any, versions: Any, results: Any) -> None:
    """Re-read the file without pause until told to stop; count the reads that were not whole JSON."""
    seen: set[str] = set()
    reads = bad = 0
    ready.set()
    while not stop.is_set():
        try:
            data = Path(path).read_bytes()
        except FileNotFoundError:
            bad += 1
            continue
        reads += 1
        try:
            seen.add(json.loads(data)["taken_at"])
        except (ValueError, KeyError):
            bad += 1
        versions.value = len(seen)
    results.put((reads, bad, len(seen)))


@pytest.mark.parametrize("sql_backend", FILE_BACKENDS)
def test_a_reader_that_rereads_the_file_during_exports_never_sees_a_partial_one(
    db_url: str, tmp_path: Path
) -> None:
    _checkpointed_scope(db_url, scopes=2, steps=20)
    jobs = open_jobs(db_url)
    path = tmp_path / "jobs-snapshot.json"
    jobs.export_snapshot(path)
    ready, stop, versions, results = CTX.Event(), CTX.Event(), CTX.Value("i", 0), CTX.Queue()
    reader = CTX.Process(target=_reader, args=(str(path), ready, stop, versions, results))
    exports = 0
    with running(reader):
        assert ready.wait(WAIT)
        while versions.value < 5 and exports < 2000:
            jobs.export_snapshot(path)
            exports += 1
        stop.set()
    reads, bad, distinct = results.get(timeout=WAIT)
    assert (bad, reader.exitcode) == (0, 0)
    assert distinct >= 5 and reads >= distinct, (reads, distinct, exports)
    jobs.dispose()
