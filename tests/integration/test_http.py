"""The HTTP adapter in-process, on SQLite and PostgreSQL: routes, statuses, headers, bodies, codecs."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

with warnings.catch_warnings():
    # The framework's test client warns about its own future; it is not ours to fix.
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine, func, select, update

from admission.aio import AsyncAdmissionService
from admission.http import AesGcmCodec, CborCodec, JsonCodec, codecs_from, create_app, envelope
from admission.receipts import AdmissionService
from admission.sql import SqlStore, workflow_commands
from tests.support.aio import AsyncTwins
from tests.support.backends import sqlite_url
from tests.support.snapshot import diff_snapshots, snapshot
from tests.support.strategies import ARGUMENTS, same

pytestmark = pytest.mark.filterwarnings("ignore:Using `httpx` with `starlette.testclient`")

KEY = bytes(range(32))
NS = "tenant-a"


def make_client(service: AdmissionService | AsyncAdmissionService, **options: Any) -> TestClient:
    codecs = codecs_from(JsonCodec(), CborCodec(), AesGcmCodec(KEY, "k1"))
    return TestClient(create_app(service, codecs=codecs, **options), raise_server_exceptions=False)


@pytest.fixture
def twins() -> Iterator[AsyncTwins]:
    made = AsyncTwins()
    yield made
    made.close()


@pytest.fixture
def client(service: AdmissionService, twins: AsyncTwins) -> TestClient:
    """The app as ``admission serve`` runs it: the async service on the test's database."""
    return make_client(twins.twin(service))


def started(service: AdmissionService, workflow_id: str = "wf-1") -> str:
    return service.start_run(NS, workflow_id).run_id


def post(client: TestClient, path: str, body: object = None, **headers: str) -> Any:
    # ASCII-escaped JSON, so that a lone surrogate can be sent as the escape a caller would send.
    content = None if body is None else json.dumps(body).encode("ascii")
    kinds = {} if body is None else {"Content-Type": "application/json"}
    return client.post(path, content=content, headers={"X-Namespace": NS, **kinds, **headers})


def count_commands(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(workflow_commands)).scalar_one())


def json_input(value: object) -> dict[str, str]:
    return envelope(JsonCodec(), value)  # type: ignore[arg-type]


def assert_error_shape(response: Any) -> dict[str, Any]:
    body = response.json()
    assert isinstance(body, dict)
    assert isinstance(body.get("reason"), str) and body["reason"]
    assert isinstance(body.get("message"), str) and body["message"]
    return body


# -- signals ----------------------------------------------------------------------------------


def test_a_lost_signal_response_retried_returns_the_original_receipt(
    client: TestClient, service: AdmissionService, engine: Engine
) -> None:
    run_id = started(service)
    body = {"request_id": "  sig-1 ", "input": json_input({"amount": 12.5})}
    first = post(client, "/api/workflows/wf-1/signal/pay", body)
    retry = post(client, "/api/workflows/wf-1/signal/pay", body)
    assert (first.status_code, retry.status_code) == (202, 202)
    one, two = first.json(), retry.json()
    assert (one["outcome"], one["retained"], one["intent_verified"]) == ("received", False, True)
    assert (two["retained"], two["intent_verified"]) == (True, True)
    assert one["request_id"] == two["request_id"] == "sig-1"  # stripped (contract §2.1)
    for field in ("command_id", "run_id", "command_sequence", "received_at"):
        assert one[field] == two[field], field
    assert one["run_id"] == run_id and one["namespace"] == NS
    assert count_commands(engine) == 1


def test_the_body_is_exactly_the_admission_json(client: TestClient, service: AdmissionService) -> None:
    started(service)
    response = post(client, "/api/workflows/wf-1/signal/pay", {"request_id": "k", "input": json_input([1])})
    again = service.admit_signal(NS, "wf-1", "pay", [1], request_id="k")
    expected = again.to_dict()
    expected["retained"] = False
    assert response.json() == expected


