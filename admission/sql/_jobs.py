"""The job store on SQLite (the embedded default) and PostgreSQL (worker contract §3, §4).

Implements :class:`~admission.jobs.JobStore` on the ``worker_job*`` tables
(revisions ``0004`` and ``0005``).  Every job transaction is a write transaction.
On PostgreSQL a scope is held with ``FOR UPDATE`` on its ``worker_job_scopes``
row (``claim_next``'s with ``FOR UPDATE SKIP LOCKED``, so that it never waits on
another claim or an enqueue), always before any job of it; a job with ``SELECT
... FOR UPDATE`` (``claim_next``'s with ``SKIP LOCKED``; its blocked dependents
with ``FOR UPDATE OF worker_jobs``, an enqueue's existing dependencies with ``FOR
SHARE``, in id order).  On SQLite the transaction begins ``BEGIN IMMEDIATE``
(``WRITE_OPTION``), which already excludes every other writer.  The owner's
fenced write is one conditional ``UPDATE worker_jobs ... WHERE job_id AND
fence AND state = 'running' ... RETURNING``: the database decides, and the
UPDATE holds the row until commit.

Driver errors become admission errors at the one boundary,
:func:`~admission.sql._engine.wrap_exceptions`: the transaction wears it
around the whole block (so every statement of :class:`_SqlJobTransaction` is
inside it), and every read wears it too.  Rows leave as frozen values
(:class:`~admission.jobs.JobRow`, ``JobView``, ``JobEvent``, ``Checkpoint``),
never as SQLAlchemy rows.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import fields
from datetime import datetime
from typing import Any, Final

from sqlalchemy import Engine, bindparam, case, func, insert, or_, select, update
from sqlalchemy.engine import Connection, RowMapping

from admission.errors import StorageError
from admission.intent._encoding import canonical_decode
from admission.jobs._states import UNFINISHED_JOB_STATES
from admission.jobs._store import AttemptRow, JobRow, JobsSnapshot, JobTransaction
from admission.jobs._values import Checkpoint, JobEvent, JobView
from admission.sql._engine import (
    DEFAULT_URL,
    WRITE_OPTION,
    create_admission_engine,
    insert_or_ignore,
    is_postgresql,
    wrap_exceptions,
)
from admission.sql._job_snapshot import read_snapshot
from admission.sql._revisions import check_revision
from admission.sql._schema import (
    worker_job_attempts,
    worker_job_checkpoints,
    worker_job_dependencies,
    worker_job_events,
    worker_job_scopes,
    worker_jobs,
)
from admission.sql._times import as_utc

__all__ = ["SqlJobStore"]

_JOBS: Final = worker_jobs.c
_DEPENDENCIES: Final = worker_job_dependencies.c
_SCOPES: Final = worker_job_scopes.c
_ATTEMPTS: Final = worker_job_attempts.c
_CHECKPOINTS: Final = worker_job_checkpoints.c
_EVENTS: Final = worker_job_events.c
_ROW_FIELDS: Final = tuple(field.name for field in fields(JobRow))
_SAVED_FIELDS: Final = tuple(name for name in _ROW_FIELDS if name not in JobRow.FIXED)
_EVENT_FIELDS: Final = (
    "job_id",
    "event",
    "from_state",
    "to_state",
    "reason",
    "fence",
    "attempt_id",
    "detail",
)

# The statements, built once: SQLAlchemy then reuses their compiled form and
# cache key instead of building a statement per call, which costs more than
# running it on SQLite.  Parameters named ``b_*`` are the WHERE clause's; the
# other parameters of an INSERT or UPDATE are the columns it writes.
_LOCK_SCOPE: Final = select(_SCOPES.scope).where(_SCOPES.scope == bindparam("b_scope")).with_for_update()
# claim_next's: a scope another transaction holds (a claim or an enqueue in flight) is passed over.
_LOCK_SCOPE_OR_SKIP: Final = (
    select(_SCOPES.scope).where(_SCOPES.scope == bindparam("b_scope")).with_for_update(skip_locked=True)
)
_NEXT_POSITION: Final = (
    update(worker_job_scopes)
    .where(_SCOPES.scope == bindparam("b_scope"))
    .values(last_position=_SCOPES.last_position + 1)
    .returning(_SCOPES.last_position)
)
# FOR UPDATE on PostgreSQL; SQLite renders nothing, its write transaction already excludes.
_LOCK_JOB: Final = select(worker_jobs).where(_JOBS.job_id == bindparam("b_job_id")).with_for_update()
# A claimer's lock: a row another transaction holds is skipped, not waited for (PostgreSQL's
# FOR UPDATE SKIP LOCKED; SQLite renders nothing and its write transaction already excludes).
_LOCK_JOB_OR_SKIP: Final = (
    select(worker_jobs).where(_JOBS.job_id == bindparam("b_job_id")).with_for_update(skip_locked=True)
)
_READ_JOB: Final = select(worker_jobs).where(_JOBS.job_id == bindparam("b_job_id"))
_FIND_JOBS: Final = select(worker_jobs).where(_JOBS.job_id.in_(bindparam("b_job_ids", expanding=True)))
# FOR SHARE (PostgreSQL; SQLite's write lock already serialises), in id order,
# so two enqueues lock in one order.
_SHARE_STATES: Final = (
    select(_JOBS.job_id, _JOBS.state)
    .where(_JOBS.job_id.in_(bindparam("b_job_ids", expanding=True)))
    .order_by(_JOBS.job_id)
    .with_for_update(read=True)
)
_COUNT_UNFINISHED: Final = (
    select(func.count())
    .select_from(worker_jobs)
    .where(_JOBS.scope == bindparam("b_scope"), _JOBS.state.in_(sorted(UNFINISHED_JOB_STATES)))
)
# Read through ix_worker_jobs_scope_state, like the claim candidates.
_RUNNING_IN_SCOPE: Final = (
    select(_JOBS.job_id)
    .where(_JOBS.scope == bindparam("b_scope"), _JOBS.state == "running")
    .order_by(_JOBS.position)
)
_INSERT_JOB: Final = insert(worker_jobs)
_INSERT_DEPENDENCY: Final = insert(worker_job_dependencies)
_SAVE_JOB: Final = update(worker_jobs).where(_JOBS.job_id == bindparam("b_job_id"))
_FENCED_UPDATE: Final = (
    update(worker_jobs)
    .where(
        _JOBS.job_id == bindparam("b_job_id"), _JOBS.fence == bindparam("b_fence"), _JOBS.state == "running"
    )
    .values(beat=_JOBS.beat + 1)
    # The row as updated, in the same statement: no second read.
    .returning(*worker_jobs.c)
)
_BLOCKED_DEPENDENTS: Final = (
    select(worker_jobs)
    .join(worker_job_dependencies, _DEPENDENCIES.job_id == _JOBS.job_id)
    .where(_DEPENDENCIES.depends_on == bindparam("b_job_id"), _JOBS.state == "blocked")
    .order_by(_JOBS.job_id)
    .with_for_update(of=worker_jobs)
)
_DEPENDENCY_STATES: Final = (
    select(_JOBS.state)
    .join(worker_job_dependencies, _DEPENDENCIES.depends_on == _JOBS.job_id)
    .where(_DEPENDENCIES.job_id == bindparam("b_job_id"))
)
_DEPENDENCY_IDS: Final = (
    select(_DEPENDENCIES.depends_on)
    .where(_DEPENDENCIES.job_id == bindparam("b_job_id"))
    .order_by(_DEPENDENCIES.depends_on)
)
_BEGIN_ATTEMPT: Final = insert(worker_job_attempts)
_END_ATTEMPT: Final = update(worker_job_attempts).where(
    _ATTEMPTS.attempt_id == bindparam("b_attempt_id"), _ATTEMPTS.ended_at.is_(None)
)
_READ_ATTEMPT: Final = select(worker_job_attempts).where(_ATTEMPTS.attempt_id == bindparam("b_attempt_id"))
_INSERT_CHECKPOINT: Final = insert(worker_job_checkpoints)
_CHECKPOINT_STATE: Final = select(_CHECKPOINTS.state).where(
    _CHECKPOINTS.job_id == bindparam("b_job_id"), _CHECKPOINTS.step == bindparam("b_step")
)
_APPEND_EVENT: Final = insert(worker_job_events)
_EVENTS_OF: Final = (
    select(worker_job_events).where(_EVENTS.job_id == bindparam("b_job_id")).order_by(_EVENTS.position)
)
_CHECKPOINTS_OF: Final = (
    select(worker_job_checkpoints)
    .where(_CHECKPOINTS.job_id == bindparam("b_job_id"))
    .order_by(_CHECKPOINTS.step)
)
_COUNTS: Final = select(_JOBS.state, func.count()).group_by(_JOBS.state)
_COUNTS_OF: Final = _COUNTS.where(_JOBS.scope == bindparam("b_scope"))
_CLAIM_CANDIDATES: Final = (
    select(_JOBS.job_id)
    .where(
        _JOBS.scope == bindparam("b_scope"),
        _JOBS.state.in_(["queued", "retry_wait", "running"]),
        _JOBS.paused.is_(False),
        # A retry's backoff: the service's time, not the server's, so every store judges alike.
        or_(_JOBS.not_before.is_(None), _JOBS.not_before <= bindparam("b_now")),
    )
    # Waiting jobs first: running ones are claimable only once their
    # lease lapsed, and a scan full of live ones must not hide the rest.
    .order_by(case((_JOBS.state == "running", 1), else_=0), _JOBS.position)
    .limit(bindparam("b_limit"))
)


def _job_row(row: RowMapping) -> JobRow:
    publish_result = row["publish_result"]
    return JobRow(
        job_id=row["job_id"],
        scope=row["scope"],
        position=int(row["position"]),
        kind=row["kind"],
        payload=bytes(row["payload"]),
        content=bytes(row["content"]),
        state=row["state"],
        reason=row["reason"],
        max_attempts=int(row["max_attempts"]),
        attempts=int(row["attempts"]),
        fence=int(row["fence"]),
        beat=int(row["beat"]),
        owner=row["owner"],
        attempt_id=row["attempt_id"],
        paused=bool(row["paused"]),
        cancel_requested=bool(row["cancel_requested"]),
        stop_requested=bool(row["stop_requested"]),
        checkpoint_step=int(row["checkpoint_step"]),
        publish_attempt_id=row["publish_attempt_id"],
        publish_result=None if publish_result is None else bytes(publish_result),
        diagnostic=row["diagnostic"],
        created_at=as_utc(row["created_at"]),
        updated_at=as_utc(row["updated_at"]),
        not_before=None if row["not_before"] is None else as_utc(row["not_before"]),
    )


def _dependencies(conn: Connection, job_id: str) -> tuple[str, ...]:
    return tuple(conn.execute(_DEPENDENCY_IDS, {"b_job_id": job_id}).scalars())


class _SqlJobTransaction:
    """One write transaction on one connection (see the module docstring for the locks)."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn

    def lock_scope(
        self, scope: str, *, created_at: datetime | None = None, skip_locked: bool = False
    ) -> bool:
        if created_at is not None:
            values = {"scope": scope, "last_position": 0, "created_at": created_at}
            insert_or_ignore(self._conn, worker_job_scopes, values, ["scope"])
        statement = _LOCK_SCOPE_OR_SKIP if skip_locked else _LOCK_SCOPE
        return self._conn.execute(statement, {"b_scope": scope}).first() is not None

    def running_in_scope(self, scope: str) -> list[str]:
        return [str(job_id) for job_id in self._conn.execute(_RUNNING_IN_SCOPE, {"b_scope": scope}).scalars()]

    def lock_job(self, job_id: str, *, skip_locked: bool = False) -> JobRow | None:
        statement = _LOCK_JOB_OR_SKIP if skip_locked else _LOCK_JOB
        row = self._conn.execute(statement, {"b_job_id": job_id}).mappings().first()
        return None if row is None else _job_row(row)

    def find_jobs(self, job_ids: Collection[str]) -> list[JobRow]:
        rows = self._conn.execute(_FIND_JOBS, {"b_job_ids": list(job_ids)}).mappings()
        return [_job_row(row) for row in rows]

    def share_states(self, job_ids: Collection[str]) -> dict[str, str]:
        rows = self._conn.execute(_SHARE_STATES, {"b_job_ids": sorted(job_ids)})
        return {str(job_id): str(state) for job_id, state in rows}

    def count_unfinished(self, scope: str) -> int:
        return int(self._conn.execute(_COUNT_UNFINISHED, {"b_scope": scope}).scalar_one())

    def next_position(self, scope: str) -> int:
        position = self._conn.execute(_NEXT_POSITION, {"b_scope": scope}).scalar_one_or_none()
        if position is None:
            raise StorageError(f"no scope {scope!r}: lock it first")
        return int(position)

    def insert_job(self, row: JobRow, depends_on: Sequence[str]) -> None:
        self._conn.execute(_INSERT_JOB, {name: getattr(row, name) for name in _ROW_FIELDS})
        if depends_on:
            self._conn.execute(
                _INSERT_DEPENDENCY, [{"job_id": row.job_id, "depends_on": d} for d in depends_on]
            )

    def save_job(self, row: JobRow) -> None:
        # Only what a job's life changes: its payload and content are written once.
        values = {name: getattr(row, name) for name in _SAVED_FIELDS}
        self._conn.execute(_SAVE_JOB, {"b_job_id": row.job_id, **values})

    def fenced_update(self, job_id: str, fence: int, *, updated_at: datetime) -> JobRow | None:
        params = {"b_job_id": job_id, "b_fence": fence, "updated_at": updated_at}
        row = self._conn.execute(_FENCED_UPDATE, params).mappings().first()
        return None if row is None else _job_row(row)

    def blocked_dependents(self, job_id: str) -> list[JobRow]:
        rows = self._conn.execute(_BLOCKED_DEPENDENTS, {"b_job_id": job_id}).mappings()
        return [_job_row(row) for row in rows]

    def dependency_states(self, job_id: str) -> list[str]:
        return [
            str(state) for state in self._conn.execute(_DEPENDENCY_STATES, {"b_job_id": job_id}).scalars()
        ]

    def dependencies(self, job_id: str) -> tuple[str, ...]:
        return _dependencies(self._conn, job_id)

    def begin_attempt(
        self, *, attempt_id: str, job_id: str, number: int, fence: int, owner: str, started_at: datetime
    ) -> None:
        self._conn.execute(
            _BEGIN_ATTEMPT,
            {
                "attempt_id": attempt_id,
                "job_id": job_id,
                "number": number,
                "fence": fence,
                "owner": owner,
                "started_at": started_at,
                "ended_at": None,
                "outcome": None,
                "diagnostic": None,
            },
        )

    def end_attempt(
        self, attempt_id: str, *, ended_at: datetime, outcome: str, diagnostic: str | None
    ) -> None:
        params = {
            "b_attempt_id": attempt_id,
            "ended_at": ended_at,
            "outcome": outcome,
            "diagnostic": diagnostic,
        }
        self._conn.execute(_END_ATTEMPT, params)

    def attempt(self, attempt_id: str) -> AttemptRow | None:
        row = self._conn.execute(_READ_ATTEMPT, {"b_attempt_id": attempt_id}).mappings().first()
        if row is None:
            return None
        ended_at = row["ended_at"]
        return AttemptRow(
            attempt_id=row["attempt_id"],
            job_id=row["job_id"],
            number=int(row["number"]),
            fence=int(row["fence"]),
            owner=row["owner"],
            started_at=as_utc(row["started_at"]),
            ended_at=None if ended_at is None else as_utc(ended_at),
            outcome=row["outcome"],
            diagnostic=row["diagnostic"],
        )

    def insert_checkpoint(
        self, *, job_id: str, step: int, attempt_id: str, fence: int, state: bytes, recorded_at: datetime
    ) -> None:
        self._conn.execute(
            _INSERT_CHECKPOINT,
            {
                "job_id": job_id,
                "step": step,
                "attempt_id": attempt_id,
                "fence": fence,
                "state": state,
                "recorded_at": recorded_at,
            },
        )

    def checkpoint_state(self, job_id: str, step: int) -> bytes | None:
        params = {"b_job_id": job_id, "b_step": step}
        state = self._conn.execute(_CHECKPOINT_STATE, params).scalar_one_or_none()
        return None if state is None else bytes(state)

    def append_event(self, event: JobEvent) -> None:
        values = {name: getattr(event, name) for name in _EVENT_FIELDS}
        self._conn.execute(_APPEND_EVENT, {**values, "recorded_at": event.recorded_at})


