"""The storage port of durable jobs, and the job row that crosses it (worker contract §3, §4).

:class:`~admission.jobs._service.JobService` speaks only to :class:`JobStore`.
Every change it makes happens inside one :meth:`JobStore.transaction`, which
commits or rolls back as a whole; the transaction offers the primitive
operations the rules need (:class:`JobTransaction`), and the store offers the
unlocked reads an operator or a claim loop makes.  Values crossing the port are
frozen: :class:`JobRow` for a whole job row, and the public
:class:`~admission.jobs._values.JobView`, :class:`~admission.jobs._values.JobEvent`
and :class:`~admission.jobs._values.Checkpoint`.

Two implementations: :class:`~admission.jobs._memory.MemoryJobStore` (real,
in memory) and ``admission.sql.SqlJobStore`` (SQLite and PostgreSQL).  One
contract suite runs the rules against each (``tests/contract/test_job_store.py``).

What an implementation must guarantee:

* **Exclusion.**  A transaction that locked a scope (:meth:`JobTransaction.lock_scope`)
  or a job (:meth:`~JobTransaction.lock_job`, :meth:`~JobTransaction.blocked_dependents`,
  or a successful :meth:`~JobTransaction.fenced_update`) holds it until it
  ends: no other transaction changes it meanwhile (PostgreSQL: row locks;
  SQLite: ``BEGIN IMMEDIATE``; memory: one lock).
* **The fence is the store's to judge** (contract §3):
  :meth:`~JobTransaction.fenced_update` is one conditional write that matches
  the job only while it is ``running`` under the caller's fence, so a reclaim
  cannot interleave between a check and a write.
* **Atomicity.**  An exception inside the transaction leaves nothing of it.
* **One instant.**  :meth:`JobStore.snapshot` reads every table it shows in
  one read transaction (PostgreSQL: ``REPEATABLE READ``, read-only; SQLite: one
  deferred transaction, whose WAL snapshot spans all its reads; memory: under
  the one lock), so what it returns held together at one moment (contract §6).

Pure: no SQLAlchemy, no clock (times are passed in).
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime
from typing import ClassVar, Protocol

from admission.jobs._values import Checkpoint, JobEvent, JobView

__all__ = [
    "AttemptRow",
    "CheckpointDigest",
    "JobRow",
    "JobStore",
    "JobTransaction",
    "JobsSnapshot",
    "SnapshotJob",
]


@dataclass(frozen=True)
class JobRow:
    """One job as stored: what ``worker_jobs`` holds for it.

    ``payload`` and ``content`` are canonical bytes (the payload alone; and
    everything the caller gave, for duplicate-or-conflict).  ``fence`` only
    grows (contract §3); ``beat`` grows with every fenced write, so that an
    observer can tell a silent owner from a live one.  ``publish_result`` is
    the recorded result (the publish intent) of attempt ``publish_attempt_id``.
    """

    job_id: str
    scope: str
    position: int
    kind: str
    payload: bytes
    content: bytes
    state: str
    reason: str
    max_attempts: int
    attempts: int
    fence: int
    beat: int
    owner: str | None
    attempt_id: str | None
    paused: bool
    cancel_requested: bool
    stop_requested: bool
    checkpoint_step: int
    publish_attempt_id: str | None
    publish_result: bytes | None
    diagnostic: str | None
    created_at: datetime
    updated_at: datetime
    not_before: datetime | None = None
    """Set while the job waits out a retry's backoff (``retry_wait``): no claim before this time."""

    FIXED: ClassVar[frozenset[str]] = frozenset(
        {"job_id", "scope", "position", "kind", "payload", "content", "max_attempts", "created_at"}
    )
    """The fields set once, at enqueue: :meth:`JobTransaction.save_job` writes every other one."""

    def view(self, depends_on: Sequence[str]) -> JobView:
        """The job as an operator sees it, with the ids it depends on."""
        return JobView(
            job_id=self.job_id,
            scope=self.scope,
            kind=self.kind,
            state=self.state,
            reason=self.reason,
            attempts=self.attempts,
            max_attempts=self.max_attempts,
            fence=self.fence,
            paused=self.paused,
            cancel_requested=self.cancel_requested,
            stop_requested=self.stop_requested,
            checkpoint_step=self.checkpoint_step,
            diagnostic=self.diagnostic,
            depends_on=tuple(sorted(depends_on)),
            not_before=self.not_before,
        )


