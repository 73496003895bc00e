"""The publication target is fenced: an old owner's late publication is refused (worker contract §3, §4).

The job database refuses an old owner's writes; these tests show that the
target refuses its publication too, whenever it arrives after the next
owner's recovery read, so that a job's result is published once.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from admission.errors import JobFencedError
from admission.intent import canonical_encode
from admission.jobs import Job, JobRunner, JobService, LocalPublisher, PublishedResult
from admission.testing import MemoryPublisher
from tests.support.jobkit import Counting, ManualClock, expire, open_jobs

RESULT = canonical_encode({"sum": 6})


@pytest.fixture
def two_owners(db_url: str) -> Iterator[tuple[JobService, JobService, ManualClock]]:
    """Two services on one database (two owners, two engines); the second one's clock is returned."""
    first, later_clock = open_jobs(db_url, ManualClock()), ManualClock()
    later = open_jobs(db_url, later_clock)
    yield first, later, later_clock
    first.dispose()
    later.dispose()


def _publishers(tmp_path: Path) -> list[LocalPublisher | MemoryPublisher]:
    return [LocalPublisher(tmp_path / "target.sqlite3"), MemoryPublisher()]


class _Hooked:
    """A publisher that runs ``before_publish`` / ``after_read`` around the real target's calls."""

    def __init__(self, inner: LocalPublisher, *, before_publish: Callable[[], None] = lambda: None,
                 after_read: Callable[[], None] = lambda: None) -> None:  # fmt: skip
        self.inner, self.before_publish, self.after_read = inner, before_publish, after_read

    def publish(self, job_id: str, attempt_id: str, result: bytes, *, fence: int | None = None) -> None:
        self.before_publish()
        self.inner.publish(job_id, attempt_id, result, fence=fence)

    def read_published(self, job_id: str, *, fence: int | None = None) -> Sequence[PublishedResult]:
        found = self.inner.read_published(job_id, fence=fence)
        self.after_read()
        return found


def test_an_owner_paused_before_publishing_is_refused_after_the_next_owner_replayed(
    two_owners: tuple[JobService, JobService, ManualClock], tmp_path: Path
) -> None:
    first, later, later_clock = two_owners
    target = LocalPublisher(tmp_path / "target.sqlite3")
    first.enqueue(Job("j1", "tenant-a", "count", {"steps": 3}))
    reports = []

    def the_next_owner_takes_over() -> None:
        # The first owner has recorded its result and passed its deadline check;
        # here it stalls (a pause, a slow network) long enough to lose the lease.
        expire(later, later_clock, "j1")
        reports.append(JobRunner(later, target, {"count": Counting()}, file_lock=False).run("j1"))

    hooked = _Hooked(target, before_publish=the_next_owner_takes_over)
    # Two owners as on two machines: no file lock (on one machine it would refuse the
    # second while the first lives), so only the target's fence stops the late publication.
    stalled = JobRunner(first, hooked, {"count": Counting()}, file_lock=False)
    report = stalled.run("j1")
    # The target refused the late publication; the report says what the job is now, not "unknown".
    assert (report.outcome, report.reason, report.state) == ("fenced", "fenced", "completed")
    [replayed] = reports
    assert (replayed.state, replayed.reason, replayed.published) == ("completed", "published_on_replay", True)
    [only] = target.read_published("j1")
    assert only.result == RESULT
    assert later.status("j1").state == "completed"


@pytest.mark.parametrize("late", ["before_the_recovery_read", "after_the_recovery_read"])
def test_a_late_publication_lands_once_whenever_it_arrives(
    two_owners: tuple[JobService, JobService, ManualClock], tmp_path: Path, late: str
) -> None:
    first, later, later_clock = two_owners
    target = LocalPublisher(tmp_path / "target.sqlite3")
    first.enqueue(Job("j1", "tenant-a", "count", {"steps": 3}))
    old = first.claim("j1").lease
    assert old is not None
    recorded = first.record_result(old, {"sum": 6})
    refusals: list[JobFencedError] = []

    def old_owner_publishes() -> None:
        try:
            target.publish("j1", old.attempt_id, recorded, fence=old.fence)
        except JobFencedError as exc:
            refusals.append(exc)

    expire(later, later_clock, "j1")
    if late == "before_the_recovery_read":
        old_owner_publishes()
        hooked = _Hooked(target)
    else:
        hooked = _Hooked(target, after_read=old_owner_publishes)
    report = JobRunner(later, hooked, {"count": Counting()}).run("j1")
    [only] = target.read_published("j1")
    assert (only.attempt_id, only.result) == (old.attempt_id, RESULT)
    assert report.state == "completed"
    if late == "before_the_recovery_read":
        assert report.reason == "recovered_after_publish" and not refusals
    else:
        assert report.reason == "published_on_replay"
        [refused] = refusals
        assert (refused.fence, refused.current_fence) == (old.fence, old.fence + 1)


