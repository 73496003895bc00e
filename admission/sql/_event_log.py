"""The event log across a cluster move: the reader's guard and the rebase (docs/event-log.md).

On PostgreSQL every event stores ``tx_id = txid_current()``, an id of one
cluster's transaction counter, and a reader's cursor is a ``(tx_id, position)``
pair.  A dump and restore, or a logical-replication copy, starts another
counter: on the new cluster the stored ids mean nothing, and a reader whose
cursor is ahead of the new counter would wait forever for ids that are
already behind it, while the events written there sort before its cursor and
are passed over.  :func:`read_after` reads a page and the server's counter in
one statement and refuses such a cursor (or a log holding such ids) with
:class:`~admission.errors.EventLogMovedError`.  :func:`rebase_event_log`
rewrites the stored ids below the new counter, keeping what every known
cursor has read, so that reading resumes exactly.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final

from sqlalchemy import Engine, and_, bindparam, case, func, literal, not_, select, text, true, tuple_, update
from sqlalchemy.engine import Connection

from admission.errors import EventLogMovedError, StateError
from admission.receipts._store import EventCursor, EventRow
from admission.sql._engine import is_postgresql, wrap_exceptions
from admission.sql._event_rows import event_row, readable_events
from admission.sql._revisions import check_revision
from admission.sql._schema import (
    outbox_cursors,
    worker_events,
    worker_job_events,
    worker_records,
    workflow_history_events,
)

__all__ = ["EventLogRebase", "read_after", "rebase_event_log"]

_events = workflow_history_events
_SNAPSHOT = func.txid_current_snapshot()
# The first id not yet handed out (64-bit, epoch-extended: it never wraps).  A
# cursor or an event of this cluster is always below it.
_NEXT_TX_ID = func.txid_snapshot_xmax(_SNAPSHOT)
_OLDEST_RUNNING = func.txid_snapshot_xmin(_SNAPSHOT)

_PAGE = (
    readable_events()
    .where(
        tuple_(_events.c.tx_id, _events.c.position)
        > tuple_(bindparam("after_tx_id"), bindparam("after_position")),
        _events.c.tx_id < _OLDEST_RUNNING,
    )
    .order_by(_events.c.tx_id, _events.c.position)
    .limit(bindparam("limit"))
    .subquery("page")
)
_SERVER = select(
    _NEXT_TX_ID.label("next_tx_id"),
    # max(tx_id) is one probe of ix_workflow_history_events_tx_id_position.
    select(func.max(_events.c.tx_id)).scalar_subquery().label("newest_tx_id"),
).subquery("server")
# One row even when the page is empty: the server's counter comes back with
# every read, in the same statement and snapshot, at no extra round trip.
READ_AFTER: Final = (
    select(_SERVER, _PAGE)
    .select_from(_SERVER.outerjoin(_PAGE, true()))
    .order_by(_PAGE.c.tx_id, _PAGE.c.position)
)
"""A page of events after a cursor, with ``next_tx_id`` and ``newest_tx_id`` on every row."""

_SEQUENCED: Final = (
    (workflow_history_events.name, "position"),
    (worker_records.name, "id"),
    (worker_events.name, "position"),
    (worker_job_events.name, "position"),
)
"""The columns a sequence numbers on PostgreSQL; logical replication does not carry sequences."""
_LAST_VALUE: Final = text("SELECT pg_sequence_last_value(CAST(:s AS regclass))")
_SET_VALUE: Final = text("SELECT setval(CAST(:s AS regclass), :top)")


def _moved(after: EventCursor, next_tx_id: int, newest_tx_id: int | None) -> EventLogMovedError | None:
    where = "`admission db rebase-events --db URL` (docs/event-log.md)"
    if after.tx_id >= next_tx_id:
        return EventLogMovedError(
            f"the event log cursor (tx_id {after.tx_id}, position {after.position}) is at or past this "
            f"server's next transaction id {next_tx_id}: the database was moved to another cluster; "
            f"stop its writers and readers and run {where}",
            cursor=(after.tx_id, after.position),
            next_tx_id=next_tx_id,
        )
    if newest_tx_id is not None and newest_tx_id >= next_tx_id:
        return EventLogMovedError(
            f"the event log holds transaction id {newest_tx_id}, at or past this server's next "
            f"transaction id {next_tx_id}: the database was moved to another cluster; stop its writers "
            f"and readers and run {where}",
            cursor=(after.tx_id, after.position),
            next_tx_id=next_tx_id,
        )
    return None


def read_after(conn: Connection, after: EventCursor, limit: int) -> list[EventRow]:
    """PostgreSQL: events after ``after`` that are safe to read, in ``(tx_id, position)`` order.

    Raises :class:`~admission.errors.EventLogMovedError`, reading nothing, when
    the cursor or the log's newest event is at or past the server's next
    transaction id: neither can have come from this cluster.
    """
    params = {"after_tx_id": after.tx_id, "after_position": after.position, "limit": limit}
    rows = conn.execute(READ_AFTER, params).mappings().all()
    moved = _moved(after, int(rows[0]["next_tx_id"]), rows[0]["newest_tx_id"])
    if moved is not None:
        raise moved
    return [event_row(r) for r in rows if r["position"] is not None]


@dataclass(frozen=True)
class EventLogRebase:
    """What :func:`rebase_event_log` did (or, with ``needed`` false, found nothing to do).

    ``next_tx_id`` is the server's next transaction id (``None`` on SQLite),
    ``events`` how many events got a new ``tx_id``, ``consumers`` each relay
    cursor of ``outbox_cursors`` as ``(consumer, before, after)``, ``cursors``
    each cursor passed in as ``(before, after)``, ``sequences`` the position
    sequences moved up to their table's highest value.
    """

    next_tx_id: int | None
    events: int = 0
    consumers: tuple[tuple[str, EventCursor, EventCursor], ...] = ()
    cursors: tuple[tuple[EventCursor, EventCursor], ...] = ()
    sequences: tuple[str, ...] = ()

    @property
    def rebased(self) -> bool:
        """Whether the log's transaction ids were rewritten."""
        return self.events > 0 or any(before != after for _, before, after in self.consumers)

    @property
    def needed(self) -> bool:
        """Whether anything was changed: ids rewritten or a sequence moved."""
        return self.rebased or bool(self.sequences)


