"""The admission service: validate, digest, lock, decide, write (contract §4, §5).

Every method validates its input before it opens a transaction (bad input
raises a typed error and writes nothing), then does all of its reading and
deciding for one workflow instance under the admission lock, so concurrent
first-time requests with one key admit exactly one command.  The decisions
are the pure tables of :mod:`admission.receipts._rules`; this module only gathers
their inputs and writes their results.

Time and identifiers are parameters (``clock``, ``new_id``), so tests and
engines control them.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Final

from admission.errors import (
    AdmissionError,
    InvalidValueError,
    RunStateError,
    UnknownCommandError,
    UnknownUpdateError,
)
from admission.intent._encoding import (
    DEFAULT_MAX_SIZE,
    INTENT_VERSION,
    Value,
    canonical_decode,
    canonical_encode,
    encode_intent,
)
from admission.intent._keys import receipt_token, validate_request_id
from admission.receipts._rules import (
    CLOSE_EVENTS,
    RUN_TRANSITIONS,
    SIGNAL_TRANSITIONS,
    UPDATE_TRANSITIONS,
    Admission,
    CommandType,
    Decision,
    Intent,
    ReceiptJudgement,
    StoredReceipt,
    closing_event,
    json_value,
    judge_receipts,
    judge_target,
    select_receipt,
)
from admission.receipts._store import (
    CommandRow,
    EventRow,
    LockedInstance,
    PruneCounts,
    PruneTarget,
    RunRow,
    Store,
    UpdateRow,
)

__all__ = ["DEFAULT_RETENTION_DAYS", "AdmissionService", "HistoryEvent", "PruneReport", "RunInfo", "utc_now"]

DEFAULT_RETENTION_DAYS: Final = 30
"""Receipts live as long as their run's history: 30 days after closure by default (contract §5)."""
REFUSALS: Final = ("run_not_active", "rejected_not_current")
CLOSED_STATUSES: Final = ("completed", "failed", "cancelled", "terminated", "continued")
MAX_IDENTIFIER_LENGTH: Final = 255
MAX_FAILURE_LENGTH: Final = 2048


def utc_now() -> datetime:
    """The default clock: the current time, timezone-aware UTC."""
    return datetime.now(UTC)


def _new_id() -> str:
    return str(uuid.uuid4())


@dataclass(frozen=True)
class RunInfo:
    """A run as the service reports it."""

    namespace: str
    workflow_id: str
    run_id: str
    run_number: int
    status: str
    started_at: datetime
    closed_at: datetime | None
    continued_from_run_id: str | None

    def to_dict(self) -> dict[str, object]:
        """The JSON form."""
        return {
            "namespace": self.namespace,
            "workflow_id": self.workflow_id,
            "run_id": self.run_id,
            "run_number": self.run_number,
            "status": self.status,
            "started_at": self.started_at.isoformat(),
            "closed_at": self.closed_at.isoformat() if self.closed_at else None,
            "continued_from_run_id": self.continued_from_run_id,
        }


class _DryRun(Exception):
    """Raised inside a dry-run pruning transaction so that it rolls back."""

    def __init__(self, counts: PruneCounts) -> None:
        super().__init__("dry run")
        self.counts = counts


@dataclass(frozen=True)
class PruneReport:
    """What :meth:`AdmissionService.prune` did (or, in a dry run, would do)."""

    before: datetime
    retention_days: int
    dry_run: bool
    chains: int
    done: int
    counts: PruneCounts

    def to_dict(self) -> dict[str, object]:
        """The JSON form."""
        return {
            "before": self.before.isoformat(),
            "retention_days": self.retention_days,
            "dry_run": self.dry_run,
            "targets": self.chains,
            "done": self.done,
            "runs": self.counts.runs,
            "commands": self.counts.commands,
            "updates": self.counts.updates,
            "events": self.counts.events,
        }


