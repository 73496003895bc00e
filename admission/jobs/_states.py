"""The job lifecycle as one table, and the pure decisions around it (worker contract §4).

``JOB_TRANSITIONS[(state, event)] -> state`` holds every state change a job
can make; the job service applies an event only through
``JOB_TRANSITIONS.next_state``, which refuses any pair not in the table.  The rules:

* A job starts ``queued`` when every job it depends on has ``completed``,
  otherwise ``blocked`` (``initial_state``).  ``blocked`` is left only by
  ``unblock`` (its last dependency completed) or ``dependency_failed`` (a
  dependency ended ``failed`` or ``cancelled``: the job can never run), or by
  ``cancel`` / ``stop``.
* Only ``queued`` and ``retry_wait`` jobs are *claimed*; a claim starts an
  attempt under a new fencing token.  A ``running`` job whose lease expired is
  ``reclaim``\\ ed, again with a new token (contract §3): the state stays
  ``running`` and the old owner's writes are refused from then on.
* A running attempt ends with ``complete`` (the result was published and
  acknowledged), ``retryable_failure`` (-> ``retry_wait`` while attempts
  remain), ``attempts_exhausted`` or ``fatal_failure`` (-> ``failed``).
* After a crash between publication and acknowledgement the next owner
  replays with the same ids and judges the publication
  (``judge_publication``): consistent -> ``recovered_after_publish``
  (``completed``, nothing re-executed), inconsistent -> ``inconsistent_publication``
  (``recovery_required``).  Recovery is bounded: a job whose recovery attempts
  (the attempts started after the one that recorded the result) reached its
  ``max_attempts`` is not reclaimed again but moved ``recovery_exhausted``
  (``recovery_required``), nothing executed or published.
* ``cancel`` ends a waiting job (``queued``, ``retry_wait``, ``blocked``) at
  once.  A running job is only *marked* (a flag, not a state): its owner stops
  at its next step boundary, or the next owner reconciles it, and it ends
  ``cancelled`` (``cancelled_after_reconciliation``) when nothing was
  published, or as the publication says when something was.
* ``stop`` prevents a new start: a waiting job ends ``cancelled`` (reason
  ``stopped``); a running attempt may finish, but a retry or a reclaim that
  would start a new execution ends it ``cancelled`` instead (``stopped_before_restart``).
* ``pause`` is a flag, not a state: a paused job keeps its state and is not
  claimed (nor reclaimed) until ``resume``.
* ``recovery_required`` is left only by an operator's ``resolve_completed``
  or ``resolve_failed``.  ``completed``, ``failed`` and ``cancelled`` are
  final: no event leaves them, and a duplicate delivery of a final job is
  acknowledged without doing anything.

Pure: no I/O, no clock, no SQLAlchemy.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Literal

from admission._table import StateTable
from admission.errors import JobStateError

__all__ = [
    "FINAL_JOB_STATES",
    "JOB_TRANSITIONS",
    "UNFINISHED_JOB_STATES",
    "WAITING_JOB_STATES",
    "JobState",
    "PublicationVerdict",
    "PublishedResult",
    "find_cycle",
    "initial_state",
    "job_diagram",
    "judge_publication",
]


class JobState(enum.StrEnum):
    """The job states of contract §4; the values are the stored strings."""

    QUEUED = "queued"
    RUNNING = "running"
    RETRY_WAIT = "retry_wait"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    RECOVERY_REQUIRED = "recovery_required"
    BLOCKED = "blocked"


FINAL_JOB_STATES: Final = frozenset({JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED})
"""States no event leaves."""

WAITING_JOB_STATES: Final = frozenset({JobState.QUEUED, JobState.RETRY_WAIT, JobState.BLOCKED})
"""States of a job waiting to run: ``cancel`` and ``stop`` end them at once."""

UNFINISHED_JOB_STATES: Final = frozenset(JobState) - FINAL_JOB_STATES
"""States that count against a scope's queue bound: every job not yet final.  A retry or a
reclaim moves a job between these states, so it never grows the count, and the bound holds
exactly with only enqueues taking the scope's lock (docs/jobs.md)."""


def _refuse(job_id: str, state: str, event: str) -> JobStateError:
    return JobStateError(
        f"job {job_id!r}: event {event!r} does not apply to a {state} job",
        job_id=job_id,
        state=state,
        event=event,
    )