def test_x_request_id_is_echoed_and_never_becomes_a_key(
    client: TestClient, service: AdmissionService, engine: Engine
) -> None:
    started(service)
    first = post(client, "/api/workflows/wf-1/signal/go", {}, **{"X-Request-Id": "corr-7"})
    second = post(client, "/api/workflows/wf-1/signal/go", {}, **{"X-Request-Id": "corr-7"})
    assert first.headers["x-request-id"] == second.headers["x-request-id"] == "corr-7"
    assert first.json()["request_id"] is None and second.json()["retained"] is False
    assert first.json()["command_id"] != second.json()["command_id"]
    assert count_commands(engine) == 2
    receipt = client.get(
        "/api/workflows/wf-1/receipts/signal", params={"request_id": "corr-7"}, headers={"X-Namespace": NS}
    )
    assert receipt.status_code == 404
    # Echoed on errors too, and absent when not sent.
    bad = post(client, "/api/workflows/wf-1/signal/go", {"nope": 1}, **{"X-Request-Id": "corr-8"})
    assert bad.status_code == 422 and bad.headers["x-request-id"] == "corr-8"
    assert "x-request-id" not in post(client, "/api/workflows/wf-1/signal/go", {}).headers


def test_an_unexpected_error_is_a_500_that_still_echoes_the_request_id(
    service: AdmissionService, monkeypatch: pytest.MonkeyPatch
) -> None:
    started(service)

    def broken(*_args: object, **_kwargs: object) -> object:
        raise RuntimeError("a bug")

    monkeypatch.setattr(service, "admit_signal", broken)
    client = make_client(service)
    failed = post(client, "/api/workflows/wf-1/signal/go", {}, **{"X-Request-Id": "corr-9"})
    assert failed.status_code == 500 and failed.headers["x-request-id"] == "corr-9"
    assert assert_error_shape(failed)["reason"] == "internal_error"
    assert "a bug" not in failed.text  # the type is named, the message stays in the server's log
    assert "x-request-id" not in post(client, "/api/workflows/wf-1/signal/go", {}).headers


def test_the_namespace_header_isolates_keys(client: TestClient, service: AdmissionService) -> None:
    service.start_run(NS, "wf-1")
    service.start_run("default", "wf-1")
    body = {"request_id": "same"}
    in_a = post(client, "/api/workflows/wf-1/signal/go", body)
    in_default = client.post("/api/workflows/wf-1/signal/go", json=body)  # no header: "default"
    assert in_a.json()["namespace"] == NS and in_default.json()["namespace"] == "default"
    assert in_a.json()["retained"] is False and in_default.json()["retained"] is False
    assert in_a.json()["command_id"] != in_default.json()["command_id"]


def test_no_body_means_no_key_and_no_arguments(client: TestClient, service: AdmissionService) -> None:
    started(service)
    response = client.post("/api/workflows/wf-1/signal/go", headers={"X-Namespace": NS})
    assert response.status_code == 202
    assert response.json()["request_id"] is None


def test_a_signal_to_the_current_run_is_received(client: TestClient, service: AdmissionService) -> None:
    run_id = started(service)
    response = post(client, f"/api/workflows/wf-1/runs/{run_id}/signal/go", {"request_id": "r"})
    assert response.status_code == 202
    assert (response.json()["target_scope"], response.json()["run_id"]) == ("run", run_id)


def test_a_signal_to_a_run_that_is_not_current_is_refused_and_retained(
    client: TestClient, service: AdmissionService
) -> None:
    first_run = started(service)
    service.continue_as_new(NS, "wf-1")
    response = post(client, f"/api/workflows/wf-1/runs/{first_run}/signal/go", {"request_id": "old"})
    body = assert_error_shape(response)
    assert response.status_code == 409
    assert (body["outcome"], body["reason"]) == ("rejected_not_current", "selected_run_not_current")
    assert body["requested_run_id"] == first_run and body["resolved_run_id"] not in (None, first_run)
    again = post(client, f"/api/workflows/wf-1/runs/{first_run}/signal/go", {"request_id": "old"})
    assert again.status_code == 409 and again.json()["retained"] is True
    assert again.json()["command_id"] == body["command_id"]


