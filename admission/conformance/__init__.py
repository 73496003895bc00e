"""A conformance kit for the retry contract: property-based checks of any implementation.

The adapter interface (:class:`Target`) says what the kit needs of a target; the
strategies, the reference model, the state machine, the adapters and the runner
build on it (``docs/conformance.md``).  :func:`machine_for` builds the state
machine over a target; :class:`ServiceTarget` and :class:`AsyncServiceTarget`
are targets over admission's own services (on any store), :class:`HttpTarget`
over any server that speaks the wire contract; :func:`run_conformance` runs the
machine and returns its :class:`Report`.

The pytest plugin (``_plugin``, an entry point that every pytest run loads) lives
in this package, so what this face imports when it loads must not import
hypothesis, httpx or pytest: the names that need them are loaded on first use.
"""

from typing import TYPE_CHECKING

from admission.conformance._http_target import ConformanceTargetError, HttpTarget, LifecycleHooks
from admission.conformance._runner import Failure, Report, load_replay, run_conformance
from admission.conformance._service_targets import AsyncServiceTarget, ServiceTarget
from admission.conformance._spellings import same, same_value_variants
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

if TYPE_CHECKING:
    from admission.conformance._machine import Options, Stats, machine_for
    from admission.conformance._plugin import test_retry_contract
    from admission.conformance._strategies import (
        CommandSpec,
        argument_pools,
        arguments,
        command_keys,
        command_sequences,
        intent_values,
        key_pools,
        twins,
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
    "CommandSpec",
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
    "argument_pools",
    "arguments",
    "command_keys",
    "command_sequences",
    "intent_values",
    "key_pools",
    "load_replay",
    "machine_for",
    "run_conformance",
    "same",
    "same_value_variants",
    "test_retry_contract",
    "twins",
]

_MACHINE_NAMES = frozenset({"Options", "Stats", "machine_for"})
_STRATEGY_NAMES = frozenset(
    {
        "CommandSpec",
        "argument_pools",
        "arguments",
        "command_keys",
        "command_sequences",
        "intent_values",
        "key_pools",
        "twins",
    }
)


def __getattr__(name: str) -> object:
    # The machine and the strategies (hypothesis) and the pytest test (pytest) load on first use.
    if name in _MACHINE_NAMES:
        from admission.conformance import _machine

        return getattr(_machine, name)
    if name in _STRATEGY_NAMES:
        from admission.conformance import _strategies

        return getattr(_strategies, name)
    if name == "test_retry_contract":
        from admission.conformance._plugin import test_retry_contract

        return test_retry_contract
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
