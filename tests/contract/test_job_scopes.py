"""One running job per scope, as a property of random programs on every job store (docs/jobs.md, "Claims").

Random sequences of enqueues, claims (by id and ``claim_next``), completions,
failures and lease expiries over three scopes, each checked after every
operation: no scope ever has two ``running`` jobs; a claim answers
``scope_busy`` exactly when another job of the job's scope runs, and then
writes nothing; a claim of a waiting job of an idle scope succeeds; and
``claim_next`` in a scope with a running job claims nothing but that job.
The races of real processes are in ``tests/integration/test_job_crash.py``, the
claimers that share a queue in ``tests/integration/test_job_queue.py``.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from admission.errors import JobFencedError, JobStateError
from admission.jobs import FINAL_JOB_STATES, Job, JobLease, JobService, MemoryJobStore
from admission.sql import SqlJobStore
from tests.support.backends import SQL_BACKENDS, sqlite_url
from tests.support.jobkit import LEASE, ManualClock, footprint, jobs_on

SCOPES = 3
JOBS = 12
EXAMPLES = {"memory": 100, "sqlite": 10}
"""Programs per backend: the rule is the service's, so the memory store takes most of them; SQLite
checks that its store answers alike.  PostgreSQL's part, the locks, is raced for real elsewhere."""

operations = st.lists(
    st.one_of(
        st.tuples(st.just("enqueue"), st.integers(0, SCOPES - 1)),
        st.tuples(st.just("claim"), st.integers(0, JOBS - 1)),
        st.tuples(st.just("claim_next"), st.integers(0, SCOPES - 1)),
        st.tuples(st.just("complete"), st.integers(0, JOBS - 1)),
        st.tuples(st.sampled_from(["fail", "fail_fatally"]), st.integers(0, JOBS - 1)),
        st.tuples(st.just("lease_expires"), st.just(0)),
        st.tuples(st.just("claim_next_after_a_lease"), st.integers(0, SCOPES - 1)),
    ),
    min_size=4,
    max_size=30,
)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture(params=[backend for backend in ("memory", *SQL_BACKENDS) if backend in EXAMPLES])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def jobs(backend: str, tmp_path: Path, clock: ManualClock) -> Iterator[JobService]:
    service = jobs_on(
        MemoryJobStore() if backend == "memory" else SqlJobStore.open(sqlite_url(tmp_path)), clock
    )
    yield service
    service.dispose()


class Program:
    """One random program's jobs (``prefix``-named, so that programs on one store never meet)."""

    def __init__(self, jobs: JobService, clock: ManualClock, prefix: str) -> None:
        self.jobs, self.clock, self.prefix = jobs, clock, prefix
        self.scope_of: dict[str, str] = {}
        self.leases: dict[str, JobLease] = {}
        self.seen: dict[str, int] = {}

    def saw(self, what: str) -> None:
        self.seen[what] = self.seen.get(what, 0) + 1

    def scope(self, n: int) -> str:
        return f"{self.prefix}-s{n}"

    def job_id(self, n: int) -> str | None:
        known = list(self.scope_of)
        return known[n % len(known)] if known else None

    def running(self) -> dict[str, list[str]]:
        found: dict[str, list[str]] = {}
        for job_id, scope in self.scope_of.items():
            if self.jobs.status(job_id).state == "running":
                found.setdefault(scope, []).append(job_id)
        return found

    def claim(self, job_id: str) -> None:
        scope = self.scope_of[job_id]
        others = [j for j in self.running().get(scope, []) if j != job_id]
        before = footprint(self.jobs, *self.scope_of)
        view = self.jobs.status(job_id)
        answer = self.jobs.claim(job_id)
        self.saw(f"claim {answer.outcome} {answer.reason}")
        if answer.reason == "scope_busy":
            assert others and view.state in ("queued", "retry_wait"), (answer, others)
            assert footprint(self.jobs, *self.scope_of) == before  # a refusal writes nothing
        elif view.state == "queued":  # never paused here, and NO_BACKOFF: claimable unless busy
            assert answer.outcome == ("not_claimable" if others else "claimed"), (answer, others)
        if answer.lease is not None:
            self.leases[job_id] = answer.lease

    def claim_next(self, scope: str) -> None:
        running = self.running().get(scope, [])
        waiting = [
            j
            for j, s in self.scope_of.items()
            if s == scope and self.jobs.status(j).state in ("queued", "retry_wait")  # NO_BACKOFF: due
        ]
        answer = self.jobs.claim_next(scope)
        self.saw("claim_next none" if answer is None else f"claim_next {answer.reason}")
        if answer is None:
            # Nothing runs and something waits: then it must have been claimed.
            assert running or not waiting, (scope, waiting)
            return
        assert answer.lease is not None
        if running and answer.job_id in running:
            assert answer.reason == "lease_expired"  # a reclaim
        elif running:
            # The running job's reclaim was refused (its attempts were used up): it ended, the
            # scope was free, and the oldest waiting job started.
            assert self.jobs.status(running[0]).state in FINAL_JOB_STATES, (running, answer)
        self.leases[answer.job_id] = answer.lease

    def run(self, name: str, n: int) -> None:
        if name == "enqueue":
            job_id = f"{self.prefix}-j{len(self.scope_of)}"
            self.jobs.enqueue(Job(job_id, self.scope(n), "count", {"steps": 1}))
            self.scope_of[job_id] = self.scope(n)
        elif name == "claim_next":
            self.claim_next(self.scope(n))
        elif name == "lease_expires":
            self.clock.advance(LEASE)
        elif name == "claim_next_after_a_lease":
            # Watch the scope's running job, a whole lease of silence, again: how it is reclaimed.
            self.claim_next(self.scope(n))
            self.check()
            self.clock.advance(LEASE)
            self.claim_next(self.scope(n))
        elif (job_id := self.job_id(n)) is None:
            return
        elif name == "claim":
            self.claim(job_id)
        elif (lease := self.leases.get(job_id)) is not None:
            try:
                if name == "complete":
                    if lease.publish_result is None:
                        self.jobs.record_result(lease, {"sum": 1})
                    self.jobs.complete(lease)
                else:
                    self.jobs.fail(lease, "x", retryable=name == "fail")
            except (JobFencedError, JobStateError):
                pass  # a lease taken over meanwhile, or one that ended: refused, as fencing says

    def check(self) -> None:
        for scope, running in self.running().items():
            assert len(running) <= 1, (scope, running)
        for n in range(SCOPES):
            assert self.jobs.counts(self.scope(n)).get("running", 0) <= 1


def test_no_scope_ever_has_two_running_jobs_and_a_busy_scopes_refusal_writes_nothing(
    backend: str, jobs: JobService, clock: ManualClock
) -> None:
    programs = itertools.count()
    seen: dict[str, int] = {}

    @given(operations)
    @settings(max_examples=EXAMPLES[backend], deadline=None)
    def check(program: list[tuple[str, int]]) -> None:
        state = Program(jobs, clock, f"p{next(programs)}")
        # Every program starts with two jobs waiting in each scope: claims have something to meet.
        for name, n in [("enqueue", k % SCOPES) for k in range(2 * SCOPES)] + program:
            state.run(name, n)
            state.check()
        for what, times in state.seen.items():
            seen[what] = seen.get(what, 0) + times

    check()
    if backend != "memory":
        return
    # The programs met the rule's corners: a busy scope, a reclaim by claim_next, a claim_next refused.
    for corner in ("claim not_claimable scope_busy", "claim_next lease_expired", "claim_next none"):
        assert seen.get(corner, 0) > 0, (corner, seen)
