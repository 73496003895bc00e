"""Bounded recovery, on every job store (worker contract §4; docs/jobs.md "Publication and recovery").

A job whose result was recorded is never executed again: each claim after its
lease expired starts a *recovery* attempt, which reads the target back.  When
the target stays unreadable, those attempts are bounded by the job's
``max_attempts``, counted from the attempt that recorded the result; past the
bound the claim moves the job to ``recovery_required`` (``recovery_exhausted``)
with a diagnostic, and nothing is executed or published.  The runner records
why each read or publication failed (``publication_failed``) before the
exception reaches its caller.

The target here is the in-memory one, cut off and repaired at will, counting
every call; ``tests/integration/test_job_recovery.py`` breaks a real file with
real processes.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from admission.errors import InvalidJobError, JobFencedError, JobStateError, StorageError
from admission.jobs import (
    Job,
    JobLease,
    JobRunner,
    JobService,
    JobStore,
    PublishedResult,
    RunReport,
)
from admission.testing import MemoryPublisher
from tests.support.jobkit import Counting, JobStores, ManualClock, expire, jobs_on

pytestmark = pytest.mark.async_stores("memory", "sqlite")

STEPS = 3


class Unreachable(MemoryPublisher):
    """The in-memory target that can be cut off (``down``): then every read and publication raises,
    as a refused connection does.  Counts every call, landed or not."""

    def __init__(self, *, down: bool = True) -> None:
        super().__init__()
        self.down = down
        self.reads = 0
        self.publishes = 0

    def publish(self, job_id: str, attempt_id: str, result: bytes, *, fence: int | None = None) -> None:
        self.publishes += 1
        if self.down:
            raise ConnectionError(f"publishing {job_id}: connection refused")
        super().publish(job_id, attempt_id, result, fence=fence)

    def read_published(self, job_id: str, *, fence: int | None = None) -> Sequence[PublishedResult]:
        self.reads += 1
        if self.down:
            raise ConnectionError(f"reading {job_id}: connection refused")
        return super().read_published(job_id, fence=fence)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def store(job_stores: JobStores) -> JobStore:
    return job_stores.open()


@pytest.fixture
def jobs(store: JobStore, clock: ManualClock) -> Iterator[JobService]:
    service = jobs_on(store, clock)
    yield service
    service.dispose()


def executed_then_publish_failed(
    jobs: JobService, target: Unreachable, job_id: str, max_attempts: int, handler: Counting
) -> JobRunner:
    """Enqueue and run ``job_id`` with the target down: every step runs, the result is recorded, the
    publication raises; the runner records why and lets the exception go on, the job stays running."""
    jobs.enqueue(Job(job_id, f"scope-{job_id}", "count", {"steps": STEPS}, max_attempts=max_attempts))
    runner = JobRunner(jobs, target, {"count": handler})
    with pytest.raises(ConnectionError):
        runner.run(job_id)
    return runner


def reclaim_and_run(jobs: JobService, clock: ManualClock, runner: JobRunner, job_id: str) -> RunReport:
    """Let the job's lease expire (this service watches it for a whole lease), then run it."""
    expire(jobs, clock, job_id)
    return runner.run(job_id)


def test_a_failed_publication_is_recorded_on_the_job_before_the_exception_reaches_the_caller(
    jobs: JobService, clock: ManualClock
) -> None:
    target, handler = Unreachable(), Counting()
    executed_then_publish_failed(jobs, target, "j1", 1, handler)
    view = jobs.status("j1")
    assert (view.state, view.attempts) == ("running", 1)
    assert view.diagnostic == "ConnectionError: publishing j1: connection refused"
    last = jobs.events("j1")[-1]
    assert (last.event, last.from_state, last.to_state, last.reason) == (
        "publication_failed",
        "running",
        "running",
        "publish_failed",
    )
    assert (last.fence, last.detail) == (view.fence, view.diagnostic)
    assert [step for step, _ in handler.calls] == [1, 2, 3]
    assert (target.publishes, target.publications) == (1, [])


