"""The exception tree of admission.

Exceptions are for misuse and infrastructure; admission outcomes (fresh,
retained, conflict, ambiguous) are returned values, never raised.  Every
exception has a stable ``code``, carries its data as attributes and pickles
with them, so it can cross a process boundary unchanged.

The tree has one intermediate base per kind of failure, so a caller can
catch a kind without naming every subsystem's error::

    AdmissionError
    ├── InputError             refused input; nothing was written (``field`` names it)
    │   ├── InvalidValueError ── CodecError
    │   ├── InvalidRequestIdError, ReservedRequestIdError, InvalidCommandTypeError
    │   ├── InvalidRecordError, ScopeMismatchError          (the durable worker)
    │   └── InvalidJobError                                 (durable jobs)
    ├── StateError             the operation does not fit the current state
    │   ├── RunStateError, RecordStateError, JobStateError
    │   ├── QueueFullError ── JobQueueFullError             (past a bound: a refusal, never a drop)
    │   └── CommandKeyError                                 (the front door, ``Once``)
    │       ├── RequestIdConflictError, RequestIdAmbiguousError
    │       └── UpdateInProgressError (retryable), UpdateFailedError
    ├── UnknownError           no such update, command or job (a ``LookupError``)
    ├── OwnershipError         another owner holds it, or this owner was fenced out
    │   ├── WorkerLockedError, JobLockedError, LeaseHeldError
    │   └── FencedError ── JobFencedError
    ├── StorageError           the database failed or refused (retryable)
    ├── EventLogMovedError     the event log's transaction ids are another cluster's (not retryable)
    ├── SchemaRevisionError    the database is not at the revision this version reads
    │   ├── UnstampedSchemaError   admission's tables with no revision recorded: adopt them
    │   └── SchemaDriftError       adoption refused: the tables differ from the revision compared
    ├── TargetError            raised by a worker target adapter
    │   └── BeforeWriteError, TargetTimeoutError
    └── RetryableJobError      raised by a job step: the failure is transient

The HTTP client adds its own ``ClientError`` subtree in ``admission.client``:
its errors carry the client's ``Receipt``, and the client stays importable on
its own.

This module imports nothing else from admission.
"""

from __future__ import annotations

from typing import ClassVar

