"""A conformance kit for the retry contract: property-based checks of any implementation.

The adapter interface (:class:`Target`) says what the kit needs of a target; the
strategies, the reference model, the state machine, the adapters and the runner
build on it (``docs/conformance.md``).  :func:`machine_for` builds the state
machine over a target; :class:`ServiceTarget` and :class:`AsyncServiceTarget`
are targets over admission's own services (on any store).
"""

from admission.conformance._http_target import ConformanceTargetError, HttpTarget, LifecycleHooks
from admission.conformance._machine import Options, Stats, machine_for
from admission.conformance._runner import Failure, Report, load_replay, run_conformance
from admission.conformance._service_targets import AsyncServiceTarget, ServiceTarget
from admission.conformance._target import (
    CAPABILITIES,
    CLOCK,
    HISTORY,
    LIFECYCLE,
    PROGRESS,
    PRUNE,
    REFUSAL_REASONS,
    Answer,
    Refusal,
    Target,
)

__all__ = [
    "CAPABILITIES",
    "CLOCK",
    "HISTORY",
    "LIFECYCLE",
    "PROGRESS",
    "PRUNE",
    "REFUSAL_REASONS",
    "Answer",
    "AsyncServiceTarget",
    "ConformanceTargetError",
    "Failure",
    "HttpTarget",
    "LifecycleHooks",
    "Options",
    "Refusal",
    "Report",
    "ServiceTarget",
    "Stats",
    "Target",
    "load_replay",
    "machine_for",
    "run_conformance",
]
