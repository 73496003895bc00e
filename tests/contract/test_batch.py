"""Batch admission (``admit_many``), run against every store: each answer is the single call's.

The property: a batch's answers, and what it writes, equal those of the same
commands admitted one by one, in order, on instances in the same state —
fresh keys, retries of committed receipts and of earlier items of the batch,
reused keys with another intent, refusals of closed or replaced runs, and bad
input, which is refused in its slot and writes nothing.
"""

from __future__ import annotations

import itertools
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from admission.errors import AdmissionError, InputError, InvalidCommandTypeError
from admission.intent import receipt_token
from admission.receipts import Admission, AdmissionService, BatchCommand, Decision, MemoryStore, Store
from admission.receipts._batch import BatchAdmission
from admission.sql import SqlStore

pytestmark = pytest.mark.async_stores("sqlite")

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
WORKFLOWS = ("open", "closed", "continued", "new")
"""The instances of one example: an open run, a completed run, a run continued as new, none at all."""
EXAMPLES = itertools.count()


def prepare(service: AdmissionService, ns: str) -> None:
    """The instances of one example, in namespace ``ns``, with one committed receipt."""
    service.start_run(ns, "open", run_id=f"{ns}-open-1")
    service.start_run(ns, "closed", run_id=f"{ns}-closed-1")
    service.close_run(ns, "closed", "completed")
    service.start_run(ns, "continued", run_id=f"{ns}-continued-1")
    service.continue_as_new(ns, "continued", new_run_id=f"{ns}-continued-2")
    service.admit_signal(ns, "open", "a", [1], request_id="k1")
    service.admit_update(ns, "continued", "a", [1], request_id="k1")


TOKENS = (receipt_token("signal", "k2"), receipt_token("update", "k2"))
"""Keys that spell another key's stored token: a lookup by raw key finds that key's receipt."""

# A command as drawn: (type, workflow, name, arguments, key, run).  The run is a suffix
# resolved in each example's namespace: None (the instance), "1", "2" or "9" (no such run).
Drawn = tuple[str, str, str, object, str | None, str | None]

commands = st.tuples(
    st.sampled_from(["signal", "update"]),
    st.sampled_from(WORKFLOWS),
    st.sampled_from(["a", "b", ""]),
    st.sampled_from([[1], [2], {"x": float("nan")}]),
    st.sampled_from([None, "k1", "k2", "k3", "", "workflow-signal:x", *TOKENS]),
    st.sampled_from([None, None, "1", "2", "9"]),
)
"""Names "" and arguments holding NaN are refused, keys "" and (on a signal) "workflow-signal:x" too."""


def command(ns: str, drawn: Drawn) -> BatchCommand:
    kind, workflow, name, arguments, key, run = drawn
    run_id = None if run is None else f"{ns}-{workflow}-{run}"
    return BatchCommand(kind, ns, workflow, name, arguments, key, run_id)  # type: ignore[arg-type]


def admit_alone(service: AdmissionService, item: BatchCommand) -> Admission | AdmissionError:
    admit = service.admit_signal if item.command_type == "signal" else service.admit_update
    try:
        return admit(
            item.namespace,
            item.workflow_id,
            item.name,
            item.arguments,
            request_id=item.request_id,
            run_id=item.run_id,
        )
    except InputError as refused:
        return refused