_Q, _R, _W, _B = JobState.QUEUED, JobState.RUNNING, JobState.RETRY_WAIT, JobState.BLOCKED
_C, _F, _X, _N = JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED, JobState.RECOVERY_REQUIRED

JOB_TRANSITIONS: Final = StateTable[JobState](
    {
        (_B, "unblock"): _Q,
        (_B, "dependency_failed"): _F,
        (_B, "cancel"): _X,
        (_B, "stop"): _X,
        (_Q, "claim"): _R,
        (_Q, "cancel"): _X,
        (_Q, "stop"): _X,
        (_W, "claim"): _R,
        (_W, "cancel"): _X,
        (_W, "stop"): _X,
        (_R, "reclaim"): _R,
        (_R, "complete"): _C,
        (_R, "recovered_after_publish"): _C,
        (_R, "inconsistent_publication"): _N,
        (_R, "recovery_exhausted"): _N,
        (_R, "retryable_failure"): _W,
        (_R, "attempts_exhausted"): _F,
        (_R, "fatal_failure"): _F,
        (_R, "cancelled_after_reconciliation"): _X,
        (_R, "stopped_before_restart"): _X,
        (_N, "resolve_completed"): _C,
        (_N, "resolve_failed"): _F,
    },
    refuse=_refuse,
)
"""Every job state change: (state, event) -> state (module docstring states the rules);
``JOB_TRANSITIONS.next_state`` refuses any other pair with :class:`JobStateError`."""


def initial_state(dependency_states: Sequence[str]) -> JobState:
    """``queued`` when every dependency has completed (or there is none), else ``blocked``."""
    done = all(state == JobState.COMPLETED for state in dependency_states)
    return JobState.QUEUED if done else JobState.BLOCKED


def job_diagram() -> str:
    """``JOB_TRANSITIONS`` as a Mermaid state diagram (``docs/jobs.md`` holds exactly this)."""
    lines = JOB_TRANSITIONS.mermaid([JobState.QUEUED, JobState.BLOCKED])
    return "\n".join(["```mermaid", *lines, "```"]) + "\n"


def find_cycle(edges: Mapping[str, Sequence[str]]) -> list[str] | None:
    """A dependency cycle in ``edges`` (job -> the jobs it depends on), as a path, or ``None``.

    The path starts and ends with the same job (``["a", "a"]`` for a
    self-cycle).  Iterative depth-first search, so a long chain cannot
    overflow the stack.
    """
    white, grey, black = 0, 1, 2
    colour: dict[str, int] = {}
    for root in sorted(edges):
        if colour.get(root, white) != white:
            continue
        stack: list[tuple[str, int]] = [(root, 0)]
        path: list[str] = [root]
        colour[root] = grey
        while stack:
            node, index = stack[-1]
            successors = list(edges.get(node, ()))
            if index < len(successors):
                stack[-1] = (node, index + 1)
                nxt = successors[index]
                state = colour.get(nxt, white)
                if state == grey:
                    return [*path[path.index(nxt) :], nxt]
                if state == white:
                    colour[nxt] = grey
                    stack.append((nxt, 0))
                    path.append(nxt)
            else:
                colour[node] = black
                stack.pop()
                path.pop()
    return None


@dataclass(frozen=True)
class PublishedResult:
    """One publication a target holds for a job: who published it and what."""

    job_id: str
    attempt_id: str
    result: bytes
    """The canonical encoding of the published result."""


PublicationVerdict = Literal["absent", "consistent", "inconsistent"]


def judge_publication(
    job_id: str, attempt_id: str, result: bytes, published: Sequence[PublishedResult]
) -> PublicationVerdict:
    """What the target's publications say about the result a job recorded before publishing.

    ``absent``: nothing is published (the publication never landed; replay it
    with the same ids).  ``consistent``: exactly one publication, by the
    recorded attempt, with the recorded canonical bytes.  Anything else (two
    publications, another attempt's, other bytes, another job's) is
    ``inconsistent``: only an operator can tell what the target now holds.
    """
    if not published:
        return "absent"
    if len(published) == 1:
        only = published[0]
        if (only.job_id, only.attempt_id, only.result) == (job_id, attempt_id, result):
            return "consistent"
    return "inconsistent"
