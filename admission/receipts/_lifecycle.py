"""The run lifecycle under the admission lock: start, close, continue, apply, finish (contract §5).

Each function runs inside one :class:`~admission.receipts.LockedInstance`
(the service opens it, after validating its input) and applies the tables of
:mod:`admission.receipts._rules`; every change is written beside the event
that records it.  Receipts never change: a closed run's pending commands end
(or move to the successor) with events of their own, and a retry still gets
the original answer.

Pure: no I/O, no clock (``now`` is passed in), no SQLAlchemy.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timedelta

from admission.errors import AdmissionError, RunStateError, UnknownCommandError, UnknownUpdateError
from admission.intent._encoding import canonical_encode
from admission.receipts._answers import REFUSALS, RunInfo, answer, command_payload, literal_key, run_info
from admission.receipts._rules import (
    CLOSE_EVENTS,
    IN_PROGRESS_EXPIRED,
    RUN_TRANSITIONS,
    SIGNAL_TRANSITIONS,
    UPDATE_TRANSITIONS,
    Admission,
    Decision,
    RunStatus,
    UpdateStatus,
    closing_event,
    may_take_over,
)
from admission.receipts._store import CommandRow, EventRow, LockedInstance, RunRow, UpdateRow, insert_stepwise

__all__ = [
    "admitted",
    "append_event",
    "apply_signal",
    "chain_of",
    "close_run",
    "close_time",
    "command_of",
    "finish_update",
    "pending",
    "release_update",
    "start_run",
    "take_over_update",
]


def append_event(
    tx: LockedInstance,
    run_id: str | None,
    event_type: str,
    now: datetime,
    payload: dict[str, object],
    *,
    command_id: str | None = None,
    update_id: str | None = None,
) -> EventRow:
    """Append one event of the instance's log, its payload canonically encoded."""
    return tx.append_event(_event(tx, run_id, event_type, now, payload, command_id, update_id))


def _event(
    tx: LockedInstance,
    run_id: str | None,
    event_type: str,
    now: datetime,
    payload: dict[str, object],
    command_id: str | None,
    update_id: str | None,
) -> EventRow:
    instance = tx.instance
    return EventRow(
        instance.namespace,
        instance.id,
        run_id,
        event_type,
        command_id,
        update_id,
        canonical_encode(payload),
        now,
    )


def command_of(tx: LockedInstance, command_id: str) -> CommandRow:
    """A command of the locked instance that must exist."""
    row = tx.get_command(command_id)
    if row is None:  # pragma: no cover - the foreign key guarantees it
        raise AdmissionError(f"command {command_id} is missing")
    return row


def chain_of(tx: LockedInstance, current: RunRow) -> list[str]:
    """``current`` and the runs it continues, newest first."""
    chain = [current.id]
    run = current
    while run.continued_from_run_id is not None:
        previous = tx.run(run.continued_from_run_id)
        if previous is None:
            break
        chain.append(previous.id)
        run = previous
    return chain


def pending(
    tx: LockedInstance, current: RunRow, chain: list[str] | None = None
) -> list[tuple[CommandRow, UpdateRow | None]]:
    """Commands the current run still has to apply: its own, and instance-scope
    ones handed down from the runs it continues (contract §5)."""
    return [
        (command, update)
        for command, update in tx.pending_commands(chain_of(tx, current) if chain is None else chain)
        if command.run_id == current.id or command.target_scope == "instance"
    ]


def close_time(tx: LockedInstance, chain: list[str], now: datetime) -> datetime:
    """When a run closes: ``now``, or, if the clock reads earlier, the latest time
    already recorded on the chain's rows.

    A close is never recorded before the run's start, its commands or any
    other time written for it: retention counts from the latest of them, and
    a clock that stepped back during the close must not make the run look
    older than it is (docs/lifecycle.md, "Clock faults").
    """
    latest = tx.latest_time(chain)
    return now if latest is None or latest <= now else latest


