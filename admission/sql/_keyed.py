"""PostgreSQL: a keyed command's lock and its key's receipts in one round trip (part of
:class:`~admission.sql.SqlStore`).

Without it a keyed admission first reads its key's receipts on a connection of
their own (a round trip, and a second server session), and takes the lock only
when none answers.  Here the lock's exchange carries the read: ``BEGIN``, the
lock taken only while no receipt holds the key
(:data:`~admission.sql._receipt_queries.LOCK_UNLESS_RETAINED`), the instance
lookup, then the key's receipts.  Each is a statement of its own, so under READ
COMMITTED the receipts are read as of after the lock, when it was taken.  A
fresh key then costs two exchanges on one connection; a retry takes no lock and
writes nothing, and its transaction ends with a ``COMMIT`` (a second round
trip, where a read of its own took one).  So the service asks for it only
while retries are rare (:data:`~admission.receipts._service.RETRY_SHARE`);
docs/performance.md has what each way costs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy.engine import Connection

from admission.receipts._store import CommandRow, LockedInstance, UpdateRow
from admission.sql._fused import lock_rows
from admission.sql._receipt_queries import (
    ReceiptStatements,
    key_values,
    receipt_order,
    receipt_pairs,
)

__all__ = ["KeyedLocks"]

T = TypeVar("T")
Found = list[tuple[CommandRow, UpdateRow | None]]
"""A key's receipts, oldest first, each with its update (none for a signal)."""


class KeyedLocks:
    """:meth:`locked_unless_retained`, on a store where the lock's round trip may carry more."""

    if TYPE_CHECKING:
        keyed_locks: bool
        _raw: ReceiptStatements
        _async: bool

        def _held(
            self, connection: Connection | None, take: Callable[[Connection, str | None], T]
        ) -> AbstractContextManager[T]: ...

        def _driver(self, conn: Connection, begin: str | None) -> Any: ...

        def _lock_rows(
            self, dbapi: Any, cursor: Any, params: Mapping[str, Any], begin: str | None
        ) -> list[dict[str, Any]]: ...

        # SqlStore._locked: the locked instance of the lock's rows (created first when none).
        _locked: Callable[..., LockedInstance]

    def locked_unless_retained(
        self,
        namespace: str,
        workflow_id: str,
        command_type: str,
        request_ids: Sequence[str],
        *,
        created_at: datetime,
        new_id: str,
    ) -> AbstractContextManager[LockedInstance | Found]:
        """The store's own transaction for a keyed command (``request_ids``: its token and raw key),
        with the lock taken only while no receipt holds the key.

        Yields the key's receipts when there are some (the transaction then holds no lock and
        writes nothing), else the locked instance (created if missing, as by
        :meth:`~admission.sql.SqlStore.locked`), whose first
        :meth:`~admission.receipts.LockedInstance.find_commands` for the key answers with what
        was read after the lock, in the same round trip.  Where :attr:`keyed_locks` is false
        (SQLite, whose write transaction is the lock) it is :meth:`~admission.sql.SqlStore.locked`:
        the locked instance, the key read under the lock when asked.
        """
        names = (namespace, workflow_id, command_type)
        return self._held(
            None,
            lambda conn, begin: self._unless_retained(conn, names, request_ids, (created_at, new_id), begin),
        )

    def _unless_retained(
        self,
        conn: Connection,
        names: tuple[str, str, str],
        request_ids: Sequence[str],
        new: tuple[datetime, str],
        begin: str | None,
    ) -> LockedInstance | Found:
        namespace, workflow_id, command_type = names
        params: dict[str, Any] = {"namespace": namespace, "workflow_id": workflow_id}
        dbapi = self._driver(conn, begin)
        cursor = dbapi.cursor()
        lock = self._raw.lock_unless_retained
        # The token, the first of request_ids, holds no NUL: key_values keeps it on PostgreSQL.
        values = None if lock is None else key_values(request_ids, True)
        if lock is None or values is None:
            # SQLite: the plain lock (BEGIN IMMEDIATE), the key read under it when asked.
            rows = self._lock_rows(dbapi, cursor, params, begin)
            return self._locked(conn, (dbapi, cursor), rows, params, new, begin is not None)
        params.update(command_type=command_type, token=values[0], raw=values[1])
        signal = command_type == "signal"
        receipts = self._raw.signal_receipts if signal else self._raw.receipts
        statements = (lock, self._raw.instance_lookup, receipts)
        locked, instance, rows = lock_rows(
            dbapi, cursor, statements, params, begin=begin, is_async=self._async
        )
        found = receipt_pairs(rows, not signal)
        found = receipt_order(found) if len(found) > 1 else found
        if instance and not locked and found:
            return found
        # Locked: the key's commands as read after the lock.  Otherwise the instance does not
        # exist yet, or the key's receipts were pruned after the lock's test: the lock as always.
        first = ((command_type, request_ids), [command for command, _ in found]) if locked else None
        return self._locked(
            conn, (dbapi, cursor), instance if locked else [], params, new, begin is not None, first
        )
