"""Shared pieces of the job tests: a manual monotonic clock, step handlers, services, write footprints."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from admission.errors import UnknownJobError
from admission.intent import Value
from admission.jobs import (
    NO_BACKOFF,
    Checkpoint,
    Continue,
    Finish,
    JobEvent,
    JobService,
    JobStore,
    JobView,
    MemoryJobStore,
)
from admission.sql import SqlJobStore

LEASE = 10.0


@dataclass
class ManualClock:
    """A monotonic clock that only moves when told to."""

    now: float = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@dataclass
class WallClock:
    """A wall clock (the service's ``now``) that only moves when told to: backoffs end at its times."""

    now: datetime = datetime(2026, 1, 1, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)

    def set(self, moment: datetime) -> None:
        self.now = moment

    def at(self, seconds: float) -> datetime:
        """The time ``seconds`` from now on this clock."""
        return self.now + timedelta(seconds=seconds)


class JobStores:
    """Handles on one fresh job store of ``backend``; :meth:`close` disposes of them all.

    :meth:`open` gives another handle on the same jobs: the in-memory store
    itself, or a SQL store with an engine (and connections) of its own, as a
    second process would hold.
    """

    def __init__(self, backend: str, url: str | None = None) -> None:
        self.backend = backend
        self.url = url
        self._memory = MemoryJobStore() if url is None else None
        self._opened: list[JobStore] = []

    def open(self) -> JobStore:
        store: JobStore
        if self._memory is not None:
            store = self._memory
        else:
            assert self.url is not None
            store = SqlJobStore.open(self.url)
        self._opened.append(store)
        return store

    def close(self) -> None:
        for store in self._opened:
            store.dispose()


def jobs_on(store: JobStore, clock: ManualClock | None = None, **options: object) -> JobService:
    """A job service on ``store`` driven by a manual clock, with the tests' lease.

    Without a ``backoff`` option, a failed job may be retried at once (``NO_BACKOFF``): the
    suites retry without waiting; the backoff's own tests give one, and a :class:`WallClock`.
    """
    options.setdefault("backoff", NO_BACKOFF)
    return JobService(store, clock=clock or ManualClock(), lease_seconds=LEASE, **options)  # type: ignore[arg-type]


def open_jobs(url: str, clock: ManualClock | None = None, **options: object) -> JobService:
    """A job service on the SQL database at ``url`` (an engine of its own), driven by a manual clock."""
    return jobs_on(SqlJobStore.open(url), clock, **options)


@dataclass
class Counting:
    """A step handler: ``payload["steps"]`` steps, each adds its number to the state; the result is the sum.

    Every call is recorded in ``calls``; ``fail_at`` maps a step to the exception it raises once.
    """

    calls: list[tuple[int, Value]] = field(default_factory=list)
    fail_at: dict[int, BaseException] = field(default_factory=dict)
    log: Path | None = None

    def __call__(self, payload: Value, step: int, state: Value) -> Continue | Finish:
        self.calls.append((step, state))
        if self.log is not None:
            with open(self.log, "a", encoding="utf-8") as out:
                out.write(f"{os.getpid()} {step}\n")
                out.flush()
                os.fsync(out.fileno())
        if step in self.fail_at:
            raise self.fail_at.pop(step)
        assert isinstance(payload, dict)
        total = (state if isinstance(state, int) else 0) + step
        steps = payload["steps"]
        assert isinstance(steps, int)
        return Finish({"sum": total}) if step >= steps else Continue(total)


@dataclass(frozen=True)
class Footprint:
    """What a store holds, read through the port: job counts by state (every scope), and each
    named job's view, events and checkpoints.  A refused write leaves it unchanged."""

    counts: dict[str, int]
    jobs: dict[str, tuple[JobView | None, list[JobEvent], list[Checkpoint]]]


def footprint(jobs: JobService, *job_ids: str) -> Footprint:
    """The :class:`Footprint` of ``jobs``'s store, with ``job_ids`` (known or not) read in full.

    Every event, checkpoint and attempt belongs to a job, so with the counts
    of all jobs and the full reads of every job a test made, no write goes
    unseen: an attempt starts only with a claim, which changes the view and
    appends an event.
    """
    found: dict[str, tuple[JobView | None, list[JobEvent], list[Checkpoint]]] = {}
    for job_id in job_ids:
        try:
            view: JobView | None = jobs.status(job_id)
        except UnknownJobError:
            view = None
        found[job_id] = (view, jobs.events(job_id), jobs.checkpoints(job_id))
    return Footprint(jobs.counts(), found)


def expire(store: JobService, clock: ManualClock, job_id: str) -> None:
    """Let ``store`` watch ``job_id`` for a whole lease, so that its next claim reclaims it."""
    answer = store.claim(job_id)
    assert (answer.outcome, answer.reason) == ("not_claimable", "lease_live"), answer
    clock.advance(LEASE)


def sum_of(steps: int) -> Callable[[], dict[str, int]]:
    return lambda: {"sum": steps * (steps + 1) // 2}