@dataclass(frozen=True)
class AttemptRow:
    """One attempt as stored: what ``worker_job_attempts`` holds for it.

    ``number`` counts the job's attempts from 1; ``outcome`` and ``diagnostic``
    are set when the attempt ended (``ended_at``), by its owner or by the
    claim that took the job after its lease expired (``lease_expired``).
    """

    attempt_id: str
    job_id: str
    number: int
    fence: int
    owner: str
    started_at: datetime
    ended_at: datetime | None = None
    outcome: str | None = None
    diagnostic: str | None = None


@dataclass(frozen=True)
class CheckpointDigest:
    """A stored checkpoint as a snapshot shows it: its size and digest, not its state.

    ``size`` is the length of the canonical bytes of the state, ``sha256`` their
    SHA-256 in hex: a reader can tell two checkpoints apart, or check a copy of one,
    without the state itself (up to 64 KiB, and not always JSON-representable).
    """

    job_id: str
    step: int
    attempt_id: str
    fence: int
    recorded_at: datetime
    size: int
    sha256: str

    @classmethod
    def of(
        cls, job_id: str, step: int, attempt_id: str, fence: int, state: bytes, recorded_at: datetime
    ) -> CheckpointDigest:
        """The digest of a checkpoint whose canonical state is ``state``."""
        digest = hashlib.sha256(state).hexdigest()
        return cls(job_id, step, attempt_id, fence, recorded_at, len(state), digest)


@dataclass(frozen=True)
class SnapshotJob:
    """A job as a snapshot shows it: its row without the payload, the content and the recorded
    result (``result_recorded`` says whether there is one), with its dependencies, the digests
    of its checkpoints (by step) and its latest attempt (``None`` before the first claim)."""

    job_id: str
    scope: str
    position: int
    kind: str
    state: str
    reason: str
    max_attempts: int
    attempts: int
    fence: int
    owner: str | None
    attempt_id: str | None
    paused: bool
    cancel_requested: bool
    stop_requested: bool
    checkpoint_step: int
    result_recorded: bool
    diagnostic: str | None
    created_at: datetime
    updated_at: datetime
    not_before: datetime | None
    depends_on: tuple[str, ...]
    checkpoints: tuple[CheckpointDigest, ...]
    last_attempt: AttemptRow | None


@dataclass(frozen=True)
class JobsSnapshot:
    """Every job of ``scope`` (of every scope when ``None``), read at one instant.

    ``jobs`` are in scope order (by code point), then queue position.  ``counts``
    is the number of jobs in each state, read by its own query in the same read
    transaction: it equals the tally of ``jobs`` by state exactly when the reads
    saw one state of the store, which is what the tests check.
    """

    scope: str | None
    jobs: tuple[SnapshotJob, ...]
    counts: Mapping[str, int]


def snapshot_order(job: SnapshotJob) -> tuple[str, int]:
    """The order of a snapshot's jobs: scope (code points, the same on every backend), then position."""
    return (job.scope, job.position)


