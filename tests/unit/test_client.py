"""The Python client: keys, the transport retry policy, typed failures (contract §2.7, §7).

The network is replaced by ``httpx.MockTransport`` whose handler answers from a
real :class:`AdmissionService` on the in-memory store, after a script of
injected transport failures.  Real sockets and real response loss are in
``tests/test_response_loss.py``.
"""

from __future__ import annotations

import asyncio
import json
import pickle
import re
from collections.abc import Callable
from urllib.parse import unquote

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from admission.client import (
    AdmissionClient,
    AsyncAdmissionClient,
    ClientError,
    CommandRejected,
    InvalidRequest,
    Receipt,
    RequestIdAmbiguous,
    SignalFailed,
    TransportFailed,
    TransportRetryPolicy,
    UnexpectedResponse,
    UpdateFailed,
    generate_request_id,
)
from admission.errors import InvalidValueError
from admission.http import JsonCodec, decode_envelope, default_codecs
from admission.receipts import AdmissionService, MemoryStore

KEY_SHAPE = re.compile(r"sdk-python-(signal|update)-[0-9a-f]{32}\Z")
ROUTE = re.compile(
    r"/api/workflows/(?P<wid>[^/]+)(?:/runs/(?P<run>[^/]+))?/(?P<type>signal|update)/(?P<name>[^/]+)\Z"
)
RECEIPT_ROUTE = re.compile(r"/api/workflows/(?P<wid>[^/]+)/receipts/(?P<type>signal|update)\Z")

# A script step: an exception to raise, a status to answer without admitting,
# or LOSE: admit, then lose the response (the connection drops after the server answered).
LOSE = "lose"
Step = BaseException | int | str


class Backend:
    """A MockTransport handler: the admission service itself, behind a script of failures."""

    def __init__(self, script: list[Step] | None = None) -> None:
        self.service = AdmissionService(MemoryStore())
        self.script = list(script or [])
        self.requests: list[httpx.Request] = []
        self.admitted = 0

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        step = self.script.pop(0) if self.script else None
        if isinstance(step, BaseException):
            raise step
        if isinstance(step, int):
            return httpx.Response(step, json={"reason": "storage_unavailable", "message": "try later"})
        response = self.answer(request)
        if step == LOSE:
            raise httpx.RemoteProtocolError("Server disconnected without sending a response.")
        return response

    def answer(self, request: httpx.Request) -> httpx.Response:
        namespace = request.headers.get("x-namespace", "default")
        path = request.url.raw_path.decode("ascii").split("?")[0]
        found = RECEIPT_ROUTE.match(path)
        if found and request.method == "GET":
            receipt = self.service.receipt(
                namespace,
                unquote(found["wid"]),
                "signal" if found["type"] == "signal" else "update",
                request.url.params["request_id"],
            )
            if receipt is None:
                return httpx.Response(404, json={"reason": "receipt_not_found", "message": "none"})
            return httpx.Response(receipt.http_status, json=receipt.to_dict())
        found = ROUTE.match(path)
        assert found and request.method == "POST", path
        body = json.loads(request.content)
        arguments = decode_envelope(default_codecs(), body["input"]) if "input" in body else []
        admit = self.service.admit_signal if found["type"] == "signal" else self.service.admit_update
        answer = admit(
            namespace,
            unquote(found["wid"]),
            unquote(found["name"]),
            arguments,
            request_id=body.get("request_id"),
            run_id=unquote(found["run"]) if found["run"] else None,
        )
        self.admitted += 1
        return httpx.Response(answer.http_status, json=answer.to_dict())


class Sleeps:
    """The client's sleep, recorded instead of slept."""

    def __init__(self) -> None:
        self.waits: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)