__all__ = [
    "AdmissionError",
    "BeforeWriteError",
    "CodecError",
    "CommandKeyError",
    "EventLogMovedError",
    "FencedError",
    "InputError",
    "InvalidCommandTypeError",
    "InvalidJobError",
    "InvalidRecordError",
    "InvalidRequestIdError",
    "InvalidValueError",
    "JobFencedError",
    "JobLockedError",
    "JobQueueFullError",
    "JobStateError",
    "LeaseHeldError",
    "OwnershipError",
    "QueueFullError",
    "RecordStateError",
    "RequestIdAmbiguousError",
    "RequestIdConflictError",
    "ReservedRequestIdError",
    "RetryableJobError",
    "RunStateError",
    "SchemaDriftError",
    "SchemaRevisionError",
    "ScopeMismatchError",
    "StateError",
    "StorageError",
    "TargetError",
    "TargetTimeoutError",
    "UnknownCommandError",
    "UnknownError",
    "UnknownJobError",
    "UnknownUpdateError",
    "UnstampedSchemaError",
    "UpdateFailedError",
    "UpdateInProgressError",
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


# -- input: refused before anything is written ----------------------------------------------------


class InputError(AdmissionError, ValueError):
    """Input was refused before anything was written; ``field`` names the input.

    Resending the same input cannot succeed.
    """

    code: ClassVar[str] = "input_invalid"

    def __init__(self, message: str, *, field: str) -> None:
        super().__init__(message)
        self.field = field


class InvalidValueError(InputError):
    """A value cannot be canonically encoded, or bytes are not canonical.

    ``field`` names the input that was refused (``"arguments"``, ``"name"``,
    ``"target"``, ``"value"`` or ``"data"``), ``path`` the offending value inside
    it (``$.items[3].price``), ``reason`` says why.  For decoding, ``offset`` is
    the byte offset of the refused item.
    """

    code: ClassVar[str] = "invalid_value"

    def __init__(
        self, reason: str, *, field: str = "value", path: str = "$", offset: int | None = None
    ) -> None:
        where = f"{field} at {path}" if path else field
        if offset is not None:
            where += f" (byte {offset})"
        super().__init__(f"{where}: {reason}", field=field)
        self.reason, self.path, self.offset = reason, path, offset


class CodecError(InvalidValueError):
    """An envelope or its blob was refused: unknown codec, bad base64, not
    canonical, not authentic.  ``codec`` names the codec (``None`` when the
    envelope itself is malformed); ``field`` is ``"input"``."""

    code: ClassVar[str] = "input_invalid"

    def __init__(self, reason: str, *, codec: str | None, path: str = "") -> None:
        super().__init__(reason, field="input", path=path)
        self.codec = codec


class InvalidRequestIdError(InputError):
    """A command key is not a string of 1..255 valid Unicode code points (contract §2.3)."""

    code: ClassVar[str] = "request_id_invalid"

    def __init__(self, reason: str, *, request_id: object = None) -> None:
        super().__init__(f"request_id: {reason}", field="request_id")
        self.reason, self.request_id = reason, request_id


class ReservedRequestIdError(InputError):
    """A caller's signal used the engine-reserved ``workflow-signal:`` prefix (contract §2.4)."""

    code: ClassVar[str] = "request_id_reserved"

    def __init__(self, reason: str, *, request_id: str) -> None:
        super().__init__(f"request_id: {reason}", field="request_id")
        self.reason, self.request_id = reason, request_id


class InvalidCommandTypeError(InputError):
    """A command type other than ``"signal"`` or ``"update"`` was given."""

    code: ClassVar[str] = "command_type_invalid"

    def __init__(self, command_type: object) -> None:
        super().__init__(
            f"command_type: must be 'signal' or 'update', got {command_type!r}", field="command_type"
        )
        self.command_type = command_type


class InvalidRecordError(InputError):
    """A record, scope or snapshot given to the worker is malformed (worker contract §1).

    ``field`` names the refused input (``"tenant"``, ``"source_key"``,
    ``"payload"``, ``"scope"``...), ``reason`` says why.  Nothing is written.
    """

    code: ClassVar[str] = "record_invalid"

    def __init__(self, reason: str, *, field: str) -> None:
        super().__init__(f"{field}: {reason}", field=field)
        self.reason = reason


class ScopeMismatchError(InputError):
    """A record outside the worker's scope, or a queue opened with another scope
    than the one pinned in the database (worker contract §1).  ``field`` names
    the first field that differs."""

    code: ClassVar[str] = "scope_mismatch"

    def __init__(self, message: str, *, field: str, queue: str) -> None:
        super().__init__(message, field=field)
        self.queue = queue


class InvalidJobError(InputError):
    """A job, or an argument of a job operation, is refused before anything is written.

    ``field`` names the refused input (``"job_id"``, ``"depends_on"``,
    ``"diagnostic"``, ...), ``reason`` says why, ``job_id`` is the job concerned.
    """

    code: ClassVar[str] = "job_invalid"

    def __init__(self, reason: str, *, field: str, job_id: str | None = None) -> None:
        super().__init__(f"{field}: {reason}", field=field)
        self.reason, self.job_id = reason, job_id


# -- state: the operation does not fit what is stored ---------------------------------------------


class StateError(AdmissionError, RuntimeError):
    """An operation does not fit the current state of what it acts on.

    ``state`` is that state as stored (``None`` when unknown).  Every state
    machine refuses a transition it does not hold with a subclass of this
    (the one rule of ``admission._table.StateTable.next_state``).
    """

    code: ClassVar[str] = "state"

    def __init__(self, message: str, *, state: str | None) -> None:
        super().__init__(message)
        self.state = state


class RunStateError(StateError):
    """A run-lifecycle call does not fit the run's state (starting an open
    instance again, closing a run that is not open, completing a finished
    update differently).  ``reason`` is a stable word; ``run_id`` the run."""

    code: ClassVar[str] = "run_state"

    def __init__(self, message: str, *, reason: str, run_id: str | None, state: str | None = None) -> None:
        super().__init__(message, state=state)
        self.reason, self.run_id = reason, run_id


class RecordStateError(StateError):
    """An operation does not fit the record's state (resolving a record that is
    not ``uncertain``, observing one that is not confirmed), or the record is
    unknown.  ``state`` is the record's state, ``None`` for an unknown record."""

    code: ClassVar[str] = "record_state"

    def __init__(self, message: str, *, write_id: str | None, state: str | None) -> None:
        super().__init__(message, state=state)
        self.write_id = write_id


class JobStateError(StateError):
    """An event does not apply to the job's state (the job transition table has no such row)."""

    code: ClassVar[str] = "job_state"

    def __init__(self, message: str, *, job_id: str, state: str, event: str) -> None:
        super().__init__(message, state=state)
        self.job_id = job_id
        self.event = event


class QueueFullError(StateError):
    """A queue already holds ``limit`` waiting items; nothing was accepted
    (worker contract §1: past a bound a refusal, never a silent drop).
    ``queue`` names the queue, ``waiting`` is how many it holds when known."""

    code: ClassVar[str] = "queue_full"

    def __init__(self, message: str, *, queue: str, limit: int, waiting: int | None = None) -> None:
        super().__init__(message, state=None)
        self.queue, self.limit, self.waiting = queue, limit, waiting


class JobQueueFullError(QueueFullError):
    """A job scope already holds its bound of unfinished jobs (worker contract §1, §4): nothing
    was written.  A job scope is its queue: ``scope`` and ``queue`` are the same name."""

    code: ClassVar[str] = "job_queue_full"

    def __init__(self, message: str, *, scope: str, waiting: int, limit: int) -> None:
        super().__init__(message, queue=scope, limit=limit, waiting=waiting)
        self.scope = scope


# -- the front door (``Once``): a command key's answer as an exception -------------------------------


class CommandKeyError(StateError):
    """The front door could not run a handler under its command key, and says why.

    :class:`~admission.receipts.Once` turns the answers that are values for
    ``admit_update`` (a conflict, an ambiguity, an update still in progress
    or failed) into exceptions, because a decorated function has no other
    way to say them.  ``request_id`` is the key (kept as data, never in the
    message); ``update_id`` the retained update, when there is one;
    ``retryable`` whether the same call may succeed later.
    """

    code: ClassVar[str] = "command_key"
    retryable: ClassVar[bool] = False

    def __init__(
        self, message: str, *, request_id: str, update_id: str | None = None, state: str | None = None
    ) -> None:
        super().__init__(message, state=state)
        self.request_id, self.update_id = request_id, update_id


class RequestIdConflictError(CommandKeyError):
    """The key names an update of another intent (contract §4 ``request_id_conflict``); nothing
    was written.  ``conflict`` lists the parts that differ (``name``, ``arguments``,
    ``target``); ``retained_command_id`` and ``retained_outcome`` describe the receipt kept."""

    code: ClassVar[str] = "request_id_conflict"

    def __init__(
        self, message: str, *, request_id: str, conflict: tuple[str, ...], retained_command_id: str | None,
        retained_outcome: str | None,
    ) -> None:  # fmt: skip
        super().__init__(message, request_id=request_id)
        self.conflict = conflict
        self.retained_command_id = retained_command_id
        self.retained_outcome = retained_outcome


class RequestIdAmbiguousError(CommandKeyError):
    """The key cannot be proven to name one receipt (contract §6); nothing was written.
    ``ambiguity`` is the shape (``two-rows``, ``legacy-token``, ``modern-raw``)."""

    code: ClassVar[str] = "request_id_ambiguous"

    def __init__(self, message: str, *, request_id: str, ambiguity: str | None) -> None:
        super().__init__(message, request_id=request_id)
        self.ambiguity = ambiguity


class UpdateInProgressError(CommandKeyError):
    """Another call holds the key and its handler has not finished: this call did not run it.

    Retryable: retry later to get the recorded result.  An update whose
    handler died stays in progress until its in-progress expiry lets a retry
    take it over (never, without one).
    """

    code: ClassVar[str] = "update_in_progress"
    retryable: ClassVar[bool] = True


class UpdateFailedError(CommandKeyError):
    """The key's handler failed and the failure was kept (``on_failure="keep"``): a retry gets
    it again and never runs the handler.  ``failure`` is the recorded failure text."""

    code: ClassVar[str] = "update_failed"

    def __init__(self, message: str, *, request_id: str, update_id: str | None, failure: str | None) -> None:
        super().__init__(message, request_id=request_id, update_id=update_id, state="failed")
        self.failure = failure


# -- unknown: nothing of that name exists -----------------------------------------------------------


class UnknownError(AdmissionError, LookupError):
    """Nothing with the given id exists where it was looked for."""

    code: ClassVar[str] = "unknown"


class UnknownUpdateError(UnknownError):
    """No update with this id exists in this instance."""

    code: ClassVar[str] = "update_unknown"

    def __init__(self, message: str, *, update_id: str) -> None:
        super().__init__(message)
        self.update_id = update_id


class UnknownCommandError(UnknownError):
    """No admitted command of the expected kind with this id exists in this instance."""

    code: ClassVar[str] = "command_unknown"

    def __init__(self, message: str, *, command_id: str) -> None:
        super().__init__(message)
        self.command_id = command_id


class UnknownJobError(UnknownError):
    """No job with this id exists."""

    code: ClassVar[str] = "job_unknown"

    def __init__(self, message: str, *, job_id: str) -> None:
        super().__init__(message)
        self.job_id = job_id


# -- ownership: exclusive owners and fencing (worker contract §3) -----------------------------------


class OwnershipError(AdmissionError, RuntimeError):
    """Another owner holds what this one asked to own, or this owner was fenced out."""

    code: ClassVar[str] = "ownership"


class WorkerLockedError(OwnershipError):
    """Another local worker holds the queue's file lock (worker contract §3)."""

    code: ClassVar[str] = "worker_locked"

    def __init__(self, message: str, *, lock_path: str) -> None:
        super().__init__(message)
        self.lock_path = lock_path


class JobLockedError(OwnershipError):
    """Another job runner on this machine holds the file lock of the job's scope (worker contract §3):
    this one claimed nothing and wrote nothing.  ``lock_path`` is the scope's lock file."""

    code: ClassVar[str] = "job_locked"

    def __init__(self, message: str, *, scope: str, lock_path: str) -> None:
        super().__init__(message)
        self.scope, self.lock_path = scope, lock_path


class LeaseHeldError(OwnershipError):
    """The queue's lease is held by a live owner, as far as this claimant's
    monotonic clock can tell (worker contract §3).  ``holder`` names it."""

    code: ClassVar[str] = "lease_held"

    def __init__(self, message: str, *, queue: str, holder: str | None, token: int) -> None:
        super().__init__(message)
        self.queue, self.holder, self.token = queue, holder, token


class FencedError(OwnershipError):
    """The database refused a write carrying a fencing token that is no longer current:
    this owner's lease was taken over (worker contract §3).  ``token`` is the
    refused writer's token; ``queue`` the worker queue it wrote to, if any."""

    code: ClassVar[str] = "fenced"

    def __init__(self, message: str, *, token: int, queue: str | None = None) -> None:
        super().__init__(message)
        self.queue = queue
        self.token = token


class JobFencedError(FencedError):
    """The database refused a job write: the writer's fencing token is not the job's (worker contract §3).

    The lease was reclaimed by a newer owner (``current_fence`` > ``fence``),
    or the job left ``running``.  The writer must stop: it no longer owns the job.
    """

    code: ClassVar[str] = "job_fenced"

    def __init__(
        self, message: str, *, job_id: str, fence: int, current_fence: int | None, state: str | None
    ) -> None:
        super().__init__(message, token=fence)
        self.job_id, self.fence, self.current_fence, self.state = job_id, fence, current_fence, state


# -- infrastructure -----------------------------------------------------------------------------------


class StorageError(AdmissionError, RuntimeError):
    """The database failed or refused an operation; the driver's error is the cause.

    ``constraint`` names the violated constraint when there is one (its name
    on PostgreSQL, its columns on SQLite).
    """

    code: ClassVar[str] = "storage"

    def __init__(self, message: str, *, constraint: str | None = None) -> None:
        super().__init__(message)
        self.constraint = constraint


class EventLogMovedError(AdmissionError, RuntimeError):
    """A reader's ``cursor`` (tx_id, position) or the log's newest event is at or past ``next_tx_id``, the
    server's next transaction id: the log came from another cluster (docs/event-log.md).  Nothing was read.
    Not retryable: run ``admission db rebase-events``.  ``consumer`` names the reader when known."""

    code: ClassVar[str] = "event_log_moved"

    def __init__(
        self, message: str, *, cursor: tuple[int, int], next_tx_id: int, consumer: str | None = None
    ) -> None:
        super().__init__(message)
        self.cursor, self.next_tx_id, self.consumer = cursor, next_tx_id, consumer


class SchemaRevisionError(AdmissionError, RuntimeError):
    """The database schema is not the revision this version reads (contract §6).

    Nothing upgrades at start-up; the message names ``admission db upgrade``
    when an upgrade is the way forward.  ``revision`` is what the database has.
    """

    code: ClassVar[str] = "schema_revision_unsupported"

    def __init__(self, message: str, *, revision: str | None) -> None:
        super().__init__(message)
        self.revision = revision


class UnstampedSchemaError(SchemaRevisionError):
    """The database holds admission's tables but records no admission revision.

    An older engine that never used alembic leaves its tables so.  Nothing
    can tell their revision but their shape: ``admission db upgrade --adopt``
    compares them with revision ``0001`` and, on an exact match, stamps and
    upgrades them (docs/upgrading.md).  ``tables`` names the tables found.
    """

    code: ClassVar[str] = "schema_unstamped"

    def __init__(self, message: str, *, tables: tuple[str, ...]) -> None:
        super().__init__(message, revision=None)
        self.tables = tuple(tables)


class SchemaDriftError(SchemaRevisionError):
    """Adoption was refused: the tables differ from the revision they were compared with.

    ``compared_with`` is that revision; ``differences`` lists every
    difference, one readable line each (``workflow_runs: column id: type
    VARCHAR(64), revision 0001 has VARCHAR(36)``).  Nothing was
    changed.
    """

    code: ClassVar[str] = "schema_drift"

    def __init__(self, message: str, *, compared_with: str, differences: tuple[str, ...]) -> None:
        super().__init__(message, revision=None)
        self.compared_with, self.differences = compared_with, tuple(differences)


class TargetError(AdmissionError):
    """Raised by a worker target adapter about one write (worker contract §2)."""

    code: ClassVar[str] = "target"


class BeforeWriteError(TargetError, RuntimeError):
    """Raised by a target adapter only when the request provably was never
    dispatched; the one error that permits another send (worker contract §2)."""

    code: ClassVar[str] = "before_write"


class TargetTimeoutError(TargetError, TimeoutError):
    """A target did not answer in time; the write may or may not have landed."""

    code: ClassVar[str] = "target_timeout"


class RetryableJobError(AdmissionError, RuntimeError):
    """Raised by a job step to say the failure is transient: the job may run again (``retry_wait``)."""

    code: ClassVar[str] = "job_retryable"
