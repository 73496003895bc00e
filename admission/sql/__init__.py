"""SQL persistence: the engine, the adapters of every port, the schema and its migrations.

The only subpackage that names a dialect.  SQLite is the embedded default;
PostgreSQL is the server.  Driver errors become admission errors at one
boundary, keeping the cause.
"""

from admission.sql._connections import REPLAN_AFTER, WRITE_CONNECTIONS
from admission.sql._engine import (
    DEFAULT_URL,
    SQLITE_BUSY_TIMEOUT_MS,
    as_utc,
    constraint_name,
    create_admission_engine,
    insert_or_ignore,
    masked_url,
    normalize_url,
    wrap_exceptions,
)
from admission.sql._jobs import SqlJobStore
from admission.sql._migrate import alembic_config, downgrade, revision_of, upgrade
from admission.sql._raw import BulkInsert, BulkStatement, RawStatement
from admission.sql._receipts import SqlStore
from admission.sql._schema import (
    HEAD_REVISION,
    KNOWN_REVISIONS,
    check_revision,
    current_revision,
    metadata,
    outbox_cursors,
    worker_events,
    worker_job_attempts,
    worker_job_checkpoints,
    worker_job_dependencies,
    worker_job_events,
    worker_job_scopes,
    worker_jobs,
    worker_leases,
    worker_queues,
    worker_records,
    workflow_commands,
    workflow_history_events,
    workflow_instances,
    workflow_runs,
    workflow_updates,
)
from admission.sql._worker import SqlWorkerStore

__all__ = [
    "DEFAULT_URL",
    "HEAD_REVISION",
    "KNOWN_REVISIONS",
    "REPLAN_AFTER",
    "SQLITE_BUSY_TIMEOUT_MS",
    "WRITE_CONNECTIONS",
    "BulkInsert",
    "BulkStatement",
    "RawStatement",
    "SqlJobStore",
    "SqlStore",
    "SqlWorkerStore",
    "alembic_config",
    "as_utc",
    "check_revision",
    "constraint_name",
    "create_admission_engine",
    "current_revision",
    "downgrade",
    "insert_or_ignore",
    "masked_url",
    "metadata",
    "normalize_url",
    "outbox_cursors",
    "revision_of",
    "upgrade",
    "worker_events",
    "worker_job_attempts",
    "worker_job_checkpoints",
    "worker_job_dependencies",
    "worker_job_events",
    "worker_job_scopes",
    "worker_jobs",
    "worker_leases",
    "worker_queues",
    "worker_records",
    "workflow_commands",
    "workflow_history_events",
    "workflow_instances",
    "workflow_runs",
    "workflow_updates",
    "wrap_exceptions",
]
