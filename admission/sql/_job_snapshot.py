"""A snapshot of the job tables at one instant, for :meth:`SqlJobStore.snapshot` (contract §6).

Five reads make a :class:`~admission.jobs.JobsSnapshot`: the jobs, their
dependencies, their checkpoints (digested row by row: the states themselves
never leave this module), their latest attempts, and the counts by state.
:func:`read_snapshot` runs them all in ONE read transaction, so that they
describe one state of the database:

* PostgreSQL: ``REPEATABLE READ``, read-only.  Its snapshot is taken at the
  first statement and kept to the end (``READ COMMITTED``, the default, would
  take a new one per statement, and a checkpoint committed between the read of
  the jobs and the read of the checkpoints would show).  Read-only: it takes no
  row lock, so no writer waits for it, and it cannot be refused for a
  serialisation conflict.
* SQLite: the engine begins a reader's transaction with a deferred ``BEGIN``;
  in WAL mode its read snapshot starts at the first ``SELECT`` and lasts until
  the transaction ends, whatever writers commit meanwhile (they do not wait for it).

:func:`read_all` runs the five reads each on the connection a callable hands
it: :func:`read_snapshot` hands them all the same one, inside one transaction;
a test hands each a transaction of its own, and shows that the invariants a
snapshot keeps (every job's checkpoints are steps ``1..checkpoint_step``, the
counts are the tally of the jobs) catch a read that was not one instant.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any, Final

from sqlalchemy import Engine, Select, bindparam, func, select
from sqlalchemy.engine import Connection

from admission.jobs._store import (
    AttemptRow,
    CheckpointDigest,
    JobsSnapshot,
    SnapshotJob,
    snapshot_order,
)
from admission.sql._engine import is_postgresql, wrap_exceptions
from admission.sql._schema import (
    worker_job_attempts,
    worker_job_checkpoints,
    worker_job_dependencies,
    worker_jobs,
)
from admission.sql._times import as_utc, utc_or_none

__all__ = ["SnapshotReads", "assemble", "one_instant", "read_all", "read_snapshot"]

_JOBS: Final = worker_jobs.c
_DEPENDENCIES: Final = worker_job_dependencies.c
_CHECKPOINTS: Final = worker_job_checkpoints.c
_ATTEMPTS: Final = worker_job_attempts.c
_IN_SCOPE: Final = _JOBS.scope == bindparam("b_scope")

# Not the payload, the content or the recorded result: they may hold secrets,
# and a snapshot is for people and dashboards.  Whether a result is recorded is
# all it says of the last.
_SNAPSHOT_JOBS: Final = select(
    *(c for c in worker_jobs.c if c.name not in ("payload", "content", "publish_result", "beat")),
    _JOBS.publish_result.is_not(None).label("result_recorded"),
)
_SNAPSHOT_DEPENDENCIES: Final = select(_DEPENDENCIES.job_id, _DEPENDENCIES.depends_on).join(
    worker_jobs, _JOBS.job_id == _DEPENDENCIES.job_id
)
_SNAPSHOT_CHECKPOINTS: Final = (
    select(worker_job_checkpoints)
    .join(worker_jobs, _JOBS.job_id == _CHECKPOINTS.job_id)
    .order_by(_CHECKPOINTS.job_id, _CHECKPOINTS.step)
)
_LATER: Final = worker_job_attempts.alias("later")
_SNAPSHOT_ATTEMPTS: Final = (
    select(worker_job_attempts)
    .join(worker_jobs, _JOBS.job_id == _ATTEMPTS.job_id)
    .where(
        _ATTEMPTS.number
        == select(func.max(_LATER.c.number)).where(_LATER.c.job_id == _ATTEMPTS.job_id).scalar_subquery()
    )
)
_SNAPSHOT_COUNTS: Final = select(_JOBS.state, func.count()).group_by(_JOBS.state)
_CHECKPOINT_BATCH: Final = 64
"""Checkpoint rows fetched at a time: each state is up to 64 KiB, and is digested, then dropped."""


def _scoped(statement: Select[Any], scope: str | None) -> Select[Any]:
    return statement if scope is None else statement.where(_IN_SCOPE)


def _params(scope: str | None) -> dict[str, str]:
    return {} if scope is None else {"b_scope": scope}


@dataclass(frozen=True)
class SnapshotReads:
    """What the five reads found, before it is put together (:func:`assemble`)."""

    jobs: list[Mapping[str, Any]]
    depends_on: dict[str, list[str]]
    checkpoints: dict[str, list[CheckpointDigest]]
    attempts: dict[str, AttemptRow]
    counts: dict[str, int]


def read_jobs(conn: Connection, scope: str | None) -> list[Mapping[str, Any]]:
    """The jobs' rows (without payload, content and result), as plain mappings."""
    return [dict(row) for row in conn.execute(_scoped(_SNAPSHOT_JOBS, scope), _params(scope)).mappings()]


