"""The in-memory receipt store: a complete :class:`~admission.receipts.Store` in one process.

A real implementation of the port, not a mock: one lock, and transactions that
work on a copy of the tables and replace them on commit, so a failed
transaction leaves nothing behind.  The unique receipt index is a dict here,
as it is an index in SQL.

Pure: no SQLAlchemy, no clock, no I/O.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, replace
from datetime import datetime

from admission.errors import InputError
from admission.receipts._store import (
    CommandRow,
    EventCursor,
    EventRow,
    InstanceRow,
    LockedInstance,
    PruneCounts,
    PruneTarget,
    RunRow,
    UpdateRow,
    insert_stepwise,
    run_id_taken,
)

__all__ = ["MemoryStore"]


@dataclass
class _Tables:
    instances: dict[str, InstanceRow]
    instance_keys: dict[tuple[str, str], str]
    runs: dict[str, RunRow]
    commands: dict[str, CommandRow]
    request_index: dict[tuple[str, str, str], str]
    updates: dict[str, UpdateRow]
    events: list[EventRow]
    last_position: int = 0

    def copy(self) -> _Tables:
        return _Tables(
            dict(self.instances),
            dict(self.instance_keys),
            dict(self.runs),
            dict(self.commands),
            dict(self.request_index),
            dict(self.updates),
            list(self.events),
            self.last_position,
        )


class _MemoryLocked:
    def __init__(self, tables: _Tables, instance_id: str) -> None:
        self._t = tables
        self._id = instance_id

    @property
    def instance(self) -> InstanceRow:
        return self._t.instances[self._id]

    def run(self, run_id: str) -> RunRow | None:
        run = self._t.runs.get(run_id)
        return run if run is not None and run.instance_id == self._id else None

    def current_run(self) -> RunRow | None:
        current = self.instance.current_run_id
        return None if current is None else self.run(current)

    def find_commands(self, command_type: str, request_ids: Sequence[str]) -> list[CommandRow]:
        wanted = set(request_ids)
        rows = [
            c
            for c in self._t.commands.values()
            if c.instance_id == self._id and c.command_type == command_type and c.request_id in wanted
        ]
        return sorted(rows, key=lambda c: (c.created_at, c.command_sequence))

    def find_commands_many(
        self, wanted: Mapping[tuple[str, str], Sequence[str]]
    ) -> dict[tuple[str, str], list[CommandRow]]:
        # Every instance of the transaction shares the working tables.
        return {
            (iid, kind): _MemoryLocked(self._t, iid).find_commands(kind, ids)
            for (iid, kind), ids in wanted.items()
        }

    def get_command(self, command_id: str) -> CommandRow | None:
        row = self._t.commands.get(command_id)
        return row if row is not None and row.instance_id == self._id else None

    def next_command_sequence(self) -> int:
        return 1 + max(
            (c.command_sequence for c in self._t.commands.values() if c.instance_id == self._id), default=0
        )

    def insert_command(self, row: CommandRow) -> bool:
        if row.request_id is not None:
            key = (row.instance_id, row.command_type, row.request_id)
            if key in self._t.request_index:
                return False
            self._t.request_index[key] = row.id
        self._t.commands[row.id] = row
        return True

    def insert_admitted(
        self, command: CommandRow, update: UpdateRow | None, event: EventRow, *, last: bool = False
    ) -> bool:
        # A transaction here commits when its block ends, whatever ``last`` says.
        return insert_stepwise(self, command, update, event)

    def insert_admitted_many(
        self, admitted: Sequence[tuple[CommandRow, UpdateRow | None, EventRow]], *, last: bool = False
    ) -> bool:
        # Every instance of the transaction shares the working tables: any of them inserts for all.
        return all(insert_stepwise(self, command, update, event) for command, update, event in admitted)

    def update_for_command(self, command_id: str) -> UpdateRow | None:
        return next((u for u in self._t.updates.values() if u.command_id == command_id), None)

    def get_update(self, update_id: str) -> UpdateRow | None:
        update = self._t.updates.get(update_id)
        return update if update is not None and update.instance_id == self._id else None

    def insert_update(self, row: UpdateRow) -> None:
        self._t.updates[row.id] = row

    def save_update(self, row: UpdateRow) -> None:
        self._t.updates[row.id] = row

    def save_command(self, row: CommandRow) -> None:
        # The index follows the row, as a database's unique index does: a released key is free.
        before = self._t.commands.get(row.id)
        if before is not None and before.request_id != row.request_id:
            if before.request_id is not None:
                self._t.request_index.pop((before.instance_id, before.command_type, before.request_id), None)
            if row.request_id is not None:
                self._t.request_index[(row.instance_id, row.command_type, row.request_id)] = row.id
        self._t.commands[row.id] = row

    def pending_commands(self, run_ids: Sequence[str]) -> list[tuple[CommandRow, UpdateRow | None]]:
        runs = set(run_ids)
        found = []
        for command in self._t.commands.values():
            if command.instance_id != self._id or command.run_id not in runs:
                continue
            update = self.update_for_command(command.id) if command.command_type == "update" else None
            if (update is None and command.status == "received") or (
                update is not None and update.status == "accepted"
            ):
                found.append((command, update))
        return sorted(found, key=lambda pair: pair[0].command_sequence)

    def insert_run(self, row: RunRow) -> None:
        if row.id in self._t.runs:
            # As the SQL store's primary key refuses it: never a second run under one id.
            raise run_id_taken(row.id)
        self._t.runs[row.id] = row

    def save_run(self, row: RunRow) -> None:
        self._t.runs[row.id] = row

    def set_current_run(self, run_id: str | None) -> None:
        self._t.instances[self._id] = replace(self.instance, current_run_id=run_id)

    def append_event(self, event: EventRow) -> EventRow:
        self._t.last_position += 1
        stored = replace(event, position=self._t.last_position, tx_id=0)
        self._t.events.append(stored)
        return stored

    def delete_runs(self, run_ids: Sequence[str]) -> PruneCounts:
        runs = set(run_ids) & {r.id for r in self._t.runs.values() if r.instance_id == self._id}
        commands = {c.id for c in self._t.commands.values() if c.instance_id == self._id and c.run_id in runs}
        updates = {u.id for u in self._t.updates.values() if u.instance_id == self._id and u.run_id in runs}
        return self._delete(runs, commands, updates, lambda e: e.run_id in runs)

    def delete_runless_refusals(self, before: datetime) -> PruneCounts:
        commands = {
            c.id
            for c in self._t.commands.values()
            if c.instance_id == self._id and c.run_id is None and c.created_at < before
        }
        return self._delete(set(), commands, set(), lambda e: e.run_id is None and e.command_id in commands)

    def latest_time(self, run_ids: Sequence[str]) -> datetime | None:
        latest = run_latest_times(
            self._t, set(run_ids) & {r.id for r in self._t.runs.values() if r.instance_id == self._id}
        )
        return max(latest.values(), default=None)

    def _delete(
        self, runs: set[str], commands: set[str], updates: set[str], event_matches: Callable[[EventRow], bool]
    ) -> PruneCounts:
        kept = [e for e in self._t.events if not (e.instance_id == self._id and event_matches(e))]
        events = len(self._t.events) - len(kept)
        self._t.events = kept
        for update_id in updates:
            del self._t.updates[update_id]
        for command_id in commands:
            row = self._t.commands.pop(command_id)
            if row.request_id is not None:
                self._t.request_index.pop((row.instance_id, row.command_type, row.request_id), None)
        for run_id in runs:
            del self._t.runs[run_id]
        if self.instance.current_run_id in runs:
            self.set_current_run(None)
        return PruneCounts(len(runs), len(commands), len(updates), events)


def _instance_in(t: _Tables, namespace: str, workflow_id: str, created_at: datetime, new_id: str) -> str:
    """The id of an instance of ``t``, its row created (with ``new_id``) if it does not exist."""
    instance_id = t.instance_keys.get((namespace, workflow_id))
    if instance_id is None:
        instance_id = new_id
        t.instances[new_id] = InstanceRow(new_id, namespace, workflow_id, None, created_at)
        t.instance_keys[(namespace, workflow_id)] = new_id
    return instance_id


class MemoryStore:
    """A complete in-memory :class:`Store`: one lock, copy-on-begin transactions.

    Meant for tests and for engines that keep receipts in memory; it keeps
    nothing across processes.
    """

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._tables = _Tables({}, {}, {}, {}, {}, {}, [])

    @contextmanager
    def _transaction(
        self, namespace: str, workflow_id: str, created_at: datetime, new_id: str
    ) -> Iterator[LockedInstance]:
        with self._lock:
            working = self._tables.copy()
            yield _MemoryLocked(working, _instance_in(working, namespace, workflow_id, created_at, new_id))
            # Reached only without an exception: the transaction commits.
            self._tables = working

    def locked(
        self,
        namespace: str,
        workflow_id: str,
        *,
        created_at: datetime,
        new_id: str,
        connection: object | None = None,
    ) -> AbstractContextManager[LockedInstance]:
        """Open a transaction on one instance (see :meth:`Store.locked`)."""
        if connection is not None:
            raise InputError("a MemoryStore takes no caller's transaction", field="connection")
        return self._transaction(namespace, workflow_id, created_at, new_id)

    def locked_many(
        self,
        keys: Sequence[tuple[str, str]],
        *,
        created_at: datetime,
        new_ids: Sequence[str],
        connection: object | None = None,
    ) -> AbstractContextManager[Mapping[tuple[str, str], LockedInstance]]:
        """Open one transaction on several instances (see :meth:`Store.locked_many`)."""
        if connection is not None:
            raise InputError("a MemoryStore takes no caller's transaction", field="connection")
        return self._transaction_many(keys, created_at, new_ids)

    @contextmanager
    def _transaction_many(
        self, keys: Sequence[tuple[str, str]], created_at: datetime, new_ids: Sequence[str]
    ) -> Iterator[Mapping[tuple[str, str], LockedInstance]]:
        # One lock covers every instance here; the order is the port's all the same.
        ordered = sorted(dict(zip(keys, new_ids, strict=True)).items())
        with self._lock:
            working = self._tables.copy()
            held: dict[tuple[str, str], LockedInstance] = {}
            for (namespace, workflow_id), new_id in ordered:
                held[(namespace, workflow_id)] = _MemoryLocked(
                    working, _instance_in(working, namespace, workflow_id, created_at, new_id)
                )
            yield held
            # Reached only without an exception: the transaction commits.
            self._tables = working

    def find_instance(self, namespace: str, workflow_id: str) -> InstanceRow | None:
        """Read an instance without locking it."""
        with self._lock:
            instance_id = self._tables.instance_keys.get((namespace, workflow_id))
            return None if instance_id is None else self._tables.instances[instance_id]

    def read_receipts(
        self, namespace: str, workflow_id: str, command_type: str, request_ids: Sequence[str]
    ) -> list[tuple[CommandRow, UpdateRow | None]]:
        """Commands of one instance and type by ``request_id`` values, each with its update."""
        with self._lock:
            instance_id = self._tables.instance_keys.get((namespace, workflow_id))
            if instance_id is None:
                return []
            view = _MemoryLocked(self._tables, instance_id)
            return [(c, view.update_for_command(c.id)) for c in view.find_commands(command_type, request_ids)]

    def read_history(self, instance_id: str) -> list[EventRow]:
        """Every event of one instance, in log order."""
        with self._lock:
            return [e for e in self._tables.events if e.instance_id == instance_id]

    def read_events(self, after: EventCursor, limit: int) -> list[EventRow]:
        """Events after ``after``, in log order (one writer at a time: nothing can commit behind)."""
        with self._lock:
            return [e for e in self._tables.events if EventCursor(e.tx_id, e.position) > after][:limit]

    def prune_targets(self, before: datetime) -> list[PruneTarget]:
        """Closed chains whose latest recorded time is before ``before``, and instances
        with old run-less refusals."""
        with self._lock:
            return expired_targets(self._tables, before)

    def newest_time(self) -> datetime | None:
        """The newest time recorded anywhere in the store's receipts and history."""
        with self._lock:
            t = self._tables
            return max(
                (
                    *(i.created_at for i in t.instances.values()),
                    *run_latest_times(t, set(t.runs)).values(),
                    *(c.created_at for c in t.commands.values()),
                    *(e.recorded_at for e in t.events),
                ),
                default=None,
            )


