"""Applying the job table to stored rows: one transition, its event, and what it does to dependents.

Every state change of a job goes through :func:`transition`, which asks
``JOB_TRANSITIONS.next_state`` for the new state (an event the table does not
hold for the job's state raises :class:`~admission.errors.JobStateError`), saves
the row and appends the event in the same transaction (contract §4: every
transition is an event), then settles the job's blocked dependents: the last
completed dependency unblocks them, a failed or cancelled one fails them,
transitively.

Every write of an owner starts with :func:`fenced` (contract §3).  The owner's
writes about the publication are here too: the judgement of what the target
holds (:func:`judge_recovery`) and a failure of the target
(:func:`record_publication_failure`).

Speaks only to the port (:class:`~admission.jobs._store.JobTransaction`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime
from typing import Literal

from admission.errors import InvalidJobError, JobFencedError, JobStateError
from admission.jobs._states import (
    JOB_TRANSITIONS,
    JobState,
    PublicationVerdict,
    PublishedResult,
    initial_state,
    judge_publication,
)
from admission.jobs._store import JobRow, JobTransaction
from admission.jobs._values import JobEvent, JobLease, bounded_diagnostic

__all__ = [
    "end_attempt",
    "fenced",
    "judge_recovery",
    "record_event",
    "record_publication_failure",
    "refused_write",
    "transition",
]


def record_event(
    tx: JobTransaction,
    job_id: str,
    event: str,
    from_state: str | None,
    to_state: str,
    reason: str,
    now: datetime,
    *,
    fence: int | None = None,
    attempt_id: str | None = None,
    detail: str | None = None,
) -> None:
    """Append one event to the job's log (its position is the store's to give)."""
    tx.append_event(JobEvent(0, job_id, event, from_state, to_state, reason, fence, attempt_id, detail, now))


def transition(
    tx: JobTransaction,
    row: JobRow,
    event: str,
    reason: str,
    now: datetime,
    *,
    detail: str | None = None,
    changes: JobRow | None = None,
) -> JobRow:
    """Apply one table event to a job ``tx`` holds; returns the row as saved.

    ``changes`` is ``row`` with the other fields this change sets (a claim's
    new fence, a failure's diagnostic); the state, reason and time are set
    here, a job that leaves ``running`` loses its owner, and one that leaves
    ``retry_wait`` its ``not_before``.
    """
    state = JOB_TRANSITIONS.next_state(row.state, event, subject=row.job_id).value
    base = changes or row
    saved = replace(
        base,
        state=state,
        reason=reason,
        updated_at=now,
        owner=base.owner if state == JobState.RUNNING else None,
        not_before=base.not_before if state == JobState.RETRY_WAIT else None,
    )
    tx.save_job(saved)
    record_event(
        tx,
        row.job_id,
        event,
        row.state,
        state,
        reason,
        now,
        fence=saved.fence,
        attempt_id=saved.attempt_id,
        detail=detail,
    )
    if state == JobState.COMPLETED:
        for dependent in tx.blocked_dependents(row.job_id):
            if initial_state(tx.dependency_states(dependent.job_id)) == JobState.QUEUED:
                transition(tx, dependent, "unblock", "dependencies_completed", now, detail=row.job_id)
    elif state in (JobState.FAILED, JobState.CANCELLED):
        # Recursion: the dependents' own dependents fail too.
        for dependent in tx.blocked_dependents(row.job_id):
            transition(tx, dependent, "dependency_failed", "dependency_failed", now, detail=row.job_id)
    return saved


def end_attempt(
    tx: JobTransaction, attempt_id: str | None, outcome: str, diagnostic: str | None, now: datetime
) -> None:
    """Record the end of the attempt a job ran under, if it ran under one."""
    if attempt_id is not None:
        tx.end_attempt(attempt_id, ended_at=now, outcome=outcome, diagnostic=diagnostic)


def fenced(tx: JobTransaction, lease: JobLease, now: datetime) -> JobRow:
    """The write every owner write starts with (contract §3): the store's one conditional update,
    which matches the job only while it is ``running`` under the lease's fence; no match raises
    :class:`~admission.errors.JobFencedError` (with the job's current fence and state), and the
    transaction then writes nothing."""
    row = tx.fenced_update(lease.job_id, lease.fence, updated_at=now)
    if row is not None:
        return row
    found = tx.find_jobs([lease.job_id])
    current = found[0] if found else None
    raise JobFencedError(
        f"job {lease.job_id!r}: the write of fence {lease.fence} was refused "
        + (
            "(no such job)"
            if current is None
            else f"(the job is {current.state} under fence {current.fence})"
        ),
        job_id=lease.job_id,
        fence=lease.fence,
        current_fence=None if current is None else current.fence,
        state=None if current is None else current.state,
    )


def refused_write(job_id: str, event: str, why: str) -> JobStateError:
    """The refusal of an owner's write that its running job does not admit (``why`` says why)."""
    return JobStateError(f"job {job_id!r} {why}", job_id=job_id, state="running", event=event)


def judge_recovery(
    tx: JobTransaction, lease: JobLease, published: Sequence[PublishedResult], now: datetime
) -> PublicationVerdict:
    """Judge, under the lease's fence, what the target holds for a job whose result was recorded
    (:func:`~admission.jobs._states.judge_publication`): ``consistent`` completes it
    (``recovered_after_publish``), ``inconsistent`` moves it to ``recovery_required`` with the
    publications found, ``absent`` changes nothing (the owner publishes again)."""
    row = fenced(tx, lease, now)
    if row.publish_result is None or row.publish_attempt_id is None:
        raise refused_write(lease.job_id, "recover", "recorded no result; there is nothing to recover")
    verdict = judge_publication(lease.job_id, row.publish_attempt_id, row.publish_result, published)
    if verdict == "consistent":
        end_attempt(tx, lease.attempt_id, "recovered_after_publish", None, now)
        transition(tx, row, "recovered_after_publish", "recovered_after_publish", now)
    elif verdict == "inconsistent":
        detail = bounded_diagnostic(
            f"{len(published)} publications: "
            + ", ".join(f"attempt {p.attempt_id} ({len(p.result)} bytes)" for p in published)
        )
        end_attempt(tx, lease.attempt_id, "recovery_required", detail, now)
        transition(tx, row, "inconsistent_publication", "inconsistent_publication", now, detail=detail)
    return verdict


def record_publication_failure(
    tx: JobTransaction,
    lease: JobLease,
    diagnostic: str,
    reason: Literal["target_unreadable", "publish_failed"],
    now: datetime,
) -> None:
    """Record, under the lease's fence, that the target failed for a job whose result was recorded:
    the attempt ends with ``reason`` and ``diagnostic``, the job keeps the diagnostic and stays
    ``running`` (whether a publication landed is unknown), and event ``publication_failed``
    (running -> running) says so.  The diagnostic was checked by the caller."""
    if reason not in ("target_unreadable", "publish_failed"):
        raise InvalidJobError(
            f"must be 'target_unreadable' or 'publish_failed', got {reason!r}",
            field="reason",
            job_id=lease.job_id,
        )
    row = fenced(tx, lease, now)
    if row.publish_result is None:
        raise refused_write(lease.job_id, "publication_failed", "recorded no result to publish")
    end_attempt(tx, lease.attempt_id, reason, diagnostic, now)
    tx.save_job(replace(row, diagnostic=diagnostic))
    record_event(
        tx,
        lease.job_id,
        "publication_failed",
        "running",
        "running",
        reason,
        now,
        fence=lease.fence,
        attempt_id=lease.attempt_id,
        detail=diagnostic,
    )
