"""The admission rules as pure decisions, and the typed answer (contract §4, §6).

Every rule that decides what a keyed command gets lives here, in two tables:

1. **What a key's receipts say** (``judge_receipts``), decided under the
   admission lock from the rows that answer the key:

   ===========================================  ================================
   rows answering the key                       answer
   ===========================================  ================================
   none                                         no receipt: go on to the target
   more than one                                ambiguous (``two-rows``)
   legacy row found by raw value, and the key   ambiguous (``modern-raw``)
   is itself shaped like a token
   legacy row found by token whose stored       ambiguous (``legacy-token``)
   literal key does not prove this key
   modern row, same intent digest               retained, verified
   modern row, other digest                     conflict on the parts that differ
   legacy row, same name and target             retained, unverified
   legacy row, other name or target             conflict on those parts
   ===========================================  ================================

   A modern row is one with an intent digest.  A legacy receipt never
   authorises a fresh command and never fabricates equality: its arguments
   are not compared, because nothing proves what they were (contract §6).

2. **Where a fresh command goes** (``judge_target``), also under the lock:

   ==============================================  ===========================
   instance and run                                answer
   ==============================================  ===========================
   run scope, selected run is not the current run  409 ``rejected_not_current``
   no current run, or it is not open               409 ``run_not_active``
   otherwise                                       fresh: received / accepted
   ==============================================  ===========================

3. **What happens to runs and commands over their lifetime** (contract §5):
   ``RUN_TRANSITIONS``, ``SIGNAL_TRANSITIONS`` and ``UPDATE_TRANSITIONS``
   below, one row per (state, event) -> state.  A pending command (a signal
   ``received``, an update ``accepted``) is *handed off* when its run
   continues as new and it was sent to the instance; any other pending
   command of a closing run is closed with it.  Receipts never change: a
   retry still gets the original answer, whatever the command became.
   ``docs/lifecycle.md`` draws these tables (``lifecycle_diagram``).

The HTTP status of a retained receipt is its own state's (``http_status``).

Pure: no I/O, no clock, no SQLAlchemy.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Final, Literal

from admission._table import StateTable
from admission.errors import RunStateError
from admission.intent._encoding import Value
from admission.intent._keys import TOKEN_PATTERN

__all__ = [
    "CLOSE_EVENTS",
    "IN_PROGRESS_EXPIRED",
    "RUN_TRANSITIONS",
    "SIGNAL_TRANSITIONS",
    "UPDATE_TRANSITIONS",
    "Admission",
    "CommandType",
    "Decision",
    "Intent",
    "ReceiptJudgement",
    "RunStatus",
    "SignalStatus",
    "StoredReceipt",
    "TargetJudgement",
    "UpdateStatus",
    "closing_event",
    "http_status",
    "json_value",
    "judge_receipts",
    "judge_target",
    "lifecycle_diagram",
    "may_take_over",
    "select_receipt",
]

CommandType = Literal["signal", "update"]
"""The two kinds of command a caller sends."""


class RunStatus(enum.StrEnum):
    """A run's status; the values are the stored strings."""

    OPEN = "open"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    TERMINATED = "terminated"
    CONTINUED = "continued"


class SignalStatus(enum.StrEnum):
    """A signal's lifecycle status (``rejected`` also marks a keyed refusal's row)."""

    RECEIVED = "received"
    APPLIED = "applied"
    REJECTED = "rejected"


class UpdateStatus(enum.StrEnum):
    """An update's status."""

    ACCEPTED = "accepted"
    COMPLETED = "completed"
    FAILED = "failed"


def _refuse(run_id: str, state: str, event: str) -> RunStateError:
    return RunStateError(
        f"{event} does not apply to {state}",
        reason="transition_not_allowed",
        run_id=run_id or None,
        state=state,
    )


_OPEN = RunStatus.OPEN

RUN_TRANSITIONS: Final = StateTable[RunStatus](
    {
        (_OPEN, "complete"): RunStatus.COMPLETED,
        (_OPEN, "fail"): RunStatus.FAILED,
        (_OPEN, "cancel"): RunStatus.CANCELLED,
        (_OPEN, "terminate"): RunStatus.TERMINATED,
        (_OPEN, "continue_as_new"): RunStatus.CONTINUED,
    },
    refuse=_refuse,
)
"""A run: (status, event) -> status.  Closed runs never change again."""

