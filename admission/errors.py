"""The exception tree of admission.

Exceptions are for misuse and infrastructure; admission outcomes (fresh,
retained, conflict, ambiguous) are returned values, never raised.  Every
exception has a stable ``code``, carries its data as attributes and pickles
with them, so it can cross a process boundary unchanged.

This module imports nothing else from admission.
"""

from __future__ import annotations

from typing import ClassVar

__all__ = [
    "AdmissionError",
    "BeforeWriteError",
    "FencedError",
    "InvalidCommandTypeError",
    "InvalidJobError",
    "InvalidRecordError",
    "InvalidRequestIdError",
    "InvalidValueError",
    "JobFencedError",
    "JobQueueFullError",
    "JobStateError",
    "LeaseHeldError",
    "QueueFullError",
    "RecordStateError",
    "ReservedRequestIdError",
    "RetryableJobError",
    "RunStateError",
    "SchemaRevisionError",
    "ScopeMismatchError",
    "StorageError",
    "TargetTimeoutError",
    "UnknownCommandError",
    "UnknownJobError",
    "UnknownUpdateError",
    "WorkerLockedError",
]


def _restore(cls: type[AdmissionError], message: str, state: dict[str, object]) -> AdmissionError:
    error = cls.__new__(cls)
    Exception.__init__(error, message)
    error.message = message
    error.__dict__.update(state)
    return error


class AdmissionError(Exception):
    """Base class of every error admission raises on purpose."""

    code: ClassVar[str] = "admission_error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message

    def __reduce__(self) -> tuple[object, ...]:
        # Keyword-only attributes would be lost by Exception's default pickling,
        # which replays only ``args``.
        state = {k: v for k, v in self.__dict__.items() if k != "message"}
        return (_restore, (type(self), self.message, state))


class InvalidValueError(AdmissionError, ValueError):
    """A value cannot be canonically encoded, or bytes are not canonical.

    ``field`` names the input that was refused (``"arguments"``, ``"name"``,
    ``"target"``, ``"value"`` or ``"data"``), ``path`` the offending value inside
    it (``$.items[3].price``), ``reason`` says why.  For decoding, ``offset`` is
    the byte offset of the refused item.
    """

    code: ClassVar[str] = "invalid_value"

    def __init__(
        self,
        reason: str,
        *,
        field: str = "value",
        path: str = "$",
        offset: int | None = None,
    ) -> None:
        where = f"{field} at {path}" if path else field
        if offset is not None:
            where += f" (byte {offset})"
        super().__init__(f"{where}: {reason}")
        self.reason = reason
        self.field = field
        self.path = path
        self.offset = offset


class InvalidRequestIdError(AdmissionError, ValueError):
    """A command key is not a string of 1..255 valid Unicode code points (contract §2.3)."""

    code: ClassVar[str] = "request_id_invalid"

    def __init__(self, reason: str, *, request_id: object = None) -> None:
        super().__init__(f"request_id: {reason}")
        self.reason = reason
        self.field = "request_id"
        self.request_id = request_id


class ReservedRequestIdError(AdmissionError, ValueError):
    """A caller's signal used the engine-reserved ``workflow-signal:`` prefix (contract §2.4)."""

    code: ClassVar[str] = "request_id_reserved"

    def __init__(self, reason: str, *, request_id: str) -> None:
        super().__init__(f"request_id: {reason}")
        self.reason = reason
        self.field = "request_id"
        self.request_id = request_id


class InvalidCommandTypeError(AdmissionError, ValueError):
    """A command type other than ``"signal"`` or ``"update"`` was given."""

    code: ClassVar[str] = "command_type_invalid"

    def __init__(self, command_type: object) -> None:
        super().__init__(f"command_type: must be 'signal' or 'update', got {command_type!r}")
        self.field = "command_type"
        self.command_type = command_type


class SchemaRevisionError(AdmissionError, RuntimeError):
    """The database schema is not the revision this version reads (contract §6).

    Nothing upgrades at start-up; the message names ``admission db upgrade``
    when an upgrade is the way forward.  ``revision`` is what the database has.
    """

    code: ClassVar[str] = "schema_revision_unsupported"

    def __init__(self, message: str, *, revision: str | None) -> None:
        super().__init__(message)
        self.revision = revision


class RunStateError(AdmissionError, RuntimeError):
    """A run-lifecycle call does not fit the run's state (starting an open
    instance again, closing a run that is not open, completing a finished
    update differently).  ``reason`` is a stable word; ``run_id`` the run."""

    code: ClassVar[str] = "run_state"

    def __init__(self, message: str, *, reason: str, run_id: str | None) -> None:
        super().__init__(message)
        self.reason = reason
        self.run_id = run_id


class UnknownUpdateError(AdmissionError, LookupError):
    """No update with this id exists in this instance."""

    code: ClassVar[str] = "update_unknown"

    def __init__(self, message: str, *, update_id: str) -> None:
        super().__init__(message)
        self.update_id = update_id


class StorageError(AdmissionError, RuntimeError):
    """The database failed or refused an operation; the driver's error is the cause.

    ``constraint`` names the violated constraint when there is one (its name
    on PostgreSQL, its columns on SQLite).
    """

    code: ClassVar[str] = "storage"

    def __init__(self, message: str, *, constraint: str | None = None) -> None:
        super().__init__(message)
        self.constraint = constraint


class UnknownCommandError(AdmissionError, LookupError):
    """No admitted command of the expected kind with this id exists in this instance."""

    code: ClassVar[str] = "command_unknown"

    def __init__(self, message: str, *, command_id: str) -> None:
        super().__init__(message)
        self.command_id = command_id


# -- the durable worker (worker contract) -------------------------------------------------


