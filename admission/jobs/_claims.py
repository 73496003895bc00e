"""Claims: when a running job may be taken from its owner, whether it may run again, the new attempt.

**Expiry** is judged on a monotonic clock, never on a stored time.  Every
fenced write of the owner bumps the job's ``beat``.  A service that finds a
job ``running`` notes the pair ``(fence, beat)`` and the time on *its own*
monotonic clock (:class:`LeaseWatch`); it reclaims the job only when a later
claim finds the very same pair after at least ``lease_seconds`` on that clock:
the owner neither renewed nor finished for a whole lease.  The owner treats
its lease as valid until ``lease_seconds`` after the monotonic time it read
*before* the write that last renewed it; since an observer starts watching a
pair only after that write committed, the owner's deadline comes first
(``docs/jobs.md``).  Observations live in the watch, so a process that
restarts watches afresh: a crashed owner's job is reclaimed ``lease_seconds``
after the new process first looks at it, never earlier.

**Restart refusals**: an expired or failed attempt is not followed by a new
execution when a cancel or a stop was requested meanwhile, or when the
attempts are used up (:func:`restart_refusal`).

**Bounded recovery**: a claim of a job whose result was recorded starts a
*recovery* attempt, which reads the target back and never executes a step.
The attempts started after the one that recorded the result are counted; once
they reach the job's ``max_attempts``, the next claim starts none but moves the
job to ``recovery_required`` (``recovery_exhausted``) with a diagnostic
(:func:`recovery_refusal`, :func:`end_recovery`).  The bound is the job's one
``max_attempts``, counted apart for recovery: a job that recorded its result on
its last attempt may still be recovered.
**One running job per scope** (:func:`judge_claim`): a claim holds the
job's scope (``lock_scope``) before the job itself, the order an enqueue
takes them in, so two claims of one scope never run side by side and
cannot deadlock with an enqueue; under that lock a waiting job whose scope
has another job ``running`` answers ``not_claimable`` (``scope_busy``) and
nothing is written.  The scope, not the job, is the unit of concurrency
(``docs/jobs.md``, "Claims").

**A claim** (:func:`start_attempt`) moves the job to ``running`` under
``fence + 1`` (contract §3: a reclaim never reuses the old token), records
the attempt, and hands the owner a :class:`~admission.jobs._values.JobLease`
with the last checkpoint to resume from, or the recorded result to recover.

Speaks only to the port; the clock's readings are passed in.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime

from admission.errors import StorageError
from admission.intent._encoding import Value, canonical_decode
from admission.jobs._lifecycle import end_attempt, transition
from admission.jobs._states import FINAL_JOB_STATES, JobState
from admission.jobs._store import AttemptRow, JobRow, JobTransaction
from admission.jobs._values import ClaimResult, JobLease, bounded_diagnostic

__all__ = [
    "LeaseWatch",
    "Owner",
    "end_recovery",
    "judge_claim",
    "recovery_refusal",
    "restart_refusal",
    "start_attempt",
]


@dataclass
class _Seen:
    pair: tuple[int, int]
    since: float


class LeaseWatch:
    """The ``(fence, beat)`` pairs this observer saw on running jobs, and when it first saw each."""

    def __init__(self) -> None:
        self._seen: dict[str, _Seen] = {}

    def expired(self, row: JobRow, now: float, lease_seconds: float) -> bool:
        """Whether ``row`` has shown the same pair for a whole lease; otherwise start (or go on) watching."""
        pair = (row.fence, row.beat)
        seen = self._seen.get(row.job_id)
        if seen is None or seen.pair != pair:
            self._seen[row.job_id] = _Seen(pair, now)
            return False
        return now - seen.since >= lease_seconds

    def forget(self, job_id: str) -> None:
        """Stop watching ``job_id`` (it was claimed anew: its pair changed for good)."""
        self._seen.pop(job_id, None)


def restart_refusal(row: JobRow) -> tuple[str, str] | None:
    """Why an ended attempt must not be followed by a new execution, as (event, reason), if it must not."""
    if row.cancel_requested:
        return "cancelled_after_reconciliation", "cancelled"
    if row.stop_requested:
        return "stopped_before_restart", "stopped"
    if row.attempts >= row.max_attempts:
        return "attempts_exhausted", "attempts_exhausted"
    return None


def recovery_refusal(row: JobRow, recovering_attempts: int) -> tuple[str, str] | None:
    """Why a job whose result was recorded must not start another recovery attempt, as (event,
    reason), if it must not: ``recovering_attempts`` (those started after the attempt that recorded
    the result) already reached the job's ``max_attempts``."""
    if recovering_attempts >= row.max_attempts:
        return "recovery_exhausted", "recovery_exhausted"
    return None


def _attempt(tx: JobTransaction, row: JobRow, attempt_id: str | None) -> AttemptRow:
    found = None if attempt_id is None else tx.attempt(attempt_id)
    if found is None:
        raise StorageError(f"job {row.job_id!r} names attempt {attempt_id!r}, but the store has none")
    return found


def _exhausted_diagnostic(row: JobRow, recorded: AttemptRow, last: AttemptRow) -> str:
    recovering = row.attempts - recorded.number
    if last.diagnostic is not None:
        error = f"ended {last.outcome}: {last.diagnostic}"
    else:
        error = f"ended {last.outcome}, no error recorded (its owner stopped or lost its lease)"
    return bounded_diagnostic(
        f"recovery exhausted: {recovering} recovery attempt{'s' if recovering != 1 else ''} "
        f"(the bound, max_attempts={row.max_attempts}) "
        f"after attempt {recorded.number} recorded the result; no step was re-executed and nothing is "
        f"published again until an operator resolves the job; the last recovery attempt "
        f"({last.number}) {error}"
    )