def make_client(
    backend: Callable[[httpx.Request], httpx.Response],
    *,
    policy: TransportRetryPolicy | None = None,
    sleeps: Sleeps | None = None,
    **kwargs: object,
) -> AdmissionClient:
    return AdmissionClient(
        "http://admission.test",
        transport=httpx.MockTransport(backend),
        policy=policy,
        sleep=sleeps if sleeps is not None else Sleeps(),
        random=lambda: 0.5,
        **kwargs,  # type: ignore[arg-type]
    )


@pytest.fixture
def backend() -> Backend:
    backend = Backend()
    backend.service.start_run("default", "order-1")
    return backend


# -- keys ----------------------------------------------------------------------------------------


def test_signal_generates_request_id_once_per_call_and_returns_it(backend: Backend) -> None:
    client = make_client(backend)
    first = client.signal("order-1", "paid", [1])
    second = client.signal("order-1", "paid", [1])
    assert first.request_id is not None and second.request_id is not None
    assert KEY_SHAPE.match(first.request_id) and first.request_id.startswith("sdk-python-signal-")
    assert first.request_id != second.request_id
    assert not first.retained and not second.retained
    assert first.command_id != second.command_id
    sent = [json.loads(r.content)["request_id"] for r in backend.requests]
    assert sent == [first.request_id, second.request_id]


def test_update_generates_update_shaped_key(backend: Backend) -> None:
    receipt = make_client(backend).update("order-1", "approve", {"amount": 12.5})
    assert receipt.request_id is not None and receipt.request_id.startswith("sdk-python-update-")
    assert KEY_SHAPE.match(receipt.request_id)
    assert receipt.status == 202 and receipt.outcome == "accepted" and receipt.update_id


def test_explicit_request_id_is_sent_verbatim(backend: Backend) -> None:
    client = make_client(backend)
    signal = client.signal("order-1", "paid", request_id="Payment:17")
    update = client.update("order-1", "approve", request_id="Payment:17")
    assert signal.request_id == update.request_id == "Payment:17"
    assert [json.loads(r.content)["request_id"] for r in backend.requests] == ["Payment:17"] * 2


def test_surrounding_whitespace_is_stripped_and_a_blank_key_gets_a_generated_one(backend: Backend) -> None:
    client = make_client(backend)
    assert client.signal("order-1", "paid", request_id="  k-1\n").request_id == "k-1"
    blank = client.signal("order-1", "paid", request_id="   ")
    # A blank key would be "no key" on the server: never let it become an unkeyed command.
    assert blank.request_id is not None and KEY_SHAPE.match(blank.request_id)


def test_no_x_request_id_header_is_sent_and_the_namespace_travels_in_its_header(backend: Backend) -> None:
    backend.service.start_run("tenant-a", "order-1")
    client = make_client(backend, namespace="tenant-a")
    receipt = client.signal("order-1", "paid")
    assert receipt.namespace == "tenant-a"
    for request in backend.requests:
        assert "x-request-id" not in request.headers
        assert request.headers["x-namespace"] == "tenant-a"


def test_run_pinned_signal_goes_to_the_run_route(backend: Backend) -> None:
    run_id = backend.service.start_run("default", "order-2").run_id
    receipt = make_client(backend).signal("order-2", "paid", run_id=run_id)
    assert backend.requests[0].url.path == f"/api/workflows/order-2/runs/{run_id}/signal/paid"
    assert receipt.target_scope == "run" and receipt.run_id == run_id


def test_path_segments_are_percent_encoded(backend: Backend) -> None:
    backend.service.start_run("default", "a/b c")
    receipt = make_client(backend).signal("a/b c", "paid?")
    assert backend.requests[0].url.raw_path.startswith(b"/api/workflows/a%2Fb%20c/signal/paid%3F")
    assert receipt.workflow_id == "a/b c"


