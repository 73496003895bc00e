"""A complete in-memory :class:`~admission.jobs._store.JobStore` (worker contract §3, §4).

A real implementation of the port, not a mock: the contract suite and the
model-based state machine run against it, SQLite and PostgreSQL alike.  One
lock serialises every transaction and read; a transaction works on a copy of
the tables and replaces them only when its block ends without an exception,
so it commits or rolls back as a whole.  The constraints the SQL schema
declares (a job id once, dependencies and scopes that exist, a checkpoint step
once) are kept too, and refused with the same :class:`StorageError`.

Pure: no SQLAlchemy, no I/O, no clock (times are passed in).  It keeps nothing
across processes.
"""

from __future__ import annotations

import threading
from collections.abc import Collection, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, replace
from datetime import datetime

from admission.errors import StorageError
from admission.intent._encoding import canonical_decode
from admission.jobs._states import UNFINISHED_JOB_STATES
from admission.jobs._store import (
    AttemptRow,
    CheckpointDigest,
    JobRow,
    JobsSnapshot,
    JobTransaction,
    SnapshotJob,
    snapshot_order,
)
from admission.jobs._values import Checkpoint, JobEvent, JobView

__all__ = ["MemoryJobStore"]

_CLAIMABLE = ("queued", "retry_wait", "running")


@dataclass(frozen=True)
class _Stored:
    """A checkpoint as stored: the canonical bytes of its state."""

    step: int
    attempt_id: str
    fence: int
    state: bytes
    recorded_at: datetime


@dataclass
class _Tables:
    # Every value is immutable (frozen rows, tuples), so a shallow copy of each dict is a snapshot.
    scopes: dict[str, int]  # scope -> last position
    jobs: dict[str, JobRow]
    depends_on: dict[str, tuple[str, ...]]
    dependents: dict[str, tuple[str, ...]]
    attempts: dict[str, AttemptRow]
    checkpoints: dict[str, tuple[_Stored, ...]]
    events: dict[str, tuple[JobEvent, ...]]
    last_event: int = 0

    def copy(self) -> _Tables:
        return _Tables(
            dict(self.scopes),
            dict(self.jobs),
            dict(self.depends_on),
            dict(self.dependents),
            dict(self.attempts),
            dict(self.checkpoints),
            dict(self.events),
            self.last_event,
        )


def _refused(constraint: str) -> StorageError:
    # As the SQL adapter refuses it on PostgreSQL, which names the constraint (admission.sql._engine).
    return StorageError(f"the database refused a write ({constraint})", constraint=constraint)