def read_dependencies(conn: Connection, scope: str | None) -> dict[str, list[str]]:
    """The ids each job depends on."""
    found: dict[str, list[str]] = defaultdict(list)
    for job_id, depends_on in conn.execute(_scoped(_SNAPSHOT_DEPENDENCIES, scope), _params(scope)):
        found[str(job_id)].append(str(depends_on))
    return found


def read_checkpoints(conn: Connection, scope: str | None) -> dict[str, list[CheckpointDigest]]:
    """The digest of every checkpoint, by job and step; the states are streamed, never all held."""
    found: dict[str, list[CheckpointDigest]] = defaultdict(list)
    statement = _scoped(_SNAPSHOT_CHECKPOINTS, scope).execution_options(yield_per=_CHECKPOINT_BATCH)
    for row in conn.execute(statement, _params(scope)).mappings():
        job_id = str(row["job_id"])
        found[job_id].append(
            CheckpointDigest.of(
                job_id,
                int(row["step"]),
                str(row["attempt_id"]),
                int(row["fence"]),
                bytes(row["state"]),
                as_utc(row["recorded_at"]),
            )
        )
    return found


def read_attempts(conn: Connection, scope: str | None) -> dict[str, AttemptRow]:
    """Each job's latest attempt (the one with the highest number)."""
    return {
        str(r["job_id"]): AttemptRow(
            attempt_id=str(r["attempt_id"]),
            job_id=str(r["job_id"]),
            number=int(r["number"]),
            fence=int(r["fence"]),
            owner=str(r["owner"]),
            started_at=as_utc(r["started_at"]),
            ended_at=utc_or_none(r["ended_at"]),
            outcome=r["outcome"],
            diagnostic=r["diagnostic"],
        )
        for r in conn.execute(_scoped(_SNAPSHOT_ATTEMPTS, scope), _params(scope)).mappings()
    }


def read_counts(conn: Connection, scope: str | None) -> dict[str, int]:
    """How many jobs are in each state, counted by the database (not from the jobs read)."""
    rows = conn.execute(_scoped(_SNAPSHOT_COUNTS, scope), _params(scope))
    return {str(state): int(n) for state, n in rows}


def _job(row: Mapping[str, Any], found: SnapshotReads) -> SnapshotJob:
    job_id = str(row["job_id"])
    return SnapshotJob(
        job_id=job_id,
        scope=row["scope"],
        position=int(row["position"]),
        kind=row["kind"],
        state=row["state"],
        reason=row["reason"],
        max_attempts=int(row["max_attempts"]),
        attempts=int(row["attempts"]),
        fence=int(row["fence"]),
        owner=row["owner"],
        attempt_id=row["attempt_id"],
        paused=bool(row["paused"]),
        cancel_requested=bool(row["cancel_requested"]),
        stop_requested=bool(row["stop_requested"]),
        checkpoint_step=int(row["checkpoint_step"]),
        result_recorded=bool(row["result_recorded"]),
        diagnostic=row["diagnostic"],
        created_at=as_utc(row["created_at"]),
        updated_at=as_utc(row["updated_at"]),
        not_before=utc_or_none(row["not_before"]),
        depends_on=tuple(sorted(found.depends_on.get(job_id, ()))),
        checkpoints=tuple(found.checkpoints.get(job_id, ())),
        last_attempt=found.attempts.get(job_id),
    )


def assemble(scope: str | None, found: SnapshotReads) -> JobsSnapshot:
    """The snapshot the reads make: jobs by scope (code points: the same on every backend) and position."""
    jobs = sorted((_job(row, found) for row in found.jobs), key=snapshot_order)
    return JobsSnapshot(scope, tuple(jobs), found.counts)


@contextmanager
def one_instant(engine: Engine) -> Iterator[Connection]:
    """One read transaction whose reads all see one state of the database (see the module docstring)."""
    with engine.connect() as conn:
        if is_postgresql(engine.dialect):
            conn = conn.execution_options(isolation_level="REPEATABLE READ", postgresql_readonly=True)
        with conn.begin() as transaction:
            yield conn
            transaction.rollback()  # it wrote nothing; nothing to commit


def read_all(
    connection: Callable[[], AbstractContextManager[Connection]], scope: str | None
) -> SnapshotReads:
    """The five reads, in this order, each on the connection ``connection()`` hands it."""
    with connection() as conn:
        jobs = read_jobs(conn, scope)
    with connection() as conn:
        depends_on = read_dependencies(conn, scope)
    with connection() as conn:
        checkpoints = read_checkpoints(conn, scope)
    with connection() as conn:
        attempts = read_attempts(conn, scope)
    with connection() as conn:
        counts = read_counts(conn, scope)
    return SnapshotReads(jobs, depends_on, checkpoints, attempts, counts)


def read_snapshot(engine: Engine, scope: str | None) -> JobsSnapshot:
    """Every job of ``scope`` (all when ``None``), read in one read transaction on ``engine``."""
    with wrap_exceptions(engine.dialect), one_instant(engine) as conn:
        found = read_all(lambda: nullcontext(conn), scope)
    return assemble(scope, found)