@dataclass(frozen=True)
class HistoryEvent:
    """One event of an instance's history, decoded."""

    position: int
    event_type: str
    run_id: str | None
    command_id: str | None
    update_id: str | None
    recorded_at: datetime
    payload: Value

    def to_dict(self) -> dict[str, object]:
        """The JSON form."""
        return {
            "position": self.position,
            "event_type": self.event_type,
            "run_id": self.run_id,
            "command_id": self.command_id,
            "update_id": self.update_id,
            "recorded_at": self.recorded_at.isoformat(),
            "payload": json_value(self.payload),
        }


def _identifier(value: object, field: str) -> str:
    if type(value) is not str:
        raise InvalidValueError(f"must be str, got {type(value).__name__}", field=field, path="")
    if not value or len(value) > MAX_IDENTIFIER_LENGTH:
        raise InvalidValueError(
            f"must have 1 to {MAX_IDENTIFIER_LENGTH} characters, got {len(value)}", field=field, path=""
        )
    if "\x00" in value:
        raise InvalidValueError("must not contain NUL", field=field, path="")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidValueError("is not valid Unicode", field=field, path="") from None
    return value


def _context(key: str | None) -> bytes | None:
    return None if key is None else canonical_encode({"request": {"request_id": key}})


def _literal_key(context: bytes | None) -> str | None:
    """The literal key kept in a command's context, or ``None`` if it proves nothing."""
    if context is None:
        return None
    try:
        decoded = canonical_decode(context)
    except AdmissionError:
        return None
    request = decoded.get("request") if isinstance(decoded, dict) else None
    key = request.get("request_id") if isinstance(request, dict) else None
    return key if isinstance(key, str) else None


def _stored(row: CommandRow, key: str) -> StoredReceipt:
    # The context this version writes for ``key`` is canonical, so equal bytes
    # prove the literal without decoding; anything else is decoded.
    literal = key if row.context is not None and row.context == _context(key) else _literal_key(row.context)
    return StoredReceipt(
        command_id=row.id,
        request_id=row.request_id or "",
        literal_key=literal,
        name=row.name,
        target=row.requested_run_id if row.target_scope == "run" else None,
        intent_digest=row.intent_digest,
        arguments_digest=row.arguments_digest,
    )


def _ambiguous(
    namespace: str, workflow_id: str, command_type: CommandType, key: str, shape: str | None
) -> Admission:
    # The key has been used, but no receipt can be proven to be its: nothing is
    # selected and nothing is written (contract §6).
    return Admission(
        decision=Decision.AMBIGUOUS,
        outcome="request_id_ambiguous",
        namespace=namespace,
        workflow_id=workflow_id,
        command_type=command_type,
        request_id=key,
        retained=True,
        intent_verified=False,
        ambiguity=shape,
    )


def _result(update: UpdateRow) -> Value:
    # A completed update keeps its result, possibly null; legacy rows may hold
    # NULL for a completed-null result.
    return None if update.result is None else canonical_decode(update.result)


