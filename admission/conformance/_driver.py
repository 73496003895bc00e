"""What every rule of the machine stands on: its state, the calls to the target, the comparisons.

Every call to the target goes through :class:`Driver`: it sets the target's
clock, adds a line to the example's trace, and (for an admission) applies the
mode: a lost response, or several clients at once.  Every comparison with the
model ends in one assertion message naming the rule, the fields that differ,
and the actual and expected value of each.
"""

from __future__ import annotations

import threading
import traceback
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Final, TypeVar

from hypothesis import strategies as st

from admission.conformance._model import Command, Instance, parse_time, wire_differences
from admission.conformance._target import CLOCK, Answer, CommandType, Refusal, Target

__all__ = ["Driver", "Options", "Stats"]

T = TypeVar("T")

# Each example lives in a stretch of time of its own when the machine owns the clock:
# example k in the year that starts EPOCH - k years, so pruning in one example never
# reaches the (later) rows an earlier example left in a store they share, and the
# counts a prune reports are this example's alone.
EPOCH: Final = datetime(9000, 1, 1, tzinfo=UTC)
SPAN: Final = timedelta(days=365)
MARGIN: Final = timedelta(days=20)
EPOCHS: Final = 8000


@dataclass
class Options:
    """How the machine drives its target."""

    namespaces: tuple[str, ...] = ("conformance-a", "conformance-b")
    """One or two namespaces; with two, every workflow id lives in both, and nothing may leak."""
    lost_responses: bool = False
    """Keyed admissions are sent twice, the first answer dropped: the second must be retained."""
    concurrency: int = 1
    """More than 1: each keyed admission is sent by that many clients (threads) at once."""
    tag: str = ""
    """The prefix of every workflow id; unique per run, so runs against one server never meet."""
    steps: int = 30
    """Steps per example (hypothesis's ``stateful_step_count``)."""


@dataclass
class Stats:
    """What a machine class has run: examples, steps, rules and coverage labels, and the trace
    of the current (after a failure: the shrunk) example."""

    examples: int = 0
    steps: int = 0
    rules: Counter[str] = field(default_factory=Counter)
    """Rule name -> times run."""
    labels: Counter[str] = field(default_factory=Counter)
    """Coverage label (``fresh received``, ``retained completed``, ``conflict`` ...) -> times seen."""
    trace: list[str] = field(default_factory=list)
    """One readable line per target call of the current example (reset at each example's start)."""


def short(value: object, width: int = 40) -> str:
    """``repr`` cut to ``width`` characters, for trace lines."""
    text = repr(value)
    return text if len(text) <= width else text[: width - 3] + "..."


def answer_line(answer: Answer | None) -> str:
    """The part of a trace line that says what came back."""
    if answer is None:
        return "none"
    body = answer.body
    retained = " retained" if body.get("retained") is True else ""
    command = body.get("command_id") or body.get("retained_command_id")
    return f"{answer.status} {body.get('outcome')}{retained} cmd={command}"


def stops_the_run(exc: BaseException) -> bool:
    """Whether a target's exception says it cannot answer at all (``ConformanceTargetError``,
    code ``conformance_target``): that stops the run, it is no disagreement."""
    return getattr(exc, "code", None) == "conformance_target"


