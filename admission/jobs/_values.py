"""The values of durable jobs and their validation (worker contract §1, §4), pure.

What a caller enqueues (:class:`Job`), what the job service answers
(:class:`EnqueueResult`, :class:`ClaimResult`, :class:`JobView`,
:class:`JobEvent`, :class:`Checkpoint`), what an owner holds (:class:`JobLease`,
:class:`Control`), the port to the target a result is published to
(:class:`Publisher`), and the bounds.  ``admission.jobs`` exports them.

Pure: no I/O, no clock, no SQLAlchemy.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Final, Literal, Protocol

from admission import _bounds as bounds
from admission.errors import AdmissionError, InvalidJobError
from admission.intent._encoding import Value, canonical_decode, canonical_encode
from admission.jobs._backoff import Backoff
from admission.jobs._states import PublishedResult

__all__ = [
    "DEFAULT_LEASE_SECONDS",
    "DEFAULT_MAX_ATTEMPTS",
    "DEFAULT_MAX_WAITING",
    "MAX_DIAGNOSTIC_BYTES",
    "MAX_ID_LENGTH",
    "MAX_PAYLOAD_BYTES",
    "MAX_SCOPE_LENGTH",
    "Checkpoint",
    "ClaimResult",
    "Control",
    "EnqueueResult",
    "Job",
    "JobEvent",
    "JobLease",
    "JobView",
    "Publisher",
    "bounded_diagnostic",
    "check_diagnostic",
    "check_text",
    "job_backoff",
    "validate_job",
]

DEFAULT_MAX_WAITING: Final = 128
"""Jobs a scope may hold that are not yet final (worker contract §1: 128 waiting items)."""

DEFAULT_MAX_ATTEMPTS: Final = 3
"""Attempts a job gets unless it says otherwise (worker contract §1)."""

MAX_ATTEMPTS_LIMIT: Final = 100
MAX_DIAGNOSTIC_BYTES: Final = bounds.TEXT
"""A stored diagnostic is at most 2 KiB of UTF-8 (worker contract §1)."""

DEFAULT_LEASE_SECONDS: Final = 30.0
"""How long a lease lives without a fenced write (judged on a monotonic clock)."""

MAX_ID_LENGTH: Final = bounds.JOB_ID
"""Job ids, kinds and owners, in characters (the width of their columns)."""
MAX_SCOPE_LENGTH: Final = bounds.NAME
MAX_PAYLOAD_BYTES: Final = 64 * 1024


# -- values ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Job:
    """What a caller enqueues.  ``payload`` is any canonically encodable value."""

    job_id: str
    scope: str
    kind: str
    payload: Value = None
    depends_on: tuple[str, ...] = ()
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    backoff: Backoff | None = None
    """The wait before each retry of this job; ``None``: the service's (``JobService(backoff=...)``)."""


@dataclass(frozen=True)
class EnqueueResult:
    """The answer to one enqueued job.

    ``enqueued``: written now.  ``duplicate``: the same id with the same
    canonical content exists (``state`` is its state; nothing written).
    ``conflict``: the id exists with other content (nothing written).
    ``aborted``: written nothing because another job of the same batch conflicted.
    """

    outcome: Literal["enqueued", "duplicate", "conflict", "aborted"]
    job_id: str
    state: str | None


@dataclass(frozen=True)
class JobView:
    """A job's row as an operator sees it."""

    job_id: str
    scope: str
    kind: str
    state: str
    reason: str
    attempts: int
    max_attempts: int
    fence: int
    paused: bool
    cancel_requested: bool
    stop_requested: bool
    checkpoint_step: int
    diagnostic: str | None
    depends_on: tuple[str, ...]
    not_before: datetime | None = None
    """While the job waits out a retry's backoff: it is not claimed before this time."""

    def to_dict(self) -> dict[str, object]:
        """Plain JSON-ready data (``not_before`` in ISO 8601, or null)."""
        not_before = None if self.not_before is None else self.not_before.isoformat()
        return {**vars(self), "depends_on": list(self.depends_on), "not_before": not_before}