def admitted(
    tx: LockedInstance,
    row: CommandRow,
    key: str | None,
    new_id: Callable[[], str],
    now: datetime,
    *,
    last: bool = False,
) -> Admission | None:
    """Insert a fresh command with what it brings beside its row: the update it opens (an update
    not refused) and its event, in one :meth:`~LockedInstance.insert_admitted` (``last`` as there);
    its answer (contract §4), or ``None``, nothing written, if its key is already taken."""
    refused = row.rejection_reason is not None
    update: UpdateRow | None = None
    if row.command_type == "update" and not refused:
        assert row.run_id is not None
        update = UpdateRow(
            new_id(), row.id, row.instance_id, row.run_id, row.name, "accepted", None, None, now, None
        )
    event_type = (
        "CommandRejected"
        if refused
        else ("SignalReceived" if row.command_type == "signal" else "UpdateAccepted")
    )
    event = _event(
        tx, row.run_id, event_type, now, command_payload(row, key), row.id, update.id if update else None
    )
    insert = getattr(tx, "insert_admitted", None)
    # A store of one's own written before insert_admitted joined the port: the same rows, one by one.
    written = (
        insert_stepwise(tx, row, update, event) if insert is None else insert(row, update, event, last=last)
    )
    if not written:
        return None
    instance = tx.instance
    return answer(
        Decision.FRESH, instance.namespace, instance.workflow_id, row, update, key, intent_verified=True
    )


def start_run(tx: LockedInstance, run_id: str, now: datetime) -> RunInfo:
    """Start run ``run_id`` of the locked instance; refused while it has an open run."""
    previous = tx.current_run()
    if previous is not None and previous.status == RunStatus.OPEN:
        raise RunStateError(
            f"workflow {tx.instance.workflow_id!r} already has an open run {previous.id}",
            reason="run_already_open",
            run_id=previous.id,
        )
    run = RunRow(
        id=run_id,
        instance_id=tx.instance.id,
        run_number=1 if previous is None else previous.run_number + 1,
        status=RunStatus.OPEN,
        continued_from_run_id=None,
        started_at=now,
        closed_at=None,
    )
    tx.insert_run(run)
    tx.set_current_run(run.id)
    append_event(tx, run.id, "RunStarted", now, {"run_number": run.run_number})
    return run_info(tx, run)


def close_run(
    tx: LockedInstance,
    status: str,
    run_id: str | None,
    successor_id: str,
    now: datetime,
    *,
    continue_as_new: bool,
) -> RunInfo:
    """Close the current run with ``status``; with ``continue_as_new``, open its successor
    ``successor_id`` and hand it the instance-scope commands not yet applied."""
    current = tx.current_run()
    if current is None or current.status != RunStatus.OPEN or (run_id is not None and run_id != current.id):
        raise RunStateError(
            f"workflow {tx.instance.workflow_id!r} has no open run"
            + (f" {run_id}" if run_id is not None else ""),
            reason="run_not_active",
            run_id=run_id,
        )
    chain = chain_of(tx, current)
    # Everything the close writes (the close, the pending commands it ends,
    # the successor's start and the handoffs) carries the same, clamped time.
    now = close_time(tx, chain, now)
    waiting = pending(tx, current, chain)
    # Pending commands that cannot follow a successor close with their
    # run, before it closes; their receipts stay as they were (§5).
    for command, update in waiting:
        if closing_event(command.target_scope, continue_as_new) == "run_closed":
            _close_pending(tx, command, update, current.id, now)
    closed = replace(
        current,
        status=RUN_TRANSITIONS.next_state(current.status, CLOSE_EVENTS[status], subject=current.id),
        closed_at=now,
    )
    tx.save_run(closed)
    # str(): the status is a RunStatus, and the canonical encoding takes exact types only.
    append_event(tx, closed.id, "RunClosed", now, {"status": str(closed.status)})
    if not continue_as_new:
        return run_info(tx, closed)
    successor = RunRow(
        id=successor_id,
        instance_id=tx.instance.id,
        run_number=current.run_number + 1,
        status=RunStatus.OPEN,
        continued_from_run_id=current.id,
        started_at=now,
        closed_at=None,
    )
    tx.insert_run(successor)
    tx.set_current_run(successor.id)
    append_event(
        tx,
        successor.id,
        "RunStarted",
        now,
        {"run_number": successor.run_number, "continued_from_run_id": current.id},
    )
    # Instance-scope commands not yet applied move to the successor, in
    # their original order, keeping their ids, arguments and times.
    for command, update in waiting:
        if closing_event(command.target_scope, continue_as_new) == "handed_off":
            append_event(
                tx,
                successor.id,
                "CommandHandedOff",
                now,
                {
                    "from_run_id": current.id,
                    "to_run_id": successor.id,
                    "command_sequence": command.command_sequence,
                },
                command_id=command.id,
                update_id=update.id if update else None,
            )
    return run_info(tx, successor)


