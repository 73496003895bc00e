"""Retention: pruning the receipts and history of runs closed long ago (contract §5).

A chain of runs linked by continue-as-new goes as a whole, once its last run
has closed and the latest time recorded on any of its rows is before the
cutoff (a command handed to a successor lives with it); refusals recorded
while an instance had no run go once they are older than the cutoff.  Each
chain is pruned in its own transaction under its instance's lock, decided
again there, and recorded as a ``RunsPruned`` event.

Clock faults (docs/lifecycle.md, "Clock faults"): a clock that stepped back
while something was written never makes anything prunable earlier, since a
chain is judged by its latest recorded time; a clock far ahead of the newest
time the store has recorded is capped (:func:`prune_cutoff`), since nothing
in the store shows that the time has passed.

Pure: no I/O, no clock, no SQLAlchemy (the store does the deleting).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Final

from admission.errors import InvalidValueError
from admission.receipts._answers import PruneReport
from admission.receipts._lifecycle import append_event
from admission.receipts._rules import RunStatus
from admission.receipts._store import LockedInstance, PruneCounts, PruneTarget, Store

__all__ = [
    "DEFAULT_MAX_CLOCK_LEAD",
    "MAX_DAYS",
    "Cutoff",
    "expired_chain",
    "prune_all",
    "prune_chain",
    "prune_cutoff",
    "utc_clock",
]

DEFAULT_MAX_CLOCK_LEAD: Final = timedelta(days=1)
"""How far pruning's ``now`` may run ahead of the newest time the store recorded before it is capped."""

MAX_DAYS: Final = timedelta.max.days
"""The longest retention (or clock lead) a :class:`~datetime.timedelta` holds, in days."""

_EARLIEST: Final = datetime.min.replace(tzinfo=UTC)


def utc_clock(clock: Callable[[], datetime]) -> Callable[[], datetime]:
    """``clock`` with every reading checked and taken to UTC.

    A reading in another zone is the same instant, but SQLite keeps a time's
    wall-clock digits without their offset: stored as read, a clock ten
    hours behind UTC would make every receipt look ten hours older there
    than on PostgreSQL or in memory, and be pruned that much early.  A naive
    reading is refused (it names no instant), before anything is written.
    """

    def read() -> datetime:
        now = clock()
        if not isinstance(now, datetime) or now.utcoffset() is None:
            raise InvalidValueError("must return timezone-aware datetimes", field="clock", path="")
        return now.astimezone(UTC)

    return read


@dataclass(frozen=True)
class Cutoff:
    """When pruning judges "now" to be, and what is old enough to go.

    ``as_of`` is the caller's ``now``, or, when that is more than the allowed
    lead ahead of ``newest`` (the newest time the store recorded), ``newest``
    plus the lead (``capped``).  ``before`` is ``as_of`` less the retention;
    ``recorded_at`` is the time the ``RunsPruned`` events carry: never later
    than ``newest`` when capped, so a clock stuck ahead cannot move the newest
    recorded time, and with it the cap, forward one pruning at a time.
    """

    as_of: datetime
    before: datetime
    recorded_at: datetime
    capped: bool


def prune_cutoff(
    now: datetime, retention: timedelta, newest: datetime | None, max_lead: timedelta | None
) -> Cutoff:
    """The cutoff of one pruning: ``now`` less ``retention``, with ``now`` capped at
    ``newest + max_lead`` (``max_lead`` ``None``: never capped)."""
    capped = max_lead is not None and newest is not None and now - newest > max_lead
    if capped:
        assert newest is not None and max_lead is not None
        # newest + max_lead < now here, so the sum cannot overflow.
        as_of, recorded_at = newest + max_lead, newest
    else:
        as_of, recorded_at = now, now
    try:
        before = as_of - retention
    except OverflowError:
        # A retention longer than the calendar reaches back: nothing is that old.
        before = _EARLIEST
    return Cutoff(as_of, before, recorded_at, capped)


class _DryRun(Exception):
    """Raised inside a dry-run pruning transaction so that it rolls back."""

    def __init__(self, counts: PruneCounts) -> None:
        super().__init__("dry run")
        self.counts = counts