def _refuse(message: str) -> StateError:
    return StateError(message, state=None)


def _key(cursor: EventCursor) -> tuple[int, int]:
    return (cursor.tx_id, cursor.position)


def rebase_event_log(engine: Engine, cursors: Iterable[EventCursor] = ()) -> EventLogRebase:
    """Make the event log's order hold again after a move to another PostgreSQL cluster.

    Run with every writer and reader of the database stopped; one
    transaction, which locks the log and the relay cursors.  Needed when an
    event or a cursor holds a transaction id at or past the server's next one
    (what :class:`~admission.errors.EventLogMovedError` reports).  Every event
    that came with the move gets a small ``tx_id``: the number of known cursors
    (the relays' in ``outbox_cursors``, and ``cursors``, a reader's own) that
    it sorts after.  Each known cursor becomes ``(its rank + 1, 0)``, so it
    has read exactly what it had read before, in the order it read it; every
    event written on this cluster (after the move, or later) sorts after all
    of them.  Position sequences behind their table's highest value (logical
    replication does not copy sequences) are moved up.

    Returns what was done; nothing is changed when nothing is needed (a
    second run), and always on SQLite, whose log has no transaction ids (a
    copy of the file keeps its positions).  Raises
    :class:`~admission.errors.StateError` naming the reason when the log
    cannot be rebased exactly (a relay that has already read events written
    on this cluster since the move), and
    :class:`~admission.errors.SchemaRevisionError` when the database is not
    at the head revision.
    """
    given = tuple(cursors)
    with wrap_exceptions(engine.dialect), engine.connect() as conn, conn.begin():
        # Only the head's tables are known here (contract §6): an older schema is refused first.
        check_revision(conn)
        if not is_postgresql(engine.dialect):
            return EventLogRebase(None, cursors=tuple((c, c) for c in given))
        # Writers wait; readers (which take no such lock) may still read, and
        # either see the log before or after, never half of it.
        conn.execute(text(f"LOCK TABLE {_events.name}, {outbox_cursors.name} IN EXCLUSIVE MODE"))
        oldest, next_tx_id = (int(v) for v in conn.execute(select(_OLDEST_RUNNING, _NEXT_TX_ID)).one())
        stored = [
            (str(name), EventCursor(int(tx), int(pos)))
            for name, tx, pos in conn.execute(
                select(outbox_cursors.c.consumer, outbox_cursors.c.tx_id, outbox_cursors.c.position)
            )
        ]
        newest = conn.execute(select(func.max(_events.c.tx_id))).scalar()
        known = [c for _, c in stored] + list(given)
        foreign = (newest is not None and newest >= next_tx_id) or any(c.tx_id >= next_tx_id for c in known)
        if foreign:
            done = _rebase(conn, stored, given, oldest, next_tx_id)
        else:
            done = EventLogRebase(
                next_tx_id,
                consumers=tuple((n, c, c) for n, c in stored),
                cursors=tuple((c, c) for c in given),
            )
        # Last: setval is not undone by a rollback, and a refusal above changes nothing.
        return replace(done, sequences=_advance_sequences(conn))