def raised(exc: BaseException) -> str:
    """An exception the target raised, and where: its type, message and innermost frame."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
    return f"{type(exc).__name__}: {exc}{where}"


class Driver:
    """The machine's state and its access to the target (the rules are mixins over it)."""

    target: Target
    options: Options
    stats: Stats
    capabilities: frozenset[str]

    instances: dict[tuple[int, int], Instance]
    keys: tuple[str, ...]
    arguments: tuple[object, ...]
    example: int
    now: datetime
    epoch: datetime
    exact_counts: bool
    touched: set[tuple[int, int]]
    checks: int
    rule_name: str

    # -- bookkeeping ---------------------------------------------------------------------------

    def allows(self, capability: str) -> bool:
        """Whether the target declares ``capability``."""
        return capability in self.capabilities

    @property
    def clocked(self) -> bool:
        """Whether the machine's clock is the target's (every recorded time checked exactly)."""
        return CLOCK in self.capabilities

    def step(self, rule: str, hours: int = 0) -> None:
        """Begin a step of ``rule``: count it, move the clock on."""
        self.rule_name = rule
        self.stats.steps += 1
        self.stats.rules[rule] += 1
        later = self.now + timedelta(hours=hours, seconds=1)
        if later < self.epoch + SPAN - MARGIN:
            self.now = later
        self.touched = set()

    def seen(self, label: str) -> None:
        """Record a coverage label."""
        self.stats.labels[label] += 1

    def touch(self, *instances: Instance) -> None:
        """Mark instances the step addressed (their history is checked after it)."""
        for inst in instances:
            self.touched |= {k for k, i in self.instances.items() if i is inst}

    def other(self, inst: Instance) -> Instance | None:
        """The instance with the same workflow id in the other namespace, if there are two."""
        ((ns, index),) = [k for k, v in self.instances.items() if v is inst]
        return self.instances.get((1 - ns, index))

    def choose(self, data: st.DataObject, anyone: bool, sensible: list[Instance]) -> Instance:
        """An instance where the call fits, or (now and then, or if none) any instance."""
        pool = [
            k for k, i in self.instances.items() if anyone or not sensible or any(i is x for x in sensible)
        ]
        return self.instances[data.draw(st.sampled_from(pool), label="instance")]

    def open_instances(self) -> list[Instance]:
        """The instances with an open run."""
        return [i for i in self.instances.values() if i.open_run() is not None]

    def known_ids(self) -> set[str]:
        """Every command and update id the example has met."""
        ids: set[str] = set()
        for inst in self.instances.values():
            for cmd in [*inst.commands.values(), *inst.pruned]:
                ids.add(cmd.id)
                if cmd.update_id is not None:
                    ids.add(cmd.update_id)
        return ids

    def time_of(self, body: Mapping[str, object], name: str) -> datetime | None:
        """A time the target recorded: the machine's clock (CLOCK), else learned from ``body``."""
        if self.clocked:
            return self.now
        learned = parse_time(body.get(name))
        self.differ("the answer", {name: (body.get(name), "an ISO time with its offset")}, learned is None)
        return learned

    # -- checks --------------------------------------------------------------------------------

    def differ(self, what: str, wrong: Mapping[str, tuple[object, object]], condition: bool = True) -> None:
        """Raise the failure report's assertion: the rule, then each field, actual and expected.

        Every disagreement is raised here, so hypothesis sees one failure and shrinks it."""
        if not (condition and wrong):
            return
        lines = [f"{self.rule_name}: {what} differs from the model"]
        lines += [
            f"  {name}: actual {actual!r}, expected {expected!r}"
            for name, (actual, expected) in wrong.items()
        ]
        if self.stats.trace:
            lines.append(f"  call: {self.stats.trace[-1]}")
        # Not chained: hypothesis tells failures apart by where they arose, and every
        # disagreement (an exception of the target's included) is one failure to shrink.
        raise AssertionError("\n".join(lines)) from None

    def invoke(self, call: Callable[[], T]) -> T:
        """Call the target where the model expects an answer: a refusal or an exception is a
        disagreement like any other."""
        try:
            return call()
        except Refusal as refusal:
            self.differ("the answer", {"refusal": (refusal.reason, "an answer")})
            raise
        except Exception as exc:
            if stops_the_run(exc):
                raise
            self.differ("the answer", {"exception": (raised(exc), "an answer")})
            raise

    def compare(
        self, what: str, answer: Answer | None, expected: Mapping[str, object], status: bool = True
    ) -> None:
        """An answer against the model's body (and its HTTP status, unless ``status`` is off:
        the engine's progress routes answer 200 whatever the receipt's own status)."""
        if answer is None:
            self.differ(what, {"answer": (None, "an answer")})
            return
        assert answer is not None
        wrong = wire_differences(answer.body, expected)
        if status and answer.status != expected.get("http_status"):
            wrong = {"status": (answer.status, expected.get("http_status")), **wrong}
        self.differ(what, wrong)

    def refused(self, reason: str, call: Callable[[], object], label: str) -> None:
        """The step must be refused with ``reason`` (contract §5), and writes nothing."""
        try:
            got = call()
        except Exception as exc:
            if stops_the_run(exc):
                raise
            if not isinstance(exc, Refusal):
                self.differ("the answer", {"exception": (raised(exc), reason)})
                raise
            refusal = exc
            self.stats.trace[-1] += f" -> refused {refusal.reason}"
            self.differ("the refusal", {"reason": (refusal.reason, reason)}, refusal.reason != reason)
            self.seen(label)
            return
        self.stats.trace[-1] += " -> answered"
        self.differ(
            "the answer", {"refusal": (got if not isinstance(got, Answer) else answer_line(got), reason)}
        )

    # -- calls ---------------------------------------------------------------------------------

    def traced(self, line: str) -> None:
        """Set the target's clock and note the call about to be made."""
        self.target.now = self.now
        self.stats.trace.append(line)

    def call(self, line: str, call: Callable[[], Answer]) -> Answer:
        """One call that answers an admission body."""
        self.traced(line)
        answer = call()
        self.stats.trace[-1] += f" -> {answer_line(answer)}"
        return answer

    def admission(
        self,
        inst: Instance,
        command_type: CommandType,
        key: str | None,
        name: str,
        arguments: object,
        run_id: str | None,
        keyed: bool,
    ) -> tuple[list[Answer], str | None]:
        """Send one admission as the mode says.  Returns the answers to check (one; or, with
        several clients, one each) and, after a lost response, the command id the dropped
        answer carried (the retry must be that command's receipt)."""
        line = (
            f"admit {command_type} {inst.label} name={name} arguments={short(arguments)} "
            f"key={short(key)} run={run_id}"
        )

        def send() -> Answer:
            return self.invoke(
                lambda: self.target.admit(
                    inst.namespace,
                    inst.workflow_id,
                    command_type,
                    name,
                    arguments,
                    request_id=key,
                    run_id=run_id,
                )
            )

        if not keyed:
            return [self.call(line, send)], None
        if self.options.lost_responses:
            self.traced(line + " (answer lost)")
            dropped = send()
            self.stats.trace[-1] += f" -> {answer_line(dropped)} (dropped)"
            first = dropped.body.get("command_id") or dropped.body.get("retained_command_id")
            return [self.call(line + " (retry)", send)], first if isinstance(first, str) else None
        if self.options.concurrency > 1:
            return self.concurrently(line, send), None
        return [self.call(line, send)], None

    def concurrently(self, line: str, send: Callable[[], Answer]) -> list[Answer]:
        """``send`` from ``options.concurrency`` threads released at once."""
        count = self.options.concurrency
        self.traced(f"{line} x{count} at once")
        gate = threading.Barrier(count)
        answers: list[Answer | None] = [None] * count
        errors: list[BaseException] = []

        def client(index: int) -> None:
            try:
                gate.wait()
                answers[index] = send()
            except BaseException as exc:  # reported after the join, in the machine's thread
                errors.append(exc)

        threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(count)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors:
            raise errors[0]
        got = [a for a in answers if a is not None]
        self.stats.trace[-1] += " -> " + "; ".join(answer_line(a) for a in got)
        return got