@pytest.mark.parametrize(
    ("key", "command", "reason"),
    [
        ("k" * 256, "signal", "request_id_invalid"),
        ("\ud800", "update", "request_id_invalid"),
        ("workflow-signal:run:1", "signal", "request_id_reserved"),
    ],
)
def test_an_invalid_key_is_refused_before_anything_is_sent(
    backend: Backend, key: str, command: str, reason: str
) -> None:
    client = make_client(backend)
    send = client.signal if command == "signal" else client.update
    with pytest.raises(InvalidRequest) as caught:
        send("order-1", "paid", request_id=key)
    assert caught.value.field == "request_id" and caught.value.reason == reason
    assert backend.requests == []


def test_unencodable_arguments_are_refused_before_sending_and_carry_the_key(backend: Backend) -> None:
    client = make_client(backend)
    with pytest.raises(InvalidRequest) as caught:
        client.signal("order-1", "paid", [{1, 2}], request_id="k-1")  # type: ignore[list-item]
    assert caught.value.field == "input" and caught.value.reason == "input_invalid"
    assert caught.value.request_id == "k-1"
    assert backend.requests == []


# -- the retry policy at work --------------------------------------------------------------------


@pytest.mark.parametrize("command", ["signal", "update"])
@pytest.mark.parametrize(
    "failure",
    [
        httpx.ConnectError("refused"),
        httpx.ReadTimeout("slow"),
        httpx.ReadError("reset"),
        httpx.RemoteProtocolError("Server disconnected without sending a response."),
        503,
        429,
    ],
    ids=["connect", "timeout", "read", "disconnect", "503", "429"],
)
def test_transport_retry_resends_identical_body_and_request_id(command: str, failure: Step) -> None:
    backend = Backend([failure])
    backend.service.start_run("default", "order-1")
    sleeps = Sleeps()
    client = make_client(backend, sleeps=sleeps, codec=JsonCodec())
    send = client.signal if command == "signal" else client.update
    receipt = send("order-1", "paid", [1, 2.0, "x"])
    assert len(backend.requests) == 2
    first, second = backend.requests
    assert first.content == second.content
    assert json.loads(first.content)["request_id"] == receipt.request_id
    assert not receipt.retained and backend.admitted == 1
    assert sleeps.waits == [0.1]


def test_a_lost_response_is_recovered_as_the_retained_original(backend: Backend) -> None:
    backend.script = [LOSE]
    receipt = make_client(backend).update("order-1", "approve", [7])
    assert receipt.retained and receipt.intent_verified
    assert backend.admitted == 2  # the lost one and the retry, answered from the receipt
    history = backend.service.history("default", "order-1")
    assert [e.event_type for e in history].count("UpdateAccepted") == 1
    assert history[-1].command_id == receipt.command_id


def test_exhausted_attempts_raise_transport_failed_with_the_key() -> None:
    backend = Backend([httpx.ConnectError("refused")] * 3)
    sleeps = Sleeps()
    with pytest.raises(TransportFailed) as caught:
        make_client(backend, sleeps=sleeps).signal("order-1", "paid", request_id="k-9")
    assert caught.value.request_id == "k-9" and caught.value.attempts == 3 and caught.value.status is None
    assert isinstance(caught.value.__cause__, httpx.ConnectError)
    assert sleeps.waits == [0.1, 0.2]
    assert len({r.content for r in backend.requests}) == 1


def test_exhausted_5xx_keeps_the_last_status_and_reason() -> None:
    backend = Backend([503, 500])
    policy = TransportRetryPolicy(max_attempts=2)
    with pytest.raises(TransportFailed) as caught:
        make_client(backend, policy=policy).update("order-1", "approve")
    assert caught.value.status == 500 and caught.value.attempts == 2
    assert caught.value.reason == "storage_unavailable"
    assert caught.value.request_id is not None and KEY_SHAPE.match(caught.value.request_id)


def test_a_local_protocol_error_is_not_retried() -> None:
    backend = Backend([httpx.LocalProtocolError("bad header")])
    with pytest.raises(TransportFailed) as caught:
        make_client(backend).signal("order-1", "paid", request_id="k-2")
    assert caught.value.attempts == 1 and caught.value.request_id == "k-2"
    assert len(backend.requests) == 1