def test_a_signal_to_an_instance_without_an_open_run_is_run_not_active(client: TestClient) -> None:
    response = post(client, "/api/workflows/never-started/signal/go", {"request_id": "x"})
    body = assert_error_shape(response)
    assert (response.status_code, body["outcome"], body["reason"]) == (
        409,
        "run_not_active",
        "run_not_active",
    )


def test_a_changed_intent_is_a_conflict_and_writes_nothing(
    client: TestClient, service: AdmissionService, engine: Engine
) -> None:
    started(service)
    first = post(client, "/api/workflows/wf-1/signal/pay", {"request_id": "k", "input": json_input([1])})
    before = snapshot(engine)
    changed = post(client, "/api/workflows/wf-1/signal/pay", {"request_id": "k", "input": json_input([1.0])})
    renamed = post(client, "/api/workflows/wf-1/signal/refund", {"request_id": "k", "input": json_input([1])})
    assert diff_snapshots(before, snapshot(engine)) == []
    for response, parts in ((changed, ["arguments"]), (renamed, ["name"])):
        body = assert_error_shape(response)
        assert response.status_code == 409
        assert (body["reason"], body["retryable"], body["conflict"]) == ("request_id_conflict", False, parts)
        assert body["retained_command_id"] == first.json()["command_id"]
        assert (body["request_id"], body["retained_command_type"], body["retained_outcome"]) == (
            "k",
            "signal",
            "received",
        )


def test_an_ambiguous_key_is_a_409_with_nothing_selected(
    client: TestClient, service: AdmissionService, engine: Engine
) -> None:
    started(service)
    first = post(client, "/api/workflows/wf-1/signal/go", {"request_id": "old-key"})
    # Make the receipt a legacy one whose key cannot be proven (contract §6, "legacy-token").
    with engine.begin() as conn:
        conn.execute(
            update(workflow_commands)
            .where(workflow_commands.c.id == first.json()["command_id"])
            .values(intent_digest=None, arguments_digest=None, context=None)
        )
    before = snapshot(engine)
    retry = post(client, "/api/workflows/wf-1/signal/go", {"request_id": "old-key"})
    read = client.get(
        "/api/workflows/wf-1/receipts/signal", params={"request_id": "old-key"}, headers={"X-Namespace": NS}
    )
    assert diff_snapshots(before, snapshot(engine)) == []
    for response in (retry, read):
        body = assert_error_shape(response)
        assert response.status_code == 409
        assert (body["reason"], body["ambiguity"], body["retryable"]) == (
            "request_id_ambiguous",
            "legacy-token",
            False,
        )
        assert "command_id" not in body


# -- updates -------------------------------------------------------------------------------------


def complete_when_accepted(
    service: AdmissionService, key: str, result: object = None, *, fail: str | None = None
) -> threading.Thread:
    """Complete (or fail) the update ``key`` names as soon as it has been accepted."""

    def run() -> None:
        for _ in range(6000):
            receipt = service.receipt(NS, "wf-1", "update", key)
            if receipt is not None and receipt.update_id is not None:
                if fail is None:
                    service.complete_update(NS, "wf-1", receipt.update_id, result)
                else:
                    service.fail_update(NS, "wf-1", receipt.update_id, fail)
                return
            time.sleep(0.005)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_an_update_waiting_for_completion_answers_200_with_the_result(
    client: TestClient, service: AdmissionService
) -> None:
    started(service)
    worker = complete_when_accepted(service, "u-1", {"approved": True, "by": [1, 1.0]})
    body = {
        "request_id": "u-1",
        "input": json_input({"amount": 5}),
        "wait_for": "completed",
        "wait_timeout_seconds": 60,
    }
    response = post(client, "/api/workflows/wf-1/update/approve", body)
    worker.join()
    assert response.status_code == 200
    answer = response.json()
    assert (answer["outcome"], answer["update_status"], answer["retained"]) == (
        "completed",
        "completed",
        False,
    )
    assert same(answer["result"], {"approved": True, "by": [1, 1.0]})
    # The retry after a lost 200 is the completed receipt, retained.
    retry = post(client, "/api/workflows/wf-1/update/approve", {**body, "wait_for": "accepted"})
    assert retry.status_code == 200
    assert (retry.json()["retained"], retry.json()["update_id"]) == (True, answer["update_id"])