class InvalidRecordError(AdmissionError, ValueError):
    """A record, scope or snapshot given to the worker is malformed (worker contract §1).

    ``field`` names the refused input (``"tenant"``, ``"source_key"``,
    ``"payload"``, ``"scope"``...), ``reason`` says why.  Nothing is written.
    """

    code: ClassVar[str] = "record_invalid"

    def __init__(self, reason: str, *, field: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.reason = reason
        self.field = field


class ScopeMismatchError(AdmissionError, ValueError):
    """A record outside the worker's scope, or a queue opened with another scope
    than the one pinned in the database (worker contract §1).  ``field`` names
    the first field that differs."""

    code: ClassVar[str] = "scope_mismatch"

    def __init__(self, message: str, *, field: str, queue: str) -> None:
        super().__init__(message)
        self.field = field
        self.queue = queue


class QueueFullError(AdmissionError, RuntimeError):
    """The queue already holds ``limit`` waiting records; the record was not accepted
    (worker contract §1: past a bound a refusal, never a silent drop)."""

    code: ClassVar[str] = "queue_full"

    def __init__(self, message: str, *, queue: str, limit: int) -> None:
        super().__init__(message)
        self.queue = queue
        self.limit = limit


class RecordStateError(AdmissionError, RuntimeError):
    """An operation does not fit the record's state (resolving a record that is
    not ``uncertain``, observing one that is not confirmed), or the record is
    unknown.  ``state`` is the record's state, ``None`` for an unknown record."""

    code: ClassVar[str] = "record_state"

    def __init__(self, message: str, *, write_id: str | None, state: str | None) -> None:
        super().__init__(message)
        self.write_id = write_id
        self.state = state


class WorkerLockedError(AdmissionError, RuntimeError):
    """Another local worker holds the queue's file lock (worker contract §3)."""

    code: ClassVar[str] = "worker_locked"

    def __init__(self, message: str, *, lock_path: str) -> None:
        super().__init__(message)
        self.lock_path = lock_path


class LeaseHeldError(AdmissionError, RuntimeError):
    """The queue's lease is held by a live owner, as far as this claimant's
    monotonic clock can tell (worker contract §3).  ``holder`` names it."""

    code: ClassVar[str] = "lease_held"

    def __init__(self, message: str, *, queue: str, holder: str | None, token: int) -> None:
        super().__init__(message)
        self.queue = queue
        self.holder = holder
        self.token = token


class FencedError(AdmissionError, RuntimeError):
    """The database refused a write carrying a fencing token that is no longer the
    queue's current one: this worker's lease was taken over (worker contract §3)."""

    code: ClassVar[str] = "fenced"

    def __init__(self, message: str, *, queue: str, token: int) -> None:
        super().__init__(message)
        self.queue = queue
        self.token = token


class BeforeWriteError(AdmissionError, RuntimeError):
    """Raised by a target adapter only when the request provably was never
    dispatched; the one error that permits another send (worker contract §2)."""

    code: ClassVar[str] = "before_write"

    def __init__(self, message: str) -> None:
        super().__init__(message)


class TargetTimeoutError(AdmissionError, TimeoutError):
    """A target did not answer in time; the write may or may not have landed."""

    code: ClassVar[str] = "target_timeout"

    def __init__(self, message: str) -> None:
        super().__init__(message)
class InvalidJobError(AdmissionError, ValueError):
    """A job, or an argument of a job operation, is refused before anything is written.

    ``field`` names the refused input (``"job_id"``, ``"depends_on"``,
    ``"diagnostic"``, ...), ``reason`` says why, ``job_id`` is the job concerned.
    """

    code: ClassVar[str] = "job_invalid"

    def __init__(self, reason: str, *, field: str, job_id: str | None = None) -> None:
        super().__init__(f"{field}: {reason}")
        self.reason = reason
        self.field = field
        self.job_id = job_id


class JobQueueFullError(AdmissionError, RuntimeError):
    """A scope already holds its bound of waiting jobs (worker contract §1, §4): nothing was written."""

    code: ClassVar[str] = "job_queue_full"

    def __init__(self, message: str, *, scope: str, waiting: int, limit: int) -> None:
        super().__init__(message)
        self.scope = scope
        self.waiting = waiting
        self.limit = limit


class JobStateError(AdmissionError, RuntimeError):
    """An event does not apply to the job's state (the job transition table has no such row)."""

    code: ClassVar[str] = "job_state"

    def __init__(self, message: str, *, job_id: str, state: str, event: str) -> None:
        super().__init__(message)
        self.job_id = job_id
        self.state = state
        self.event = event


class JobFencedError(FencedError):
    """The database refused a job write: the writer's fencing token is not the job's (worker contract §3).

    The lease was reclaimed by a newer owner (``current_fence`` > ``fence``),
    or the job left ``running``.  The writer must stop: it no longer owns the job.
    """

    code: ClassVar[str] = "job_fenced"

    def __init__(
        self, message: str, *, job_id: str, fence: int, current_fence: int | None, state: str | None
    ) -> None:
        # A job's fence lives on its own row, not on a queue's lease: skip
        # FencedError's queue/token signature, keep its place in the tree.
        AdmissionError.__init__(self, message)
        self.job_id = job_id
        self.fence = fence
        self.current_fence = current_fence
        self.state = state


class UnknownJobError(AdmissionError, LookupError):
    """No job with this id exists."""

    code: ClassVar[str] = "job_unknown"

    def __init__(self, message: str, *, job_id: str) -> None:
        super().__init__(message)
        self.job_id = job_id


class RetryableJobError(AdmissionError, RuntimeError):
    """Raised by a job step to say the failure is transient: the job may run again (``retry_wait``)."""

    code: ClassVar[str] = "job_retryable"