class SqlJobStore:
    """The :class:`~admission.jobs.JobStore` on SQLite or PostgreSQL.

    Opening checks the schema revision and refuses anything but the head
    (contract §6): run ``admission db upgrade`` first.
    """

    def __init__(self, engine: Engine, *, check: bool = True) -> None:
        self.engine = engine
        # The engine with admission's write option set once, not per transaction.
        self._write_engine = engine.execution_options(**{WRITE_OPTION: True})
        if check:
            with self._read() as conn:
                check_revision(conn)

    @classmethod
    def open(cls, url: str = DEFAULT_URL, **engine_options: Any) -> SqlJobStore:
        """Create an engine for ``url`` and open the store on it."""
        return cls(create_admission_engine(url, **engine_options))

    def dispose(self) -> None:
        """Close the engine's pooled connections."""
        self.engine.dispose()

    def default_lock_dir(self) -> str | None:
        """``<file>.job-locks`` beside a SQLite database file: every runner of an embedded database
        is on this machine.  None on PostgreSQL, whose runners may be on several machines (there
        the lease and the fence decide), and none for a database in memory."""
        database = self.engine.url.database
        if is_postgresql(self.engine.dialect) or not database or database == ":memory:":
            return None
        return f"{database}.job-locks"

    def _translate(self) -> AbstractContextManager[None]:
        return wrap_exceptions(self.engine.dialect)

    @contextmanager
    def _transaction(self) -> Iterator[JobTransaction]:
        with self._translate(), self._write_engine.connect() as conn, conn.begin():
            yield _SqlJobTransaction(conn)

    def transaction(self) -> AbstractContextManager[JobTransaction]:
        """A write transaction (``BEGIN IMMEDIATE`` on SQLite): commits when the block ends,
        rolls back on an exception; a driver error anywhere in it becomes an admission error."""
        return self._transaction()

    @contextmanager
    def _read(self) -> Iterator[Connection]:
        with self._translate(), self.engine.connect() as conn, conn.begin():
            yield conn

    def view(self, job_id: str) -> JobView | None:
        """The job as it is now, or ``None``."""
        with self._read() as conn:
            row = conn.execute(_READ_JOB, {"b_job_id": job_id}).mappings().first()
            return None if row is None else _job_row(row).view(_dependencies(conn, job_id))

    def events(self, job_id: str) -> list[JobEvent]:
        """Every event of the job, oldest first."""
        with self._read() as conn:
            return [
                JobEvent(
                    position=int(r["position"]),
                    job_id=r["job_id"],
                    event=r["event"],
                    from_state=r["from_state"],
                    to_state=r["to_state"],
                    reason=r["reason"],
                    fence=None if r["fence"] is None else int(r["fence"]),
                    attempt_id=r["attempt_id"],
                    detail=r["detail"],
                    recorded_at=as_utc(r["recorded_at"]),
                )
                for r in conn.execute(_EVENTS_OF, {"b_job_id": job_id}).mappings()
            ]

    def checkpoints(self, job_id: str) -> list[Checkpoint]:
        """The job's checkpoints, by step."""
        with self._read() as conn:
            return [
                Checkpoint(
                    r["job_id"],
                    int(r["step"]),
                    r["attempt_id"],
                    int(r["fence"]),
                    canonical_decode(bytes(r["state"])),
                    as_utc(r["recorded_at"]),
                )
                for r in conn.execute(_CHECKPOINTS_OF, {"b_job_id": job_id}).mappings()
            ]

    def counts(self, scope: str | None = None) -> dict[str, int]:
        """How many jobs are in each state (of one scope, or of all)."""
        with self._read() as conn:
            rows = conn.execute(_COUNTS) if scope is None else conn.execute(_COUNTS_OF, {"b_scope": scope})
            return {str(state): int(n) for state, n in rows}

    def snapshot(self, scope: str | None) -> JobsSnapshot:
        """Every job of ``scope`` (or of all) in ONE read transaction: ``REPEATABLE READ`` and
        read-only on PostgreSQL, one WAL read snapshot on SQLite (``admission/sql/_job_snapshot.py``)."""
        return read_snapshot(self.engine, scope)

    def claim_candidates(self, scope: str, limit: int, *, now: datetime) -> list[str]:
        """Unpaused claimable jobs of ``scope`` not in backoff at ``now``: waiting ones first,
        each group in queue order."""
        params = {"b_scope": scope, "b_limit": limit, "b_now": now}
        with self._read() as conn:
            rows = conn.execute(_CLAIM_CANDIDATES, params).scalars()
            return [str(job_id) for job_id in rows]
