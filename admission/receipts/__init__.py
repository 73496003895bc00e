"""Receipts: the admission rules, the storage port with its in-memory store, and the service.

``AdmissionService`` admits signals and updates under command keys on any
``Store`` (``MemoryStore`` here, ``admission.sql.SqlStore`` on SQLite or
PostgreSQL) and answers with a typed ``Admission`` (contract §4, §5).
``admit_many`` admits a list of ``BatchCommand`` in one transaction, each answered as if
admitted alone.  ``Once`` runs a handler once per command key on top of it (``docs/once.md``).
"""

from admission.receipts._answers import HistoryEvent, PruneReport, RunInfo
from admission.receipts._batch import BatchCommand
from admission.receipts._memory import MemoryStore

# _observed wraps the service's writing methods with spans, metrics and log lines (docs/observability.md).
from admission.receipts._observed import AdmissionService
from admission.receipts._once import Attempt, Once, OnFailure, failure_name
from admission.receipts._rules import (
    CLOSE_EVENTS,
    IN_PROGRESS_EXPIRED,
    RUN_TRANSITIONS,
    SIGNAL_TRANSITIONS,
    UPDATE_TRANSITIONS,
    Admission,
    CommandType,
    Decision,
    Intent,
    ReceiptJudgement,
    RunStatus,
    SignalStatus,
    StoredReceipt,
    TargetJudgement,
    UpdateStatus,
    closing_event,
    http_status,
    json_value,
    judge_receipts,
    judge_target,
    lifecycle_diagram,
    may_take_over,
    select_receipt,
)
from admission.receipts._sealed import SealedArguments, sealed_max_size
from admission.receipts._service import DEFAULT_RETENTION_DAYS, utc_now
from admission.receipts._store import (
    CommandRow,
    EventCursor,
    EventRow,
    InstanceRow,
    KeyedLocking,
    LockedInstance,
    PruneCounts,
    PruneTarget,
    RunRow,
    Store,
    UpdateRow,
    insert_stepwise,
)

__all__ = [
    "CLOSE_EVENTS",
    "DEFAULT_RETENTION_DAYS",
    "IN_PROGRESS_EXPIRED",
    "RUN_TRANSITIONS",
    "SIGNAL_TRANSITIONS",
    "UPDATE_TRANSITIONS",
    "Admission",
    "AdmissionService",
    "Attempt",
    "BatchCommand",
    "CommandRow",
    "CommandType",
    "Decision",
    "EventCursor",
    "EventRow",
    "HistoryEvent",
    "InstanceRow",
    "Intent",
    "KeyedLocking",
    "LockedInstance",
    "MemoryStore",
    "OnFailure",
    "Once",
    "PruneCounts",
    "PruneReport",
    "PruneTarget",
    "ReceiptJudgement",
    "RunInfo",
    "RunRow",
    "RunStatus",
    "SealedArguments",
    "SignalStatus",
    "Store",
    "StoredReceipt",
    "TargetJudgement",
    "UpdateRow",
    "UpdateStatus",
    "closing_event",
    "failure_name",
    "http_status",
    "insert_stepwise",
    "json_value",
    "judge_receipts",
    "judge_target",
    "lifecycle_diagram",
    "may_take_over",
    "sealed_max_size",
    "select_receipt",
    "utc_now",
]
