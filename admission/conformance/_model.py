"""The reference model of the retry contract (§2 to §5): every answer predicted from the contract's words.

The model never calls admission's own decision tables: it keeps, per instance,
the runs, the commands with their receipts and the event log, and says what a
conforming target must answer, in the wire form (``Admission.to_dict()``,
``RunInfo.to_dict()``, ``HistoryEvent.to_dict()``).  Where the contract is
silent it follows ``docs/lifecycle.md`` (closure, handoff, retention).

Argument identity is the canonical encoding (contract §3): two arguments are
the same intent exactly when ``canonical_encode`` gives the same bytes.

Pure: no clock, no I/O; times are the machine's, passed in.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Final

from admission.errors import AdmissionError
from admission.intent._encoding import canonical_decode, canonical_encode
from admission.receipts._rules import json_value

__all__ = [
    "HTTP",
    "PRUNED_EVENT",
    "REFUSALS",
    "SIGNAL_CLOSED",
    "UPDATE_CLOSED",
    "Command",
    "Event",
    "Instance",
    "PrunePlan",
    "Run",
    "conflict_parts",
    "event_view",
    "expected_conflict",
    "expected_receipt",
    "expected_run",
    "model_key",
    "placement",
    "wire_differences",
]

HTTP: Final[Mapping[str, int]] = {
    "received": 202,
    "accepted": 202,
    "completed": 200,
    "failed": 422,
    "rejected_not_current": 409,
    "run_not_active": 409,
    "request_id_conflict": 409,
}
"""Contract §4/§5: the HTTP status of each outcome a caller can see."""
REFUSALS: Final = ("rejected_not_current", "run_not_active")
"""The outcomes of a fresh command the target refused (recorded, and retained under a key)."""
SIGNAL_CLOSED: Final = "run_closed_before_signal_applied"
"""Why a signal still pending when its run closed is rejected (docs/lifecycle.md)."""
UPDATE_CLOSED: Final = "run_closed_before_update_applied"
"""Why an update still accepted when its run closed fails (docs/lifecycle.md)."""
PRUNED_EVENT: Final = "RunsPruned"
"""The event each pruning leaves in an instance's log, outside any run."""
TIME_FIELDS: Final = frozenset({"received_at", "started_at", "closed_at"})


def model_key(key: str | None, strips_keys: bool) -> str | None:
    """The key the target must act on: the HTTP-input normalisation (contract §2.1) when the
    target applies it (surrounding whitespace stripped, blank = no key), else the key as sent."""
    if key is None or not strips_keys:
        return key
    return key.strip() or None


@dataclass
class Run:
    """One run of an instance as the model knows it."""

    id: str
    number: int
    status: str
    """``open``, or how it closed (``completed`` ... ``continued``)."""
    continued_from: str | None
    started_at: datetime | None = None
    """Known from the machine's clock, or learned from the target's first answer."""
    closed_at: datetime | None = None


@dataclass
class Command:
    """One admitted command (a signal or an update), refused or not, and its receipt's state."""

    id: str
    type: str
    key: str | None
    name: str
    raw_arguments: object
    arguments: bytes
    """The canonical encoding: the identity of the arguments (contract §3)."""
    target: str | None
    """``None``: instance scope; else the run the caller selected."""
    run_id: str | None
    """The run it was admitted in (for a refusal: the instance's current run then, if any)."""
    sequence: int
    received_at: datetime | None
    outcome: str
    """``received``, ``accepted``, ``rejected_not_current`` or ``run_not_active``."""
    status: str
    """A signal: received/applied/rejected; an update: accepted/completed/failed; ``refused``."""
    owner: str | None
    """The run it waits in while pending (its successor's after a handoff)."""
    update_id: str | None = None
    result: bytes | None = None
    failure: str | None = None
    reason: str | None = None

    @property
    def refused(self) -> bool:
        """Whether the fresh admission was refused (§4: it is recorded, and retained under a key)."""
        return self.outcome in REFUSALS

    @property
    def pending(self) -> bool:
        """Whether the engine has still to apply, complete or fail it."""
        return not self.refused and self.status in ("received", "accepted")

    @property
    def answer_outcome(self) -> str:
        """What the receipt answers: a refusal stays one; an update shows its state."""
        if self.refused:
            return self.outcome
        return self.status if self.type == "update" else "received"


