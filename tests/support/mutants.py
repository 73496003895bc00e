"""Deliberately broken targets: the conformance kit must catch every one of them.

Each mutant wraps a correct in-process target (``ServiceTarget.memory()``) and
changes exactly one behaviour, one that a real implementation gets wrong: a
store that compares too little, a column that truncates, a retry path that
forgets it is a retry.  The docstring of each says which rule of the contract
it breaks.  ``tests/integration/test_conformance_mutants.py`` runs the kit
against each and requires a failure with a shrunk counterexample;
``tools/conformance_mutants.py`` measures how often and how fast it catches them.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Final

from admission.conformance import Answer, Target
from admission.errors import AdmissionError
from admission.intent import validate_request_id

Key = tuple[str, str, str, str]
"""(namespace, workflow_id, command type, request id): a receipt's uniqueness scope (contract §2.6)."""


def memory_target() -> Target:
    """The correct in-process target every mutant wraps."""
    from admission.conformance import ServiceTarget

    return ServiceTarget.memory()


class Mutant:
    """A target that delegates every call to ``inner``; a subclass overrides the one behaviour it breaks.

    ``answer`` and ``forward_key`` are the two hooks most mutants need: what the
    caller sees of an admission answer, and which key the inner target is asked for.
    """

    rule: str = ""
    """The rule of the contract the mutant breaks (its docstring's first line, for reports)."""

    def __init__(self, inner: Target | None = None) -> None:
        self.inner = inner if inner is not None else memory_target()
        self.name = f"{type(self).__name__}({self.inner.name})"
        self.capabilities = self.inner.capabilities
        self.strips_keys = self.inner.strips_keys

    # The machine sets the clock on the target; the inner target is the one that reads it.
    @property
    def now(self) -> datetime:
        return self.inner.now

    @now.setter
    def now(self, value: datetime) -> None:
        self.inner.now = value

    def begin(self, example: int) -> None:
        self.reset()
        self.inner.begin(example)

    def reset(self) -> None:
        """Forget what the mutant remembers between calls (a new example starts on a fresh store)."""

    def forward_key(self, key: Key) -> str:
        """The key the inner target is asked for (the caller's own, unless the mutant rewrites it)."""
        return key[3]

    def caller_key(self, forwarded: object) -> object:
        """The key a caller sees in an answer, from the one the inner target echoed."""
        return forwarded

    def answer(self, key: Key | None, answer: Answer) -> Answer:
        """What the caller sees of an admission answer; ``key`` is ``None`` for an unkeyed command."""
        return self.restore_keys(answer)

    def restore_keys(self, answer: Answer) -> Answer:
        body = dict(answer.body)
        if "request_id" in body:
            body["request_id"] = self.caller_key(body["request_id"])
        return Answer(answer.status, body)

    def arguments(self, key: Key | None, name: str, arguments: object) -> object:
        """The arguments the inner target is asked to admit."""
        return arguments

    def admit(
        self,
        namespace: str,
        workflow_id: str,
        command_type: str,
        name: str,
        arguments: object,
        *,
        request_id: str | None,
        run_id: str | None,
    ) -> Answer:
        key = None if request_id is None else (namespace, workflow_id, command_type, request_id)
        forwarded = request_id if key is None or not valid(key) else self.forward_key(key)
        got = self.inner.admit(
            namespace,
            workflow_id,
            command_type,  # type: ignore[arg-type]
            name,
            self.arguments(key, name, arguments),
            request_id=forwarded,
            run_id=run_id,
        )
        return self.answer(key, got)

    def receipt(self, namespace: str, workflow_id: str, command_type: str, request_id: str) -> Answer | None:
        key = (namespace, workflow_id, command_type, request_id)
        forwarded = self.forward_key(key) if valid(key) else request_id
        got = self.inner.receipt(namespace, workflow_id, command_type, forwarded)  # type: ignore[arg-type]
        return None if got is None else self.restore_keys(got)

    def start_run(self, namespace: str, workflow_id: str) -> Mapping[str, object]:
        return self.inner.start_run(namespace, workflow_id)

    def close_run(self, namespace: str, workflow_id: str, status: str) -> Mapping[str, object]:
        return self.inner.close_run(namespace, workflow_id, status)

    def continue_as_new(self, namespace: str, workflow_id: str) -> Mapping[str, object]:
        return self.inner.continue_as_new(namespace, workflow_id)

    def apply_signal(self, namespace: str, workflow_id: str, command_id: str) -> Answer:
        return self.restore_keys(self.inner.apply_signal(namespace, workflow_id, command_id))

    def complete_update(self, namespace: str, workflow_id: str, update_id: str, result: object) -> Answer:
        return self.restore_keys(self.inner.complete_update(namespace, workflow_id, update_id, result))

    def fail_update(self, namespace: str, workflow_id: str, update_id: str, failure: str) -> Answer:
        return self.restore_keys(self.inner.fail_update(namespace, workflow_id, update_id, failure))

    def history(self, namespace: str, workflow_id: str) -> Sequence[Mapping[str, object]]:
        events = self.inner.history(namespace, workflow_id)
        return [{k: self.restore_strings(v) for k, v in event.items()} for event in events]

    def restore_strings(self, value: object) -> object:
        """``value`` with every string the mutant put in place of a caller's key put back (events)."""
        if isinstance(value, str):
            return self.caller_key(value)
        if isinstance(value, list):
            return [self.restore_strings(item) for item in value]
        if isinstance(value, Mapping):
            return {k: self.restore_strings(v) for k, v in value.items()}
        return value

    def prune(self, retention_days: int, now: datetime, dry_run: bool) -> Mapping[str, int]:
        return self.inner.prune(retention_days, now, dry_run)


