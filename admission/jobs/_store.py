"""Durable jobs on SQLite or PostgreSQL: fenced claims, checkpoints, recovery (worker contract §4).

The lifecycle is the table in ``admission.jobs._states``; this module applies it
to rows.  Every state change and every request (pause, stop, cancel, a
recorded result) writes a ``worker_job_events`` row in the transaction that
makes it.

**Fencing** (contract §3).  A claim sets ``fence = fence + 1`` on the job row
and hands the new value to the owner in its :class:`JobLease`.  Every write of
the owner (``heartbeat``, ``checkpoint``, ``record_result``, ``complete``,
``fail``, ``recover``, ``cancel_running``) starts with one conditional
``UPDATE worker_jobs ... WHERE job_id = :id AND fence = :fence AND state =
'running'`` inside a write transaction: the UPDATE takes the row lock
(PostgreSQL) or runs under ``BEGIN IMMEDIATE`` (SQLite), so a reclaim cannot
interleave, and zero rows updated raises :class:`~admission.errors.JobFencedError`.
The database, not the owner, decides.

**Expiry** is judged on a monotonic clock, never on a stored time.  Every
fenced write also bumps ``beat``.  A store that finds a job ``running`` notes
the pair ``(fence, beat)`` and the time on *its own* monotonic clock; it
reclaims the job only when a later claim finds the very same pair after at
least ``lease_seconds`` on that clock (the owner neither renewed nor
finished).  The owner, for its part, treats its lease as valid until
``lease_seconds`` after the monotonic time it read *before* the write that
last renewed it; since any observer starts watching a pair only after that
write committed, the owner's deadline comes first (``docs/jobs.md``).
Observations live in the store object: a process that restarts watches
afresh, so a crashed owner's job is reclaimed ``lease_seconds`` after the new
process first looks at it.

**Checkpoints**: at each step boundary the owner writes the step number and
the canonical encoding of its state, immutable, under its fence; a claim
hands the latest one to the next attempt, which resumes at the next step.

**Publication**: the owner first records the result under its fence
(``record_result``: the publish intent, with its attempt id), then publishes
it through a :class:`Publisher`, then acknowledges (``complete``).  A
reclaimed job with a publish intent is never executed again: the next owner
reads the target back and :func:`~admission.jobs._states.judge_publication`
decides (``recover``).
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final, Literal

from sqlalchemy import Engine, case, func, insert, select, update
from sqlalchemy.engine import Connection, RowMapping

from admission.errors import (
    AdmissionError,
    InvalidJobError,
    JobFencedError,
    JobQueueFullError,
    JobStateError,
    UnknownJobError,
)
from admission.intent._encoding import Value, canonical_decode, canonical_encode
from admission.jobs._states import (
    FINAL_JOB_STATES,
    JOB_TRANSITIONS,
    UNFINISHED_JOB_STATES,
    WAITING_JOB_STATES,
    JobState,
    PublicationVerdict,
    PublishedResult,
    find_cycle,
    initial_state,
    judge_publication,
)
from admission.jobs._values import (
    DEFAULT_LEASE_SECONDS,
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_MAX_WAITING,
    MAX_DIAGNOSTIC_BYTES,
    MAX_ID_LENGTH,
    MAX_PAYLOAD_BYTES,
    Checkpoint,
    ClaimResult,
    Control,
    EnqueueResult,
    Job,
    JobEvent,
    JobLease,
    JobView,
    Publisher,
    bounded_diagnostic,
    check_diagnostic,
    check_text,
    validate_job,
)
from admission.sql._engine import as_utc, create_admission_engine, insert_or_ignore, wrap_exceptions
from admission.sql._schema import (
    check_revision,
    worker_job_attempts,
    worker_job_checkpoints,
    worker_job_dependencies,
    worker_job_events,
    worker_job_scopes,
    worker_jobs,
)

__all__ = [
    "DEFAULT_LEASE_SECONDS",
    "DEFAULT_MAX_ATTEMPTS",
    "DEFAULT_MAX_WAITING",
    "MAX_DIAGNOSTIC_BYTES",
    "Checkpoint",
    "ClaimResult",
    "Control",
    "EnqueueResult",
    "Job",
    "JobEvent",
    "JobLease",
    "JobStore",
    "JobView",
    "Publisher",
    "bounded_diagnostic",
    "validate_job",
]

_WRITE: Final = "admission_write"
_CLAIM_SCAN: Final = 64


def _default_owner() -> str:
    return f"{socket.gethostname()[:64]}:{os.getpid()}:{uuid.uuid4().hex[:12]}"


# -- the store -------------------------------------------------------------------------------------------


@dataclass
class _Seen:
    pair: tuple[int, int]
    since: float


@dataclass
class _Tx:
    """One write transaction: the connection and the wall-clock time of its events."""

    conn: Connection
    now: datetime


class _Abort(Exception):
    """Rolls a batch back (a conflict in it) and carries the answers out of the transaction."""

    def __init__(self, answers: list[EnqueueResult]) -> None:
        super().__init__("batch aborted")
        self.answers = answers


class JobStore:
    """Durable jobs on an admission database (SQLite or PostgreSQL).

    ``clock`` is the monotonic clock liveness is judged on, ``now`` the
    wall-clock time written on rows (for people, never for liveness),
    ``new_id`` makes attempt ids.  All three are parameters so that tests can
    drive them.
    """

    def __init__(
        self,
        engine: Engine,
        *,
        clock: Callable[[], float] = time.monotonic,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
        new_id: Callable[[], str] = lambda: str(uuid.uuid4()),
        lease_seconds: float = DEFAULT_LEASE_SECONDS,
        max_waiting: int = DEFAULT_MAX_WAITING,
        owner: str | None = None,
        check: bool = True,
    ) -> None:
        if not lease_seconds > 0:
            raise InvalidJobError(f"must be positive, got {lease_seconds!r}", field="lease_seconds")
        if isinstance(max_waiting, bool) or not isinstance(max_waiting, int) or max_waiting < 1:
            raise InvalidJobError(f"must be a positive int, got {max_waiting!r}", field="max_waiting")
        self.engine = engine
        self.clock = clock
        self.now = now
        self.new_id = new_id
        self.lease_seconds = float(lease_seconds)
        self.max_waiting = max_waiting
        self.owner = owner or _default_owner()
        self._seen: dict[str, _Seen] = {}
        if check:
            with self._translate(), engine.connect() as conn, conn.begin():
                check_revision(conn)

    @classmethod
    def open(cls, url: str, **options: Any) -> JobStore:
        """Open a job store on the database at ``url`` (created with ``create_admission_engine``)."""
        return cls(create_admission_engine(url), **options)

    def dispose(self) -> None:
        """Close the engine's pooled connections."""
        self.engine.dispose()

    # -- transactions and the driver boundary --

    def _translate(self) -> AbstractContextManager[None]:
        return wrap_exceptions(self.engine.dialect)

    @contextmanager
    def _write(self) -> Iterator[_Tx]:
        with self._translate(), self.engine.connect() as conn:
            conn.execution_options(**{_WRITE: True})
            with conn.begin():
                yield _Tx(conn, self.now())

    @contextmanager
    def _read(self) -> Iterator[Connection]:
        with self._translate(), self.engine.connect() as conn, conn.begin():
            yield conn

    def _locked_job(self, tx: _Tx, job_id: str) -> RowMapping:
        # FOR UPDATE on PostgreSQL; SQLite renders nothing, its write transaction already excludes.
        query = select(worker_jobs).where(worker_jobs.c.job_id == job_id).with_for_update()
        row = tx.conn.execute(query).mappings().first()
        if row is None:
            raise UnknownJobError(f"no job {job_id!r}", job_id=job_id)
        return row

    def _event(
        self,
        tx: _Tx,
        job_id: str,
        event: str,
        from_state: str | None,
        to_state: str,
        reason: str,
        *,
        fence: int | None = None,
        attempt_id: str | None = None,
        detail: str | None = None,
    ) -> None:
        tx.conn.execute(
            insert(worker_job_events).values(
                job_id=job_id,
                event=event,
                from_state=from_state,
                to_state=to_state,
                reason=reason,
                fence=fence,
                attempt_id=attempt_id,
                detail=detail,
                recorded_at=tx.now,
            )
        )

    def _transition(
        self,
        tx: _Tx,
        row: Mapping[Any, Any],
        event: str,
        reason: str,
        *,
        values: Mapping[Any, Any] | None = None,
        detail: str | None = None,
    ) -> JobState:
        """Apply one table transition to a locked row, with its event row, in ``tx``."""
        state = JOB_TRANSITIONS.next_state(row["state"], event, subject=row["job_id"])
        changes = {"state": state, "reason": reason, "updated_at": tx.now, **(values or {})}
        if state != "running":
            changes.setdefault("owner", None)
        tx.conn.execute(update(worker_jobs).where(worker_jobs.c.job_id == row["job_id"]).values(**changes))
        self._event(
            tx,
            row["job_id"],
            event,
            row["state"],
            state,
            reason,
            fence=changes.get("fence", row["fence"]),
            attempt_id=changes.get("attempt_id", row["attempt_id"]),
            detail=detail,
        )
        if state == "completed":
            self._unblock_dependents(tx, row["job_id"])
        elif state in ("failed", "cancelled"):
            self._fail_dependents(tx, row["job_id"])
        return state

    def _dependents(self, tx: _Tx, job_id: str) -> list[RowMapping]:
        query = (
            select(worker_jobs)
            .join(worker_job_dependencies, worker_job_dependencies.c.job_id == worker_jobs.c.job_id)
            .where(worker_job_dependencies.c.depends_on == job_id, worker_jobs.c.state == "blocked")
            .order_by(worker_jobs.c.job_id)
            .with_for_update(of=worker_jobs)
        )
        return list(tx.conn.execute(query).mappings())

    def _dependency_states(self, conn: Connection, job_id: str) -> list[str]:
        query = (
            select(worker_jobs.c.state)
            .join(worker_job_dependencies, worker_job_dependencies.c.depends_on == worker_jobs.c.job_id)
            .where(worker_job_dependencies.c.job_id == job_id)
        )
        return list(conn.execute(query).scalars())

    def _unblock_dependents(self, tx: _Tx, job_id: str) -> None:
        for row in self._dependents(tx, job_id):
            if initial_state(self._dependency_states(tx.conn, row["job_id"])) == "queued":
                self._transition(tx, row, "unblock", "dependencies_completed", detail=job_id)

    def _fail_dependents(self, tx: _Tx, job_id: str) -> None:
        # Recursion through _transition: the dependents' own dependents fail too.
        for row in self._dependents(tx, job_id):
            self._transition(tx, row, "dependency_failed", "dependency_failed", detail=job_id)

    # -- enqueue --

    def enqueue(self, job: Job) -> EnqueueResult:
        """Enqueue one job (see :meth:`enqueue_all`)."""
        return self.enqueue_all([job])[0]

    def enqueue_all(self, jobs: Sequence[Job]) -> list[EnqueueResult]:
        """Enqueue jobs in one transaction; they may depend on each other and on existing jobs.

        Refused with :class:`InvalidJobError`, writing nothing: a malformed
        job, a dependency that exists neither in the database nor in the
        batch, a dependency cycle (a self-cycle included).  Refused with
        :class:`JobQueueFullError`: a scope that would hold more than its
        bound of unfinished jobs (``UNFINISHED_JOB_STATES``).  An id that exists is a ``duplicate`` (same
        canonical content) or a ``conflict`` (other content); a batch with a
        conflict writes nothing.
        """
        contents: dict[str, tuple[Job, bytes]] = {}
        for job in jobs:
            content = validate_job(job)
            if job.job_id in contents and contents[job.job_id][1] != content:
                raise InvalidJobError(
                    "appears twice in the batch with different content", field="job_id", job_id=job.job_id
                )
            contents[job.job_id] = (job, content)
        try:
            return self._enqueue_batch(jobs, contents)
        except _Abort as abort:
            return abort.answers

    def _enqueue_batch(
        self, jobs: Sequence[Job], contents: Mapping[str, tuple[Job, bytes]]
    ) -> list[EnqueueResult]:
        with self._write() as tx:
            for scope in sorted({job.scope for job, _ in contents.values()}):
                self._lock_scope(tx, scope)
            existing = {
                row["job_id"]: row
                for row in tx.conn.execute(
                    select(worker_jobs.c.job_id, worker_jobs.c.content, worker_jobs.c.state).where(
                        worker_jobs.c.job_id.in_(list(contents))
                    )
                ).mappings()
            }
            answers: dict[str, EnqueueResult] = {}
            for job_id, (_, content) in contents.items():
                if job_id in existing:
                    same = bytes(existing[job_id]["content"]) == content
                    answers[job_id] = EnqueueResult(
                        "duplicate" if same else "conflict", job_id, existing[job_id]["state"]
                    )
            if any(answer.outcome == "conflict" for answer in answers.values()):
                raise _Abort(
                    [answers.get(job.job_id, EnqueueResult("aborted", job.job_id, None)) for job in jobs]
                )
            fresh = {job_id: pair for job_id, pair in contents.items() if job_id not in existing}
            self._insert_fresh(tx, fresh)
            states = _pairs(
                tx.conn.execute(
                    select(worker_jobs.c.job_id, worker_jobs.c.state).where(
                        worker_jobs.c.job_id.in_(list(fresh))
                    )
                )
            )
        return [
            answers.get(job.job_id) or EnqueueResult("enqueued", job.job_id, states[job.job_id])
            for job in jobs
        ]

    def _lock_scope(self, tx: _Tx, scope: str) -> None:
        insert_or_ignore(
            tx.conn, worker_job_scopes, {"scope": scope, "last_position": 0, "created_at": tx.now}, ["scope"]
        )
        tx.conn.execute(
            select(worker_job_scopes.c.scope).where(worker_job_scopes.c.scope == scope).with_for_update()
        )

    def _insert_fresh(self, tx: _Tx, fresh: Mapping[str, tuple[Job, bytes]]) -> None:
        if not fresh:
            return
        wanted = {dep for job, _ in fresh.values() for dep in job.depends_on if dep not in fresh}
        # FOR SHARE (PostgreSQL; SQLite's write lock already serialises): a
        # dependency that finishes meanwhile waits for this commit, and then
        # sees the new dependent it must unblock or fail; one that finished
        # first is read as finished.  Sorted, so two enqueues lock in one order.
        known = _pairs(
            tx.conn.execute(
                select(worker_jobs.c.job_id, worker_jobs.c.state)
                .where(worker_jobs.c.job_id.in_(sorted(wanted)))
                .order_by(worker_jobs.c.job_id)
                .with_for_update(read=True)
            )
        ) if wanted else {}
        for job, _ in fresh.values():
            for dep in job.depends_on:
                if dep not in fresh and dep not in known:
                    raise InvalidJobError(
                        f"job {dep!r} does not exist (a dependency must exist before the claim)",
                        field="depends_on",
                        job_id=job.job_id,
                    )
        # Existing jobs' dependencies are fixed and point at existing jobs, so
        # a cycle can only run through the batch (contract §4: refused).
        cycle = find_cycle(
            {job_id: [d for d in job.depends_on if d in fresh] for job_id, (job, _) in fresh.items()}
        )
        if cycle is not None:
            raise InvalidJobError("cycle " + " -> ".join(cycle), field="depends_on", job_id=cycle[0])
        for scope in sorted({job.scope for job, _ in fresh.values()}):
            waiting = tx.conn.execute(
                select(func.count())
                .select_from(worker_jobs)
                .where(worker_jobs.c.scope == scope, worker_jobs.c.state.in_(sorted(UNFINISHED_JOB_STATES)))
            ).scalar_one()
            adding = sum(1 for job, _ in fresh.values() if job.scope == scope)
            if waiting + adding > self.max_waiting:
                raise JobQueueFullError(
                    f"scope {scope!r} holds {waiting} unfinished jobs; {adding} more would pass its bound "
                    f"of {self.max_waiting}",
                    scope=scope,
                    waiting=waiting,
                    limit=self.max_waiting,
                )
        states = dict(known)
        for job_id in _topological(fresh):
            job, content = fresh[job_id]
            position = tx.conn.execute(
                update(worker_job_scopes)
                .where(worker_job_scopes.c.scope == job.scope)
                .values(last_position=worker_job_scopes.c.last_position + 1)
                .returning(worker_job_scopes.c.last_position)
            ).scalar_one()
            dependency_states = [states[d] for d in job.depends_on]
            state = initial_state(dependency_states)
            tx.conn.execute(
                insert(worker_jobs).values(
                    job_id=job_id,
                    scope=job.scope,
                    position=position,
                    kind=job.kind,
                    payload=canonical_encode(job.payload, max_size=MAX_PAYLOAD_BYTES),
                    content=content,
                    state=state,
                    reason="enqueued",
                    max_attempts=job.max_attempts,
                    attempts=0,
                    fence=0,
                    beat=0,
                    owner=None,
                    attempt_id=None,
                    paused=False,
                    cancel_requested=False,
                    stop_requested=False,
                    checkpoint_step=0,
                    publish_attempt_id=None,
                    publish_result=None,
                    diagnostic=None,
                    created_at=tx.now,
                    updated_at=tx.now,
                )
            )
            if job.depends_on:
                tx.conn.execute(
                    insert(worker_job_dependencies),
                    [{"job_id": job_id, "depends_on": d} for d in job.depends_on],
                )
            self._event(tx, job_id, "enqueue", None, state, "enqueued")
            if any(s in ("failed", "cancelled") for s in dependency_states):
                row = self._locked_job(tx, job_id)
                state = self._transition(tx, row, "dependency_failed", "dependency_failed")
            states[job_id] = state

    # -- claims --

    def claim(self, job_id: str) -> ClaimResult:
        """Claim the job: start an attempt under a new fencing token, or say why not.

        A final job answers ``final`` (a duplicate delivery: nothing runs, nothing
        is written).  A running job is reclaimed only once its lease expired
        as this store judges it (module docstring); a reclaim of a job whose
        result was recorded returns a lease that recovers instead of executing.
        """
        started = self.clock()
        with self._write() as tx:
            row = self._locked_job(tx, job_id)
            state = row["state"]
            if state in FINAL_JOB_STATES:
                return ClaimResult("final", job_id, state, row["reason"])
            if state in ("blocked", "recovery_required"):
                return ClaimResult("not_claimable", job_id, state, state)
            if row["paused"]:
                return ClaimResult("not_claimable", job_id, state, "paused")
            if state == "running":
                if not self._expired(row, started):
                    return ClaimResult("not_claimable", job_id, state, "lease_live")
                self._end_attempt(tx, row["attempt_id"], "lease_expired", None)
                if row["publish_result"] is None:
                    ending = self._restart_refusal(row)
                    if ending is not None:
                        event, reason = ending
                        final = self._transition(tx, row, event, reason)
                        return ClaimResult("final", job_id, final, reason)
                event = "reclaim"
            else:
                # queued or retry_wait: a stop or cancel request would have ended it already.
                event = "claim"
            return self._start_attempt(tx, row, event, started)

    def _restart_refusal(self, row: Mapping[Any, Any]) -> tuple[str, str] | None:
        """Why an expired attempt must not be followed by a new execution, if it must not."""
        if row["cancel_requested"]:
            return "cancelled_after_reconciliation", "cancelled"
        if row["stop_requested"]:
            return "stopped_before_restart", "stopped"
        if row["attempts"] >= row["max_attempts"]:
            return "attempts_exhausted", "attempts_exhausted"
        return None

    def _expired(self, row: Mapping[Any, Any], started: float) -> bool:
        pair = (int(row["fence"]), int(row["beat"]))
        seen = self._seen.get(row["job_id"])
        if seen is None or seen.pair != pair:
            self._seen[row["job_id"]] = _Seen(pair, started)
            return False
        return started - seen.since >= self.lease_seconds

    def _start_attempt(self, tx: _Tx, row: Mapping[Any, Any], event: str, started: float) -> ClaimResult:
        job_id = row["job_id"]
        attempt_id = self.new_id()
        fence = int(row["fence"]) + 1
        number = int(row["attempts"]) + 1
        reason = "claimed" if event == "claim" else "lease_expired"
        recovering = row["publish_result"] is not None
        self._transition(
            tx,
            row,
            event,
            "recovering" if recovering else reason,
            values={
                "fence": fence,
                "beat": int(row["beat"]) + 1,
                "attempts": number,
                "attempt_id": attempt_id,
                "owner": self.owner,
            },
        )
        tx.conn.execute(
            insert(worker_job_attempts).values(
                attempt_id=attempt_id,
                job_id=job_id,
                number=number,
                fence=fence,
                owner=self.owner,
                started_at=tx.now,
                ended_at=None,
                outcome=None,
                diagnostic=None,
            )
        )
        self._seen.pop(job_id, None)
        step = int(row["checkpoint_step"])
        resume: Value = None
        if step:
            stored = tx.conn.execute(
                select(worker_job_checkpoints.c.state).where(
                    worker_job_checkpoints.c.job_id == job_id, worker_job_checkpoints.c.step == step
                )
            ).scalar_one()
            resume = canonical_decode(bytes(stored))
        lease = JobLease(
            job_id=job_id,
            fence=fence,
            attempt_id=attempt_id,
            attempt_number=number,
            owner=self.owner,
            kind=row["kind"],
            payload=canonical_decode(bytes(row["payload"])),
            resume_step=step,
            resume_state=resume,
            publish_attempt_id=row["publish_attempt_id"],
            publish_result=None if row["publish_result"] is None else bytes(row["publish_result"]),
            deadline=started + self.lease_seconds,
        )
        return ClaimResult("claimed", job_id, "running", reason, lease)

    def claim_next(self, scope: str) -> ClaimResult | None:
        """Claim the oldest claimable job of ``scope`` (queued, retrying, or expired), or ``None``."""
        with self._read() as conn:
            candidates = list(
                conn.execute(
                    select(worker_jobs.c.job_id)
                    .where(
                        worker_jobs.c.scope == scope,
                        worker_jobs.c.state.in_(["queued", "retry_wait", "running"]),
                        worker_jobs.c.paused.is_(False),
                    )
                    # Waiting jobs first: running ones are claimable only once their
                    # lease lapsed, and a scan full of live ones must not hide the rest.
                    .order_by(case((worker_jobs.c.state == "running", 1), else_=0), worker_jobs.c.position)
                    .limit(_CLAIM_SCAN)
                ).scalars()
            )
        for job_id in candidates:
            answer = self.claim(job_id)
            if answer.outcome == "claimed":
                return answer
        return None

    def _end_attempt(self, tx: _Tx, attempt_id: str | None, outcome: str, diagnostic: str | None) -> None:
        if attempt_id is None:
            return
        tx.conn.execute(
            update(worker_job_attempts)
            .where(worker_job_attempts.c.attempt_id == attempt_id, worker_job_attempts.c.ended_at.is_(None))
            .values(ended_at=tx.now, outcome=outcome, diagnostic=diagnostic)
        )

    # -- fenced writes of the owner --

    def _fenced(self, tx: _Tx, lease: JobLease, **values: Any) -> RowMapping:
        """The conditional UPDATE every owner write starts with; zero rows -> JobFencedError."""
        result = tx.conn.execute(
            update(worker_jobs)
            .where(
                worker_jobs.c.job_id == lease.job_id,
                worker_jobs.c.fence == lease.fence,
                worker_jobs.c.state == "running",
            )
            .values(beat=worker_jobs.c.beat + 1, updated_at=tx.now, **values)
            # The row as updated, in the same statement: no second read.
            .returning(*worker_jobs.c)
        )
        row = result.mappings().first()
        if row is None:
            current = tx.conn.execute(
                select(worker_jobs.c.fence, worker_jobs.c.state).where(worker_jobs.c.job_id == lease.job_id)
            ).first()
            raise JobFencedError(
                f"job {lease.job_id!r}: the write of fence {lease.fence} was refused "
                + (
                    "(no such job)"
                    if current is None
                    else f"(the job is {current.state} under fence {current.fence})"
                ),
                job_id=lease.job_id,
                fence=lease.fence,
                current_fence=None if current is None else int(current.fence),
                state=None if current is None else str(current.state),
            )
        return row

    def _control(self, row: Mapping[Any, Any], started: float) -> Control:
        return Control(
            started + self.lease_seconds, bool(row["cancel_requested"]), bool(row["stop_requested"])
        )

    def heartbeat(self, lease: JobLease) -> Control:
        """Renew the lease (a fenced write); the answer carries the new deadline and pending requests."""
        started = self.clock()
        with self._write() as tx:
            return self._control(self._fenced(tx, lease), started)

    def checkpoint(self, lease: JobLease, step: int, state: Value) -> Control:
        """Persist the state after ``step`` (the next step after the last one), immutable, under the fence.

        Also renews the lease.  The step must be exactly one past the last
        checkpoint: a checkpoint is never rewritten.
        """
        if isinstance(step, bool) or not isinstance(step, int) or step < 1:
            raise InvalidJobError(f"must be a positive int, got {step!r}", field="step", job_id=lease.job_id)
        try:
            encoded = canonical_encode(state, max_size=MAX_PAYLOAD_BYTES)
        except AdmissionError as exc:
            raise InvalidJobError(str(exc), field="state", job_id=lease.job_id) from exc
        started = self.clock()
        with self._write() as tx:
            row = self._fenced(tx, lease)
            if step != int(row["checkpoint_step"]) + 1:
                raise InvalidJobError(
                    f"step {step} does not follow the last checkpoint, step {row['checkpoint_step']}",
                    field="step",
                    job_id=lease.job_id,
                )
            tx.conn.execute(
                insert(worker_job_checkpoints).values(
                    job_id=lease.job_id,
                    step=step,
                    attempt_id=lease.attempt_id,
                    fence=lease.fence,
                    state=encoded,
                    recorded_at=tx.now,
                )
            )
            tx.conn.execute(
                update(worker_jobs).where(worker_jobs.c.job_id == lease.job_id).values(checkpoint_step=step)
            )
            return self._control(row, started)

    def record_result(self, lease: JobLease, result: Value) -> bytes:
        """Record the result before it is published (the publish intent); returns its canonical bytes."""
        try:
            encoded = canonical_encode(result, max_size=MAX_PAYLOAD_BYTES)
        except AdmissionError as exc:
            raise InvalidJobError(str(exc), field="result", job_id=lease.job_id) from exc
        with self._write() as tx:
            row = self._fenced(tx, lease)
            if row["publish_result"] is not None:
                raise JobStateError(
                    f"job {lease.job_id!r} already recorded its result",
                    job_id=lease.job_id,
                    state="running",
                    event="record_result",
                )
            tx.conn.execute(
                update(worker_jobs)
                .where(worker_jobs.c.job_id == lease.job_id)
                .values(publish_attempt_id=lease.attempt_id, publish_result=encoded)
            )
            self._event(
                tx,
                lease.job_id,
                "result_recorded",
                "running",
                "running",
                "result_recorded",
                fence=lease.fence,
                attempt_id=lease.attempt_id,
            )
        return encoded

    def complete(self, lease: JobLease, *, reason: str = "completed") -> JobView:
        """Acknowledge the publication: the job is ``completed``.  Needs a recorded result."""
        with self._write() as tx:
            row = self._fenced(tx, lease)
            if row["publish_result"] is None:
                raise JobStateError(
                    f"job {lease.job_id!r} has no recorded result to acknowledge",
                    job_id=lease.job_id,
                    state="running",
                    event="complete",
                )
            self._end_attempt(tx, lease.attempt_id, "completed", None)
            self._transition(tx, row, "complete", reason)
            view = self._view(tx.conn, lease.job_id)
        return view

    def fail(self, lease: JobLease, diagnostic: str | None, *, retryable: bool) -> JobView:
        """End the attempt as failed.

        Retryable: ``retry_wait`` while attempts remain, else ``failed``
        (``attempts_exhausted``); ``cancelled`` instead when a stop or cancel
        was requested meanwhile.  Not retryable: ``failed``.  A diagnostic
        over 2 KiB is refused (nothing is written); see :func:`bounded_diagnostic`.
        """
        check_diagnostic(diagnostic, lease.job_id)
        with self._write() as tx:
            row = self._fenced(tx, lease, diagnostic=diagnostic)
            if row["publish_result"] is not None:
                # After the result was recorded, only the publication decides (recover).
                raise JobStateError(
                    f"job {lease.job_id!r} recorded its result; it cannot fail now",
                    job_id=lease.job_id,
                    state="running",
                    event="fail",
                )
            if not retryable:
                event, reason = "fatal_failure", "failed"
            else:
                event, reason = self._restart_refusal(row) or ("retryable_failure", "retryable_failure")
            self._end_attempt(tx, lease.attempt_id, reason, diagnostic)
            self._transition(tx, row, event, reason, detail=diagnostic)
            view = self._view(tx.conn, lease.job_id)
        return view

    def cancel_running(self, lease: JobLease) -> JobView:
        """The owner saw a cancel request at a step boundary and stops: the job is ``cancelled``."""
        with self._write() as tx:
            row = self._fenced(tx, lease)
            if not row["cancel_requested"] or row["publish_result"] is not None:
                raise JobStateError(
                    f"job {lease.job_id!r} has no cancel request to honour before publication",
                    job_id=lease.job_id,
                    state="running",
                    event="cancelled_after_reconciliation",
                )
            self._end_attempt(tx, lease.attempt_id, "cancelled", None)
            self._transition(tx, row, "cancelled_after_reconciliation", "cancelled")
            view = self._view(tx.conn, lease.job_id)
        return view

    def recover(self, lease: JobLease, published: Sequence[PublishedResult]) -> PublicationVerdict:
        """Judge what the target holds for a job whose result was recorded (contract §4).

        ``consistent``: ``completed`` (``recovered_after_publish``), nothing
        re-executed.  ``inconsistent``: ``recovery_required``.  ``absent``:
        nothing changes; the owner publishes again with the recorded ids, then
        calls :meth:`complete`.
        """
        with self._write() as tx:
            row = self._fenced(tx, lease)
            if row["publish_result"] is None:
                raise JobStateError(
                    f"job {lease.job_id!r} recorded no result; there is nothing to recover",
                    job_id=lease.job_id,
                    state="running",
                    event="recover",
                )
            verdict = judge_publication(
                lease.job_id, row["publish_attempt_id"], bytes(row["publish_result"]), published
            )
            if verdict == "consistent":
                self._end_attempt(tx, lease.attempt_id, "recovered_after_publish", None)
                self._transition(tx, row, "recovered_after_publish", "recovered_after_publish")
            elif verdict == "inconsistent":
                detail = bounded_diagnostic(
                    f"{len(published)} publications: "
                    + ", ".join(f"attempt {p.attempt_id} ({len(p.result)} bytes)" for p in published)
                )
                self._end_attempt(tx, lease.attempt_id, "recovery_required", detail)
                self._transition(
                    tx, row, "inconsistent_publication", "inconsistent_publication", detail=detail
                )
        return verdict

    # -- requests of callers and operators --

    def _mark(self, job_id: str, flag: str, value: bool, event: str) -> JobView:
        with self._write() as tx:
            row = self._locked_job(tx, job_id)
            if row["state"] not in FINAL_JOB_STATES and bool(row[flag]) != value:
                tx.conn.execute(
                    update(worker_jobs)
                    .where(worker_jobs.c.job_id == job_id)
                    .values(**{flag: value, "updated_at": tx.now})
                )
                self._event(tx, job_id, event, row["state"], row["state"], event, fence=row["fence"])
            view = self._view(tx.conn, job_id)
        return view

    def pause(self, job_id: str) -> JobView:
        """Stop new claims (and reclaims) of the job until :meth:`resume`; its state is kept."""
        return self._mark(job_id, "paused", True, "paused")

    def resume(self, job_id: str) -> JobView:
        """Let a paused job be claimed again."""
        return self._mark(job_id, "paused", False, "resumed")

    def stop(self, job_id: str) -> JobView:
        """Prevent a new start: a waiting job ends ``cancelled`` (``stopped``) now; a running
        attempt may finish, but no retry or reclaim executes it again."""
        return self._request(job_id, "stop", "stopped", "stop_requested")

    def cancel(self, job_id: str) -> JobView:
        """End a waiting job (``cancelled``); mark a running one for reconciliation (contract §4)."""
        return self._request(job_id, "cancel", "cancelled", "cancel_requested")

    def _request(self, job_id: str, event: str, reason: str, flag: str) -> JobView:
        with self._write() as tx:
            row = self._locked_job(tx, job_id)
            if row["state"] in WAITING_JOB_STATES:
                self._transition(tx, row, event, reason)
            elif row["state"] == "running" and not row[flag]:
                tx.conn.execute(
                    update(worker_jobs).where(worker_jobs.c.job_id == job_id).values(**{flag: True})
                )
                self._event(tx, job_id, flag, "running", "running", flag, fence=row["fence"])
            # A final job is left as it is; recovery_required is the operator's (resolve).
            view = self._view(tx.conn, job_id)
        return view

    def resolve(self, job_id: str, outcome: Literal["completed", "failed"], *, who: str, why: str) -> JobView:
        """An operator settles a ``recovery_required`` job after checking the target (records who, why)."""
        if outcome not in ("completed", "failed"):
            raise InvalidJobError(f"must be 'completed' or 'failed', got {outcome!r}", field="outcome")
        check_text(who, "who", MAX_ID_LENGTH, job_id)
        check_text(why, "why", 1024, job_id)
        with self._write() as tx:
            row = self._locked_job(tx, job_id)
            self._transition(tx, row, f"resolve_{outcome}", f"resolved_{outcome}", detail=f"{who}: {why}")
            view = self._view(tx.conn, job_id)
        return view

    # -- reads --

    def status(self, job_id: str) -> JobView:
        """The job as it is now."""
        with self._read() as conn:
            return self._view(conn, job_id)

    def _view(self, conn: Connection, job_id: str) -> JobView:
        """The job as ``conn`` sees it now."""
        row = conn.execute(select(worker_jobs).where(worker_jobs.c.job_id == job_id)).mappings().first()
        if row is None:
            raise UnknownJobError(f"no job {job_id!r}", job_id=job_id)
        deps = tuple(
            conn.execute(
                select(worker_job_dependencies.c.depends_on)
                .where(worker_job_dependencies.c.job_id == job_id)
                .order_by(worker_job_dependencies.c.depends_on)
            ).scalars()
        )
        return JobView(
            job_id=row["job_id"],
            scope=row["scope"],
            kind=row["kind"],
            state=row["state"],
            reason=row["reason"],
            attempts=int(row["attempts"]),
            max_attempts=int(row["max_attempts"]),
            fence=int(row["fence"]),
            paused=bool(row["paused"]),
            cancel_requested=bool(row["cancel_requested"]),
            stop_requested=bool(row["stop_requested"]),
            checkpoint_step=int(row["checkpoint_step"]),
            diagnostic=row["diagnostic"],
            depends_on=deps,
        )

    def events(self, job_id: str) -> list[JobEvent]:
        """Every event of the job, oldest first."""
        with self._read() as conn:
            rows = conn.execute(
                select(worker_job_events)
                .where(worker_job_events.c.job_id == job_id)
                .order_by(worker_job_events.c.position)
            ).mappings()
            return [
                JobEvent(
                    position=int(r["position"]),
                    job_id=r["job_id"],
                    event=r["event"],
                    from_state=r["from_state"],
                    to_state=r["to_state"],
                    reason=r["reason"],
                    fence=None if r["fence"] is None else int(r["fence"]),
                    attempt_id=r["attempt_id"],
                    detail=r["detail"],
                    recorded_at=as_utc(r["recorded_at"]),
                )
                for r in rows
            ]

    def checkpoints(self, job_id: str) -> list[Checkpoint]:
        """The job's checkpoints, by step."""
        with self._read() as conn:
            rows = conn.execute(
                select(worker_job_checkpoints)
                .where(worker_job_checkpoints.c.job_id == job_id)
                .order_by(worker_job_checkpoints.c.step)
            ).mappings()
            return [
                Checkpoint(
                    r["job_id"],
                    int(r["step"]),
                    r["attempt_id"],
                    int(r["fence"]),
                    canonical_decode(bytes(r["state"])),
                    as_utc(r["recorded_at"]),
                )
                for r in rows
            ]

    def counts(self, scope: str | None = None) -> dict[str, int]:
        """How many jobs are in each state (of one scope, or of all)."""
        query = select(worker_jobs.c.state, func.count()).group_by(worker_jobs.c.state)
        if scope is not None:
            query = query.where(worker_jobs.c.scope == scope)
        with self._read() as conn:
            return {str(state): int(n) for state, n in conn.execute(query)}


def _pairs(rows: Iterable[Any]) -> dict[str, str]:
    """Two-column rows as a dict (a result has ``keys()``, so ``dict(result)`` would misread it)."""
    return {str(key): str(value) for key, value in rows}


def _topological(fresh: Mapping[str, tuple[Job, bytes]]) -> list[str]:
    """The batch's ids, each after the batch jobs it depends on (the batch is acyclic by now)."""
    order: list[str] = []
    placed: set[str] = set()

    def place(job_id: str) -> None:
        stack = [(job_id, iter(fresh[job_id][0].depends_on))]
        while stack:
            current, deps = stack[-1]
            for dep in deps:
                if dep in fresh and dep not in placed:
                    stack.append((dep, iter(fresh[dep][0].depends_on)))
                    break
            else:
                stack.pop()
                if current not in placed:
                    placed.add(current)
                    order.append(current)

    for job_id in fresh:
        if job_id not in placed:
            place(job_id)
    return order