SIGNAL_TRANSITIONS: Final = StateTable[SignalStatus](
    {
        (SignalStatus.RECEIVED, "apply"): SignalStatus.APPLIED,
        (SignalStatus.RECEIVED, "run_closed"): SignalStatus.REJECTED,
        (SignalStatus.RECEIVED, "handed_off"): SignalStatus.RECEIVED,
    },
    refuse=_refuse,
)
"""A signal's lifecycle status: (status, event) -> status.  ``run_closed``
rejects it (``run_closed_before_signal_applied``); ``handed_off`` keeps it
pending in the successor run."""

UPDATE_TRANSITIONS: Final = StateTable[UpdateStatus](
    {
        (UpdateStatus.ACCEPTED, "complete"): UpdateStatus.COMPLETED,
        (UpdateStatus.ACCEPTED, "fail"): UpdateStatus.FAILED,
        (UpdateStatus.ACCEPTED, "run_closed"): UpdateStatus.FAILED,
        (UpdateStatus.ACCEPTED, "handed_off"): UpdateStatus.ACCEPTED,
        (UpdateStatus.ACCEPTED, "expire"): UpdateStatus.FAILED,
    },
    refuse=_refuse,
)
"""An update's status: (status, event) -> status.  ``run_closed`` fails it
(``run_closed_before_update_applied``); ``expire`` fails one a later retry took
over after its in-progress expiry (``in_progress_expired``, :func:`may_take_over`)."""

IN_PROGRESS_EXPIRED: Final = "in_progress_expired"
"""The failure recorded on an update taken over after its in-progress expiry."""


def may_take_over(now: datetime, accepted_at: datetime, expiry: timedelta | None) -> bool:
    """Whether a retry at ``now`` may take over an update ``accepted`` at ``accepted_at``.

    Only when an expiry is given and the update is strictly older than it: with
    no expiry an in-progress update is never taken over, however old (a live
    handler must never be reclaimed because no deadline was set).  A clock that
    reads before ``accepted_at`` never makes an update look expired.
    """
    return expiry is not None and now - accepted_at > expiry


CLOSE_EVENTS: Final[dict[str, str]] = {
    RunStatus.COMPLETED: "complete",
    RunStatus.FAILED: "fail",
    RunStatus.CANCELLED: "cancel",
    RunStatus.TERMINATED: "terminate",
    RunStatus.CONTINUED: "continue_as_new",
}
"""The event that closes a run with each closed status."""


def closing_event(scope: str, continue_as_new: bool) -> str:
    """What a pending command of a closing run undergoes: handed off or closed with it."""
    return "handed_off" if continue_as_new and scope == "instance" else "run_closed"


def lifecycle_diagram() -> str:
    """The three lifecycle tables as Mermaid state diagrams (``docs/lifecycle.md``)."""
    tables: tuple[
        tuple[str, StateTable[RunStatus] | StateTable[SignalStatus] | StateTable[UpdateStatus], str], ...
    ]
    tables = (
        ("Run", RUN_TRANSITIONS, RunStatus.OPEN),
        ("Signal", SIGNAL_TRANSITIONS, SignalStatus.RECEIVED),
        ("Update", UPDATE_TRANSITIONS, UpdateStatus.ACCEPTED),
    )
    parts = []
    for title, table, start in tables:
        lines = [f"### {title}", "", "```mermaid", *table.mermaid([start]), "```", ""]  # type: ignore[list-item]
        parts.append("\n".join(lines))
    return "\n".join(parts)


# The state of a stored command (and of its update) -> HTTP status (contract §4, §5).
_STATUS_BY_OUTCOME: Final[dict[str, int]] = {
    "received": 202,
    "accepted": 202,
    "completed": 200,
    "failed": 422,
    "rejected_not_current": 409,
    "run_not_active": 409,
    "request_id_conflict": 409,
    "request_id_ambiguous": 409,
}


def http_status(outcome: str) -> int:
    """The HTTP status that goes with an outcome (contract §4 table)."""
    return _STATUS_BY_OUTCOME[outcome]


class Decision(enum.StrEnum):
    """How admission answered: the four outcomes of contract §4."""

    FRESH = "fresh"
    """A new command was recorded (or, unkeyed or keyed, a new refusal)."""
    RETAINED = "retained"
    """The key's original receipt is returned; nothing was written."""
    CONFLICT = "request_id_conflict"
    """The key is taken by a different intent; nothing was written."""
    AMBIGUOUS = "request_id_ambiguous"
    """The key cannot be proven to name one receipt; nothing was written."""


