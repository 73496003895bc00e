"""A conformance kit for the retry contract: property-based checks of any implementation.

The adapter interface (:class:`Target`) says what the kit needs of a target; the
strategies, the reference model, the state machine, the adapters and the runner
build on it (``docs/conformance.md``).

The pytest plugin (``_plugin``, an entry point that every pytest run loads) lives
in this package, so what this face imports when it loads must not import
hypothesis, httpx or pytest: names that need them are loaded on first use.
"""

from admission.conformance._http_target import ConformanceTargetError, HttpTarget, LifecycleHooks
from admission.conformance._runner import Failure, Report, load_replay, run_conformance
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
    "ConformanceTargetError",
    "Failure",
    "HttpTarget",
    "LifecycleHooks",
    "Refusal",
    "Report",
    "Target",
    "load_replay",
    "run_conformance",
    "test_retry_contract",
]


def __getattr__(name: str) -> object:
    # The pytest test is loaded on demand, so that ``import admission.conformance`` never imports pytest.
    if name == "test_retry_contract":
        from admission.conformance._plugin import test_retry_contract

        return test_retry_contract
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