# -- the rule itself, for both targets ---------------------------------------------------------------

_OPERATION = st.tuples(
    st.sampled_from(["publish", "read"]), st.sampled_from(["a", "b"]), st.none() | st.integers(0, 4)
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(operations=st.lists(_OPERATION, max_size=12))
def test_a_target_refuses_exactly_the_calls_older_than_the_newest_token_it_has_seen(
    tmp_path_factory: pytest.TempPathFactory, operations: list[tuple[str, str, int | None]]
) -> None:
    for target in _publishers(tmp_path_factory.mktemp("fenced")):
        newest: dict[str, int] = {}
        accepted: list[PublishedResult] = []
        for number, (action, job_id, fence) in enumerate(operations):
            stale = fence is not None and fence < newest.get(job_id, -1)
            try:
                if action == "publish":
                    target.publish(job_id, f"attempt-{number}", bytes([number]), fence=fence)
                    accepted.append(PublishedResult(job_id, f"attempt-{number}", bytes([number])))
                else:
                    found = target.read_published(job_id, fence=fence)
                    assert list(found) == [p for p in accepted if p.job_id == job_id]
            except JobFencedError as exc:
                assert stale, (action, job_id, fence, newest)
                assert (exc.job_id, exc.fence, exc.current_fence) == (job_id, fence, newest[job_id])
            else:
                assert not stale, (action, job_id, fence, newest)
                if fence is not None:
                    newest[job_id] = max(newest.get(job_id, fence), fence)
        for job_id in ("a", "b"):
            assert list(target.read_published(job_id)) == [p for p in accepted if p.job_id == job_id]


def test_a_refused_late_publication_reports_the_state_the_job_is_in_now(
    two_owners: tuple[JobService, JobService, ManualClock], tmp_path: Path
) -> None:
    first, later, later_clock = two_owners
    target = LocalPublisher(tmp_path / "target.sqlite3")
    first.enqueue(Job("j1", "tenant-a", "count", {"steps": 3}))
    leases = []

    def the_next_owner_reads_the_target() -> None:
        # The next owner reclaims and makes its fenced recovery read, and is still at it.
        expire(later, later_clock, "j1")
        lease = later.claim("j1").lease
        assert lease is not None
        assert target.read_published("j1", fence=lease.fence) == []
        leases.append(lease)

    hooked = _Hooked(target, before_publish=the_next_owner_reads_the_target)
    report = JobRunner(first, hooked, {"count": Counting()}, file_lock=False).run("j1")
    [lease] = leases
    assert (report.outcome, report.state, report.reason) == ("fenced", "running", "fenced")
    view = later.status("j1")
    assert (view.state, view.fence) == ("running", lease.fence)
    assert target.read_published("j1") == []


def _open_target(path: str, start: Any, answers: Any) -> None:
    """A runner's start: open the publication target at ``path`` once ``start`` lets every one go."""
    start.wait()
    try:
        LocalPublisher(path)
        answers.put("opened")
    except Exception as exc:  # the answer is the test's to judge
        answers.put(f"{type(exc).__name__}: {exc}")


def test_runners_opening_a_new_target_at_once_all_open_it(tmp_path: Path) -> None:
    # Both hold the new file's read lock and want its write lock to switch it to WAL: SQLite
    # refuses one at once rather than wait (it would be a deadlock), and that one must ask again.
    # Forked after the import, so both reach the file together (a third of the rounds refused
    # one of them before the target asked again).
    context = multiprocessing.get_context("fork")
    refused = []
    for round_ in range(40):
        path = str(tmp_path / f"target-{round_}.sqlite3")
        start, answers = context.Barrier(2), context.Queue()
        openers = [context.Process(target=_open_target, args=(path, start, answers)) for _ in range(2)]
        for opener in openers:
            opener.start()
        for opener in openers:
            opener.join(60)
        both = (answers.get(timeout=5), answers.get(timeout=5))
        refused += [answer for answer in both if answer != "opened"]
    assert refused == []