def _close_pending(
    tx: LockedInstance, command: CommandRow, update: UpdateRow | None, run_id: str, now: datetime
) -> None:
    if update is None:
        reason = "run_closed_before_signal_applied"
        tx.save_command(
            replace(
                command,
                status=SIGNAL_TRANSITIONS.next_state(command.status, "run_closed", subject=run_id),
                rejection_reason=reason,
            )
        )
        append_event(tx, run_id, "SignalRejected", now, {"reason": reason}, command_id=command.id)
        return
    reason = "run_closed_before_update_applied"
    tx.save_update(
        replace(
            update,
            status=UPDATE_TRANSITIONS.next_state(update.status, "run_closed", subject=run_id),
            failure=reason,
            completed_at=now,
        )
    )
    append_event(
        tx,
        run_id,
        "UpdateFailed",
        now,
        {"status": "failed", "failure": reason, "reason": reason},
        command_id=command.id,
        update_id=update.id,
    )


def apply_signal(tx: LockedInstance, command_id: str, now: datetime) -> Admission:
    """Record that a received signal was delivered to the current run; again, a retry."""
    namespace, workflow_id = tx.instance.namespace, tx.instance.workflow_id
    command = tx.get_command(command_id)
    if command is None or command.command_type != "signal" or command.outcome in REFUSALS:
        raise UnknownCommandError(
            f"workflow {workflow_id!r} has no admitted signal {command_id!r}", command_id=command_id
        )
    key = literal_key(command.context)
    verified = command.intent_digest is not None
    if command.status == "applied":
        return answer(Decision.RETAINED, namespace, workflow_id, command, None, key, intent_verified=verified)
    current = tx.current_run()
    if (
        current is None
        or current.status != RunStatus.OPEN
        or all(c.id != command_id for c, _ in pending(tx, current))
    ):
        raise RunStateError(
            f"signal {command_id} is {command.status} and not pending in an open run",
            reason=f"signal_{command.status}",
            run_id=command.run_id,
        )
    applied = replace(
        command, status=SIGNAL_TRANSITIONS.next_state(command.status, "apply", subject=current.id)
    )
    tx.save_command(applied)
    append_event(
        tx,
        current.id,
        "SignalApplied",
        now,
        {"command_sequence": command.command_sequence},
        command_id=command.id,
    )
    return answer(Decision.FRESH, namespace, workflow_id, applied, None, key, intent_verified=verified)


def finish_update(
    tx: LockedInstance,
    update_id: str,
    status: str,
    result: bytes | None,
    failure: str | None,
    now: datetime,
) -> Admission:
    """Complete or fail an accepted update; the same completion again is a retry, another is refused."""
    namespace, workflow_id = tx.instance.namespace, tx.instance.workflow_id
    update = tx.get_update(update_id)
    if update is None:
        raise UnknownUpdateError(f"workflow {workflow_id!r} has no update {update_id!r}", update_id=update_id)
    row = command_of(tx, update.command_id)
    key = literal_key(row.context)
    verified = row.intent_digest is not None
    if update.status != "accepted":
        if update.status == status and update.result == result and update.failure == failure:
            # Applying the same completion twice is a retry, not a second effect.
            return answer(
                Decision.RETAINED, namespace, workflow_id, row, update, key, intent_verified=verified
            )
        raise RunStateError(
            f"update {update_id} is already {update.status}",
            reason=f"update_already_{update.status}",
            run_id=update.run_id,
        )
    finished = replace(update, status=status, result=result, failure=failure, completed_at=now)
    tx.save_update(finished)
    payload: dict[str, object] = {"status": status}
    if result is not None:
        payload["result"] = result
    if failure is not None:
        payload["failure"] = failure
    # A pending update belongs to the open run (closing a run fails
    # the ones it does not hand on), which may be a successor of the
    # run it was admitted in: the event goes to the run it finished in.
    current = tx.current_run()
    append_event(
        tx,
        current.id if current is not None else update.run_id,
        "UpdateCompleted" if status == "completed" else "UpdateFailed",
        now,
        payload,
        command_id=row.id,
        update_id=update.id,
    )
    return answer(Decision.FRESH, namespace, workflow_id, row, finished, key, intent_verified=verified)