def end_recovery(tx: JobTransaction, row: JobRow, now: datetime) -> ClaimResult | None:
    """At the reclaim of a job ``tx`` holds whose result was recorded: if its recovery attempts
    reached the bound (:func:`recovery_refusal`), move it to ``recovery_required`` with a diagnostic
    (on the job and in the event) and answer ``not_claimable``; else ``None`` (recover once more).

    The expired attempt was ended by the caller; its own ending (an error its owner recorded
    with ``publication_failed``) goes into the diagnostic.
    """
    recorded = _attempt(tx, row, row.publish_attempt_id)
    refusal = recovery_refusal(row, row.attempts - recorded.number)
    if refusal is None:
        return None
    event, reason = refusal
    diagnostic = _exhausted_diagnostic(row, recorded, _attempt(tx, row, row.attempt_id))
    changes = replace(row, diagnostic=diagnostic)
    transition(tx, row, event, reason, now, detail=diagnostic, changes=changes)
    return ClaimResult("not_claimable", row.job_id, JobState.RECOVERY_REQUIRED.value, reason)


@dataclass(frozen=True)
class Owner:
    """Who claims, and the lease it would take: the claiming service's side of :func:`judge_claim`.

    ``started`` is the monotonic time read before the claim's transaction
    began; ``attempt_id`` makes the id of a new attempt.
    """

    name: str
    watch: LeaseWatch
    started: float
    lease_seconds: float
    attempt_id: Callable[[], str]


def judge_claim(tx: JobTransaction, row: JobRow, owner: Owner, now: datetime) -> ClaimResult:
    """Claim the job ``tx`` holds (its scope held first), or say why not; a refusal writes nothing,
    except a reclaim whose restart is refused (:func:`restart_refusal`), which ends the job."""
    job_id, state = row.job_id, row.state
    if state in FINAL_JOB_STATES:
        return ClaimResult("final", job_id, state, row.reason)
    if state in (JobState.BLOCKED, JobState.RECOVERY_REQUIRED):
        return ClaimResult("not_claimable", job_id, state, state)
    if row.paused:
        return ClaimResult("not_claimable", job_id, state, "paused")
    if row.not_before is not None and now < row.not_before:
        return ClaimResult("not_claimable", job_id, state, "backoff")
    if state == JobState.RUNNING:
        if not owner.watch.expired(row, owner.started, owner.lease_seconds):
            return ClaimResult("not_claimable", job_id, state, "lease_live")
        end_attempt(tx, row.attempt_id, "lease_expired", None, now)
        if row.publish_result is None:
            ending = restart_refusal(row)
            if ending is not None:
                event, reason = ending
                final = transition(tx, row, event, reason, now)
                return ClaimResult("final", job_id, final.state, reason)
        else:
            exhausted = end_recovery(tx, row, now)
            if exhausted is not None:
                return exhausted
        event = "reclaim"
    else:
        # queued or retry_wait: a stop or cancel request would have ended it already.  Read
        # under the scope's lock, which every claim takes: no other job of it can start meanwhile.
        if any(other != job_id for other in tx.running_in_scope(row.scope)):
            return ClaimResult("not_claimable", job_id, state, "scope_busy")
        event = "claim"
    owner.watch.forget(job_id)
    return start_attempt(
        tx,
        row,
        event,
        attempt_id=owner.attempt_id(),
        owner=owner.name,
        started=owner.started,
        lease_seconds=owner.lease_seconds,
        now=now,
    )


def start_attempt(
    tx: JobTransaction,
    row: JobRow,
    event: str,
    *,
    attempt_id: str,
    owner: str,
    started: float,
    lease_seconds: float,
    now: datetime,
) -> ClaimResult:
    """Start an attempt of a job ``tx`` holds (``event``: ``claim`` or ``reclaim``) under a new fence.

    The owner's deadline is ``lease_seconds`` after ``started``, the
    monotonic time read before this transaction began.
    """
    job_id = row.job_id
    fence = row.fence + 1
    number = row.attempts + 1
    reason = "claimed" if event == "claim" else "lease_expired"
    recovering = row.publish_result is not None
    changes = replace(
        row, fence=fence, beat=row.beat + 1, attempts=number, attempt_id=attempt_id, owner=owner
    )
    transition(tx, row, event, "recovering" if recovering else reason, now, changes=changes)
    tx.begin_attempt(
        attempt_id=attempt_id, job_id=job_id, number=number, fence=fence, owner=owner, started_at=now
    )
    step = row.checkpoint_step
    resume: Value = None
    if step:
        stored = tx.checkpoint_state(job_id, step)
        if stored is None:
            raise StorageError(f"job {job_id!r} records checkpoint step {step}, but the store has none")
        resume = canonical_decode(stored)
    lease = JobLease(
        job_id=job_id,
        fence=fence,
        attempt_id=attempt_id,
        attempt_number=number,
        owner=owner,
        kind=row.kind,
        payload=canonical_decode(row.payload),
        resume_step=step,
        resume_state=resume,
        publish_attempt_id=row.publish_attempt_id,
        publish_result=row.publish_result,
        deadline=started + lease_seconds,
    )
    return ClaimResult("claimed", job_id, "running", reason, lease)