def test_an_update_that_fails_while_waited_for_is_a_422_admission_answer(
    client: TestClient, service: AdmissionService
) -> None:
    started(service)
    worker = complete_when_accepted(service, "u-2", fail="insufficient funds")
    body = {"request_id": "u-2", "wait_for": "completed", "wait_timeout_seconds": 60}
    response = post(client, "/api/workflows/wf-1/update/approve", body)
    worker.join()
    answer = assert_error_shape(response)
    assert response.status_code == 422
    assert (answer["outcome"], answer["update_status"], answer["failure"]) == (
        "failed",
        "failed",
        "insufficient funds",
    )
    assert answer["reason"] == "update_failed" and "insufficient funds" in answer["message"]


def test_a_wait_that_times_out_answers_202_accepted(service: AdmissionService, twins: AsyncTwins) -> None:
    started(service)
    ticks = iter(range(1_000_000))
    # A clock that advances one second per reading: the wait gives up without real time passing.
    client = make_client(twins.twin(service), clock=lambda: float(next(ticks)), poll_interval_seconds=0.001)
    body = {"request_id": "u-3", "wait_for": "completed", "wait_timeout_seconds": 5}
    response = post(client, "/api/workflows/wf-1/update/approve", body)
    assert response.status_code == 202
    assert (response.json()["outcome"], response.json()["update_status"]) == ("accepted", "accepted")
    zero = post(client, "/api/workflows/wf-1/update/approve", {**body, "wait_timeout_seconds": 0})
    assert zero.status_code == 202 and zero.json()["retained"] is True


def test_an_update_without_wait_is_accepted_at_once(client: TestClient, service: AdmissionService) -> None:
    run_id = started(service)
    response = post(client, f"/api/workflows/wf-1/runs/{run_id}/update/approve", {"request_id": "u-4"})
    assert response.status_code == 202
    answer = response.json()
    assert (answer["outcome"], answer["target_scope"], answer["update_status"]) == (
        "accepted",
        "run",
        "accepted",
    )
    assert isinstance(answer["update_id"], str)


def test_the_same_key_on_a_signal_and_an_update_are_two_receipts(
    client: TestClient, service: AdmissionService
) -> None:
    started(service)
    signal = post(client, "/api/workflows/wf-1/signal/go", {"request_id": "both"})
    upd = post(client, "/api/workflows/wf-1/update/go", {"request_id": "both"})
    assert signal.json()["retained"] is False and upd.json()["retained"] is False


# -- receipts --------------------------------------------------------------------------------------


def test_reading_a_receipt(client: TestClient, service: AdmissionService) -> None:
    started(service)
    sent = post(client, "/api/workflows/wf-1/update/approve", {"request_id": "r-1"})
    headers = {"X-Namespace": NS, "X-Request-Id": "c"}
    read = client.get("/api/workflows/wf-1/receipts/update", params={"request_id": " r-1 "}, headers=headers)
    assert read.status_code == 202 and read.headers["x-request-id"] == "c"
    assert read.json()["command_id"] == sent.json()["command_id"] and read.json()["retained"] is True
    missing = client.get("/api/workflows/wf-1/receipts/signal", params={"request_id": "r-1"}, headers=headers)
    body = assert_error_shape(missing)
    assert (missing.status_code, body["reason"], body["request_id"]) == (404, "receipt_not_found", "r-1")
    blank = client.get("/api/workflows/wf-1/receipts/signal", params={"request_id": "  "}, headers=headers)
    assert blank.status_code == 422 and assert_error_shape(blank)["reason"] == "request_id_invalid"
    bad_type = client.get("/api/workflows/wf-1/receipts/query", params={"request_id": "r-1"}, headers=headers)
    assert bad_type.status_code == 422 and assert_error_shape(bad_type)["field"] == "command_type"


