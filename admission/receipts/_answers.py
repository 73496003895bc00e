"""How the admission service answers, built from stored rows: pure.

A receipt is answered from the rows it is stored in, whether the answer is
fresh (just written) or retained (read again); the same functions build both,
so a retry gets exactly the original answer (contract §4).  Also the values
the service reports for runs, history and pruning.

Pure: no I/O, no clock, no SQLAlchemy.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Final

from admission.errors import AdmissionError
from admission.intent._encoding import Value, canonical_decode, canonical_encode
from admission.receipts._rules import (
    Admission,
    CommandType,
    Decision,
    Intent,
    ReceiptJudgement,
    StoredReceipt,
    json_value,
    judge_receipts,
)
from admission.receipts._store import CommandRow, LockedInstance, PruneCounts, RunRow, UpdateRow

__all__ = [
    "REFUSALS",
    "HistoryEvent",
    "PruneReport",
    "RunInfo",
    "admission_payload",
    "ambiguous",
    "answer",
    "answer_judgement",
    "answerable_from_copy",
    "command_payload",
    "context_of",
    "is_final",
    "judge_locked",
    "literal_key",
    "plainly_retained",
    "row_outcome",
    "run_info",
    "stored_receipt",
    "update_result",
]

REFUSALS: Final = ("run_not_active", "rejected_not_current")
"""The outcomes of a command refused by run state; keyed refusals are receipts too (contract §4)."""


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


@dataclass(frozen=True)
class PruneReport:
    """What :meth:`AdmissionService.prune` did (or, in a dry run, would do)."""

    before: datetime
    retention_days: int
    dry_run: bool
    chains: int
    done: int
    counts: PruneCounts
    as_of: datetime | None = None
    """The time pruning took as now: the caller's, or the capped one (``clock_capped``)."""
    clock_capped: bool = False
    """Whether ``now`` ran too far ahead of the store's newest recorded time and was capped."""

    def to_dict(self) -> dict[str, object]:
        """The JSON form."""
        return {
            "before": self.before.isoformat(),
            "as_of": None if self.as_of is None else self.as_of.isoformat(),
            "clock_capped": self.clock_capped,
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


def context_of(key: str | None) -> bytes | None:
    """The context a command stores for its literal key: ``{"request": {"request_id": key}}``."""
    return None if key is None else canonical_encode({"request": {"request_id": key}})


def literal_key(context: bytes | None) -> str | None:
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


def stored_receipt(row: CommandRow, key: str) -> StoredReceipt:
    """A stored command as the receipt rules see it (``judge_receipts``)."""
    # The context this version writes for ``key`` is canonical, so equal bytes
    # prove the literal without decoding; anything else is decoded.
    literal = key if row.context is not None and row.context == context_of(key) else literal_key(row.context)
    return StoredReceipt(
        command_id=row.id,
        request_id=row.request_id or "",
        literal_key=literal,
        name=row.name,
        target=row.requested_run_id if row.target_scope == "run" else None,
        intent_digest=row.intent_digest,
        arguments_digest=row.arguments_digest,
    )


def ambiguous(
    namespace: str, workflow_id: str, command_type: CommandType, key: str, shape: str | None
) -> Admission:
    """The ``request_id_ambiguous`` answer: the key has been used, but no receipt
    can be proven to be its; nothing is selected and nothing is written (contract §6)."""
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


def update_result(update: UpdateRow) -> Value:
    """A completed update's result, decoded."""
    # A completed update keeps its result, possibly null; legacy rows may hold
    # NULL for a completed-null result.
    return None if update.result is None else canonical_decode(update.result)


def run_info(tx: LockedInstance, run: RunRow) -> RunInfo:
    """A run as the service reports it."""
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


def answer_judgement(
    namespace: str,
    workflow_id: str,
    judgement: ReceiptJudgement,
    rows: Sequence[CommandRow],
    update_of: Callable[[str], UpdateRow | None],
    key: str,
    command_type: CommandType,
) -> Admission:
    """The answer a judgement of a key's receipts gives: ambiguous, a conflict, or the receipt retained."""
    if judgement.decision is Decision.AMBIGUOUS:
        return ambiguous(namespace, workflow_id, command_type, key, judgement.ambiguity)
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
            retained_outcome=row_outcome(row, update),
        )
    return answer(
        Decision.RETAINED,
        namespace,
        workflow_id,
        row,
        update,
        key,
        intent_verified=judgement.intent_verified,
    )


def plainly_retained(
    namespace: str,
    workflow_id: str,
    found: Sequence[tuple[CommandRow, UpdateRow | None]],
    key: str,
    token: str,
    digest: str,
) -> Admission | None:
    """The retained answer when ``found`` is the common case of a retry, else ``None``.

    The common case: one row, stored by this version under ``token`` with the
    context of ``key`` and the intent ``digest`` asked again.  For it,
    :func:`~admission.receipts._rules.judge_receipts` over :func:`stored_receipt`
    decides ``RETAINED`` with the intent verified, and :func:`answer_judgement`
    answers with this row and its update: the same answer, without building the
    judgement (``tests/unit/test_answers.py`` compares them).  Anything else
    (``None``) goes through the full judgement.
    """
    if len(found) != 1:
        return None
    row, update = found[0]
    if row.intent_digest != digest or row.request_id != token or row.context != context_of(key):
        return None
    if row.command_type != "update":
        update = None
    return answer(Decision.RETAINED, namespace, workflow_id, row, update, key, intent_verified=True)


