"""The job service: durable jobs on any job store (worker contract §3, §4).

:class:`JobService` speaks only to the port
(:class:`~admission.jobs._store.JobStore`): ``MemoryJobStore``, or
``admission.sql.SqlJobStore`` on SQLite or PostgreSQL.  The lifecycle is the
table in ``admission.jobs._states``; every state change goes through
``JOB_TRANSITIONS.next_state`` (``admission.jobs._lifecycle``) and writes an
event in the transaction that makes it.  Enqueueing a batch is
``admission.jobs._enqueue``; expiry, restart refusals and the start of an
attempt are ``admission.jobs._claims``.

**Fencing** (contract §3).  A claim sets ``fence = fence + 1`` on the job and
hands the new value to the owner in its :class:`JobLease`.  Every write of
the owner (``heartbeat``, ``checkpoint``, ``record_result``, ``complete``,
``fail``, ``recover``, ``publication_failed``, ``cancel_running``) starts with the store's one
conditional write, which matches the job only while it is ``running`` under
that fence (:func:`~admission.jobs._lifecycle.fenced`); no match raises
:class:`~admission.errors.JobFencedError` and the transaction writes
nothing.  The store, not the owner, decides.

**Checkpoints**: at each step boundary the owner writes the step number and
the canonical encoding of its state, immutable, under its fence; a claim
hands the latest one to the next attempt, which resumes at the next step.

**Publication**: the owner first records the result under its fence
(``record_result``: the publish intent, with its attempt id), then publishes
it through a :class:`Publisher`, then acknowledges (``complete``).  A
reclaimed job with a publish intent is never executed again: the next owner
reads the target back and :func:`~admission.jobs._states.judge_publication`
decides (``recover``); such recovery attempts are bounded by the job's
``max_attempts`` (``admission.jobs._claims``).

Time and identifiers are parameters (``clock``, ``now``, ``new_id``), so
tests drive them.
"""

from __future__ import annotations

import os
import random
import socket
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Final, Literal

from admission import _bounds as bounds
from admission.errors import (
    AdmissionError,
    InvalidJobError,
    UnknownJobError,
)
from admission.intent._encoding import Value, canonical_encode
from admission.jobs._backoff import DEFAULT_BACKOFF, Backoff
from admission.jobs._claims import LeaseWatch, Owner, judge_claim, restart_refusal
from admission.jobs._enqueue import enqueue_batch
from admission.jobs._lifecycle import (
    end_attempt,
    fenced,
    judge_recovery,
    record_event,
    record_publication_failure,
    refused_write,
    transition,
)
from admission.jobs._snapshot import SnapshotMethods
from admission.jobs._states import (
    FINAL_JOB_STATES,
    WAITING_JOB_STATES,
    JobState,
    PublicationVerdict,
    PublishedResult,
)
from admission.jobs._store import JobRow, JobStore, JobTransaction
from admission.jobs._values import (
    DEFAULT_LEASE_SECONDS,
    DEFAULT_MAX_WAITING,
    MAX_ID_LENGTH,
    MAX_PAYLOAD_BYTES,
    MAX_SCOPE_LENGTH,
    Checkpoint,
    ClaimResult,
    Control,
    EnqueueResult,
    Job,
    JobEvent,
    JobLease,
    JobView,
    check_diagnostic,
    check_text,
    job_backoff,
)

__all__ = ["JobService"]

_CLAIM_SCAN: Final = 64
"""How many candidates ``claim_next`` reads at a time."""


def _default_owner() -> str:
    return f"{socket.gethostname()[:64]}:{os.getpid()}:{uuid.uuid4().hex[:12]}"


def _storable(value: object, width: int) -> bool:
    return bounds.text_fault(value, width) is None


def _retry_time(row: JobRow, now: datetime, backoff: Backoff, draw: float) -> datetime:
    """When a job whose attempt ``row.attempts`` just failed may be claimed again: the job's own
    backoff, else the service's ``backoff``, with the service's random ``draw``."""
    if not (isinstance(draw, float) and 0 <= draw < 1):
        raise InvalidJobError(f"must draw a float in [0, 1), drew {draw!r}", field="rng", job_id=row.job_id)
    policy = job_backoff(row.content) or backoff
    return now + timedelta(seconds=policy.delay(row.attempts, draw))


