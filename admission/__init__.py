"""admission: safe retries of signals and updates for workflow engines.

A caller whose response was lost retries with the same command key; admission
answers with the original receipt instead of recording the command twice,
refuses a reused key whose intent changed, and says so plainly when it cannot
tell.

This facade re-exports the intent API, the admission service with its
in-memory and SQL stores, and the exception tree.  ``SqlStore`` loads on first
use, so that ``import admission`` does not load SQLAlchemy until a database is
needed.  The subsystems have faces of their own: ``admission.intent``,
``admission.receipts``, ``admission.worker``, ``admission.jobs``,
``admission.sql``, ``admission.http``, ``admission.client``,
``admission.testing`` and ``admission.telemetry`` (spans, metrics and the
``admission`` logger; docs/observability.md).
"""

from typing import TYPE_CHECKING

from admission.errors import (
    AdmissionError,
    BeforeWriteError,
    CodecError,
    CommandKeyError,
    EventLogMovedError,
    FencedError,
    InputError,
    InvalidCommandTypeError,
    InvalidJobError,
    InvalidRecordError,
    InvalidRequestIdError,
    InvalidValueError,
    JobFencedError,
    JobLockedError,
    JobQueueFullError,
    JobStateError,
    LeaseHeldError,
    OwnershipError,
    QueueFullError,
    RecordStateError,
    RequestIdAmbiguousError,
    RequestIdConflictError,
    ReservedRequestIdError,
    RetryableJobError,
    RunStateError,
    SchemaDriftError,
    SchemaRevisionError,
    ScopeMismatchError,
    StateError,
    StorageError,
    TargetError,
    TargetTimeoutError,
    UnknownCommandError,
    UnknownError,
    UnknownJobError,
    UnknownUpdateError,
    UnstampedSchemaError,
    UpdateFailedError,
    UpdateInProgressError,
    WorkerLockedError,
)
from admission.intent import (
    DEFAULT_MAX_SIZE,
    INTENT_VERSION,
    MAX_DEPTH,
    EncodedIntent,
    Value,
    arguments_digest,
    canonical_decode,
    canonical_encode,
    encode_intent,
    intent_digest,
    intent_record,
    normalize_request_id,
    receipt_token,
    validate_request_id,
)
from admission.receipts import Admission, AdmissionService, BatchCommand, Decision, MemoryStore, Once

if TYPE_CHECKING:
    from admission.sql import SqlStore

__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    # SqlStore needs SQLAlchemy, which the pure intent API does not.
    if name == "SqlStore":
        from admission.sql import SqlStore

        return SqlStore
    raise AttributeError(f"module 'admission' has no attribute {name!r}")


__all__ = [
    "DEFAULT_MAX_SIZE",
    "INTENT_VERSION",
    "MAX_DEPTH",
    "Admission",
    "AdmissionError",
    "AdmissionService",
    "BatchCommand",
    "BeforeWriteError",
    "CodecError",
    "CommandKeyError",
    "Decision",
    "EncodedIntent",
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
    "MemoryStore",
    "Once",
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
    "SqlStore",
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
    "Value",
    "WorkerLockedError",
    "__version__",
    "arguments_digest",
    "canonical_decode",
    "canonical_encode",
    "encode_intent",
    "intent_digest",
    "intent_record",
    "normalize_request_id",
    "receipt_token",
    "validate_request_id",
]
