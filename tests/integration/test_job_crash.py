"""Crash safety of durable jobs, shown with real OS processes that die (worker contract §3, §4).

Each runner is a separate ``spawn``\\ ed process with its own engine. A fault
hook kills it at an exact point of the cycle, by ``SIGKILL`` (no cleanup at
all) or ``os._exit(73)``; or the parent SIGKILLs it in the middle of a step.
A new process then restarts the job: it watches the dead owner's lease for a
whole lease on its own monotonic clock (a manual one, so no test waits on real
time), reclaims the job with a new fence, and either resumes at the step after
the last checkpoint or recovers the publication. Steps are logged to a file
(fsynced) by the processes that run them, publications are counted in the
local target database, so the parent sees what really happened.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event

from admission.errors import JobFencedError, JobQueueFullError
from admission.intent import Value, canonical_encode
from admission.jobs import Continue, Finish, Job, JobRunner, JobService, LocalPublisher
from admission.sql import SqlJobStore
from tests.support.jobkit import Counting, ManualClock, expire, open_jobs
from tests.support.processes import WAIT, running

CTX = multiprocessing.get_context("spawn")
STEPS = 5
TOTAL = {"sum": STEPS * (STEPS + 1) // 2}


# -- processes (module level, so that ``spawn`` can import them) ---------------------------------------


def _die(how: str) -> None:
    if how == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    os._exit(73)


def _runner_process(
    db_url: str, target: str, log: str, job_id: str, fault: tuple[str, int, str] | None, results: Any
) -> None:
    """Restart-or-run ``job_id``: watch a possibly dead owner for a lease, then run; die at ``fault``."""
    clock = ManualClock()
    store = open_jobs(db_url, clock)
    first = store.claim(job_id) if store.status(job_id).state == "running" else None
    if first is not None:
        assert first.reason == "lease_live", first
        clock.advance(store.lease_seconds)

    def hook(point: str, step: int) -> None:
        if fault is not None and (point, step) == fault[:2]:
            _die(fault[2])

    runner = JobRunner(store, LocalPublisher(target), {"count": Counting(log=Path(log))}, fault=hook)
    results.put({"pid": os.getpid(), "report": asdict(runner.run(job_id))})
    store.dispose()


class _Hang(Counting):
    """Logs a step, then at ``hang_at`` says so and never returns: the parent kills it mid-step."""

    def __init__(self, log: Path, hang_at: int, results: Any) -> None:
        super().__init__(log=log)
        self.hang_at, self.results = hang_at, results

    def __call__(self, payload: Value, step: int, state: Value) -> Continue | Finish:
        answer = super().__call__(payload, step, state)
        if step == self.hang_at:
            self.results.put({"pid": os.getpid(), "hanging_at": step})
            while True:
                time.sleep(1)
        return answer


def _hanging_process(db_url: str, target: str, log: str, job_id: str, hang_at: int, results: Any) -> None:
    store = open_jobs(db_url)
    runner = JobRunner(store, LocalPublisher(target), {"count": _Hang(Path(log), hang_at, results)})
    runner.run(job_id)


def _stale_owner_process(db_url: str, job_id: str, go: Any, results: Any) -> None:
    """Claim and checkpoint, wait until the parent reclaimed the job, then try to write with the old fence."""
    store = open_jobs(db_url)
    lease = store.claim(job_id).lease
    assert lease is not None
    store.checkpoint(lease, 1, 1)
    results.put({"claimed": lease.fence})
    go.wait(WAIT)
    refused = []
    for name, write in (
        ("checkpoint", lambda: store.checkpoint(lease, 2, 3)),
        ("heartbeat", lambda: store.heartbeat(lease)),
        ("record_result", lambda: store.record_result(lease, TOTAL)),
        ("fail", lambda: store.fail(lease, "late", retryable=True)),
    ):
        try:
            write()
            refused.append((name, None, None))
        except JobFencedError as exc:
            refused.append((name, exc.code, exc.current_fence))
    results.put({"refused": refused})
    store.dispose()


def _die_inside_the_completion(db_url: str, target: str, log: str, dying: Any) -> None:
    """Run the job; SIGKILL this process inside the completing transaction, before its commit."""
    store = open_jobs(db_url)

    def hook(
        conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, executemany: bool
    ) -> None:
        text = str(parameters)
        if statement.lstrip().upper().startswith("INSERT INTO WORKER_JOB_EVENTS") and "'complete'" in text:
            dying.set()  # synchronous, unlike a queue's feeder thread
            os.kill(os.getpid(), signal.SIGKILL)

    assert isinstance(store.store, SqlJobStore)
    event.listen(store.store.engine, "after_cursor_execute", hook)
    runner = JobRunner(store, LocalPublisher(target), {"count": Counting(log=Path(log))})
    runner.run("job")


def _racer(db_url: str, action: str, index: int, barrier: Any, results: Any) -> None:
    """Race the other racers at the barrier: claim the shared job, or enqueue jobs into the shared scope."""
    store = open_jobs(db_url, max_waiting=RACE_BOUND)
    store.status("shared")  # connect before the race, not during it
    barrier.wait(WAIT)
    answers: list[str] = []
    if action == "claim":
        answers.append(store.claim("shared").outcome)
    else:
        for n in range(RACE_BOUND):
            try:
                answers.append(store.enqueue(Job(f"r{index}-{n}", "raced", "count", {"steps": 1})).outcome)
            except JobQueueFullError:
                answers.append("full")
    results.put(answers)
    store.dispose()


def _next_racer(db_url: str, barrier: Any, results: Any) -> None:
    """Race the other racers at the barrier, once per round: ``claim_next`` in the round's scope."""
    store = open_jobs(db_url)
    store.counts()  # connect before the race, not during it
    won: list[str | None] = []
    for round_number in range(ROUNDS):
        barrier.wait(WAIT)
        answer = store.claim_next(f"round-{round_number}")
        won.append(None if answer is None or answer.lease is None else answer.job_id)
    results.put(won)
    store.dispose()