def test_an_exception_the_client_does_not_translate_still_carries_the_key() -> None:
    backend = Backend([RuntimeError("handler bug")])
    with pytest.raises(RuntimeError) as caught:
        make_client(backend).signal("order-1", "paid", request_id="k-3")
    assert caught.value.request_id == "k-3"  # type: ignore[attr-defined]


def test_wait_for_completed_lengthens_the_read_timeout_by_the_wait(backend: Backend) -> None:
    client = make_client(backend, timeout=2.0)
    client.update("order-1", "approve", wait_for="completed", wait_timeout_seconds=5)
    client.update("order-1", "approve", wait_for="completed")
    client.update("order-1", "approve")
    reads = [r.extensions["timeout"]["read"] for r in backend.requests]
    assert reads == [7.0, 12.0, 2.0]
    bodies = [json.loads(r.content) for r in backend.requests]
    assert bodies[0]["wait_for"] == "completed" and bodies[0]["wait_timeout_seconds"] == 5
    assert "wait_for" not in bodies[2] and "wait_timeout_seconds" not in bodies[2]


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"wait_for": "done"}, "wait_for"),
        ({"wait_timeout_seconds": 61}, "wait_timeout_seconds"),
        ({"wait_timeout_seconds": -1}, "wait_timeout_seconds"),
        ({"wait_timeout_seconds": True}, "wait_timeout_seconds"),
    ],
)
def test_bad_wait_options_are_refused_naming_the_field(
    backend: Backend, options: dict[str, object], field: str
) -> None:
    with pytest.raises(InvalidRequest) as caught:
        make_client(backend).update("order-1", "approve", request_id="k-4", **options)  # type: ignore[arg-type]
    assert caught.value.field == field and caught.value.request_id == "k-4"
    assert backend.requests == []


# -- typed failures ------------------------------------------------------------------------------


@pytest.mark.parametrize(("command", "failure"), [("signal", SignalFailed), ("update", UpdateFailed)])
def test_request_id_conflict_raises_the_typed_failure_after_one_call(
    backend: Backend, command: str, failure: type[ClientError]
) -> None:
    client = make_client(backend)
    send = client.signal if command == "signal" else client.update
    first = send("order-1", "paid", [1], request_id="k-5")
    sent = len(backend.requests)
    with pytest.raises(failure) as caught:
        send("order-1", "paid", [2], request_id="k-5")
    error = caught.value
    assert isinstance(error, (SignalFailed, UpdateFailed))
    assert len(backend.requests) == sent + 1  # never retried
    assert error.request_id == "k-5" and error.reason == "request_id_conflict" and error.status == 409
    assert error.details == {
        "request_id": "k-5",
        "retained_command_id": first.command_id,
        "retained_command_type": command,
        "retained_outcome": first.outcome,
        "conflict": ["arguments"],
    }
    assert not isinstance(error, RequestIdAmbiguous)


