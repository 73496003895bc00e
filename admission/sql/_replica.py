"""Retries answered from a read replica: final receipts only, the primary for everything else.

A :class:`~admission.sql.SqlStore` given a ``read_engine`` reads a retry's
receipt there first (:class:`ReadReplica`).  The copy answers only when the
rule of :func:`~admission.receipts._answers.answerable_from_copy` says the
primary would answer the same: every row the key finds is final and its run
is open in the copy.  Anything else (no receipt, a pending command, a closed
run, a replica that fails) is read on the primary, as without a replica.  A
row read from the copy is the primary's row as it was committed, so the
answer built from it is byte for byte the primary's (``docs/replicas.md``).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Final

from sqlalchemy import Engine, Select, select
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from admission import telemetry
from admission.errors import InputError
from admission.receipts._answers import answerable_from_copy
from admission.receipts._rules import RunStatus
from admission.receipts._store import CommandRow, UpdateRow
from admission.sql._connections import kept_for
from admission.sql._engine import create_admission_engine, create_awaited_engine, normalize_url
from admission.sql._raw import RawStatement
from admission.sql._receipt_queries import (
    command_of_columns,
    command_row,
    optional_update_row,
    receipt_reads,
    signal_receipt_reads,
)
from admission.sql._revisions import check_revision
from admission.sql._schema import workflow_commands, workflow_runs

__all__ = [
    "REPLICA_CONNECT_TIMEOUT",
    "REPLICA_RETRY_SECONDS",
    "ReadReplica",
    "ReplicaCounts",
    "replica_engine",
]

REPLICA_RETRY_SECONDS: Final = 5.0
"""After a failed read, the replica is left alone this long (retries go to the primary), then tried again."""

REPLICA_CONNECT_TIMEOUT: Final = 2
"""PostgreSQL's ``connect_timeout`` (seconds) for a read URL that names none: an unreachable
replica costs at most this, once per :data:`REPLICA_RETRY_SECONDS`."""

_log: Final = telemetry.logger("sql")

_OPEN: Final = str(RunStatus.OPEN)


@dataclass(frozen=True)
class ReplicaCounts:
    """What a store's read replica did since the store opened (per process)."""

    answered: int = 0
    """Retries answered from the replica."""
    primary: int = 0
    """Keys read on the replica and answered by the primary: no receipt there, or one not final, or
    of a closed run."""
    unavailable: int = 0
    """Reads the replica failed, or that were not tried while it was failing: the primary answered."""


def _with_run_status(query: Select[Any]) -> Select[Any]:
    """A receipt read with the status of each command's run (``None`` for a refusal without one)."""
    return query.add_columns(
        select(workflow_runs.c.status)
        .where(workflow_runs.c.id == workflow_commands.c.run_id)
        .scalar_subquery()
        .label("run_status")
    )


class _CopyStatements:
    """The receipt reads of :mod:`~admission.sql._receipt_queries`, each row with its run's status."""

    def __init__(self, engine: Engine) -> None:
        self.signal_receipts = RawStatement(signal_receipt_reads(_with_run_status), engine.dialect)
        self.receipts = RawStatement(receipt_reads(_with_run_status), engine.dialect)


