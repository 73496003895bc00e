"""The storage port, its row values, and an in-memory reference store.

The admission service speaks only to :class:`Store`.  A store opens a
*locked instance*: everything the service reads and writes about one workflow
instance happens inside it, under the admission lock (contract §4), and it
commits or rolls back as a whole.  :class:`~admission.receipts.MemoryStore` is
a real implementation of the port (not a mock): the contract suite and the
conformance state machine run against it, SQLite and PostgreSQL alike.

Pure: no SQLAlchemy, no clock (times are passed in).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from admission.errors import RunStateError

__all__ = [
    "CommandRow",
    "EventCursor",
    "EventRow",
    "InstanceRow",
    "KeyedLocking",
    "LockedInstance",
    "PruneCounts",
    "PruneTarget",
    "RunRow",
    "Store",
    "UpdateRow",
    "insert_stepwise",
    "run_id_taken",
]


@dataclass(frozen=True)
class InstanceRow:
    """A workflow instance: one per (namespace, workflow_id)."""

    id: str
    namespace: str
    workflow_id: str
    current_run_id: str | None
    created_at: datetime


@dataclass(frozen=True)
class RunRow:
    """One run of an instance."""

    id: str
    instance_id: str
    run_number: int
    status: str
    continued_from_run_id: str | None
    started_at: datetime
    closed_at: datetime | None


@dataclass(frozen=True)
class CommandRow:
    """A command and its receipt, as stored."""

    id: str
    instance_id: str
    run_id: str | None
    command_sequence: int
    command_type: str
    name: str
    target_scope: str
    requested_run_id: str | None
    request_id: str | None
    context: bytes | None
    arguments: bytes | None
    status: str
    outcome: str
    rejection_reason: str | None
    created_at: datetime
    intent_digest: str | None
    arguments_digest: str | None
    intent_encoding: str | None


@dataclass(frozen=True)
class UpdateRow:
    """An update's lifecycle: accepted, then completed or failed."""

    id: str
    command_id: str
    instance_id: str
    run_id: str
    name: str
    status: str
    result: bytes | None
    failure: str | None
    accepted_at: datetime
    completed_at: datetime | None


@dataclass(frozen=True)
class EventRow:
    """One event of the log.  ``position`` and ``tx_id`` are set by the store."""

    namespace: str
    instance_id: str
    run_id: str | None
    event_type: str
    command_id: str | None
    update_id: str | None
    payload: bytes
    recorded_at: datetime
    position: int = 0
    tx_id: int = 0


@dataclass(frozen=True)
class PruneTarget:
    """Rows due for pruning in one instance: the chain of runs ending in
    ``run_id`` (which closed before the cutoff), or, with ``run_id`` ``None``,
    refusals recorded while the instance had no run."""

    namespace: str
    workflow_id: str
    run_id: str | None


@dataclass(frozen=True)
class PruneCounts:
    """What one pruning removed (or, in a dry run, would remove)."""

    runs: int = 0
    commands: int = 0
    updates: int = 0
    events: int = 0

    def __add__(self, other: PruneCounts) -> PruneCounts:
        return PruneCounts(
            self.runs + other.runs,
            self.commands + other.commands,
            self.updates + other.updates,
            self.events + other.events,
        )


@dataclass(frozen=True, order=True)
class EventCursor:
    """Where a reader of the event log stands: after (tx_id, position).

    Readers resume strictly after the cursor, in (tx_id, position) order; see
    ``docs/event-log.md`` for why this never skips an event.
    """

    tx_id: int = 0
    position: int = 0