# -- bad input: 422, the documented shape, nothing written ------------------------------------------

REFUSED: list[tuple[str, Any, str, str]] = [
    # (path, body, reason, field)
    ("signal/go", {"request_id": 5}, "request_id_invalid", "request_id"),
    ("signal/go", {"request_id": "x" * 256}, "request_id_invalid", "request_id"),
    ("signal/go", {"request_id": "\ud800"}, "request_id_invalid", "request_id"),
    ("signal/go", {"request_id": "workflow-signal:1"}, "request_id_reserved", "request_id"),
    ("signal/go", {"request_id": "k", "extra": 1}, "input_invalid", "extra"),
    ("signal/go", {"request_id": "k", "wait_for": "completed"}, "input_invalid", "wait_for"),
    ("signal/go", [], "input_invalid", "body"),
    ("signal/go", {"input": {"codec": "yaml", "blob": "[]"}}, "input_invalid", "input"),
    ("signal/go", {"input": {"codec": "json", "blob": '{"a": 1, "a": 2}'}}, "input_invalid", "input"),
    ("signal/go", {"input": {"codec": "json", "blob": "[1,"}}, "input_invalid", "input"),
    ("signal/go", {"input": {"codec": "json", "blob": "[1e400]"}}, "input_invalid", "input"),
    ("signal/go", {"input": {"codec": "json", "blob": "5"}}, "input_invalid", "arguments"),
    ("signal/go", {"input": {"codec": "cbor", "blob": "GBc="}}, "input_invalid", "input"),
    ("signal/go", {"input": {"codec": "cbor", "blob": "%%"}}, "input_invalid", "input"),
    ("signal/go", {"input": {"codec": "json", "blob": "[]", "key_id": "k"}}, "input_invalid", "input.key_id"),
    ("signal/go", {"input": {"codec": "json"}}, "input_invalid", "input.blob"),
    ("signal/go", {"input": "[]"}, "input_invalid", "input"),
    ("update/go", {"wait_for": "done"}, "input_invalid", "wait_for"),
    ("update/go", {"wait_timeout_seconds": 61}, "input_invalid", "wait_timeout_seconds"),
    ("update/go", {"wait_timeout_seconds": -1}, "input_invalid", "wait_timeout_seconds"),
    ("update/go", {"wait_timeout_seconds": "5"}, "input_invalid", "wait_timeout_seconds"),
    ("update/go", {"wait_timeout_seconds": True}, "input_invalid", "wait_timeout_seconds"),
    ("update/go", {"request_id": ["k"]}, "request_id_invalid", "request_id"),
]


def tampered_blob() -> str:
    raw = bytearray(base64.b64decode(AesGcmCodec(KEY, "k1").encode([1])))
    raw[-1] ^= 1
    return base64.b64encode(bytes(raw)).decode()