class ReadReplica:
    """The unlocked receipt read on a replica of the store's database, with the primary as fallback.

    Connections: kept readers lent to one read at a time, as the primary's
    reads are (:func:`~admission.sql._connections.kept_for`), on the
    replica's own engine, whose pool has the primary's options and so the
    same connection budget.  A read that raises anything leaves the replica alone
    for ``retry_after`` seconds; the first read after that tries it again
    (and checks its schema revision again).
    """

    def __init__(self, engine: Engine, primary: Engine, retry_after: float = REPLICA_RETRY_SECONDS) -> None:
        if engine.dialect.name != primary.dialect.name:
            raise InputError("must be a replica of the same kind of database as engine", field="read_engine")
        self.engine = engine
        self._statements = _CopyStatements(engine)
        self._kept = kept_for(engine)
        self._retry_after = retry_after
        self._mutex = threading.Lock()
        self._down_until = 0.0
        self._checked = False
        self._counts = [0, 0, 0]

    def counts(self) -> ReplicaCounts:
        """The counts so far."""
        with self._mutex:
            return ReplicaCounts(*self._counts)

    def _count(self, index: int, answer: str) -> None:
        with self._mutex:
            self._counts[index] += 1
        telemetry.replica_read(answer)

    def read(
        self, command_type: str, params: dict[str, Any]
    ) -> list[tuple[CommandRow, UpdateRow | None]] | None:
        """The key's receipts as the replica holds them, if they answer as the primary would, else None."""
        if self._down_until and time.monotonic() < self._down_until:
            self._count(2, "unavailable")
            return None
        try:
            if not self._checked:
                with self.engine.connect() as conn:
                    check_revision(conn)
                self._checked = True
            found = self._read(command_type, params)
        except Exception as exc:  # a replica's failure, whatever it is, falls back to the primary
            self._failed(exc)
            self._count(2, "unavailable")
            return None
        if self._down_until:
            self._down_until = 0.0
            _log.warning("the read replica answers again")
        if not answerable_from_copy(found):
            self._count(1, "primary")
            return None
        self._count(0, "replica")
        return [(command, update) for command, update, _ in found]

    def _read(
        self, command_type: str, params: dict[str, Any]
    ) -> list[tuple[CommandRow, UpdateRow | None, bool]]:
        return self._kept.read(self.engine, lambda _, cursor: self._rows(cursor, command_type, params))

    def _rows(
        self, cursor: Any, command_type: str, params: dict[str, Any]
    ) -> list[tuple[CommandRow, UpdateRow | None, bool]]:
        if command_type == "signal":
            return [
                (command_of_columns(r[:-1]), None, r[-1] == _OPEN)
                for r in self._statements.signal_receipts.tuples(cursor, params)
            ]
        return [
            (command_row(r), optional_update_row(r), r["run_status"] == _OPEN)
            for r in self._statements.receipts.rows(cursor, params)
        ]

    def _failed(self, error: Exception) -> None:
        first = not self._down_until
        self._down_until = time.monotonic() + self._retry_after
        self._checked = False
        # The class only: a driver's message may name the host, never needed here.
        _log.log(
            logging.WARNING if first else logging.DEBUG,
            "the read replica failed (%s); retries are read on the primary, the replica again in %.0f s",
            type(error).__name__,
            self._retry_after,
        )

    def dispose(self) -> None:
        """Close the replica's kept connections and its engine's pool."""
        self._kept.close()
        self.engine.dispose()


def replica_engine(read_url: str, engine_options: dict[str, Any], *, awaited: bool = False) -> Engine:
    """The engine of a read replica at ``read_url``, made as the primary's is (``engine_options``;
    ``awaited``: :func:`~admission.sql.create_awaited_engine`, for :func:`admission.aio.open_store`).

    A PostgreSQL URL that names no ``connect_timeout`` gets :data:`REPLICA_CONNECT_TIMEOUT`: a
    replica that does not answer must not hold a retry for the system's default (minutes).  A
    URL that cannot be used raises :class:`~admission.errors.InputError` naming ``read_url``.
    """
    try:
        url = make_url(normalize_url(read_url))
        if url.get_backend_name() == "postgresql" and "connect_timeout" not in url.query:
            url = url.update_query_dict({"connect_timeout": str(REPLICA_CONNECT_TIMEOUT)})
        make = create_awaited_engine if awaited else create_admission_engine
        return make(url.render_as_string(hide_password=False), **engine_options)
    except InputError as exc:
        raise InputError(str(exc), field="read_url") from exc
    except (ArgumentError, ValueError) as exc:
        raise InputError(f"the read replica's URL cannot be used: {exc}", field="read_url") from exc
