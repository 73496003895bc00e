"""Run the conformance machine against a target and report: :func:`run_conformance` and :class:`Report`.

The machine runs under hypothesis with no example database (a run depends on
its seed alone, never on what an earlier run left on disk), no deadline (a
remote target may be slow without being wrong) and every health check off
(the target's speed is not the kit's business).  A failure is shrunk by
hypothesis to a minimal sequence; the report keeps it twice, as hypothesis
prints it and as the machine's trace of target calls, and a replay record
from which :func:`run_conformance` (or ``admission conformance --replay``)
runs exactly that example again.

A target that cannot be reached or answers outside the contract stops the
run at once with :class:`~admission.errors.ConformanceTargetError`: without an
answer there is nothing to compare, and shrinking would only ask again.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import re
import secrets
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from admission.conformance._determinism import without_local_constants
from admission.conformance._http_target import ConformanceTargetError
from admission.conformance._target import CAPABILITIES, Target
from admission.errors import InvalidValueError

if TYPE_CHECKING:
    from hypothesis.stateful import RuleBasedStateMachine

    from admission.conformance._machine import Options

__all__ = ["REPLAY_FORMAT", "Failure", "Report", "load_replay", "run_conformance"]

REPLAY_FORMAT: Final = "admission-conformance-replay/1"
"""The ``format`` member of a replay file."""

_BLOB: Final = re.compile(r"@reproduce_failure\((?P<args>'[^']*', b'[^']*')\)")
_CHATTER: Final = ("Failing test case", "Falsifying", "Trying example", "You can reproduce", "(note:")


@dataclass(frozen=True)
class Failure:
    """The first disagreement a run found, shrunk to its minimal form."""

    message: str
    """What the machine said disagreed (the assertion's message)."""
    sequence: tuple[str, ...]
    """The minimal failing sequence of rules, as hypothesis prints it (``state.rule(...)`` lines)."""
    trace: tuple[str, ...]
    """The target calls of that minimal sequence and their answers, one line each."""
    replay: Mapping[str, object]
    """The replay record (the content of a replay file): see :func:`run_conformance`."""


@dataclass(frozen=True)
class Report:
    """What a conformance run did and found.  ``ok`` when every answer agreed with the model."""

    target: str
    capabilities: frozenset[str]
    seed: int
    examples: int
    """Cases run, shrinking included."""
    steps: int
    """Rules run in all those cases."""
    rules: Mapping[str, int]
    """Each rule's name and how often it ran."""
    labels: Mapping[str, int]
    """Coverage labels (what the answers were: ``fresh received``, ``retained completed``, ...)."""
    seconds: float
    options: Mapping[str, object]
    failure: Failure | None = None
    replayed: bool | None = None
    """For a replay: whether the recorded failure came back (``None`` when this was not a replay)."""
    notes: tuple[str, ...] = ()
    """What the run left out and why (a capability the target lacks, a replay that fell back to its seed)."""

    @property
    def ok(self) -> bool:
        """Every answer agreed with the model."""
        return self.failure is None

    def to_dict(self) -> dict[str, object]:
        """The JSON form (``admission conformance --report FILE`` writes it)."""
        body: dict[str, object] = {
            "ok": self.ok,
            "target": self.target,
            "capabilities": sorted(self.capabilities),
            "seed": self.seed,
            "examples": self.examples,
            "steps": self.steps,
            "rules": dict(sorted(self.rules.items())),
            "labels": dict(sorted(self.labels.items())),
            "seconds": round(self.seconds, 3),
            "options": dict(self.options),
            "notes": list(self.notes),
            "replayed": self.replayed,
            "failure": None,
        }
        if self.failure is not None:
            body["failure"] = {
                "message": self.failure.message,
                "sequence": list(self.failure.sequence),
                "trace": list(self.failure.trace),
                "replay": dict(self.failure.replay),
            }
        return body

    def text(self) -> str:
        """The report for people: what ran, what was covered, and the failure with how to replay it."""
        verdict = "every answer agreed with the model" if self.ok else "DISAGREEMENT"
        lines = [
            f"conformance of {self.target}: {verdict}",
            f"  seed {self.seed}, {self.examples} cases, {self.steps} steps, {self.seconds:.1f} s",
            f"  capabilities: {', '.join(sorted(self.capabilities)) or 'none'}",
        ]
        if self.replayed is not None:
            lines.append(
                "  replay: the recorded failure came back"
                if self.replayed
                else "  replay: the recorded failure did NOT come back"
            )
        lines.extend(f"  note: {note}" for note in self.notes)
        lines.append("rules exercised:")
        width = max((len(name) for name in self.rules), default=0)
        lines.extend(f"  {name:<{width}}  {count}" for name, count in sorted(self.rules.items()))
        if not self.rules:
            lines.append("  (none)")
        if self.labels:
            lines.append("coverage:")
            width = max(len(label) for label in self.labels)
            lines.extend(f"  {label:<{width}}  {count}" for label, count in sorted(self.labels.items()))
        if self.failure is not None:
            lines.append("first disagreement:")
            lines.extend(f"  {line}" for line in self.failure.message.splitlines() or [""])
            lines.append("minimal failing sequence:")
            lines.extend(f"  {line}" for line in self.failure.sequence)
            lines.append("target calls of that sequence:")
            lines.extend(f"  {line}" for line in self.failure.trace or ("(none recorded)",))
            lines.append("replay record (save this line as FILE and run again with --replay FILE):")
            lines.append("  " + json.dumps(dict(self.failure.replay), ensure_ascii=False, sort_keys=True))
        return "\n".join(lines) + "\n"


def load_replay(source: str | Path | Mapping[str, object]) -> dict[str, object]:
    """A replay record: a mapping as it is, or a file holding a replay record or a whole report.

    A report's JSON (``--report FILE``) holds the record under ``failure.replay``,
    so either file may be given.  A record that is not one raises
    :class:`~admission.errors.InvalidValueError` naming ``replay``.
    """
    if isinstance(source, Mapping):
        record: object = dict(source)
    else:
        try:
            record = json.loads(Path(source).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise InvalidValueError(f"cannot read {source}: {exc}", field="replay", path="") from None
    if isinstance(record, dict) and isinstance(record.get("failure"), dict):
        record = record["failure"].get("replay")
    if not isinstance(record, dict) or record.get("format") != REPLAY_FORMAT:
        raise InvalidValueError(f"is not a replay record ({REPLAY_FORMAT})", field="replay", path="")
    if type(record.get("seed")) is not int or type(record.get("examples")) is not int:
        raise InvalidValueError("needs an integer seed and examples", field="replay", path="")
    if not isinstance(record.get("options"), dict):
        raise InvalidValueError("needs its options", field="replay", path="")
    return record


class _Stop(BaseException):
    # Carries a ConformanceTargetError through hypothesis: a BaseException that is not an
    # Exception is neither shrunk nor retried, and passes any ``except Exception`` of the machine.
    def __init__(self, error: ConformanceTargetError) -> None:
        super().__init__(str(error))
        self.error = error


class _Guarded:
    """The target as the machine sees it: every call the same, but an infrastructure failure stops the run."""

    def __init__(self, target: Target) -> None:
        self._target = target

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._target, name)
        if not callable(value):
            return value

        def call(*args: object, **kwargs: object) -> object:
            try:
                return value(*args, **kwargs)
            except ConformanceTargetError as exc:
                raise _Stop(exc) from None

        return call

    def __setattr__(self, name: str, value: object) -> None:
        if name == "_target":
            object.__setattr__(self, name, value)
        else:
            setattr(self._target, name, value)


def _options_dict(options: Options) -> dict[str, object]:
    # The tag is left out: a replay takes a fresh one, so it never meets the ids of the run it replays.
    values = dataclasses.asdict(options)
    values.pop("tag", None)
    return {k: list(v) if isinstance(v, tuple) else v for k, v in values.items()}


def _options_from(values: Mapping[str, object], tag: str) -> Options:
    from admission.conformance._machine import Options

    known = {f.name for f in dataclasses.fields(Options)}
    given = {k: tuple(v) if isinstance(v, list) else v for k, v in values.items() if k in known}
    given["tag"] = tag
    return Options(**given)  # type: ignore[arg-type]


def run_conformance(
    target: Target,
    *,
    examples: int = 100,
    seed: int | None = None,
    options: Options | None = None,
    replay: str | Path | Mapping[str, object] | None = None,
) -> Report:
    """Drive ``target`` with the conformance machine; the :class:`Report` of what agreed and what did not.

    ``examples`` cases of up to ``options.steps`` rules each, derandomised by
    ``seed`` (a random one when ``None``; the report names it either way).
    ``replay`` (a replay record, or a file holding one or a whole report) runs
    the recorded failing case again, exactly: same seed, options and examples,
    and hypothesis's record of the case when it was made by this version of
    hypothesis (else the whole seeded search is run again, and a note says so).
    A target that cannot be reached or answers outside the contract raises
    :class:`~admission.errors.ConformanceTargetError`.
    """
    from admission.conformance._machine import Options, machine_for

    blob: tuple[str, bytes] | None = None
    notes: list[str] = []
    tag = f"c{secrets.token_hex(4)}"
    if replay is not None:
        record = load_replay(replay)
        seed = int(record["seed"])  # type: ignore[call-overload]
        examples = int(record["examples"])  # type: ignore[call-overload]
        options = _options_from(record["options"], tag)  # type: ignore[arg-type]
        blob, note = _recorded_case(record)
        if note:
            notes.append(note)
    else:
        options = dataclasses.replace(
            options or Options(), tag=(options.tag if options and options.tag else tag)
        )
    if type(examples) is not int or examples < 1:
        raise InvalidValueError("must be a positive integer", field="examples", path="")
    if seed is None:
        seed = secrets.randbelow(2**32)
    machine = machine_for(_Guarded(target), options)
    missing = sorted(CAPABILITIES - set(target.capabilities))
    if missing:
        notes.append(f"the target lacks {', '.join(missing)}: the rules that need them were not run")
    return _run_machine(
        machine,
        target=target,
        examples=examples,
        seed=seed,
        steps=options.steps,
        options=_options_dict(options),
        blob=blob,
        notes=notes,
    )


def _recorded_case(record: Mapping[str, object]) -> tuple[tuple[str, bytes] | None, str]:
    from hypothesis import __version__

    version, text = record.get("hypothesis"), record.get("blob")
    if not isinstance(version, str) or not isinstance(text, str):
        return None, "the replay record holds no hypothesis case: the seeded search runs again"
    if version != __version__:
        return None, (
            f"the replay record was made with hypothesis {version}, this is {__version__}: "
            "the seeded search runs again"
        )
    return (version, text.encode("ascii")), ""


def _run_machine(
    machine: type[RuleBasedStateMachine],
    *,
    target: Target,
    examples: int,
    seed: int,
    steps: int,
    options: Mapping[str, object],
    blob: tuple[str, bytes] | None = None,
    notes: Sequence[str] = (),
) -> Report:
    """Run ``machine`` (which has a ``stats`` class attribute) under hypothesis; its :class:`Report`."""
    from hypothesis import HealthCheck, Phase, reproduce_failure, settings
    from hypothesis import seed as seeded
    from hypothesis.errors import DidNotReproduce
    from hypothesis.reporting import with_reporter
    from hypothesis.stateful import get_state_machine_test

    phases = [Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink]
    chosen = settings(
        max_examples=examples,
        stateful_step_count=steps,
        database=None,
        deadline=None,
        print_blob=True,
        report_multiple_bugs=False,
        suppress_health_check=list(HealthCheck),
        phases=phases,
    )
    test = seeded(seed)(get_state_machine_test(machine, settings=chosen))
    if blob is not None:
        test = reproduce_failure(*blob)(test)
    stats = machine.stats  # type: ignore[attr-defined]
    started = time.perf_counter()
    failure: Failure | None = None
    replayed: bool | None = None if blob is None else False
    # What hypothesis reports goes into the report, never to the caller's stdout: a replayed
    # case prints its steps rather than attach them to the exception.
    reported: list[str] = []
    try:
        with with_reporter(lambda line: reported.append(str(line))), without_local_constants():
            test()
    except _Stop as stop:
        raise stop.error from None
    except DidNotReproduce:
        replayed = False
    except Exception as exc:
        failure = _failure(
            exc,
            stats.trace,
            reported,
            seed=seed,
            examples=examples,
            options=options,
            target=target,
            blob=blob,
        )
        if blob is not None:
            replayed = True
    seconds = time.perf_counter() - started
    return Report(
        target=target.name,
        capabilities=frozenset(target.capabilities),
        seed=seed,
        examples=stats.examples,
        steps=stats.steps,
        rules=dict(Counter(stats.rules)),
        labels=dict(Counter(stats.labels)),
        seconds=seconds,
        options=dict(options),
        failure=failure,
        replayed=replayed,
        notes=tuple(notes),
    )


def _failure(
    exc: BaseException,
    trace: Sequence[str],
    reported: Sequence[str],
    *,
    seed: int,
    examples: int,
    options: Mapping[str, object],
    target: Target,
    blob: tuple[str, bytes] | None,
) -> Failure:
    notes = [str(note) for note in getattr(exc, "__notes__", ())]
    steps = [n for n in notes if _is_step(n)] or [n for n in reported if _is_step(n)]
    record: dict[str, object] = {
        "format": REPLAY_FORMAT,
        "target": target.name,
        "seed": seed,
        "examples": examples,
        "options": dict(options),
        "message": _message(exc),
    }
    for note in notes:
        found = _BLOB.search(note)
        if found:
            version, case = ast.literal_eval(f"({found['args']})")
            record["hypothesis"] = version
            record["blob"] = case.decode("ascii")
    if "blob" not in record and blob is not None:  # a replayed case: hypothesis names no blob again
        record["hypothesis"], record["blob"] = blob[0], blob[1].decode("ascii")
    return Failure(
        message=_message(exc),
        sequence=tuple(line for step in steps for line in step.strip("\n").splitlines()),
        trace=tuple(trace),
        replay=record,
    )


def _is_step(line: str) -> bool:
    # hypothesis's own sentences around the steps it prints are not steps.
    line = line.strip()
    return bool(line) and not line.startswith(_CHATTER) and "@reproduce_failure" not in line


def _message(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text if isinstance(exc, AssertionError) else f"{type(exc).__name__}: {text}"