class _MemoryTransaction:
    """One transaction on a working copy of the tables."""

    def __init__(self, tables: _Tables) -> None:
        self._t = tables

    def lock_scope(
        self, scope: str, *, created_at: datetime | None = None, skip_locked: bool = False
    ) -> bool:
        # The store's one lock is held for the whole transaction: no other one holds the scope.
        if created_at is not None:
            self._t.scopes.setdefault(scope, 0)
        return scope in self._t.scopes

    def running_in_scope(self, scope: str) -> list[str]:
        rows = (r for r in self._t.jobs.values() if r.scope == scope and r.state == "running")
        return [r.job_id for r in sorted(rows, key=lambda r: r.position)]

    def lock_job(self, job_id: str, *, skip_locked: bool = False) -> JobRow | None:
        # The store's one lock is held for the whole transaction: no other one holds the job.
        return self._t.jobs.get(job_id)

    def find_jobs(self, job_ids: Collection[str]) -> list[JobRow]:
        return [self._t.jobs[j] for j in job_ids if j in self._t.jobs]

    def share_states(self, job_ids: Collection[str]) -> dict[str, str]:
        return {j: self._t.jobs[j].state for j in sorted(job_ids) if j in self._t.jobs}

    def count_unfinished(self, scope: str) -> int:
        return sum(1 for r in self._t.jobs.values() if r.scope == scope and r.state in UNFINISHED_JOB_STATES)

    def next_position(self, scope: str) -> int:
        if scope not in self._t.scopes:
            raise StorageError(f"no scope {scope!r}: lock it first")
        self._t.scopes[scope] += 1
        return self._t.scopes[scope]

    def insert_job(self, row: JobRow, depends_on: Sequence[str]) -> None:
        if row.job_id in self._t.jobs:
            raise _refused("pk_worker_jobs")
        if row.scope not in self._t.scopes:
            raise _refused("fk_worker_jobs_scope_worker_job_scopes")
        if len(set(depends_on)) != len(depends_on):
            raise _refused("pk_worker_job_dependencies")
        if any(d not in self._t.jobs for d in depends_on):
            raise _refused("fk_worker_job_dependencies_depends_on_worker_jobs")
        self._t.jobs[row.job_id] = row
        self._t.depends_on[row.job_id] = tuple(sorted(depends_on))
        for dependency in depends_on:
            self._t.dependents[dependency] = (*self._t.dependents.get(dependency, ()), row.job_id)

    def save_job(self, row: JobRow) -> None:
        stored = self._t.jobs.get(row.job_id)
        if stored is None:
            raise StorageError(f"no job {row.job_id!r} to save")
        fixed = {name: getattr(stored, name) for name in JobRow.FIXED}
        self._t.jobs[row.job_id] = replace(row, **fixed)

    def fenced_update(self, job_id: str, fence: int, *, updated_at: datetime) -> JobRow | None:
        row = self._t.jobs.get(job_id)
        if row is None or row.fence != fence or row.state != "running":
            return None
        row = replace(row, beat=row.beat + 1, updated_at=updated_at)
        self._t.jobs[job_id] = row
        return row

    def blocked_dependents(self, job_id: str) -> list[JobRow]:
        rows = (self._t.jobs[d] for d in self._t.dependents.get(job_id, ()))
        return sorted((r for r in rows if r.state == "blocked"), key=lambda r: r.job_id)

    def dependency_states(self, job_id: str) -> list[str]:
        return [self._t.jobs[d].state for d in self._t.depends_on.get(job_id, ())]

    def dependencies(self, job_id: str) -> tuple[str, ...]:
        return self._t.depends_on.get(job_id, ())

    def begin_attempt(
        self, *, attempt_id: str, job_id: str, number: int, fence: int, owner: str, started_at: datetime
    ) -> None:
        if attempt_id in self._t.attempts:
            raise _refused("pk_worker_job_attempts")
        if any(a.job_id == job_id and a.number == number for a in self._t.attempts.values()):
            raise _refused("uq_worker_job_attempts_job_id_number")
        self._t.attempts[attempt_id] = AttemptRow(attempt_id, job_id, number, fence, owner, started_at)

    def end_attempt(
        self, attempt_id: str, *, ended_at: datetime, outcome: str, diagnostic: str | None
    ) -> None:
        attempt = self._t.attempts.get(attempt_id)
        if attempt is not None and attempt.ended_at is None:
            self._t.attempts[attempt_id] = replace(
                attempt, ended_at=ended_at, outcome=outcome, diagnostic=diagnostic
            )

    def attempt(self, attempt_id: str) -> AttemptRow | None:
        return self._t.attempts.get(attempt_id)

    def insert_checkpoint(
        self, *, job_id: str, step: int, attempt_id: str, fence: int, state: bytes, recorded_at: datetime
    ) -> None:
        held = self._t.checkpoints.get(job_id, ())
        if any(c.step == step for c in held):
            raise _refused("pk_worker_job_checkpoints")
        stored = _Stored(step, attempt_id, fence, bytes(state), recorded_at)
        self._t.checkpoints[job_id] = tuple(sorted((*held, stored), key=lambda c: c.step))

    def checkpoint_state(self, job_id: str, step: int) -> bytes | None:
        return next((c.state for c in self._t.checkpoints.get(job_id, ()) if c.step == step), None)

    def append_event(self, event: JobEvent) -> None:
        if event.job_id not in self._t.jobs:
            raise _refused("fk_worker_job_events_job_id_worker_jobs")
        self._t.last_event += 1
        stored = replace(event, position=self._t.last_event)
        self._t.events[event.job_id] = (*self._t.events.get(event.job_id, ()), stored)