@dataclass(frozen=True)
class Intent:
    """What a command asks, with its digests (contract §3)."""

    command_type: CommandType
    name: str
    target: str | None
    digest: str
    arguments_digest: str


@dataclass(frozen=True)
class StoredReceipt:
    """One stored command row that answers a key, as the rules need to see it.

    ``request_id`` is the stored column (a token for rows written by this
    version, a token or the raw key for legacy rows); ``literal_key`` the key
    kept in the command's context, if any; ``intent_digest`` is ``None`` for a
    legacy row.
    """

    command_id: str
    request_id: str
    literal_key: str | None
    name: str
    target: str | None
    intent_digest: str | None
    arguments_digest: str | None


@dataclass(frozen=True)
class ReceiptJudgement:
    """The verdict on a key's receipts.  ``receipt`` is the one selected, if any."""

    decision: Decision | None
    receipt: StoredReceipt | None = None
    intent_verified: bool = True
    conflict: tuple[str, ...] = ()
    ambiguity: str | None = None


def select_receipt(
    rows: Sequence[StoredReceipt], key: str, token: str
) -> tuple[StoredReceipt | None, str | None]:
    """Pick the one receipt a key names, or say which ambiguity shape prevents it (contract §6).

    Returns ``(receipt, None)``, ``(None, None)`` when no row answers the key,
    or ``(None, shape)`` with ``shape`` one of ``two-rows``, ``modern-raw``,
    ``legacy-token``.
    """
    # A modern row is only ever stored under its token and answers the key
    # only if it was made by this key; one found by raw value belongs to
    # another key whose token happens to equal this literal.
    answering = [
        row
        for row in rows
        if row.intent_digest is None or (row.request_id == token and row.literal_key == key)
    ]
    if not answering:
        return None, None
    if len(answering) > 1:
        return None, "two-rows"
    row = answering[0]
    if row.intent_digest is None:
        # A legacy row must first be proven to have been made by this key.
        if row.request_id != token:
            if TOKEN_PATTERN.match(key):
                return None, "modern-raw"
        elif row.literal_key != key:
            return None, "legacy-token"
    return row, None


def judge_receipts(rows: Sequence[StoredReceipt], key: str, token: str, intent: Intent) -> ReceiptJudgement:
    """Apply table 1 to the rows found by token or by raw key (contract §4, §6)."""
    row, ambiguity = select_receipt(rows, key, token)
    if ambiguity is not None:
        return ReceiptJudgement(Decision.AMBIGUOUS, ambiguity=ambiguity)
    if row is None:
        return ReceiptJudgement(decision=None)
    if row.intent_digest is not None:
        if row.intent_digest == intent.digest:
            return ReceiptJudgement(Decision.RETAINED, row)
        return ReceiptJudgement(
            Decision.CONFLICT, row, conflict=_differing(row, intent, compare_arguments=True)
        )
    parts = _differing(row, intent, compare_arguments=False)
    if parts:
        return ReceiptJudgement(Decision.CONFLICT, row, intent_verified=False, conflict=parts)
    return ReceiptJudgement(Decision.RETAINED, row, intent_verified=False)


def _differing(row: StoredReceipt, intent: Intent, *, compare_arguments: bool) -> tuple[str, ...]:
    parts = []
    if row.name != intent.name:
        parts.append("name")
    if compare_arguments and row.arguments_digest != intent.arguments_digest:
        parts.append("arguments")
    if row.target != intent.target:
        parts.append("target")
    if compare_arguments and not parts:
        # Same name, arguments and target but another digest: the record
        # differs in a part the receipt does not keep separately.  The type
        # cannot (the lookup is per type), so report the arguments rather
        # than hide the difference.
        parts.append("arguments")
    return tuple(parts)


@dataclass(frozen=True)
class TargetJudgement:
    """Where a fresh command goes: ``outcome`` is received/accepted or a refusal."""

    outcome: str
    run_id: str | None
    reason: str | None = None
    requested_run_id: str | None = None
    resolved_run_id: str | None = None