def fresh_command(
    driver: Driver,
    inst: Instance,
    body: Mapping[str, object],
    spec: tuple[CommandType, str | None, str, object, bytes, str | None],
    placement: tuple[str, str | None],
) -> Command:
    """The command a fresh answer introduces: the ids and sequence it carries (checked to be new
    and in place), the rest from the model."""
    command_type, key, name, arguments, encoded, target = spec
    outcome, reason = placement
    command_id, sequence = body.get("command_id"), body.get("command_sequence")
    known = driver.known_ids()
    driver.differ(
        "the fresh answer",
        {"command_id": (command_id, "a command id not seen before")},
        not isinstance(command_id, str) or command_id in known,
    )
    # A fresh command comes after every command the instance still has, and leaves no gap for
    # a row nobody admitted (retained and conflicting answers write nothing).
    low = max((c.sequence for c in inst.commands.values()), default=0)
    driver.differ(
        "the fresh answer",
        {"command_sequence": (sequence, f"an integer above {low}, at most {inst.max_sequence + 1}")},
        not isinstance(sequence, int)
        or isinstance(sequence, bool)
        or not low < sequence <= inst.max_sequence + 1,
    )
    assert isinstance(command_id, str) and isinstance(sequence, int)
    cmd = Command(
        id=command_id,
        type=command_type,
        key=key,
        name=name,
        raw_arguments=arguments,
        arguments=encoded,
        target=target,
        run_id=inst.current,
        sequence=sequence,
        received_at=driver.time_of(body, "received_at"),
        outcome=outcome,
        status="refused" if reason else outcome,
        owner=None if reason else inst.current,
        reason=reason,
    )
    if command_type == "update" and not reason:
        update_id = body.get("update_id")
        driver.differ(
            "the fresh answer",
            {"update_id": (update_id, "an update id not seen before")},
            not isinstance(update_id, str) or update_id in known,
        )
        assert isinstance(update_id, str)
        cmd.update_id = update_id
    return cmd