@dataclass(frozen=True)
class JobLease:
    """Ownership of one attempt of a job.  Every write of the owner carries ``fence``."""

    job_id: str
    fence: int
    attempt_id: str
    attempt_number: int
    owner: str
    kind: str
    payload: Value
    resume_step: int
    """The last checkpointed step (0: none); the attempt resumes at ``resume_step + 1``."""
    resume_state: Value
    publish_attempt_id: str | None
    """Set when a result was recorded before a crash: this lease recovers, never re-executes."""
    publish_result: bytes | None
    deadline: float
    """The owner's own monotonic deadline: it stops writing to the outside after it."""


@dataclass(frozen=True)
class Control:
    """What a fenced write tells the owner: its new deadline and the requests made meanwhile."""

    deadline: float
    cancel_requested: bool
    stop_requested: bool


@dataclass(frozen=True)
class ClaimResult:
    """The answer to a claim.

    ``claimed``: ``lease`` is yours.  ``final``: the job is (now) completed,
    failed or cancelled; a duplicate delivery is acknowledged, nothing runs.
    ``not_claimable``: ``reason`` says why (``blocked``, ``paused``,
    ``lease_live``, ``recovery_required``, ``backoff``: a retry's wait has not ended;
    ``recovery_exhausted``: this claim found the job's recovery attempts at their
    bound and moved it to ``recovery_required`` instead of starting another;
    ``scope_busy``: another job of its scope is running, and a scope runs one job at a time).
    """

    outcome: Literal["claimed", "final", "not_claimable"]
    job_id: str
    state: str
    reason: str
    lease: JobLease | None = None


@dataclass(frozen=True)
class Checkpoint:
    """An immutable step checkpoint."""

    job_id: str
    step: int
    attempt_id: str
    fence: int
    state: Value
    recorded_at: datetime


@dataclass(frozen=True)
class JobEvent:
    """One row of ``worker_job_events``."""

    position: int
    job_id: str
    event: str
    from_state: str | None
    to_state: str
    reason: str
    fence: int | None
    attempt_id: str | None
    detail: str | None
    recorded_at: datetime


class Publisher(Protocol):
    """The port to the external target a job's result is published to.

    ``publish`` must make the result visible under ``job_id`` with the given
    ``attempt_id``; ``read_published`` returns every publication the target
    holds for the job, so a second one shows (``admission.jobs._target`` is a
    real local adapter).

    ``fence`` is the owner's fencing token (the runner always passes it).  The
    target keeps the highest token it has seen per job and, in the same
    transaction as the write, refuses a publication or a fenced read that
    carries a lower one with :class:`~admission.errors.JobFencedError`;
    a fenced read raises the job's token to its own.  That is what stops an
    old owner's late publication after the next owner's recovery read.
    """

    def publish(self, job_id: str, attempt_id: str, result: bytes, *, fence: int | None = None) -> None:
        """Publish ``result`` (canonical bytes) for the job, unless a newer owner has been here."""

    def read_published(self, job_id: str, *, fence: int | None = None) -> Sequence[PublishedResult]:
        """Every publication the target holds for ``job_id``, oldest first; raises its token to ``fence``."""


# -- validation (pure) ---------------------------------------------------------------------------------


def check_text(value: object, field: str, limit: int, job_id: str | None) -> str:
    """Refuse a value that is not a printable string of 1..``limit`` characters, naming ``field``."""
    if not isinstance(value, str):
        raise InvalidJobError(f"must be a string, got {type(value).__name__}", field=field, job_id=job_id)
    if not 1 <= len(value) <= limit:
        raise InvalidJobError(f"must be 1..{limit} characters, got {len(value)}", field=field, job_id=job_id)
    if not value.isprintable():
        raise InvalidJobError("must hold printable characters only", field=field, job_id=job_id)
    return value