def comparable(ns: str, answers: list[Admission | AdmissionError], ids: dict[str, str]) -> list[object]:
    """Answers with this example's namespace and generated ids replaced by stable names."""

    def same(value: object) -> object:
        if isinstance(value, str):
            if value.startswith(ns):
                return "NS" + value[len(ns) :]
            return ids.setdefault(value, f"id-{len(ids)}") if value in ids or _generated(value) else value
        if isinstance(value, dict):
            return {k: same(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [same(v) for v in value]
        return value

    return [
        same(answer.to_dict()) if isinstance(answer, Admission) else (type(answer), answer.field)
        for answer in answers
    ]


def _generated(value: str) -> bool:
    return value.startswith("gen-")


def history(service: AdmissionService, ns: str) -> list[list[str]]:
    return [[e.event_type for e in service.history(ns, workflow)] for workflow in WORKFLOWS]


def check_batch_equals_one_by_one(store: Store, drawn: list[Drawn]) -> None:
    counter = itertools.count()
    example = next(EXAMPLES)
    # Ids unique in the store (one store serves every example), named for the comparison.
    service = AdmissionService(store, clock=lambda: NOW, new_id=lambda: f"gen-{example}-{next(counter)}")
    batch_ns, alone_ns = f"b{example}", f"s{example}"
    prepare(service, batch_ns)
    prepare(service, alone_ns)

    batch = service.admit_many([command(batch_ns, d) for d in drawn])
    alone = [admit_alone(service, command(alone_ns, d)) for d in drawn]

    assert comparable(batch_ns, batch, {}) == comparable(alone_ns, alone, {})
    assert history(service, batch_ns) == history(service, alone_ns)


@settings(max_examples=60)
@given(drawn=st.lists(commands, max_size=12))
def test_a_batch_answers_as_its_commands_admitted_one_by_one_in_order_in_memory(drawn: list[Drawn]) -> None:
    check_batch_equals_one_by_one(MemoryStore(), drawn)


def test_a_batch_answers_as_its_commands_admitted_one_by_one_in_order(store: Store) -> None:
    # Memory has its own run above; on SQL a few examples, fewer on PostgreSQL (seconds).
    examples = 10 if not isinstance(store, SqlStore) or not store.postgres else 5

    @settings(max_examples=examples, database=None)
    @given(drawn=st.lists(commands, min_size=1, max_size=10))
    def on_this_store(drawn: list[Drawn]) -> None:
        check_batch_equals_one_by_one(store, drawn)

    on_this_store()


@pytest.fixture
def service(store: Store) -> AdmissionService:
    return AdmissionService(store, clock=lambda: NOW)


def test_a_second_item_with_an_earlier_items_key_is_its_retry_or_a_conflict(
    service: AdmissionService,
) -> None:
    service.start_run("ns", "wf")
    first, retry, changed = service.admit_many(
        [
            BatchCommand("update", "ns", "wf", "approve", {"n": 1}, request_id="k"),
            BatchCommand("update", "ns", "wf", "approve", {"n": 1}, request_id="k"),
            BatchCommand("update", "ns", "wf", "approve", {"n": 2}, request_id="k"),
        ]
    )
    assert isinstance(first, Admission) and isinstance(retry, Admission) and isinstance(changed, Admission)
    assert first.decision is Decision.FRESH and first.outcome == "accepted"
    assert retry.decision is Decision.RETAINED and retry.command_id == first.command_id
    assert retry.update_id == first.update_id
    assert changed.decision is Decision.CONFLICT and changed.conflict == ("arguments",)
    assert [e.event_type for e in service.history("ns", "wf")] == ["RunStarted", "UpdateAccepted"]


def test_a_bad_item_gets_its_typed_error_writes_nothing_and_the_others_go_on(
    service: AdmissionService,
) -> None:
    service.start_run("ns", "wf")
    answers = service.admit_many(
        [
            BatchCommand("signal", "ns", "wf", "go", [1], request_id="k1"),
            BatchCommand("signal", "ns", "wf", "go", [1], request_id="x" * 256),
            BatchCommand("signal", "ns", "wf", "n" * 256, [1], request_id="k2"),
            BatchCommand("chore", "ns", "wf", "go", [1]),  # type: ignore[arg-type]
            ("signal", "ns", "wf", "go", [1]),  # type: ignore[list-item]
            BatchCommand("signal", "ns", "wf", "go", [2], request_id="k3"),
        ]
    )
    fresh = [a for a in answers if isinstance(a, Admission)]
    assert [a.request_id for a in fresh] == ["k1", "k3"]
    assert [answers.index(a) for a in fresh] == [0, 5]
    refused = answers[1:5]
    assert [(type(e).__name__, getattr(e, "field", None)) for e in refused] == [
        ("InvalidRequestIdError", "request_id"),
        ("InvalidValueError", "name"),
        ("InvalidCommandTypeError", "command_type"),
        ("InputError", "commands"),
    ]
    assert isinstance(refused[2], InvalidCommandTypeError)
    assert [e.event_type for e in service.history("ns", "wf")] == [
        "RunStarted",
        "SignalReceived",
        "SignalReceived",
    ]
    assert service.receipt("ns", "wf", "signal", "k2") is None


def test_an_empty_batch_answers_nothing_and_writes_nothing(service: AdmissionService) -> None:
    assert service.admit_many([]) == []
    assert service.store.find_instance("ns", "wf") is None


def test_a_batch_of_only_bad_items_opens_no_transaction(service: AdmissionService) -> None:
    [refused] = service.admit_many([BatchCommand("signal", "ns", "wf", "", [1])])
    assert isinstance(refused, InputError) and refused.field == "name"
    assert service.store.find_instance("ns", "wf") is None


def test_a_batch_over_many_instances_creates_each_instance_once(service: AdmissionService) -> None:
    items = [BatchCommand("signal", "ns", f"wf-{i % 3}", "go", [i], request_id=f"k{i}") for i in range(9)]
    answers = service.admit_many(items)
    assert all(isinstance(a, Admission) and a.outcome == "run_not_active" for a in answers)
    for i in range(3):
        assert [e.event_type for e in service.history("ns", f"wf-{i}")] == ["CommandRejected"] * 3
    again = service.admit_many(items)
    assert all(isinstance(a, Admission) and a.retained for a in again)


def test_a_failing_batch_commits_none_of_its_items(store: Store) -> None:
    calls = itertools.count()

    def new_id() -> str:
        # Ids 0 and 1 start the run; 2 and 3 are the batch's two instances (before the
        # transaction); 4 and 5 the first two items' commands; 6, the third item's, is
        # taken under the locks after two inserts, and its column refuses it.
        call = next(calls)
        return "x" * 100 if call == 6 else f"id-{call}"

    service = AdmissionService(store, clock=lambda: NOW, new_id=new_id)
    service.start_run("ns", "a")
    items = [BatchCommand("signal", "ns", w, "go", [i], request_id=f"k{i}") for i, w in enumerate("abab")]
    with pytest.raises(InputError) as refused:
        service.admit_many(items)
    assert refused.value.field == "new_id"
    assert service.store.find_instance("ns", "b") is None
    assert [e.event_type for e in service.history("ns", "a")] == ["RunStarted"]
    assert all(service.receipt("ns", w, "signal", f"k{i}") is None for i, w in enumerate("abab"))


def test_a_batch_larger_than_one_read_statement_answers_every_command(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 80 instances (70 with a committed receipt, 10 new) and 150 keyed commands: more than one
    # statement's worth of instances and of keys for a batch's reads on SQLite (CHUNK, 64 each).
    service = AdmissionService(store)
    # A key the lookup missed would still be answered right, by deciding the batch again after
    # its rows met the key: each batch here must be decided once, from what its lookup found.
    decided = []
    decide = BatchAdmission._admit_ready

    def counted(self: BatchAdmission, *args: Any) -> None:
        decided.append(1)
        decide(self, *args)

    monkeypatch.setattr(BatchAdmission, "_admit_ready", counted)
    ns = f"big-{next(EXAMPLES)}"
    workflows = [f"wf-{i}" for i in range(80)]
    committed = {}
    for workflow in workflows[:70]:
        service.start_run(ns, workflow)
        committed[workflow] = service.admit_signal(ns, workflow, "s", [1], request_id=f"old-{workflow}")
    retries = [BatchCommand("signal", ns, w, "s", [1], request_id=f"old-{w}") for w in workflows[:70]]
    fresh = [BatchCommand("signal", ns, w, "s", [2], request_id=f"new-{w}") for w in workflows]
    answers = service.admit_many(
        [item for pair in zip(fresh, retries, strict=False) for item in pair] + fresh[70:]
    )
    assert all(isinstance(a, Admission) for a in answers)
    by_key = {a.request_id: a for a in answers if isinstance(a, Admission)}
    assert len(by_key) == 150
    for workflow in workflows[:70]:
        again = by_key[f"old-{workflow}"]
        assert (again.decision, again.command_id) == (Decision.RETAINED, committed[workflow].command_id)
        assert by_key[f"new-{workflow}"].outcome == "received"
    for workflow in workflows[70:]:
        # No run there: the fresh refusal of a command for an instance the batch created.
        assert by_key[f"new-{workflow}"].decision is Decision.FRESH
        assert by_key[f"new-{workflow}"].outcome == "run_not_active"
    # Admitted again, the batch answers every command with its receipt.
    again = service.admit_many(
        [item for pair in zip(fresh, retries, strict=False) for item in pair] + fresh[70:]
    )
    assert [a.decision for a in again if isinstance(a, Admission)] == [Decision.RETAINED] * 150
    assert len(decided) == 2
