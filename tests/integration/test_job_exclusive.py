"""One job runner per scope on a machine: a live owner is never taken over, however long it stalls
(worker contract §3; docs/jobs.md, "One runner per scope on a machine").

Runner A, a spawned process on the real monotonic clock with a short lease
and heartbeats on, runs a job of four steps. Step 2 logs its start to an
fsynced file, tells the parent, and waits. The parent stops A there
(SIGSTOP) and reads the job's row until its ``(fence, beat)`` has stood
still for more than a lease: by the lease alone (the service's own rule,
``LeaseWatch``) the job could now be reclaimed. Runner B, another spawned
process, asks for the job again and again (``run`` and ``run_next``): it is
refused at once with ``JobLockedError`` and writes nothing. Then either the
parent SIGKILLs A, and B takes the lock, watches the lease for a whole lease
on its own clock, reclaims with a new fence, resumes after checkpoint 1 and
publishes once; or it SIGCONTs A, which finishes and publishes, and B never
runs a step. The processes log every step's start and end, their claims and
their refusals with their monotonic times (one clock for every process of the
machine); the parent adds its own moments and prints the timeline.
"""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import signal
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, make_url, select

from admission.errors import InputError, InvalidJobError, JobLockedError
from admission.intent import Value
from admission.jobs import (
    ClaimResult,
    Continue,
    Finish,
    Job,
    JobRunner,
    JobService,
    LocalPublisher,
    MemoryJobStore,
)
from admission.jobs._claims import LeaseWatch
from admission.sql import SqlJobStore
from admission.sql._jobs import _job_row
from admission.sql._schema import worker_job_attempts, worker_jobs
from admission.testing import MemoryPublisher
from tests.conftest import SUMMARY_LINES
from tests.support.jobkit import Counting, ManualClock, footprint
from tests.support.processes import WAIT, running

CTX = multiprocessing.get_context("spawn")
LEASE = 1.5
"""The lease of both runners, seconds: short, so that the test waits little for it to lapse."""
STEPS = 4
SLOW_STEP = 2
SCOPE = "tenant-x"
JOB = "long"
CLAIM = "claim, holding the scope's lock: "


def _lock_file(lock_dir: Path, scope: str) -> Path:
    return lock_dir / f"{hashlib.sha256(scope.encode()).hexdigest()[:32]}.lock"


# -- the processes (module level, so that ``spawn`` can import them) ------------------------------------


def _note(log: str, who: str, text: str) -> None:
    """Append one moment to the shared log, fsynced: it survives a SIGKILL right after."""
    with open(log, "a", encoding="utf-8") as out:
        out.write(f"{time.monotonic():.6f} {who} {os.getpid()} {text}\n")
        out.flush()
        os.fsync(out.fileno())


class _Slow:
    """Four steps, each logged at its start and end; step 2 of runner A waits for the parent."""

    def __init__(self, log: str, who: str, in_step: Any = None, proceed: Any = None) -> None:
        self.log, self.who, self.in_step, self.proceed = log, who, in_step, proceed

    def __call__(self, payload: Value, step: int, state: Value) -> Continue | Finish:
        _note(self.log, self.who, f"start step {step}")
        if step == SLOW_STEP and self.in_step is not None:
            self.in_step.set()
            self.proceed.wait(WAIT)  # a long step: the parent stops this process here
        _note(self.log, self.who, f"end step {step}")
        total = (state if isinstance(state, int) else 0) + step
        return Finish({"sum": total}) if step == STEPS else Continue(total)


class _Timed(JobService):
    """A job service that logs every claim's answer (the runner claims under the scope's lock)."""

    def __init__(self, url: str, log: str, who: str) -> None:
        super().__init__(SqlJobStore.open(url), lease_seconds=LEASE)
        self.log, self.who = log, who

    def _logged(self, answer: ClaimResult | None) -> ClaimResult | None:
        if answer is not None:
            fence = "" if answer.lease is None else f", fence {answer.lease.fence}"
            _note(self.log, self.who, f"{CLAIM}{answer.outcome} ({answer.reason}{fence})")
        return answer

    def claim(self, job_id: str) -> ClaimResult:
        answer = self._logged(super().claim(job_id))
        assert answer is not None
        return answer

    def claim_next(self, scope: str) -> ClaimResult | None:
        return self._logged(super().claim_next(scope))


def _runner(url: str, lock_dir: str | None, log: str, target: str, who: str, handler: _Slow) -> JobRunner:
    def fault(point: str, step: int) -> None:
        if point == "after_publish":
            _note(log, who, "published")

    service = _Timed(url, log, who)
    return JobRunner(service, LocalPublisher(target), {"slow": handler}, fault=fault, lock_dir=lock_dir)