def validate_job(job: Job) -> bytes:
    """Refuse a malformed job (naming the field and why); return its canonical content."""
    job_id = check_text(job.job_id, "job_id", MAX_ID_LENGTH, None)
    check_text(job.scope, "scope", MAX_SCOPE_LENGTH, job_id)
    check_text(job.kind, "kind", MAX_ID_LENGTH, job_id)
    if isinstance(job.max_attempts, bool) or not isinstance(job.max_attempts, int):
        raise InvalidJobError("must be an int", field="max_attempts", job_id=job_id)
    if not 1 <= job.max_attempts <= MAX_ATTEMPTS_LIMIT:
        raise InvalidJobError(
            f"must be 1..{MAX_ATTEMPTS_LIMIT}, got {job.max_attempts}", field="max_attempts", job_id=job_id
        )
    if not isinstance(job.depends_on, tuple):
        raise InvalidJobError("must be a tuple of job ids", field="depends_on", job_id=job_id)
    for dependency in job.depends_on:
        check_text(dependency, "depends_on", MAX_ID_LENGTH, job_id)
    if len(set(job.depends_on)) != len(job.depends_on):
        raise InvalidJobError("names a job twice", field="depends_on", job_id=job_id)
    if job_id in job.depends_on:
        # The smallest cycle (contract §4): refused before anything else is looked up.
        raise InvalidJobError(f"cycle {job_id} -> {job_id}", field="depends_on", job_id=job_id)
    if job.backoff is not None and not isinstance(job.backoff, Backoff):
        raise InvalidJobError("must be a Backoff or None", field="backoff", job_id=job_id)
    if job.backoff is not None:
        job.backoff.check(job_id)
    try:
        canonical_encode(job.payload, max_size=MAX_PAYLOAD_BYTES)
    except AdmissionError as exc:
        raise InvalidJobError(str(exc), field="payload", job_id=job_id) from exc
    content: dict[str, Value] = {
        "scope": job.scope,
        "kind": job.kind,
        "payload": job.payload,
        "depends_on": list[Value](sorted(job.depends_on)),
        "max_attempts": job.max_attempts,
    }
    if job.backoff is not None:
        # Only when set: the content of a job without one is what it was before backoffs existed.
        content["backoff"] = job.backoff.to_value()
    return canonical_encode(content, max_size=2 * MAX_PAYLOAD_BYTES)


def job_backoff(content: bytes) -> Backoff | None:
    """The backoff a job set for itself, read from its stored canonical content; ``None``: unset."""
    decoded = canonical_decode(content)
    stored = decoded.get("backoff") if isinstance(decoded, dict) else None
    return None if not isinstance(stored, dict) else Backoff.from_value(stored)


def check_diagnostic(diagnostic: str | None, job_id: str) -> None:
    """Refuse a diagnostic over :data:`MAX_DIAGNOSTIC_BYTES` of UTF-8, or one holding NUL."""
    if diagnostic is None:
        return
    if not isinstance(diagnostic, str):
        raise InvalidJobError("must be a string", field="diagnostic", job_id=job_id)
    try:
        size = len(diagnostic.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise InvalidJobError(
            f"must be valid text: a lone surrogate at index {exc.start}", field="diagnostic", job_id=job_id
        ) from exc
    if size > MAX_DIAGNOSTIC_BYTES:
        raise InvalidJobError(
            f"is {size} bytes of UTF-8, more than {MAX_DIAGNOSTIC_BYTES}", field="diagnostic", job_id=job_id
        )
    if "\x00" in diagnostic:
        raise InvalidJobError(
            f"must not contain NUL (at index {diagnostic.index(chr(0))})", field="diagnostic", job_id=job_id
        )


def bounded_diagnostic(text: str) -> str:
    """``text`` cut to fit :data:`MAX_DIAGNOSTIC_BYTES`, with a visible marker when cut (never silently).

    The password of any URL in it is masked first (``user:***@``: an exception's
    text may quote the URL it was given, and diagnostics are stored and printed);
    NUL and lone surrogates, which no backend stores, become U+FFFD; a cut
    keeps whole characters and ends with `` [truncated N bytes]``, where N is the
    number of UTF-8 bytes cut from that mended text (kept bytes + N = its length).
    """
    data = bounds.storable_text(bounds.mask_secrets(text)).encode("utf-8")
    if len(data) <= MAX_DIAGNOSTIC_BYTES:
        return data.decode("utf-8")
    # Room for the widest marker: N is at most len(data), so its digits never outgrow the reservation.
    room = MAX_DIAGNOSTIC_BYTES - len(f" [truncated {len(data)} bytes]")
    head = data[:room].decode("utf-8", "ignore")
    cut = len(data) - len(head.encode("utf-8"))
    return f"{head} [truncated {cut} bytes]"