RACERS = 3
RACE_BOUND = 10
ROUNDS = 4


# -- helpers ------------------------------------------------------------------------------------------


@pytest.fixture
def paths(tmp_path: Path) -> tuple[str, str]:
    return str(tmp_path / "target.sqlite3"), str(tmp_path / "steps.log")


def enqueue(db_url: str, job_id: str = "job") -> JobService:
    store = open_jobs(db_url)
    assert store.enqueue(Job(job_id, "tenant", "count", {"steps": STEPS})).outcome == "enqueued"
    return store


def run_process(
    db_url: str, paths: tuple[str, str], fault: tuple[str, int, str] | None = None
) -> tuple[int, Any]:
    """Run one runner process to its end (or death); its exit code and its report, if it lived to send one."""
    results = CTX.Queue()
    process = CTX.Process(target=_runner_process, args=(db_url, *paths, "job", fault, results))
    with running(process):
        pass
    report = results.get(timeout=WAIT) if process.exitcode == 0 else None
    assert process.exitcode is not None
    return process.exitcode, report


def steps_by_pid(log: str) -> list[tuple[int, int]]:
    if not Path(log).exists():
        return []
    return [
        (int(pid), int(step)) for pid, step in (line.split() for line in Path(log).read_text().splitlines())
    ]


DEATHS = [("sigkill", -signal.SIGKILL), ("exit", 73)]


# -- the tests ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("how", "code"), DEATHS)
def test_a_runner_killed_after_a_checkpoint_is_resumed_at_the_next_step_by_a_new_process(
    db_url: str, paths: tuple[str, str], how: str, code: int
) -> None:
    store = enqueue(db_url)
    exitcode, _ = run_process(db_url, paths, ("after_checkpoint", 3, how))
    assert exitcode == code
    view = store.status("job")
    assert (view.state, view.checkpoint_step, view.fence) == ("running", 3, 1)
    target = LocalPublisher(paths[0])
    assert target.count() == 0

    exitcode, answer = run_process(db_url, paths)
    assert exitcode == 0
    report = answer["report"]
    assert (report["state"], report["reason"], report["steps"]) == ("completed", "completed", (4, 5))
    pids = [pid for pid, _ in steps_by_pid(paths[1])]
    assert [step for _, step in steps_by_pid(paths[1])] == [1, 2, 3, 4, 5]
    assert pids[3:] == [answer["pid"]] * 2 and answer["pid"] not in pids[:3]
    [only] = target.read_published("job")
    assert only.result == canonical_encode(TOTAL)
    assert [c.fence for c in store.checkpoints("job")] == [1, 1, 1, 2]
    store.dispose()