def _owner_a(url: str, lock_dir: str | None, log: str, target: str, in_step: Any, proceed: Any) -> None:
    runner = _runner(url, lock_dir, log, target, "A", _Slow(log, "A", in_step, proceed))
    report = runner.run(JOB)
    _note(log, "A", f"run returned: {report.outcome}, steps {list(report.steps)}")


def _runner_b(url: str, lock_dir: str | None, log: str, target: str, orders: Any, answers: Any) -> None:
    """Runner B: runs what the parent orders and answers with the report, or the refusal."""
    runner = _runner(url, lock_dir, log, target, "B", _Slow(log, "B"))
    while (order := orders.get(timeout=WAIT)) != "stop":
        try:
            if order == "run_next":
                report = runner.run_next(SCOPE)
            else:
                report = runner.run(JOB)
                # "takeover": the dead owner's lease is watched for a whole lease first.
                while order == "takeover" and report.outcome == "not_claimable":
                    time.sleep(LEASE / 6)
                    report = runner.run(JOB)
        except JobLockedError as refused:
            _note(log, "B", f"refused ({order}): {refused.code}")
            answers.put(
                {
                    "refused": refused.code,
                    "scope": refused.scope,
                    "lock_path": refused.lock_path,
                    "message": str(refused),
                }
            )
        else:
            answers.put({"report": None if report is None else asdict(report)})
    runner.service.dispose()


# -- the parent's view ----------------------------------------------------------------------------------


class Timeline:
    """The parent's moments, merged with those the processes logged, on the one monotonic clock."""

    def __init__(self, log: Path) -> None:
        self.log = log
        self.parent: list[tuple[float, str]] = []

    def mark(self, text: str) -> None:
        self.parent.append((time.monotonic(), text))

    def logged(self) -> list[tuple[float, str, str]]:
        """(time, who, text) of every line the processes and the parent wrote to the log, in order."""
        lines = self.log.read_text(encoding="utf-8").splitlines() if self.log.exists() else []
        return [(float(t), who, text) for t, who, _pid, text in (line.split(" ", 3) for line in lines)]

    def render(self) -> list[str]:
        moments = sorted(
            [(t, who, text) for t, who, text in self.logged()]
            + [(t, "parent", text) for t, text in self.parent]
        )
        start = next(t for t, who, text in moments if who == "A" and text.startswith(CLAIM))
        return [f"{t - start:+8.3f} s  {who:<6} {text}" for t, who, text in moments]


def _row(store: SqlJobStore) -> Any:
    """The job's row, read without a lock (A may be stopped anywhere)."""
    with store.engine.connect() as conn:
        return _job_row(conn.execute(select(worker_jobs).where(worker_jobs.c.job_id == JOB)).mappings().one())


def _attempts(store: SqlJobStore) -> int:
    with store.engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(worker_job_attempts)).scalar_one())


def _no_step_ran_twice_at_once(timeline: Timeline) -> None:
    """Read in the log's order: no process starts a step while another process is inside one."""
    inside: dict[str, int] = {}
    for _, who, text in timeline.logged():
        if text.startswith("start step"):
            assert not inside, f"{who} started {text!r} while {inside} ran"
            inside[who] = int(text.rsplit(" ", 1)[1])
        elif text.startswith("end step"):
            assert inside.pop(who) == int(text.rsplit(" ", 1)[1])
        elif text == "SIGKILL A: dead":
            inside.pop("A", None)


