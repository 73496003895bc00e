"""The receipt store's reads that take no lock and serve no retry: an instance, its history,
the retention targets, the newest time and the event log (a part of :class:`~admission.sql.SqlStore`)."""

from __future__ import annotations

from contextlib import AbstractContextManager
from datetime import datetime
from typing import TYPE_CHECKING

from sqlalchemy import select
from sqlalchemy.engine import Connection

from admission.receipts._store import EventCursor, EventRow, InstanceRow, PruneTarget
from admission.sql._event_log import read_after
from admission.sql._event_rows import event_row, readable_events
from admission.sql._receipt_queries import instance_row
from admission.sql._retention import expired_ends, newest_time
from admission.sql._schema import workflow_commands, workflow_history_events, workflow_instances

__all__ = ["ReceiptReads"]


class ReceiptReads:
    """Reads of the whole log and of retention, each in a read transaction of its own."""

    if TYPE_CHECKING:
        postgres: bool

        def _read(self) -> AbstractContextManager[Connection]: ...

    def find_instance(self, namespace: str, workflow_id: str) -> InstanceRow | None:
        """Read an instance without locking it."""
        with self._read() as conn:
            row = (
                conn.execute(
                    select(workflow_instances).where(
                        workflow_instances.c.namespace == namespace,
                        workflow_instances.c.workflow_id == workflow_id,
                    )
                )
                .mappings()
                .first()
            )
        return None if row is None else instance_row(row)

    def read_history(self, instance_id: str) -> list[EventRow]:
        """Every event of one instance, in log order."""
        with self._read() as conn:
            rows = (
                conn.execute(
                    readable_events()
                    .where(workflow_history_events.c.instance_id == instance_id)
                    .order_by(workflow_history_events.c.position)
                )
                .mappings()
                .all()
            )
        return [event_row(r) for r in rows]

    def prune_targets(self, before: datetime) -> list[PruneTarget]:
        """Closed chains whose latest recorded time is before ``before``, then instances
        with older run-less refusals."""
        runless = (
            select(workflow_instances.c.namespace, workflow_instances.c.workflow_id)
            .where(
                workflow_instances.c.id.in_(
                    select(workflow_commands.c.instance_id).where(
                        workflow_commands.c.run_id.is_(None), workflow_commands.c.created_at < before
                    )
                )
            )
            .order_by(workflow_instances.c.id)
        )
        with self._read() as conn:
            ends = [PruneTarget(ns, wf, run_id) for ns, wf, run_id in expired_ends(conn, before)]
            stale = [PruneTarget(ns, wf, None) for ns, wf in conn.execute(runless)]
        return ends + stale

    def newest_time(self) -> datetime | None:
        """The newest time recorded anywhere in the receipt tables."""
        with self._read() as conn:
            return newest_time(conn)

    def read_events(self, after: EventCursor, limit: int) -> list[EventRow]:
        """Events after ``after`` that are safe to read now, in (tx_id, position) order.

        On PostgreSQL only events of transactions older than every transaction
        still running are returned (``tx_id < txid_snapshot_xmin``): a
        transaction still open may yet commit events with lower positions,
        and a reader that passed them would never see them.  A cursor, or a
        log, holding a transaction id this server has not handed out yet
        (the database moved to another cluster) raises
        :class:`~admission.errors.EventLogMovedError` and reads nothing.
        """
        if self.postgres:
            # The same statement reads the server's transaction counter: a
            # cursor or log from another cluster raises EventLogMovedError.
            with self._read() as conn:
                return read_after(conn, after, limit)
        events = workflow_history_events
        query = readable_events().where(events.c.position > after.position).order_by(events.c.position)
        with self._read() as conn:
            rows = conn.execute(query.limit(limit)).mappings().all()
        return [event_row(r) for r in rows]