def run_latest_times(t: _Tables, runs: set[str]) -> dict[str, datetime]:
    """The latest time recorded on each of ``runs``' rows (see :meth:`LockedInstance.latest_time`)."""
    latest: dict[str, datetime] = {}

    def see(run_id: str | None, *times: datetime | None) -> None:
        if run_id not in runs:
            return
        for time in times:
            if time is not None and (run_id not in latest or time > latest[run_id]):
                latest[run_id] = time

    for run in t.runs.values():
        see(run.id, run.started_at, run.closed_at)
    for command in t.commands.values():
        see(command.run_id, command.created_at)
    for update in t.updates.values():
        see(update.run_id, update.accepted_at, update.completed_at)
    for event in t.events:
        see(event.run_id, event.recorded_at)
    return latest


def expired_targets(t: _Tables, before: datetime) -> list[PruneTarget]:
    """The retention rule (contract §5), as the reference for every store.

    A run's receipts live as long as its history, and a command handed to a
    continue-as-new successor lives with the successor: so a chain of runs
    (linked by ``continued_from_run_id``) is pruned as a whole, once its last
    run closed other than by continuing and the latest time recorded on any
    row of the chain is before ``before``.  Judging by the latest recorded
    time, not the close time alone, means a clock that stepped back while
    something was written never makes a chain prunable earlier.
    """
    names = {i.id: (i.namespace, i.workflow_id) for i in t.instances.values()}
    latest = run_latest_times(t, set(t.runs))
    expired: list[tuple[datetime, str, PruneTarget]] = []
    for end in t.runs.values():
        if end.status in ("open", "continued") or end.closed_at is None:
            continue
        run: RunRow | None = end
        chain_latest = latest[end.id]
        while run is not None and run.continued_from_run_id is not None:
            run = t.runs.get(run.continued_from_run_id)
            if run is not None:
                chain_latest = max(chain_latest, latest[run.id])
        if chain_latest < before:
            expired.append((end.closed_at, end.id, PruneTarget(*names[end.instance_id], end.id)))
    runless = [c for c in t.commands.values() if c.run_id is None]
    stale = sorted({c.instance_id for c in runless if c.created_at < before})
    return [target for *_, target in sorted(expired)] + [PruneTarget(*names[i], None) for i in stale]