Event = tuple[str, str | None, str | None, object]
"""What the model predicts of a history event: its type, run, command, and the detail the docs fix."""


@dataclass
class Instance:
    """One workflow instance of one namespace: runs, commands, receipts and event log."""

    namespace: str
    workflow_id: str
    runs: dict[str, Run] = field(default_factory=dict)
    current: str | None = None
    commands: dict[str, Command] = field(default_factory=dict)
    receipts: dict[tuple[str, str], str] = field(default_factory=dict)
    """(command type, key) -> the command id the key's receipt names."""
    events: list[Event] = field(default_factory=list)
    pruned: list[Command] = field(default_factory=list)
    all_run_ids: list[str] = field(default_factory=list)
    max_sequence: int = 0

    @property
    def label(self) -> str:
        """``namespace/workflow_id``, for messages."""
        return f"{self.namespace}/{self.workflow_id}"

    def current_run(self) -> Run | None:
        """The instance's current run (open or closed), if it has one."""
        return None if self.current is None else self.runs[self.current]

    def open_run(self) -> Run | None:
        """The current run if it is open."""
        run = self.current_run()
        return run if run is not None and run.status == "open" else None

    def chain(self, end: Run) -> list[Run]:
        """``end`` and the runs it continues, newest first."""
        chain = [end]
        while chain[-1].continued_from is not None and chain[-1].continued_from in self.runs:
            chain.append(self.runs[chain[-1].continued_from])
        return chain

    def receipt_of(self, command_type: str, key: str | None) -> Command | None:
        """The command a key's receipt names, if the key has one."""
        found = None if key is None else self.receipts.get((command_type, key))
        return None if found is None else self.commands[found]

    def record(self, cmd: Command) -> None:
        """Keep a fresh command: its receipt (§4: a keyed refusal is retained too) and its event."""
        self.commands[cmd.id] = cmd
        self.max_sequence = max(self.max_sequence, cmd.sequence)
        if cmd.key is not None:
            self.receipts[(cmd.type, cmd.key)] = cmd.id
        event = (
            "CommandRejected"
            if cmd.refused
            else ("SignalReceived" if cmd.type == "signal" else "UpdateAccepted")
        )
        self.events.append((event, cmd.run_id, cmd.id, None))


# -- admission ----------------------------------------------------------------------------------


def conflict_parts(cmd: Command, name: str, encoded: bytes, target: str | None) -> tuple[str, ...]:
    """Contract §4: the parts of an intent that differ from the retained command's, in order."""
    return tuple(
        part
        for part, same in (
            ("name", cmd.name == name),
            ("arguments", cmd.arguments == encoded),
            ("target", cmd.target == target),
        )
        if not same
    )


def placement(inst: Instance, command_type: str, target: str | None) -> tuple[str, str | None]:
    """Contract §4: where a fresh command goes: (outcome, reason).  A selected run that is not
    the current one refuses it; with no open run it is refused as ``run_not_active``."""
    if target is not None and target != inst.current:
        return "rejected_not_current", "selected_run_not_current"
    if inst.open_run() is None:
        return "run_not_active", "run_not_active"
    return ("received" if command_type == "signal" else "accepted"), None


def wire_result(encoded: bytes | None) -> object:
    """A result in its wire form (``json_value`` of the decoded value)."""
    return json_value(None if encoded is None else canonical_decode(encoded))


