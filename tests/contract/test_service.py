"""The admission contract (§2, §4, §5), run against every store: memory, SQLite, PostgreSQL."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from admission import InvalidRequestIdError, InvalidValueError, ReservedRequestIdError
from admission.errors import RunStateError, UnknownUpdateError
from admission.receipts import AdmissionService, Decision, EventCursor, Store
from admission.sql import SqlStore

pytestmark = pytest.mark.async_stores

NS = "tenant-a"
WF = "order-1"


class Clock:
    """A clock that advances one millisecond per reading, so every time is distinct."""

    def __init__(self) -> None:
        self.now = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        self.now += timedelta(milliseconds=1)
        return self.now


@pytest.fixture
def service(store: Store) -> AdmissionService:
    counter = itertools.count(1)
    return AdmissionService(store, clock=Clock(), new_id=lambda: f"id-{next(counter):04d}")


@pytest.fixture
def run_id(service: AdmissionService) -> str:
    return service.start_run(NS, WF).run_id


def event_count(service: AdmissionService, namespace: str = NS, workflow_id: str = WF) -> int:
    return len(service.history(namespace, workflow_id))


def test_fresh_signal_is_received_with_a_new_command(service: AdmissionService, run_id: str) -> None:
    answer = service.admit_signal(NS, WF, "approve", {"amount": 12.5}, request_id="k-1")
    assert answer.decision is Decision.FRESH
    assert (answer.outcome, answer.http_status, answer.retained, answer.intent_verified) == (
        "received",
        202,
        False,
        True,
    )
    assert answer.run_id == run_id and answer.command_id and answer.request_id == "k-1"
    assert [e.event_type for e in service.history(NS, WF)] == ["RunStarted", "SignalReceived"]


def test_retry_with_same_intent_returns_the_original_receipt_and_writes_nothing(
    service: AdmissionService, run_id: str
) -> None:
    first = service.admit_signal(NS, WF, "approve", {"b": 2, "a": 1}, request_id="k-1")
    events = event_count(service)
    again = service.admit_signal(NS, WF, "approve", {"a": 1, "b": 2}, request_id="k-1")
    assert again.decision is Decision.RETAINED and again.retained and again.intent_verified
    assert (again.command_id, again.run_id, again.received_at, again.command_sequence) == (
        first.command_id,
        first.run_id,
        first.received_at,
        first.command_sequence,
    )
    assert again.http_status == 202
    assert event_count(service) == events


@pytest.mark.parametrize(
    ("changed", "parts"),
    [
        ({"name": "reject"}, ["name"]),
        ({"arguments": {"amount": 12}}, ["arguments"]),
        ({"arguments": {"amount": "12.5"}}, ["arguments"]),
        ({"name": "reject", "arguments": [12.5]}, ["name", "arguments"]),
    ],
)
def test_reused_key_with_changed_intent_is_a_conflict_naming_the_parts(
    service: AdmissionService, run_id: str, changed: dict[str, object], parts: list[str]
) -> None:
    first = service.admit_update(NS, WF, "approve", {"amount": 12.5}, request_id="k-1")
    events = event_count(service)
    kwargs: dict[str, object] = {"name": "approve", "arguments": {"amount": 12.5}, **changed}
    answer = service.admit_update(NS, WF, kwargs["name"], kwargs["arguments"], request_id="k-1")  # type: ignore[arg-type]
    assert answer.decision is Decision.CONFLICT and answer.http_status == 409
    assert list(answer.conflict) == parts
    assert answer.retained_command_id == first.command_id
    assert answer.retained_command_type == "update" and answer.retained_outcome == "accepted"
    body = answer.to_dict()
    assert body["reason"] == "request_id_conflict" and body["request_id"] == "k-1"
    assert event_count(service) == events
    # The key is not consumed: the original intent still retains.
    assert service.admit_update(NS, WF, "approve", {"amount": 12.5}, request_id="k-1").retained


def test_conflict_on_target_when_a_retry_selects_a_run(service: AdmissionService, run_id: str) -> None:
    service.admit_signal(NS, WF, "go", [], request_id="k")
    answer = service.admit_signal(NS, WF, "go", [], request_id="k", run_id=run_id)
    assert answer.decision is Decision.CONFLICT and answer.conflict == ("target",)


def test_same_key_on_signal_and_update_are_independent_receipts(
    service: AdmissionService, run_id: str
) -> None:
    signal = service.admit_signal(NS, WF, "go", [], request_id="k")
    update = service.admit_update(NS, WF, "go", [], request_id="k")
    assert signal.decision is update.decision is Decision.FRESH
    assert signal.command_id != update.command_id


def test_namespaces_and_instances_never_interact(service: AdmissionService) -> None:
    for namespace, workflow_id in [(NS, WF), ("tenant-b", WF), (NS, "order-2")]:
        service.start_run(namespace, workflow_id)
    answers = [
        service.admit_signal(ns, wf, "go", [1], request_id="k")
        for ns, wf in [(NS, WF), ("tenant-b", WF), (NS, "order-2")]
    ]
    assert all(a.decision is Decision.FRESH for a in answers)
    assert len({a.command_id for a in answers}) == 3
    assert service.receipt("tenant-b", WF, "signal", "k").command_id == answers[1].command_id  # type: ignore[union-attr]


def test_keys_are_case_sensitive_and_unnormalised(service: AdmissionService, run_id: str) -> None:
    keys = ["k", "K", "caf\u00e9", "cafe\u0301"]
    answers = [service.admit_signal(NS, WF, "go", [], request_id=k) for k in keys]
    assert all(a.decision is Decision.FRESH for a in answers)


@pytest.mark.parametrize("key", ["a\x00b", "\U0001f600" * 255, "\u00e9" * 255, " padded "])
def test_literal_keys_round_trip_exactly(service: AdmissionService, run_id: str, key: str) -> None:
    first = service.admit_update(NS, WF, "go", [], request_id=key)
    receipt = service.receipt(NS, WF, "update", key)
    assert receipt is not None and receipt.request_id == key and receipt.command_id == first.command_id
    assert service.admit_update(NS, WF, "go", [], request_id=key).retained


def test_update_lifecycle_accepted_completed_and_retained_completed(
    service: AdmissionService, run_id: str
) -> None:
    accepted = service.admit_update(NS, WF, "resize", {"size": 3}, request_id="u-1")
    assert (accepted.outcome, accepted.http_status, accepted.update_status) == ("accepted", 202, "accepted")
    done = service.complete_update(NS, WF, accepted.update_id, {"ok": True, "size": 3})  # type: ignore[arg-type]
    assert (done.outcome, done.http_status, done.result) == ("completed", 200, {"ok": True, "size": 3})
    events = event_count(service)
    retry = service.admit_update(NS, WF, "resize", {"size": 3}, request_id="u-1")
    assert retry.retained and retry.http_status == 200 and retry.result == {"ok": True, "size": 3}
    assert retry.update_id == accepted.update_id and retry.command_id == accepted.command_id
    assert retry.to_dict()["result"] == {"ok": True, "size": 3}
    # Completing again with the same result is a retry, not a second effect.
    assert service.complete_update(NS, WF, accepted.update_id, {"ok": True, "size": 3}).retained  # type: ignore[arg-type]
    assert event_count(service) == events
    with pytest.raises(RunStateError):
        service.complete_update(NS, WF, accepted.update_id, {"ok": False})  # type: ignore[arg-type]


def test_completed_null_result_is_kept_explicitly(service: AdmissionService, run_id: str) -> None:
    accepted = service.admit_update(NS, WF, "ping", [], request_id="u-1")
    service.complete_update(NS, WF, accepted.update_id, None)  # type: ignore[arg-type]
    retry = service.admit_update(NS, WF, "ping", [], request_id="u-1")
    assert retry.update_status == "completed" and retry.result is None
    body = retry.to_dict()
    assert "result" in body and body["result"] is None


def test_failed_update_is_retained_as_422(service: AdmissionService, run_id: str) -> None:
    accepted = service.admit_update(NS, WF, "charge", [10], request_id="u-1")
    failed = service.fail_update(NS, WF, accepted.update_id, "card declined")  # type: ignore[arg-type]
    assert (failed.outcome, failed.http_status) == ("failed", 422)
    retry = service.admit_update(NS, WF, "charge", [10], request_id="u-1")
    assert retry.retained and retry.http_status == 422 and retry.failure == "card declined"


def test_unknown_update_is_a_typed_error(service: AdmissionService, run_id: str) -> None:
    with pytest.raises(UnknownUpdateError):
        service.complete_update(NS, WF, "no-such-update", 1)


def test_no_open_run_is_run_not_active_and_a_keyed_refusal_is_retained(service: AdmissionService) -> None:
    refused = service.admit_signal(NS, WF, "go", [], request_id="k")
    assert (refused.outcome, refused.http_status, refused.retained) == ("run_not_active", 409, False)
    service.start_run(NS, WF)
    again = service.admit_signal(NS, WF, "go", [], request_id="k")
    assert again.retained and again.outcome == "run_not_active" and again.command_id == refused.command_id
    assert service.admit_signal(NS, WF, "go", [], request_id="k2").outcome == "received"


def test_closed_run_refuses_fresh_commands(service: AdmissionService, run_id: str) -> None:
    service.close_run(NS, WF, "completed")
    answer = service.admit_update(NS, WF, "go", [])
    assert answer.outcome == "run_not_active" and answer.to_dict()["resolved_run_id"] == run_id


def test_selected_run_not_current_is_decided_in_the_lock_and_retained(
    service: AdmissionService, run_id: str
) -> None:
    successor = service.continue_as_new(NS, WF)
    refused = service.admit_signal(NS, WF, "go", [], request_id="k", run_id=run_id)
    assert refused.outcome == "rejected_not_current" and refused.http_status == 409
    body = refused.to_dict()
    assert body["reason"] == "selected_run_not_current"
    assert (body["requested_run_id"], body["resolved_run_id"]) == (run_id, successor.run_id)
    events = event_count(service)
    again = service.admit_signal(NS, WF, "go", [], request_id="k", run_id=run_id)
    assert (
        again.retained and again.outcome == "rejected_not_current" and again.command_id == refused.command_id
    )
    assert event_count(service) == events
    assert service.admit_signal(NS, WF, "go", [], run_id=successor.run_id).outcome == "received"


def test_unkeyed_commands_are_always_fresh(service: AdmissionService, run_id: str) -> None:
    a = service.admit_signal(NS, WF, "go", [])
    b = service.admit_signal(NS, WF, "go", [])
    assert a.command_id != b.command_id and b.command_sequence == a.command_sequence + 1  # type: ignore[operator]


def test_receipt_after_continue_as_new_is_the_original(service: AdmissionService, run_id: str) -> None:
    first = service.admit_update(NS, WF, "go", [1], request_id="u")
    service.continue_as_new(NS, WF)
    retry = service.admit_update(NS, WF, "go", [1], request_id="u")
    assert retry.retained and retry.command_id == first.command_id and retry.received_at == first.received_at


@pytest.mark.parametrize(
    ("call", "error", "field"),
    [
        (lambda s: s.admit_signal(NS, WF, "go", [], request_id=""), InvalidRequestIdError, "request_id"),
        (
            lambda s: s.admit_signal(NS, WF, "go", [], request_id="x" * 256),
            InvalidRequestIdError,
            "request_id",
        ),
        (
            lambda s: s.admit_signal(NS, WF, "go", [], request_id="workflow-signal:1"),
            ReservedRequestIdError,
            "request_id",
        ),
        (lambda s: s.admit_signal(NS, WF, "go", [{1, 2}], request_id="k"), InvalidValueError, "arguments"),
        (lambda s: s.admit_signal(NS, WF, "go", "text", request_id="k"), InvalidValueError, "arguments"),
        (lambda s: s.admit_signal(NS, WF, "", [], request_id="k"), InvalidValueError, "name"),
        (lambda s: s.admit_signal("", WF, "go", []), InvalidValueError, "namespace"),
        (lambda s: s.admit_signal(NS, "x" * 256, "go", []), InvalidValueError, "workflow_id"),
        (lambda s: s.admit_update(NS, WF, "go", [], run_id=""), InvalidValueError, "run_id"),
        (lambda s: s.admit_update(NS, "new-wf", "go", [2**64]), InvalidValueError, "arguments"),
    ],
)
def test_bad_input_gets_a_typed_error_naming_the_field_and_writes_nothing(
    service: AdmissionService, run_id: str, call: object, error: type[Exception], field: str
) -> None:
    before = event_count(service)
    with pytest.raises(error) as info:
        call(service)  # type: ignore[operator]
    assert getattr(info.value, "field") == field  # noqa: B009
    assert event_count(service) == before
    assert service.store.find_instance(NS, "new-wf") is None


def test_every_admission_refusal_and_transition_is_an_event(service: AdmissionService, run_id: str) -> None:
    update = service.admit_update(NS, WF, "go", [], request_id="u")
    service.complete_update(NS, WF, update.update_id, 1)  # type: ignore[arg-type]
    service.admit_signal(NS, WF, "go", [], run_id="not-a-run")
    service.continue_as_new(NS, WF)
    types = [e.event_type for e in service.history(NS, WF)]
    assert types == [
        "RunStarted",
        "UpdateAccepted",
        "UpdateCompleted",
        "CommandRejected",
        "RunClosed",
        "RunStarted",
    ]


def test_event_log_is_read_in_order_after_a_cursor(service: AdmissionService, run_id: str) -> None:
    for i in range(5):
        service.admit_signal(NS, WF, "go", [i])
    events = service.store.read_events(EventCursor(), 100)
    assert [e.event_type for e in events] == ["RunStarted"] + ["SignalReceived"] * 5
    cursor = EventCursor(events[2].tx_id, events[2].position)
    assert service.store.read_events(cursor, 100) == events[3:]
    assert service.store.read_events(cursor, 2) == events[3:5]


def test_to_dict_has_the_contract_fields(service: AdmissionService, run_id: str) -> None:
    body = service.admit_update(NS, WF, "go", [], request_id="u").to_dict()
    for field in (
        "request_id",
        "retained",
        "intent_verified",
        "command_id",
        "run_id",
        "outcome",
        "http_status",
        "update_id",
        "update_status",
    ):
        assert field in body, field


def test_start_run_while_open_is_refused(service: AdmissionService, run_id: str) -> None:
    with pytest.raises(RunStateError) as info:
        service.start_run(NS, WF)
    assert info.value.reason == "run_already_open"


def test_a_run_id_another_run_holds_is_refused_and_writes_nothing(
    service: AdmissionService, run_id: str
) -> None:
    # A caller's chosen run id that another instance's run holds: a typed refusal on every store,
    # never a storage error to retry, and the other instance is not made.
    with pytest.raises(RunStateError) as info:
        service.start_run(NS, "other", run_id=run_id)
    assert (info.value.reason, info.value.run_id) == ("run_id_taken", run_id)
    assert service.store.find_instance(NS, "other") is None
    assert [e.event_type for e in service.history(NS, WF)] == ["RunStarted"]


# -- the caller owns the transaction (SQL stores) ---------------------------------------------


@pytest.fixture
def sql_service(db_url: str) -> Iterator[AdmissionService]:
    store = SqlStore.open(db_url)
    service = AdmissionService(store, clock=Clock())
    service.start_run(NS, WF)
    yield service
    store.dispose()


def test_admission_inside_the_callers_transaction_commits_with_it(sql_service: AdmissionService) -> None:
    store = sql_service.store
    assert isinstance(store, SqlStore)
    with store.begin() as conn:
        answer = sql_service.admit_signal(NS, WF, "go", [], request_id="k", connection=conn)
        assert answer.decision is Decision.FRESH
    assert sql_service.receipt(NS, WF, "signal", "k") is not None


def test_admission_inside_the_callers_transaction_rolls_back_with_it(sql_service: AdmissionService) -> None:
    store = sql_service.store
    assert isinstance(store, SqlStore)
    with pytest.raises(RuntimeError, match="caller fails"), store.begin() as conn:
        sql_service.admit_signal(NS, WF, "go", [], request_id="k", connection=conn)
        raise RuntimeError("caller fails after admission")
    assert sql_service.receipt(NS, WF, "signal", "k") is None
    assert sql_service.admit_signal(NS, WF, "go", [], request_id="k").decision is Decision.FRESH


def test_unique_index_backstop_answers_instead_of_raising(service: AdmissionService, run_id: str) -> None:
    from dataclasses import replace

    first = service.admit_signal(NS, WF, "go", [], request_id="k")
    now = datetime(2026, 11, 29, tzinfo=UTC)
    with service.store.locked(NS, WF, created_at=now, new_id="unused") as tx:
        row = tx.get_command(first.command_id)  # type: ignore[arg-type]
        assert row is not None
        clash = replace(row, id="other", command_sequence=tx.next_command_sequence())
        assert tx.insert_command(clash) is False


class _BlindStore:
    """A store whose unlocked read misses committed receipts: as if another caller
    had committed the key between that read and the lock."""

    def __init__(self, inner: Store) -> None:
        self._inner = inner

    def read_receipts(self, *args: object) -> list[object]:
        return []

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)


def test_the_unique_index_backstop_turns_a_duplicate_into_the_retained_answer(
    service: AdmissionService, run_id: str
) -> None:
    first = service.admit_update(NS, WF, "go", [1], request_id="k")
    events = event_count(service)
    blind = AdmissionService(_BlindStore(service.store), clock=Clock())  # type: ignore[arg-type]
    again = blind.admit_update(NS, WF, "go", [1], request_id="k")
    assert again.decision is Decision.RETAINED and again.command_id == first.command_id
    changed = blind.admit_update(NS, WF, "go", [2], request_id="k")
    assert changed.decision is Decision.CONFLICT and changed.conflict == ("arguments",)
    assert event_count(service) == events