@pytest.mark.parametrize(("how", "code"), DEATHS)
def test_a_runner_killed_between_publish_and_ack_is_recovered_after_publish_without_a_second_publication(
    db_url: str, paths: tuple[str, str], how: str, code: int
) -> None:
    store = enqueue(db_url)
    exitcode, _ = run_process(db_url, paths, ("after_publish", STEPS, how))
    assert exitcode == code
    target = LocalPublisher(paths[0])
    [published] = target.read_published("job")
    assert store.status("job").state == "running"
    executed = steps_by_pid(paths[1])

    exitcode, answer = run_process(db_url, paths)
    assert exitcode == 0
    report = answer["report"]
    assert (report["state"], report["reason"], report["steps"], report["published"]) == (
        "completed",
        "recovered_after_publish",
        (),
        False,
    )
    assert target.read_published("job") == [published]
    assert steps_by_pid(paths[1]) == executed  # nothing re-executed
    assert [s for _, s in executed] == [1, 2, 3, 4, 5]

    # A duplicate delivery to a third process: acknowledged, nothing runs, nothing is published.
    exitcode, answer = run_process(db_url, paths)
    assert (exitcode, answer["report"]["outcome"], answer["report"]["state"]) == (0, "final", "completed")
    assert target.read_published("job") == [published] and steps_by_pid(paths[1]) == executed
    store.dispose()


def test_a_runner_killed_between_recording_and_publishing_is_published_once_on_replay(
    db_url: str, paths: tuple[str, str]
) -> None:
    store = enqueue(db_url)
    exitcode, _ = run_process(db_url, paths, ("after_record", STEPS, "sigkill"))
    assert exitcode == -signal.SIGKILL
    target = LocalPublisher(paths[0])
    assert target.count() == 0
    attempt = store.events("job")[-1].attempt_id
    exitcode, answer = run_process(db_url, paths)
    assert (answer["report"]["state"], answer["report"]["reason"]) == ("completed", "published_on_replay")
    [only] = target.read_published("job")
    assert (only.attempt_id, only.result) == (attempt, canonical_encode(TOTAL))
    assert len(steps_by_pid(paths[1])) == STEPS
    store.dispose()


def test_a_runner_sigkilled_by_the_parent_in_the_middle_of_a_step_resumes_from_the_last_checkpoint(
    db_url: str, paths: tuple[str, str]
) -> None:
    store = enqueue(db_url)
    results = CTX.Queue()
    process = CTX.Process(target=_hanging_process, args=(db_url, *paths, "job", 3, results))
    with running(process):
        assert results.get(timeout=WAIT)["hanging_at"] == 3
        process.kill()
    assert process.exitcode == -signal.SIGKILL
    assert store.status("job").checkpoint_step == 2

    exitcode, answer = run_process(db_url, paths)
    assert exitcode == 0
    assert (answer["report"]["state"], answer["report"]["steps"]) == ("completed", (3, 4, 5))
    # Step 3 ran twice (it never reached its checkpoint); every other step once.
    assert [s for _, s in steps_by_pid(paths[1])] == [1, 2, 3, 3, 4, 5]
    assert LocalPublisher(paths[0]).count() == 1
    store.dispose()