def expected_receipt(inst: Instance, cmd: Command, retained: bool) -> dict[str, object]:
    """The receipt of ``cmd`` as contract §4/§5 and docs/lifecycle.md describe it, in the
    wire form; times are datetimes (``None``: not known yet)."""
    signal = cmd.type == "signal"
    outcome = cmd.answer_outcome
    body: dict[str, object] = {
        "outcome": outcome,
        "http_status": HTTP[outcome],
        "namespace": inst.namespace,
        "workflow_id": inst.workflow_id,
        "command_type": cmd.type,
        "request_id": cmd.key,
        "retained": retained,
        "intent_verified": True,
        "command_id": cmd.id,
        "run_id": cmd.run_id,
        "command_sequence": cmd.sequence,
        "target_scope": "instance" if cmd.target is None else "run",
        "signal_status": cmd.status if signal and not cmd.refused else None,
        "update_id": cmd.update_id,
        "update_status": cmd.status if not signal and not cmd.refused else None,
        "result": wire_result(cmd.result) if cmd.status == "completed" else None,
        "failure": cmd.failure,
        "reason": cmd.reason,
        "requested_run_id": cmd.target if cmd.refused else None,
        "resolved_run_id": cmd.run_id if cmd.refused else None,
    }
    if cmd.received_at is not None:
        body["received_at"] = cmd.received_at
    return body


def expected_conflict(
    inst: Instance, command_type: str, key: str, cmd: Command, parts: tuple[str, ...]
) -> dict[str, object]:
    """Contract §4: another intent under a kept key: 409 naming the parts that differ; nothing
    written, the key still names its command."""
    return {
        "outcome": "request_id_conflict",
        "http_status": 409,
        "reason": "request_id_conflict",
        "namespace": inst.namespace,
        "workflow_id": inst.workflow_id,
        "command_type": command_type,
        "request_id": key,
        "retained": False,
        "intent_verified": True,
        "command_id": None,
        "conflict": list(parts),
        "retained_command_id": cmd.id,
        "retained_command_type": cmd.type,
        "retained_outcome": cmd.answer_outcome,
    }


def expected_run(inst: Instance, run: Run, full: bool) -> dict[str, object]:
    """A run's ``RunInfo.to_dict()`` fields the model fixes (``full``: also its number, start
    and predecessor, which a start and a continue-as-new answer with)."""
    body: dict[str, object] = {
        "namespace": inst.namespace,
        "workflow_id": inst.workflow_id,
        "run_id": run.id,
        "status": run.status,
    }
    if run.status != "continued" and (run.status == "open" or run.closed_at is not None):
        body["closed_at"] = run.closed_at
    if full:
        body["run_number"] = run.number
        body["continued_from_run_id"] = run.continued_from
        if run.started_at is not None:
            body["started_at"] = run.started_at
    return body