@pytest.mark.parametrize("max_attempts", [1, 3])
def test_recovery_of_an_unreadable_target_stops_at_the_bound_with_a_diagnostic(
    jobs: JobService, clock: ManualClock, max_attempts: int
) -> None:
    target, handler = Unreachable(), Counting()
    runner = executed_then_publish_failed(jobs, target, "j1", max_attempts, handler)
    for recovery in range(1, max_attempts + 1):
        with pytest.raises(ConnectionError):
            reclaim_and_run(jobs, clock, runner, "j1")
        view = jobs.status("j1")
        assert (view.state, view.attempts) == ("running", 1 + recovery)
        assert view.diagnostic == "ConnectionError: reading j1: connection refused"
        assert jobs.events("j1")[-1].reason == "target_unreadable"
    report = reclaim_and_run(jobs, clock, runner, "j1")
    assert (report.outcome, report.state, report.reason) == (
        "not_claimable",
        "recovery_required",
        "recovery_exhausted",
    )
    view = jobs.status("j1")
    assert (view.state, view.reason, view.attempts) == (
        "recovery_required",
        "recovery_exhausted",
        1 + max_attempts,
    )
    plural = "" if max_attempts == 1 else "s"
    assert view.diagnostic == (
        f"recovery exhausted: {max_attempts} recovery attempt{plural} (the bound, "
        f"max_attempts={max_attempts}) after attempt 1 recorded the result; no step was re-executed "
        "and nothing is published again until an operator resolves the job; the last recovery "
        f"attempt ({1 + max_attempts}) ended target_unreadable: ConnectionError: reading j1: "
        "connection refused"
    )
    last = jobs.events("j1")[-1]
    assert (last.event, last.from_state, last.to_state, last.detail) == (
        "recovery_exhausted",
        "running",
        "recovery_required",
        view.diagnostic,
    )
    # Nothing ran again, nothing was published, and no claim goes on.
    assert [step for step, _ in handler.calls] == [1, 2, 3]
    assert (target.publishes, target.reads, target.publications) == (1, max_attempts, [])
    again = jobs.claim("j1")
    assert (again.outcome, again.reason, again.lease) == ("not_claimable", "recovery_required", None)
    assert jobs.status("j1").attempts == 1 + max_attempts


def test_recovery_within_the_bound_completes_once_the_target_is_back(
    jobs: JobService, clock: ManualClock
) -> None:
    target, handler = Unreachable(), Counting()
    runner = executed_then_publish_failed(jobs, target, "j1", 3, handler)
    for _ in range(2):
        with pytest.raises(ConnectionError):
            reclaim_and_run(jobs, clock, runner, "j1")
    target.down = False
    report = reclaim_and_run(jobs, clock, runner, "j1")
    assert (report.state, report.reason, report.steps, report.published) == (
        "completed",
        "published_on_replay",
        (),
        True,
    )
    assert jobs.status("j1").attempts == 4
    [only] = target.publications
    recorder = next(e.attempt_id for e in jobs.events("j1") if e.event == "result_recorded")
    assert only.attempt_id == recorder and [step for step, _ in handler.calls] == [1, 2, 3]


def test_a_recovery_owner_that_died_silently_counts_and_the_diagnostic_says_no_error_was_recorded(
    jobs: JobService, clock: ManualClock
) -> None:
    jobs.enqueue(Job("j1", "s", "count", {"steps": 1}, max_attempts=1))
    lease = jobs.claim("j1").lease
    assert lease is not None
    jobs.record_result(lease, {"sum": 1})  # then the process dies, and so does its successor
    expire(jobs, clock, "j1")
    assert jobs.claim("j1").outcome == "claimed"
    expire(jobs, clock, "j1")
    answer = jobs.claim("j1")
    assert (answer.outcome, answer.state, answer.reason) == (
        "not_claimable",
        "recovery_required",
        "recovery_exhausted",
    )
    diagnostic = jobs.status("j1").diagnostic
    assert diagnostic is not None and diagnostic.endswith(
        "the last recovery attempt (2) ended lease_expired, no error recorded "
        "(its owner stopped or lost its lease)"
    )


def test_a_job_that_recorded_on_its_last_attempt_still_gets_its_recoveries(
    jobs: JobService, clock: ManualClock
) -> None:
    jobs.enqueue(Job("j1", "s", "count", {"steps": 1}, max_attempts=2))
    for attempt in (1, 2):
        lease = jobs.claim("j1").lease
        assert lease is not None and lease.attempt_number == attempt
        if attempt == 1:
            jobs.fail(lease, "transient", retryable=True)
    jobs.record_result(lease, {"sum": 1})  # on the last attempt; then the process dies
    for recovery in (3, 4):
        expire(jobs, clock, "j1")
        claimed = jobs.claim("j1").lease
        assert claimed is not None and claimed.attempt_number == recovery and claimed.publish_result
    expire(jobs, clock, "j1")
    assert jobs.claim("j1").reason == "recovery_exhausted"
    assert jobs.status("j1").attempts == 4