def _snapshot_job(row: JobRow, t: _Tables, attempt: AttemptRow | None) -> SnapshotJob:
    return SnapshotJob(
        job_id=row.job_id,
        scope=row.scope,
        position=row.position,
        kind=row.kind,
        state=row.state,
        reason=row.reason,
        max_attempts=row.max_attempts,
        attempts=row.attempts,
        fence=row.fence,
        owner=row.owner,
        attempt_id=row.attempt_id,
        paused=row.paused,
        cancel_requested=row.cancel_requested,
        stop_requested=row.stop_requested,
        checkpoint_step=row.checkpoint_step,
        result_recorded=row.publish_result is not None,
        diagnostic=row.diagnostic,
        created_at=row.created_at,
        updated_at=row.updated_at,
        not_before=row.not_before,
        depends_on=t.depends_on.get(row.job_id, ()),
        checkpoints=tuple(
            CheckpointDigest.of(row.job_id, c.step, c.attempt_id, c.fence, c.state, c.recorded_at)
            for c in t.checkpoints.get(row.job_id, ())
        ),
        last_attempt=attempt,
    )


class MemoryJobStore:
    """A complete in-memory job store: one lock, copy-on-begin transactions.

    Meant for tests and for engines that keep jobs in memory; nothing survives
    the process.
    """

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._tables = _Tables({}, {}, {}, {}, {}, {}, {})

    @contextmanager
    def _transaction(self) -> Iterator[JobTransaction]:
        with self._lock:
            working = self._tables.copy()
            yield _MemoryTransaction(working)
            # Reached only without an exception: the transaction commits.
            self._tables = working

    def transaction(self) -> AbstractContextManager[JobTransaction]:
        """A write transaction (see :meth:`JobStore.transaction <admission.jobs.JobStore.transaction>`)."""
        return self._transaction()

    def view(self, job_id: str) -> JobView | None:
        """The job as it is now, or ``None``."""
        with self._lock:
            row = self._tables.jobs.get(job_id)
            return None if row is None else row.view(self._tables.depends_on.get(job_id, ()))

    def events(self, job_id: str) -> list[JobEvent]:
        """Every event of the job, oldest first."""
        with self._lock:
            return list(self._tables.events.get(job_id, ()))

    def checkpoints(self, job_id: str) -> list[Checkpoint]:
        """The job's checkpoints, by step."""
        with self._lock:
            held = self._tables.checkpoints.get(job_id, ())
        return [
            Checkpoint(job_id, c.step, c.attempt_id, c.fence, canonical_decode(c.state), c.recorded_at)
            for c in held
        ]

    def counts(self, scope: str | None = None) -> dict[str, int]:
        """How many jobs are in each state (of one scope, or of all)."""
        found: dict[str, int] = {}
        with self._lock:
            for row in self._tables.jobs.values():
                if scope is None or row.scope == scope:
                    found[row.state] = found.get(row.state, 0) + 1
        return found

    def snapshot(self, scope: str | None) -> JobsSnapshot:
        """Every job of ``scope`` (or of all), read under the one lock: one instant."""
        with self._lock:
            t = self._tables
            rows = [r for r in t.jobs.values() if scope is None or r.scope == scope]
            latest: dict[str, AttemptRow] = {}
            for attempt in t.attempts.values():
                held = latest.get(attempt.job_id)
                if held is None or attempt.number > held.number:
                    latest[attempt.job_id] = attempt
            jobs = [_snapshot_job(r, t, latest.get(r.job_id)) for r in rows]
            counts = self.counts(scope)
        return JobsSnapshot(scope, tuple(sorted(jobs, key=snapshot_order)), counts)

    def claim_candidates(self, scope: str, limit: int, *, now: datetime) -> list[str]:
        """Unpaused claimable jobs of ``scope`` not in backoff at ``now``: waiting ones first,
        each group in queue order."""
        with self._lock:
            rows = [
                r
                for r in self._tables.jobs.values()
                if r.scope == scope
                and r.state in _CLAIMABLE
                and not r.paused
                and (r.not_before is None or r.not_before <= now)
            ]
        rows.sort(key=lambda r: (r.state == "running", r.position))
        return [r.job_id for r in rows[:limit]]

    def default_lock_dir(self) -> str | None:
        """No lock files: the store lives in one process."""
        return None

    def dispose(self) -> None:
        """Nothing to release."""