@pytest.mark.parametrize("command", ["signal", "update"])
def test_request_id_ambiguous_is_its_own_type_and_never_retried(command: str) -> None:
    def ambiguous(request: httpx.Request) -> httpx.Response:
        key = json.loads(request.content)["request_id"]
        return httpx.Response(
            409,
            json={
                "outcome": "request_id_ambiguous",
                "reason": "request_id_ambiguous",
                "request_id": key,
                "retryable": False,
                "ambiguity": "two-rows",
                "message": "cannot tell",
            },
        )

    calls: list[httpx.Request] = []

    def counting(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        return ambiguous(request)

    client = make_client(counting)
    send = client.signal if command == "signal" else client.update
    with pytest.raises(RequestIdAmbiguous) as caught:
        send("order-1", "paid", request_id="k-6")
    assert caught.value.request_id == "k-6" and caught.value.ambiguity == "two-rows"
    assert not isinstance(caught.value, (SignalFailed, UpdateFailed))
    assert len(calls) == 1


def test_a_selected_run_that_is_not_current_raises_command_rejected_with_its_receipt(
    backend: Backend,
) -> None:
    old = backend.service.start_run("default", "order-3").run_id
    backend.service.continue_as_new("default", "order-3")
    client = make_client(backend)
    with pytest.raises(CommandRejected) as caught:
        client.signal("order-3", "paid", run_id=old, request_id="k-7")
    error = caught.value
    assert error.outcome == "rejected_not_current" and error.status == 409
    assert error.requested_run_id == old and error.resolved_run_id not in (None, old)
    assert error.receipt is not None and error.receipt.request_id == "k-7"
    with pytest.raises(CommandRejected) as again:
        client.signal("order-3", "paid", run_id=old, request_id="k-7")
    assert again.value.receipt is not None and again.value.receipt.retained


def test_no_open_run_raises_command_rejected(backend: Backend) -> None:
    with pytest.raises(CommandRejected) as caught:
        make_client(backend).update("nobody", "approve", request_id="k-8")
    assert caught.value.outcome == "run_not_active" and caught.value.request_id == "k-8"


def test_a_failed_update_raises_update_failed_with_its_receipt(backend: Backend) -> None:
    client = make_client(backend)
    accepted = client.update("order-1", "approve", request_id="k-10")
    assert accepted.update_id is not None
    backend.service.fail_update("default", "order-1", accepted.update_id, "no stock")
    with pytest.raises(UpdateFailed) as caught:
        client.update("order-1", "approve", request_id="k-10")
    error = caught.value
    assert error.reason == "update_failed" and error.status == 422 and error.request_id == "k-10"
    assert error.receipt is not None and error.receipt.failure == "no stock" and error.receipt.retained
    assert error.details == {"update_id": accepted.update_id, "failure": "no stock"}


def test_a_completed_update_is_a_200_receipt_with_its_result(backend: Backend) -> None:
    client = make_client(backend)
    accepted = client.update("order-1", "approve", request_id="k-11")
    assert accepted.update_id is not None
    backend.service.complete_update("default", "order-1", accepted.update_id, {"ok": True})
    done = client.update("order-1", "approve", request_id="k-11")
    assert done.status == 200 and done.completed and done.result == {"ok": True} and done.retained
    assert done.command_id == accepted.command_id and done.update_id == accepted.update_id


def test_a_422_from_the_server_is_invalid_request_naming_the_field() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            422,
            json={
                "reason": "input_invalid",
                "message": "input: blob failed authentication",
                "field": "input",
                "request_id": "k-12",
            },
        )

    with pytest.raises(InvalidRequest) as caught:
        make_client(refuse).signal("order-1", "paid", request_id="k-12")
    assert caught.value.field == "input" and caught.value.reason == "input_invalid"
    assert caught.value.request_id == "k-12" and "authentication" in str(caught.value)


@pytest.mark.parametrize(
    "response",
    [
        httpx.Response(404, json={"reason": "not_found", "message": "no route"}),
        httpx.Response(200, text="<html>proxy page</html>"),
        httpx.Response(202, json={"outcome": "received"}),
    ],
    ids=["404", "not-json", "not-an-admission"],
)
def test_responses_outside_the_wire_contract_are_unexpected(response: httpx.Response) -> None:
    calls: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        return response

    with pytest.raises(UnexpectedResponse) as caught:
        make_client(answer).signal("order-1", "paid", request_id="k-13")
    assert caught.value.request_id == "k-13" and caught.value.status == response.status_code
    assert len(calls) == 1


def test_an_answer_about_another_key_is_never_returned(backend: Backend) -> None:
    def other_key(request: httpx.Request) -> httpx.Response:
        response = backend(request)
        body = json.loads(response.content)
        body["request_id"] = "someone-else"
        return httpx.Response(response.status_code, json=body)

    with pytest.raises(UnexpectedResponse) as caught:
        make_client(other_key).signal("order-1", "paid", request_id="k-14")
    assert caught.value.request_id == "k-14"