class JobService(SnapshotMethods):
    """Durable jobs on a :class:`~admission.jobs._store.JobStore`.

    ``clock`` is the monotonic clock liveness is judged on, ``now`` the
    wall-clock time written on rows (for people, never for liveness),
    ``new_id`` makes attempt ids.  All three are parameters so that tests can
    drive them.  The service keeps its own observations of running jobs
    (``admission.jobs._claims``): two services on one store judge expiry each
    on its own clock.

    ``backoff`` is the wait before a retry of a job that sets none itself
    (:class:`~admission.jobs.Backoff`; default :data:`~admission.jobs.DEFAULT_BACKOFF`),
    ``rng`` the uniform draw in ``[0, 1)`` its jitter takes.  The wait ends at
    a wall-clock time (``not_before``, from ``now``): it is shared by every
    process, and it decides when a job may run again, never whether an owner lives.
    """

    def __init__(
        self,
        store: JobStore,
        *,
        clock: Callable[[], float] = time.monotonic,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
        new_id: Callable[[], str] = lambda: str(uuid.uuid4()),
        lease_seconds: float = DEFAULT_LEASE_SECONDS,
        max_waiting: int = DEFAULT_MAX_WAITING,
        owner: str | None = None,
        backoff: Backoff = DEFAULT_BACKOFF,
        rng: Callable[[], float] = random.random,
    ) -> None:
        if not lease_seconds > 0:
            raise InvalidJobError(f"must be positive, got {lease_seconds!r}", field="lease_seconds")
        if isinstance(max_waiting, bool) or not isinstance(max_waiting, int) or max_waiting < 1:
            raise InvalidJobError(f"must be a positive int, got {max_waiting!r}", field="max_waiting")
        if not isinstance(backoff, Backoff):
            raise InvalidJobError(f"must be a Backoff, got {type(backoff).__name__}", field="backoff")
        self.backoff = backoff.check()
        self.rng = rng
        self.store = store
        self.clock = clock
        self.now = now
        self.new_id = new_id
        self.lease_seconds = float(lease_seconds)
        self.max_waiting = max_waiting
        self.owner = check_text(owner or _default_owner(), "owner", MAX_ID_LENGTH, None)
        self._watch = LeaseWatch()

    def _attempt_id(self) -> str:
        # Attempt ids are stored in ID-wide columns: one that does not fit is refused (and the
        # claim's transaction rolled back), never a storage error.
        value = self.new_id()
        fault = bounds.text_fault(value, bounds.ID)
        if fault is not None:
            raise InvalidJobError(fault, field="new_id")
        return value

    def dispose(self) -> None:
        """Release the store's resources (its connections); the service is not used afterwards."""
        self.store.dispose()

    # -- enqueue --

    def enqueue(self, job: Job) -> EnqueueResult:
        """Enqueue one job (see :meth:`enqueue_all`)."""
        return self.enqueue_all([job])[0]

    def enqueue_all(self, jobs: Sequence[Job]) -> list[EnqueueResult]:
        """Enqueue jobs in one transaction; they may depend on each other and on existing jobs.

        Refused with :class:`InvalidJobError`, writing nothing: a malformed
        job, a dependency that exists neither in the store nor in the
        batch, a dependency cycle (a self-cycle included).  Refused with
        :class:`JobQueueFullError`: a scope that would hold more than its
        bound of unfinished jobs (``UNFINISHED_JOB_STATES``).  An id that exists is a ``duplicate`` (same
        canonical content) or a ``conflict`` (other content); a batch with a
        conflict writes nothing.
        """
        return enqueue_batch(self.store, jobs, max_waiting=self.max_waiting, now=self.now)

    # -- claims --

    @staticmethod
    def _locked(tx: JobTransaction, job_id: str) -> JobRow:
        row = tx.lock_job(job_id)
        if row is None:
            raise UnknownJobError(f"no job {job_id!r}", job_id=job_id)
        return row

    def claim(self, job_id: str) -> ClaimResult:
        """Claim the job: start an attempt under a new fencing token, or say why not.

        A final job answers ``final`` (a duplicate delivery: nothing runs, nothing
        is written).  A running job is reclaimed only once its lease expired
        as this service judges it (``admission.jobs._claims``); a reclaim of a job whose
        result was recorded returns a lease that recovers instead of executing.
        A waiting job whose scope has another job ``running`` answers
        ``not_claimable`` (``scope_busy``): one running job per scope.  The
        claim waits for the scope and the job if another transaction holds them.
        """
        check_text(job_id, "job_id", MAX_ID_LENGTH, None)
        owner = self._owner()
        with self.store.transaction() as tx:
            now = self.now()
            # The scope before the job, the order of an enqueue (which locks the scope, then
            # reads jobs): one order, no deadlock.  A job's scope never changes: read it unlocked.
            found = tx.find_jobs([job_id])
            if not found or not tx.lock_scope(found[0].scope):
                raise UnknownJobError(f"no job {job_id!r}", job_id=job_id)
            return judge_claim(tx, self._locked(tx, job_id), owner, now)

    def _owner(self) -> Owner:
        return Owner(self.owner, self._watch, self.clock(), self.lease_seconds, self._attempt_id)

    def claim_next(self, scope: str) -> ClaimResult | None:
        """Claim the oldest claimable job of ``scope`` (queued, retrying, or expired), or ``None``.

        One running job per scope: while a job of ``scope`` is ``running``,
        only that job can be claimed (reclaimed once its lease expired).  Never
        waits: a scope another transaction holds (a claim or an enqueue in
        flight) answers ``None`` at once, and a job another transaction holds is
        passed over (``FOR UPDATE SKIP LOCKED`` on PostgreSQL), and so is a job
        whose retry backoff has not ended.
        """
        if not _storable(scope, MAX_SCOPE_LENGTH):
            return None
        waiting = self.store.claim_candidates(scope, _CLAIM_SCAN, now=self.now())
        if not waiting:
            return None
        owner = self._owner()
        with self.store.transaction() as tx:
            now = self.now()
            if not tx.lock_scope(scope, skip_locked=True):
                return None  # another claim or an enqueue holds the scope: never wait for it
            running = tx.running_in_scope(scope)
            for job_id in running:
                row = tx.lock_job(job_id, skip_locked=True)
                answer = None if row is None else judge_claim(tx, row, owner, now)
                if answer is None or answer.state == JobState.RUNNING:
                    # Reclaimed, or still running (its owner is writing, its lease lives, or
                    # it is paused): either way nothing else of the scope may start.
                    return answer if answer is not None and answer.lease is not None else None
                # The reclaim ended it instead (a refused restart): the scope may be free.
            # No job of the scope runs now (a reclaim may have just ended one): the oldest waiting.
            for job_id in waiting:
                row = tx.lock_job(job_id, skip_locked=True)
                if row is None or row.job_id in running:
                    continue  # held by another transaction (a pause, say), or judged above
                answer = judge_claim(tx, row, owner, now)
                if answer.lease is not None:
                    return answer
        return None

    # -- fenced writes of the owner --

    def _control(self, row: JobRow, started: float) -> Control:
        return Control(started + self.lease_seconds, row.cancel_requested, row.stop_requested)

    def heartbeat(self, lease: JobLease) -> Control:
        """Renew the lease (a fenced write); the answer carries the new deadline and pending requests."""
        started = self.clock()
        with self.store.transaction() as tx:
            return self._control(fenced(tx, lease, self.now()), started)

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
        with self.store.transaction() as tx:
            now = self.now()
            row = fenced(tx, lease, now)
            if step != row.checkpoint_step + 1:
                raise InvalidJobError(
                    f"step {step} does not follow the last checkpoint, step {row.checkpoint_step}",
                    field="step",
                    job_id=lease.job_id,
                )
            tx.insert_checkpoint(
                job_id=lease.job_id,
                step=step,
                attempt_id=lease.attempt_id,
                fence=lease.fence,
                state=encoded,
                recorded_at=now,
            )
            tx.save_job(replace(row, checkpoint_step=step))
            return self._control(row, started)

    def record_result(self, lease: JobLease, result: Value) -> bytes:
        """Record the result before it is published (the publish intent); returns its canonical bytes."""
        try:
            encoded = canonical_encode(result, max_size=MAX_PAYLOAD_BYTES)
        except AdmissionError as exc:
            raise InvalidJobError(str(exc), field="result", job_id=lease.job_id) from exc
        with self.store.transaction() as tx:
            now = self.now()
            row = fenced(tx, lease, now)
            if row.publish_result is not None:
                raise refused_write(lease.job_id, "record_result", "already recorded its result")
            tx.save_job(replace(row, publish_attempt_id=lease.attempt_id, publish_result=encoded))
            record_event(
                tx,
                lease.job_id,
                "result_recorded",
                "running",
                "running",
                "result_recorded",
                now,
                fence=lease.fence,
                attempt_id=lease.attempt_id,
            )
        return encoded

    def complete(self, lease: JobLease, *, reason: str = "completed") -> JobView:
        """Acknowledge the publication: the job is ``completed``.  Needs a recorded result."""
        with self.store.transaction() as tx:
            now = self.now()
            row = fenced(tx, lease, now)
            if row.publish_result is None:
                raise refused_write(lease.job_id, "complete", "has no recorded result to acknowledge")
            end_attempt(tx, lease.attempt_id, "completed", None, now)
            row = transition(tx, row, "complete", reason, now)
            return row.view(tx.dependencies(lease.job_id))

    def fail(self, lease: JobLease, diagnostic: str | None, *, retryable: bool) -> JobView:
        """End the attempt as failed.

        Retryable: ``retry_wait`` while attempts remain, not to be claimed before
        ``not_before`` (now plus the job's backoff, or the service's), else ``failed``
        (``attempts_exhausted``); ``cancelled`` instead when a stop or cancel
        was requested meanwhile.  Not retryable: ``failed``.  A diagnostic
        over 2 KiB is refused (nothing is written); see :func:`bounded_diagnostic`.
        """
        check_diagnostic(diagnostic, lease.job_id)
        with self.store.transaction() as tx:
            now = self.now()
            row = fenced(tx, lease, now)
            if row.publish_result is not None:
                # After the result was recorded, only the publication decides (recover).
                raise refused_write(lease.job_id, "fail", "recorded its result; it cannot fail now")
            if not retryable:
                event, reason = "fatal_failure", "failed"
            else:
                event, reason = restart_refusal(row) or ("retryable_failure", "retryable_failure")
            end_attempt(tx, lease.attempt_id, reason, diagnostic, now)
            retry = event == "retryable_failure"
            not_before = _retry_time(row, now, self.backoff, self.rng()) if retry else None
            changes = replace(row, diagnostic=diagnostic, not_before=not_before)
            row = transition(tx, row, event, reason, now, detail=diagnostic, changes=changes)
            return row.view(tx.dependencies(lease.job_id))

    def cancel_running(self, lease: JobLease) -> JobView:
        """The owner saw a cancel request at a step boundary and stops: the job is ``cancelled``."""
        with self.store.transaction() as tx:
            now = self.now()
            row = fenced(tx, lease, now)
            if not row.cancel_requested or row.publish_result is not None:
                raise refused_write(
                    lease.job_id,
                    "cancelled_after_reconciliation",
                    "has no cancel request to honour before publication",
                )
            end_attempt(tx, lease.attempt_id, "cancelled", None, now)
            row = transition(tx, row, "cancelled_after_reconciliation", "cancelled", now)
            return row.view(tx.dependencies(lease.job_id))

    def recover(self, lease: JobLease, published: Sequence[PublishedResult]) -> PublicationVerdict:
        """Judge what the target holds for a job whose result was recorded (contract §4).

        ``consistent``: ``completed`` (``recovered_after_publish``), nothing
        re-executed.  ``inconsistent``: ``recovery_required``.  ``absent``:
        nothing changes; the owner publishes again with the recorded ids, then
        calls :meth:`complete`.
        """
        with self.store.transaction() as tx:
            return judge_recovery(tx, lease, published, self.now())

    def publication_failed(
        self, lease: JobLease, diagnostic: str, *, reason: Literal["target_unreadable", "publish_failed"]
    ) -> None:
        """Record why the target could not be read back or published to, for a job whose result was
        recorded: the attempt ends with ``reason`` and ``diagnostic`` (at most 2 KiB, else refused),
        which the job keeps; it stays ``running``, and the next claim recovers, within the bound."""
        check_diagnostic(diagnostic, lease.job_id)
        with self.store.transaction() as tx:
            record_publication_failure(tx, lease, diagnostic, reason, self.now())

    # -- requests of callers and operators --

    def _mark(self, job_id: str, paused: bool, event: str) -> JobView:
        check_text(job_id, "job_id", MAX_ID_LENGTH, None)
        with self.store.transaction() as tx:
            now = self.now()
            row = self._locked(tx, job_id)
            if row.state not in FINAL_JOB_STATES and row.paused != paused:
                row = replace(row, paused=paused, updated_at=now)
                tx.save_job(row)
                record_event(tx, job_id, event, row.state, row.state, event, now, fence=row.fence)
            return row.view(tx.dependencies(job_id))

    def pause(self, job_id: str) -> JobView:
        """Stop new claims (and reclaims) of the job until :meth:`resume`; its state is kept."""
        return self._mark(job_id, True, "paused")

    def resume(self, job_id: str) -> JobView:
        """Let a paused job be claimed again."""
        return self._mark(job_id, False, "resumed")

    def stop(self, job_id: str) -> JobView:
        """Prevent a new start: a waiting job ends ``cancelled`` (``stopped``) now; a running
        attempt may finish, but no retry or reclaim executes it again."""
        return self._request(job_id, "stop", "stopped", "stop_requested")

    def cancel(self, job_id: str) -> JobView:
        """End a waiting job (``cancelled``); mark a running one for reconciliation (contract §4)."""
        return self._request(job_id, "cancel", "cancelled", "cancel_requested")

    def _request(
        self, job_id: str, event: str, reason: str, flag: Literal["stop_requested", "cancel_requested"]
    ) -> JobView:
        check_text(job_id, "job_id", MAX_ID_LENGTH, None)
        with self.store.transaction() as tx:
            now = self.now()
            row = self._locked(tx, job_id)
            if row.state in WAITING_JOB_STATES:
                row = transition(tx, row, event, reason, now)
            elif row.state == JobState.RUNNING and not getattr(row, flag):
                if flag == "stop_requested":
                    row = replace(row, stop_requested=True)
                else:
                    row = replace(row, cancel_requested=True)
                tx.save_job(row)
                record_event(tx, job_id, flag, "running", "running", flag, now, fence=row.fence)
            # A final job is left as it is; recovery_required is the operator's (resolve).
            return row.view(tx.dependencies(job_id))

    def resolve(self, job_id: str, outcome: Literal["completed", "failed"], *, who: str, why: str) -> JobView:
        """An operator settles a ``recovery_required`` job after checking the target (records who, why)."""
        if outcome not in ("completed", "failed"):
            raise InvalidJobError(f"must be 'completed' or 'failed', got {outcome!r}", field="outcome")
        check_text(job_id, "job_id", MAX_ID_LENGTH, None)
        check_text(who, "who", MAX_ID_LENGTH, job_id)
        check_text(why, "why", 1024, job_id)
        with self.store.transaction() as tx:
            now = self.now()
            row = self._locked(tx, job_id)
            event, reason = f"resolve_{outcome}", f"resolved_{outcome}"
            row = transition(tx, row, event, reason, now, detail=f"{who}: {why}")
            return row.view(tx.dependencies(job_id))

    # -- reads --

    def status(self, job_id: str) -> JobView:
        """The job as it is now."""
        # An id no backend can store names no job: the same answer everywhere, without a query.
        view = self.store.view(job_id) if _storable(job_id, MAX_ID_LENGTH) else None
        if view is None:
            raise UnknownJobError(f"no job {job_id!r}", job_id=job_id)
        return view

    def events(self, job_id: str) -> list[JobEvent]:
        """Every event of the job, oldest first."""
        return self.store.events(job_id) if _storable(job_id, MAX_ID_LENGTH) else []

    def checkpoints(self, job_id: str) -> list[Checkpoint]:
        """The job's checkpoints, by step."""
        return self.store.checkpoints(job_id) if _storable(job_id, MAX_ID_LENGTH) else []

    def counts(self, scope: str | None = None) -> dict[str, int]:
        """How many jobs are in each state (of one scope, or of all)."""
        if scope is not None and not _storable(scope, MAX_SCOPE_LENGTH):
            return {}
        return self.store.counts(scope)
