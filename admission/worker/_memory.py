"""The in-memory worker store: a complete :class:`~admission.worker.WorkerStore` in one process.

A real implementation of the port, not a mock: one lock, and transactions
that work on a copy of the tables and replace them on commit, so a failed
transaction leaves nothing behind.  It enforces what the database enforces
for the SQL store: the unique intake key, and the fencing rule that refuses a
record update whose token is not the queue's current one (contract §3).

Pure: no SQLAlchemy, no clock, no I/O.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, replace
from datetime import datetime

from admission.errors import InputError
from admission.receipts._store import EventCursor
from admission.worker._store import (
    RECORD_CHANGES,
    LeaseRow,
    WorkerEvent,
    WorkerRecord,
    WorkerTransaction,
    WorkItem,
    stale_fence,
)

__all__ = ["MemoryWorkerStore"]


@dataclass
class _Tables:
    scopes: dict[str, bytes]
    leases: dict[str, LeaseRow]
    records: dict[str, WorkerRecord]
    keys: dict[tuple[str, str, str], str]
    events: list[WorkerEvent]
    cursors: dict[str, EventCursor]
    last_record: int = 0
    last_event: int = 0

    def copy(self) -> _Tables:
        return _Tables(
            dict(self.scopes),
            dict(self.leases),
            dict(self.records),
            dict(self.keys),
            list(self.events),
            dict(self.cursors),
            self.last_record,
            self.last_event,
        )


def _item(record: WorkerRecord) -> WorkItem:
    return WorkItem(
        record.write_id, record.tenant, record.source_key, record.content, record.state, record.attempts
    )


class _MemoryTransaction:
    def __init__(self, tables: _Tables, queue: str) -> None:
        self._t = tables
        self._queue = queue

    def token(self) -> int:
        return self._t.leases[self._queue].token

    def lease(self) -> LeaseRow:
        return self._t.leases[self._queue]

    def take_lease(self, token: int, holder: str, claimed_at: datetime) -> None:
        self._t.leases[self._queue] = LeaseRow(self._queue, token, holder, 0, claimed_at)

    def renew_lease(self, token: int) -> bool:
        lease = self._t.leases[self._queue]
        if lease.token != token:
            return False
        self._t.leases[self._queue] = replace(lease, heartbeat=lease.heartbeat + 1)
        return True

    def release_lease(self, token: int) -> None:
        lease = self._t.leases[self._queue]
        if lease.token == token:
            self._t.leases[self._queue] = replace(lease, holder=None)

    def lock_intake(self) -> None:
        # The store's lock is held for the whole transaction already.
        return None

    def find(self, tenant: str, source_key: str) -> WorkerRecord | None:
        write_id = self._t.keys.get((self._queue, tenant, source_key))
        return None if write_id is None else self._t.records[write_id]

    def count(self, states: frozenset[str]) -> int:
        return sum(1 for r in self._t.records.values() if r.queue == self._queue and r.state in states)

    def insert(self, record: WorkerRecord) -> bool:
        key = (self._queue, record.tenant, record.source_key)
        if key in self._t.keys or record.write_id in self._t.records:
            return False
        self._t.last_record += 1
        self._t.records[record.write_id] = replace(record, queue=self._queue, position=self._t.last_record)
        self._t.keys[key] = record.write_id
        return True

    def _fenced(self, fence: int) -> None:
        # What the database's trigger does for the SQL store (contract §3).
        if fence != self._t.leases[self._queue].token:
            raise stale_fence(self._queue, fence)

    def update(self, write_id: str, expected: str, fence: int, changes: Mapping[str, object]) -> bool:
        unknown = set(changes) - RECORD_CHANGES
        if unknown:
            raise ValueError(f"not a record change: {sorted(unknown)}")
        record = self._t.records.get(write_id)
        if record is None or record.queue != self._queue or record.state != expected:
            return False
        self._fenced(fence)
        self._t.records[write_id] = replace(record, fence=fence, **changes)  # type: ignore[arg-type]
        return True

    def update_many(
        self,
        write_ids: Sequence[str],
        expected: str,
        state: str,
        fence: int,
        now: datetime,
        *,
        count_attempt: bool,
    ) -> int:
        moved = 0
        for write_id in write_ids:
            record = self._t.records.get(write_id)
            if record is None or record.queue != self._queue or record.state != expected:
                continue
            self._fenced(fence)
            attempts = record.attempts + 1 if count_attempt else record.attempts
            self._t.records[write_id] = replace(
                record, state=state, updated_at=now, fence=fence, attempts=attempts
            )
            moved += 1
        return moved

    def record_events(self, event: WorkerEvent, write_ids: Sequence[str | None]) -> None:
        for write_id in write_ids:
            self._t.last_event += 1
            self._t.events.append(replace(event, write_id=write_id, position=self._t.last_event))

    def cursor(self, consumer: str) -> EventCursor:
        return self._t.cursors.get(consumer, EventCursor())

    def move_cursor(self, consumer: str, before: EventCursor, after: EventCursor, now: datetime) -> bool:
        if self.cursor(consumer) != before:
            return False
        self._t.cursors[consumer] = after
        return True


class MemoryWorkerStore:
    """A complete in-memory :class:`~admission.worker.WorkerStore`: one lock, copy-on-begin transactions.

    For tests and for engines that keep their outbox in memory; it keeps
    nothing across processes, so every owner is local (``local`` is true)
    and there is no lock file.
    """

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._tables = _Tables({}, {}, {}, {}, [], {})

    @property
    def local(self) -> bool:
        """Every owner of a memory store runs in this process."""
        return True

    def default_lock_path(self, queue: str) -> str | None:
        """No lock file: the store lives in one process."""
        return None

    def open_queue(self, queue: str, scope: bytes, now: datetime) -> bytes:
        """Create the queue and its lease unless they exist; the pinned scope."""
        with self._lock:
            self._tables.scopes.setdefault(queue, scope)
            self._tables.leases.setdefault(queue, LeaseRow(queue, 0, None, 0, None))
            return self._tables.scopes[queue]

    @contextmanager
    def _transaction(self, queue: str) -> Iterator[WorkerTransaction]:
        with self._lock:
            if queue not in self._tables.leases:
                raise KeyError(f"no queue {queue!r}")
            working = self._tables.copy()
            yield _MemoryTransaction(working, queue)
            self._tables = working

    def transaction(
        self, queue: str, *, connection: object | None = None
    ) -> AbstractContextManager[WorkerTransaction]:
        """A transaction on ``queue``; a memory store has no caller-owned connection."""
        if connection is not None:
            raise InputError("a memory store takes no caller's transaction", field="connection")
        return self._transaction(queue)

    def _of(self, queue: str) -> list[WorkerRecord]:
        with self._lock:
            rows = [r for r in self._tables.records.values() if r.queue == queue]
        return sorted(rows, key=lambda r: r.position)

    def work(self, queue: str, state: str) -> list[WorkItem]:
        """The queue's records in ``state``, in queue order."""
        return [_item(r) for r in self._of(queue) if r.state == state]

    def record(self, queue: str, write_id: str) -> WorkerRecord | None:
        """One record of the queue, by ``write_id``."""
        with self._lock:
            record = self._tables.records.get(write_id)
        return record if record is not None and record.queue == queue else None

    def record_by_key(self, queue: str, tenant: str, source_key: str) -> WorkerRecord | None:
        """One record of the queue, by its intake key."""
        with self._lock:
            write_id = self._tables.keys.get((queue, tenant, source_key))
            return None if write_id is None else self._tables.records[write_id]

    def records(self, queue: str) -> list[WorkerRecord]:
        """Every record of the queue, in queue order."""
        return self._of(queue)

    def poll_batch(self, queue: str, state: str, limit: int) -> list[WorkerRecord]:
        """Records in ``state``: never polled first, then oldest polled, then queue order."""
        rows = [r for r in self._of(queue) if r.state == state]
        rows.sort(key=lambda r: (r.polled_at is not None, r.polled_at or datetime.min, r.position))
        return rows[:limit]

    def events(self, queue: str, write_id: str | None = None) -> list[WorkerEvent]:
        """The queue's events (or one record's), oldest first."""
        with self._lock:
            return [
                e
                for e in self._tables.events
                if e.queue == queue and (write_id is None or e.write_id == write_id)
            ]

    def counts(self, queue: str) -> dict[str, int]:
        """How many records of the queue are in each state."""
        counts: dict[str, int] = {}
        for record in self._of(queue):
            counts[record.state] = counts.get(record.state, 0) + 1
        return counts

    def lease_of(self, queue: str) -> LeaseRow:
        """The queue's lease as it stands."""
        with self._lock:
            return self._tables.leases[queue]

    def read_cursor(self, consumer: str) -> EventCursor:
        """Where ``consumer`` stands in the admission event log."""
        with self._lock:
            return self._tables.cursors.get(consumer, EventCursor())
