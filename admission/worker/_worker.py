"""The durable worker: scoped intake, the fenced write cycle, reconciliation and observation.

Worker contract §1-§3, §5.  Every state change is one transaction that also
appends its event to ``worker_events``; the state it moves to is looked up
in :data:`admission.worker._states.WRITE_TRANSITIONS`, never decided here.  A record
is committed ``in_flight`` *before* the target is called, so any crash after
that point is found by the next start and turns the record ``uncertain``,
which only an exact readback or an operator's ``resolve`` settles.

Ownership (contract §3, docs/worker.md): a local worker holds a non-blocking
``fcntl.flock`` on a lock file for as long as it owns the queue; every owner
also claims the queue's lease row, which increments the fencing token.  Every
update of a record carries the writer's token in ``fence`` and a trigger in
the database refuses one that is not the current token
(:class:`~admission.errors.FencedError`).  A claimant takes over a live-looking
lease only after watching its heartbeat stand still for ``lease_ttl``
seconds on the claimant's own monotonic clock.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from sqlalchemy import Engine, bindparam, func, select, update
from sqlalchemy.engine import Connection, RowMapping

from admission.errors import (
    BeforeWriteError,
    FencedError,
    InvalidRecordError,
    InvalidValueError,
    QueueFullError,
    RecordStateError,
    ScopeMismatchError,
    StorageError,
    TargetTimeoutError,
)
from admission.intent._encoding import canonical_decode, canonical_encode
from admission.sql._engine import as_utc, insert_or_ignore, wrap_exceptions
from admission.sql._raw import BulkInsert, BulkStatement
from admission.sql._schema import worker_events, worker_leases, worker_queues, worker_records
from admission.worker._intake import MAX_CONTENT, Intake, Scope, WorkerLimits, bounded_text, validate_record
from admission.worker._lease import QueueLease
from admission.worker._localfs import FileLock, write_json_atomically
from admission.worker._states import (
    WAITING_WRITE_STATES,
    WRITE_TRANSITIONS,
    WriteState,
    after_before_write_error,
)
from admission.worker._targets import StatusRead, Target, TargetRecord

__all__ = [
    "CRASH_POINTS",
    "CycleReport",
    "DurableWorker",
    "FileLock",
    "Intake",
    "PollReport",
    "Scope",
    "WorkerLimits",
    "bounded_text",
    "write_json_atomically",
]

CRASH_POINTS: Final = ("before_dispatch", "after_in_flight", "after_target_commit", "after_confirm")
"""The named points of a send at which the worker calls its ``hook`` (crash tests stop it there)."""

_ACKNOWLEDGED: Final = "the target acknowledged the write"
_EVENT_KEYS: Final = (
    "queue",
    "write_id",
    "event_type",
    "from_state",
    "to_state",
    "reason",
    "actor",
    "fence",
    "recorded_at",
)
_WRITE_OPTION: Final = "admission_write"

# One transition of many records, guarded by their previous state (the fencing
# trigger checks ``fence``): built once, run as one executemany per batch.
_STEP_MANY: Final = (
    update(worker_records)
    .where(
        worker_records.c.write_id == bindparam("match_write_id"),
        worker_records.c.state == bindparam("match_state"),
    )
    .values(state=bindparam("new_state"), updated_at=bindparam("now"), fence=bindparam("new_fence"))
)
_STEP_MANY_ATTEMPT: Final = _STEP_MANY.values(attempts=worker_records.c.attempts + 1)
# What a send, a transition and a readback read of a record.
_CYCLE_COLUMNS: Final = tuple(
    worker_records.c[name]
    for name in ("id", "write_id", "tenant", "source_key", "content", "state", "attempts")
)


@dataclass(frozen=True)
class CycleReport:
    """What one send/reconcile cycle did."""

    token: int
    recovered: int = 0
    reconciled: int = 0
    still_uncertain: int = 0
    sent: int = 0
    confirmed: int = 0
    retried: int = 0
    failed_safe: int = 0
    uncertain: int = 0


@dataclass(frozen=True)
class PollReport:
    """What one polling pass read (contract §5)."""

    read: int = 0
    changed: int = 0
    missing: int = 0
    failed: int = 0


def _utcnow() -> datetime:
    return datetime.now(UTC)


def _no_hook(_point: str) -> None:
    return None


class DurableWorker:
    """One queue of records for one scope, on a SQLAlchemy engine (SQLite or PostgreSQL).

    ``engine`` must come from :func:`admission.sql.create_admission_engine` on a
    database at the head revision.  ``lock_path`` is the local file lock
    (default: next to a SQLite database; none on PostgreSQL, where the lease
    alone decides; ``file_lock=False`` turns it off).  ``now`` stamps rows; ``monotonic`` decides liveness.
    ``hook`` is called with each name of :data:`CRASH_POINTS` during a send.
    ``claim_wait`` is how long :meth:`claim` keeps trying a held lease.
    ``send_batch`` records are put in flight per commit (default 1): more is
    faster, but a crash then leaves up to that many records ``uncertain``,
    some of them never sent (docs/worker.md).
    """

    def __init__(
        self,
        engine: Engine,
        scope: Scope,
        *,
        queue: str = "default",
        limits: WorkerLimits | None = None,
        holder: str | None = None,
        lock_path: str | os.PathLike[str] | None = None,
        file_lock: bool | None = None,
        lease_ttl: float = 30.0,
        claim_wait: float = 0.0,
        send_batch: int = 1,
        now: Callable[[], datetime] = _utcnow,
        monotonic: Callable[[], float] = time.monotonic,
        hook: Callable[[str], None] | None = None,
        new_id: Callable[[], str] = lambda: str(uuid.uuid4()),
    ) -> None:
        if not isinstance(queue, str) or not 1 <= len(queue) <= 255:
            raise InvalidRecordError("must be a string of 1 to 255 characters", field="queue")
        if lease_ttl <= 0:
            raise InvalidRecordError("must be positive", field="lease_ttl")
        self.engine = engine
        self.scope = scope
        self.queue = queue
        self.limits = limits or WorkerLimits()
        self.holder = holder or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.lease_ttl = lease_ttl
        self.claim_wait = claim_wait
        if isinstance(send_batch, bool) or not isinstance(send_batch, int) or not 1 <= send_batch <= 1000:
            raise InvalidRecordError("must be an integer from 1 to 1000", field="send_batch")
        self.send_batch = send_batch
        self._postgres = engine.dialect.name == "postgresql"
        # A transition of a batch writes one event per record: on the hot path.
        self._events = BulkInsert(worker_events, engine.dialect, _EVENT_KEYS)
        self._steps = {
            False: BulkStatement(_STEP_MANY, engine.dialect),
            True: BulkStatement(_STEP_MANY_ATTEMPT, engine.dialect),
        }
        if file_lock is None:
            file_lock = lock_path is not None or not self._postgres
        if file_lock and lock_path is None:
            if not engine.url.database:
                raise InvalidRecordError("a file lock needs lock_path on this database", field="lock_path")
            lock_path = f"{engine.url.database}.{queue}.lock"
        self.lock_path = Path(lock_path) if file_lock and lock_path is not None else None
        self._now = now
        self._hook = hook or _no_hook
        self._new_id = new_id
        self.lease = QueueLease(
            queue,
            self.holder,
            begin=self._write,
            lock_path=self.lock_path,
            local_exclusive=not self._postgres,
            lease_ttl=lease_ttl,
            claim_wait=claim_wait,
            now=now,
            monotonic=monotonic,
        )
        self._open_queue()

    # -- transactions and the one translation boundary --------------------------------------

    @contextmanager
    def _write(self, connection: Connection | None = None) -> Iterator[Connection]:
        if connection is not None:
            # The caller owns the transaction: neither commit nor roll back.
            with self._translate():
                yield connection
            return
        with self._translate(), self.engine.connect() as conn:
            conn.execution_options(**{_WRITE_OPTION: True})
            with conn.begin():
                yield conn

    @contextmanager
    def _read(self) -> Iterator[Connection]:
        with self._translate(), self.engine.connect() as conn, conn.begin():
            yield conn

    def _translate(self) -> AbstractContextManager[None]:
        # The fencing trigger's refusal (worker_fence) means another owner claimed the queue.
        return wrap_exceptions(self.engine.dialect, {"worker_fence": self._fenced})

    def _fenced(self) -> FencedError:
        token = self.lease.token if self.lease.token is not None else -1
        return FencedError(
            f"the database refused a write of queue {self.queue!r} with fencing token {token}: "
            "another worker has claimed the queue",
            queue=self.queue,
            token=token,
        )

    # -- the queue and its pinned scope (contract §1) -------------------------------------------

    def _open_queue(self) -> None:
        with self._write() as conn:
            insert_or_ignore(
                conn,
                worker_queues,
                {"queue": self.queue, "scope": self.scope.encode(), "created_at": self._now()},
                ["queue"],
            )
            insert_or_ignore(
                conn,
                worker_leases,
                {"queue": self.queue, "token": 0, "holder": None, "heartbeat": 0, "claimed_at": None},
                ["queue"],
            )
            pinned = conn.execute(
                select(worker_queues.c.scope).where(worker_queues.c.queue == self.queue)
            ).scalar_one()
        if bytes(pinned) != self.scope.encode():
            stored = canonical_decode(bytes(pinned))
            assert isinstance(stored, dict)
            mine = self.scope.as_dict()
            differing = sorted(k for k in {*stored, *mine} if stored.get(k) != mine.get(k))
            raise ScopeMismatchError(
                f"queue {self.queue!r} is pinned to another scope (differs in {', '.join(differing)}); "
                "a queue's scope never changes",
                field=differing[0],
                queue=self.queue,
            )

    # -- intake (contract §1) ------------------------------------------------------------------

    def validate(self, record: object) -> tuple[str, bytes]:
        """Check a record against the scope; return its source key and canonical content.

        Raises InvalidRecordError or ScopeMismatchError naming the field; nothing is written.
        """
        return validate_record(self.scope, record, queue=self.queue)

    def accept(self, record: object, *, connection: Connection | None = None) -> Intake:
        """Validate, then commit the record before acknowledging it (contract §1).

        With ``connection`` the write joins the caller's transaction (the outbox
        relay uses this to move its cursor in the same commit).  Raises
        QueueFullError past the bound of waiting records.
        """
        source_key, content = self.validate(record)
        tenant = self.scope.tenant
        records = worker_records.c
        with self._write(connection) as conn:
            # Serialises intake per queue, so the bound holds under concurrent producers.
            conn.execute(
                select(worker_queues.c.queue).where(worker_queues.c.queue == self.queue).with_for_update()
            )
            key = (
                (records.queue == self.queue)
                & (records.tenant == tenant)
                & (records.source_key == source_key)
            )
            existing = conn.execute(
                select(records.write_id, records.content, records.state).where(key)
            ).first()
            if existing is not None:
                same = bytes(existing.content) == content
                return Intake("duplicate" if same else "conflict", existing.write_id, existing.state)
            waiting = conn.execute(
                select(func.count()).where(
                    records.queue == self.queue, records.state.in_(WAITING_WRITE_STATES)
                )
            ).scalar_one()
            if waiting >= self.limits.max_waiting:
                raise QueueFullError(
                    f"queue {self.queue!r} already holds {waiting} waiting records "
                    f"(limit {self.limits.max_waiting}); the record was not accepted, retry later",
                    queue=self.queue,
                    limit=self.limits.max_waiting,
                )
            write_id = self._new_id()
            now = self._now()
            inserted = insert_or_ignore(
                conn,
                worker_records,
                {
                    "write_id": write_id,
                    "queue": self.queue,
                    "tenant": tenant,
                    "source_key": source_key,
                    "content": content,
                    "state": WriteState.PREPARED,
                    "attempts": 0,
                    "created_at": now,
                    "updated_at": now,
                },
                ["queue", "tenant", "source_key"],
            )
            if not inserted:  # pragma: no cover - the queue row lock above prevents this race
                raise StorageError("a concurrent intake of the same key; retry")
            self._event(conn, write_id, "accepted", None, WriteState.PREPARED, "record accepted", fence=None)
        return Intake("accepted", write_id, WriteState.PREPARED)

    def record_refusal(self, connection: Connection, reason: str) -> None:
        """Append an ``intake_refused`` event in the caller's transaction (a producer
        that must not drop what the intake refused, such as the outbox relay)."""
        with self._write(connection) as conn:
            self._event(conn, None, "intake_refused", None, None, reason, fence=None)

    # -- ownership (contract §3, admission/lease.py) --------------------------------------------

    def owned(self) -> AbstractContextManager[int]:
        """Own the queue for the block: file lock (if any), then a lease claim; yields the token."""
        return self.lease.owned()

    def claim(self) -> int:
        """Take the file lock and claim the lease with a new fencing token (see :class:`Lease`)."""
        return self.lease.claim()

    def renew(self) -> None:
        """Bump the heartbeat under the current token; FencedError if the lease was taken."""
        self.lease.renew()

    def release(self) -> None:
        """Give the lease up (if still ours) and drop the file lock."""
        self.lease.release()

    def keep_lease(self) -> None:
        """Renew the lease if half its ttl has passed on this owner's monotonic clock.

        A long-lived owner calls it while idle between cycles (``admission
        worker start`` does); a cycle calls it before every send and readback.
        """
        self.lease.keep()

    # -- the write cycle (contract §2) -------------------------------------------------------------

    def run_once(self, target: Target) -> CycleReport:
        """One send/reconcile cycle under ownership.

        First ``in_flight`` records (left by a crash: this worker finishes its
        own sends within the cycle) become ``uncertain``; then every
        ``uncertain`` record is read back and confirmed only by an exact match;
        then ``prepared`` records are sent, each committed ``in_flight`` before
        the target is called.
        """
        with self.owned() as token:
            # A long-lived owner (``start``) renews here too, so that idle time
            # between cycles never lets the lease lapse.
            self.keep_lease()
            counts = {"recovered": 0, "reconciled": 0, "still_uncertain": 0, "sent": 0}
            outcomes = {"confirmed": 0, "retried": 0, "failed_safe": 0, "uncertain": 0}
            for row in self._rows(WriteState.IN_FLIGHT):
                self._transition(row, "crash_found", "found in_flight at start: the send may have landed")
                counts["recovered"] += 1
            for row in self._rows(WriteState.UNCERTAIN):
                if self._reconcile(target, row):
                    counts["reconciled"] += 1
                else:
                    counts["still_uncertain"] += 1
            # Records the target acknowledged are confirmed in the same commit that
            # puts the next batch in flight (docs/worker.md: one queue commit per
            # batch).  Until then they are in_flight with their writes landed: a
            # crash leaves them for the next start to find uncertain and confirm
            # by readback, never to send again.
            acknowledged: list[RowMapping] = []
            prepared = self._rows(WriteState.PREPARED)
            for start in range(0, len(prepared), self.send_batch):
                batch = prepared[start : start + self.send_batch]
                self._hook("before_dispatch")
                self.keep_lease()
                flights = self._dispatch(batch, acknowledged)
                if acknowledged:
                    outcomes["confirmed"] += len(acknowledged)
                    self._hook("after_confirm")
                acknowledged = []
                for flight in flights:
                    counts["sent"] += 1
                    self.keep_lease()
                    outcome = self._send(target, flight)
                    if outcome == "acknowledged":
                        acknowledged.append(flight)
                    else:
                        outcomes[outcome] += 1
            if acknowledged:
                with self._write() as conn:
                    self._step_many(conn, self._fence(conn), acknowledged, "acknowledged", _ACKNOWLEDGED)
                outcomes["confirmed"] += len(acknowledged)
                self._hook("after_confirm")
            return CycleReport(token, **counts, **outcomes)

    def _rows(self, state: str) -> list[RowMapping]:
        # Only what a send, a transition and a readback use: converting the
        # other columns (stored times above all) would cost more than the read.
        records = worker_records.c
        with self._read() as conn:
            return list(
                conn.execute(
                    select(*_CYCLE_COLUMNS)
                    .where(records.queue == self.queue, records.state == state)
                    .order_by(records.id)
                ).mappings()
            )

    def _reconcile(self, target: Target, row: RowMapping) -> bool:
        self.keep_lease()
        try:
            answer = target.read_back(row["write_id"])
        except Exception:
            return False
        # Only a positive exact readback with the same write_id confirms (contract §2);
        # missing, unknown or different content leaves the record uncertain.
        if (
            answer.kind != "found"
            or answer.write_id != row["write_id"]
            or answer.content != bytes(row["content"])
        ):
            return False
        self._transition(row, "readback_found", "exact readback of the same write_id")
        return True

    def _dispatch(self, batch: list[RowMapping], acknowledged: list[RowMapping]) -> list[RowMapping]:
        # One commit: confirm what the target acknowledged, and put the batch in
        # flight (with its attempt counted) before any of it is sent (contract §2).
        with self._write() as conn:
            fence = self._fence(conn)
            if acknowledged:
                self._step_many(conn, fence, acknowledged, "acknowledged", _ACKNOWLEDGED)
            return self._step_many(conn, fence, batch, "dispatch", "sending", count_attempt=True)

    def _send(self, target: Target, flight: RowMapping) -> str:
        self._hook("after_in_flight")
        attempts = int(flight["attempts"])
        record = TargetRecord(
            flight["write_id"], flight["tenant"], flight["source_key"], bytes(flight["content"])
        )
        try:
            target.write(record)
        except BeforeWriteError as exc:
            event = after_before_write_error(attempts, self.limits.max_attempts)
            self._transition(flight, event, f"before-write error: {exc}", diagnostic=str(exc))
            return "retried" if event == "before_write_error" else "failed_safe"
        except TargetTimeoutError as exc:
            self._transition(flight, "timeout", "the target did not answer in time", diagnostic=str(exc))
            return "uncertain"
        except Exception as exc:  # any other failure may have landed (contract §2)
            self._transition(flight, "error", f"{type(exc).__name__} during the write", diagnostic=repr(exc))
            return "uncertain"
        self._hook("after_target_commit")
        return "acknowledged"

    # -- state changes: one transaction, one event ------------------------------------------------

    def _fence(self, conn: Connection) -> int:
        if self.lease.token is not None:
            return self.lease.token
        # An operator's write (resolve, observe) outside a worker cycle carries the
        # token current in its own transaction: it never races a claim.
        token = conn.execute(
            select(worker_leases.c.token).where(worker_leases.c.queue == self.queue).with_for_update()
        ).scalar_one()
        return int(token)

    def _transition(
        self,
        row: RowMapping,
        event: str,
        reason: str,
        *,
        actor: str | None = None,
        diagnostic: str | None = None,
        values: Mapping[str, object] | None = None,
    ) -> RowMapping:
        """Move ``row`` by ``event`` in one transaction with its event."""
        with self._write() as conn:
            fence = self._fence(conn)
            return self._step(
                conn, fence, row, event, reason, actor=actor, diagnostic=diagnostic, values=values
            )

    def _step(
        self,
        conn: Connection,
        fence: int,
        row: RowMapping,
        event: str,
        reason: str,
        *,
        actor: str | None = None,
        diagnostic: str | None = None,
        values: Mapping[str, object] | None = None,
    ) -> RowMapping:
        state = row["state"]
        new_state = WRITE_TRANSITIONS.next_state(state, event, subject=row["write_id"])
        changes: dict[str, Any] = {"state": new_state, "updated_at": self._now(), **(values or {})}
        if diagnostic is not None:
            changes["diagnostic"] = bounded_text(diagnostic, self.limits.max_diagnostic)
        # Guarded by the previous state; the fencing trigger checks ``fence`` (contract §3).
        changed = conn.execute(
            update(worker_records)
            .where(worker_records.c.write_id == row["write_id"], worker_records.c.state == state)
            .values(**changes, fence=fence)
        ).rowcount
        if not changed:
            raise RecordStateError(
                f"record {row['write_id']} is no longer {state}", write_id=row["write_id"], state=None
            )
        self._event(conn, row["write_id"], event, state, new_state, reason, fence=fence, actor=actor)
        return {**row, **changes, "fence": fence}  # type: ignore[return-value]

    def _step_many(
        self,
        conn: Connection,
        fence: int,
        rows: list[RowMapping],
        event: str,
        reason: str,
        *,
        count_attempt: bool = False,
    ) -> list[RowMapping]:
        # The same transition for rows that are all in one state: one executemany
        # of the guarded UPDATE and one of the events, whatever the batch size.
        state = rows[0]["state"]
        new_state = WRITE_TRANSITIONS.next_state(state, event)
        if any(r["state"] != state for r in rows):
            raise RecordStateError(f"{event} is not allowed from {state}", write_id=None, state=state)
        now = self._now()
        ids = [r["write_id"] for r in rows]
        changed = self._steps[count_attempt].execute(
            conn,
            [{"match_write_id": write_id} for write_id in ids],
            {"match_state": state, "new_state": new_state, "now": now, "new_fence": fence},
        )
        if changed != len(ids):
            raise RecordStateError(
                f"records changed state under the worker ({event})", write_id=None, state=state
            )
        common = {
            "queue": self.queue,
            "event_type": event,
            "from_state": state,
            "to_state": new_state,
            "reason": reason,
            "actor": None,
            "fence": fence,
            "recorded_at": now,
        }
        self._events.insert(conn, [{"write_id": write_id} for write_id in ids], common)
        step = 1 if count_attempt else 0
        return [
            {  # type: ignore[misc]
                **r,
                "state": new_state,
                "updated_at": now,
                "fence": fence,
                "attempts": int(r["attempts"]) + step,
            }
            for r in rows
        ]

    def _event(
        self,
        conn: Connection,
        write_id: str | None,
        event_type: str,
        from_state: str | None,
        to_state: str | None,
        reason: str,
        *,
        fence: int | None,
        actor: str | None = None,
    ) -> None:
        self._events.insert(
            conn,
            [
                {
                    "queue": self.queue,
                    "write_id": write_id,
                    "event_type": event_type,
                    "from_state": from_state,
                    "to_state": to_state,
                    "reason": bounded_text(reason, self.limits.max_diagnostic),
                    "actor": actor,
                    "fence": fence,
                    "recorded_at": self._now(),
                }
            ],
        )

    # -- the operator (contract §2) --------------------------------------------------------------

    def resolve(self, write_id: str, decision: str, *, actor: str, reason: str) -> str:
        """Settle an ``uncertain`` record by an operator's decision, recorded with who and why.

        ``decision`` is ``confirm``, ``failed_safe`` or ``release`` (back to
        ``prepared`` for another send, with its attempts counted afresh).
        Returns the new state.
        """
        events = {
            "confirm": "resolve_confirm",
            "failed_safe": "resolve_failed_safe",
            "release": "resolve_release",
        }
        if decision not in events:
            raise InvalidRecordError(f"must be one of {', '.join(events)}", field="decision")
        if not isinstance(actor, str) or not actor.strip() or len(actor) > 255:
            raise InvalidRecordError("must name who decides (1 to 255 characters)", field="actor")
        if not isinstance(reason, str) or not reason.strip():
            raise InvalidRecordError("must say why", field="reason")
        row = self.get(write_id)
        values = {"attempts": 0} if decision == "release" else None
        updated = self._transition(row, events[decision], reason, actor=actor, values=values)
        return str(updated["state"])

    # -- observation (contract §5) ---------------------------------------------------------------

    def observe(self, write_id: str, snapshot: object = None, *, missing: bool = False) -> bool:
        """Store the latest status snapshot of a confirmed record; True if it changed.

        Only a changed snapshot makes an event.  ``missing=True`` says the
        target positively no longer has the row: the record becomes
        ``confirmed_then_missing`` and is never recreated.
        """
        row = self.get(write_id)
        if missing:
            self._apply_read(row, StatusRead("missing", write_id))
            return True
        try:
            canonical_encode(snapshot, max_size=MAX_CONTENT)
        except InvalidValueError as exc:
            raise InvalidRecordError(exc.message, field="snapshot") from exc
        return self._apply_read(row, StatusRead("found", write_id, snapshot))

    def poll_status(self, target: Target, limit: int = 100) -> PollReport:
        """One fair, bounded polling pass: at most ``limit`` (1-1000) confirmed records,
        oldest-polled first (never polled first of all)."""
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 1000:
            raise InvalidRecordError("must be an integer from 1 to 1000", field="poll_limit")
        records = worker_records.c
        with self.owned():
            self.keep_lease()
            with self._read() as conn:
                rows = list(
                    conn.execute(
                        select(worker_records)
                        .where(records.queue == self.queue, records.state == WriteState.CONFIRMED)
                        .order_by(records.polled_at.asc().nulls_first(), records.id)
                        .limit(limit)
                    ).mappings()
                )
            if not rows:
                return PollReport()
            try:
                reads = target.observe_status([r["write_id"] for r in rows])
            except Exception as exc:
                reads = [StatusRead("unknown", r["write_id"], detail=repr(exc)) for r in rows]
            by_id = {read.write_id: read for read in reads}
            tally = {"read": 0, "changed": 0, "missing": 0, "failed": 0}
            for row in rows:
                read = by_id.get(row["write_id"], StatusRead("unknown", row["write_id"], detail="no answer"))
                self.keep_lease()
                changed = self._apply_read(row, read)
                tally["read"] += 1
                if read.kind == "missing":
                    tally["missing"] += 1
                elif read.kind == "unknown":
                    tally["failed"] += 1
                elif changed:
                    tally["changed"] += 1
            return PollReport(**tally)

    def _apply_read(self, row: RowMapping, read: StatusRead) -> bool:
        write_id = row["write_id"]
        if row["state"] != WriteState.CONFIRMED:
            raise RecordStateError(
                f"record {write_id} is {row['state']}; only confirmed records are observed",
                write_id=write_id,
                state=row["state"],
            )
        if read.kind == "missing":
            self._transition(
                row, "observed_missing", "the target no longer has the row", values={"polled_at": self._now()}
            )
            return True
        records = worker_records.c
        now = self._now()
        with self._write() as conn:
            fence = self._fence(conn)
            where = (records.write_id == write_id) & (records.state == WriteState.CONFIRMED)
            if read.kind == "unknown":
                # Keep the snapshot; record poll-health once per failing streak (deduplicated).
                conn.execute(
                    update(worker_records)
                    .where(where)
                    .values(polled_at=now, poll_health="failing", fence=fence)
                )
                if row["poll_health"] != "failing":
                    detail = f"status read failed: {read.detail}" if read.detail else "status read failed"
                    self._event(
                        conn,
                        write_id,
                        "poll_failed",
                        WriteState.CONFIRMED,
                        WriteState.CONFIRMED,
                        detail,
                        fence=fence,
                    )
                return False
            encoded = canonical_encode(read.snapshot, max_size=MAX_CONTENT)
            changed = row["snapshot"] is None or bytes(row["snapshot"]) != encoded
            conn.execute(
                update(worker_records)
                .where(where)
                .values(snapshot=encoded, polled_at=now, poll_health="ok", fence=fence, updated_at=now)
            )
            if row["poll_health"] == "failing":
                self._event(
                    conn,
                    write_id,
                    "poll_recovered",
                    WriteState.CONFIRMED,
                    WriteState.CONFIRMED,
                    "status read again",
                    fence=fence,
                )
            if changed:
                self._event(
                    conn,
                    write_id,
                    "status_changed",
                    WriteState.CONFIRMED,
                    WriteState.CONFIRMED,
                    "a new status snapshot",
                    fence=fence,
                )
            return changed

    # -- reading -----------------------------------------------------------------------------------

    def get(self, write_id: str) -> RowMapping:
        """The record row with this ``write_id`` in this queue; RecordStateError if there is none."""
        records = worker_records.c
        with self._read() as conn:
            row = (
                conn.execute(
                    select(worker_records).where(records.write_id == write_id, records.queue == self.queue)
                )
                .mappings()
                .first()
            )
        if row is None:
            raise RecordStateError(
                f"no record {write_id!r} in queue {self.queue!r}", write_id=write_id, state=None
            )
        return row

    def find(self, source_key: str) -> RowMapping:
        """The record accepted under ``source_key`` for the scope's tenant."""
        records = worker_records.c
        with self._read() as conn:
            row = (
                conn.execute(
                    select(worker_records).where(
                        records.queue == self.queue,
                        records.tenant == self.scope.tenant,
                        records.source_key == source_key,
                    )
                )
                .mappings()
                .first()
            )
        if row is None:
            raise RecordStateError(f"no record with source key {source_key!r}", write_id=None, state=None)
        return row

    def events(self, write_id: str | None = None) -> list[dict[str, object]]:
        """The queue's events (or one record's), oldest first, JSON-able."""
        query = select(worker_events).where(worker_events.c.queue == self.queue)
        if write_id is not None:
            query = query.where(worker_events.c.write_id == write_id)
        with self._read() as conn:
            rows = conn.execute(query.order_by(worker_events.c.position)).mappings().all()
        return [
            {**{k: v for k, v in r.items() if k != "recorded_at"}, "recorded_at": _iso(r["recorded_at"])}
            for r in rows
        ]

    def status(self, *, records: bool = True) -> dict[str, object]:
        """A JSON-able snapshot of the queue: scope, lease, counts per state, records."""
        table = worker_records.c
        with self._read() as conn:
            counts: dict[str, int] = dict(
                conn.execute(
                    select(table.state, func.count()).where(table.queue == self.queue).group_by(table.state)
                ).all()
            )
            lease = (
                conn.execute(select(worker_leases).where(worker_leases.c.queue == self.queue))
                .mappings()
                .one()
            )
            rows = (
                conn.execute(select(worker_records).where(table.queue == self.queue).order_by(table.id))
                .mappings()
                .all()
                if records
                else []
            )
        payload: dict[str, object] = {
            "queue": self.queue,
            "scope": self.scope.as_dict(),
            "lease": {"token": lease["token"], "holder": lease["holder"], "heartbeat": lease["heartbeat"]},
            "counts": {state: int(counts.get(state, 0)) for state in WriteState},
        }
        if records:
            payload["records"] = [
                {
                    "write_id": r["write_id"],
                    "source_key": r["source_key"],
                    "state": r["state"],
                    "attempts": r["attempts"],
                    "diagnostic": r["diagnostic"],
                    "snapshot": None if r["snapshot"] is None else canonical_decode(bytes(r["snapshot"])),
                    "poll_health": r["poll_health"],
                    "polled_at": None if r["polled_at"] is None else _iso(r["polled_at"]),
                }
                for r in rows
            ]
        return payload

    def export_status(self, path: str | os.PathLike[str]) -> None:
        """Write :meth:`status` to ``path`` atomically (temporary file, fsync, rename)."""
        write_json_atomically(path, self.status())


def _iso(value: datetime | str) -> str:
    return as_utc(value).isoformat()