class AdmissionService:
    """Admits signals and updates with command keys, on any :class:`Store`.

    ``clock`` returns timezone-aware datetimes; ``new_id`` returns fresh
    identifiers for instances, runs, commands and updates; ``max_size`` bounds
    the encoded arguments and results.
    """

    def __init__(
        self,
        store: Store,
        *,
        clock: Callable[[], datetime] = utc_now,
        new_id: Callable[[], str] = _new_id,
        max_size: int = DEFAULT_MAX_SIZE,
    ) -> None:
        self.store = store
        self._clock = clock
        self._new_id = new_id
        self._max_size = max_size

    # -- runs ---------------------------------------------------------------------

    def start_run(
        self, namespace: str, workflow_id: str, *, run_id: str | None = None, connection: object | None = None
    ) -> RunInfo:
        """Start a new run of an instance, registering the instance if it is new.

        Refused with :class:`RunStateError` while the instance has an open run.
        """
        _identifier(namespace, "namespace")
        _identifier(workflow_id, "workflow_id")
        new_run_id = self._new_id() if run_id is None else _identifier(run_id, "run_id")
        now = self._clock()
        with self.store.locked(
            namespace, workflow_id, created_at=now, new_id=self._new_id(), connection=connection
        ) as tx:
            previous = tx.current_run()
            if previous is not None and previous.status == "open":
                raise RunStateError(
                    f"workflow {workflow_id!r} already has an open run {previous.id}",
                    reason="run_already_open",
                    run_id=previous.id,
                )
            run = RunRow(
                id=new_run_id,
                instance_id=tx.instance.id,
                run_number=1 if previous is None else previous.run_number + 1,
                status="open",
                continued_from_run_id=None,
                started_at=now,
                closed_at=None,
            )
            tx.insert_run(run)
            tx.set_current_run(run.id)
            self._event(tx, run.id, "RunStarted", now, {"run_number": run.run_number})
            return self._run_info(tx, run)

    def close_run(
        self,
        namespace: str,
        workflow_id: str,
        status: str,
        *,
        run_id: str | None = None,
        connection: object | None = None,
    ) -> RunInfo:
        """Close the current run as completed, failed, cancelled or terminated."""
        if status not in CLOSE_EVENTS or status == "continued":
            raise InvalidValueError(
                "must be one of completed, failed, cancelled, terminated", field="status", path=""
            )
        return self._close(namespace, workflow_id, status, run_id, connection, continue_as_new=False)

    def continue_as_new(
        self,
        namespace: str,
        workflow_id: str,
        *,
        run_id: str | None = None,
        new_run_id: str | None = None,
        connection: object | None = None,
    ) -> RunInfo:
        """Close the current run as ``continued`` and open its successor; returns the new run."""
        return self._close(
            namespace,
            workflow_id,
            "continued",
            run_id,
            connection,
            continue_as_new=True,
            new_run_id=new_run_id,
        )

    def _close(
        self,
        namespace: str,
        workflow_id: str,
        status: str,
        run_id: str | None,
        connection: object | None,
        *,
        continue_as_new: bool,
        new_run_id: str | None = None,
    ) -> RunInfo:
        _identifier(namespace, "namespace")
        _identifier(workflow_id, "workflow_id")
        if run_id is not None:
            _identifier(run_id, "run_id")
        successor_id = self._new_id() if new_run_id is None else _identifier(new_run_id, "new_run_id")
        now = self._clock()
        with self.store.locked(
            namespace, workflow_id, created_at=now, new_id=self._new_id(), connection=connection
        ) as tx:
            current = tx.current_run()
            if current is None or current.status != "open" or (run_id is not None and run_id != current.id):
                raise RunStateError(
                    f"workflow {workflow_id!r} has no open run"
                    + (f" {run_id}" if run_id is not None else ""),
                    reason="run_not_active",
                    run_id=run_id,
                )
            pending = self._pending(tx, current)
            successor: RunRow | None = None
            if continue_as_new:
                successor = RunRow(
                    id=successor_id,
                    instance_id=tx.instance.id,
                    run_number=current.run_number + 1,
                    status="open",
                    continued_from_run_id=current.id,
                    started_at=now,
                    closed_at=None,
                )
            # Pending commands that cannot follow a successor close with their
            # run, before it closes; their receipts stay as they were (§5).
            for command, update in pending:
                if closing_event(command.target_scope, continue_as_new) == "run_closed":
                    self._close_pending(tx, command, update, current.id, now)
            closing = CLOSE_EVENTS[status]
            closed = replace(
                current,
                status=RUN_TRANSITIONS.next_state(current.status, closing, subject=current.id),
                closed_at=now,
            )
            tx.save_run(closed)
            # str(): the status is a RunStatus, and the canonical encoding takes exact types only.
            self._event(tx, closed.id, "RunClosed", now, {"status": str(closed.status)})
            if successor is None:
                return self._run_info(tx, closed)
            tx.insert_run(successor)
            tx.set_current_run(successor.id)
            self._event(
                tx,
                successor.id,
                "RunStarted",
                now,
                {"run_number": successor.run_number, "continued_from_run_id": current.id},
            )
            # Instance-scope commands not yet applied move to the successor, in
            # their original order, keeping their ids, arguments and times.
            for command, update in pending:
                if closing_event(command.target_scope, continue_as_new) == "handed_off":
                    self._event(
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
            return self._run_info(tx, successor)

    def _close_pending(
        self, tx: LockedInstance, command: CommandRow, update: UpdateRow | None, run_id: str, now: datetime
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
            self._event(tx, run_id, "SignalRejected", now, {"reason": reason}, command_id=command.id)
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
        self._event(
            tx,
            run_id,
            "UpdateFailed",
            now,
            {"status": "failed", "failure": reason, "reason": reason},
            command_id=command.id,
            update_id=update.id,
        )

    @staticmethod
    def _pending(tx: LockedInstance, current: RunRow) -> list[tuple[CommandRow, UpdateRow | None]]:
        """Commands the current run still has to apply: its own, and instance-scope
        ones handed down from the runs it continues (contract §5)."""
        chain = [current.id]
        run = current
        while run.continued_from_run_id is not None:
            previous = tx.run(run.continued_from_run_id)
            if previous is None:
                break
            chain.append(previous.id)
            run = previous
        return [
            (command, update)
            for command, update in tx.pending_commands(chain)
            if command.run_id == current.id or command.target_scope == "instance"
        ]

    def apply_signal(
        self, namespace: str, workflow_id: str, command_id: str, *, connection: object | None = None
    ) -> Admission:
        """Record that the engine delivered a received signal to its (current) run.

        Applying it again is a retry and changes nothing; a signal that is not
        pending in the current open run (rejected at closure, unknown) is
        refused with :class:`RunStateError` or :class:`UnknownCommandError`.
        """
        _identifier(namespace, "namespace")
        _identifier(workflow_id, "workflow_id")
        _identifier(command_id, "command_id")
        now = self._clock()
        with self.store.locked(
            namespace, workflow_id, created_at=now, new_id=self._new_id(), connection=connection
        ) as tx:
            command = tx.get_command(command_id)
            if command is None or command.command_type != "signal" or command.outcome in REFUSALS:
                raise UnknownCommandError(
                    f"workflow {workflow_id!r} has no admitted signal {command_id!r}", command_id=command_id
                )
            key = _literal_key(command.context)
            verified = command.intent_digest is not None
            if command.status == "applied":
                return self._answer(
                    Decision.RETAINED, namespace, workflow_id, command, None, key, intent_verified=verified
                )
            current = tx.current_run()
            if (
                current is None
                or current.status != "open"
                or all(c.id != command_id for c, _ in self._pending(tx, current))
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
            self._event(
                tx,
                current.id,
                "SignalApplied",
                now,
                {"command_sequence": command.command_sequence},
                command_id=command.id,
            )
            return self._answer(
                Decision.FRESH, namespace, workflow_id, applied, None, key, intent_verified=verified
            )

    def _run_info(self, tx: LockedInstance, run: RunRow) -> RunInfo:
        return RunInfo(
            tx.instance.namespace,
            tx.instance.workflow_id,
            run.id,
            run.run_number,
            run.status,
            run.started_at,
            run.closed_at,
            run.continued_from_run_id,
        )

    # -- admission ----------------------------------------------------------------

    def admit_signal(
        self,
        namespace: str,
        workflow_id: str,
        name: str,
        arguments: object,
        *,
        request_id: str | None = None,
        run_id: str | None = None,
        connection: object | None = None,
    ) -> Admission:
        """Admit a signal to the instance (or, with ``run_id``, to that run).

        Returns fresh (202 received), retained, ``request_id_conflict``,
        ``request_id_ambiguous``, ``run_not_active`` or ``rejected_not_current``.
        """
        return self._admit("signal", namespace, workflow_id, name, arguments, request_id, run_id, connection)

    def admit_update(
        self,
        namespace: str,
        workflow_id: str,
        name: str,
        arguments: object,
        *,
        request_id: str | None = None,
        run_id: str | None = None,
        connection: object | None = None,
    ) -> Admission:
        """Admit an update: fresh is 202 accepted; a retry after completion returns 200 completed."""
        return self._admit("update", namespace, workflow_id, name, arguments, request_id, run_id, connection)

    def _admit(
        self,
        command_type: CommandType,
        namespace: str,
        workflow_id: str,
        name: str,
        arguments: object,
        request_id: str | None,
        run_id: str | None,
        connection: object | None,
    ) -> Admission:
        # Everything is validated before the transaction: bad input writes nothing.
        _identifier(namespace, "namespace")
        _identifier(workflow_id, "workflow_id")
        key = None if request_id is None else validate_request_id(request_id, command_type)
        target = None if run_id is None else _identifier(run_id, "run_id")
        encoded = encode_intent(command_type, name, arguments, target, max_size=self._max_size)
        intent = Intent(command_type, name, target, encoded.digest, encoded.arguments_digest)
        token = None if key is None else receipt_token(command_type, key)
        if key is not None and token is not None and connection is None:
            answer = self._judge_committed(namespace, workflow_id, intent, key, token)
            if answer is not None:
                return answer
        now = self._clock()
        with self.store.locked(
            namespace, workflow_id, created_at=now, new_id=self._new_id(), connection=connection
        ) as tx:
            # After the read above, the only receipt that can have been committed
            # for this key since is a token row made by another admission, and the
            # insert below finds that one on the unique index and answers with it:
            # reading the key again under the lock would find nothing more
            # (docs/guide.md, section 4).  Inside a caller's
            # transaction there was no read before, so the lock reads.
            if key is not None and token is not None and connection is not None:
                answer = self._judge_key(tx, intent, key, token)
                if answer is not None:
                    return answer
            instance = tx.instance
            current = tx.current_run()
            placed = judge_target(
                command_type, instance.current_run_id, current.status if current else None, target
            )
            refused = placed.reason is not None
            row = CommandRow(
                id=self._new_id(),
                instance_id=instance.id,
                run_id=placed.run_id if not refused else placed.resolved_run_id,
                command_sequence=tx.next_command_sequence(),
                command_type=command_type,
                name=name,
                target_scope="instance" if target is None else "run",
                requested_run_id=target,
                request_id=token,
                context=_context(key),
                arguments=encoded.arguments,
                status="rejected" if refused else placed.outcome,
                outcome=placed.outcome,
                rejection_reason=placed.reason,
                created_at=now,
                intent_digest=intent.digest,
                arguments_digest=intent.arguments_digest,
                intent_encoding=INTENT_VERSION,
            )
            if not tx.insert_command(row):
                # The unique index (contract §4): another caller committed this
                # key after the unlocked read above (or wrote it outside the
                # lock).  The answer is the receipt now stored, never an error.
                assert key is not None and token is not None
                answer = self._judge_key(tx, intent, key, token)
                if answer is None:
                    raise AdmissionError("receipt index reported a duplicate that cannot be read back")
                return answer
            update: UpdateRow | None = None
            if command_type == "update" and not refused:
                assert placed.run_id is not None
                update = UpdateRow(
                    self._new_id(),
                    row.id,
                    instance.id,
                    placed.run_id,
                    name,
                    "accepted",
                    None,
                    None,
                    now,
                    None,
                )
                tx.insert_update(update)
            event_type = (
                "CommandRejected"
                if refused
                else ("SignalReceived" if command_type == "signal" else "UpdateAccepted")
            )
            self._event(
                tx,
                row.run_id,
                event_type,
                now,
                self._command_payload(row, key),
                command_id=row.id,
                update_id=update.id if update else None,
            )
            return self._answer(
                Decision.FRESH, namespace, workflow_id, row, update, key, intent_verified=True
            )

    def _judge_key(self, tx: LockedInstance, intent: Intent, key: str, token: str) -> Admission | None:
        rows = tx.find_commands(intent.command_type, [token, key])
        judgement = judge_receipts([_stored(r, key) for r in rows], key, token, intent)
        if judgement.decision is None:
            return None
        return self._answer_judgement(
            tx.instance.namespace,
            tx.instance.workflow_id,
            judgement,
            rows,
            tx.update_for_command,
            key,
            intent.command_type,
        )

    def _judge_committed(
        self, namespace: str, workflow_id: str, intent: Intent, key: str, token: str
    ) -> Admission | None:
        """Answer a retry from committed receipts, without the lock, when a receipt exists.

        Receipts are immutable (an update's status only advances, by its own
        committed transaction), so a committed receipt gives the answer the
        lock would give; with none, the caller takes the lock and decides.
        """
        found = self.store.read_receipts(namespace, workflow_id, intent.command_type, [token, key])
        if not found:
            return None
        rows = [row for row, _ in found]
        judgement = judge_receipts([_stored(r, key) for r in rows], key, token, intent)
        if judgement.decision is None:
            return None
        updates = {row.id: update for row, update in found}
        return self._answer_judgement(
            namespace, workflow_id, judgement, rows, updates.get, key, intent.command_type
        )

    def _answer_judgement(
        self,
        namespace: str,
        workflow_id: str,
        judgement: ReceiptJudgement,
        rows: Sequence[CommandRow],
        update_of: Callable[[str], UpdateRow | None],
        key: str,
        command_type: CommandType,
    ) -> Admission:
        if judgement.decision is Decision.AMBIGUOUS:
            return _ambiguous(namespace, workflow_id, command_type, key, judgement.ambiguity)
        assert judgement.receipt is not None and judgement.decision is not None
        row = next(r for r in rows if r.id == judgement.receipt.command_id)
        update = update_of(row.id) if row.command_type == "update" else None
        if judgement.decision is Decision.CONFLICT:
            return Admission(
                decision=Decision.CONFLICT,
                outcome="request_id_conflict",
                namespace=namespace,
                workflow_id=workflow_id,
                command_type=command_type,
                request_id=key,
                retained=False,
                intent_verified=judgement.intent_verified,
                conflict=judgement.conflict,
                retained_command_id=row.id,
                retained_command_type=command_type,
                retained_outcome=self._row_outcome(row, update),
            )
        return self._answer(
            Decision.RETAINED,
            namespace,
            workflow_id,
            row,
            update,
            key,
            intent_verified=judgement.intent_verified,
        )

    @staticmethod
    def _row_outcome(row: CommandRow, update: UpdateRow | None) -> str:
        if row.outcome in REFUSALS:
            return row.outcome
        if update is not None:
            return update.status
        return row.outcome

    def _answer(
        self,
        decision: Decision,
        namespace: str,
        workflow_id: str,
        row: CommandRow,
        update: UpdateRow | None,
        key: str | None,
        *,
        intent_verified: bool,
    ) -> Admission:
        rejected = row.outcome in REFUSALS
        is_signal = row.command_type == "signal"
        # Every field of Admission is set, in a dict: skipping the frozen
        # dataclass's __init__ (one object.__setattr__ per field, 26 of them)
        # matters on the retry path, which answers from here.
        values = {
            "decision": decision,
            "outcome": self._row_outcome(row, update),
            "namespace": namespace,
            "workflow_id": workflow_id,
            "command_type": "signal" if is_signal else "update",
            "request_id": key,
            "retained": decision is Decision.RETAINED,
            "intent_verified": intent_verified,
            "command_id": row.id,
            "run_id": row.run_id,
            "command_sequence": row.command_sequence,
            "received_at": row.created_at,
            "target_scope": "run" if row.target_scope == "run" else "instance",
            "signal_status": row.status if is_signal and not rejected else None,
            "update_id": update.id if update else None,
            "update_status": update.status if update else None,
            "result": _result(update) if update is not None and update.status == "completed" else None,
            "failure": update.failure if update else None,
            "reason": row.rejection_reason,
            "requested_run_id": row.requested_run_id if rejected else None,
            "resolved_run_id": row.run_id if rejected else None,
            "conflict": (),
            "retained_command_id": None,
            "retained_command_type": None,
            "retained_outcome": None,
            "ambiguity": None,
        }
        answer = object.__new__(Admission)
        answer.__dict__.update(values)
        return answer

    # -- update lifecycle -------------------------------------------------------------

    def complete_update(
        self,
        namespace: str,
        workflow_id: str,
        update_id: str,
        result: object = None,
        *,
        connection: object | None = None,
    ) -> Admission:
        """Complete an accepted update with its result (which may be ``None``).

        Completing an update twice with the same result returns the completed
        receipt again; a different result, or completing a failed update, is
        refused with :class:`RunStateError`.
        """
        encoded = canonical_encode(result, max_size=self._max_size)
        return self._finish(namespace, workflow_id, update_id, "completed", encoded, None, connection)

    def fail_update(
        self,
        namespace: str,
        workflow_id: str,
        update_id: str,
        failure: str,
        *,
        connection: object | None = None,
    ) -> Admission:
        """Fail an accepted update with a message (422 ``failed``)."""
        if type(failure) is not str or not failure or len(failure) > MAX_FAILURE_LENGTH:
            raise InvalidValueError(
                f"must be a str of 1 to {MAX_FAILURE_LENGTH} characters", field="failure", path=""
            )
        return self._finish(namespace, workflow_id, update_id, "failed", None, failure, connection)

    def _finish(
        self,
        namespace: str,
        workflow_id: str,
        update_id: str,
        status: str,
        result: bytes | None,
        failure: str | None,
        connection: object | None,
    ) -> Admission:
        _identifier(namespace, "namespace")
        _identifier(workflow_id, "workflow_id")
        _identifier(update_id, "update_id")
        now = self._clock()
        with self.store.locked(
            namespace, workflow_id, created_at=now, new_id=self._new_id(), connection=connection
        ) as tx:
            update = tx.get_update(update_id)
            if update is None:
                raise UnknownUpdateError(
                    f"workflow {workflow_id!r} has no update {update_id!r}", update_id=update_id
                )
            row = self._command(tx, update.command_id)
            key = _literal_key(row.context)
            if update.status != "accepted":
                if update.status == status and update.result == result and update.failure == failure:
                    # Applying the same completion twice is a retry, not a second effect.
                    return self._answer(
                        Decision.RETAINED,
                        namespace,
                        workflow_id,
                        row,
                        update,
                        key,
                        intent_verified=row.intent_digest is not None,
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
            self._event(
                tx,
                current.id if current is not None else update.run_id,
                "UpdateCompleted" if status == "completed" else "UpdateFailed",
                now,
                payload,
                command_id=row.id,
                update_id=update.id,
            )
            return self._answer(
                Decision.FRESH,
                namespace,
                workflow_id,
                row,
                finished,
                key,
                intent_verified=row.intent_digest is not None,
            )

    @staticmethod
    def _command(tx: LockedInstance, command_id: str) -> CommandRow:
        row = tx.get_command(command_id)
        if row is None:  # pragma: no cover - the foreign key guarantees it
            raise AdmissionError(f"command {command_id} is missing")
        return row

    # -- retention ----------------------------------------------------------------------

    def prune(
        self,
        retention_days: int = DEFAULT_RETENTION_DAYS,
        *,
        now: datetime | None = None,
        batch_size: int = 100,
        dry_run: bool = False,
        progress: Callable[[PruneReport], None] | None = None,
    ) -> PruneReport:
        """Remove the history and receipts of runs closed more than ``retention_days`` ago.

        A chain of runs linked by continue-as-new goes as a whole, once its
        last run closed before the cutoff (a command handed to a successor
        lives with it); refusals recorded while an instance had no run go
        once they are older than the cutoff.  Each chain is pruned in its own
        transaction under its instance's lock and recorded as a
        ``RunsPruned`` event; afterwards its keys are free (contract §5).
        ``progress`` is called after every ``batch_size`` chains.  With
        ``dry_run`` every deletion is made and rolled back, so the counts are
        exact and nothing changes.
        """
        if type(retention_days) is not int or retention_days < 0:
            raise InvalidValueError("must be an int >= 0", field="retention_days", path="")
        if type(batch_size) is not int or not 1 <= batch_size <= 100_000:
            raise InvalidValueError("must be an int from 1 to 100000", field="batch_size", path="")
        now = self._clock() if now is None else now
        before = now - timedelta(days=retention_days)
        targets = self.store.prune_targets(before)
        report = PruneReport(before, retention_days, dry_run, len(targets), 0, PruneCounts())
        for start in range(0, len(targets), batch_size):
            for target in targets[start : start + batch_size]:
                report = replace(
                    report,
                    done=report.done + 1,
                    counts=report.counts + self._prune(target, before, now, dry_run),
                )
            if progress is not None:
                progress(report)
        return report

    def _prune(self, target: PruneTarget, before: datetime, now: datetime, dry_run: bool) -> PruneCounts:
        try:
            with self.store.locked(
                target.namespace, target.workflow_id, created_at=now, new_id=self._new_id()
            ) as tx:
                chain = self._expired_chain(tx, target.run_id, before)
                if target.run_id is not None and not chain:
                    return PruneCounts()  # pruned meanwhile, or no longer expired
                counts = tx.delete_runs(chain) if chain else tx.delete_runless_refusals(before)
                if counts != PruneCounts():
                    self._event(
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

    @staticmethod
    def _expired_chain(tx: LockedInstance, end: str | None, before: datetime) -> list[str]:
        # Decided again under the lock: the reading that found the target took none.
        run = None if end is None else tx.run(end)
        if (
            run is None
            or run.status in ("open", "continued")
            or run.closed_at is None
            or run.closed_at >= before
        ):
            return []
        chain = [run.id]
        while (
            run.continued_from_run_id is not None and (run := tx.run(run.continued_from_run_id)) is not None
        ):
            chain.append(run.id)
        return chain

    # -- reading ------------------------------------------------------------------------

    def receipt(
        self, namespace: str, workflow_id: str, command_type: CommandType, request_id: str
    ) -> Admission | None:
        """Read the receipt a key names, without admitting anything.

        Returns ``None`` if the key has no receipt, the retained receipt
        (``intent_verified`` says whether it carries a digest), or a
        ``request_id_ambiguous`` answer (contract §6).
        """
        _identifier(namespace, "namespace")
        _identifier(workflow_id, "workflow_id")
        key = validate_request_id(request_id, command_type)
        token = receipt_token(command_type, key)
        found = self.store.read_receipts(namespace, workflow_id, command_type, [token, key])
        selected, ambiguity = select_receipt([_stored(row, key) for row, _ in found], key, token)
        if ambiguity is not None:
            return _ambiguous(namespace, workflow_id, command_type, key, ambiguity)
        if selected is None:
            return None
        row, update = next((r, u) for r, u in found if r.id == selected.command_id)
        return self._answer(
            Decision.RETAINED,
            namespace,
            workflow_id,
            row,
            update,
            key,
            intent_verified=row.intent_digest is not None,
        )

    def history(self, namespace: str, workflow_id: str) -> list[HistoryEvent]:
        """The event log of one instance, oldest first."""
        _identifier(namespace, "namespace")
        _identifier(workflow_id, "workflow_id")
        instance = self.store.find_instance(namespace, workflow_id)
        if instance is None:
            return []
        return [
            HistoryEvent(
                e.position,
                e.event_type,
                e.run_id,
                e.command_id,
                e.update_id,
                e.recorded_at,
                canonical_decode(e.payload),
            )
            for e in self.store.read_history(instance.id)
        ]

    # -- events -------------------------------------------------------------------------

    @staticmethod
    def _command_payload(row: CommandRow, key: str | None) -> dict[str, object]:
        payload: dict[str, object] = {
            "command_type": row.command_type,
            "name": row.name,
            "command_sequence": row.command_sequence,
            "outcome": row.outcome,
            "target_scope": row.target_scope,
            "request_id": key,
            "intent_digest": row.intent_digest,
        }
        if row.requested_run_id is not None:
            payload["requested_run_id"] = row.requested_run_id
        if row.rejection_reason is not None:
            payload["reason"] = row.rejection_reason
        return payload

    def _event(
        self,
        tx: LockedInstance,
        run_id: str | None,
        event_type: str,
        now: datetime,
        payload: dict[str, object],
        *,
        command_id: str | None = None,
        update_id: str | None = None,
    ) -> EventRow:
        instance = tx.instance
        return tx.append_event(
            EventRow(
                instance.namespace,
                instance.id,
                run_id,
                event_type,
                command_id,
                update_id,
                canonical_encode(payload),
                now,
            )
        )