class LockedInstance(Protocol):
    """One instance, held under the admission lock until the transaction ends."""

    @property
    def instance(self) -> InstanceRow:
        """The locked instance row."""
        ...

    def run(self, run_id: str) -> RunRow | None:
        """A run of this instance, by id."""
        ...

    def current_run(self) -> RunRow | None:
        """The run the instance points at as current (open or closed), if any."""
        ...

    def find_commands(self, command_type: str, request_ids: Sequence[str]) -> list[CommandRow]:
        """Commands of this type whose ``request_id`` is one of ``request_ids``, oldest first."""
        ...

    def find_commands_many(
        self, wanted: Mapping[tuple[str, str], Sequence[str]]
    ) -> dict[tuple[str, str], list[CommandRow]]:
        """:meth:`find_commands` for several (instance id, command type) groups of instances this
        transaction has locked, this one or others: each group's commands under its values, in
        the same order; a batch's lookup of its keys.  Optional: without it a batch asks each
        instance's :meth:`find_commands`."""
        ...

    def get_command(self, command_id: str) -> CommandRow | None:
        """A command of this instance, by id."""
        ...

    def next_command_sequence(self) -> int:
        """The sequence number the next command of this instance gets."""
        ...

    def insert_command(self, row: CommandRow) -> bool:
        """Insert a command; ``False`` if the unique receipt index already holds its key."""
        ...

    def update_for_command(self, command_id: str) -> UpdateRow | None:
        """The update a command created, if any."""
        ...

    def get_update(self, update_id: str) -> UpdateRow | None:
        """An update of this instance, by id."""
        ...

    def insert_update(self, row: UpdateRow) -> None:
        """Insert an update."""
        ...

    def save_update(self, row: UpdateRow) -> None:
        """Record an update's new status (always beside the event that says so)."""
        ...

    def save_command(self, row: CommandRow) -> None:
        """Record a command's new lifecycle status (always beside the event that says so)."""
        ...

    def pending_commands(self, run_ids: Sequence[str]) -> list[tuple[CommandRow, UpdateRow | None]]:
        """Commands of these runs not yet applied (signals ``received``, updates
        ``accepted``), each with its update, in command order."""
        ...

    def insert_run(self, row: RunRow) -> None:
        """Insert a run."""
        ...

    def save_run(self, row: RunRow) -> None:
        """Record a run's new status."""
        ...

    def set_current_run(self, run_id: str | None) -> None:
        """Point the instance at its current run."""
        ...

    def append_event(self, event: EventRow) -> EventRow:
        """Append an event; returns it with its position."""
        ...

    def insert_admitted(
        self, command: CommandRow, update: UpdateRow | None, event: EventRow, *, last: bool = False
    ) -> bool:
        """Insert a fresh command with the update it opens (if any) and its event, all or nothing;
        ``False``, writing nothing, if the unique receipt index already holds its key.

        ``last``: nothing more is written in this transaction, so a store may
        commit it with these rows when it is the store's own (never a caller's
        ``connection=``); after that only reads may follow.
        :func:`insert_stepwise` does it with the methods above.
        """
        ...

    def insert_admitted_many(
        self, admitted: Sequence[tuple[CommandRow, UpdateRow | None, EventRow]], *, last: bool = False
    ) -> bool:
        """Insert many fresh admissions (each as for :meth:`insert_admitted`, in order), made under
        locks this transaction holds, of this instance or any other it has locked: a batch's writes.

        ``False`` if the unique receipt index already held one of their keys;
        rows may then have been written (never committed), and the caller must
        roll the transaction back.  ``last`` as for :meth:`insert_admitted`: a
        store may commit its own transaction with these rows, but only when it
        answers ``True``.  Optional: a batch on a store without it inserts each
        admission as it is decided (:meth:`insert_admitted`).
        """
        ...

    def delete_runs(self, run_ids: Sequence[str]) -> PruneCounts:
        """Delete these runs with their commands, updates and events (retention)."""
        ...

    def delete_runless_refusals(self, before: datetime) -> PruneCounts:
        """Delete refusals recorded without a run before ``before``, with their events."""
        ...

    def latest_time(self, run_ids: Sequence[str]) -> datetime | None:
        """The latest time recorded on any row of these runs: their start and close, their
        commands' creation, their updates' acceptance and completion, and their events.

        These are exactly the rows :meth:`delete_runs` removes; ``None`` if there are none.
        """
        ...


