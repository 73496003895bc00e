"""The retention statements of the receipt store: the times pruning judges by (contract §5).

A closed chain of runs is prunable once the latest time recorded on any of
its rows (the runs' start and close, their commands, updates and events) is
before the cutoff; these statements compute that time in the database, so no
column has to keep it and the admission path writes nothing more.  Built once
at import, like the other receipt statements.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any, Final

from sqlalchemy import (
    ColumnElement,
    Connection,
    Select,
    String,
    and_,
    bindparam,
    delete,
    func,
    select,
    union_all,
)

from admission.receipts._store import PruneCounts
from admission.sql._schema import (
    workflow_commands,
    workflow_history_events,
    workflow_instances,
    workflow_runs,
    workflow_updates,
)
from admission.sql._times import utc_or_none

__all__ = ["delete_run_rows", "delete_runless_refusals", "expired_ends", "latest_time", "newest_time"]

_runs, _commands, _updates, _events = (
    workflow_runs,
    workflow_commands,
    workflow_updates,
    workflow_history_events,
)
_BEFORE: Final = bindparam("before", type_=workflow_runs.c.closed_at.type)
_IID: Final = bindparam("iid", type_=String())
_RUN_IDS: Final = bindparam("run_ids", type_=String(), expanding=True)


def _latest_of_runs() -> Select[Any]:
    """One row: the latest of each kind of time recorded on the rows of some runs of one instance."""

    def latest(column: ColumnElement[Any], *where: ColumnElement[bool]) -> Any:
        return select(func.max(column)).where(*where).scalar_subquery()

    runs = (_runs.c.instance_id == _IID, _runs.c.id.in_(_RUN_IDS))
    updates = (_updates.c.instance_id == _IID, _updates.c.run_id.in_(_RUN_IDS))
    return select(
        latest(_runs.c.started_at, *runs),
        latest(_runs.c.closed_at, *runs),
        latest(_commands.c.created_at, _commands.c.instance_id == _IID, _commands.c.run_id.in_(_RUN_IDS)),
        latest(_updates.c.accepted_at, *updates),
        latest(_updates.c.completed_at, *updates),
        latest(_events.c.recorded_at, _events.c.instance_id == _IID, _events.c.run_id.in_(_RUN_IDS)),
    )


LATEST_OF_RUNS: Final = _latest_of_runs()
NEWEST: Final = select(
    *(
        select(func.max(column)).scalar_subquery()
        for column in (
            workflow_instances.c.created_at,
            _runs.c.started_at,
            _runs.c.closed_at,
            _commands.c.created_at,
            _updates.c.accepted_at,
            _updates.c.completed_at,
            _events.c.recorded_at,
        )
    )
)


def _expired_ends() -> Select[Any]:
    """Closed chain ends whose chain's latest recorded time is before ``:before``.

    A recursive walk from each closed end (one that did not continue) back
    along ``continued_from_run_id`` pairs every run of a chain with its end;
    the times of every row of those runs are then taken per end.  The close
    time is a necessary condition (it is one of the times), so only ends
    closed before the cutoff start a walk.
    """
    start = select(
        _runs.c.id.label("end_id"), _runs.c.id.label("run_id"), _runs.c.instance_id.label("instance_id")
    ).where(_runs.c.status.not_in(["open", "continued"]), _runs.c.closed_at < _BEFORE)
    chain = start.cte("chain", recursive=True)
    back = _runs.alias("back")
    chain = chain.union_all(
        select(chain.c.end_id, back.c.continued_from_run_id, chain.c.instance_id)
        .select_from(chain.join(back, back.c.id == chain.c.run_id))
        .where(back.c.continued_from_run_id.is_not(None))
    )

    def times(column: ColumnElement[Any], table: Any, on: ColumnElement[bool]) -> Select[Any]:
        return select(chain.c.end_id, column.label("t")).select_from(chain.join(table, on))

    same = {
        table: and_(table.c.instance_id == chain.c.instance_id, table.c.run_id == chain.c.run_id)
        for table in (_commands, _updates, _events)
    }
    every = union_all(
        times(_runs.c.started_at, _runs, _runs.c.id == chain.c.run_id),
        times(_runs.c.closed_at, _runs, _runs.c.id == chain.c.run_id),
        times(_commands.c.created_at, _commands, same[_commands]),
        times(_updates.c.accepted_at, _updates, same[_updates]),
        times(_updates.c.completed_at, _updates, same[_updates]),
        times(_events.c.recorded_at, _events, same[_events]),
    ).subquery("times")
    expired = (
        select(every.c.end_id).group_by(every.c.end_id).having(func.max(every.c.t) < _BEFORE)
    ).scalar_subquery()
    return (
        select(workflow_instances.c.namespace, workflow_instances.c.workflow_id, _runs.c.id)
        .join(workflow_instances, workflow_instances.c.id == _runs.c.instance_id)
        .where(_runs.c.id.in_(expired))
        .order_by(_runs.c.closed_at, _runs.c.id)
    )


EXPIRED_ENDS: Final = _expired_ends()


def _latest(values: Iterable[datetime | str | None]) -> datetime | None:
    return max((t for t in map(utc_or_none, values) if t is not None), default=None)


def latest_time(conn: Connection, instance_id: str, run_ids: Sequence[str]) -> datetime | None:
    """The latest time recorded on the rows of these runs of one instance (see
    :meth:`~admission.receipts.LockedInstance.latest_time`)."""
    if not run_ids:
        return None
    row = conn.execute(LATEST_OF_RUNS, {"iid": instance_id, "run_ids": list(run_ids)}).one()
    return _latest(row)


def newest_time(conn: Connection) -> datetime | None:
    """The newest time recorded on any row of the receipt tables."""
    return _latest(conn.execute(NEWEST).one())


def expired_ends(conn: Connection, before: datetime) -> list[tuple[str, str, str]]:
    """(namespace, workflow_id, end run id) of every closed chain whose latest recorded
    time is before ``before``, oldest close first."""
    return [(ns, wf, run_id) for ns, wf, run_id in conn.execute(EXPIRED_ENDS, {"before": before})]


def delete_run_rows(connection: Connection, instance_id: str, run_ids: list[str]) -> tuple[int, int, int]:
    """Delete the events, updates and commands of these runs of one instance; how many of each."""
    events, updates, commands = (
        connection.execute(delete(t).where(t.c.instance_id == instance_id, t.c.run_id.in_(run_ids))).rowcount
        for t in (_events, _updates, _commands)  # children before the commands they point at
    )
    return events, updates, commands


def delete_runless_refusals(connection: Connection, instance_id: str, before: datetime) -> PruneCounts:
    """Delete one instance's refusals recorded without a run before ``before``, with their events."""
    stale = select(_commands.c.id).where(
        _commands.c.instance_id == instance_id,
        _commands.c.run_id.is_(None),
        _commands.c.created_at < before,
    )
    events = connection.execute(
        delete(_events).where(
            _events.c.instance_id == instance_id,
            _events.c.run_id.is_(None),
            _events.c.command_id.in_(stale),
        )
    ).rowcount
    commands = connection.execute(
        delete(_commands).where(_commands.c.id.in_(stale.scalar_subquery()))
    ).rowcount
    return PruneCounts(0, commands, 0, events)