def judge_target(
    command_type: CommandType,
    current_run_id: str | None,
    current_run_status: str | None,
    requested_run_id: str | None,
) -> TargetJudgement:
    """Apply table 2: decide, inside the lock, the run a fresh command goes to."""
    if requested_run_id is not None and requested_run_id != current_run_id:
        return TargetJudgement(
            "rejected_not_current",
            run_id=None,
            reason="selected_run_not_current",
            requested_run_id=requested_run_id,
            resolved_run_id=current_run_id,
        )
    if current_run_id is None or current_run_status != RunStatus.OPEN:
        return TargetJudgement(
            "run_not_active",
            run_id=current_run_id,
            reason="run_not_active",
            requested_run_id=requested_run_id,
            resolved_run_id=current_run_id,
        )
    return TargetJudgement(
        "received" if command_type == "signal" else "accepted",
        run_id=current_run_id,
        requested_run_id=requested_run_id,
        resolved_run_id=current_run_id,
    )


@dataclass(frozen=True)
class Admission:
    """The answer to one admission: a typed value with a stable JSON form.

    ``decision`` says how the key was answered (fresh, retained, conflict,
    ambiguous); ``outcome`` is the state the caller sees (``received``,
    ``accepted``, ``completed``, ``failed``, ``rejected_not_current``,
    ``run_not_active``, ``request_id_conflict``, ``request_id_ambiguous``) and
    ``http_status`` its status.  A retained answer carries the original ids and
    times, never new ones.
    """

    decision: Decision
    outcome: str
    namespace: str
    workflow_id: str
    command_type: CommandType
    request_id: str | None
    retained: bool
    intent_verified: bool
    command_id: str | None = None
    run_id: str | None = None
    command_sequence: int | None = None
    received_at: datetime | None = None
    target_scope: Literal["instance", "run"] = "instance"
    signal_status: str | None = None
    update_id: str | None = None
    update_status: str | None = None
    result: Value = None
    failure: str | None = None
    reason: str | None = None
    requested_run_id: str | None = None
    resolved_run_id: str | None = None
    conflict: tuple[str, ...] = ()
    retained_command_id: str | None = None
    retained_command_type: CommandType | None = None
    retained_outcome: str | None = None
    ambiguity: str | None = None

    @property
    def http_status(self) -> int:
        """The HTTP status of this answer (contract §4)."""
        return http_status(self.outcome)

    @property
    def accepted(self) -> bool:
        """True when the command is (or was) recorded and not refused."""
        return self.outcome in ("received", "accepted", "completed", "failed")

    def to_dict(self) -> dict[str, object]:
        """The stable JSON form: the contract §4 fields, and only those that apply."""
        body: dict[str, object] = {
            "outcome": self.outcome,
            "http_status": self.http_status,
            "namespace": self.namespace,
            "workflow_id": self.workflow_id,
            "command_type": self.command_type,
            "request_id": self.request_id,
            "retained": self.retained,
            "intent_verified": self.intent_verified,
            "target_scope": self.target_scope,
        }
        if self.decision in (Decision.CONFLICT, Decision.AMBIGUOUS):
            body["reason"] = self.outcome
            body["retryable"] = False
            if self.decision is Decision.CONFLICT:
                body["retained_command_id"] = self.retained_command_id
                body["retained_command_type"] = self.retained_command_type
                body["retained_outcome"] = self.retained_outcome
                body["conflict"] = list(self.conflict)
            else:
                body["ambiguity"] = self.ambiguity
            return body
        body["command_id"] = self.command_id
        body["run_id"] = self.run_id
        body["command_sequence"] = self.command_sequence
        body["received_at"] = self.received_at.isoformat() if self.received_at else None
        if self.reason is not None:
            body["reason"] = self.reason
        if self.outcome in ("rejected_not_current", "run_not_active"):
            body["requested_run_id"] = self.requested_run_id
            body["resolved_run_id"] = self.resolved_run_id
        if self.signal_status is not None:
            body["signal_status"] = self.signal_status
        if self.command_type == "update" and self.accepted:
            body["update_id"] = self.update_id
            body["update_status"] = self.update_status
            if self.update_status == "completed":
                body["result"] = json_value(self.result)
            if self.update_status == "failed":
                body["failure"] = self.failure
        return body


def json_value(value: Value) -> object:
    """A typed value in a form strict JSON can carry: bytes as ``{"$bytes": hex}``,
    NaN and infinities as ``{"$float": "nan"}`` (and ``inf``, ``-inf``)."""
    if isinstance(value, bytes):
        return {"$bytes": value.hex()}
    if isinstance(value, float) and value - value != 0.0:
        return {"$float": repr(value)}
    if isinstance(value, (list, tuple)):
        return [json_value(v) for v in value]
    if isinstance(value, dict):
        return {k: json_value(v) for k, v in value.items()}
    return value