class JobTransaction(Protocol):
    """One write transaction on the job store: everything in it commits together, or nothing does."""

    def lock_scope(
        self, scope: str, *, created_at: datetime | None = None, skip_locked: bool = False
    ) -> bool:
        """Hold the scope until the end of the transaction: enqueues into it and claims in it wait.

        With ``created_at`` (an enqueue), a new scope is created first; without
        it (a claim), a scope that does not exist is not created and the answer
        is ``False``.  The queue bound is counted under this lock, so two
        enqueues cannot both pass it; a claim takes it before the job's own
        lock (the order enqueues take them in), so claims of one scope see
        each other's running job.  ``skip_locked``: never wait for another
        transaction that holds the scope; answer ``False`` instead
        (PostgreSQL: ``FOR UPDATE SKIP LOCKED``).  ``True``: the scope is held.
        """
        ...

    def lock_job(self, job_id: str, *, skip_locked: bool = False) -> JobRow | None:
        """The job, held until the end of the transaction; ``None`` if there is no such job.

        ``skip_locked``: never wait for another transaction that holds the job; answer
        ``None`` instead (PostgreSQL: ``FOR UPDATE SKIP LOCKED``).  ``claim_next`` uses
        it, so that it never waits on a job an owner or an operator is writing.
        """
        ...

    def find_jobs(self, job_ids: Collection[str]) -> list[JobRow]:
        """Those of ``job_ids`` that exist, unlocked (their content never changes)."""
        ...

    def share_states(self, job_ids: Collection[str]) -> dict[str, str]:
        """The states of those of ``job_ids`` that exist, read under a shared lock, in id order.

        A dependency that finishes meanwhile waits for this transaction, and
        then sees the dependents enqueued here (it must unblock or fail them).
        """
        ...

    def running_in_scope(self, scope: str) -> list[str]:
        """The ids of ``scope``'s ``running`` jobs, in queue order (at most one, once every claim
        keeps the rule of one running job per scope; read through the ``(scope, state)`` index)."""
        ...

    def count_unfinished(self, scope: str) -> int:
        """How many jobs of ``scope`` are not final (``UNFINISHED_JOB_STATES``)."""
        ...

    def next_position(self, scope: str) -> int:
        """The next queue position of a locked scope (claims go in this order)."""
        ...

    def insert_job(self, row: JobRow, depends_on: Sequence[str]) -> None:
        """Insert a new job with the jobs it depends on (which must exist)."""
        ...

    def save_job(self, row: JobRow) -> None:
        """Write a job this transaction holds (locked, fenced or inserted) as ``row`` says;
        the fields set at enqueue (:attr:`JobRow.FIXED`) keep their stored values."""
        ...

    def fenced_update(self, job_id: str, fence: int, *, updated_at: datetime) -> JobRow | None:
        """The owner's write (contract §3): if the job is ``running`` under ``fence``, bump its
        ``beat``, set ``updated_at`` and hold it; returns the updated row, else ``None``.

        One conditional write, so the store, not the owner's belief, decides.
        """
        ...

    def blocked_dependents(self, job_id: str) -> list[JobRow]:
        """The ``blocked`` jobs that depend on ``job_id``, held, in id order."""
        ...

    def dependency_states(self, job_id: str) -> list[str]:
        """The states of the jobs ``job_id`` depends on."""
        ...

    def dependencies(self, job_id: str) -> tuple[str, ...]:
        """The ids of the jobs ``job_id`` depends on, sorted."""
        ...

    def begin_attempt(
        self, *, attempt_id: str, job_id: str, number: int, fence: int, owner: str, started_at: datetime
    ) -> None:
        """Record the start of an attempt (a claim or a reclaim) under its fence."""
        ...

    def end_attempt(
        self, attempt_id: str, *, ended_at: datetime, outcome: str, diagnostic: str | None
    ) -> None:
        """Record how an attempt ended; an attempt that already ended keeps its first ending."""
        ...

    def attempt(self, attempt_id: str) -> AttemptRow | None:
        """The attempt as stored, or ``None`` if there is none with that id."""
        ...

    def insert_checkpoint(
        self, *, job_id: str, step: int, attempt_id: str, fence: int, state: bytes, recorded_at: datetime
    ) -> None:
        """Store the canonical ``state`` after ``step``; a checkpoint is never rewritten."""
        ...

    def checkpoint_state(self, job_id: str, step: int) -> bytes | None:
        """The canonical state stored after ``step``, if any."""
        ...

    def append_event(self, event: JobEvent) -> None:
        """Append an event to the job's log (the store gives it its position)."""
        ...


class JobStore(Protocol):
    """The storage port of durable jobs."""

    def transaction(self) -> AbstractContextManager[JobTransaction]:
        """A write transaction: commits when the block ends, rolls back on an exception."""
        ...

    def view(self, job_id: str) -> JobView | None:
        """The job as it is now, or ``None``."""
        ...

    def events(self, job_id: str) -> list[JobEvent]:
        """Every event of the job, oldest first."""
        ...

    def checkpoints(self, job_id: str) -> list[Checkpoint]:
        """The job's checkpoints, by step."""
        ...

    def counts(self, scope: str | None = None) -> dict[str, int]:
        """How many jobs are in each state (of one scope, or of all); states without jobs are absent."""
        ...

    def snapshot(self, scope: str | None) -> JobsSnapshot:
        """Every job of ``scope`` (of all scopes when ``None``) with its dependencies, checkpoint
        digests and latest attempt, and the counts by state, all read in ONE read transaction
        (see "One instant" above); writes nothing and takes no lock a writer waits for."""
        ...

    def claim_candidates(self, scope: str, limit: int, *, now: datetime) -> list[str]:
        """Up to ``limit`` ids of ``scope``'s unpaused ``queued``, ``retry_wait`` and ``running`` jobs
        whose ``not_before`` is unset or not after ``now``: the waiting ones first, each group in
        queue order (a scan full of live leases must not hide a waiting job)."""
        ...

    def default_lock_dir(self) -> str | None:
        """Where runners on this machine keep the lock files of the scopes they run, by default
        (``JobRunner``); ``None`` when the store suggests none (runners may be on several machines,
        or the store lives in one process)."""
        ...

    def dispose(self) -> None:
        """Release what the store holds (connections); the store is not used afterwards."""
        ...
