"""The storage port of the durable worker, and the values that cross it (worker contract §1-§3, §5).

:class:`DurableWorker` speaks only to :class:`WorkerStore`.  A store opens a
:class:`WorkerTransaction` on one queue: everything the worker reads and
writes there for one state change happens inside it, and it commits or rolls
back as a whole, with the events that record the change.  Every update of a
record carries the writer's fencing token, and the store refuses one that is
not the queue's current token (:class:`~admission.errors.FencedError`): the
database decides, never the writer (contract §3).

Implementations: :class:`~admission.worker.MemoryWorkerStore` (in memory, a
real implementation that the contract suite runs beside the others) and
:class:`~admission.sql.SqlWorkerStore` (SQLite and PostgreSQL).

Pure: no SQLAlchemy, no clock (times are passed in), no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

from admission.errors import FencedError
from admission.receipts._store import EventCursor

__all__ = [
    "RECORD_CHANGES",
    "LeaseRow",
    "WorkItem",
    "WorkerEvent",
    "WorkerRecord",
    "WorkerStore",
    "WorkerTransaction",
    "stale_fence",
]

RECORD_CHANGES = frozenset(
    {"state", "attempts", "diagnostic", "snapshot", "poll_health", "polled_at", "updated_at"}
)
"""The fields of a record a transition may change (besides ``fence``, which every update carries)."""


@dataclass(frozen=True)
class WorkerRecord:
    """An accepted record, as stored.  ``position`` is its place in the queue (sends go in this order)."""

    position: int
    write_id: str
    queue: str
    tenant: str
    source_key: str
    content: bytes
    state: str
    attempts: int
    diagnostic: str | None
    fence: int | None
    snapshot: bytes | None
    poll_health: str | None
    polled_at: datetime | None
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True)
class WorkItem:
    """What a send, a transition and a readback use of a record: the write cycle reads only this."""

    write_id: str
    tenant: str
    source_key: str
    content: bytes
    state: str
    attempts: int


@dataclass(frozen=True)
class WorkerEvent:
    """One event of the worker's log.  ``position`` is set by the store."""

    queue: str
    write_id: str | None
    event_type: str
    from_state: str | None
    to_state: str | None
    reason: str
    actor: str | None
    fence: int | None
    recorded_at: datetime
    position: int = field(default=0)

    def to_dict(self) -> dict[str, object]:
        """The JSON form, in the log's column order."""
        return {
            "position": self.position,
            "queue": self.queue,
            "write_id": self.write_id,
            "event_type": self.event_type,
            "from_state": self.from_state,
            "to_state": self.to_state,
            "reason": self.reason,
            "actor": self.actor,
            "fence": self.fence,
            "recorded_at": self.recorded_at.isoformat(),
        }


@dataclass(frozen=True)
class LeaseRow:
    """A queue's lease: the fencing ``token`` (every claim increments it), its ``holder``
    (``None`` once released) and the ``heartbeat`` the holder bumps on every renewal."""

    queue: str
    token: int
    holder: str | None
    heartbeat: int
    claimed_at: datetime | None


def stale_fence(queue: str, token: int) -> FencedError:
    """The refusal of a record update whose fencing token is no longer the queue's (contract §3)."""
    return FencedError(
        f"the database refused a write of queue {queue!r} with fencing token {token}: "
        "another worker has claimed the queue",
        queue=queue,
        token=token,
    )


