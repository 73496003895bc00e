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

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Final

from admission.receipts._lifecycle import append_event
from admission.receipts._rules import RunStatus
from admission.receipts._store import LockedInstance, PruneCounts, PruneTarget, Store

__all__ = ["DEFAULT_MAX_CLOCK_LEAD", "Cutoff", "expired_chain", "prune_chain", "prune_cutoff"]

DEFAULT_MAX_CLOCK_LEAD: Final = timedelta(days=1)
"""How far pruning's ``now`` may run ahead of the newest time the store recorded before it is capped."""

_EARLIEST: Final = datetime.min.replace(tzinfo=UTC)


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