def expired_chain(tx: LockedInstance, end: str | None, before: datetime) -> list[str]:
    """The runs of the chain ending in ``end``, if it has closed and the latest time
    recorded on its rows is before ``before``; else none."""
    # Decided again under the lock: the reading that found the target took none.
    run = None if end is None else tx.run(end)
    if (
        run is None
        or run.status in (RunStatus.OPEN, RunStatus.CONTINUED)
        or run.closed_at is None
        or run.closed_at >= before
    ):
        return []
    chain = [run.id]
    while run.continued_from_run_id is not None and (run := tx.run(run.continued_from_run_id)) is not None:
        chain.append(run.id)
    # The latest recorded time, not the close time alone: a close (or a later
    # refusal) written under a clock that stepped back must not shorten the
    # life of a receipt recorded at a later time (contract §5).
    latest = tx.latest_time(chain)
    return chain if latest is not None and latest < before else []


def prune_chain(
    store: Store, target: PruneTarget, cutoff: Cutoff, *, new_id: str, dry_run: bool
) -> PruneCounts:
    """Prune one target in its own locked transaction; a dry run makes every deletion and rolls back."""
    before, now = cutoff.before, cutoff.recorded_at
    try:
        with store.locked(target.namespace, target.workflow_id, created_at=now, new_id=new_id) as tx:
            chain = expired_chain(tx, target.run_id, before)
            if target.run_id is not None and not chain:
                return PruneCounts()  # pruned meanwhile, or no longer expired
            counts = tx.delete_runs(chain) if chain else tx.delete_runless_refusals(before)
            if counts != PruneCounts():
                append_event(
                    tx,
                    None,
                    "RunsPruned",
                    now,
                    {
                        "run_ids": list(chain),
                        "runs": counts.runs,
                        "commands": counts.commands,
                        "updates": counts.updates,
                        "events": counts.events,
                        "before": before.isoformat(),
                    },
                )
            if dry_run:
                raise _DryRun(counts)
            return counts
    except _DryRun as rolled_back:
        return rolled_back.counts


def prune_all(
    store: Store,
    retention_days: int,
    now: datetime,
    *,
    batch_size: int,
    dry_run: bool,
    progress: Callable[[PruneReport], None] | None,
    max_clock_lead: timedelta | None,
    new_id: Callable[[], str],
) -> PruneReport:
    """:meth:`AdmissionService.prune <admission.receipts.AdmissionService.prune>`: check
    the arguments (bad ones write nothing), take the cutoff, prune every target."""
    if type(retention_days) is not int or not 0 <= retention_days <= MAX_DAYS:
        raise InvalidValueError(f"must be an int from 0 to {MAX_DAYS}", field="retention_days", path="")
    if type(batch_size) is not int or not 1 <= batch_size <= 100_000:
        raise InvalidValueError("must be an int from 1 to 100000", field="batch_size", path="")
    if max_clock_lead is not None and (
        not isinstance(max_clock_lead, timedelta) or max_clock_lead < timedelta(0)
    ):
        raise InvalidValueError("must be a timedelta >= 0, or None", field="max_clock_lead", path="")
    if not isinstance(now, datetime) or now.utcoffset() is None:
        raise InvalidValueError("must be a timezone-aware datetime", field="now", path="")
    now = now.astimezone(UTC)
    newest = store.newest_time() if max_clock_lead is not None else None
    cutoff = prune_cutoff(now, timedelta(days=retention_days), newest, max_clock_lead)
    targets = store.prune_targets(cutoff.before)
    report = PruneReport(
        cutoff.before,
        retention_days,
        dry_run,
        len(targets),
        0,
        PruneCounts(),
        as_of=cutoff.as_of,
        clock_capped=cutoff.capped,
    )
    for start in range(0, len(targets), batch_size):
        for target in targets[start : start + batch_size]:
            counts = prune_chain(store, target, cutoff, new_id=new_id(), dry_run=dry_run)
            report = replace(report, done=report.done + 1, counts=report.counts + counts)
        if progress is not None:
            progress(report)
    return report