def valid(key: Key) -> bool:
    """Whether the core accepts the key (contract §2.3, §2.4): only those reach a mutant's change."""
    try:
        validate_request_id(key[3], key[2])
    except AdmissionError:
        return False
    return True


def rewrite_numbers(value: object, change: Callable[[float], object]) -> object:
    """``value`` with ``change`` applied to every float in it, at any depth."""
    if isinstance(value, float):
        return change(value)
    if isinstance(value, (list, tuple)):
        return [rewrite_numbers(item, change) for item in value]
    if isinstance(value, dict):
        return {k: rewrite_numbers(v, change) for k, v in value.items()}
    return value


class IgnoresArguments(Mutant):
    """Judges a retry by name and target only (breaks contract §3 "intent record" and §4 conflict).

    The first arguments admitted under a key are remembered and every later
    request with that key is judged as if it carried them: a retry with changed
    arguments gets the retained receipt instead of a 409 ``request_id_conflict``.
    """

    def reset(self) -> None:
        self.first: dict[Key, object] = {}

    def arguments(self, key: Key | None, name: str, arguments: object) -> object:
        if key is None or not valid(key):
            return arguments
        if key in self.first and self.inner.receipt(*key) is not None:  # type: ignore[arg-type]
            return self.first[key]
        self.first[key] = arguments
        return arguments


INT64: Final = (-(2**63), 2**63 - 1)


class IntFloat(Mutant):
    """Treats ``1`` and ``1.0`` as one intent (breaks contract §3: "``1`` and ``1.0`` differ").

    Integral floats are taken as ints before judging and storing, as a JSON
    layer that parses numbers into one numeric type would.
    """

    def arguments(self, key: Key | None, name: str, arguments: object) -> object:
        def change(number: float) -> object:
            if number.is_integer() and INT64[0] <= number <= INT64[1]:
                return int(number)
            return number

        return rewrite_numbers(arguments, change)


class SignedZero(Mutant):
    """Treats ``0.0`` and ``-0.0`` as one intent (breaks contract §3: "``-0.0`` keeps its sign")."""

    def arguments(self, key: Key | None, name: str, arguments: object) -> object:
        return rewrite_numbers(arguments, lambda number: 0.0 if number == 0.0 else number)


class RetryAsFresh(Mutant):
    """Answers a retry as fresh (breaks contract §4 "retained"): ``retained: false`` and 202, as if new."""

    def answer(self, key: Key | None, answer: Answer) -> Answer:
        if answer.body.get("retained") is not True:
            return answer
        body = {**answer.body, "retained": False}
        if "http_status" in body:
            body["http_status"] = 202
        return Answer(202, body)


def alias(key: str, generation: int) -> str:
    """A stand-in key the caller never sends: where a receipt "lost" by a mutant is forgotten."""
    return f"~lost{generation}~{hashlib.sha256(key.encode('utf-8', 'surrogatepass')).hexdigest()[:48]}"


class AliasingMutant(Mutant):
    """A mutant that forgets receipts by asking the inner target for a stand-in key from some point on."""

    def reset(self) -> None:
        self.aliases: dict[Key, str] = {}
        self.callers: dict[str, str] = {}

    def forward_key(self, key: Key) -> str:
        return self.aliases.get(key, key[3])

    def caller_key(self, forwarded: object) -> object:
        return self.callers.get(forwarded, forwarded) if isinstance(forwarded, str) else forwarded

    def forget(self, key: Key, generation: int) -> None:
        stand_in = alias(key[3], generation)
        self.aliases[key] = stand_in
        self.callers[stand_in] = key[3]


