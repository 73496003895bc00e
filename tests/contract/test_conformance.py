"""Property-based conformance of admission and the run lifecycle (contract §2, §4, §5), on every store.

A hypothesis state machine drives random sequences of run starts, signals and
updates (fresh, keyed or not, to the instance or to the current, an older or
another instance's run), retries with the same intent and with a changed name,
arguments or target, applications, completions and failures, closures,
continue-as-new and pruning, across two namespaces and two or three workflow
ids that share one small pool of keys.  Every answer is predicted by a
reference model written from the contract's words (and ``docs/lifecycle.md``
where the contract is silent), never by calling admission's own decision
tables; after every step the event log of the instances the step addressed
(and of one more, in turn) must equal the model's, event for event.

Retention follows the "Retention" section of ``docs/lifecycle.md``: a chain
goes as a whole once its last run closed and the latest time recorded on its
rows (the close, or a refusal recorded with its last run after it) is more
than ``retention_days`` before ``now`` (exactly that long ago: kept; the
machine's clock is right, so it turns the clock cap off), refusals recorded while an instance
had no run go once older than the cutoff, and each pruning leaves one
``RunsPruned`` event, outside any run.  Where neither document decides, the
model follows what the service does and says so: run numbering after every
run of an instance was pruned is not checked.

The machine counts its steps per backend and reports them at the end of the
module (``conformance steps: memory=... sqlite=... postgresql=...`` on the
process's real stderr, so CI logs show it, and as JSON, with what each backend exercised, under
pytest's temporary directory).  ``CI`` selects the larger profile;
``CONFORMANCE_EXAMPLES`` and ``CONFORMANCE_STEPS`` override either.
"""

from __future__ import annotations

import inspect
import itertools
import json
import os
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from admission import canonical_decode, canonical_encode
from admission.errors import RunStateError, UnknownCommandError, UnknownUpdateError
from admission.receipts import (
    Admission,
    AdmissionService,
    Decision,
    HistoryEvent,
    MemoryStore,
    RunInfo,
    Store,
)
from tests.conftest import SUMMARY_LINES

# Pruning is being added in parallel: the rule joins the machine once it exists.
HAS_PRUNE = hasattr(AdmissionService, "prune")
PRUNE_PARAMETERS = set(inspect.signature(AdmissionService.prune).parameters) if HAS_PRUNE else set()

# -- the run sizes ---------------------------------------------------------------------------