# -- reading receipts ----------------------------------------------------------------------------


def test_receipt_reads_without_admitting_and_is_none_when_missing(backend: Backend) -> None:
    client = make_client(backend)
    assert client.receipt("order-1", "update", "k-15") is None
    accepted = client.update("order-1", "approve", request_id="k-15")
    read = client.receipt("order-1", "update", "k-15")
    assert read is not None and read.command_id == accepted.command_id and read.retained
    assert client.receipt("order-1", "signal", "k-15") is None
    assert backend.requests[-1].url.params["request_id"] == "k-15"
    with pytest.raises(InvalidRequest):
        client.receipt("order-1", "update", "  ")


def test_receipt_reads_retry_on_transport_failure(backend: Backend) -> None:
    client = make_client(backend)
    client.signal("order-1", "paid", request_id="k-16")
    backend.script = [httpx.ReadTimeout("slow")]
    read = client.receipt("order-1", "signal", "k-16")
    assert read is not None and read.request_id == "k-16"


# -- the async client ----------------------------------------------------------------------------


def test_async_client_retries_with_identical_bytes_and_maps_failures(backend: Backend) -> None:
    backend.script = [httpx.ConnectError("refused"), LOSE]
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)

    async def scenario() -> tuple[Receipt, ClientError]:
        async with AsyncAdmissionClient(
            "http://admission.test",
            transport=httpx.MockTransport(backend),
            sleep=sleep,
            random=lambda: 0.0,
        ) as client:
            receipt = await client.signal("order-1", "paid", [1])
            try:
                await client.signal("order-1", "paid", [2], request_id=receipt.request_id)
            except SignalFailed as exc:
                return receipt, exc
            raise AssertionError("no conflict")

    receipt, conflict = asyncio.run(scenario())
    assert receipt.retained and receipt.request_id is not None and KEY_SHAPE.match(receipt.request_id)
    assert len({r.content for r in backend.requests[:3]}) == 1 and len(backend.requests) == 4
    assert waits == [0.1 * 0.75, 0.2 * 0.75]
    assert conflict.request_id == receipt.request_id and conflict.reason == "request_id_conflict"


# -- failures are values that travel -------------------------------------------------------------


def test_failures_pickle_with_their_attributes(backend: Backend) -> None:
    client = make_client(backend)
    client.signal("order-1", "paid", [1], request_id="k-17")
    with pytest.raises(SignalFailed) as caught:
        client.signal("order-1", "paid", [2], request_id="k-17")
    with pytest.raises(CommandRejected) as rejected:
        client.signal("nobody", "paid", request_id="k-17")
    for error in (
        caught.value,
        rejected.value,
        TransportFailed("lost", request_id="k", attempts=3, status=503),
        InvalidRequest("bad", request_id="k", field="input", reason="input_invalid"),
    ):
        copy = pickle.loads(pickle.dumps(error))
        assert type(copy) is type(error) and copy.__dict__ == error.__dict__ and str(copy) == str(error)
        assert copy.code == error.code


def test_generated_keys_have_the_contract_shape() -> None:
    keys = {generate_request_id("signal") for _ in range(50)} | {generate_request_id("update")}
    assert len(keys) == 51 and all(KEY_SHAPE.match(k) for k in keys)


# -- the policy's decision table, as properties ----------------------------------------------------


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"max_attempts": 0}, "max_attempts"),
        ({"max_attempts": 2.0}, "max_attempts"),
        ({"initial_backoff_seconds": -0.1}, "initial_backoff_seconds"),
        ({"max_backoff_seconds": float("inf")}, "max_backoff_seconds"),
        ({"initial_backoff_seconds": 6.0}, "initial_backoff_seconds"),
        ({"backoff_multiplier": 0.5}, "backoff_multiplier"),
        ({"jitter": 1.5}, "jitter"),
        ({"jitter": True}, "jitter"),
    ],
)
def test_policy_refuses_bad_settings_naming_the_field(options: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidValueError) as caught:
        TransportRetryPolicy(**options)  # type: ignore[arg-type]
    assert caught.value.field == field