def _plain(value: object) -> object:
    """``value`` with its str and int subclasses (enums) as the wire carries them."""
    if isinstance(value, str):
        return str(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return int(value)
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    return value


def _typed(value: object) -> object:
    """A value's identity on the wire: its canonical encoding where it has one."""
    if isinstance(value, float) and math.isnan(value):
        return ("nan",)
    try:
        return canonical_encode(_plain(value))
    except (AdmissionError, TypeError, ValueError, RecursionError):
        return ("unencodable", repr(value))


def parse_time(value: object) -> datetime | None:
    """An ISO time of a wire body (``None`` when absent or not a time)."""
    if isinstance(value, datetime):
        return value
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        return None


def wire_differences(
    body: Mapping[str, object], expected: Mapping[str, object]
) -> dict[str, tuple[object, object]]:
    """The fields of ``body`` that differ from ``expected``: field -> (actual, expected).

    Values are compared by type and value (``1`` is not ``1.0``, ``True`` is not ``1``);
    times as instants; an absent field equals ``None``."""
    wrong: dict[str, tuple[object, object]] = {}
    for name, want in expected.items():
        got = body.get(name)
        if name in TIME_FIELDS and want is not None:
            assert isinstance(want, datetime)
            parsed = parse_time(got)
            if parsed is None or parsed.utcoffset() is None or parsed != want:
                wrong[name] = (got, want.isoformat())
        elif _typed(got) != _typed(want):
            wrong[name] = (got, want)
    return wrong


# -- history ------------------------------------------------------------------------------------


def event_view(event: Mapping[str, object]) -> Event:
    """What the model predicts of one ``HistoryEvent.to_dict()`` body."""
    payload = event.get("payload")
    details = payload if isinstance(payload, Mapping) else {}
    kind = event.get("event_type")
    detail: object = None
    if kind == "RunClosed":
        detail = details.get("status")
    elif kind == "CommandHandedOff":
        detail = (details.get("from_run_id"), details.get("to_run_id"), details.get("command_sequence"))
    elif kind == "SignalRejected":
        detail = details.get("reason")
    elif kind == "UpdateFailed":
        detail = details.get("failure")
    run_id, command_id = event.get("run_id"), event.get("command_id")
    return (
        str(kind),
        run_id if isinstance(run_id, str) else None,
        command_id if isinstance(command_id, str) else None,
        detail,
    )


# -- closure and continue-as-new --------------------------------------------------------------


def close_pending(inst: Instance, run: Run, continue_as_new: bool) -> list[Command]:
    """Close what ``run`` has not applied (docs/lifecycle.md): a signal is rejected, an update
    fails; on continue-as-new the instance-scope ones are returned, to be handed on."""
    handed = []
    for cmd in sorted(inst.commands.values(), key=lambda c: c.sequence):
        if not (cmd.pending and cmd.owner == run.id):
            continue
        if continue_as_new and cmd.target is None:
            handed.append(cmd)
        elif cmd.type == "signal":
            cmd.status, cmd.reason, cmd.owner = "rejected", SIGNAL_CLOSED, None
            inst.events.append(("SignalRejected", run.id, cmd.id, SIGNAL_CLOSED))
        else:
            cmd.status, cmd.failure, cmd.owner = "failed", UPDATE_CLOSED, None
            inst.events.append(("UpdateFailed", run.id, cmd.id, UPDATE_CLOSED))
    return handed


def close(inst: Instance, run: Run, status: str, now: datetime | None) -> None:
    """Close ``run`` as ``status`` (not continue-as-new)."""
    close_pending(inst, run, continue_as_new=False)
    run.status, run.closed_at = status, now
    inst.events.append(("RunClosed", run.id, None, status))


def continue_as_new(inst: Instance, run: Run, successor: Run, now: datetime | None) -> list[Command]:
    """Close ``run`` as ``continued``, open ``successor`` and hand the instance-scope pending
    commands on to it in their order, keeping their ids (contract §5); returns those."""
    handed = close_pending(inst, run, continue_as_new=True)
    run.status, run.closed_at = "continued", now
    inst.events.append(("RunClosed", run.id, None, "continued"))
    begin(inst, successor)
    for cmd in handed:
        cmd.owner = successor.id
        inst.events.append(("CommandHandedOff", successor.id, cmd.id, (run.id, successor.id, cmd.sequence)))
    return handed


def begin(inst: Instance, run: Run) -> None:
    """``run`` becomes the instance's current, open run."""
    inst.runs[run.id] = run
    inst.all_run_ids.append(run.id)
    inst.current = run.id
    inst.events.append(("RunStarted", run.id, None, None))


# -- retention ----------------------------------------------------------------------------------


@dataclass
class PrunePlan:
    """What one pruning removes of one instance: whole closed chains, and run-less refusals."""

    instance: Instance
    chains: list[list[Run]]
    runless: list[Command]


def chain_latest(inst: Instance, end: Run) -> datetime:
    """The latest time recorded on a closed chain's rows: its close, or a refusal recorded
    with its last run (the instance's current run) after the close."""
    assert end.closed_at is not None
    ids = {r.id for r in inst.chain(end)}
    times = [c.received_at for c in inst.commands.values() if c.run_id in ids and c.received_at is not None]
    return max([end.closed_at, *times])


def _ended(run: Run) -> bool:
    return run.status not in ("open", "continued") and run.closed_at is not None


def prune_plan(instances: Iterable[Instance], cutoff: datetime) -> list[PrunePlan]:
    """Contract §5 and docs/lifecycle.md "Retention": a chain goes once its last run closed and
    the latest time recorded on its rows is before the cutoff (exactly at it: kept); an open
    chain stays.  Refusals recorded while the instance had no run go once older."""
    plan = []
    for inst in instances:
        chains = [
            inst.chain(run) for run in inst.runs.values() if _ended(run) and chain_latest(inst, run) < cutoff
        ]
        runless = [
            c
            for c in inst.commands.values()
            if c.run_id is None and c.received_at is not None and c.received_at < cutoff
        ]
        if chains or runless:
            plan.append(PrunePlan(inst, chains, runless))
    return plan


def prune_times(instances: Iterable[Instance], now: datetime, retention_days: int) -> list[datetime]:
    """Interesting values of ``now`` for a pruning: the clock, later, and each boundary and just past it."""
    times = [now, now + timedelta(days=1), now + timedelta(days=3)]
    days = timedelta(days=retention_days)
    for inst in instances:
        for run in inst.runs.values():
            if _ended(run):
                assert run.closed_at is not None
                latest = chain_latest(inst, run)
                times += [run.closed_at + days, latest + days, latest + days + timedelta(seconds=1)]
        for cmd in inst.commands.values():
            if cmd.run_id is None and cmd.received_at is not None:
                times += [cmd.received_at + days, cmd.received_at + days + timedelta(seconds=1)]
    return sorted(set(times))


def prune(plans: list[PrunePlan], dry_run: bool, seen: Callable[[str], None]) -> Counter[str]:
    """Carry out ``plans`` on the model (unless ``dry_run``); the counts the target must report."""
    counts = Counter[str]()
    for plan in plans:
        inst = plan.instance
        for chain in plan.chains:
            ids = {r.id for r in chain}
            commands = [c for c in inst.commands.values() if c.run_id in ids]
            counts["runs"] += len(ids)
            counts["commands"] += len(commands)
            counts["updates"] += sum(c.update_id is not None for c in commands)
            counts["events"] += sum(e[1] in ids for e in inst.events)
            if not dry_run:
                _forget(inst, commands, lambda e, ids=ids: e[1] in ids)  # type: ignore[misc]
                for run in chain:
                    del inst.runs[run.id]
                if inst.current in ids:
                    inst.current = None
                inst.events.append((PRUNED_EVENT, None, None, None))
            seen("pruned chain (dry run)" if dry_run else "pruned chain")
        if plan.runless:
            gone = {c.id for c in plan.runless}
            counts["commands"] += len(plan.runless)
            counts["events"] += sum(e[1] is None and e[2] in gone for e in inst.events)
            if not dry_run:
                _forget(inst, plan.runless, lambda e, gone=gone: e[1] is None and e[2] in gone)  # type: ignore[misc]
                inst.events.append((PRUNED_EVENT, None, None, None))
            seen("pruned run-less refusals (dry run)" if dry_run else "pruned run-less refusals")
    return counts


def _forget(inst: Instance, commands: list[Command], event_gone: Callable[[Event], bool]) -> None:
    for cmd in commands:
        del inst.commands[cmd.id]
        inst.pruned.append(cmd)
        if cmd.key is not None and inst.receipts.get((cmd.type, cmd.key)) == cmd.id:
            del inst.receipts[(cmd.type, cmd.key)]  # contract §5: the key is free again
    inst.events = [e for e in inst.events if not event_gone(e)]
