"""Observation of confirmed records: status snapshots and fair polling (worker contract §5).

A confirmed record's latest status is kept as a snapshot; only a changed
snapshot is an event, a failing read is recorded once per failing streak,
and a record the target positively no longer has becomes
``confirmed_then_missing``, never to be recreated.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from admission.errors import InvalidRecordError, InvalidValueError, RecordStateError
from admission.intent._encoding import canonical_encode
from admission.worker._intake import MAX_CONTENT
from admission.worker._states import WriteState
from admission.worker._store import WorkerRecord
from admission.worker._targets import StatusRead, Target
from admission.worker._transitions import RecordWriter

__all__ = ["PollReport", "StatusObserver"]


@dataclass(frozen=True)
class PollReport:
    """What one polling pass read (contract §5)."""

    read: int = 0
    changed: int = 0
    missing: int = 0
    failed: int = 0


class StatusObserver:
    """Applies status reads to the confirmed records of one queue, through its :class:`RecordWriter`."""

    def __init__(self, writer: RecordWriter, now: Callable[[], datetime]) -> None:
        self._writer = writer
        self._now = now

    def observe(self, record: WorkerRecord, snapshot: object = None, *, missing: bool = False) -> bool:
        """Store a confirmed record's latest snapshot; True if it changed (``DurableWorker.observe``)."""
        write_id = record.write_id
        if missing:
            self.apply_read(record, StatusRead("missing", write_id))
            return True
        try:
            canonical_encode(snapshot, max_size=MAX_CONTENT)
        except InvalidValueError as exc:
            raise InvalidRecordError(exc.message, field="snapshot") from exc
        return self.apply_read(record, StatusRead("found", write_id, snapshot))

    def poll(self, target: Target, limit: int, keep_lease: Callable[[], None]) -> PollReport:
        """One polling pass of an owner (``DurableWorker.poll_status``); ``keep_lease`` renews as it goes."""
        keep_lease()
        records = self._writer.store.poll_batch(self._writer.queue, WriteState.CONFIRMED, limit)
        if not records:
            return PollReport()
        try:
            reads = target.observe_status([r.write_id for r in records])
        except Exception as exc:
            reads = [StatusRead("unknown", r.write_id, detail=repr(exc)) for r in records]
        by_id = {read.write_id: read for read in reads}
        tally = {"read": 0, "changed": 0, "missing": 0, "failed": 0}
        for record in records:
            read = by_id.get(record.write_id, StatusRead("unknown", record.write_id, detail="no answer"))
            keep_lease()
            changed = self.apply_read(record, read)
            tally["read"] += 1
            if read.kind == "missing":
                tally["missing"] += 1
            elif read.kind == "unknown":
                tally["failed"] += 1
            elif changed:
                tally["changed"] += 1
        return PollReport(**tally)

    def apply_read(self, record: WorkerRecord, read: StatusRead) -> bool:
        """Apply one status read to a confirmed record; True if its snapshot changed (or it went missing)."""
        write_id, confirmed = record.write_id, WriteState.CONFIRMED
        if record.state != confirmed:
            raise RecordStateError(
                f"record {write_id} is {record.state}; only confirmed records are observed",
                write_id=write_id,
                state=record.state,
            )
        now = self._now()
        if read.kind == "missing":
            self._writer.transition(
                record, "observed_missing", "the target no longer has the row", values={"polled_at": now}
            )
            return True
        with self._writer.store.transaction(self._writer.queue) as tx:
            fence = self._writer.fence(tx)
            if read.kind == "unknown":
                # Keep the snapshot; record poll-health once per failing streak (deduplicated).
                tx.update(write_id, confirmed, fence, {"polled_at": now, "poll_health": "failing"})
                if record.poll_health != "failing":
                    detail = f"status read failed: {read.detail}" if read.detail else "status read failed"
                    self._writer.event(tx, write_id, "poll_failed", confirmed, confirmed, detail, fence=fence)
                return False
            encoded = canonical_encode(read.snapshot, max_size=MAX_CONTENT)
            changed = record.snapshot != encoded
            changes = {"snapshot": encoded, "polled_at": now, "poll_health": "ok", "updated_at": now}
            tx.update(write_id, confirmed, fence, changes)
            if record.poll_health == "failing":
                self._writer.event(
                    tx, write_id, "poll_recovered", confirmed, confirmed, "status read again", fence=fence
                )
            if changed:
                self._writer.event(
                    tx, write_id, "status_changed", confirmed, confirmed, "a new status snapshot", fence=fence
                )
            return changed