def test_default_policy_matches_the_upstream_defaults() -> None:
    policy = TransportRetryPolicy()
    assert (policy.max_attempts, policy.initial_backoff_seconds, policy.max_backoff_seconds) == (3, 0.1, 5.0)
    assert (policy.backoff_multiplier, policy.jitter) == (2.0, 0.25)


@settings(max_examples=200)
@given(st.integers(100, 599))
def test_only_5xx_and_429_are_retried(status: int) -> None:
    assert TransportRetryPolicy().retries_status(status) == (status == 429 or status >= 500)


policies = st.builds(
    lambda attempts, initial, grow, cap, multiplier, jitter: TransportRetryPolicy(
        max_attempts=attempts,
        initial_backoff_seconds=initial,
        max_backoff_seconds=initial + grow if cap else initial,
        backoff_multiplier=multiplier,
        jitter=jitter,
    ),
    st.integers(1, 8),
    st.floats(0, 10, allow_nan=False),
    st.floats(0, 100, allow_nan=False),
    st.booleans(),
    st.floats(1, 10, allow_nan=False),
    st.floats(0, 1),
)


@settings(max_examples=200)
@given(policies, st.integers(1, 2000), st.floats(0, 1))
def test_delays_stay_within_the_jitter_band_and_the_cap(
    policy: TransportRetryPolicy, retry: int, unit: float
) -> None:
    base = policy.base_delay(retry)
    delay = policy.delay(retry, unit)
    assert 0 <= base <= policy.max_backoff_seconds
    assert 0 <= delay <= policy.max_backoff_seconds
    assert base * (1 - policy.jitter) - 1e-9 <= delay <= base * (1 + policy.jitter) + 1e-9
    if retry > 1:
        assert policy.base_delay(retry - 1) <= base  # the backoff never shrinks


OUTCOMES = st.one_of(
    st.sampled_from(
        [
            httpx.ConnectError("refused"),
            httpx.ConnectTimeout("slow"),
            httpx.ReadError("reset"),
            httpx.RemoteProtocolError("disconnected"),
            httpx.LocalProtocolError("bad request line"),
            httpx.UnsupportedProtocol("gopher"),
        ]
    ),
    st.sampled_from([200, 202, 400, 404, 409, 422, 429]),
    st.integers(500, 599),
)


def scripted(outcomes: list[BaseException | int]) -> Callable[[httpx.Request], httpx.Response]:
    """A server that answers each attempt with the next scripted outcome."""
    queue = list(outcomes)

    def answer(request: httpx.Request) -> httpx.Response:
        step = queue.pop(0)
        if isinstance(step, BaseException):
            raise step
        key = json.loads(request.content)["request_id"]
        if step in (200, 202):
            body = {
                "outcome": "received",
                "namespace": "default",
                "workflow_id": "order-1",
                "command_type": "signal",
                "request_id": key,
                "retained": False,
                "intent_verified": True,
            }
        else:
            body = {"reason": "something", "message": "scripted", "request_id": key}
        return httpx.Response(step, json=body)

    return answer


def retried(outcome: BaseException | int) -> bool:
    policy = TransportRetryPolicy()
    if isinstance(outcome, BaseException):
        return policy.retries_error(outcome)
    return policy.retries_status(outcome)


