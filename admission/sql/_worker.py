"""The worker store on SQLite and PostgreSQL: queues, leases, records, events, outbox cursors.

Every state change runs in one write transaction (``BEGIN IMMEDIATE`` on
SQLite, row locks on PostgreSQL).  The fencing rule (contract §3) is the
database's: the trigger ``worker_records_fence`` refuses a record update whose
``fence`` is not the queue's current lease token, and the boundary
(:func:`~admission.sql._engine.wrap_exceptions`) turns that refusal, by the
constraint's name ``worker_fence``, into :class:`~admission.errors.FencedError`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from datetime import datetime
from typing import Any, Final

from sqlalchemy import Engine, Select, bindparam, func, select, update
from sqlalchemy.engine import Connection, RowMapping

from admission.receipts._store import EventCursor
from admission.sql._caller import caller_connection, join_transaction
from admission.sql._engine import (
    WRITE_OPTION,
    create_admission_engine,
    insert_or_ignore,
    is_postgresql,
    wrap_exceptions,
)
from admission.sql._raw import BulkInsert, BulkStatement
from admission.sql._revisions import check_revision
from admission.sql._schema import (
    outbox_cursors,
    worker_events,
    worker_leases,
    worker_queues,
    worker_records,
)
from admission.sql._times import as_utc, utc_or_none
from admission.worker._store import (
    RECORD_CHANGES,
    LeaseRow,
    WorkerEvent,
    WorkerRecord,
    WorkerTransaction,
    WorkItem,
    stale_fence,
)

__all__ = ["SqlWorkerStore"]

_EVENT_KEYS: Final = tuple(c.name for c in worker_events.c if c.name != "position")
_EVENT_COMMON: Final = tuple(k for k in _EVENT_KEYS if k != "write_id")
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
# What a send, a transition and a readback read of a record: converting the
# other columns (stored times above all) would cost more than the read.
_WORK_COLUMNS: Final = tuple(
    worker_records.c[name] for name in ("write_id", "tenant", "source_key", "content", "state", "attempts")
)


def _by_key(queue: str, tenant: str, source_key: str) -> Select[Any]:
    records = worker_records.c
    return select(worker_records).where(
        records.queue == queue, records.tenant == tenant, records.source_key == source_key
    )


def _record(row: RowMapping) -> WorkerRecord:
    return WorkerRecord(
        position=int(row["id"]),
        write_id=row["write_id"],
        queue=row["queue"],
        tenant=row["tenant"],
        source_key=row["source_key"],
        content=bytes(row["content"]),
        state=row["state"],
        attempts=int(row["attempts"]),
        diagnostic=row["diagnostic"],
        fence=None if row["fence"] is None else int(row["fence"]),
        snapshot=None if row["snapshot"] is None else bytes(row["snapshot"]),
        poll_health=row["poll_health"],
        polled_at=utc_or_none(row["polled_at"]),
        created_at=as_utc(row["created_at"]),
        updated_at=as_utc(row["updated_at"]),
    )


def _lease(row: RowMapping) -> LeaseRow:
    return LeaseRow(
        row["queue"], int(row["token"]), row["holder"], int(row["heartbeat"]), utc_or_none(row["claimed_at"])
    )


def _event(row: RowMapping) -> WorkerEvent:
    return WorkerEvent(
        queue=row["queue"],
        write_id=row["write_id"],
        event_type=row["event_type"],
        from_state=row["from_state"],
        to_state=row["to_state"],
        reason=row["reason"],
        actor=row["actor"],
        fence=None if row["fence"] is None else int(row["fence"]),
        recorded_at=as_utc(row["recorded_at"]),
        position=int(row["position"]),
    )


class _SqlWorkerTransaction:
    """One queue inside one write transaction, on one connection."""

    def __init__(self, store: SqlWorkerStore, conn: Connection, queue: str) -> None:
        self._store = store
        self._conn = conn
        self._queue = queue

    def token(self) -> int:
        query = select(worker_leases.c.token).where(worker_leases.c.queue == self._queue).with_for_update()
        return int(self._conn.execute(query).scalar_one())

    def lease(self) -> LeaseRow:
        query = select(worker_leases).where(worker_leases.c.queue == self._queue).with_for_update()
        return _lease(self._conn.execute(query).mappings().one())

    def take_lease(self, token: int, holder: str, claimed_at: datetime) -> None:
        self._conn.execute(
            update(worker_leases)
            .where(worker_leases.c.queue == self._queue)
            .values(token=token, holder=holder, heartbeat=0, claimed_at=claimed_at)
        )

    def renew_lease(self, token: int) -> bool:
        renewed = self._conn.execute(
            update(worker_leases)
            .where(worker_leases.c.queue == self._queue, worker_leases.c.token == token)
            .values(heartbeat=worker_leases.c.heartbeat + 1)
        ).rowcount
        return bool(renewed)

    def release_lease(self, token: int) -> None:
        self._conn.execute(
            update(worker_leases)
            .where(worker_leases.c.queue == self._queue, worker_leases.c.token == token)
            .values(holder=None)
        )

    def lock_intake(self) -> None:
        # The queue's row is the lock: intake is serialised per queue, so the bound holds exactly.
        self._conn.execute(
            select(worker_queues.c.queue).where(worker_queues.c.queue == self._queue).with_for_update()
        )

    def find(self, tenant: str, source_key: str) -> WorkerRecord | None:
        row = self._conn.execute(_by_key(self._queue, tenant, source_key)).mappings().first()
        return None if row is None else _record(row)

    def count(self, states: frozenset[str]) -> int:
        records = worker_records.c
        query = select(func.count()).where(records.queue == self._queue, records.state.in_(sorted(states)))
        return int(self._conn.execute(query).scalar_one())

    def insert(self, record: WorkerRecord) -> bool:
        values = {
            "write_id": record.write_id,
            "queue": self._queue,
            "tenant": record.tenant,
            "source_key": record.source_key,
            "content": record.content,
            "state": record.state,
            "attempts": record.attempts,
            "diagnostic": record.diagnostic,
            "fence": record.fence,
            "snapshot": record.snapshot,
            "poll_health": record.poll_health,
            "polled_at": record.polled_at,
            "created_at": record.created_at,
            "updated_at": record.updated_at,
        }
        return bool(insert_or_ignore(self._conn, worker_records, values, ["queue", "tenant", "source_key"]))

    def update(self, write_id: str, expected: str, fence: int, changes: Mapping[str, object]) -> bool:
        unknown = set(changes) - RECORD_CHANGES
        if unknown:
            raise ValueError(f"not a record change: {sorted(unknown)}")
        with self._store._fenced(self._queue, fence):
            changed = self._conn.execute(
                update(worker_records)
                .where(worker_records.c.write_id == write_id, worker_records.c.state == expected)
                .values(**changes, fence=fence)
            ).rowcount
        return bool(changed)

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
        with self._store._fenced(self._queue, fence):
            return self._store._steps[count_attempt].execute(
                self._conn,
                [{"match_write_id": write_id} for write_id in write_ids],
                {"match_state": expected, "new_state": state, "now": now, "new_fence": fence},
            )

    def record_events(self, event: WorkerEvent, write_ids: Sequence[str | None]) -> None:
        common = {key: getattr(event, key) for key in _EVENT_COMMON}
        self._store._event_insert.insert(self._conn, [{"write_id": w} for w in write_ids], common)

    def cursor(self, consumer: str) -> EventCursor:
        return _cursor(self._conn, consumer)

    def move_cursor(self, consumer: str, before: EventCursor, after: EventCursor, now: datetime) -> bool:
        # Compare-and-set: a second relay that moved the cursor first makes this one fail.
        values = {"tx_id": after.tx_id, "position": after.position, "updated_at": now}
        moved = self._conn.execute(
            update(outbox_cursors)
            .where(
                outbox_cursors.c.consumer == consumer,
                outbox_cursors.c.tx_id == before.tx_id,
                outbox_cursors.c.position == before.position,
            )
            .values(**values)
        ).rowcount
        if moved:
            return True
        if before != EventCursor():
            return False
        return bool(
            insert_or_ignore(self._conn, outbox_cursors, {"consumer": consumer, **values}, ["consumer"])
        )


def _cursor(conn: Connection, consumer: str) -> EventCursor:
    row = conn.execute(
        select(outbox_cursors.c.tx_id, outbox_cursors.c.position).where(outbox_cursors.c.consumer == consumer)
    ).first()
    return EventCursor() if row is None else EventCursor(int(row.tx_id), int(row.position))


class SqlWorkerStore:
    """The :class:`~admission.worker.WorkerStore` on SQLite or PostgreSQL.

    Opening checks the schema revision and refuses anything but the head
    (contract §6), as :class:`~admission.sql.SqlStore` does.  On SQLite all
    owners share one machine, so a file lock next to the database proves
    exclusivity; on PostgreSQL the fenced lease alone decides.
    """

    def __init__(self, engine: Engine, *, check: bool = True) -> None:
        self.engine = engine
        self._postgres = is_postgresql(engine.dialect)
        # A transition of a batch writes one event per record: on the hot path.
        self._event_insert = BulkInsert(worker_events, engine.dialect, _EVENT_KEYS)
        self._steps = {
            False: BulkStatement(_STEP_MANY, engine.dialect),
            True: BulkStatement(_STEP_MANY_ATTEMPT, engine.dialect),
        }
        if check:
            with self._read() as conn:
                check_revision(conn)

    @classmethod
    def open(cls, url: str, **engine_options: Any) -> SqlWorkerStore:
        """Create an engine for ``url`` and open the store on it."""
        return cls(create_admission_engine(url, **engine_options))

    def dispose(self) -> None:
        """Close the engine's pooled connections."""
        self.engine.dispose()

    @property
    def local(self) -> bool:
        """SQLite is embedded: every owner runs on this machine."""
        return not self._postgres

    def default_lock_path(self, queue: str) -> str | None:
        """Beside a SQLite database file; none on PostgreSQL."""
        database = self.engine.url.database
        return None if self._postgres or not database else f"{database}.{queue}.lock"

    def _fenced(self, queue: str, fence: int) -> AbstractContextManager[None]:
        # The boundary for a record update: the fencing trigger's refusal is a FencedError.
        return wrap_exceptions(self.engine.dialect, {"worker_fence": lambda: stale_fence(queue, fence)})

    @contextmanager
    def _read(self) -> Iterator[Connection]:
        with wrap_exceptions(self.engine.dialect), self.engine.connect() as conn, conn.begin():
            yield conn

    def open_queue(self, queue: str, scope: bytes, now: datetime) -> bytes:
        """Create the queue pinned to ``scope`` and its lease unless they exist; the pinned scope."""
        with self._write() as conn:
            insert_or_ignore(
                conn, worker_queues, {"queue": queue, "scope": scope, "created_at": now}, ["queue"]
            )
            insert_or_ignore(
                conn,
                worker_leases,
                {"queue": queue, "token": 0, "holder": None, "heartbeat": 0, "claimed_at": None},
                ["queue"],
            )
            pinned = conn.execute(
                select(worker_queues.c.scope).where(worker_queues.c.queue == queue)
            ).scalar_one()
        return bytes(pinned)

    @contextmanager
    def _write(self) -> Iterator[Connection]:
        with wrap_exceptions(self.engine.dialect), self.engine.connect() as conn:
            conn.execution_options(**{WRITE_OPTION: True})
            with conn.begin():
                yield conn

    @contextmanager
    def _transaction(self, queue: str, connection: Connection | None) -> Iterator[_SqlWorkerTransaction]:
        if connection is not None:
            # The caller owns the transaction: neither commit nor roll back.
            with wrap_exceptions(self.engine.dialect):
                join_transaction(connection)
                yield _SqlWorkerTransaction(self, connection, queue)
            return
        with self._write() as conn:
            yield _SqlWorkerTransaction(self, conn, queue)

    def transaction(
        self, queue: str, *, connection: object | None = None
    ) -> AbstractContextManager[WorkerTransaction]:
        """A write transaction on ``queue``.

        ``connection`` is the caller's transaction, which it commits itself: a
        ``Connection``, a ``Session``, or through the async service an
        ``AsyncConnection`` or ``AsyncSession`` (see
        :func:`~admission.sql._caller.caller_connection`).
        """
        joined = None if connection is None else caller_connection(self.engine, connection)
        return self._transaction(queue, joined)

    def work(self, queue: str, state: str) -> list[WorkItem]:
        """The queue's records in ``state``, in queue order (only the columns a send uses)."""
        records = worker_records.c
        query = (
            select(*_WORK_COLUMNS).where(records.queue == queue, records.state == state).order_by(records.id)
        )
        with self._read() as conn:
            return [WorkItem(w, t, k, bytes(c), s, int(a)) for w, t, k, c, s, a in conn.execute(query)]

    def _records(self, query: Any) -> list[WorkerRecord]:
        with self._read() as conn:
            return [_record(row) for row in conn.execute(query).mappings()]

    def record(self, queue: str, write_id: str) -> WorkerRecord | None:
        """One record of the queue, by ``write_id``."""
        records = worker_records.c
        found = self._records(
            select(worker_records).where(records.write_id == write_id, records.queue == queue)
        )
        return found[0] if found else None

    def record_by_key(self, queue: str, tenant: str, source_key: str) -> WorkerRecord | None:
        """One record of the queue, by its intake key."""
        found = self._records(_by_key(queue, tenant, source_key))
        return found[0] if found else None

    def records(self, queue: str) -> list[WorkerRecord]:
        """Every record of the queue, in queue order."""
        records = worker_records.c
        return self._records(select(worker_records).where(records.queue == queue).order_by(records.id))

    def poll_batch(self, queue: str, state: str, limit: int) -> list[WorkerRecord]:
        """Records in ``state``: never polled first, then oldest polled, then queue order."""
        records = worker_records.c
        return self._records(
            select(worker_records)
            .where(records.queue == queue, records.state == state)
            .order_by(records.polled_at.asc().nulls_first(), records.id)
            .limit(limit)
        )

    def events(self, queue: str, write_id: str | None = None) -> list[WorkerEvent]:
        """The queue's events (or one record's), oldest first."""
        query = select(worker_events).where(worker_events.c.queue == queue)
        if write_id is not None:
            query = query.where(worker_events.c.write_id == write_id)
        with self._read() as conn:
            return [_event(row) for row in conn.execute(query.order_by(worker_events.c.position)).mappings()]

    def counts(self, queue: str) -> dict[str, int]:
        """How many records of the queue are in each state."""
        records = worker_records.c
        query = select(records.state, func.count()).where(records.queue == queue).group_by(records.state)
        with self._read() as conn:
            return {str(state): int(n) for state, n in conn.execute(query)}

    def lease_of(self, queue: str) -> LeaseRow:
        """The queue's lease as it stands."""
        with self._read() as conn:
            return _lease(
                conn.execute(select(worker_leases).where(worker_leases.c.queue == queue)).mappings().one()
            )

    def read_cursor(self, consumer: str) -> EventCursor:
        """Where ``consumer`` stands in the admission event log."""
        with self._read() as conn:
            return _cursor(conn, consumer)