def is_final(row: CommandRow, update: UpdateRow | None) -> bool:
    """Whether a stored receipt answers every later retry exactly as it answers now, until pruned.

    A refusal never changes (contract §4: a keyed refusal is retained as it is);
    a signal once ``applied`` or ``rejected`` (closed with its run) has no
    transition left (``SIGNAL_TRANSITIONS``); an update once ``completed``
    keeps its result and its key for good.  Not final: a signal still
    ``received`` (it is applied, or rejected when its run closes, and its
    answer says which), an update still ``accepted``, and a ``failed`` update,
    whose key can still be released (``release_update``), after which the key
    admits a new command (``docs/lifecycle.md``).
    """
    if row.outcome in REFUSALS:
        return True
    if row.command_type == "signal":
        return row.status in ("applied", "rejected")
    return update is not None and update.status == "completed"


def answerable_from_copy(found: Sequence[tuple[CommandRow, UpdateRow | None, bool]]) -> bool:
    """Whether the rows a key finds on a copy of the store (a read replica, behind by some lag)
    give the answer the primary gives: each ``(command, update, run_open)``.

    Every row must be final (:func:`is_final`) and belong to a run that is open in the copy.
    Rows can only change on the primary in three ways: a pending command moves on (not final),
    a failed update's key is released (not final), or retention prunes them, which needs their
    chain of runs closed and ``retention_days`` passed since (contract §5): a run still open
    in the copy was open at the copy's moment, so only pruning with a retention shorter than
    the copy's lag can have removed it since (``docs/replicas.md``).  No row (no receipt yet,
    or one admitted after the copy's moment), a pending row, or a row of a closed run sends
    the key to the primary, and with it any ambiguity the copy cannot settle.
    """
    return bool(found) and all(run_open and is_final(row, update) for row, update, run_open in found)


def row_outcome(row: CommandRow, update: UpdateRow | None) -> str:
    """The state a stored command answers with: its refusal, its update's status, or its own outcome."""
    if row.outcome in REFUSALS:
        return row.outcome
    if update is not None:
        return update.status
    return row.outcome


def answer(
    decision: Decision,
    namespace: str,
    workflow_id: str,
    row: CommandRow,
    update: UpdateRow | None,
    key: str | None,
    *,
    intent_verified: bool,
) -> Admission:
    """The admission answer a stored command (and its update) gives, fresh or retained."""
    rejected = row.outcome in REFUSALS
    is_signal = row.command_type == "signal"
    # Every field of Admission is set, in a dict: skipping the frozen
    # dataclass's __init__ (one object.__setattr__ per field, 26 of them)
    # matters on the retry path, which answers from here.
    values = {
        "decision": decision,
        "outcome": row_outcome(row, update),
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
        "result": update_result(update) if update is not None and update.status == "completed" else None,
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
    built = object.__new__(Admission)
    built.__dict__.update(values)
    return built


def command_payload(row: CommandRow, key: str | None) -> dict[str, object]:
    """The payload of the event that records a command's admission."""
    return admission_payload(
        row.command_type,
        row.name,
        row.command_sequence,
        row.outcome,
        row.target_scope,
        key,
        row.intent_digest,
        row.requested_run_id,
        row.rejection_reason,
    )


def admission_payload(
    command_type: str,
    name: str,
    command_sequence: int,
    outcome: str,
    target_scope: str,
    key: str | None,
    intent_digest: str | None,
    requested_run_id: str | None,
    reason: str | None,
) -> dict[str, object]:
    """:func:`command_payload` from the command's columns: what a store that keeps the payload
    compact rebuilds it from (``admission/sql/_compact.py``)."""
    payload: dict[str, object] = {
        "command_type": command_type,
        "name": name,
        "command_sequence": command_sequence,
        "outcome": outcome,
        "target_scope": target_scope,
        "request_id": key,
        "intent_digest": intent_digest,
    }
    if requested_run_id is not None:
        payload["requested_run_id"] = requested_run_id
    if reason is not None:
        payload["reason"] = reason
    return payload


def judge_locked(
    tx: LockedInstance, rows: Sequence[CommandRow], intent: Intent, key: str, token: str
) -> Admission | None:
    """The answer the rows stored under a key give, read under the instance's lock (``None``: no
    receipt answers the key, and the command is decided afresh)."""
    judgement = judge_receipts([stored_receipt(r, key) for r in rows], key, token, intent)
    if judgement.decision is None:
        return None
    return answer_judgement(
        tx.instance.namespace,
        tx.instance.workflow_id,
        judgement,
        rows,
        tx.update_for_command,
        key,
        intent.command_type,
    )