class ConflictConsumesKey(AliasingMutant):
    """A conflicting request consumes the key (breaks contract §4: "the key is not consumed").

    After a 409 ``request_id_conflict`` the key no longer finds its original
    receipt: the next retry of the original intent is admitted fresh.
    """

    def reset(self) -> None:
        super().reset()
        self.conflicts = 0

    def answer(self, key: Key | None, answer: Answer) -> Answer:
        seen = self.restore_keys(answer)
        if key is not None and answer.body.get("outcome") == "request_id_conflict":
            self.conflicts += 1
            self.forget(key, self.conflicts)
        return seen


class LosesReceiptsAtContinueAsNew(AliasingMutant):
    """Loses receipts at continue-as-new (breaks contract §5: "Receipts outlive ... continue-as-new").

    After an instance continues as new, the keys of its earlier commands no
    longer find their receipts: a retry is admitted fresh on the successor run.
    """

    def reset(self) -> None:
        super().reset()
        self.generation: dict[tuple[str, str], int] = {}
        self.used: dict[tuple[str, str], set[Key]] = {}

    def forward_key(self, key: Key) -> str:
        self.used.setdefault(key[:2], set()).add(key)
        return super().forward_key(key)

    def continue_as_new(self, namespace: str, workflow_id: str) -> Mapping[str, object]:
        successor = self.inner.continue_as_new(namespace, workflow_id)
        instance = (namespace, workflow_id)
        self.generation[instance] = self.generation.get(instance, 0) + 1
        for key in self.used.pop(instance, set()):
            self.forget(key, self.generation[instance])
        return successor


class NewIdOnRetained(Mutant):
    """A retained answer carries a new command id (breaks contract §4/§5: "the original receipt
    with its original identities")."""

    def answer(self, key: Key | None, answer: Answer) -> Answer:
        if answer.body.get("retained") is not True or "command_id" not in answer.body:
            return answer
        return Answer(answer.status, {**answer.body, "command_id": str(uuid.uuid4())})


class TrimsKeys(Mutant):
    """Strips surrounding whitespace from keys in the core (breaks contract §2.1: "The core never
    trims"), so ``" k"`` and ``"k"`` are one key; a blank key becomes no key, as over HTTP."""

    def admit(
        self,
        namespace: str,
        workflow_id: str,
        command_type: str,
        name: str,
        arguments: object,
        *,
        request_id: str | None,
        run_id: str | None,
    ) -> Answer:
        trimmed = request_id.strip() or None if isinstance(request_id, str) else request_id
        return super().admit(
            namespace, workflow_id, command_type, name, arguments, request_id=trimmed, run_id=run_id
        )

    def receipt(self, namespace: str, workflow_id: str, command_type: str, request_id: str) -> Answer | None:
        trimmed = request_id.strip()
        return super().receipt(namespace, workflow_id, command_type, trimmed) if trimmed else None


MAX_KEY_BYTES: Final = 255


class TruncatesKeys(Mutant):
    """Keeps keys in a 255-byte column that truncates (breaks contract §2.2: up to 255 code points,
    compared byte-exact on the UTF-8 form): two long keys of multi-byte characters that share their
    first 255 bytes become one key, and a receipt read back carries the cut key."""

    def reset(self) -> None:
        self.callers: dict[str, str] = {}

    def forward_key(self, key: Key) -> str:
        cut = key[3].encode("utf-8")[:MAX_KEY_BYTES].decode("utf-8", "ignore")
        return cut or key[3]

    def answer(self, key: Key | None, answer: Answer) -> Answer:
        # A fresh answer echoes the request; a retained one reads the stored (cut) key back.
        if key is not None and answer.body.get("retained") is False and "request_id" in answer.body:
            return Answer(answer.status, {**answer.body, "request_id": key[3]})
        return answer

    def restore_keys(self, answer: Answer) -> Answer:
        return answer


MUTANTS: Final[dict[str, type[Mutant]]] = {
    "ignores-arguments": IgnoresArguments,
    "int-float": IntFloat,
    "signed-zero": SignedZero,
    "retry-as-fresh": RetryAsFresh,
    "conflict-consumes-key": ConflictConsumesKey,
    "loses-receipts-at-continue-as-new": LosesReceiptsAtContinueAsNew,
    "new-id-on-retained": NewIdOnRetained,
    "trims-keys": TrimsKeys,
    "truncates-keys": TruncatesKeys,
}
"""Every mutant by its name in reports."""