def test_dependents_stay_blocked_until_the_operator_resolves_an_exhausted_recovery(
    jobs: JobService, clock: ManualClock
) -> None:
    target = Unreachable()
    runner = executed_then_publish_failed(jobs, target, "a", 1, Counting())
    jobs.enqueue(Job("b", "scope-b", "count", {"steps": 1}, depends_on=("a",)))
    with pytest.raises(ConnectionError):
        reclaim_and_run(jobs, clock, runner, "a")
    assert reclaim_and_run(jobs, clock, runner, "a").reason == "recovery_exhausted"
    assert jobs.status("b").state == "blocked" and jobs.claim("b").reason == "blocked"
    # The operator reads the target (it holds nothing) and decides the work must be redone.
    view = jobs.resolve("a", "failed", who="ops@example", why="target lost the result")
    assert (view.state, view.reason) == ("failed", "resolved_failed")
    assert (jobs.status("b").state, jobs.status("b").reason) == ("failed", "dependency_failed")
    with pytest.raises(JobStateError):
        jobs.resolve("a", "completed", who="ops@example", why="twice")


def test_the_failure_record_is_a_fenced_write_that_needs_a_recorded_result(
    jobs: JobService, clock: ManualClock
) -> None:
    jobs.enqueue(Job("j1", "s", "count", {"steps": 1}))
    lease = jobs.claim("j1").lease
    assert lease is not None
    with pytest.raises(JobStateError):
        jobs.publication_failed(lease, "x", reason="publish_failed")  # nothing recorded yet
    jobs.record_result(lease, {"sum": 1})
    with pytest.raises(InvalidJobError) as refused:
        jobs.publication_failed(lease, "x", reason="lost")  # type: ignore[arg-type]
    assert refused.value.field == "reason"
    with pytest.raises(InvalidJobError) as too_long:
        jobs.publication_failed(lease, "x" * 3000, reason="publish_failed")
    assert too_long.value.field == "diagnostic"
    expire(jobs, clock, "j1")
    assert jobs.claim("j1").outcome == "claimed"
    with pytest.raises(JobFencedError):
        jobs.publication_failed(lease, "late", reason="publish_failed")
    assert "publication_failed" not in [e.event for e in jobs.events("j1")]


class _RefusingService(JobService):
    """A service whose failure record fails, as a busy database makes it."""

    def publication_failed(self, lease: JobLease, diagnostic: str, *, reason: str) -> None:  # type: ignore[override]
        raise StorageError("database is locked")


def test_when_the_failure_record_itself_fails_the_caller_still_gets_the_targets_exception(
    store: JobStore, clock: ManualClock
) -> None:
    jobs = _RefusingService(store, clock=clock, lease_seconds=10.0)
    jobs.enqueue(Job("j1", "s", "count", {"steps": 1}))
    with pytest.raises(ConnectionError, match="publishing j1"):
        JobRunner(jobs, Unreachable(), {"count": Counting()}).run("j1")
    assert jobs.status("j1").state == "running"


def test_recovery_attempts_never_pass_the_bound_and_the_end_is_as_predicted(
    jobs: JobService, clock: ManualClock
) -> None:
    ids = itertools.count()

    @given(st.integers(1, 4), st.integers(0, 6), st.booleans())
    @settings(max_examples=25, deadline=None)
    def check(max_attempts: int, failing: int, comes_back: bool) -> None:
        job_id = f"p{next(ids)}"
        target, handler = Unreachable(), Counting()
        runner = executed_then_publish_failed(jobs, target, job_id, max_attempts, handler)
        for _ in range(failing):
            if jobs.status(job_id).state != "running":
                assert jobs.claim(job_id).reason == "recovery_required"
                continue
            try:
                report = reclaim_and_run(jobs, clock, runner, job_id)
            except ConnectionError:
                continue
            assert report.reason == "recovery_exhausted"
        if comes_back:
            target.down = False
            if jobs.status(job_id).state == "running":
                reclaim_and_run(jobs, clock, runner, job_id)
        view = jobs.status(job_id)
        if failing >= max_attempts:
            expected = "recovery_required" if failing > max_attempts or comes_back else "running"
        else:
            expected = "completed" if comes_back else "running"
        assert view.state == expected
        recovering = min(failing, max_attempts) + (comes_back and failing < max_attempts)
        assert view.attempts == 1 + recovering <= 1 + max_attempts
        assert len(target.publications) == (view.state == "completed") <= 1
        assert [step for step, _ in handler.calls] == [1, 2, 3]

    check()