def test_bad_input_is_a_422_with_the_documented_shape_and_writes_nothing(
    client: TestClient, service: AdmissionService, engine: Engine
) -> None:
    started(service)
    post(client, "/api/workflows/wf-1/signal/go", {"request_id": "seen"})
    before = snapshot(engine)
    cases = [
        *REFUSED,
        ("signal/go", {"input": {"codec": "aes-gcm", "blob": tampered_blob()}}, "input_invalid", "input"),
        ("signal/go", {"input": {"codec": "json", "blob": '["\\ud800"]'}}, "input_invalid", "arguments"),
    ]
    for path, body, reason, field in cases:
        response = post(client, f"/api/workflows/wf-1/{path}", body, **{"X-Request-Id": "corr"})
        where = (path, body)
        assert response.status_code == 422, (where, response.text)
        answer = assert_error_shape(response)
        assert (answer["reason"], answer["field"]) == (reason, field), (where, answer)
        assert response.headers["x-request-id"] == "corr"
    raw_cases = [
        b'{"request_id": "a", "request_id": "b"}',
        b'{"request_id": "a", "wait_timeout_seconds": NaN}',
        b'{"request_id": ',
        b"\xff\xfe",
    ]
    for raw in raw_cases:
        response = client.post(
            "/api/workflows/wf-1/update/go",
            content=raw,
            headers={"X-Namespace": NS, "Content-Type": "application/json"},
        )
        assert response.status_code == 422, (raw, response.text)
        refused = assert_error_shape(response)
        assert (refused["reason"], refused["field"]) == ("input_invalid", "body"), raw
    for kind in ("multipart/form-data; boundary=x", "application/x-www-form-urlencoded", "text/plain"):
        response = client.post(
            "/api/workflows/wf-1/signal/go",
            content=b"\x80junk",
            headers={"X-Namespace": NS, "Content-Type": kind},
        )
        assert response.status_code == 422, (kind, response.text)
        assert (assert_error_shape(response)["reason"], response.json()["field"]) == ("input_invalid", "body")
    for path, headers in (
        ("/api/workflows/wf-1/signal/go", {"X-Namespace": ""}),
        ("/api/workflows/wf-1/signal/go", {"X-Namespace": "n" * 256}),
        (f"/api/workflows/{'w' * 256}/signal/go", {"X-Namespace": NS}),
        (f"/api/workflows/wf-1/runs/{'r' * 256}/signal/go", {"X-Namespace": NS}),
        ("/api/workflows/wf%00x/signal/go", {"X-Namespace": NS}),
    ):
        response = client.post(path, json={"request_id": "k"}, headers=headers)
        assert response.status_code == 422, (path, response.text)
        assert assert_error_shape(response)["reason"] == "input_invalid"
    assert diff_snapshots(before, snapshot(engine)) == []


def test_unknown_routes_and_methods_answer_with_the_error_shape(client: TestClient) -> None:
    missing = client.get("/api/nothing")
    assert missing.status_code == 404 and assert_error_shape(missing)["reason"] == "not_found"
    method = client.delete("/api/workflows/wf-1/signal/go")
    assert method.status_code == 405 and assert_error_shape(method)["reason"] == "method_not_allowed"


def test_the_openapi_document_describes_the_routes_and_the_error_shape(client: TestClient) -> None:
    document = client.get("/openapi.json").json()
    assert set(document["paths"]) == {
        "/api/workflows/{workflow_id}/signal/{name}",
        "/api/workflows/{workflow_id}/runs/{run_id}/signal/{name}",
        "/api/workflows/{workflow_id}/update/{name}",
        "/api/workflows/{workflow_id}/runs/{run_id}/update/{name}",
        "/api/workflows/{workflow_id}/receipts/{command_type}",
        # The engine's routes (tests/integration/test_http_lifecycle.py).
        "/api/workflows/{workflow_id}/runs",
        "/api/workflows/{workflow_id}/close",
        "/api/workflows/{workflow_id}/continue-as-new",
        "/api/workflows/{workflow_id}/signals/{command_id}/apply",
        "/api/workflows/{workflow_id}/updates/{update_id}/complete",
        "/api/workflows/{workflow_id}/updates/{update_id}/fail",
    }
    schemas = document["components"]["schemas"]
    assert "HTTPValidationError" not in schemas
    assert set(schemas["ErrorBody"]["required"]) == {"reason", "message"}
    assert schemas["SignalRequest"]["additionalProperties"] is False
    signal = document["paths"]["/api/workflows/{workflow_id}/signal/{name}"]["post"]
    assert any(p["name"] == "X-Namespace" and p["in"] == "header" for p in signal["parameters"])


# -- codecs over the wire --------------------------------------------------------------------------


