"""Durable jobs: fenced claims, checkpoints, recovery after publish (worker contract §3, §4).

``JobService`` runs the job lifecycle on any ``JobStore`` (the port):
``MemoryJobStore`` here, ``admission.sql.SqlJobStore`` on SQLite or
PostgreSQL; ``JobRunner`` executes jobs step by step and publishes their
results through a ``Publisher``; a retried job waits a ``Backoff`` first;
``JobService.export_snapshot`` writes every job of a scope, read at one
instant, to a JSON file atomically.
"""

from admission.jobs._backoff import DEFAULT_BACKOFF, MAX_BACKOFF_SECONDS, NO_BACKOFF, Backoff
from admission.jobs._memory import MemoryJobStore
from admission.jobs._runner import Continue, Finish, JobRunner, RunReport, StepHandler
from admission.jobs._service import JobService
from admission.jobs._states import (
    FINAL_JOB_STATES,
    JOB_TRANSITIONS,
    UNFINISHED_JOB_STATES,
    WAITING_JOB_STATES,
    JobState,
    PublicationVerdict,
    PublishedResult,
    find_cycle,
    initial_state,
    job_diagram,
    judge_publication,
)
from admission.jobs._store import (
    AttemptRow,
    CheckpointDigest,
    JobRow,
    JobsSnapshot,
    JobStore,
    JobTransaction,
    SnapshotJob,
)
from admission.jobs._target import LocalPublisher
from admission.jobs._values import (
    DEFAULT_LEASE_SECONDS,
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_MAX_WAITING,
    MAX_DIAGNOSTIC_BYTES,
    MAX_ID_LENGTH,
    MAX_PAYLOAD_BYTES,
    Checkpoint,
    ClaimResult,
    Control,
    EnqueueResult,
    Job,
    JobEvent,
    JobLease,
    JobView,
    Publisher,
    bounded_diagnostic,
    validate_job,
)

__all__ = [
    "DEFAULT_BACKOFF",
    "DEFAULT_LEASE_SECONDS",
    "DEFAULT_MAX_ATTEMPTS",
    "DEFAULT_MAX_WAITING",
    "FINAL_JOB_STATES",
    "JOB_TRANSITIONS",
    "MAX_BACKOFF_SECONDS",
    "MAX_DIAGNOSTIC_BYTES",
    "MAX_ID_LENGTH",
    "MAX_PAYLOAD_BYTES",
    "NO_BACKOFF",
    "UNFINISHED_JOB_STATES",
    "WAITING_JOB_STATES",
    "AttemptRow",
    "Backoff",
    "Checkpoint",
    "CheckpointDigest",
    "ClaimResult",
    "Continue",
    "Control",
    "EnqueueResult",
    "Finish",
    "Job",
    "JobEvent",
    "JobLease",
    "JobRow",
    "JobRunner",
    "JobService",
    "JobState",
    "JobStore",
    "JobTransaction",
    "JobView",
    "JobsSnapshot",
    "LocalPublisher",
    "MemoryJobStore",
    "PublicationVerdict",
    "PublishedResult",
    "Publisher",
    "RunReport",
    "SnapshotJob",
    "StepHandler",
    "bounded_diagnostic",
    "find_cycle",
    "initial_state",
    "job_diagram",
    "judge_publication",
    "validate_job",
]
