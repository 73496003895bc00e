"""Enqueueing a batch of jobs in one transaction (worker contract §1, §4; docs/jobs.md).

The rules, in the order they are applied:

1. Every job is validated before the transaction (``validate_job``); an id
   twice in the batch with different content is refused.
2. The batch's scopes are locked, in name order (two batches lock in one order).
3. An id that exists is a ``duplicate`` (same canonical content) or a
   ``conflict`` (other content); a batch with a conflict writes nothing, and
   its other jobs answer ``aborted``.
4. Every dependency exists, in the store or in the batch; the existing ones
   are read under a shared lock, so one that finishes meanwhile sees its new
   dependents.
5. A dependency cycle is refused: existing jobs' dependencies are fixed and
   point at existing jobs, so a cycle can only run through the batch.
6. No scope may hold more than ``max_waiting`` unfinished jobs afterwards,
   counted under the scope's lock.
7. Each new job starts ``queued`` or ``blocked`` (``initial_state``), after
   the batch jobs it depends on; one whose dependency already failed fails at
   once (``dependency_failed``).

Speaks only to the port (:class:`~admission.jobs._store.JobStore`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime

from admission.errors import InvalidJobError, JobQueueFullError
from admission.intent._encoding import canonical_encode
from admission.jobs._lifecycle import record_event, transition
from admission.jobs._states import JobState, find_cycle, initial_state
from admission.jobs._store import JobRow, JobStore, JobTransaction
from admission.jobs._values import MAX_PAYLOAD_BYTES, EnqueueResult, Job, validate_job

__all__ = ["enqueue_batch"]

_Batch = Mapping[str, tuple[Job, bytes]]
"""job id -> the job and its canonical content."""


class _Abort(Exception):
    """Rolls a batch back (a conflict in it) and carries the answers out of the transaction."""

    def __init__(self, answers: list[EnqueueResult]) -> None:
        super().__init__("batch aborted")
        self.answers = answers


def enqueue_batch(
    store: JobStore, jobs: Sequence[Job], *, max_waiting: int, now: Callable[[], datetime]
) -> list[EnqueueResult]:
    """Enqueue ``jobs`` in one transaction of ``store``; one answer per job, in order (module docstring)."""
    contents: dict[str, tuple[Job, bytes]] = {}
    for job in jobs:
        content = validate_job(job)
        if job.job_id in contents and contents[job.job_id][1] != content:
            raise InvalidJobError(
                "appears twice in the batch with different content", field="job_id", job_id=job.job_id
            )
        contents[job.job_id] = (job, content)
    try:
        with store.transaction() as tx:
            return _write(tx, jobs, contents, max_waiting, now())
    except _Abort as abort:
        return abort.answers


def _write(
    tx: JobTransaction, jobs: Sequence[Job], contents: _Batch, max_waiting: int, now: datetime
) -> list[EnqueueResult]:
    for scope in sorted({job.scope for job, _ in contents.values()}):
        tx.lock_scope(scope, created_at=now)
    existing = {row.job_id: row for row in tx.find_jobs(list(contents))}
    answers: dict[str, EnqueueResult] = {}
    for job_id, (_, content) in contents.items():
        if job_id in existing:
            same = existing[job_id].content == content
            answers[job_id] = EnqueueResult(
                "duplicate" if same else "conflict", job_id, existing[job_id].state
            )
    if any(answer.outcome == "conflict" for answer in answers.values()):
        raise _Abort([answers.get(job.job_id, EnqueueResult("aborted", job.job_id, None)) for job in jobs])
    fresh = {job_id: pair for job_id, pair in contents.items() if job_id not in existing}
    states = _insert_fresh(tx, fresh, max_waiting, now)
    return [
        answers.get(job.job_id) or EnqueueResult("enqueued", job.job_id, states[job.job_id]) for job in jobs
    ]


def _insert_fresh(tx: JobTransaction, fresh: _Batch, max_waiting: int, now: datetime) -> dict[str, str]:
    """Insert the batch's new jobs; returns their states."""
    if not fresh:
        return {}
    wanted = {dep for job, _ in fresh.values() for dep in job.depends_on if dep not in fresh}
    known = tx.share_states(wanted) if wanted else {}
    for job, _ in fresh.values():
        for dep in job.depends_on:
            if dep not in fresh and dep not in known:
                raise InvalidJobError(
                    f"job {dep!r} does not exist (a dependency must exist before the claim)",
                    field="depends_on",
                    job_id=job.job_id,
                )
    # Contract §4: a cycle is refused; it can only run through the batch.
    cycle = find_cycle(
        {job_id: [d for d in job.depends_on if d in fresh] for job_id, (job, _) in fresh.items()}
    )
    if cycle is not None:
        raise InvalidJobError("cycle " + " -> ".join(cycle), field="depends_on", job_id=cycle[0])
    for scope in sorted({job.scope for job, _ in fresh.values()}):
        waiting = tx.count_unfinished(scope)
        adding = sum(1 for job, _ in fresh.values() if job.scope == scope)
        if waiting + adding > max_waiting:
            raise JobQueueFullError(
                f"scope {scope!r} holds {waiting} unfinished jobs; {adding} more would pass its bound "
                f"of {max_waiting}",
                scope=scope,
                waiting=waiting,
                limit=max_waiting,
            )
    states = dict(known)
    for job_id in _topological(fresh):
        job, content = fresh[job_id]
        dependency_states = [states[d] for d in job.depends_on]
        row = JobRow(
            job_id=job_id,
            scope=job.scope,
            position=tx.next_position(job.scope),
            kind=job.kind,
            payload=canonical_encode(job.payload, max_size=MAX_PAYLOAD_BYTES),
            content=content,
            state=initial_state(dependency_states).value,
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
            created_at=now,
            updated_at=now,
        )
        tx.insert_job(row, job.depends_on)
        record_event(tx, job_id, "enqueue", None, row.state, "enqueued", now)
        if any(s in (JobState.FAILED, JobState.CANCELLED) for s in dependency_states):
            row = transition(tx, row, "dependency_failed", "dependency_failed", now)
        states[job_id] = row.state
    return {job_id: states[job_id] for job_id in fresh}


def _topological(fresh: _Batch) -> list[str]:
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