def _fail(
    tx: LockedInstance, row: CommandRow, update: UpdateRow, event: str, failure: str, now: datetime
) -> UpdateRow:
    """Fail a pending update by ``event`` (a row of ``UPDATE_TRANSITIONS``), with its ``UpdateFailed``."""
    failed = replace(
        update,
        status=UPDATE_TRANSITIONS.next_state(UpdateStatus(update.status), event, subject=update.run_id),
        failure=failure,
        completed_at=now,
    )
    tx.save_update(failed)
    current = tx.current_run()
    payload: dict[str, object] = {"status": "failed", "failure": failure}
    if event == "expire":
        payload["reason"] = failure
    append_event(
        tx,
        current.id if current is not None else update.run_id,
        "UpdateFailed",
        now,
        payload,
        command_id=row.id,
        update_id=update.id,
    )
    return failed


def _release_key(tx: LockedInstance, row: CommandRow, update: UpdateRow, reason: str, now: datetime) -> None:
    """Free a failed update's command key: the command keeps its row, its event log and its
    digest, but no longer answers the key, so the next admission with it is fresh
    (``docs/lifecycle.md``, "Releasing a key").  The key's token stays in the event."""
    if row.request_id is None:
        return  # unkeyed, or released already: nothing holds a key
    tx.save_command(replace(row, request_id=None, context=None))
    current = tx.current_run()
    append_event(
        tx,
        current.id if current is not None else update.run_id,
        "UpdateKeyReleased",
        now,
        {"request_id": row.request_id, "reason": reason},
        command_id=row.id,
        update_id=update.id,
    )


def _held_update(tx: LockedInstance, update_id: str) -> tuple[CommandRow, UpdateRow]:
    update = tx.get_update(update_id)
    if update is None:
        raise UnknownUpdateError(
            f"workflow {tx.instance.workflow_id!r} has no update {update_id!r}", update_id=update_id
        )
    return command_of(tx, update.command_id), update


def release_update(tx: LockedInstance, update_id: str, failure: str | None, now: datetime) -> Admission:
    """Release the command key of a failed update, failing it first with ``failure`` if it is
    still accepted; a completed update keeps its key (its result is the answer to every retry)."""
    row, update = _held_update(tx, update_id)
    if update.status == UpdateStatus.COMPLETED or (
        update.status == UpdateStatus.ACCEPTED and failure is None
    ):
        raise RunStateError(
            f"update {update_id} is {update.status}: only a failed update's key is released",
            reason=f"update_{update.status}",
            run_id=update.run_id,
            state=update.status,
        )
    key = literal_key(row.context)
    if update.status == UpdateStatus.ACCEPTED:
        assert failure is not None
        update = _fail(tx, row, update, "fail", failure, now)
    _release_key(tx, row, update, "released", now)
    return _released(tx, row, update, key)


def take_over_update(
    tx: LockedInstance, update_id: str, expiry: timedelta, now: datetime
) -> Admission | None:
    """Fail an update still ``accepted`` after ``expiry`` (``in_progress_expired``) and release its
    key, in the caller's one locked transaction; ``None``, writing nothing, if it may not be taken
    over (:func:`~admission.receipts.may_take_over`) or is no longer accepted."""
    row, update = _held_update(tx, update_id)
    if update.status != UpdateStatus.ACCEPTED or not may_take_over(now, update.accepted_at, expiry):
        return None
    key = literal_key(row.context)
    failed = _fail(tx, row, update, "expire", IN_PROGRESS_EXPIRED, now)
    _release_key(tx, row, failed, IN_PROGRESS_EXPIRED, now)
    return _released(tx, row, failed, key)


def _released(tx: LockedInstance, row: CommandRow, update: UpdateRow, key: str | None) -> Admission:
    """The answer for an update whose key was just released: its command as it now stands, keyless."""
    instance = tx.instance
    return answer(
        Decision.FRESH,
        instance.namespace,
        instance.workflow_id,
        replace(row, request_id=None, context=None),
        update,
        key,
        intent_verified=row.intent_digest is not None,
    )
