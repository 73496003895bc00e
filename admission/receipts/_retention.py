"""Retention: pruning the receipts and history of runs closed long ago (contract §5).

A chain of runs linked by continue-as-new goes as a whole, once its last run
closed before the cutoff (a command handed to a successor lives with it);
refusals recorded while an instance had no run go once they are older than
the cutoff.  Each chain is pruned in its own transaction under its instance's
lock, decided again there, and recorded as a ``RunsPruned`` event.

Pure: no I/O, no clock, no SQLAlchemy (the store does the deleting).
"""

from __future__ import annotations

from datetime import datetime

from admission.receipts._lifecycle import append_event
from admission.receipts._rules import RunStatus
from admission.receipts._store import LockedInstance, PruneCounts, PruneTarget, Store

__all__ = ["expired_chain", "prune_chain"]


class _DryRun(Exception):
    """Raised inside a dry-run pruning transaction so that it rolls back."""

    def __init__(self, counts: PruneCounts) -> None:
        super().__init__("dry run")
        self.counts = counts


def expired_chain(tx: LockedInstance, end: str | None, before: datetime) -> list[str]:
    """The runs of the chain ending in ``end``, if it closed before ``before``; else none."""
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
    return chain


def prune_chain(
    store: Store, target: PruneTarget, before: datetime, now: datetime, *, new_id: str, dry_run: bool
) -> PruneCounts:
    """Prune one target in its own locked transaction; a dry run makes every deletion and rolls back."""
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
