"""One state change of a worker record: one transaction with its event, fenced (worker contract §2, §3).

The worker and the operator change a record only through :class:`RecordWriter`:
the next state comes from :data:`~admission.worker.WRITE_TRANSITIONS`, the
update is guarded by the previous state, it carries the writer's fencing
token (which the store refuses once another owner claimed the queue), and the
event that records it commits with it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from datetime import datetime

from admission.errors import InvalidRecordError, RecordStateError
from admission.worker._intake import WorkerLimits, bounded_text
from admission.worker._lease import QueueLease
from admission.worker._states import WRITE_TRANSITIONS
from admission.worker._store import WorkerEvent, WorkerRecord, WorkerStore, WorkerTransaction, WorkItem

__all__ = ["RecordWriter", "number"]


def number(value: object, field: str, low: int, high: int) -> int:
    """``value`` if it is an int from ``low`` to ``high``, else an error naming ``field``."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidRecordError(f"must be an integer from {low} to {high}", field=field)
    return value


class RecordWriter:
    """Fenced, evented state changes of the records of one queue."""

    def __init__(
        self,
        store: WorkerStore,
        queue: str,
        lease: QueueLease,
        limits: WorkerLimits,
        now: Callable[[], datetime],
    ) -> None:
        self.store = store
        self.queue = queue
        self.limits = limits
        self._lease = lease
        self._now = now

    def fence(self, tx: WorkerTransaction) -> int:
        """The token a write carries: the owner's, or for an operator the current one (locked)."""
        if self._lease.token is not None:
            return self._lease.token
        # An operator's write (resolve, observe) outside a worker cycle carries the
        # token current in its own transaction: it never races a claim.
        return tx.token()

    def transition(
        self,
        item: WorkItem | WorkerRecord,
        event: str,
        reason: str,
        *,
        actor: str | None = None,
        diagnostic: str | None = None,
        values: Mapping[str, object] | None = None,
    ) -> str:
        """Move a record by ``event`` in one transaction with its event; returns the new state."""
        with self.store.transaction(self.queue) as tx:
            fence = self.fence(tx)
            state = WRITE_TRANSITIONS.next_state(item.state, event, subject=item.write_id)
            changes: dict[str, object] = {"state": state, "updated_at": self._now(), **(values or {})}
            if diagnostic is not None:
                changes["diagnostic"] = bounded_text(diagnostic, self.limits.max_diagnostic)
            # Guarded by the previous state; the store refuses a stale ``fence`` (contract §3).
            if not tx.update(item.write_id, item.state, fence, changes):
                raise RecordStateError(
                    f"record {item.write_id} is no longer {item.state}", write_id=item.write_id, state=None
                )
            self.event(tx, item.write_id, event, item.state, state, reason, fence=fence, actor=actor)
        return state

    def step_many(
        self,
        tx: WorkerTransaction,
        fence: int,
        items: list[WorkItem],
        event: str,
        reason: str,
        *,
        count_attempt: bool = False,
    ) -> list[WorkItem]:
        """Move ``items``, all in one state, by ``event`` inside ``tx``; returns them as moved."""
        # The same transition for records that are all in one state: one batched
        # update and one batch of events, whatever the batch size.
        state = items[0].state
        new_state = WRITE_TRANSITIONS.next_state(state, event)
        if any(item.state != state for item in items):
            raise RecordStateError(f"{event} is not allowed from {state}", write_id=None, state=state)
        now = self._now()
        ids = [item.write_id for item in items]
        if tx.update_many(ids, state, new_state, fence, now, count_attempt=count_attempt) != len(ids):
            raise RecordStateError(
                f"records changed state under the worker ({event})", write_id=None, state=state
            )
        template = WorkerEvent(self.queue, None, event, state, new_state, reason, None, fence, now)
        tx.record_events(template, ids)
        step = 1 if count_attempt else 0
        return [replace(item, state=new_state, attempts=item.attempts + step) for item in items]

    def event(
        self,
        tx: WorkerTransaction,
        write_id: str | None,
        event_type: str,
        from_state: str | None,
        to_state: str | None,
        reason: str,
        *,
        fence: int | None,
        actor: str | None = None,
    ) -> None:
        """Append one event inside ``tx`` (its reason bounded, contract §1)."""
        reason = bounded_text(reason, self.limits.max_diagnostic)
        event = WorkerEvent(
            self.queue, write_id, event_type, from_state, to_state, reason, actor, fence, self._now()
        )
        tx.record_events(event, [write_id])