@settings(max_examples=150)
@given(policies, st.lists(OUTCOMES, min_size=8, max_size=8), st.floats(0, 1))
def test_the_client_follows_the_policy_for_any_sequence_of_outcomes(
    policy: TransportRetryPolicy, outcomes: list[BaseException | int], unit: float
) -> None:
    requests: list[httpx.Request] = []
    answer = scripted(outcomes)

    def recording(request: httpx.Request) -> httpx.Response:
        requests.append(request)
        return answer(request)

    sleeps = Sleeps()
    client = AdmissionClient(
        "http://admission.test",
        transport=httpx.MockTransport(recording),
        policy=policy,
        sleep=sleeps,
        random=lambda: unit,
    )
    # The attempts the policy allows: up to the first outcome that is an answer.
    stop = next((i for i, o in enumerate(outcomes) if not retried(o)), len(outcomes))
    expected = min(stop + 1, policy.max_attempts)
    try:
        client.signal("order-1", "paid", [1])
        succeeded = True
    except ClientError as exc:
        succeeded = False
        assert exc.request_id is not None and KEY_SHAPE.match(exc.request_id)
        last = outcomes[expected - 1]
        if isinstance(exc, TransportFailed):
            assert exc.attempts == expected
        else:
            assert isinstance(last, int) and not retried(last)  # an answer, mapped to its failure
    assert len(requests) <= policy.max_attempts and len(requests) == expected
    assert len({r.content for r in requests}) == 1  # byte-identical, one key
    assert succeeded == (isinstance(outcomes[expected - 1], int) and outcomes[expected - 1] in (200, 202))
    # A 4xx other than 429 is the last attempt ever made.
    for earlier in outcomes[: expected - 1]:
        assert not (isinstance(earlier, int) and 400 <= earlier < 500 and earlier != 429)
    assert sleeps.waits == [policy.delay(n, unit) for n in range(1, expected)]
    assert all(0 <= w <= policy.max_backoff_seconds for w in sleeps.waits)


def test_the_client_module_pins_its_public_names_and_documents_them() -> None:
    import admission.client as module

    assert sorted(module.__all__) == sorted(
        [
            "AccessDenied",
            "AdmissionClient",
            "AsyncAdmissionClient",
            "ClientError",
            "CommandRejected",
            "InvalidRequest",
            "Receipt",
            "RequestIdAmbiguous",
            "SignalFailed",
            "TransportFailed",
            "TransportRetryPolicy",
            "UnexpectedResponse",
            "UpdateFailed",
            "generate_request_id",
        ]
    )
    for name in module.__all__:
        obj = getattr(module, name)
        assert obj.__doc__, name
        if isinstance(obj, type) and issubclass(obj, ClientError):
            assert obj.code != ClientError.code or obj is ClientError, name


@pytest.mark.parametrize(
    ("retry_after", "wait"),
    [
        ("3", 3.0),
        ("100", 5.0),
        ("0", 0.1),
        ("Wed, 21 Oct 2026 07:28:00 GMT", 0.1),
        ("1.5", 0.1),
        ("-2", 0.1),
        (None, 0.1),
    ],
)
def test_retry_after_is_honoured_up_to_the_cap(retry_after: str | None, wait: float) -> None:
    headers = {} if retry_after is None else {"retry-after": retry_after}
    answers = [httpx.Response(429, headers=headers, json={"reason": "slow_down", "message": "later"})]

    def answer(request: httpx.Request) -> httpx.Response:
        if answers:
            return answers.pop()
        key = json.loads(request.content)["request_id"]
        body = {
            "outcome": "received",
            "namespace": "default",
            "workflow_id": "order-1",
            "command_type": "signal",
            "request_id": key,
            "retained": False,
            "intent_verified": True,
        }
        return httpx.Response(202, json=body)

    sleeps = Sleeps()
    make_client(answer, sleeps=sleeps).signal("order-1", "paid")
    assert sleeps.waits == [wait]


@settings(max_examples=200)
@given(policies, st.integers(1, 50), st.floats(0, 1), st.one_of(st.none(), st.text(max_size=12)))
def test_a_retry_after_never_shortens_the_backoff_nor_passes_the_cap(
    policy: TransportRetryPolicy, retry: int, unit: float, header: str | None
) -> None:
    delay = policy.delay(retry, unit)
    wait = policy.honour_retry_after(delay, header)
    assert delay <= wait <= policy.max_backoff_seconds
