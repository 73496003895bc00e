"""The durable worker: scoped intake, the fenced write cycle, reconciliation, the outbox relay.

Worker contract §1-§3, §5: records are accepted into a queue, committed
``in_flight`` before every send, and settled only by an exact readback or an
operator; one owner at a time holds the queue (a file lock and a fenced lease).
``DurableWorker`` runs on any ``WorkerStore``: ``MemoryWorkerStore`` here,
``admission.sql.SqlWorkerStore`` on SQLite or PostgreSQL.
"""

from admission._files import FileLock, write_json_atomically
from admission.worker._intake import MAX_CONTENT, Intake, Scope, WorkerLimits, bounded_text, validate_record
from admission.worker._lease import QueueLease
from admission.worker._memory import MemoryWorkerStore
from admission.worker._observe import PollReport
from admission.worker._outbox import OUTBOX_EVENT, OutboxRelay, RelayReport, record_outbox
from admission.worker._states import (
    TERMINAL_WRITE_STATES,
    WAITING_WRITE_STATES,
    WRITE_TRANSITIONS,
    WriteState,
    after_before_write_error,
    write_diagram,
)
from admission.worker._store import (
    LeaseRow,
    WorkerEvent,
    WorkerRecord,
    WorkerStore,
    WorkerTransaction,
    WorkItem,
)
from admission.worker._targets import (
    DuplicateWriteError,
    Readback,
    SqliteTarget,
    StatusRead,
    Target,
    TargetRecord,
)
from admission.worker._worker import CRASH_POINTS, CycleReport, DurableWorker

__all__ = [
    "CRASH_POINTS",
    "MAX_CONTENT",
    "OUTBOX_EVENT",
    "TERMINAL_WRITE_STATES",
    "WAITING_WRITE_STATES",
    "WRITE_TRANSITIONS",
    "CycleReport",
    "DuplicateWriteError",
    "DurableWorker",
    "FileLock",
    "Intake",
    "LeaseRow",
    "MemoryWorkerStore",
    "OutboxRelay",
    "PollReport",
    "QueueLease",
    "Readback",
    "RelayReport",
    "Scope",
    "SqliteTarget",
    "StatusRead",
    "Target",
    "TargetRecord",
    "WorkItem",
    "WorkerEvent",
    "WorkerLimits",
    "WorkerRecord",
    "WorkerStore",
    "WorkerTransaction",
    "WriteState",
    "after_before_write_error",
    "bounded_text",
    "record_outbox",
    "validate_record",
    "write_diagram",
    "write_json_atomically",
]
