"""The adapter interface: what the conformance machine needs of a target.

A target is anything that answers the retry contract: admission's own
service, a user's store behind admission's service, or any HTTP endpoint that
speaks the wire contract (``docs/http.md``).  The machine speaks to it only
through :class:`Target`, and compares what comes back with its reference model.

Answers travel in their wire form whatever the target: an admission answer is
an :class:`Answer`, the HTTP status and the JSON body of ``Admission.to_dict()``
(contract §4); a run is the JSON body of ``RunInfo.to_dict()``.  A step the
target refuses (no open run to close, an unknown command id) raises
:class:`Refusal` with the reason the HTTP adapter would give.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Final, Literal, Protocol, runtime_checkable

__all__ = [
    "CAPABILITIES",
    "CLOCK",
    "HISTORY",
    "LIFECYCLE",
    "PROGRESS",
    "PRUNE",
    "REFUSAL_REASONS",
    "Answer",
    "Refusal",
    "Target",
]

LIFECYCLE: Final = "lifecycle"
"""The target starts runs, closes them and continues them as new (contract §5)."""
PROGRESS: Final = "progress"
"""The target lets the engine apply signals and complete or fail updates (contract §5)."""
HISTORY: Final = "history"
"""The target reads an instance's event log (``HistoryEvent.to_dict()`` bodies)."""
CLOCK: Final = "clock"
"""The target's clock is the machine's: ``Target.now`` is set before every call, and every
recorded time is compared exactly."""
PRUNE: Final = "prune"
"""The target prunes by retention (contract §5); needs :data:`CLOCK`."""
CAPABILITIES: Final = frozenset({LIFECYCLE, PROGRESS, HISTORY, CLOCK, PRUNE})
"""Every capability a target may declare; the machine runs the rules its target's allow."""

REFUSAL_REASONS: Final = ("run_state", "command_unknown", "update_unknown")
"""Why a lifecycle or progress step is refused: the run is not in a state that allows it
(``RunStateError``), or the command or update id is unknown to the instance."""

CommandType = Literal["signal", "update"]


@dataclass(frozen=True)
class Answer:
    """One admission answer as the wire carries it: the HTTP status and the JSON body.

    ``body`` is ``Admission.to_dict()`` (contract §4): for an in-process target the
    dict itself, for an HTTP target the parsed response body.
    """

    status: int
    body: Mapping[str, object]


class Refusal(Exception):
    """A lifecycle or progress step the target refused; ``reason`` is one of :data:`REFUSAL_REASONS`."""

    def __init__(self, reason: str, message: str = "") -> None:
        super().__init__(f"{reason}: {message}" if message else reason)
        self.reason = reason


@runtime_checkable
class Target(Protocol):
    """What the conformance machine drives.  Implement the methods your capabilities name;
    the others may raise ``NotImplementedError`` (the machine never calls them).

    Every method may be called from several threads at once in the concurrent mode.
    """

    name: str
    """A short name for reports (``memory``, ``http://127.0.0.1:8000``)."""
    capabilities: frozenset[str]
    """What the target supports, a subset of :data:`CAPABILITIES`."""
    now: datetime
    """The machine's clock; read by targets with :data:`CLOCK`, ignored by the others."""
    strips_keys: bool
    """The target applies the HTTP-input normalisation of keys (contract §2.1): surrounding
    whitespace is stripped and a blank key means no key.  In-process targets do not: the core
    never trims, so ``" k"`` and ``"k"`` are two keys there."""

    def begin(self, example: int) -> None:
        """Called before each example (a fresh in-memory store may start here)."""

    def admit(
        self,
        namespace: str,
        workflow_id: str,
        command_type: CommandType,
        name: str,
        arguments: object,
        *,
        request_id: str | None,
        run_id: str | None,
    ) -> Answer:
        """Admit a signal or an update (contract §4); ``run_id`` selects a run."""
        ...

    def receipt(
        self, namespace: str, workflow_id: str, command_type: CommandType, request_id: str
    ) -> Answer | None:
        """The receipt a key names, or ``None`` when it has none."""
        ...

    def start_run(self, namespace: str, workflow_id: str) -> Mapping[str, object]:
        """Start a run (:data:`LIFECYCLE`); ``RunInfo.to_dict()``."""
        ...

    def close_run(self, namespace: str, workflow_id: str, status: str) -> Mapping[str, object]:
        """Close the current run as ``status`` (:data:`LIFECYCLE`); the closed run."""
        ...

    def continue_as_new(self, namespace: str, workflow_id: str) -> Mapping[str, object]:
        """Continue the current run as new (:data:`LIFECYCLE`); the successor run."""
        ...

    def apply_signal(self, namespace: str, workflow_id: str, command_id: str) -> Answer:
        """The engine delivers a signal (:data:`PROGRESS`); its receipt."""
        ...

    def complete_update(self, namespace: str, workflow_id: str, update_id: str, result: object) -> Answer:
        """The engine completes an update (:data:`PROGRESS`); its receipt."""
        ...

    def fail_update(self, namespace: str, workflow_id: str, update_id: str, failure: str) -> Answer:
        """The engine fails an update (:data:`PROGRESS`); its receipt."""
        ...

    def history(self, namespace: str, workflow_id: str) -> Sequence[Mapping[str, object]]:
        """The instance's event log, oldest first (:data:`HISTORY`): ``HistoryEvent.to_dict()``."""
        ...

    def prune(self, retention_days: int, now: datetime, dry_run: bool) -> Mapping[str, int]:
        """Prune by retention (:data:`PRUNE`); the counts (``runs``, ``commands``, ``updates``,
        ``events``)."""
        ...
