"""Batch admission: many commands, for one or more instances, in one transaction.

:meth:`AdmissionService.admit_many <admission.receipts.AdmissionService.admit_many>`
takes a list of :class:`BatchCommand` and answers each exactly as
``admit_signal`` or ``admit_update`` would answer it alone, at its place in
the list: fresh, retained, ``request_id_conflict`` and the rest, a second
item with the key of an earlier one being that item's retry.  Every item is
validated before the transaction; a bad one gets its typed error in its slot
and writes nothing, the others go on.  The valid items are then admitted in
one transaction that holds every instance's admission lock, taken in one
order (sorted by namespace and workflow id), so two batches never deadlock;
each item is decided under the lock by the same code as a single admission
inside a caller's transaction (its key judged from what is stored under it,
then the insert).  The keys are read under the locks before anything is
written, in one lookup where the store offers
:meth:`~admission.receipts.LockedInstance.find_commands_many` (else one per
instance and command type); an item whose key an earlier item of the batch
has used is looked up again, so it is that item's retry.  Where the store
offers :meth:`~admission.receipts.LockedInstance.insert_admitted_many`, the
fresh admissions of the store's own transaction wait and are written
together (:class:`_Pending`), before anything else reads and at the end.  One
commit, and on SQLite and PostgreSQL one flush to disk, serves the whole
batch: that, and a statement per table instead of one per row, is what makes
it faster than one call per command.

Pure: no SQLAlchemy, no clock (the service's clock is passed in).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

from admission.errors import AdmissionError, InputError, InvalidCommandTypeError
from admission.receipts._answers import judge_locked
from admission.receipts._rules import Admission, CommandType, Intent
from admission.receipts._store import (
    CommandRow,
    EventRow,
    InstanceRow,
    LockedInstance,
    RunRow,
    Store,
    UpdateRow,
)

__all__ = ["BatchAdmission", "BatchCommand", "Prepared"]


@dataclass(frozen=True)
class BatchCommand:
    """One command of a batch: what ``admit_signal`` (``command_type="signal"``) or
    ``admit_update`` (``"update"``) take, as a value."""

    command_type: Literal["signal", "update"]
    namespace: str
    workflow_id: str
    name: str
    arguments: object
    request_id: str | None = None
    run_id: str | None = None


class Prepared(NamedTuple):
    """A command whose input was validated and digested: all the transaction needs of it.

    A named tuple (immutable, as a frozen dataclass would be) since every admission makes one
    before its read: a tuple is built in one step, a frozen dataclass sets each field in turn.
    """

    command_type: CommandType
    namespace: str
    workflow_id: str
    name: str
    target: str | None
    key: str | None
    token: str | None
    intent: Intent
    stored: bytes


class BatchAdmission:
    """The batch step of the admission service (a part of :class:`AdmissionService`)."""

    if TYPE_CHECKING:
        store: Store
        _clock: Callable[[], datetime]
        _new_id: Callable[[], str]

        def _prepare(
            self,
            command_type: CommandType,
            namespace: str,
            workflow_id: str,
            name: str,
            arguments: object,
            request_id: str | None,
            run_id: str | None,
        ) -> Prepared: ...

        def _place(
            self, tx: LockedInstance, item: Prepared, now: datetime, *, read_before: bool
        ) -> Admission: ...

    def admit_many(
        self, commands: Sequence[BatchCommand], *, connection: object | None = None
    ) -> list[Admission | AdmissionError]:
        """Admit ``commands`` in one transaction; one answer per command, in order.

        Each answer is the :class:`Admission` that ``admit_signal`` or
        ``admit_update`` would return for that command admitted alone at its
        place in the list (an item repeating an earlier item's key is its
        retry), or, for a command whose input is refused, the
        :class:`~admission.errors.InputError` that call would raise; such a
        command writes nothing and the others are admitted.  An empty list
        returns ``[]`` and opens no transaction.  A storage failure raises and
        commits nothing of the batch.  ``connection`` is a caller's
        transaction, as for every method (``docs/guide.md``, section 6).
        """
        answers: list[Admission | AdmissionError | None] = []
        ready: list[tuple[int, Prepared]] = []
        for index, command in enumerate(commands):
            try:
                item = self._prepare_command(command)
            except InputError as refused:
                answers.append(refused)
                continue
            answers.append(None)
            ready.append((index, item))
        if ready:
            now = self._clock()
            # One lock order for every batch (sorted): two batches over the same
            # instances wait for each other instead of deadlocking.
            keys = sorted({(item.namespace, item.workflow_id) for _, item in ready})
            new_ids = [self._new_id() for _ in keys]
            # Within the store's own transaction the batch's rows are written together
            # (_Pending); a caller's transaction gets each as it is decided, as a single call's.
            together = connection is None
            try:
                self._admit_ready(ready, answers, keys, new_ids, now, connection, together)
            except _Raced:
                # Nothing of the batch was committed: decide it again, row by row.
                self._admit_ready(ready, answers, keys, new_ids, now, connection, False)
        return [answer for answer in answers if answer is not None]

    def _admit_ready(
        self,
        ready: Sequence[tuple[int, Prepared]],
        answers: list[Admission | AdmissionError | None],
        keys: Sequence[tuple[str, str]],
        new_ids: Sequence[str],
        now: datetime,
        connection: object | None,
        together: bool,
    ) -> None:
        """Admit the valid items in one transaction, each answer at its index in ``answers``."""
        with self.store.locked_many(keys, created_at=now, new_ids=new_ids, connection=connection) as held:
            found = _stored_under_keys(held, [item for _, item in ready])
            first = next(iter(held.values()))
            pending = _Pending(first) if together and hasattr(first, "insert_admitted_many") else None
            deciding = held if pending is None else {k: _Deferred(tx, pending) for k, tx in held.items()}
            written: set[tuple[str, str, str, str]] = set()
            for index, item in ready:
                answers[index] = self._admit_held(deciding, item, now, found, written)
            if pending is not None:
                pending.flush(last=True)

    def _admit_held(
        self,
        held: Mapping[tuple[str, str], LockedInstance],
        item: Prepared,
        now: datetime,
        found: Mapping[tuple[str, str, str], Sequence[CommandRow]],
        written: set[tuple[str, str, str, str]],
    ) -> Admission:
        """One item, under the locks: its key judged as a single admission judges it under the lock."""
        tx = held[(item.namespace, item.workflow_id)]
        if item.key is None or item.token is None:
            return self._place(tx, item, now, read_before=True)
        group = (item.namespace, item.workflow_id, item.command_type)
        ids = (item.token, item.key)
        if any((*group, value) in written for value in ids):
            # An earlier item of the batch may have written under this key since the
            # lookup: read it again, under the lock, as its retry must see it.
            answer = self._place(tx, item, now, read_before=False)
        else:
            # Nothing of the batch is under this key yet: the rows found under the lock are
            # all there are, and a key they do not answer goes straight to the insert.
            rows = [row for row in found.get(group, ()) if row.request_id in ids]
            known = judge_locked(tx, rows, item.intent, item.key, item.token)
            answer = known if known is not None else self._place(tx, item, now, read_before=True)
        written.add((*group, item.token))
        return answer

    def _prepare_command(self, command: object) -> Prepared:
        if not isinstance(command, BatchCommand):
            raise InputError(f"must be a BatchCommand, got {type(command).__name__}", field="commands")
        if command.command_type not in ("signal", "update"):
            raise InvalidCommandTypeError(command.command_type)
        return self._prepare(
            command.command_type,
            command.namespace,
            command.workflow_id,
            command.name,
            command.arguments,
            command.request_id,
            command.run_id,
        )


def _stored_under_keys(
    held: Mapping[tuple[str, str], LockedInstance], items: Sequence[Prepared]
) -> dict[tuple[str, str, str], list[CommandRow]]:
    """The stored commands under the keyed items' keys (tokens and raw keys), read under the
    locks with one lookup per instance and command type, before the batch writes anything."""
    wanted: dict[tuple[str, str, str], list[str]] = {}
    for item in items:
        if item.key is not None and item.token is not None:
            wanted.setdefault((item.namespace, item.workflow_id, item.command_type), []).extend(
                (item.token, item.key)
            )
    if not wanted:
        return {}
    many = getattr(next(iter(held.values())), "find_commands_many", None)
    if many is None:
        return {
            (ns, wf, kind): held[(ns, wf)].find_commands(kind, list(dict.fromkeys(values)))
            for (ns, wf, kind), values in wanted.items()
        }
    ids = {key: tx.instance.id for key, tx in held.items()}
    found: dict[tuple[str, str], list[CommandRow]] = many(
        {(ids[(ns, wf)], kind): list(dict.fromkeys(values)) for (ns, wf, kind), values in wanted.items()}
    )
    return {(ns, wf, kind): found[(ids[(ns, wf)], kind)] for ns, wf, kind in wanted}


class _Raced(Exception):
    """A batch's rows met a key in the unique receipt index that its lookup under the locks did
    not find (a write outside the admission lock): the transaction is rolled back."""


class _Pending:
    """A batch's fresh admissions not yet written: written together, by one of its locked
    instances, before anything else reads or writes in the transaction, and at its end.

    One statement per table for the whole batch instead of one per row (and,
    on PostgreSQL, one round trip); the rows are those :func:`insert_stepwise`
    would write, in the same order, so event positions are as they would have been.
    """

    __slots__ = ("_rows", "_writer")

    def __init__(self, writer: LockedInstance) -> None:
        self._writer = writer
        self._rows: list[tuple[CommandRow, UpdateRow | None, EventRow]] = []

    def add(self, admitted: tuple[CommandRow, UpdateRow | None, EventRow]) -> None:
        self._rows.append(admitted)

    def flush(self, *, last: bool = False) -> None:
        """Write what is pending (raises :class:`_Raced` if a key was taken); ``last``: the batch
        writes nothing after (:meth:`~admission.receipts.LockedInstance.insert_admitted_many`)."""
        if self._rows:
            rows, self._rows = self._rows, []
            if not self._writer.insert_admitted_many(rows, last=last):
                raise _Raced


class _Deferred:
    """A batch's locked instance whose fresh admissions wait in the batch's :class:`_Pending`.

    Deciding a fresh admission asks the instance, its current run and its next
    sequence, which are what the lock read (the sequence is counted here from
    the first one the store gives, so rows still pending count too), and
    inserts; every other method reads or writes the database, so what is
    pending is written first and the method sees the transaction as it would
    have (a retry of an earlier item, an update's row).
    """

    def __init__(self, tx: LockedInstance, pending: _Pending) -> None:
        self._tx = tx
        self._pending = pending
        self._sequence: int | None = None

    @property
    def instance(self) -> InstanceRow:
        return self._tx.instance

    def current_run(self) -> RunRow | None:
        return self._tx.current_run()

    def next_command_sequence(self) -> int:
        if self._sequence is None:
            # Nothing of this instance is pending yet: the store's answer is complete.
            self._sequence = self._tx.next_command_sequence()
        else:
            self._sequence += 1
        return self._sequence

    def insert_admitted(
        self, command: CommandRow, update: UpdateRow | None, event: EventRow, *, last: bool = False
    ) -> bool:
        self._pending.add((command, update, event))
        return True

    def __getattr__(self, name: str) -> Any:
        self._pending.flush()
        return getattr(self._tx, name)