def _rebase(
    conn: Connection,
    stored: Sequence[tuple[str, EventCursor]],
    given: Sequence[EventCursor],
    oldest: int,
    next_tx_id: int,
) -> EventLogRebase:
    # The move's boundary: the highest position that surely came with it (an
    # event or a cursor with an id this cluster has not handed out).  An event
    # with an id of this cluster above it was written here after the move: it
    # keeps its id, which sorts after every rebased one.
    came = select(func.max(_events.c.position)).where(_events.c.tx_id >= next_tx_id)
    boundary = max(
        [conn.execute(came).scalar() or 0]
        + [c.position for c in [*(c for _, c in stored), *given] if c.tx_id >= next_tx_id]
    )
    for name, cursor in [*stored, *(("(given)", c) for c in given)]:
        if cursor.tx_id < next_tx_id and cursor.position > boundary:
            raise _refuse(
                f"consumer {name} has read events written on this cluster since the move (cursor tx_id "
                f"{cursor.tx_id}, position {cursor.position}); its place in the moved log is unknown: "
                f"delete its cursor to read the log again from the start (docs/event-log.md)"
            )
    cuts = sorted({_key(c) for _, c in stored} | {_key(c) for c in given})
    written_here = and_(_events.c.tx_id < next_tx_id, _events.c.position > boundary)
    first_here = conn.execute(select(func.min(_events.c.tx_id)).where(written_here)).scalar()
    if len(cuts) >= min(oldest, next_tx_id if first_here is None else int(first_here)):
        raise _refuse(
            f"{len(cuts)} cursors need {len(cuts) + 1} transaction ids below this server's oldest "
            f"running one ({oldest}): run more transactions (SELECT txid_current()) first"
        )
    rank = _rank(cuts)
    events = conn.execute(update(_events).where(not_(written_here)).values(tx_id=rank)).rowcount
    after = {cut: EventCursor(i + 1, 0) for i, cut in enumerate(cuts)}
    consumers = []
    for name, cursor in stored:
        new = after[_key(cursor)]
        conn.execute(
            update(outbox_cursors)
            .where(outbox_cursors.c.consumer == name)
            .values(tx_id=new.tx_id, position=new.position)
        )
        consumers.append((name, cursor, new))
    return EventLogRebase(
        next_tx_id,
        events=int(events),
        consumers=tuple(consumers),
        cursors=tuple((c, after[_key(c)]) for c in given),
    )


def _rank(cuts: Sequence[tuple[int, int]]) -> Any:
    # How many cursors an event sorts after, in the order it was read before
    # the move: the cuts ascend, so the first one at or above the event wins.
    key = tuple_(_events.c.tx_id, _events.c.position)
    if not cuts:
        return literal(0)
    whens = [(key <= tuple_(literal(tx), literal(pos)), i) for i, (tx, pos) in enumerate(cuts)]
    return case(*whens, else_=len(cuts))


def _advance_sequences(conn: Connection) -> tuple[str, ...]:
    moved = []
    for table, column in _SEQUENCED:
        sequence = conn.execute(select(func.pg_get_serial_sequence(table, column))).scalar()
        if sequence is None:
            continue
        top = conn.execute(text(f'SELECT max("{column}") FROM {table}')).scalar()
        last = conn.execute(_LAST_VALUE, {"s": sequence}).scalar()
        if top is not None and (last is None or int(last) < int(top)):
            # The next value handed out is top + 1: a position is never given twice.
            conn.execute(_SET_VALUE, {"s": sequence, "top": int(top)})
            moved.append(str(sequence))
    return tuple(moved)
