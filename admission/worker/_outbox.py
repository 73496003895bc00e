"""The transactional outbox on admission's event log, and its relay into the durable worker.

Issue 6 item 1, worker contract preamble.  :func:`record_outbox` appends an
``outbox.v1`` event to ``workflow_history_events`` inside the caller's
transaction, so the work for an external target commits (or not) together
with the admission that caused it.  :class:`OutboxRelay` reads the log after
its tracked :class:`~admission.receipts.EventCursor` (``Store.read_events``: on
PostgreSQL it never passes a transaction still open) and, for each outbox
event, accepts the record into the worker's intake *in the same transaction
of the worker's store* as it moves its cursor, which that store keeps beside
the records: progress and effect commit together, and a crash in between
leaves neither.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final

from admission.errors import (
    EventLogMovedError,
    InvalidRecordError,
    QueueFullError,
    ScopeMismatchError,
    StorageError,
)
from admission.intent._encoding import canonical_decode, canonical_encode
from admission.receipts._store import EventCursor, EventRow, Store
from admission.worker._intake import check_name
from admission.worker._store import WorkerTransaction
from admission.worker._worker import DurableWorker

__all__ = ["OUTBOX_EVENT", "OutboxRelay", "RelayReport", "record_outbox"]

OUTBOX_EVENT: Final = "outbox.v1"
"""The event type of an outbox entry in the admission event log."""


def _utcnow() -> datetime:
    return datetime.now(UTC)


def record_outbox(
    store: Store,
    connection: object | None,
    namespace: str,
    workflow_id: str,
    *,
    target: str,
    source_key: str,
    content: Mapping[str, object],
    now: datetime | None = None,
) -> EventRow:
    """Append an outbox entry for ``target`` to the instance's event log, in the caller's transaction.

    ``connection`` is the caller's transaction (``SqlStore.begin()`` or a
    ``Session``: the same one the admission used); nothing here commits or rolls back it.  Without
    one (a memory store) the entry is appended in a transaction of its own.  ``content`` is the record the
    worker will accept (its scope fields and ``payload``); ``source_key`` is
    its intake key.
    """
    check_name(target, "target")
    check_name(source_key, "source_key")
    if not isinstance(content, Mapping):
        raise InvalidRecordError("must be a JSON object", field="content")
    payload = canonical_encode({"target": target, "source_key": source_key, "content": dict(content)})
    stamp = now or _utcnow()
    with store.locked(
        namespace, workflow_id, created_at=stamp, new_id=str(uuid.uuid4()), connection=connection
    ) as locked:
        return locked.append_event(
            EventRow(
                namespace=namespace,
                instance_id=locked.instance.id,
                run_id=locked.instance.current_run_id,
                event_type=OUTBOX_EVENT,
                command_id=None,
                update_id=None,
                payload=payload,
                recorded_at=stamp,
            )
        )


@dataclass(frozen=True)
class RelayReport:
    """What one relay pass did: events read, records accepted, duplicates, conflicts,
    entries the worker refused (recorded as ``intake_refused`` events), and whether it
    stopped early because the worker's queue was full (nothing dropped)."""

    read: int = 0
    accepted: int = 0
    duplicates: int = 0
    conflicts: int = 0
    refused: int = 0
    blocked: bool = False


def _report(tally: dict[str, int], *, blocked: bool) -> RelayReport:
    return RelayReport(
        tally["read"], tally["accepted"], tally["duplicate"], tally["conflict"], tally["refused"], blocked
    )


def _no_hook(_point: str) -> None:
    return None


class OutboxRelay:
    """Moves outbox entries for one target from the event log into a worker's intake.

    ``store`` holds the event log (any receipt :class:`~admission.receipts.Store`);
    the relay's cursor lives in the worker's store, so the accept and the
    cursor move share one transaction there (``hook("before_commit")`` is
    called inside it, for crash tests).  A conflicting entry (changed content
    under a key already accepted) is passed over and counted, as the worker
    contract refuses it; a full queue stops the pass before the entry, which
    is read again next time.
    """

    def __init__(
        self,
        store: Store,
        worker: DurableWorker,
        *,
        target: str,
        consumer: str | None = None,
        now: Callable[[], datetime] = _utcnow,
        hook: Callable[[str], None] = _no_hook,
    ) -> None:
        self.store = store
        self.worker = worker
        self.target = target
        # The cursor row is keyed by the consumer: a default built from a long queue
        # and target must fit its column too, or the relay asks for a name.
        self.consumer = check_name(consumer or f"worker:{worker.queue}:{target}", "consumer")
        self._now = now
        self._hook = hook

    def cursor(self) -> EventCursor:
        """Where this relay stands."""
        return self.worker.store.read_cursor(self.consumer)

    def pump(self, limit: int = 100) -> RelayReport:
        """One pass over at most ``limit`` events after the cursor.

        Raises :class:`~admission.errors.EventLogMovedError` naming this relay,
        having moved nothing, when the log was moved to another PostgreSQL
        cluster and not rebased yet (docs/event-log.md).
        """
        tally = {"read": 0, "accepted": 0, "duplicate": 0, "conflict": 0, "refused": 0}
        try:
            events = self.store.read_events(self.cursor(), limit)
        except EventLogMovedError as exc:
            # Named, so that the operator knows which cursor the rebase must carry.
            raise EventLogMovedError(
                f"relay {self.consumer!r}: {exc}",
                cursor=exc.cursor,
                next_tx_id=exc.next_tx_id,
                consumer=self.consumer,
            ) from exc
        for event in events:
            try:
                with self.worker.store.transaction(self.worker.queue) as tx:
                    self._advance(tx, event)
                    outcome = self._relay(tx, event)
                    self._hook("before_commit")
            except QueueFullError:
                return _report(tally, blocked=True)
            tally["read"] += 1
            if outcome is not None:
                tally[outcome] += 1
        return _report(tally, blocked=False)

    def _relay(self, tx: WorkerTransaction, event: EventRow) -> str | None:
        if event.event_type != OUTBOX_EVENT:
            return None
        entry = canonical_decode(event.payload)
        if not isinstance(entry, dict) or entry.get("target") != self.target:
            return None
        content = entry.get("content")
        source_key = entry.get("source_key")
        record = {**content, "source_key": source_key} if isinstance(content, dict) else content
        try:
            return self.worker.accept_in(tx, record).outcome
        except (InvalidRecordError, ScopeMismatchError) as exc:
            # Refused, not dropped: the refusal is an event of the worker's log,
            # committed with the cursor move, so the entry is passed over visibly.
            self.worker.record_refusal(tx, f"outbox event {event.position}: {exc}")
            return "refused"

    def _advance(self, tx: WorkerTransaction, event: EventRow) -> None:
        # Compare-and-set from the cursor as this transaction reads it: a second
        # relay that already moved past the event makes this one stop, not repeat.
        current = tx.cursor(self.consumer)
        if (event.tx_id, event.position) <= (current.tx_id, current.position):
            raise StorageError(f"relay {self.consumer!r} was moved by another process; pass again")
        if not tx.move_cursor(self.consumer, current, EventCursor(event.tx_id, event.position), self._now()):
            raise StorageError(f"relay {self.consumer!r} was moved by another process; pass again")