class Store(Protocol):
    """The storage port of the admission service."""

    def locked(
        self,
        namespace: str,
        workflow_id: str,
        *,
        created_at: datetime,
        new_id: str,
        connection: object | None = None,
    ) -> AbstractContextManager[LockedInstance]:
        """Open a transaction holding the admission lock of one instance.

        The instance row is created (with ``new_id``) if it does not exist,
        and the lock is taken even then.  With ``connection`` the caller owns
        the transaction (on a SQL store a ``Connection``, a ``Session``, or
        through the async service an ``AsyncConnection`` or ``AsyncSession``):
        the store neither commits nor rolls back.
        """
        ...

    def locked_many(
        self,
        keys: Sequence[tuple[str, str]],
        *,
        created_at: datetime,
        new_ids: Sequence[str],
        connection: object | None = None,
    ) -> AbstractContextManager[Mapping[tuple[str, str], LockedInstance]]:
        """Open one transaction holding the admission locks of several instances.

        ``keys`` are (namespace, workflow_id) pairs, ``new_ids`` the id for each
        one's instance row should it not exist yet (as for :meth:`locked`).
        The locks are taken in sorted order of the keys, whatever order they
        come in, so two transactions over the same instances never deadlock;
        each key appears once in the mapping.  ``connection`` as for :meth:`locked`.
        """
        ...

    def find_instance(self, namespace: str, workflow_id: str) -> InstanceRow | None:
        """Read an instance without locking it."""
        ...

    def read_receipts(
        self, namespace: str, workflow_id: str, command_type: str, request_ids: Sequence[str]
    ) -> list[tuple[CommandRow, UpdateRow | None]]:
        """Committed commands of one instance and type whose ``request_id`` is one of
        ``request_ids``, oldest first, each with its update: one read, no lock."""
        ...

    def read_history(self, instance_id: str) -> list[EventRow]:
        """Every event of one instance, in log order."""
        ...

    def read_events(self, after: EventCursor, limit: int) -> list[EventRow]:
        """Events after ``after`` that are safe to read now, in cursor order."""
        ...

    def prune_targets(self, before: datetime) -> list[PruneTarget]:
        """Every closed chain of runs whose latest recorded time (see
        :meth:`LockedInstance.latest_time`) is before ``before``, and every
        instance with run-less refusals older than that (contract §5)."""
        ...

    def newest_time(self) -> datetime | None:
        """The newest time recorded anywhere in the store's receipts and history, if any."""
        ...


class KeyedLocking(Protocol):
    """An optional part of a :class:`Store`: a keyed command's receipts read in the round trip
    that takes the lock, where :attr:`keyed_locks` is true (PostgreSQL, ``admission/sql/_keyed.py``).

    Without it, or while retries are frequent, the service reads a key's committed receipts first
    (:meth:`Store.read_receipts`) and takes the lock only when none answers.
    """

    keyed_locks: bool

    def locked_unless_retained(
        self,
        namespace: str,
        workflow_id: str,
        command_type: str,
        request_ids: Sequence[str],
        *,
        created_at: datetime,
        new_id: str,
    ) -> AbstractContextManager[LockedInstance | list[tuple[CommandRow, UpdateRow | None]]]:
        """The store's own transaction with the instance's lock, taken only while no receipt holds
        the key: yields the key's committed receipts, oldest first, if it has some (no lock is
        then held and nothing may be written), else the locked instance, created if missing.
        Where :attr:`keyed_locks` is false it may always yield the locked instance."""
        ...


def insert_stepwise(
    tx: LockedInstance, command: CommandRow, update: UpdateRow | None, event: EventRow
) -> bool:
    """:meth:`LockedInstance.insert_admitted` made of :meth:`~LockedInstance.insert_command`,
    :meth:`~LockedInstance.insert_update` and :meth:`~LockedInstance.append_event`, for a store
    with no shorter way (it commits nothing: the transaction ends as it would have)."""
    if not tx.insert_command(command):
        return False
    if update is not None:
        tx.insert_update(update)
    tx.append_event(event)
    return True


def run_id_taken(run_id: str) -> RunStateError:
    """What :meth:`LockedInstance.insert_run` raises for a run id another run already holds (a
    caller's chosen id, ``start_run(run_id=...)``): the same on every store, and not retryable."""
    return RunStateError(f"run id {run_id} is taken by another run", reason="run_id_taken", run_id=run_id)