def test_a_stale_owner_process_cannot_write_after_another_connection_reclaimed_its_job(db_url: str) -> None:
    store = enqueue(db_url)
    go, results = CTX.Event(), CTX.Queue()
    process = CTX.Process(target=_stale_owner_process, args=(db_url, "job", go, results))
    with running(process):
        assert results.get(timeout=WAIT) == {"claimed": 1}
        clock = ManualClock()
        reclaimer = open_jobs(db_url, clock)
        expire(reclaimer, clock, "job")
        new = reclaimer.claim("job").lease
        assert new is not None and new.fence == 2 and new.resume_step == 1
        go.set()
        refused = results.get(timeout=WAIT)["refused"]
    assert process.exitcode == 0
    assert refused == [
        ("checkpoint", "job_fenced", 2),
        ("heartbeat", "job_fenced", 2),
        ("record_result", "job_fenced", 2),
        ("fail", "job_fenced", 2),
    ]
    view = store.status("job")
    assert (view.state, view.fence, view.checkpoint_step) == ("running", 2, 1)
    assert reclaimer.checkpoint(new, 2, 3).deadline > 0
    reclaimer.dispose()
    store.dispose()


@pytest.mark.parametrize("action", ["claim", "enqueue"])
def test_racing_processes_get_one_claim_and_never_pass_the_queue_bound(db_url: str, action: str) -> None:
    store = enqueue(db_url, "shared")
    barrier, results = CTX.Barrier(RACERS), CTX.Queue()
    racers = [CTX.Process(target=_racer, args=(db_url, action, i, barrier, results)) for i in range(RACERS)]
    with running(*racers):
        answers = [a for _ in racers for a in results.get(timeout=WAIT)]
    assert all(p.exitcode == 0 for p in racers)
    if action == "claim":
        assert sorted(answers) == ["claimed"] + ["not_claimable"] * (RACERS - 1)
        assert store.status("shared").fence == 1
        assert [e.event for e in store.events("shared")] == ["enqueue", "claim"]
    else:
        assert answers.count("enqueued") == RACE_BOUND and answers.count("full") == RACE_BOUND * (RACERS - 1)
        assert store.counts("raced") == {"queued": RACE_BOUND}
    store.dispose()


def test_processes_racing_claim_next_in_one_scope_start_exactly_one_of_its_jobs(db_url: str) -> None:
    store = open_jobs(db_url)
    jobs = [Job(f"r{n}-j{i}", f"round-{n}", "count", {"steps": 1}) for n in range(ROUNDS) for i in range(3)]
    store.enqueue_all(jobs)
    barrier, results = CTX.Barrier(RACERS), CTX.Queue()
    racers = [CTX.Process(target=_next_racer, args=(db_url, barrier, results)) for _ in range(RACERS)]
    with running(*racers):
        rounds = list(zip(*(results.get(timeout=WAIT) for _ in racers), strict=True))
    assert all(p.exitcode == 0 for p in racers)
    for n, answers in enumerate(rounds):
        # Every racer found queued jobs; exactly one started one (the oldest), the others none.
        assert [a for a in answers if a is not None] == [f"r{n}-j0"], answers
        assert answers.count(None) == RACERS - 1, answers
        assert store.counts(f"round-{n}") == {"running": 1, "queued": 2}
    store.dispose()


def test_a_runner_killed_inside_the_completing_transaction_leaves_neither_the_state_nor_its_event(
    db_url: str, paths: tuple[str, str]
) -> None:
    store = enqueue(db_url)
    dying = CTX.Event()
    process = CTX.Process(target=_die_inside_the_completion, args=(db_url, *paths, dying))
    with running(process):
        pass
    assert dying.is_set()
    assert process.exitcode == -signal.SIGKILL
    # The state change and its event were one transaction: both are gone, the publication is not.
    view = store.status("job")
    assert (view.state, view.reason) == ("running", "claimed")
    assert "complete" not in [e.event for e in store.events("job")]
    target = LocalPublisher(paths[0])
    [published] = target.read_published("job")
    exitcode, answer = run_process(db_url, paths)
    assert (exitcode, answer["report"]["reason"]) == (0, "recovered_after_publish")
    assert target.read_published("job") == [published]
    assert [e.event for e in store.events("job")][-2:] == ["reclaim", "recovered_after_publish"]
    store.dispose()
