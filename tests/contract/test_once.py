"""The front door (docs/once.md): a handler runs once per command key, on every store.

Also the service steps it stands on: ``release_update`` and ``take_over_update``
(docs/lifecycle.md, "Releasing a key"), and the pure takeover rule.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from admission.aio import AsyncAdmissionService, AsyncOnce, open_store
from admission.errors import (
    InvalidValueError,
    RequestIdConflictError,
    RunStateError,
    UpdateFailedError,
    UpdateInProgressError,
)
from admission.receipts import (
    IN_PROGRESS_EXPIRED,
    AdmissionService,
    MemoryStore,
    Once,
    Store,
    may_take_over,
)
from tests.support.backends import SQL_BACKENDS, PostgresPool, database_url

NS = "payments"
T0 = datetime(2026, 1, 1, tzinfo=UTC)


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def service(store: Store, clock: Clock) -> AdmissionService:
    return AdmissionService(store, clock=clock)


def event_types(service: AdmissionService, workflow_id: str) -> list[str]:
    return [e.event_type for e in service.history(NS, workflow_id)]


# -- the pure rule ---------------------------------------------------------------------------------


@given(
    accepted=st.datetimes(datetime(2000, 1, 1), datetime(2100, 1, 1), timezones=st.just(UTC)),
    age=st.timedeltas(min_value=timedelta(days=-3), max_value=timedelta(days=3)),
    expiry=st.none() | st.timedeltas(min_value=timedelta(microseconds=1), max_value=timedelta(days=2)),
)
def test_only_an_update_older_than_a_given_expiry_may_be_taken_over(
    accepted: datetime, age: timedelta, expiry: timedelta | None
) -> None:
    now = accepted + age
    allowed = may_take_over(now, accepted, expiry)
    # No expiry: never, however old (a live handler is not an orphan because no deadline was set).
    assert allowed == (expiry is not None and age > expiry)
    if allowed:
        assert expiry is not None
        # Monotone: later is allowed too; a clock before the acceptance never is.
        assert may_take_over(now + timedelta(seconds=1), accepted, expiry)
    assert not may_take_over(accepted - abs(age), accepted, expiry)


@settings(max_examples=60, deadline=None)
@given(
    policy=st.sampled_from(["keep", "release"]),
    calls=st.lists(
        st.tuples(st.sampled_from(["a", "b", "c"]), st.integers(0, 2), st.booleans()), max_size=25
    ),
)
def test_the_handler_runs_exactly_when_a_model_of_the_key_says_so(
    policy: str, calls: list[tuple[str, int, bool]]
) -> None:
    """Any sequence of calls (key, argument, whether the handler raises): the handler runs only
    for a key with no live record, a retry of a completed call gets its value, a kept failure
    is raised again, a released one runs again, and other arguments are a conflict."""
    once = Once(AdmissionService(MemoryStore()), namespace=NS, on_failure=policy)  # type: ignore[arg-type]
    runs: list[tuple[str, int]] = []
    raising: dict[str, bool] = {}

    @once(name="step")
    def step(key: str, n: int) -> list[object]:
        runs.append((key, n))
        if raising[key]:
            raise LookupError
        return [key, n]

    model: dict[str, tuple[str, int]] = {}  # key -> ("completed" | "failed", argument)
    for key, n, fails in calls:
        raising[key] = fails
        expected_runs = list(runs)
        held = model.get(key)
        if held is None:
            expected_runs.append((key, n))
            if fails:
                with pytest.raises(LookupError):
                    step(key, n)
                if policy == "keep":
                    model[key] = ("failed", n)
            else:
                assert step(key, n) == [key, n]
                model[key] = ("completed", n)
        elif held[1] != n:
            with pytest.raises(RequestIdConflictError):
                step(key, n)
        elif held[0] == "completed":
            assert step(key, n) == [key, n]
        else:
            with pytest.raises(UpdateFailedError):
                step(key, n)
        assert runs == expected_runs


# -- the decorator -----------------------------------------------------------------------------------


def test_the_handler_runs_once_and_retries_get_the_recorded_result(service: AdmissionService) -> None:
    once = Once(service, namespace=NS)
    runs: list[int] = []

    @once(name="charge")
    def charge(key: str, *, amount: int) -> dict[str, object]:
        runs.append(amount)
        return {"amount": amount, "parts": (1, 2)}

    first = charge("order-1", amount=5)
    assert first == {"amount": 5, "parts": [1, 2]}  # decoded, as every retry sees it
    assert charge("order-1", amount=5) == first and charge(key="order-1", amount=5) == first
    assert runs == [5]
    assert charge("order-2", amount=5) == first and runs == [5, 5]
    assert event_types(service, "charge") == [
        "RunStarted",
        *["UpdateAccepted", "UpdateCompleted"] * 2,
    ]


def test_a_reused_key_with_other_arguments_is_a_typed_conflict_and_writes_nothing(
    service: AdmissionService,
) -> None:
    once = Once(service, namespace=NS, workflow_id="shop")
    runs: list[int] = []

    @once()
    def charge(key: str, amount: int) -> int:
        runs.append(amount)
        return amount

    charge("k", 5)
    before = event_types(service, "shop")
    with pytest.raises(RequestIdConflictError) as raised:
        charge("k", 6)
    assert raised.value.conflict == ("arguments",) and raised.value.code == "request_id_conflict"
    assert raised.value.retained_outcome == "completed" and raised.value.request_id == "k"
    assert "k" not in str(raised.value).split("'charge'")[1]  # the key is data, not message text

    @once(name="refund")
    def other(key: str, amount: int) -> int:
        return -amount

    with pytest.raises(RequestIdConflictError) as named:
        other("k", 5)  # same instance, same key, another command name
    assert named.value.conflict == ("name",)
    assert runs == [5] and event_types(service, "shop") == before


def test_a_kept_failure_is_what_every_retry_gets(service: AdmissionService) -> None:
    once = Once(service, namespace=NS)
    runs: list[str] = []

    @once()
    def pay(key: str) -> None:
        runs.append(key)
        raise ValueError("card 4242 declined")

    with pytest.raises(ValueError):
        pay("p")
    with pytest.raises(UpdateFailedError) as raised:
        pay("p")
    # The default failure text is the exception's class, never its message.
    assert raised.value.failure == "builtins.ValueError" and not raised.value.retryable
    assert runs == ["p"]


def test_a_released_failure_lets_the_retry_run_again(service: AdmissionService) -> None:
    once = Once(service, namespace=NS, on_failure="release")
    runs: list[int] = []

    @once(name="flaky")
    def flaky(key: str) -> int:
        runs.append(1)
        if len(runs) == 1:
            raise RuntimeError("transient")
        return len(runs)

    with pytest.raises(RuntimeError):
        flaky("f")
    assert flaky("f") == 2 and flaky("f") == 2 and len(runs) == 2
    assert event_types(service, "flaky") == [
        "RunStarted",
        "UpdateAccepted",
        "UpdateFailed",
        "UpdateKeyReleased",
        "UpdateAccepted",
        "UpdateCompleted",
    ]


def test_a_releasing_front_door_frees_a_failure_another_one_kept(service: AdmissionService) -> None:
    keeping = Once(service, namespace=NS, workflow_id="w")
    releasing = Once(service, namespace=NS, workflow_id="w", on_failure="release")
    with pytest.raises(ZeroDivisionError), keeping.attempt("job", "k", [1]):
        raise ZeroDivisionError
    with releasing.attempt("job", "k", [1]) as attempt:
        assert not attempt.done
        attempt.complete("ran again")
    assert event_types(service, "w")[-4:] == [
        "UpdateFailed",
        "UpdateKeyReleased",
        "UpdateAccepted",
        "UpdateCompleted",
    ]


def test_a_retry_while_the_handler_runs_is_refused_as_in_progress(service: AdmissionService) -> None:
    once = Once(service, namespace=NS)
    seen: list[BaseException] = []

    @once()
    def slow(key: str, n: int = 1) -> str:
        # Retries arrive while this call still holds the key: the same intent is in progress;
        # another intent is a conflict, on this path too (the intent is checked on every path).
        for retry in (1, 2):
            try:
                slow(key, retry)
            except (UpdateInProgressError, RequestIdConflictError) as exc:
                seen.append(exc)
        return "done"

    assert slow("s") == "done"
    assert [type(e) for e in seen] == [UpdateInProgressError, RequestIdConflictError]
    assert seen[0].retryable and seen[0].code == "update_in_progress" and not seen[1].retryable
    assert event_types(service, "slow").count("UpdateAccepted") == 1


def test_without_an_expiry_an_old_update_in_progress_is_never_taken_over(
    service: AdmissionService, clock: Clock
) -> None:
    holder = Once(service, namespace=NS, workflow_id="w")
    with pytest.raises(KeyboardInterrupt), holder.attempt("job", "k", [1]):
        raise KeyboardInterrupt  # not an Exception: the update stays accepted, as after a crash
    clock.now = T0 + timedelta(days=365)
    with pytest.raises(UpdateInProgressError), holder.attempt("job", "k", [1]):
        pytest.fail("the handler ran")


def test_after_its_expiry_a_retry_takes_the_update_over_once(service: AdmissionService, clock: Clock) -> None:
    expiry = timedelta(minutes=5)
    once = Once(service, namespace=NS, workflow_id="w", in_progress_expiry=expiry)
    dead = once.begin("job", "k", {"n": 1})  # the holder dies: nothing completes it
    clock.now = T0 + expiry  # exactly the expiry: not older than it
    with pytest.raises(UpdateInProgressError), once.attempt("job", "k", {"n": 1}):
        pytest.fail("the handler ran")
    clock.now = T0 + expiry + timedelta(microseconds=1)
    with once.attempt("job", "k", {"n": 1}) as attempt:
        assert not attempt.done and attempt.update_id != dead.update_id
        attempt.complete("second")
    with once.attempt("job", "k", {"n": 1}) as again:
        assert again.done and again.result == "second"
    history = service.history(NS, "w")
    failed = [e for e in history if e.event_type == "UpdateFailed"]
    assert [(e.update_id, e.payload["failure"]) for e in failed] == [(dead.update_id, IN_PROGRESS_EXPIRED)]
    assert [e.event_type for e in history].count("UpdateKeyReleased") == 1
    # The old holder, should it come back, cannot complete what was taken over, and its
    # block's end records nothing more.
    with pytest.raises(RunStateError) as late:
        dead.complete("first")
    assert late.value.reason == "update_already_failed" and not dead.holds_key
    once.end(dead, None)
    assert service.history(NS, "w") == history


def test_an_attempt_that_ends_without_a_result_is_recorded_failed(service: AdmissionService) -> None:
    once = Once(service, namespace=NS, workflow_id="w")
    with pytest.raises(RunStateError) as raised, once.attempt("job", "k", []):
        pass
    assert raised.value.reason == "attempt_not_completed"
    with pytest.raises(UpdateFailedError) as kept, once.attempt("job", "k", []):
        pytest.fail("the handler ran")
    assert kept.value.failure == "attempt_not_completed"


def test_a_result_the_encoding_refuses_fails_the_update(service: AdmissionService) -> None:
    once = Once(service, namespace=NS, on_failure="release")

    @once()
    def odd(key: str) -> object:
        return {1, 2}

    with pytest.raises(InvalidValueError):
        odd("o")
    assert event_types(service, "odd")[-2:] == ["UpdateFailed", "UpdateKeyReleased"]


def test_a_front_door_refuses_bad_options_naming_the_field(service: AdmissionService) -> None:
    for options, field in [
        ({"on_failure": "retry"}, "on_failure"),
        ({"in_progress_expiry": timedelta(0)}, "in_progress_expiry"),
        ({"in_progress_expiry": 60}, "in_progress_expiry"),
    ]:
        with pytest.raises(InvalidValueError) as raised:
            Once(service, namespace=NS, **options)  # type: ignore[arg-type]
        assert raised.value.field == field
    with pytest.raises(InvalidValueError) as unnamed:
        Once(service, namespace=NS)(key_param="order")(lambda key: key)
    assert unnamed.value.field == "key_param"
    once = Once(service, namespace="")

    @once()
    def job(key: str) -> None:
        raise AssertionError("ran")

    with pytest.raises(InvalidValueError) as bad:
        job("k")
    assert bad.value.field == "namespace" and service.store.find_instance("", "job") is None


# -- the service steps ----------------------------------------------------------------------------------


def test_release_and_take_over_refuse_bad_input_naming_the_field_and_write_nothing(
    service: AdmissionService,
) -> None:
    service.start_run(NS, "w")
    update = service.admit_update(NS, "w", "job", [], request_id="k")
    uid = update.update_id
    assert uid is not None
    before = event_types(service, "w")
    bad = [
        (lambda: service.release_update(NS, "w", uid, failure=3), "failure"),  # type: ignore[arg-type]
        (lambda: service.release_update(NS, "w", uid, failure="x" * 70000), "failure"),
        (lambda: service.release_update("", "w", uid, failure="f"), "namespace"),
        (lambda: service.take_over_update(NS, "w", uid, expiry=timedelta(0)), "expiry"),
        (lambda: service.take_over_update(NS, "w", uid, expiry=5), "expiry"),  # type: ignore[arg-type]
        (lambda: service.take_over_update(NS, None, uid, expiry=timedelta(1)), "workflow_id"),  # type: ignore[arg-type]
    ]
    for call, field in bad:
        with pytest.raises(InvalidValueError) as raised:
            call()
        assert raised.value.field == field
    # An accepted update is released only with a failure; a completed one never.
    with pytest.raises(RunStateError):
        service.release_update(NS, "w", uid)
    service.complete_update(NS, "w", uid, 1)
    with pytest.raises(RunStateError):
        service.release_update(NS, "w", uid, failure="f")
    assert event_types(service, "w") == [*before, "UpdateCompleted"]
    retry = service.admit_update(NS, "w", "job", [], request_id="k")
    assert retry.retained and retry.result == 1


def test_a_released_key_admits_fresh_and_the_old_receipt_stays_in_history(service: AdmissionService) -> None:
    service.start_run(NS, "w")
    first = service.admit_update(NS, "w", "job", [1], request_id="k")
    released = service.release_update(NS, "w", first.update_id, failure="boom")  # type: ignore[arg-type]
    assert (released.update_status, released.failure) == ("failed", "boom")
    again = service.release_update(NS, "w", first.update_id)  # type: ignore[arg-type]
    assert again.update_status == "failed"
    assert event_types(service, "w").count("UpdateKeyReleased") == 1
    # Released, the key no longer binds its old intent: other arguments are a fresh command.
    fresh = service.admit_update(NS, "w", "job", [2], request_id="k")
    assert not fresh.retained and fresh.command_id != first.command_id
    assert service.receipt(NS, "w", "update", "k").command_id == fresh.command_id  # type: ignore[union-attr]


# -- asyncio: memory, and each SQL backend through admission.aio.open_store ----------------------


@pytest.fixture(params=["memory", *SQL_BACKENDS])
def async_url(request: pytest.FixtureRequest, postgres_pool: PostgresPool, tmp_path: Path) -> str | None:
    """``None`` for memory, else a fresh database for :func:`admission.aio.open_store`."""
    return None if request.param == "memory" else database_url(str(request.param), postgres_pool, tmp_path)


def test_async_front_door_runs_the_handler_once(async_url: str | None) -> None:
    runs: list[int] = []

    async def main() -> None:
        store = MemoryStore() if async_url is None else await open_store(async_url)
        service = AsyncAdmissionService(store)
        once = AsyncOnce(service, namespace=NS, on_failure="keep")

        @once(name="charge")
        async def charge(key: str, amount: int) -> list[int]:
            await asyncio.sleep(0)
            runs.append(amount)
            if amount < 0:
                raise ValueError("negative")
            return [amount]

        try:
            await exercise(service, once, charge)
        finally:
            if async_url is not None:
                await service.store.dispose()

    async def exercise(service: AsyncAdmissionService, once: AsyncOnce, charge: Any) -> None:
        assert await charge("k", 5) == [5] and await charge("k", 5) == [5]
        with pytest.raises(RequestIdConflictError):
            await charge("k", 6)
        with pytest.raises(ValueError):
            await charge("n", -1)
        with pytest.raises(UpdateFailedError):
            await charge("n", -1)
        async with once.attempt("manual", "m", {"x": 1}) as attempt:
            assert not attempt.done
            assert await attempt.complete((1, "a")) == [1, "a"]
        async with once.attempt("manual", "m", {"x": 1}) as again:
            assert again.done and again.result == [1, "a"]

        # Two tasks on one loop with one key: the second finds the first in progress.
        entered, leave = asyncio.Event(), asyncio.Event()

        @once(name="slow")
        async def slow(key: str) -> str:
            entered.set()
            await leave.wait()
            return "ok"

        first = asyncio.create_task(slow("s"))
        await entered.wait()
        with pytest.raises(UpdateInProgressError):
            await slow("s")
        update_id = (await service.receipt(NS, "slow", "update", "s")).update_id  # type: ignore[union-attr]
        assert await service.take_over_update(NS, "slow", update_id, expiry=timedelta(days=1)) is None
        leave.set()
        assert await first == "ok" and await slow("s") == "ok"
        with pytest.raises(RunStateError):
            await service.release_update(NS, "slow", update_id)  # completed: its key is kept

    asyncio.run(main())
    assert runs == [5, -1]