class WorkerTransaction(Protocol):
    """One queue's state inside one transaction of the store."""

    def token(self) -> int:
        """The queue's current fencing token, locked until the transaction ends."""
        ...

    def lease(self) -> LeaseRow:
        """The queue's lease row, locked until the transaction ends."""
        ...

    def take_lease(self, token: int, holder: str, claimed_at: datetime) -> None:
        """Give the lease to ``holder`` under the new ``token``, with a fresh heartbeat."""
        ...

    def renew_lease(self, token: int) -> bool:
        """Bump the heartbeat if the lease is still ``token``'s; ``False`` if another claimed it."""
        ...

    def release_lease(self, token: int) -> None:
        """Release the lease if it is still ``token``'s."""
        ...

    def lock_intake(self) -> None:
        """Serialise intake on the queue until the transaction ends, so the bound holds exactly."""
        ...

    def find(self, tenant: str, source_key: str) -> WorkerRecord | None:
        """The record accepted under this intake key, if any."""
        ...

    def count(self, states: frozenset[str]) -> int:
        """How many of the queue's records are in one of ``states``."""
        ...

    def insert(self, record: WorkerRecord) -> bool:
        """Insert a record (its ``position`` is assigned); ``False`` if its intake key is taken."""
        ...

    def update(self, write_id: str, expected: str, fence: int, changes: Mapping[str, object]) -> bool:
        """Change a record still in state ``expected`` (``changes`` keys: :data:`RECORD_CHANGES`),
        writing ``fence``; ``False`` if it left that state.  A stale fence is refused."""
        ...

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
        """Move records still in ``expected`` to ``state`` (counting an attempt if asked); how many moved."""
        ...

    def record_events(self, event: WorkerEvent, write_ids: Sequence[str | None]) -> None:
        """Append ``event`` once per id in ``write_ids`` (everything else as given)."""
        ...

    def cursor(self, consumer: str) -> EventCursor:
        """Where ``consumer`` stands in the admission event log (the start if it never moved)."""
        ...

    def move_cursor(self, consumer: str, before: EventCursor, after: EventCursor, now: datetime) -> bool:
        """Move ``consumer`` from ``before`` to ``after``; ``False`` if it no longer stands at ``before``."""
        ...


class WorkerStore(Protocol):
    """The storage port of the durable worker."""

    @property
    def local(self) -> bool:
        """Whether every owner of this store runs on this machine (an embedded database, memory):
        then a held file lock proves that no other owner is alive (contract §3)."""
        ...

    def default_lock_path(self, queue: str) -> str | None:
        """Where a local owner of ``queue`` keeps its lock file by default (``None``: no file)."""
        ...

    def open_queue(self, queue: str, scope: bytes, now: datetime) -> bytes:
        """Create ``queue`` pinned to ``scope`` (and its lease) unless it exists; the pinned scope."""
        ...

    def transaction(
        self, queue: str, *, connection: object | None = None
    ) -> AbstractContextManager[WorkerTransaction]:
        """A transaction on ``queue``.  With ``connection`` the caller owns the transaction
        (a SQL store's connection in a write transaction): the store neither commits nor rolls back."""
        ...

    def work(self, queue: str, state: str) -> list[WorkItem]:
        """The queue's records in ``state``, in queue order."""
        ...

    def record(self, queue: str, write_id: str) -> WorkerRecord | None:
        """One record of the queue, by ``write_id``."""
        ...

    def record_by_key(self, queue: str, tenant: str, source_key: str) -> WorkerRecord | None:
        """One record of the queue, by its intake key."""
        ...

    def records(self, queue: str) -> list[WorkerRecord]:
        """Every record of the queue, in queue order."""
        ...

    def poll_batch(self, queue: str, state: str, limit: int) -> list[WorkerRecord]:
        """At most ``limit`` records in ``state``, never polled first, then oldest polled (fair polling)."""
        ...

    def events(self, queue: str, write_id: str | None = None) -> list[WorkerEvent]:
        """The queue's events (or one record's), oldest first."""
        ...

    def counts(self, queue: str) -> dict[str, int]:
        """How many records of the queue are in each state (states with none are left out)."""
        ...

    def lease_of(self, queue: str) -> LeaseRow:
        """The queue's lease as it stands."""
        ...

    def read_cursor(self, consumer: str) -> EventCursor:
        """Where ``consumer`` stands in the admission event log, outside any transaction."""
        ...
