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
    "FencedError",
    "InvalidCommandTypeError",
    "InvalidJobError",
    "InvalidRequestIdError",
    "InvalidValueError",
    "JobQueueFullError",
    "JobStateError",
    "ReservedRequestIdError",
    "RetryableJobError",
    "RunStateError",
    "SchemaRevisionError",
    "StorageError",
    "UnknownCommandError",
    "UnknownJobError",
    "UnknownUpdateError",
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


class FencedError(AdmissionError, RuntimeError):
    """The database refused a job write: the writer's fencing token is not the job's (worker contract §3).

    The lease was reclaimed by a newer owner (``current_fence`` > ``fence``),
    or the job left ``running``.  The writer must stop: it no longer owns the job.
    """

    code: ClassVar[str] = "job_fenced"

    def __init__(
        self, message: str, *, job_id: str, fence: int, current_fence: int | None, state: str | None
    ) -> None:
        super().__init__(message)
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
