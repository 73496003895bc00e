"""Bounded recovery from outside: runner processes, a SQLite job database, a target that is really broken.

The target is the real local one (``LocalPublisher``), its file overwritten with
bytes that are not a SQLite database while the runner process lives, so every
publication and every read back fails in SQLite itself.  One job may recover three
times, another once.  The runner (a ``spawn``\\ ed process of its own, with its own
engine and manual monotonic clock) runs both, round after round; then the file is
repaired and a new process takes over: the job within its bound recovers and
publishes once, the one past it stays ``recovery_required`` until an operator runs
``admission jobs resolve``.  Steps are logged (fsynced) by the process that runs
them, so the parent sees that nothing ran twice.
"""

from __future__ import annotations

import json
import multiprocessing
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from admission.intent import canonical_encode
from admission.jobs import Job, JobRunner, LocalPublisher
from tests.support.backends import SQL_BACKENDS, sqlite_url
from tests.support.jobkit import Counting, ManualClock, open_jobs
from tests.support.processes import WAIT, admission_cli, running

CTX = multiprocessing.get_context("spawn")
STEPS = 3
BOUNDS = {"within": 3, "past": 1}
"""Each job's ``max_attempts``, in a scope of its own: the bound of its recovery attempts too."""


def _runner_process(db_url: str, target: str, log: str, commands: Any, results: Any) -> None:
    """Open the target while it is whole, then run rounds: for each job named, watch a silent owner
    for a lease (on this process's manual clock), then run it; report each answer or exception."""
    clock = ManualClock()
    jobs = open_jobs(db_url, clock)
    runner = JobRunner(jobs, LocalPublisher(target), {"count": Counting(log=Path(log))})
    results.put(os.getpid())
    while (job_ids := commands.get(timeout=WAIT)) is not None:
        answers: dict[str, Any] = {}
        for job_id in job_ids:
            if jobs.status(job_id).state == "running":
                watched = jobs.claim(job_id)
                assert watched.reason == "lease_live", watched
                clock.advance(jobs.lease_seconds)
            try:
                answers[job_id] = asdict(runner.run(job_id))
            except Exception as exc:  # the target's failure reaches the caller: report it
                answers[job_id] = {"raised": type(exc).__name__, "message": str(exc)}
        results.put(answers)
    jobs.dispose()


def _round(commands: Any, results: Any, *job_ids: str) -> dict[str, Any]:
    commands.put(list(job_ids))
    answers: dict[str, Any] = results.get(timeout=WAIT)
    return answers


@pytest.mark.skipif("sqlite" not in SQL_BACKENDS, reason="the runner processes share a SQLite file")
def test_an_unreachable_target_is_recovered_within_the_bound_and_past_it_waits_for_the_operator(
    tmp_path: Path,
) -> None:
    db_url, target, log = sqlite_url(tmp_path), tmp_path / "target.sqlite3", tmp_path / "steps.log"
    jobs = open_jobs(db_url)
    for job_id, bound in BOUNDS.items():
        job = Job(job_id, f"tenant-{job_id}", "count", {"steps": STEPS}, max_attempts=bound)
        assert jobs.enqueue(job).outcome == "enqueued"
    LocalPublisher(target)  # the target exists and is whole when the runner opens it

    commands, results = CTX.Queue(), CTX.Queue()
    first = CTX.Process(target=_runner_process, args=(db_url, str(target), str(log), commands, results))
    with running(first):
        pid = results.get(timeout=WAIT)
        target.write_bytes(b"this is not a SQLite database\n" * 200)  # the target breaks

        executed = _round(commands, results, "within", "past")  # every step runs, publication fails
        for job_id in BOUNDS:
            assert executed[job_id]["raised"] == "StorageError"
            assert "file is not a database" in executed[job_id]["message"]
            view = jobs.status(job_id)
            assert (view.state, view.attempts) == ("running", 1)
            assert view.diagnostic is not None and "file is not a database" in view.diagnostic
            assert jobs.events(job_id)[-1].reason == "publish_failed"
        for recovery in (1, 2):  # reading the target back fails: recovery attempts, each recorded
            answers = _round(commands, results, "within", "past")
            assert answers["within"]["raised"] == "StorageError"
            assert jobs.status("within").attempts == 1 + recovery
            assert jobs.events("within")[-1].reason == "target_unreadable"
            if recovery == 1:
                assert answers["past"]["raised"] == "StorageError"
            else:  # past its bound of one recovery attempt: no claim, no read, no publication
                assert (answers["past"]["outcome"], answers["past"]["reason"]) == (
                    "not_claimable",
                    "recovery_exhausted",
                )
        commands.put(None)
    assert first.exitcode == 0
    past = jobs.status("past")
    assert (past.state, past.reason, past.attempts) == ("recovery_required", "recovery_exhausted", 2)
    assert past.diagnostic is not None
    assert past.diagnostic.startswith("recovery exhausted: 1 recovery attempt (the bound, max_attempts=1)")
    assert "the last recovery attempt (2) ended target_unreadable: StorageError" in past.diagnostic

    target.unlink()  # the target is repaired (empty: the publication never landed)
    LocalPublisher(target)
    second = CTX.Process(target=_runner_process, args=(db_url, str(target), str(log), commands, results))
    with running(second):
        results.get(timeout=WAIT)
        answers = _round(commands, results, "within", "past")
        commands.put(None)
    assert second.exitcode == 0
    within = answers["within"]
    assert (within["state"], within["reason"], within["steps"], within["published"]) == (
        "completed",
        "published_on_replay",
        (),
        True,
    )
    assert (answers["past"]["outcome"], answers["past"]["reason"]) == ("not_claimable", "recovery_required")
    assert jobs.status("within").attempts == 4  # the recording attempt and three recoveries
    recorder = next(e.attempt_id for e in jobs.events("within") if e.event == "result_recorded")
    published = LocalPublisher(target)
    [only] = published.read_published("within")
    assert (only.attempt_id, only.result) == (recorder, canonical_encode({"sum": 6}))
    assert published.read_published("past") == []
    # Every step ran once, all of them in the first process: recovery never executes.
    lines = [line.split() for line in log.read_text().splitlines()]
    assert [int(step) for _, step in lines] == [1, 2, 3, 1, 2, 3]
    assert {int(p) for p, _ in lines} == {pid}

    shown = admission_cli(db_url, "jobs", "status", "past", "--events")
    assert shown.returncode == 0, shown.stderr
    status = json.loads(shown.stdout)
    assert (status["state"], status["diagnostic"]) == ("recovery_required", past.diagnostic)
    assert status["events"][-1]["event"] == "recovery_exhausted"
    resolved = admission_cli(
        db_url, "jobs", "resolve", "past", "--outcome", "failed", "--who", "ops", "--why", "target rebuilt"
    )
    assert resolved.returncode == 0, resolved.stderr
    assert (json.loads(resolved.stdout)["state"], jobs.status("past").reason) == ("failed", "resolved_failed")
    jobs.dispose()
