"""A retried job waits its backoff: the rule on every job store (memory, SQLite, PostgreSQL; docs/jobs.md).

A retryable failure that leaves attempts sets ``not_before`` (the service's
wall clock plus the backoff of the attempt that failed); no claim takes the job
before that time, every claim may take it from then on.  The same checks run
on each backend (``job_stores``), so the memory reference and the SQL stores
agree.  The wall clock is a :class:`WallClock` the tests move; the draw of the
jitter is a parameter too.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from datetime import timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from admission.errors import InvalidJobError
from admission.intent import canonical_encode
from admission.jobs import NO_BACKOFF, Backoff, Job, JobService, JobStore
from tests.support.jobkit import JobStores, WallClock, footprint, jobs_on

pytestmark = pytest.mark.async_stores("memory", "sqlite")

MICROSECOND = timedelta(microseconds=1)
MINUTE = Backoff(base=60.0, factor=2.0, cap=600.0, jitter=0.0)


@pytest.fixture
def wall() -> WallClock:
    return WallClock()


@pytest.fixture
def store(job_stores: JobStores) -> JobStore:
    return job_stores.open()


@pytest.fixture
def jobs(store: JobStore, wall: WallClock) -> Iterator[JobService]:
    service = jobs_on(store, now=wall, backoff=MINUTE, rng=lambda: 0.25)
    yield service
    service.dispose()


def job(job_id: str = "j1", **kw: object) -> Job:
    return Job(job_id, kw.pop("scope", "tenant-a"), "count", {"steps": 1}, **kw)  # type: ignore[arg-type]


def fail_once(jobs: JobService, job_id: str, *, retryable: bool = True) -> None:
    lease = jobs.claim(job_id).lease
    assert lease is not None
    jobs.fail(lease, "transient", retryable=retryable)


def test_a_retried_job_is_claimed_only_once_its_backoff_ended(jobs: JobService, wall: WallClock) -> None:
    jobs.enqueue(job(max_attempts=3))
    failed_at = wall.now
    fail_once(jobs, "j1")
    view = jobs.status("j1")
    assert (view.state, view.not_before) == ("retry_wait", failed_at + timedelta(seconds=60))
    wall.advance(60 - 1e-6)
    assert (jobs.claim("j1").outcome, jobs.claim("j1").reason) == ("not_claimable", "backoff")
    assert jobs.claim_next("tenant-a") is None
    wall.advance(1e-6)
    claimed = jobs.claim_next("tenant-a")
    assert claimed is not None and claimed.job_id == "j1" and claimed.lease is not None
    assert jobs.status("j1").not_before is None  # cleared by the claim
    # The second failure waits the next ceiling: 120 s (no jitter in MINUTE).
    jobs.fail(claimed.lease, "again", retryable=True)
    assert jobs.status("j1").not_before == wall.now + timedelta(seconds=120)


def test_a_job_s_own_backoff_overrides_the_service_s_and_belongs_to_its_content(
    jobs: JobService, wall: WallClock
) -> None:
    own = Backoff(base=5.0, factor=3.0, cap=10.0, jitter=1.0)
    assert jobs.enqueue(job("own", backoff=own)).outcome == "enqueued"
    assert jobs.enqueue(job("own", backoff=own)).outcome == "duplicate"
    assert jobs.enqueue(job("own", backoff=MINUTE)).outcome == "conflict"
    assert jobs.enqueue(job("own")).outcome == "conflict"
    fail_once(jobs, "own")
    # Full jitter with the service's draw 0.25: three quarters of the 5 s ceiling.
    assert jobs.status("own").not_before == wall.now + timedelta(seconds=3.75)


def test_a_job_without_a_backoff_keeps_the_content_it_had_before_backoffs_existed(jobs: JobService) -> None:
    jobs.enqueue(job("plain", max_attempts=2))
    with jobs.store.transaction() as tx:
        [stored] = tx.find_jobs(["plain"])
    before = {
        "scope": "tenant-a",
        "kind": "count",
        "payload": {"steps": 1},
        "depends_on": [],
        "max_attempts": 2,
    }
    assert stored.content == canonical_encode(before)


def test_no_backoff_is_set_when_no_retry_follows(jobs: JobService) -> None:
    jobs.enqueue_all([job("fatal"), job("last", max_attempts=1)])
    fail_once(jobs, "fatal", retryable=False)
    fail_once(jobs, "last")
    for job_id, reason in (("fatal", "failed"), ("last", "attempts_exhausted")):
        view = jobs.status(job_id)
        assert (view.state, view.reason, view.not_before) == ("failed", reason, None)


@pytest.mark.parametrize("request_name", ["stop", "cancel"])
def test_a_job_in_backoff_can_be_stopped_or_cancelled(jobs: JobService, request_name: str) -> None:
    jobs.enqueue(job())
    fail_once(jobs, "j1")
    view = getattr(jobs, request_name)("j1")
    assert (view.state, view.not_before) == ("cancelled", None)
    assert jobs.claim("j1").outcome == "final"


@pytest.mark.parametrize(
    ("field", "policy"),
    [
        ("backoff.base", Backoff(base=-1.0)),
        ("backoff.factor", Backoff(factor=0.5)),
        ("backoff.cap", Backoff(base=10.0, cap=5.0)),
        ("backoff.cap", Backoff(cap=float("inf"))),
        ("backoff.jitter", Backoff(jitter=1.5)),
        ("backoff.base", Backoff(base=True)),
    ],
)
def test_a_malformed_backoff_is_refused_naming_the_field_and_nothing_is_written(
    jobs: JobService, store: JobStore, field: str, policy: Backoff
) -> None:
    before = footprint(jobs, "bad")
    with pytest.raises(InvalidJobError) as refused:
        jobs.enqueue(job("bad", backoff=policy))
    assert refused.value.field == field
    assert footprint(jobs, "bad") == before
    with pytest.raises(InvalidJobError) as refused:
        jobs_on(store, backoff=policy)
    assert refused.value.field == field


def test_a_job_is_never_claimable_before_its_not_before_and_always_from_then_on(
    job_stores: JobStores,
) -> None:
    wall = WallClock()
    draws = iter(())
    service = jobs_on(job_stores.open(), now=wall, backoff=NO_BACKOFF, rng=lambda: next(draws))
    ids = itertools.count()
    try:

        @given(
            base=st.floats(0, 100),
            factor=st.floats(1, 10),
            extra=st.floats(0, 1000),
            jitter=st.floats(0, 1),
            failures=st.integers(1, 3),
            draw=st.floats(0, 1, exclude_max=True),
            later=st.floats(0, 10_000),
        )
        @settings(max_examples=25, deadline=None)
        def check(
            base: float, factor: float, extra: float, jitter: float, failures: int, draw: float, later: float
        ) -> None:
            nonlocal draws
            draws = itertools.repeat(draw)
            policy = Backoff(base=base, factor=factor, cap=base + extra, jitter=jitter)
            job_id, scope = f"p{next(ids)}", f"scope-{next(ids)}"
            service.enqueue(job(job_id, scope=scope, backoff=policy, max_attempts=failures + 1))
            for attempt in range(1, failures + 1):
                fail_once(service, job_id)
                not_before = service.status(job_id).not_before
                assert not_before is not None
                assert not_before - wall.now == timedelta(seconds=policy.delay(attempt, draw))
                if not_before > wall.now:
                    wall.set(not_before - MICROSECOND)
                    assert service.claim_next(scope) is None
                    assert service.claim(job_id).reason == "backoff"
                wall.set(not_before + timedelta(seconds=later) * (attempt == failures))
                if attempt < failures:
                    continue
                claimed = service.claim_next(scope)
                assert claimed is not None and claimed.job_id == job_id
                service.cancel(job_id)  # the claim was the point; keep the store small

        check()
    finally:
        service.dispose()
