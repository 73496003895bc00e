"""The durable worker: scoped intake, the fenced write cycle, reconciliation and observation.

Worker contract §1-§3, §5.  Every state change is one transaction of the
worker's :class:`~admission.worker.WorkerStore` that also appends its event;
the state it moves to is looked up in :data:`~admission.worker.WRITE_TRANSITIONS`,
never decided here.  A record is committed ``in_flight`` *before* the target
is called, so any crash after that point is found by the next start and
turns the record ``uncertain``, which only an exact readback or an operator's
``resolve`` settles.

Ownership (contract §3, docs/worker.md): a local worker holds a non-blocking
``fcntl.flock`` on a lock file for as long as it owns the queue; every owner
also claims the queue's lease, which increments the fencing token.  Every
update of a record carries the writer's token in ``fence`` and the store
refuses one that is not the current token
(:class:`~admission.errors.FencedError`).  A claimant takes over a live-looking
lease only after watching its heartbeat stand still for ``lease_ttl``
seconds on the claimant's own monotonic clock.
"""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Final

from admission import _bounds as bounds
from admission import telemetry
from admission._files import write_json_atomically
from admission.errors import (
    BeforeWriteError,
    InvalidRecordError,
    QueueFullError,
    RecordStateError,
    ScopeMismatchError,
    StorageError,
    TargetTimeoutError,
)
from admission.intent._encoding import canonical_decode
from admission.worker._intake import Intake, Scope, WorkerLimits, check_name, validate_record
from admission.worker._lease import QueueLease
from admission.worker._observe import PollReport, StatusObserver
from admission.worker._states import (
    WAITING_WRITE_STATES,
    WriteState,
    after_before_write_error,
)
from admission.worker._store import WorkerRecord, WorkerStore, WorkerTransaction, WorkItem
from admission.worker._targets import Target, TargetRecord
from admission.worker._transitions import RecordWriter, number

__all__ = ["CRASH_POINTS", "CycleReport", "DurableWorker", "PollReport"]

CRASH_POINTS: Final = ("before_dispatch", "after_in_flight", "after_target_commit", "after_confirm")
"""The named points of a send at which the worker calls its ``hook`` (crash tests stop it there)."""

_ACKNOWLEDGED: Final = "the target acknowledged the write"
_log: Final = telemetry.logger("worker")
_RESOLUTIONS: Final = {
    "confirm": "resolve_confirm",
    "failed_safe": "resolve_failed_safe",
    "release": "resolve_release",
}


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


def _counts(report: CycleReport) -> str:
    return ", ".join(f"{k} {v}" for k, v in vars(report).items() if k != "token" and v) or "nothing to do"


def _utcnow() -> datetime:
    return datetime.now(UTC)


def _no_hook(_point: str) -> None:
    return None


def _write_id(value: object) -> str:
    # A write id is stored in an ID-wide column: one that does not fit is refused, never stored.
    fault = bounds.text_fault(value, bounds.ID)
    if fault is not None:
        raise InvalidRecordError(fault, field="new_id")
    assert isinstance(value, str)
    return value