def test_two_encryptions_of_one_intent_are_retained_and_a_forged_blob_is_refused(
    client: TestClient, service: AdmissionService, engine: Engine
) -> None:
    started(service)
    codec = AesGcmCodec(KEY, "k1")
    arguments = {"card": "4111 1111 1111 1111", "amount": 12.5}
    first = post(
        client,
        "/api/workflows/wf-1/update/charge",
        {"request_id": "c-1", "input": envelope(codec, arguments)},
    )
    second_blob = envelope(codec, arguments)
    assert second_blob["blob"] != json.loads(first.request.content)["input"]["blob"]
    retry = post(client, "/api/workflows/wf-1/update/charge", {"request_id": "c-1", "input": second_blob})
    assert (first.status_code, retry.status_code) == (202, 202)
    assert retry.json()["retained"] is True and retry.json()["command_id"] == first.json()["command_id"]
    # The digest is over the plaintext: the same arguments in the clear are the same intent.
    clear = post(
        client, "/api/workflows/wf-1/update/charge", {"request_id": "c-1", "input": json_input(arguments)}
    )
    assert clear.json()["retained"] is True
    other_key = envelope(AesGcmCodec(bytes(32), "k1"), arguments)
    before = snapshot(engine)
    forged = post(client, "/api/workflows/wf-1/update/charge", {"request_id": "c-2", "input": other_key})
    assert diff_snapshots(before, snapshot(engine)) == []
    body = assert_error_shape(forged)
    assert (forged.status_code, body["reason"], body["field"]) == (422, "input_invalid", "input")
    assert "authentication" in body["message"]


def test_a_server_without_the_encryption_codec_refuses_it(service: AdmissionService) -> None:
    started(service)
    plain = TestClient(create_app(service))
    response = post(plain, "/api/workflows/wf-1/signal/go", {"input": envelope(AesGcmCodec(KEY, "k1"), [1])})
    assert response.status_code == 422 and "not accepted here" in assert_error_shape(response)["message"]


