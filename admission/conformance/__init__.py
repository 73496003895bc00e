"""A conformance kit for the retry contract: property-based checks of any implementation.

The adapter interface (:class:`Target`) says what the kit needs of a target; the
strategies, the reference model, the state machine, the adapters and the runner
build on it (``docs/conformance.md``).
"""

from admission.conformance._spellings import same, same_value_variants
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
    "CommandSpec",
    "Refusal",
    "Target",
    "argument_pools",
    "arguments",
    "command_keys",
    "command_sequences",
    "intent_values",
    "key_pools",
    "same",
    "same_value_variants",
    "twins",
]