class DurableWorker:
    """One queue of records for one scope, on a :class:`~admission.worker.WorkerStore`.

    ``store`` is a :class:`~admission.worker.MemoryWorkerStore` or an
    :class:`~admission.sql.SqlWorkerStore` (SQLite or PostgreSQL, at the head
    revision).  ``lock_path`` is the local file lock (default: the store's,
    next to a SQLite database; none on PostgreSQL, where the lease alone
    decides; ``file_lock=False`` turns it off).  ``now`` stamps rows;
    ``monotonic`` decides liveness.  ``hook`` is called with each name of
    :data:`CRASH_POINTS` during a send.  ``claim_wait`` is how long
    :meth:`claim` keeps trying a held lease.  ``send_batch`` records are put in
    flight per commit (default 1): more is faster, but a crash then leaves up
    to that many records ``uncertain``, some of them never sent (docs/worker.md).
    """

    def __init__(
        self,
        store: WorkerStore,
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
        check_name(queue, "queue")
        if lease_ttl <= 0:
            raise InvalidRecordError("must be positive", field="lease_ttl")
        self.store = store
        self.scope = scope
        self.queue = queue
        self.limits = limits or WorkerLimits()
        self.holder = check_name(
            holder or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}", "holder"
        )
        self.lease_ttl = lease_ttl
        self.claim_wait = claim_wait
        self.send_batch = number(send_batch, "send_batch", 1, 1000)
        if file_lock is None:
            file_lock = lock_path is not None or store.default_lock_path(queue) is not None
        if file_lock and lock_path is None:
            lock_path = store.default_lock_path(queue)
            if lock_path is None:
                raise InvalidRecordError("a file lock needs lock_path on this database", field="lock_path")
        self.lock_path = Path(lock_path) if file_lock and lock_path is not None else None
        self._now = now
        self._hook = hook or _no_hook
        self._new_id = new_id
        self.lease = QueueLease(
            queue,
            self.holder,
            store=store,
            lock_path=self.lock_path,
            local_exclusive=store.local,
            lease_ttl=lease_ttl,
            claim_wait=claim_wait,
            now=now,
            monotonic=monotonic,
        )
        self._writer = RecordWriter(store, queue, self.lease, self.limits, now)
        self._observer = StatusObserver(self._writer, now)
        self._open_queue()

    # -- the queue and its pinned scope (contract §1) -------------------------------------------

    def _open_queue(self) -> None:
        pinned = self.store.open_queue(self.queue, self.scope.encode(), self._now())
        if pinned != self.scope.encode():
            stored = canonical_decode(pinned)
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

    def accept(self, record: object, *, connection: object | None = None) -> Intake:
        """Validate, then commit the record before acknowledging it (contract §1).

        With ``connection`` the write joins the caller's transaction (a SQL
        store's ``Connection`` or ``Session``; the caller commits).  Raises QueueFullError past
        the bound of waiting records.
        """
        source_key, content = self.validate(record)
        with self.store.transaction(self.queue, connection=connection) as tx:
            return self._accept(tx, source_key, content)

    def accept_in(self, tx: WorkerTransaction, record: object) -> Intake:
        """:meth:`accept` inside a transaction already open on this worker's queue
        (the outbox relay moves its cursor in the same one)."""
        source_key, content = self.validate(record)
        return self._accept(tx, source_key, content)

    def _accept(self, tx: WorkerTransaction, source_key: str, content: bytes) -> Intake:
        tenant = self.scope.tenant
        tx.lock_intake()
        existing = tx.find(tenant, source_key)
        if existing is not None:
            same = existing.content == content
            return Intake("duplicate" if same else "conflict", existing.write_id, existing.state)
        waiting = tx.count(WAITING_WRITE_STATES)
        if waiting >= self.limits.max_waiting:
            raise QueueFullError(
                f"queue {self.queue!r} already holds {waiting} waiting records "
                f"(limit {self.limits.max_waiting}); the record was not accepted, retry later",
                queue=self.queue,
                limit=self.limits.max_waiting,
                waiting=waiting,
            )
        now = self._now()
        fresh = WorkerRecord(
            0, _write_id(self._new_id()), self.queue, tenant, source_key, content, WriteState.PREPARED, 0,
            None, None, None, None, None, now, now,
        )  # fmt: skip
        if not tx.insert(fresh):  # pragma: no cover - the intake lock above prevents this race
            raise StorageError("a concurrent intake of the same key; retry")
        self._writer.event(
            tx, fresh.write_id, "accepted", None, WriteState.PREPARED, "record accepted", fence=None
        )
        return Intake("accepted", fresh.write_id, WriteState.PREPARED)

    def record_refusal(self, tx: WorkerTransaction, reason: str) -> None:
        """Append an ``intake_refused`` event in an open transaction (a producer that
        must not drop what the intake refused, such as the outbox relay)."""
        self._writer.event(tx, None, "intake_refused", None, None, reason, fence=None)

    # -- ownership (contract §3, QueueLease) ------------------------------------------------------

    def owned(self) -> AbstractContextManager[int]:
        """Own the queue for the block: file lock (if any), then a lease claim; yields the token."""
        return self.lease.owned()

    def claim(self) -> int:
        """Take the file lock and claim the lease with a new fencing token (see :class:`QueueLease`)."""
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
        with telemetry.span("admission.worker.cycle", {"admission.worker.queue": self.queue}) as span:
            report = self._cycle(target)
            counts = {f"admission.worker.{k}": v for k, v in vars(report).items() if k != "token"}
            span.set({"admission.worker.token": report.token, **counts})
        # A cycle that found nothing to do is not news; one that left records uncertain or failed is.
        busy = any(v for k, v in vars(report).items() if k != "token")
        worrying = report.uncertain or report.failed_safe or report.still_uncertain
        level = logging.WARNING if worrying else logging.INFO if busy else logging.DEBUG
        _log.log(level, "cycle of %s (token %d): %s", self.queue, report.token, _counts(report))
        return report

    def _cycle(self, target: Target) -> CycleReport:
        with self.owned() as token:
            # A long-lived owner (``start``) renews here too, so that idle time
            # between cycles never lets the lease lapse.
            self.keep_lease()
            counts = {"recovered": 0, "reconciled": 0, "still_uncertain": 0, "sent": 0}
            outcomes = {"confirmed": 0, "retried": 0, "failed_safe": 0, "uncertain": 0}
            for item in self.store.work(self.queue, WriteState.IN_FLIGHT):
                self._writer.transition(
                    item, "crash_found", "found in_flight at start: the send may have landed"
                )
                counts["recovered"] += 1
            for item in self.store.work(self.queue, WriteState.UNCERTAIN):
                counts["reconciled" if self._reconcile(target, item) else "still_uncertain"] += 1
            # Records the target acknowledged are confirmed in the same commit that
            # puts the next batch in flight (docs/worker.md: one queue commit per
            # batch).  Until then they are in_flight with their writes landed: a
            # crash leaves them for the next start to find uncertain and confirm
            # by readback, never to send again.
            acknowledged: list[WorkItem] = []
            prepared = self.store.work(self.queue, WriteState.PREPARED)
            for start in range(0, len(prepared), self.send_batch):
                self._hook("before_dispatch")
                self.keep_lease()
                flights = self._dispatch(prepared[start : start + self.send_batch], acknowledged)
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
                with self.store.transaction(self.queue) as tx:
                    self._writer.step_many(
                        tx, self._writer.fence(tx), acknowledged, "acknowledged", _ACKNOWLEDGED
                    )
                outcomes["confirmed"] += len(acknowledged)
                self._hook("after_confirm")
            return CycleReport(token, **counts, **outcomes)

    def _reconcile(self, target: Target, item: WorkItem) -> bool:
        self.keep_lease()
        try:
            answer = target.read_back(item.write_id)
        except Exception:
            return False
        # Only a positive exact readback with the same write_id confirms (contract §2);
        # missing, unknown or different content leaves the record uncertain.
        if answer.kind != "found" or answer.write_id != item.write_id or answer.content != item.content:
            return False
        self._writer.transition(item, "readback_found", "exact readback of the same write_id")
        return True

    def _dispatch(self, batch: list[WorkItem], acknowledged: list[WorkItem]) -> list[WorkItem]:
        # One commit: confirm what the target acknowledged, and put the batch in
        # flight (with its attempt counted) before any of it is sent (contract §2).
        with self.store.transaction(self.queue) as tx:
            fence = self._writer.fence(tx)
            if acknowledged:
                self._writer.step_many(tx, fence, acknowledged, "acknowledged", _ACKNOWLEDGED)
            return self._writer.step_many(tx, fence, batch, "dispatch", "sending", count_attempt=True)

    def _send(self, target: Target, flight: WorkItem) -> str:
        self._hook("after_in_flight")
        try:
            target.write(TargetRecord(flight.write_id, flight.tenant, flight.source_key, flight.content))
        except BeforeWriteError as exc:
            event = after_before_write_error(flight.attempts, self.limits.max_attempts)
            self._writer.transition(flight, event, f"before-write error: {exc}", diagnostic=str(exc))
            return "retried" if event == "before_write_error" else "failed_safe"
        except TargetTimeoutError as exc:
            self._writer.transition(
                flight, "timeout", "the target did not answer in time", diagnostic=str(exc)
            )
            return "uncertain"
        except Exception as exc:  # any other failure may have landed (contract §2)
            self._writer.transition(
                flight, "error", f"{type(exc).__name__} during the write", diagnostic=repr(exc)
            )
            return "uncertain"
        self._hook("after_target_commit")
        return "acknowledged"

    # -- the operator (contract §2) --------------------------------------------------------------

    def resolve(self, write_id: str, decision: str, *, actor: str, reason: str) -> str:
        """Settle an ``uncertain`` record by an operator's decision, recorded with who and why.

        ``decision`` is ``confirm``, ``failed_safe`` or ``release`` (back to
        ``prepared`` for another send, with its attempts counted afresh).
        Returns the new state.
        """
        if decision not in _RESOLUTIONS:
            raise InvalidRecordError(f"must be one of {', '.join(_RESOLUTIONS)}", field="decision")
        if not isinstance(actor, str) or not actor.strip():
            raise InvalidRecordError("must name who decides", field="actor")
        check_name(actor, "actor")
        if not isinstance(reason, str) or not reason.strip():
            raise InvalidRecordError("must say why", field="reason")
        values = {"attempts": 0} if decision == "release" else None
        return self._writer.transition(
            self.get(write_id), _RESOLUTIONS[decision], reason, actor=actor, values=values
        )

    # -- observation (contract §5) ---------------------------------------------------------------

    def observe(self, write_id: str, snapshot: object = None, *, missing: bool = False) -> bool:
        """Store the latest status snapshot of a confirmed record; True if it changed.

        Only a changed snapshot makes an event.  ``missing=True`` says the
        target positively no longer has the row: the record becomes
        ``confirmed_then_missing`` and is never recreated.
        """
        return self._observer.observe(self.get(write_id), snapshot, missing=missing)

    def poll_status(self, target: Target, limit: int = 100) -> PollReport:
        """One fair, bounded polling pass: at most ``limit`` (1-1000) confirmed records,
        oldest-polled first (never polled first of all)."""
        number(limit, "poll_limit", 1, 1000)
        with self.owned():
            return self._observer.poll(target, limit, self.keep_lease)

    # -- reading -----------------------------------------------------------------------------------

    def get(self, write_id: str) -> WorkerRecord:
        """The record with this ``write_id`` in this queue; RecordStateError if there is none."""
        # Checked like a stored value, so a lookup no backend could answer is input, not a storage error.
        fault = bounds.text_fault(write_id, bounds.ID)
        if fault is not None:
            raise InvalidRecordError(fault, field="write_id")
        record = self.store.record(self.queue, write_id)
        if record is None:
            raise RecordStateError(
                f"no record {write_id!r} in queue {self.queue!r}", write_id=write_id, state=None
            )
        return record

    def find(self, source_key: str) -> WorkerRecord:
        """The record accepted under ``source_key`` for the scope's tenant."""
        check_name(source_key, "source_key")
        record = self.store.record_by_key(self.queue, self.scope.tenant, source_key)
        if record is None:
            raise RecordStateError(f"no record with source key {source_key!r}", write_id=None, state=None)
        return record

    def events(self, write_id: str | None = None) -> list[dict[str, object]]:
        """The queue's events (or one record's), oldest first, JSON-able."""
        return [event.to_dict() for event in self.store.events(self.queue, write_id)]

    def status(self, *, records: bool = True) -> dict[str, object]:
        """A JSON-able snapshot of the queue: scope, lease, counts per state, records."""
        counts = self.store.counts(self.queue)
        lease = self.store.lease_of(self.queue)
        payload: dict[str, object] = {
            "queue": self.queue,
            "scope": self.scope.as_dict(),
            "lease": {"token": lease.token, "holder": lease.holder, "heartbeat": lease.heartbeat},
            "counts": {str(state): counts.get(state, 0) for state in WriteState},
        }
        if records:
            payload["records"] = [
                {
                    "write_id": r.write_id,
                    "source_key": r.source_key,
                    "state": r.state,
                    "attempts": r.attempts,
                    "diagnostic": r.diagnostic,
                    "snapshot": None if r.snapshot is None else canonical_decode(r.snapshot),
                    "poll_health": r.poll_health,
                    "polled_at": None if r.polled_at is None else r.polled_at.isoformat(),
                }
                for r in self.store.records(self.queue)
            ]
        return payload

    def export_status(self, path: str | os.PathLike[str]) -> None:
        """Write :meth:`status` to ``path`` atomically (temporary file, fsync, rename)."""
        write_json_atomically(path, self.status())