@settings(max_examples=25, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(arguments=ARGUMENTS, retry_codec=st.sampled_from(["cbor", "aes-gcm"]))
def test_a_retry_in_any_codec_of_the_same_arguments_is_retained(
    client: TestClient, service: AdmissionService, arguments: object, retry_codec: str
) -> None:
    workflow_id = f"wf-{uuid.uuid4().hex}"
    service.start_run(NS, workflow_id)
    codecs = {"cbor": CborCodec(), "aes-gcm": AesGcmCodec(KEY, "k1")}
    first_input = envelope(CborCodec(), arguments)  # type: ignore[arg-type]
    retry_input = envelope(codecs[retry_codec], arguments)  # type: ignore[arg-type]
    path = f"/api/workflows/{workflow_id}/signal/go"
    first = post(client, path, {"request_id": "k", "input": first_input})
    retry = post(client, path, {"request_id": "k", "input": retry_input})
    assert first.status_code == 202, first.text
    assert retry.json()["retained"] is True
    assert retry.json()["command_id"] == first.json()["command_id"]
    history = service.history(NS, workflow_id)
    assert sum(1 for e in history if e.event_type == "SignalReceived") == 1


# -- storage failures and mounting ----------------------------------------------------------------


def test_a_storage_failure_is_a_retryable_503(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path)
    store = SqlStore.open(url)
    try:
        client = make_client(AdmissionService(store))
        store.engine.dispose()
        # The database file goes away under the running server: every table is gone.
        Path(url.removeprefix("sqlite:///")).unlink()
        response = client.post(
            "/api/workflows/wf-1/signal/go", json={"request_id": "k"}, headers={"X-Request-Id": "c"}
        )
        body = assert_error_shape(response)
        assert (response.status_code, body["reason"], body["retryable"]) == (503, "storage_unavailable", True)
        assert response.headers["x-request-id"] == "c"
    finally:
        store.dispose()


def test_the_app_mounts_under_an_engines_own_app(service: AdmissionService) -> None:
    started(service)
    engine_app = FastAPI()

    @engine_app.get("/health")
    def health() -> dict[str, str]:
        return {"status": "ok"}

    engine_app.mount("/admission", create_app(service))
    client = TestClient(engine_app)
    assert client.get("/health").json() == {"status": "ok"}
    response = post(
        client, "/admission/api/workflows/wf-1/signal/go", {"request_id": "m"}, **{"X-Request-Id": "z"}
    )
    assert response.status_code == 202 and response.headers["x-request-id"] == "z"
    assert response.json()["request_id"] == "m"


# -- admission serve: a real server process on a real socket ---------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def serving(
    db_url: str, *extra: str, env: dict[str, str] | None = None
) -> Iterator[tuple[str, dict[str, Any]]]:
    """``admission serve`` as a subprocess; yields its base URL and the JSON line it printed."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "admission", "--db", db_url, "serve", "--port", str(port), *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )
    try:
        assert process.stdout is not None
        announced = json.loads(process.stdout.readline() or "null")
        assert announced is not None, process.stderr.read() if process.stderr else ""
        base = f"http://127.0.0.1:{port}"
        for _ in range(600):
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                assert process.poll() is None, process.stderr.read() if process.stderr else ""
                time.sleep(0.05)
        yield base, announced
    finally:
        process.send_signal(signal.SIGTERM)
        _, log = process.communicate(timeout=30)
        # uvicorn shuts down gracefully, then re-raises SIGTERM so the exit status tells the truth.
        assert process.returncode == -signal.SIGTERM, log
        assert "Finished server process" in log


def test_admission_serve_admits_over_a_real_socket(db_url: str) -> None:
    store = SqlStore.open(db_url)
    service = AdmissionService(store)
    try:
        started(service)
        key_env = {"ADMISSION_AES_GCM_KEY": base64.b64encode(KEY).decode(), "ADMISSION_AES_GCM_KEY_ID": "k1"}
        with serving(db_url, env=key_env) as (base, announced), httpx.Client(base_url=base) as http:
            assert announced["serving"] == base  # loopback unless told otherwise
            assert announced["codecs"] == ["json", "cbor", "aes-gcm"]
            assert announced["aes_gcm_key_id"] == "k1"
            body = {"request_id": "over-the-wire", "input": envelope(AesGcmCodec(KEY, "k1"), {"n": 1})}
            headers = {"X-Namespace": NS, "X-Request-Id": "corr-1"}
            first = http.post("/api/workflows/wf-1/signal/go", json=body, headers=headers)
            body["input"] = envelope(AesGcmCodec(KEY, "k1"), {"n": 1})  # a new nonce
            retry = http.post("/api/workflows/wf-1/signal/go", json=body, headers=headers)
        assert (first.status_code, retry.status_code) == (202, 202)
        assert first.headers["x-request-id"] == "corr-1"
        assert (first.json()["retained"], retry.json()["retained"]) == (False, True)
        assert retry.json()["command_id"] == first.json()["command_id"]
        receipt = service.receipt(NS, "wf-1", "signal", "over-the-wire")
        assert receipt is not None and receipt.command_id == first.json()["command_id"]
    finally:
        store.dispose()


@pytest.mark.parametrize(
    ("key", "message"),
    [
        (base64.b64encode(b"short").decode(), "must decode to 16, 24 or 32 bytes, got 5"),
        ("not*base64", "not standard base64"),
        ("clé-non-ascii", "not standard base64"),
    ],
)
def test_admission_serve_refuses_a_bad_key_before_listening(tmp_path: Path, key: str, message: str) -> None:
    url = sqlite_url(tmp_path)
    result = subprocess.run(
        [sys.executable, "-m", "admission", "--db", url, "serve", "--port", str(free_port())],
        capture_output=True,
        text=True,
        env={**os.environ, "ADMISSION_AES_GCM_KEY": key},
        timeout=60,
    )
    assert result.returncode == 2, result.stderr
    assert f"ADMISSION_AES_GCM_KEY: {message}" in result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""


def test_every_python_block_of_the_http_guide_runs() -> None:
    text = (Path(__file__).resolve().parents[2] / "docs" / "http.md").read_text(encoding="utf-8")
    blocks = re.findall(r"^```python\n(.*?)^```", text, re.MULTILINE | re.DOTALL)
    assert len(blocks) >= 3
    namespace: dict[str, object] = {"__name__": "docs.http"}
    for number, block in enumerate(blocks, 1):
        exec(compile(block, f"http.md[block {number}]", "exec"), namespace)