IN_CI = bool(os.environ.get("CI"))
# Default: the whole file in well under a minute on all three backends.  CI: enough examples
# to meet every coverage label of the derandomised run (checked at 200), the file in about
# two minutes on two cores.
MAX_EXAMPLES = int(os.environ.get("CONFORMANCE_EXAMPLES", 200 if IN_CI else 60))
STEP_COUNT = int(os.environ.get("CONFORMANCE_STEPS", 40 if IN_CI else 30))
MIN_STEPS = MAX_EXAMPLES * 10  # a run that executes fewer steps proves too little
SETTINGS = settings(
    max_examples=MAX_EXAMPLES,
    stateful_step_count=STEP_COUNT,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# -- the vocabulary --------------------------------------------------------------------------

NAMESPACES = ("a", "b")
WORKFLOW_IDS = ("order-1", "order-2", "order-3")
# One small key pool for every namespace, instance and command type; keys are
# case-sensitive and never normalised (NFC "é" and NFD "é" are two keys).
KEYS = ("k1", "K1", "k2", "\u00e9", "e\u0301")
NAMES = ("approve", "reject")
# Arguments whose canonical encodings differ pairwise, except the two maps
# written in another order, which are one value.
ARGUMENTS: tuple[object, ...] = (
    [],
    [1],
    [1.0],
    [True],
    [0.0],
    [-0.0],
    ["1"],
    {"a": 1, "b": 2},
    {"b": 2, "a": 1},
    {"aa": None, "b": [b"\x00"]},
)
RESULTS: tuple[object, ...] = (None, 0, "ok", [1, 2], {"n": 1.5})
FAILURES = ("boom", "invalid input")
CLOSE_STATUSES = ("completed", "failed", "cancelled", "terminated")
# Instance scope half the time; run scope naming the current run, an older one, or another
# instance's run.
TARGETS = ("instance", "instance", "instance", "current", "older", "foreign")

# Contract §4/§5: the HTTP status of each state a caller can see.
HTTP = {
    "received": 202,
    "accepted": 202,
    "completed": 200,
    "failed": 422,
    "rejected_not_current": 409,
    "run_not_active": 409,
    "request_id_conflict": 409,
}
REFUSALS = ("rejected_not_current", "run_not_active")
SIGNAL_CLOSED = "run_closed_before_signal_applied"
UPDATE_CLOSED = "run_closed_before_update_applied"
PRUNED_EVENT = "RunsPruned"

# Each example works in its own namespaces, and in its own stretch of time:
# example k lives in the year that starts EPOCH - k years, so pruning in one
# example never reaches the (later) rows an earlier example left in the same
# database, and the counts a prune reports are this example's alone.
EPOCH = datetime(9000, 1, 1, tzinfo=UTC)
SPAN = timedelta(days=365)
MARGIN = timedelta(days=20)
EPOCHS = 8000

# What every run must have exercised (labels the machine records as it goes).
COVERAGE = [
    "fresh received",
    "fresh accepted",
    "fresh rejected_not_current",
    "fresh run_not_active",
    "conflict",
]
CI_COVERAGE = [
    *COVERAGE,
    "retained received",
    "retained accepted",
    "retained completed",
    "retained failed",
    "retained rejected_not_current",
    "retained run_not_active",
    "handed off",
    "apply fresh",
    "apply again",
    "apply rejected",
    "apply unknown",
    "completed fresh",
    "completed again",
    "completed refused",
    "completed unknown",
    "failed fresh",
    "failed again",
    "start refused",
    "close refused",
    "continue refused",
    *(
        ["pruned chain", "pruned chain (dry run)", "pruned run-less refusals", "fresh again after pruning"]
        if HAS_PRUNE
        else []
    ),
]

STEPS: Counter[str] = Counter()
SEEN: dict[str, Counter[str]] = {}
SECONDS: dict[str, float] = {}


# -- the reference model ---------------------------------------------------------------------


@dataclass
class Run:
    id: str
    number: int
    status: str  # open, or how it closed
    continued_from: str | None
    closed_at: datetime | None = None


@dataclass
class Command:
    id: str
    type: str  # signal / update
    key: str | None
    name: str
    raw_arguments: object
    arguments: bytes  # canonical encoding: the identity of the arguments
    target: str | None  # None: instance scope; else the selected run
    run_id: str | None  # the run it was admitted in (a refusal: the current run then, if any)
    sequence: int
    received_at: datetime
    outcome: str  # received / accepted / rejected_not_current / run_not_active
    status: str  # signal: received/applied/rejected; update: accepted/completed/failed; "refused"
    owner: str | None  # the run it waits in while pending (its successor after a handoff)
    update_id: str | None = None
    result: bytes | None = None
    failure: str | None = None
    reason: str | None = None

    @property
    def refused(self) -> bool:
        return self.outcome in REFUSALS

    @property
    def pending(self) -> bool:
        return not self.refused and self.status in ("received", "accepted")

    @property
    def answer_outcome(self) -> str:
        """What the receipt answers: a refusal stays one; an update shows its state."""
        if self.refused:
            return self.outcome
        return self.status if self.type == "update" else "received"


Event = tuple[str, str | None, str | None, object]


@dataclass
class Instance:
    namespace: str
    workflow_id: str
    runs: dict[str, Run] = field(default_factory=dict)
    current: str | None = None
    commands: dict[str, Command] = field(default_factory=dict)
    receipts: dict[tuple[str, str], str] = field(default_factory=dict)
    events: list[Event] = field(default_factory=list)
    pruned: list[Command] = field(default_factory=list)
    all_run_ids: list[str] = field(default_factory=list)
    max_sequence: int = 0

    @property
    def label(self) -> str:
        return f"{self.namespace}/{self.workflow_id}"

    def current_run(self) -> Run | None:
        return None if self.current is None else self.runs[self.current]

    def chain(self, end: Run) -> list[Run]:
        chain = [end]
        while chain[-1].continued_from is not None and chain[-1].continued_from in self.runs:
            chain.append(self.runs[chain[-1].continued_from])
        return chain


def event_view(event: HistoryEvent) -> Event:
    """What the model predicts of an event: its type, run, command and the detail the docs fix."""
    payload = event.payload if isinstance(event.payload, dict) else {}
    detail: object = None
    if event.event_type == "RunClosed":
        detail = payload.get("status")
    elif event.event_type == "CommandHandedOff":
        detail = (payload.get("from_run_id"), payload.get("to_run_id"), payload.get("command_sequence"))
    elif event.event_type == "SignalRejected":
        detail = payload.get("reason")
    elif event.event_type == "UpdateFailed":
        detail = payload.get("failure")
    return (event.event_type, event.run_id, event.command_id, detail)


RECEIPT_FIELDS = (
    "decision",
    "outcome",
    "http_status",
    "namespace",
    "workflow_id",
    "command_type",
    "request_id",
    "retained",
    "intent_verified",
    "command_id",
    "run_id",
    "command_sequence",
    "received_at",
    "target_scope",
    "signal_status",
    "update_id",
    "update_status",
    "result",
    "failure",
    "reason",
    "requested_run_id",
    "resolved_run_id",
)
CONFLICT_FIELDS = (
    "decision",
    "outcome",
    "http_status",
    "namespace",
    "workflow_id",
    "command_type",
    "request_id",
    "retained",
    "intent_verified",
    "conflict",
    "retained_command_id",
    "retained_command_type",
    "retained_outcome",
)


def fields_of(answer: Admission, names: tuple[str, ...]) -> dict[str, object]:
    found = {name: getattr(answer, name) for name in names}
    if "result" in found:
        found["result"] = canonical_encode(answer.result)
    body = answer.to_dict()  # the JSON form must exist for every answer
    assert body["http_status"] == answer.http_status and body["outcome"] == answer.outcome
    return found


def expected_receipt(inst: Instance, cmd: Command, decision: Decision) -> dict[str, object]:
    """The receipt of ``cmd`` as contract §4/§5 and docs/lifecycle.md describe it."""
    signal = cmd.type == "signal"
    return {
        "decision": decision,
        "outcome": cmd.answer_outcome,
        "http_status": HTTP[cmd.answer_outcome],
        "namespace": inst.namespace,
        "workflow_id": inst.workflow_id,
        "command_type": cmd.type,
        "request_id": cmd.key,
        "retained": decision is Decision.RETAINED,
        "intent_verified": True,
        "command_id": cmd.id,
        "run_id": cmd.run_id,
        "command_sequence": cmd.sequence,
        "received_at": cmd.received_at,
        "target_scope": "instance" if cmd.target is None else "run",
        "signal_status": cmd.status if signal and not cmd.refused else None,
        "update_id": cmd.update_id,
        "update_status": cmd.status if not signal and not cmd.refused else None,
        "result": cmd.result if cmd.status == "completed" else canonical_encode(None),
        "failure": cmd.failure,
        "reason": cmd.reason,
        "requested_run_id": cmd.target if cmd.refused else None,
        "resolved_run_id": cmd.run_id if cmd.refused else None,
    }


def check(actual: dict[str, object], expected: dict[str, object], what: str) -> None:
    wrong = {k: (actual[k], expected[k]) for k in expected if actual[k] != expected[k]}
    assert not wrong, f"{what}: (actual, expected) differ in {wrong}"


# -- the machine -----------------------------------------------------------------------------

# Mostly a call goes where it fits (an open run, a pending command); now and then anywhere.
ANYONE = st.integers(min_value=0, max_value=4).map(lambda n: n == 0)
# Now and then the engine names a command in the other namespace's twin instance.
ELSEWHERE = st.integers(min_value=0, max_value=9).map(lambda n: n == 0)
# Time the machine lets pass before a lifecycle call: often none, sometimes hours or days.
LATER = st.sampled_from((0, 0, 0, 1, 24, 49))
# Which earlier receipt a retry names.
RECEIPT_KINDS = ("any", "pending", "applied", "completed", "rejected or failed", "refused", "pruned")
KEY = st.one_of(st.none(), st.sampled_from(KEYS))


class Conformance(RuleBasedStateMachine):
    """Two namespaces x 2-3 workflow ids, one key pool, one clock the machine moves by hand."""

    store: Store
    backend: str
    examples = itertools.count()

    @initialize(workflows=st.integers(min_value=2, max_value=3), started=st.lists(st.booleans(), min_size=6))
    def setup(self, workflows: int, started: list[bool]) -> None:
        example = next(self.examples)
        self.exact_counts = example < EPOCHS
        self.epoch = EPOCH - (example % EPOCHS) * SPAN
        self.now = self.epoch
        ids = itertools.count(1)
        # The in-memory store copies all its tables in every transaction: a fresh
        # one per example keeps long runs (and shrinking) linear.  The SQL stores
        # keep every example's rows, so each example also runs beside the others'.
        store = MemoryStore() if isinstance(self.store, MemoryStore) else self.store
        self.service = AdmissionService(
            store, clock=lambda: self.now, new_id=lambda: f"e{example}-{next(ids)}"
        )
        self.workflows = workflows
        self.instances = {
            (ns, i): Instance(f"{ns}-{example}", WORKFLOW_IDS[i])
            for ns in NAMESPACES
            for i in range(workflows)
        }
        self.checks = 0
        self.touched: set[tuple[str, int]] = set(self.instances)
        # Most instances begin with an open run; the others first meet commands with none.
        for where, start in zip(list(self.instances), started, strict=False):
            if start:
                self.start_run(self.instances[where])

    # -- helpers ------------------------------------------------------------------------------

    def step(self, label: str, hours: int = 0) -> None:
        STEPS[self.backend] += 1
        self.seen(label)
        later = self.now + timedelta(hours=hours, seconds=1)
        if later < self.epoch + SPAN - MARGIN:
            self.now = later
        self.touched = set()

    def touch(self, *instances: Instance) -> None:
        for inst in instances:
            self.touched |= {k for k, i in self.instances.items() if i is inst}

    def seen(self, label: str) -> None:
        SEEN.setdefault(self.backend, Counter())[label] += 1

    def other(self, inst: Instance) -> Instance:
        """The instance with the same workflow id in the other namespace."""
        ((ns, index),) = [k for k, v in self.instances.items() if v is inst]
        return self.instances[("b" if ns == "a" else "a", index)]

    def choose(self, data: st.DataObject, anyone: bool, sensible: list[Instance]) -> Instance:
        """An instance where the call fits, or (now and then, or if none) any instance."""
        pool = [
            k for k, i in self.instances.items() if anyone or not sensible or any(i is x for x in sensible)
        ]
        return self.instances[data.draw(st.sampled_from(pool), label="instance")]

    def open_instances(self) -> list[Instance]:
        return [
            i for i in self.instances.values() if (r := i.current_run()) is not None and r.status == "open"
        ]

    def known_ids(self) -> set[str]:
        ids: set[str] = set()
        for inst in self.instances.values():
            for cmd in [*inst.commands.values(), *inst.pruned]:
                ids.add(cmd.id)
                if cmd.update_id is not None:
                    ids.add(cmd.update_id)
        return ids

    def pick_target(self, inst: Instance, aim: str, data: st.DataObject) -> str | None:
        if aim == "current":
            return inst.current
        if aim == "older" and inst.all_run_ids:
            return data.draw(st.sampled_from(inst.all_run_ids), label="older run")
        if aim == "foreign":
            foreign = [r for i in self.instances.values() if i is not inst for r in i.all_run_ids]
            return data.draw(st.sampled_from(foreign), label="foreign run") if foreign else "no-such-run"
        return None

    # -- admission ------------------------------------------------------------------------------

    def admit(
        self,
        inst: Instance,
        command_type: str,
        key: str | None,
        name: str,
        arguments: object,
        target: str | None,
    ) -> None:
        self.touch(inst)
        admit = self.service.admit_signal if command_type == "signal" else self.service.admit_update
        answer = admit(inst.namespace, inst.workflow_id, name, arguments, request_id=key, run_id=target)
        encoded = canonical_encode(arguments)
        receipt = None if key is None else inst.receipts.get((command_type, key))
        if receipt is not None:
            cmd = inst.commands[receipt]
            parts = tuple(
                part
                for part, same in (
                    ("name", cmd.name == name),
                    ("arguments", cmd.arguments == encoded),
                    ("target", cmd.target == target),
                )
                if not same
            )
            if not parts:
                # §4: same digest: the original receipt, in its current state; nothing written.
                self.seen(f"retained {cmd.answer_outcome}")
                check(
                    fields_of(answer, RECEIPT_FIELDS),
                    expected_receipt(inst, cmd, Decision.RETAINED),
                    "retained receipt",
                )
                return
            # §4: another digest: 409 naming the parts that differ; nothing written, key kept.
            self.seen("conflict")
            check(
                fields_of(answer, CONFLICT_FIELDS),
                {
                    "decision": Decision.CONFLICT,
                    "outcome": "request_id_conflict",
                    "http_status": 409,
                    "namespace": inst.namespace,
                    "workflow_id": inst.workflow_id,
                    "command_type": command_type,
                    "request_id": key,
                    "retained": False,
                    "intent_verified": True,
                    "conflict": parts,
                    "retained_command_id": cmd.id,
                    "retained_command_type": cmd.type,
                    "retained_outcome": cmd.answer_outcome,
                },
                "conflict",
            )
            return
        # No receipt (or no key): a fresh command, placed by the target rules of §4.
        if key is not None and any(c.type == command_type and c.key == key for c in inst.pruned):
            self.seen("fresh again after pruning")  # §5: after pruning the key is free again
        current = inst.current_run()
        if target is not None and target != inst.current:
            outcome, reason = "rejected_not_current", "selected_run_not_current"
        elif current is None or current.status != "open":
            outcome, reason = "run_not_active", "run_not_active"
        else:
            outcome, reason = ("received" if command_type == "signal" else "accepted"), None
        self.seen(f"fresh {outcome}")
        assert answer.command_id is not None and answer.command_id not in self.known_ids()
        assert answer.command_sequence is not None
        # A fresh command comes after every command the instance still has, and
        # leaves no gap for a row nobody admitted (retained and conflicting
        # answers write nothing).
        assert (
            max((c.sequence for c in inst.commands.values()), default=0)
            < answer.command_sequence
            <= inst.max_sequence + 1
        ), (answer.command_sequence, inst.max_sequence)
        cmd = Command(
            id=answer.command_id,
            type=command_type,
            key=key,
            name=name,
            raw_arguments=arguments,
            arguments=encoded,
            target=target,
            run_id=inst.current,
            sequence=answer.command_sequence,
            received_at=self.now,
            outcome=outcome,
            status="refused" if reason else outcome,
            owner=None if reason else inst.current,
            reason=reason,
        )
        if command_type == "update" and not reason:
            assert answer.update_id is not None and answer.update_id not in self.known_ids()
            cmd.update_id = answer.update_id
        check(fields_of(answer, RECEIPT_FIELDS), expected_receipt(inst, cmd, Decision.FRESH), "fresh")
        inst.commands[cmd.id] = cmd
        inst.max_sequence = max(inst.max_sequence, cmd.sequence)
        if key is not None:
            inst.receipts[(command_type, key)] = cmd.id  # §4: a keyed refusal is retained too
        event = (
            "CommandRejected"
            if reason
            else ("SignalReceived" if command_type == "signal" else "UpdateAccepted")
        )
        inst.events.append((event, cmd.run_id, cmd.id, None))

    @rule(
        data=st.data(),
        anyone=ANYONE,
        key=KEY,
        name=st.sampled_from(NAMES),
        arguments=st.sampled_from(ARGUMENTS),
        aim=st.sampled_from(TARGETS),
    )
    def signal(
        self, data: st.DataObject, anyone: bool, key: str | None, name: str, arguments: object, aim: str
    ) -> None:
        """A signal, keyed or not, to the instance or to a run (current, older, another instance's)."""
        self.step("signal")
        inst = self.choose(data, anyone, self.open_instances())
        self.admit(inst, "signal", key, name, arguments, self.pick_target(inst, aim, data))

    @rule(
        data=st.data(),
        anyone=ANYONE,
        key=KEY,
        name=st.sampled_from(NAMES),
        arguments=st.sampled_from(ARGUMENTS),
        aim=st.sampled_from(TARGETS),
    )
    def update(
        self, data: st.DataObject, anyone: bool, key: str | None, name: str, arguments: object, aim: str
    ) -> None:
        """An update, keyed or not, to the instance or to a run (current, older, another instance's)."""
        self.step("update")
        inst = self.choose(data, anyone, self.open_instances())
        self.admit(inst, "update", key, name, arguments, self.pick_target(inst, aim, data))

    def keyed(self, include_pruned: bool) -> list[tuple[tuple[str, int], str, str]]:
        """Every keyed command (where, id, kind): the live receipts, and the pruned ones."""
        found = []
        for where, inst in self.instances.items():
            for cmd_id in inst.receipts.values():
                cmd = inst.commands[cmd_id]
                kind = (
                    "refused"
                    if cmd.refused
                    else "pending"
                    if cmd.pending
                    # Two kinds, not one: a retry of a completed update must turn up
                    # in every CI run ("retained completed"), on every backend alone.
                    else cmd.status
                    if cmd.status in ("applied", "completed")
                    else "rejected or failed"
                )
                found.append((where, cmd_id, kind))
            if include_pruned:
                found += [(where, c.id, "pruned") for c in inst.pruned if c.key is not None]
        return found

    def command(self, where: tuple[str, int], command_id: str) -> Command:
        inst = self.instances[where]
        return inst.commands.get(command_id) or next(c for c in inst.pruned if c.id == command_id)

    @precondition(lambda self: self.keyed(include_pruned=True))
    @rule(data=st.data(), kind=st.sampled_from(RECEIPT_KINDS))
    def retry_same(self, data: st.DataObject, kind: str) -> None:
        """An earlier key with the identical intent: its receipt (after pruning: a fresh command)."""
        self.step("retry_same")
        found = self.keyed(include_pruned=True)
        self.retry(data, [f for f in found if f[2] == kind] or found)

    @precondition(lambda self: any(kind == "completed" for *_, kind in self.keyed(include_pruned=False)))
    @rule(data=st.data())
    def retry_completed(self, data: st.DataObject) -> None:
        """A retry of a completed update: its result again.  A rule of its own, not only a
        kind ``retry_same`` may draw, so that every run meets it however rare completions
        with a key are in the sequences drawn."""
        self.step("retry_same")
        self.retry(data, [f for f in self.keyed(include_pruned=False) if f[2] == "completed"])

    def retry(self, data: st.DataObject, found: list[tuple[tuple[str, int], str, str]]) -> None:
        """Send one of ``found`` again with the same intent."""
        where, command_id, _ = data.draw(st.sampled_from(found), label="receipt")
        cmd = self.command(where, command_id)
        # The same value, possibly written differently (a map in another order).
        same = [a for a in ARGUMENTS if canonical_encode(a) == cmd.arguments]
        arguments = data.draw(st.sampled_from(same), label="arguments")
        self.admit(self.instances[where], cmd.type, cmd.key, cmd.name, arguments, cmd.target)

    @precondition(lambda self: self.keyed(include_pruned=False))
    @rule(data=st.data(), parts=st.sets(st.sampled_from(("name", "arguments", "target")), min_size=1))
    def retry_changed(self, data: st.DataObject, parts: set[str]) -> None:
        """An earlier key with a changed name, arguments or target: a conflict on exactly those."""
        self.step("retry_changed")
        where, command_id, _ = data.draw(st.sampled_from(self.keyed(include_pruned=False)), label="receipt")
        inst = self.instances[where]
        cmd = inst.commands[command_id]
        name = next(n for n in NAMES if n != cmd.name) if "name" in parts else cmd.name
        arguments = cmd.raw_arguments
        if "arguments" in parts:
            others = [a for a in ARGUMENTS if canonical_encode(a) != cmd.arguments]
            arguments = data.draw(st.sampled_from(others), label="changed arguments")
        target = cmd.target
        if "target" in parts:
            choices = [None, "no-such-run", *inst.all_run_ids, *self.other(inst).all_run_ids]
            target = data.draw(
                st.sampled_from([t for t in choices if t != cmd.target]), label="changed target"
            )
        self.admit(inst, cmd.type, cmd.key, name, arguments, target)

    @rule(data=st.data(), command_type=st.sampled_from(("signal", "update")), key=st.sampled_from(KEYS))
    def read_receipt(self, data: st.DataObject, command_type: str, key: str) -> None:
        """Reading a receipt answers what a retry would, and writes nothing."""
        self.step("read_receipt")
        inst = self.choose(data, True, [])
        self.touch(inst)
        answer = self.service.receipt(inst.namespace, inst.workflow_id, command_type, key)  # type: ignore[arg-type]
        receipt = inst.receipts.get((command_type, key))
        if receipt is None:
            assert answer is None, answer
            return
        assert answer is not None
        check(
            fields_of(answer, RECEIPT_FIELDS),
            expected_receipt(inst, inst.commands[receipt], Decision.RETAINED),
            "receipt",
        )

    # -- the engine's progress -----------------------------------------------------------------------

    def pick(
        self, data: st.DataObject, command_type: str, anyone: bool, elsewhere: bool
    ) -> tuple[Instance, Command | None, str]:
        """A pending command of the type, or (now and then) any: finished, refused, pruned; and
        the instance asked (``elsewhere``: the same workflow id in the other namespace)."""
        candidates = [
            (where, c.id)
            for where, inst in self.instances.items()
            for c in [*inst.commands.values(), *inst.pruned]
            if c.type == command_type
        ]
        pending = [
            (w, c) for w, c in candidates if c in self.instances[w].commands and self.command(w, c).pending
        ]
        if pending and not anyone:
            candidates = pending
        if not candidates:
            return self.instances[("a", 0)], None, "no-such-id"
        where, command_id = data.draw(st.sampled_from(candidates), label=command_type)
        inst = self.instances[where]
        cmd = self.command(where, command_id)
        asked = self.other(inst) if elsewhere else inst
        self.touch(inst, asked)
        if elsewhere or any(c is cmd for c in inst.pruned):
            return asked, None, (cmd.update_id or cmd.id) if command_type == "update" else cmd.id
        return asked, cmd, (cmd.update_id or cmd.id) if command_type == "update" else cmd.id

    def has(self, command_type: str) -> bool:
        return any(
            c.type == command_type for i in self.instances.values() for c in [*i.commands.values(), *i.pruned]
        )

    @precondition(lambda self: self.has("signal"))
    @rule(data=st.data(), anyone=ANYONE, elsewhere=ELSEWHERE)
    def apply(self, data: st.DataObject, anyone: bool, elsewhere: bool) -> None:
        """The engine delivers a signal (docs/lifecycle.md: pending in the open run, else refused)."""
        self.step("apply")
        inst, cmd, command_id = self.pick(data, "signal", anyone, elsewhere)

        def call() -> Admission:
            return self.service.apply_signal(inst.namespace, inst.workflow_id, command_id)

        if cmd is None or cmd.refused:
            # Unknown here: never admitted in this instance, refused, or pruned.
            with pytest.raises(UnknownCommandError):
                call()
            self.seen("apply unknown")
            return
        if cmd.status == "applied":
            self.seen("apply again")
            check(fields_of(call(), RECEIPT_FIELDS), expected_receipt(inst, cmd, Decision.RETAINED), "apply")
            return
        if cmd.status == "rejected":
            with pytest.raises(RunStateError):
                call()
            self.seen("apply rejected")
            return
        assert cmd.pending and cmd.owner == inst.current
        answer = call()
        cmd.status = "applied"
        cmd.owner = None
        check(fields_of(answer, RECEIPT_FIELDS), expected_receipt(inst, cmd, Decision.FRESH), "apply")
        inst.events.append(("SignalApplied", inst.current, cmd.id, None))
        self.seen("apply fresh")

    def finish(self, data: st.DataObject, anyone: bool, elsewhere: bool, status: str, value: object) -> None:
        inst, cmd, update_id = self.pick(data, "update", anyone, elsewhere)
        if cmd is not None and cmd.status == status and data.draw(st.booleans(), label="repeat"):
            # A finished update is finished again with its own value half of the time:
            # the retry of a completion (contract §5) must not hinge on a lucky draw.
            value = canonical_decode(cmd.result) if status == "completed" else cmd.failure
        encoded = canonical_encode(value)

        def call() -> Admission:
            if status == "completed":
                return self.service.complete_update(inst.namespace, inst.workflow_id, update_id, value)
            return self.service.fail_update(inst.namespace, inst.workflow_id, update_id, str(value))

        if cmd is None or cmd.refused:
            with pytest.raises(UnknownUpdateError):
                call()
            self.seen(f"{status} unknown")
            return
        if cmd.status == "accepted":
            answer = call()
            cmd.status = status
            cmd.owner = None
            if status == "completed":
                cmd.result = encoded
            else:
                cmd.failure = str(value)
            check(fields_of(answer, RECEIPT_FIELDS), expected_receipt(inst, cmd, Decision.FRESH), status)
            # The event goes to the run the update finished in: the open run,
            # the successor of the one it was admitted in after a handoff.
            if status == "completed":
                inst.events.append(("UpdateCompleted", inst.current, cmd.id, None))
            else:
                inst.events.append(("UpdateFailed", inst.current, cmd.id, cmd.failure))
            self.seen(f"{status} fresh")
            return
        same = (
            (cmd.status == "completed" and cmd.result == encoded)
            if status == "completed"
            else (cmd.status == "failed" and cmd.failure == value)
        )
        if cmd.status == status and same:
            # The same completion twice is a retry, never a second effect (§5).
            check(fields_of(call(), RECEIPT_FIELDS), expected_receipt(inst, cmd, Decision.RETAINED), status)
            self.seen(f"{status} again")
            return
        with pytest.raises(RunStateError):
            call()
        self.seen(f"{status} refused")

    @precondition(lambda self: self.has("update"))
    @rule(data=st.data(), anyone=ANYONE, elsewhere=ELSEWHERE, result=st.sampled_from(RESULTS))
    def complete(self, data: st.DataObject, anyone: bool, elsewhere: bool, result: object) -> None:
        self.step("complete")
        self.finish(data, anyone, elsewhere, "completed", result)

    @precondition(lambda self: self.has("update"))
    @rule(data=st.data(), anyone=ANYONE, elsewhere=ELSEWHERE, failure=st.sampled_from(FAILURES))
    def fail(self, data: st.DataObject, anyone: bool, elsewhere: bool, failure: str) -> None:
        self.step("fail")
        self.finish(data, anyone, elsewhere, "failed", failure)

    # -- runs ------------------------------------------------------------------------------------------

    def check_run(self, info: RunInfo, inst: Instance, run: Run, started: datetime | None = None) -> None:
        check(
            {k: getattr(info, k) for k in ("namespace", "workflow_id", "run_id", "status", "closed_at")},
            {
                "namespace": inst.namespace,
                "workflow_id": inst.workflow_id,
                "run_id": run.id,
                "status": run.status,
                "closed_at": run.closed_at,
            },
            "run",
        )
        if started is not None:
            assert (info.run_number, info.started_at, info.continued_from_run_id) == (
                run.number,
                started,
                run.continued_from,
            )

    def start_run(self, inst: Instance) -> None:
        self.touch(inst)
        current = inst.current_run()
        if current is not None and current.status == "open":
            with pytest.raises(RunStateError):
                self.service.start_run(inst.namespace, inst.workflow_id)
            self.seen("start refused")
            return
        info = self.service.start_run(inst.namespace, inst.workflow_id)
        assert info.run_id not in inst.all_run_ids
        if current is not None:
            number = current.number + 1
        elif not inst.all_run_ids:
            number = 1
        else:
            # Every run was pruned: the contract does not say how numbering goes on.
            assert info.run_number >= 1
            number = info.run_number
        run = Run(info.run_id, number, "open", None)
        self.check_run(info, inst, run, started=self.now)
        inst.runs[run.id] = run
        inst.all_run_ids.append(run.id)
        inst.current = run.id
        inst.events.append(("RunStarted", run.id, None, None))

    @rule(data=st.data(), anyone=ANYONE, hours=LATER)
    def start(self, data: st.DataObject, anyone: bool, hours: int) -> None:
        self.step("start", hours)
        opened = self.open_instances()
        closed = [i for i in self.instances.values() if not any(i is o for o in opened)]
        self.start_run(self.choose(data, anyone, closed))

    def close_pending(self, inst: Instance, run: Run, continue_as_new: bool) -> list[Command]:
        """Close what the run has not applied; return the instance-scope commands to hand on."""
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

    @rule(data=st.data(), anyone=ANYONE, status=st.sampled_from(CLOSE_STATUSES), hours=LATER)
    def close(self, data: st.DataObject, anyone: bool, status: str, hours: int) -> None:
        self.step("close", hours)
        inst = self.choose(data, anyone, self.open_instances())
        self.touch(inst)
        run = inst.current_run()
        if run is None or run.status != "open":
            with pytest.raises(RunStateError):
                self.service.close_run(inst.namespace, inst.workflow_id, status)
            self.seen("close refused")
            return
        info = self.service.close_run(inst.namespace, inst.workflow_id, status)
        self.close_pending(inst, run, continue_as_new=False)
        run.status, run.closed_at = status, self.now
        inst.events.append(("RunClosed", run.id, None, status))
        self.check_run(info, inst, run)

    @rule(data=st.data(), anyone=ANYONE, hours=LATER)
    def continue_as_new(self, data: st.DataObject, anyone: bool, hours: int) -> None:
        self.step("continue_as_new", hours)
        # Preferably a run with something to hand on.
        busy = [
            i
            for i in self.open_instances()
            if any(c.pending and c.target is None for c in i.commands.values())
        ]
        inst = self.choose(data, anyone, busy or self.open_instances())
        self.touch(inst)
        run = inst.current_run()
        if run is None or run.status != "open":
            with pytest.raises(RunStateError):
                self.service.continue_as_new(inst.namespace, inst.workflow_id)
            self.seen("continue refused")
            return
        info = self.service.continue_as_new(inst.namespace, inst.workflow_id)
        handed = self.close_pending(inst, run, continue_as_new=True)
        run.status, run.closed_at = "continued", self.now
        inst.events.append(("RunClosed", run.id, None, "continued"))
        successor = Run(info.run_id, run.number + 1, "open", run.id)
        assert info.run_id not in inst.all_run_ids
        self.check_run(info, inst, successor, started=self.now)
        inst.runs[successor.id] = successor
        inst.all_run_ids.append(successor.id)
        inst.current = successor.id
        inst.events.append(("RunStarted", successor.id, None, None))
        for cmd in handed:  # in their original order, keeping their ids
            cmd.owner = successor.id
            inst.events.append(
                ("CommandHandedOff", successor.id, cmd.id, (run.id, successor.id, cmd.sequence))
            )
            self.seen("handed off")

    # -- retention ----------------------------------------------------------------------------------

    @staticmethod
    def chain_latest(inst: Instance, end: Run) -> datetime:
        """The latest time recorded on a closed chain's rows: its close, or a refusal
        recorded with its last run (the instance's current run) after the close."""
        assert end.closed_at is not None
        ids = {r.id for r in inst.chain(end)}
        return max([end.closed_at, *(c.received_at for c in inst.commands.values() if c.run_id in ids)])

    def prune_plan(self, cutoff: datetime) -> list[tuple[Instance, list[list[Run]], list[Command]]]:
        """§5 and the brief: a chain goes once its last run closed and the latest time
        recorded on its rows is before the cutoff; an open chain stays.  Refusals recorded
        while the instance had no run go once older."""
        plan = []
        for inst in self.instances.values():
            chains = [
                inst.chain(run)
                for run in inst.runs.values()
                if run.status not in ("open", "continued")
                and run.closed_at is not None
                and self.chain_latest(inst, run) < cutoff
            ]
            runless = [c for c in inst.commands.values() if c.run_id is None and c.received_at < cutoff]
            if chains or runless:
                plan.append((inst, chains, runless))
        return plan

    def prune_times(self, retention: int) -> list[datetime]:
        """Interesting values of ``now``: the clock, later, and each boundary and just past it."""
        times = [self.now, self.now + timedelta(days=1), self.now + timedelta(days=3)]
        days = timedelta(days=retention)
        for inst in self.instances.values():
            for run in inst.runs.values():
                if run.status not in ("open", "continued") and run.closed_at is not None:
                    latest = self.chain_latest(inst, run)
                    times += [run.closed_at + days, latest + days, latest + days + timedelta(seconds=1)]
            for cmd in inst.commands.values():
                if cmd.run_id is None:
                    times += [cmd.received_at + days, cmd.received_at + days + timedelta(seconds=1)]
        return sorted(set(times))

    @precondition(lambda self: HAS_PRUNE)
    @rule(data=st.data(), retention=st.sampled_from((0, 1, 2)), dry_run=st.booleans())
    def prune(self, data: st.DataObject, retention: int, dry_run: bool) -> None:
        self.step("prune")
        now = data.draw(st.sampled_from(self.prune_times(retention)), label="now")
        plan = self.prune_plan(now - timedelta(days=retention))
        options: dict[str, Any] = {"retention_days": retention, "now": now}
        if "dry_run" in PRUNE_PARAMETERS:
            options["dry_run"] = dry_run
        else:
            dry_run = False
        if "max_clock_lead" in PRUNE_PARAMETERS:
            # The machine's clock is right, and its ``now`` runs days past the
            # last write: the cap on a clock far ahead is tested on its own
            # (test_retention.py), here the retention rule itself is.
            options["max_clock_lead"] = None
        self.touch(*self.instances.values())
        report = self.service.prune(**options)
        expected = Counter[str]()
        for inst, chains, runless in plan:
            for chain in chains:
                ids = {r.id for r in chain}
                commands = [c for c in inst.commands.values() if c.run_id in ids]
                expected["runs"] += len(ids)
                expected["commands"] += len(commands)
                expected["updates"] += sum(c.update_id is not None for c in commands)
                expected["events"] += sum(e[1] in ids for e in inst.events)
                if not dry_run:
                    self.forget(inst, commands, lambda e, ids=ids: e[1] in ids)
                    for run in chain:
                        del inst.runs[run.id]
                    if inst.current in ids:
                        inst.current = None
                    inst.events.append((PRUNED_EVENT, None, None, None))
                self.seen("pruned chain (dry run)" if dry_run else "pruned chain")
            if runless:
                gone = {c.id for c in runless}
                expected["commands"] += len(runless)
                expected["events"] += sum(e[1] is None and e[2] in gone for e in inst.events)
                if not dry_run:
                    self.forget(inst, runless, lambda e, gone=gone: e[1] is None and e[2] in gone)
                    inst.events.append((PRUNED_EVENT, None, None, None))
                self.seen("pruned run-less refusals (dry run)" if dry_run else "pruned run-less refusals")
        counts = getattr(report, "counts", None)
        if counts is not None and self.exact_counts:
            actual = {k: getattr(counts, k) for k in ("runs", "commands", "updates", "events")}
            assert actual == {k: expected[k] for k in actual}, (actual, dict(expected))

    @staticmethod
    def forget(inst: Instance, commands: list[Command], event_gone: Any) -> None:
        for cmd in commands:
            del inst.commands[cmd.id]
            inst.pruned.append(cmd)
            if cmd.key is not None and inst.receipts.get((cmd.type, cmd.key)) == cmd.id:
                del inst.receipts[(cmd.type, cmd.key)]  # the key is free again
        inst.events = [e for e in inst.events if not event_gone(e)]

    # -- invariants -----------------------------------------------------------------------------------

    @invariant()
    def history_agrees_with_the_model(self) -> None:
        """An instance's event log is exactly the model's: the same events, in order, each on
        its run and command (so the counts of every event type agree, and retained, conflicting
        and refused-by-exception calls wrote nothing).

        Checked after every step for the instances the step addressed, and for one more
        instance in turn, so every instance (and so any write that leaked into it from another
        namespace or instance) is compared within a few steps."""
        keys = list(self.instances)
        self.checks += 1
        due = {*self.touched, keys[self.checks % len(keys)]}
        for key in keys:
            if key not in due:
                continue
            inst = self.instances[key]
            actual = [event_view(e) for e in self.service.history(inst.namespace, inst.workflow_id)]
            if actual != inst.events:
                counts = Counter(e[0] for e in actual)
                wanted = Counter(e[0] for e in inst.events)
                raise AssertionError(
                    f"{inst.label}: history differs from the model; counts {dict(counts)} vs {dict(wanted)};"
                    f"\nactual   {actual}\nexpected {inst.events}"
                )

    @invariant()
    def pending_commands_wait_in_the_open_run(self) -> None:
        """A pending command always waits in its instance's current, open run (nothing is left
        pending in a closed run: closure rejects it or hands it on)."""
        for inst in self.instances.values():
            current = inst.current_run()
            for cmd in inst.commands.values():
                if cmd.pending:
                    assert current is not None and current.status == "open" and cmd.owner == current.id


def backend_of(request: pytest.FixtureRequest) -> str:
    return str(request.node.callspec.params["store"])


def test_admission_and_lifecycle_follow_the_contract(
    store: Store, request: pytest.FixtureRequest, record_property: Any
) -> None:
    backend = backend_of(request)
    machine = type("Machine", (Conformance,), {"store": store, "backend": backend})
    before, seen_before = STEPS[backend], Counter(SEEN.get(backend, Counter()))
    started = time.perf_counter()
    run_state_machine_as_test(machine, settings=SETTINGS)
    SECONDS[backend] = SECONDS.get(backend, 0.0) + time.perf_counter() - started
    steps = STEPS[backend] - before
    record_property("conformance_steps", steps)
    assert steps >= MIN_STEPS, f"only {steps} steps ran on {backend}; at least {MIN_STEPS} expected"
    # Not a vacuous pass: the answers that matter turned up.  The CI profile
    # (derandomised, many examples) must meet every one of them.
    seen = SEEN[backend] - seen_before
    missing = [label for label in (CI_COVERAGE if IN_CI else COVERAGE) if not seen[label]]
    assert not missing, f"never seen on {backend}: {missing}; seen {dict(seen)}"


@pytest.fixture(scope="module", autouse=True)
def report_steps(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Save the steps each backend executed, and leave them for the run's summary (CI logs keep it)."""
    yield
    if not STEPS:
        return
    profile = "ci" if IN_CI else "default"
    line = (
        "conformance steps: "
        + " ".join(f"{backend}={STEPS[backend]}" for backend in STEPS)
        + f" (profile {profile}: {MAX_EXAMPLES} examples x <= {STEP_COUNT} steps; seconds "
        + " ".join(f"{backend}={SECONDS.get(backend, 0.0):.1f}" for backend in STEPS)
        + ")"
    )
    path = tmp_path_factory.mktemp("conformance") / "steps.json"
    path.write_text(
        json.dumps(
            {
                "profile": profile,
                "steps": dict(STEPS),
                "seconds": {k: round(v, 2) for k, v in SECONDS.items()},
                "seen": {k: dict(sorted(v.items())) for k, v in SEEN.items()},
            },
            indent=2,
        ),
        encoding="utf-8",
    )
    SUMMARY_LINES.append(f"{line} (details: {path})")


# -- namespace isolation, spelled out ----------------------------------------------------------


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = datetime(2030, 1, 1, tzinfo=UTC)

    def __call__(self) -> datetime:
        self.now += timedelta(seconds=1)
        return self.now

    def advance(self, **delta: float) -> None:
        self.now += timedelta(**delta)


A, B, WF, KEY_K = "tenant-a", "tenant-b", "order-1", "k"


def commands_in(service: AdmissionService, namespace: str) -> set[str]:
    return {e.command_id for e in service.history(namespace, WF) if e.command_id is not None}


def snapshot(service: AdmissionService, namespace: str) -> list[dict[str, object]]:
    return [e.to_dict() for e in service.history(namespace, WF)]


def test_the_same_workflow_and_key_in_two_namespaces_never_interact(store: Store) -> None:
    service = AdmissionService(store, clock=Clock())
    run_a = service.start_run(A, WF)
    run_b = service.start_run(B, WF)
    signal_a = service.admit_signal(A, WF, "approve", [1], request_id=KEY_K)
    # The same key with another intent in the other namespace: a fresh command, not a conflict.
    signal_b = service.admit_signal(B, WF, "reject", {"x": 2}, request_id=KEY_K)
    assert (signal_a.decision, signal_b.decision) == (Decision.FRESH, Decision.FRESH)
    assert signal_a.command_id != signal_b.command_id and signal_b.run_id == run_b.run_id
    # The same key on an update is another receipt (contract §2.6).
    update_a = service.admit_update(A, WF, "approve", [1], request_id=KEY_K)
    assert update_a.decision is Decision.FRESH and update_a.outcome == "accepted"

    # Retries are answered from their own namespace's receipt only.
    retry_a = service.admit_signal(A, WF, "approve", [1], request_id=KEY_K)
    assert (retry_a.decision, retry_a.command_id) == (Decision.RETAINED, signal_a.command_id)
    crossed = service.admit_signal(B, WF, "approve", [1], request_id=KEY_K)
    assert crossed.decision is Decision.CONFLICT
    assert (crossed.retained_command_id, crossed.conflict) == (signal_b.command_id, ("name", "arguments"))

    # Receipt lookup.
    found_a = service.receipt(A, WF, "signal", KEY_K)
    found_b = service.receipt(B, WF, "signal", KEY_K)
    assert found_a is not None and found_a.command_id == signal_a.command_id
    assert found_b is not None and found_b.command_id == signal_b.command_id
    assert service.receipt(B, WF, "update", KEY_K) is None

    # History: each namespace sees its own events only.
    assert commands_in(service, A) == {signal_a.command_id, update_a.command_id}
    assert commands_in(service, B) == {signal_b.command_id}
    assert {e.run_id for e in service.history(A, WF)} == {run_a.run_id}
    assert {e.run_id for e in service.history(B, WF)} == {run_b.run_id}

    # The engine cannot reach a command through the other namespace.
    with pytest.raises(UnknownCommandError):
        service.apply_signal(B, WF, signal_a.command_id)  # type: ignore[arg-type]
    with pytest.raises(UnknownUpdateError):
        service.complete_update(B, WF, update_a.update_id, "ok")  # type: ignore[arg-type]
    # A run of the other namespace is never the current run here.
    pinned = service.admit_update(B, WF, "approve", [1], run_id=run_a.run_id)
    assert (pinned.outcome, pinned.requested_run_id, pinned.resolved_run_id) == (
        "rejected_not_current",
        run_a.run_id,
        run_b.run_id,
    )

    # Closing A's run closes A's pending commands only.
    before_b = snapshot(service, B)
    service.close_run(A, WF, "terminated")
    assert snapshot(service, B) == before_b
    rejected = service.admit_signal(A, WF, "approve", [1], request_id=KEY_K)
    assert (rejected.retained, rejected.signal_status) == (True, "rejected")
    untouched = service.admit_signal(B, WF, "reject", {"x": 2}, request_id=KEY_K)
    assert (untouched.retained, untouched.signal_status) == (True, "received")
    failed = service.admit_update(A, WF, "approve", [1], request_id=KEY_K)
    assert (failed.http_status, failed.failure) == (422, UPDATE_CLOSED)
    # A has no open run now; B still admits.
    assert service.admit_update(A, WF, "x", [], request_id="k2").outcome == "run_not_active"
    assert service.admit_update(B, WF, "x", [], request_id="k2").outcome == "accepted"


@pytest.mark.skipif(not HAS_PRUNE, reason="AdmissionService.prune is not there yet")
def test_pruning_one_namespace_leaves_the_others_identical_rows_untouched(store: Store) -> None:
    clock = Clock()
    service = AdmissionService(store, clock=clock)

    def fill(namespace: str, close: bool) -> dict[str, Admission]:
        service.start_run(namespace, WF)
        made = {
            "signal": service.admit_signal(namespace, WF, "approve", [1], request_id=KEY_K),
            "update": service.admit_update(namespace, WF, "approve", [1], request_id=KEY_K),
            "pending": service.admit_update(namespace, WF, "resize", [2], request_id="k2"),
        }
        service.apply_signal(namespace, WF, made["signal"].command_id)  # type: ignore[arg-type]
        service.complete_update(namespace, WF, made["update"].update_id, {"ok": True})  # type: ignore[arg-type]
        if close:
            service.continue_as_new(namespace, WF)  # a chain of two runs, "pending" handed on
            service.close_run(namespace, WF, "completed")
        return made

    c = "tenant-c"
    made_a = fill(A, close=True)
    closed_a = clock.now
    clock.advance(days=20)
    made_b = fill(B, close=True)  # the same rows, closed 20 days later
    made_c = fill(c, close=False)  # the same rows, run still open
    before = {ns: snapshot(service, ns) for ns in (B, c)}

    # Nothing is written after B closes: the cap on a clock far ahead of the newest
    # recorded time would hold the pruning back, so it is turned off.
    idle: dict[str, Any] = {"max_clock_lead": None} if "max_clock_lead" in PRUNE_PARAMETERS else {}
    report = service.prune(retention_days=30, now=closed_a + timedelta(days=31), **idle)
    counts = getattr(report, "counts", None)
    if counts is not None:
        assert (counts.runs, counts.commands, counts.updates) == (2, 3, 2)

    # B and C: every event and every receipt exactly as before.
    assert {ns: snapshot(service, ns) for ns in (B, c)} == before
    for ns, made in ((B, made_b), (c, made_c)):
        again = service.admit_update(ns, WF, "approve", [1], request_id=KEY_K)
        assert (again.decision, again.command_id, again.http_status, again.result) == (
            Decision.RETAINED,
            made["update"].command_id,
            200,
            {"ok": True},
        )
        found = service.receipt(ns, WF, "signal", KEY_K)
        assert found is not None and found.command_id == made["signal"].command_id
    # A: its runs, commands and events are gone and its keys are free again.
    assert service.receipt(A, WF, "signal", KEY_K) is None
    assert service.receipt(A, WF, "update", KEY_K) is None
    assert not [e for e in service.history(A, WF) if e.run_id is not None or e.command_id is not None]
    service.start_run(A, WF)
    fresh = service.admit_update(A, WF, "approve", [1], request_id=KEY_K)
    assert fresh.decision is Decision.FRESH and fresh.command_id != made_a["update"].command_id

    # Later B expires too; A's new rows (an open run) and C stay.
    before = {ns: snapshot(service, ns) for ns in (A, c)}
    service.prune(retention_days=30, now=clock.now + timedelta(days=31), **idle)
    assert {ns: snapshot(service, ns) for ns in (A, c)} == before
    assert service.receipt(B, WF, "update", KEY_K) is None
    kept = service.receipt(A, WF, "update", KEY_K)
    assert kept is not None and kept.command_id == fresh.command_id
