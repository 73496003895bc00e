"""SQL persistence: the engine, the adapters of every port, the schema and its migrations.

The only subpackage that names a dialect.  SQLite is the embedded default;
PostgreSQL is the server.  Driver errors become admission errors at one
boundary, keeping the cause.

Auditing: ``audit`` re-verifies every stored digest, event and reference,
read-only, in one snapshot (``admission db check --deep``, docs/cli.md).

Migrations: ``upgrade`` and ``downgrade`` move a stamped database between
revisions; ``adopt`` takes on admission's tables that an older engine left
with no stamp, after comparing them with revision ``0001`` (docs/upgrading.md).
"""

from admission.sql._adopt import ADOPTED_REVISION, AdoptionReport, adopt
from admission.sql._audit import (
    DEFAULT_AUDIT_BATCH,
    DEFAULT_MAX_FINDINGS,
    FINDING_KINDS,
    AuditReport,
    Finding,
    audit,
)
from admission.sql._connections import READ_CONNECTIONS, REPLAN_AFTER, WRITE_CONNECTIONS
from admission.sql._engine import (
    CONNECTIONS_PARAMETER,
    DEFAULT_CONNECTIONS,
    DEFAULT_URL,
    SQLITE_BUSY_TIMEOUT_MS,
    SQLITE_WAL_AUTOCHECKPOINT,
    async_url,
    constraint_name,
    create_admission_engine,
    create_async_admission_engine,
    create_awaited_engine,
    insert_or_ignore,
    masked_url,
    normalize_url,
    schema_of,
    wrap_exceptions,
)
from admission.sql._event_log import EventLogRebase, rebase_event_log
from admission.sql._host import ADMISSION_TABLES, host_include_object, prepare_host_database
from admission.sql._jobs import SqlJobStore
from admission.sql._migrate import alembic_config, downgrade, revision_of, upgrade, upgrade_sql
from admission.sql._pooler import POOLER_PARAMETER, POOLERS, pooler_of
from admission.sql._raw import BulkInsert, BulkStatement, RawStatement
from admission.sql._receipts import SqlStore
from admission.sql._revisions import (
    BRANCH_LABEL,
    HEAD_REVISION,
    KNOWN_REVISIONS,
    VERSION_TABLE,
    Stamp,
    StampPlace,
    check_revision,
    current_revision,
    find_stamp,
)
from admission.sql._schema import (
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
from admission.sql._times import as_utc
from admission.sql._worker import SqlWorkerStore

__all__ = [
    "ADMISSION_TABLES",
    "ADOPTED_REVISION",
    "BRANCH_LABEL",
    "CONNECTIONS_PARAMETER",
    "DEFAULT_AUDIT_BATCH",
    "DEFAULT_CONNECTIONS",
    "DEFAULT_MAX_FINDINGS",
    "DEFAULT_URL",
    "FINDING_KINDS",
    "HEAD_REVISION",
    "KNOWN_REVISIONS",
    "POOLERS",
    "POOLER_PARAMETER",
    "READ_CONNECTIONS",
    "REPLAN_AFTER",
    "SQLITE_BUSY_TIMEOUT_MS",
    "SQLITE_WAL_AUTOCHECKPOINT",
    "VERSION_TABLE",
    "WRITE_CONNECTIONS",
    "AdoptionReport",
    "AuditReport",
    "BulkInsert",
    "BulkStatement",
    "EventLogRebase",
    "Finding",
    "RawStatement",
    "SqlJobStore",
    "SqlStore",
    "SqlWorkerStore",
    "Stamp",
    "StampPlace",
    "adopt",
    "alembic_config",
    "as_utc",
    "async_url",
    "audit",
    "check_revision",
    "constraint_name",
    "create_admission_engine",
    "create_async_admission_engine",
    "create_awaited_engine",
    "current_revision",
    "downgrade",
    "find_stamp",
    "host_include_object",
    "insert_or_ignore",
    "masked_url",
    "metadata",
    "normalize_url",
    "outbox_cursors",
    "pooler_of",
    "prepare_host_database",
    "rebase_event_log",
    "revision_of",
    "schema_of",
    "upgrade",
    "upgrade_sql",
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