@pytest.mark.parametrize("fate", ["sigkill", pytest.param("sigcont", marks=pytest.mark.extra)])
def test_a_stalled_runner_is_never_taken_over_while_it_lives(
    db_url: str, sql_backend: str, tmp_path: Path, fate: str
) -> None:
    # SQLite: the store's default, beside the database file. PostgreSQL has none (its runners
    # may be on several machines): a one-machine deployment names the directory.
    if sql_backend == "sqlite":
        lock_dir, where = None, Path(f"{make_url(db_url).database}.job-locks")
    else:
        lock_dir = str(tmp_path / "job-locks")
        where = Path(lock_dir)
    log, target = tmp_path / "moments.log", str(tmp_path / "target.sqlite3")
    timeline = Timeline(log)
    service = JobService(SqlJobStore.open(db_url), lease_seconds=LEASE)
    assert isinstance(service.store, SqlJobStore)
    service.enqueue(Job(JOB, SCOPE, "slow", {"steps": STEPS}))
    in_step, proceed, orders, answers = CTX.Event(), CTX.Event(), CTX.Queue(), CTX.Queue()
    a = CTX.Process(target=_owner_a, args=(db_url, lock_dir, str(log), target, in_step, proceed))
    b = CTX.Process(target=_runner_b, args=(db_url, lock_dir, str(log), target, orders, answers))
    try:
        with running(a, b):
            assert in_step.wait(WAIT)
            assert a.pid is not None
            os.kill(a.pid, signal.SIGSTOP)
            timeline.mark("SIGSTOP A (inside step 2)")

            # Watch A's row as a claimer would: the service's own rule, on this clock.
            watch, first, since = LeaseWatch(), _row(service.store), time.monotonic()
            assert (first.state, first.fence, first.checkpoint_step) == ("running", 1, 1)
            watch.expired(first, since, LEASE)
            timeline.mark(f"reads A's row: (fence, beat) = ({first.fence}, {first.beat})")
            while not watch.expired(row := _row(service.store), now := time.monotonic(), LEASE):
                time.sleep(LEASE / 6)
            assert (row.fence, row.beat) == (first.fence, first.beat)
            timeline.mark(
                f"lease lapsed: (fence, beat) still ({row.fence}, {row.beat}) after {now - since:.3f} s "
                f"(lease {LEASE} s): by the lease alone, the job may be reclaimed"
            )
            before = (footprint(service, JOB), _attempts(service.store))

            # B asks again and again while A lives: refused at once, nothing written.
            for order in ("run", "run_next", "run", "run_next"):
                orders.put(order)
                answer = answers.get(timeout=WAIT)
                assert answer.get("refused") == "job_locked", answer
                assert answer == {
                    "refused": "job_locked",
                    "scope": SCOPE,
                    "lock_path": str(_lock_file(where, SCOPE)),
                    "message": answer["message"],
                }
                assert answer["lock_path"] in answer["message"] and "slow" not in answer["message"]
                time.sleep(LEASE / 4)
            assert a.is_alive()
            assert (footprint(service, JOB), _attempts(service.store)) == before

            if fate == "sigkill":
                os.kill(a.pid, signal.SIGKILL)
                a.join(WAIT)
                _note(str(log), "parent", "SIGKILL A: dead")
                orders.put("takeover")
                report = answers.get(timeout=WAIT)["report"]
                assert (report["state"], report["reason"], report["steps"], report["published"]) == (
                    "completed",
                    "completed",
                    (2, 3, 4),
                    True,
                )
            else:
                os.kill(a.pid, signal.SIGCONT)
                timeline.mark("SIGCONT A")
                proceed.set()
                a.join(WAIT)
                assert a.exitcode == 0
                orders.put("run")
                report = answers.get(timeout=WAIT)["report"]
                assert (report["outcome"], report["state"], report["steps"]) == ("final", "completed", ())
            orders.put("stop")
    finally:
        lines = timeline.render() if log.exists() else []
        (tmp_path / "timeline.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
        print(f"\njob exclusivity timeline ({sql_backend}, {fate}):", *lines, sep="\n")
        SUMMARY_LINES.append(f"job exclusivity timeline ({sql_backend}, {fate}):")
        SUMMARY_LINES.extend(f"  {line}" for line in lines)
    assert b.exitcode == 0

    _no_step_ran_twice_at_once(timeline)
    moments = timeline.logged()
    steps = [(who, text) for _, who, text in moments if text.startswith(("start step", "end step"))]
    claims = [(who, text) for _, who, text in moments if text.startswith(CLAIM)]
    view = service.status(JOB)
    [published] = LocalPublisher(target).read_published(JOB)
    if fate == "sigkill":
        # B watched the dead owner's lease afresh, then reclaimed under fence 2, after checkpoint 1.
        assert claims[0] == ("A", CLAIM + "claimed (claimed, fence 1)")
        assert claims[1] == ("B", CLAIM + "not_claimable (lease_live)")
        assert claims[-1] == ("B", CLAIM + "claimed (lease_expired, fence 2)")
        assert steps == [("A", "start step 1"), ("A", "end step 1"), ("A", "start step 2")] + [
            ("B", f"{edge} step {n}") for n in (2, 3, 4) for edge in ("start", "end")
        ]
        assert (view.state, view.fence, view.attempts) == ("completed", 2, 2)
        assert [c.fence for c in service.checkpoints(JOB)] == [1, 2, 2]
        assert published.attempt_id == service.events(JOB)[-1].attempt_id
    else:
        assert claims == [("A", CLAIM + "claimed (claimed, fence 1)"), ("B", CLAIM + "final (completed)")]
        assert steps == [("A", f"{edge} step {n}") for n in (1, 2, 3, 4) for edge in ("start", "end")]
        assert (view.state, view.fence, view.attempts) == ("completed", 1, 1)
    assert [who for _, who, text in moments if text == "published"] == ["B" if fate == "sigkill" else "A"]
    service.dispose()


# -- the lock itself, in one process ------------------------------------------------------------------


def _memory_jobs() -> JobService:
    return JobService(MemoryJobStore(), clock=ManualClock(), lease_seconds=10.0)


class _Gate(Counting):
    """Counts; step 1 of a job waits for ``release`` after setting ``inside``."""

    def __init__(self) -> None:
        super().__init__()
        self.inside, self.release = threading.Event(), threading.Event()

    def __call__(self, payload: Value, step: int, state: Value) -> Continue | Finish:
        if step == 1:
            self.inside.set()
            assert self.release.wait(WAIT)
        return super().__call__(payload, step, state)


class _Failing:
    def publish(self, job_id: str, attempt_id: str, result: bytes, *, fence: int | None = None) -> None:
        raise ConnectionError("the target is gone")

    def read_published(self, job_id: str, *, fence: int | None = None) -> list[Any]:
        return []


def test_a_second_runner_on_a_scope_in_use_is_refused_and_the_lock_ends_with_the_run(tmp_path: Path) -> None:
    jobs, lock_dir = _memory_jobs(), tmp_path / "locks"
    for job_id, scope in (("a1", "tenant-a"), ("a2", "tenant-a"), ("b1", "tenant-b"), ("a3", "tenant-a")):
        jobs.enqueue(Job(job_id, scope, "count", {"steps": 2}))
    gate = _Gate()
    first = JobRunner(jobs, MemoryPublisher(), {"count": gate}, lock_dir=lock_dir)
    second = JobRunner(jobs, MemoryPublisher(), {"count": Counting()}, lock_dir=lock_dir)
    assert lock_dir.is_dir() and lock_dir.stat().st_mode & 0o777 == 0o700
    reports: list[Any] = []
    thread = threading.Thread(target=lambda: reports.append(first.run("a1")))
    thread.start()
    try:
        assert gate.inside.wait(WAIT)
        before = footprint(jobs, "a1", "a2")
        for attempt in (
            lambda: second.run("a2"),
            lambda: second.run_next("tenant-a"),
            lambda: first.run("a2"),
        ):
            with pytest.raises(JobLockedError) as refused:
                attempt()
            assert (refused.value.code, refused.value.scope) == ("job_locked", "tenant-a")
            assert refused.value.lock_path == str(_lock_file(lock_dir, "tenant-a"))
            assert refused.value.lock_path in str(refused.value)
        assert footprint(jobs, "a1", "a2") == before
        # Another scope is not locked.
        assert second.run("b1").state == "completed"
    finally:
        gate.release.set()
        thread.join(WAIT)
    assert [r.state for r in reports] == ["completed"]
    # The run returned: its lock went with it.
    assert second.run("a2").state == "completed"
    # A run that raises lets the lock go too.
    failing = JobRunner(jobs, _Failing(), {"count": Counting()}, lock_dir=lock_dir)
    with pytest.raises(ConnectionError):
        failing.run("a3")
    assert (second.run("a3").outcome, jobs.status("a3").state) == ("not_claimable", "running")


def test_the_lock_directory_is_the_stores_unless_named_and_one_that_cannot_be_made_is_refused(
    db_url: str, sql_backend: str, tmp_path: Path
) -> None:
    store = SqlJobStore.open(db_url)
    sql = JobService(store, lease_seconds=10.0)
    runner = JobRunner(sql, MemoryPublisher(), {})
    if sql_backend == "sqlite":
        expected = f"{make_url(db_url).database}.job-locks"
        assert store.default_lock_dir() == expected and runner.lock_dir == Path(expected)
        assert Path(expected).is_dir()
    else:
        assert store.default_lock_dir() is None and runner.lock_dir is None
        with pytest.raises(InvalidJobError) as refused:
            JobRunner(sql, MemoryPublisher(), {}, file_lock=True)
        assert refused.value.field == "lock_dir"
    assert JobRunner(sql, MemoryPublisher(), {}, lock_dir=tmp_path / "named").lock_dir == tmp_path / "named"
    assert JobRunner(sql, MemoryPublisher(), {}, lock_dir=tmp_path / "off", file_lock=False).lock_dir is None
    assert not (tmp_path / "off").exists()
    sql.dispose()

    memory = _memory_jobs()
    assert memory.store.default_lock_dir() is None
    assert JobRunner(memory, MemoryPublisher(), {}).lock_dir is None
    with pytest.raises(InvalidJobError) as refused:
        JobRunner(memory, MemoryPublisher(), {}, file_lock=True)
    assert refused.value.field == "lock_dir"
    (tmp_path / "a-file").write_text("")
    with pytest.raises(InputError) as unmade:
        JobRunner(memory, MemoryPublisher(), {}, lock_dir=tmp_path / "a-file" / "locks")
    assert unmade.value.field == "lock_dir"
    assert not (tmp_path / "a-file" / "locks").exists()
