"""The engine's routes over HTTP, on SQLite and PostgreSQL: runs and the progress of commands.

A whole lifecycle is driven through the app alone (start, signal, apply,
update, complete, fail, continue as new, close), with the synchronous and the
async service; each refusal answers its status and reason; bad input and
refused access write nothing (the whole database is compared before and after).
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi import FastAPI
from sqlalchemy import Engine

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

from admission.aio import AsyncAdmissionService
from admission.http import (
    AuthRequest,
    BearerTokens,
    CborCodec,
    NamespaceForbiddenError,
    Principal,
    TokenGrant,
    create_app,
    envelope,
    is_engine_path,
    token_digest,
)
from admission.receipts import AdmissionService
from admission.receipts._rules import CLOSE_EVENTS
from tests.support.aio import AsyncTwins
from tests.support.backends import SQL_BACKENDS
from tests.support.snapshot import diff_snapshots, snapshot

pytestmark = pytest.mark.filterwarnings("ignore:Using `httpx` with `starlette.testclient`")

NS = "tenant-a"
WF = "/api/workflows/wf-1"
TOKEN = "adm_" + "c3" * 32
CALLER_TOKEN = "adm_" + "5e" * 32
ENGINE_PATHS = {
    "/api/workflows/{workflow_id}/runs",
    "/api/workflows/{workflow_id}/close",
    "/api/workflows/{workflow_id}/continue-as-new",
    "/api/workflows/{workflow_id}/signals/{command_id}/apply",
    "/api/workflows/{workflow_id}/updates/{update_id}/complete",
    "/api/workflows/{workflow_id}/updates/{update_id}/fail",
}
ONE_BACKEND = pytest.mark.parametrize("sql_backend", SQL_BACKENDS[:1], indirect=True)


@pytest.fixture
def twins() -> Iterator[AsyncTwins]:
    made = AsyncTwins()
    yield made
    made.close()


def make_client(service: AdmissionService | AsyncAdmissionService, **options: Any) -> TestClient:
    return TestClient(create_app(service, **options), raise_server_exceptions=False)


@pytest.fixture
def client(service: AdmissionService, twins: AsyncTwins) -> TestClient:
    """The app as ``admission serve`` runs it: the async service on the test's database."""
    return make_client(twins.twin(service))


def post(client: TestClient, path: str, body: object = None, **headers: str) -> Any:
    content = None if body is None else json.dumps(body).encode("ascii")
    kinds = {} if body is None else {"Content-Type": "application/json"}
    return client.post(path, content=content, headers={"X-Namespace": NS, **kinds, **headers})


def ok(response: Any, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body = response.json()
    assert isinstance(body, dict)
    return body


def refused(response: Any, status: int, reason: str) -> dict[str, Any]:
    body = ok(response, status)
    assert body["reason"] == reason, body
    assert isinstance(body["message"], str) and body["message"]
    assert "outcome" not in body
    return body


def cbor(value: object) -> dict[str, str]:
    return envelope(CborCodec(), value)  # type: ignore[arg-type]


def json_envelope(text: str) -> dict[str, str]:
    return {"codec": "json", "blob": text}


def events(service: AdmissionService) -> list[tuple[str, str | None]]:
    return [(e.event_type, e.command_id) for e in service.history(NS, "wf-1")]


# -- a whole lifecycle ---------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["async", "sync"])
def test_a_whole_lifecycle_runs_through_the_app(
    service: AdmissionService, twins: AsyncTwins, kind: str
) -> None:
    client = make_client(twins.twin(service) if kind == "async" else service)
    first = ok(post(client, f"{WF}/runs", {"run_id": "run-1"}), 201)
    assert (first["run_id"], first["run_number"], first["status"]) == ("run-1", 1, "open")
    assert first["namespace"] == NS and first["closed_at"] is None

    # A signal is received, then applied by the engine; applying it again is a retry.
    signal = ok(post(client, f"{WF}/signal/paid", {"request_id": "s1"}), 202)
    applied = ok(post(client, f"{WF}/signals/{signal['command_id']}/apply"), 200)
    assert (applied["signal_status"], applied["http_status"], applied["retained"]) == ("applied", 202, False)
    again = ok(post(client, f"{WF}/signals/{signal['command_id']}/apply", {}), 200)
    assert again["retained"] is True and again["command_id"] == signal["command_id"]

    # An update is completed with a typed result, carried by cbor: bytes and -0.0 survive.
    update = ok(post(client, f"{WF}/update/approve", {"request_id": "u1"}), 202)
    result = {"blob": b"\x00\xff", "zero": -0.0, "n": 1}
    done = ok(post(client, f"{WF}/updates/{update['update_id']}/complete", {"result": cbor(result)}), 200)
    assert (done["outcome"], done["http_status"], done["update_status"]) == ("completed", 200, "completed")
    assert done["result"] == {"blob": {"$bytes": "00ff"}, "zero": -0.0, "n": 1}
    stored = service.receipt(NS, "wf-1", "update", "u1")
    assert stored is not None and stored.result == result
    assert isinstance(stored.result, dict) and math.copysign(1.0, stored.result["zero"]) == -1.0
    # The caller's retry finds the completion; the same completion again is a retry too.
    retry = ok(post(client, f"{WF}/update/approve", {"request_id": "u1"}), 200)
    assert retry["retained"] is True and retry["result"] == done["result"]
    same = ok(post(client, f"{WF}/updates/{update['update_id']}/complete", {"result": cbor(result)}), 200)
    assert same["retained"] is True

    # Absent result is null; a failure's receipt says 422 to the caller's retry.
    nothing = ok(post(client, f"{WF}/update/approve", {"request_id": "u2"}), 202)
    finished = ok(post(client, f"{WF}/updates/{nothing['update_id']}/complete"), 200)
    assert finished["result"] is None
    doomed = ok(post(client, f"{WF}/update/approve", {"request_id": "u3"}), 202)
    failed = ok(post(client, f"{WF}/updates/{doomed['update_id']}/fail", {"failure": "no stock"}), 200)
    assert (failed["outcome"], failed["http_status"], failed["failure"]) == ("failed", 422, "no stock")
    caller = post(client, f"{WF}/update/approve", {"request_id": "u3"})
    assert caller.status_code == 422 and caller.json()["failure"] == "no stock"

    # Continue-as-new hands a pending instance-scope signal on; a run-scope one closes with its run.
    handed = ok(post(client, f"{WF}/signal/paid", {"request_id": "s2"}), 202)
    pinned = ok(post(client, f"{WF}/runs/run-1/signal/paid", {"request_id": "s3"}), 202)
    successor = ok(post(client, f"{WF}/continue-as-new", {"run_id": "run-1", "new_run_id": "run-2"}), 201)
    assert (successor["run_id"], successor["run_number"]) == ("run-2", 2)
    assert successor["continued_from_run_id"] == "run-1" and successor["status"] == "open"
    assert ("CommandHandedOff", handed["command_id"]) in events(service)
    ok(post(client, f"{WF}/signals/{handed['command_id']}/apply"), 200)
    late = refused(post(client, f"{WF}/signals/{pinned['command_id']}/apply"), 409, "run_state")
    assert late["state_reason"] == "signal_rejected"

    # Closing rejects what is still pending; the instance can then start again.
    pending = ok(post(client, f"{WF}/signal/paid", {"request_id": "s4"}), 202)
    closed = ok(post(client, f"{WF}/close", {"status": "completed"}), 200)
    assert (closed["run_id"], closed["status"]) == ("run-2", "completed") and closed["closed_at"]
    refused(post(client, f"{WF}/signals/{pending['command_id']}/apply"), 409, "run_state")
    assert ("SignalRejected", pending["command_id"]) in events(service)
    third = ok(post(client, f"{WF}/runs"), 201)
    assert third["run_number"] == 3 and third["continued_from_run_id"] is None
    assert [e for e, _ in events(service) if e.startswith("Run")] == [
        "RunStarted",
        "RunClosed",
        "RunStarted",
        "RunClosed",
        "RunStarted",
    ]


# -- refusals ------------------------------------------------------------------------------


def test_each_refusal_answers_its_status_and_reason_and_writes_nothing(
    client: TestClient, service: AdmissionService, engine: Engine
) -> None:
    signal = service.admit_signal(NS, "wf-2", "go", [], request_id="s")  # no run: refused, recorded
    assert signal.outcome == "run_not_active"
    run = service.start_run(NS, "wf-1")
    update = service.admit_update(NS, "wf-1", "approve", [], request_id="u")
    service.complete_update(NS, "wf-1", update.update_id or "", "yes")
    received = service.admit_signal(NS, "wf-1", "go", [], request_id="s")
    before = snapshot(engine)
    cases = [
        (f"{WF}/runs", None, 409, "run_state", "run_already_open"),
        ("/api/workflows/wf-2/close", {"status": "failed"}, 409, "run_state", "run_not_active"),
        ("/api/workflows/wf-2/continue-as-new", None, 409, "run_state", "run_not_active"),
        (f"{WF}/close", {"status": "completed", "run_id": "other"}, 409, "run_state", "run_not_active"),
        (f"{WF}/continue-as-new", {"run_id": "other"}, 409, "run_state", "run_not_active"),
        (f"{WF}/updates/{update.update_id}/complete", {"result": cbor("no")}, 409, "run_state", None),
        (f"{WF}/updates/{update.update_id}/fail", {"failure": "late"}, 409, "run_state", None),
        (f"{WF}/signals/nope/apply", None, 404, "command_unknown", None),
        (f"{WF}/signals/{update.command_id}/apply", None, 404, "command_unknown", None),  # an update's
        (f"/api/workflows/wf-2/signals/{signal.command_id}/apply", None, 404, "command_unknown", None),
        (f"{WF}/updates/nope/complete", None, 404, "update_unknown", None),
        (f"{WF}/updates/nope/fail", {"failure": "x"}, 404, "update_unknown", None),
        (f"/api/workflows/wf-9/updates/{update.update_id}/complete", None, 404, "update_unknown", None),
    ]
    for path, body, status, reason, state_reason in cases:
        response = post(client, path, body, **{"X-Request-Id": "corr-9"})
        answer = refused(response, status, reason)
        assert response.headers["x-request-id"] == "corr-9", path
        if state_reason is not None:
            assert answer["state_reason"] == state_reason, (path, answer)
        if reason == "command_unknown":
            assert isinstance(answer["command_id"], str)
        if reason == "update_unknown":
            assert isinstance(answer["update_id"], str)
    assert diff_snapshots(before, snapshot(engine)) == []
    # The run and the received signal are as they were: the engine can go on.
    assert ok(post(client, f"{WF}/signals/{received.command_id}/apply"), 200)["signal_status"] == "applied"
    assert ok(post(client, f"{WF}/close", {"status": "cancelled", "run_id": run.run_id}), 200)["status"] == (
        "cancelled"
    )


def test_bad_input_is_refused_naming_the_field_and_writes_nothing(
    client: TestClient, service: AdmissionService, engine: Engine
) -> None:
    service.start_run(NS, "wf-1")
    update = service.admit_update(NS, "wf-1", "approve", [], request_id="u")
    signal = service.admit_signal(NS, "wf-1", "go", [], request_id="s")
    complete = f"{WF}/updates/{update.update_id}/complete"
    fail = f"{WF}/updates/{update.update_id}/fail"
    apply = f"{WF}/signals/{signal.command_id}/apply"
    long_id = "r" * 37
    cases: list[tuple[str, object, str]] = [
        (f"{WF}/runs", {"nope": 1}, "nope"),
        (f"{WF}/runs", {"run_id": 5}, "run_id"),
        ("/api/workflows/wf-3/runs", {"run_id": long_id}, "run_id"),  # past the column's bound
        ("/api/workflows/wf-3/runs", {"run_id": "a\u0000b"}, "run_id"),
        (f"/api/workflows/{'w' * 256}/runs", None, "workflow_id"),
        (f"{WF}/close", None, "status"),
        (f"{WF}/close", {}, "status"),
        (f"{WF}/close", {"status": "continued"}, "status"),  # only through continue-as-new
        (f"{WF}/close", {"status": "open"}, "status"),
        (f"{WF}/close", {"status": "completed", "extra": True}, "extra"),
        (f"{WF}/close", {"status": "completed", "run_id": long_id}, "run_id"),
        (f"{WF}/continue-as-new", {"new_run_id": ""}, "new_run_id"),
        (f"{WF}/continue-as-new", {"new_run_id": long_id}, "new_run_id"),
        (f"{WF}/continue-as-new", {"status": "completed"}, "status"),
        (apply, {"force": True}, "force"),
        (f"{WF}/signals/{'c' * 37}/apply", None, "command_id"),
        (complete, {"result": 5}, "result"),
        (complete, {"result": {"codec": "json"}}, "result.blob"),
        (complete, {"result": {"codec": "json", "blob": "[1]", "key": "k"}}, "result.key"),
        (complete, {"result": {"codec": "yaml", "blob": "1"}}, "result"),
        (complete, {"result": {"codec": "cbor", "blob": "!!"}}, "result"),
        (complete, {"result": json_envelope("[1e400]")}, "result"),
        (complete, {"result": json_envelope("9223372036854775808")}, "result"),  # past int64: the service's
        (complete, {"result": json_envelope('"\\ud800"')}, "result"),  # a lone surrogate
        (complete, {"result": cbor(1), "failure": "x"}, "failure"),
        (f"{WF}/updates/{'u' * 37}/complete", None, "update_id"),
        (fail, None, "failure"),
        (fail, {}, "failure"),
        (fail, {"failure": ""}, "failure"),
        (fail, {"failure": 5}, "failure"),
        (fail, {"failure": "a\u0000b"}, "failure"),
        (fail, {"failure": "x" * 70_000}, "failure"),
    ]
    before = snapshot(engine)
    for path, body, field in cases:
        answer = refused(post(client, path, body), 422, "input_invalid")
        assert answer["field"] == field, (path, body, answer)
    # Duplicate members and NaN are refused before the body is read as a model.
    for raw in (b'{"status": "failed", "status": "completed"}', b'{"status": NaN}'):
        response = client.post(
            f"{WF}/close", content=raw, headers={"X-Namespace": NS, "Content-Type": "application/json"}
        )
        assert refused(response, 422, "input_invalid")["field"] == "body"
    empty_namespace = client.post(f"{WF}/runs", headers={"X-Namespace": ""})
    assert refused(empty_namespace, 422, "input_invalid")["field"] == "namespace"
    assert diff_snapshots(before, snapshot(engine)) == []
    # Nothing was spent: the update and the signal still await the engine.
    assert ok(post(client, fail, {"failure": "declined"}), 200)["outcome"] == "failed"
    assert ok(post(client, apply), 200)["signal_status"] == "applied"


# -- access --------------------------------------------------------------------------------


def test_the_engine_routes_are_behind_the_authorizer_and_a_refusal_writes_nothing(
    service: AdmissionService, twins: AsyncTwins, engine: Engine
) -> None:
    tokens = BearerTokens([TokenGrant("engine-a", token_digest(TOKEN), (NS,))])
    client = make_client(twins.twin(service), authorize=tokens)
    service.start_run(NS, "wf-1")
    service.start_run("tenant-b", "wf-1")
    update = service.admit_update(NS, "wf-1", "approve", [], request_id="u")
    signal = service.admit_signal(NS, "wf-1", "go", [], request_id="s")
    routes: list[tuple[str, object]] = [
        ("/api/workflows/wf-new/runs", None),
        (f"{WF}/signals/{signal.command_id}/apply", None),
        (f"{WF}/updates/{update.update_id}/complete", {"result": cbor(b"ok")}),
        (f"{WF}/updates/{update.update_id}/fail", {"failure": "no"}),
        (f"{WF}/close", {"status": "terminated"}),
        (f"{WF}/continue-as-new", None),
    ]
    granted = {"Authorization": f"Bearer {TOKEN}"}
    before = snapshot(engine)
    for path, body in routes:
        unauthenticated = post(client, path, body, **{"X-Request-Id": "corr-1"})
        assert refused(unauthenticated, 401, "unauthenticated")
        assert unauthenticated.headers["www-authenticate"].startswith("Bearer ")
        assert unauthenticated.headers["x-request-id"] == "corr-1"
        other = client.post(path, json=body, headers={"X-Namespace": "tenant-b", **granted})
        refused(other, 403, "namespace_forbidden")
        # The gate answers before the body is read: a body that is not JSON changes nothing.
        garbage = client.post(path, content=b"{nope", headers={"X-Namespace": NS})
        assert garbage.status_code == 401
    assert diff_snapshots(before, snapshot(engine)) == []
    statuses = [post(client, path, body, **granted).status_code for path, body in routes]
    # Completing, then failing, one update: the failure is refused (409) once it completed.
    assert statuses == [201, 200, 200, 409, 200, 409]


@ONE_BACKEND
def test_an_authorizer_can_keep_callers_off_the_engine_routes(
    service: AdmissionService, twins: AsyncTwins, engine: Engine
) -> None:
    tokens = BearerTokens(
        [
            TokenGrant("caller", token_digest(CALLER_TOKEN), (NS,)),
            TokenGrant("engine", token_digest(TOKEN), (NS,)),
        ]
    )

    def callers_and_engine(request: AuthRequest) -> Principal:
        principal = tokens(request)
        if is_engine_path(request.path) and principal.name != "engine":
            raise NamespaceForbiddenError(
                f"{principal.name} may not drive runs", namespace=request.namespace, principal=principal.name
            )
        return principal

    engine_app = FastAPI()
    engine_app.mount("/admission", create_app(twins.twin(service), authorize=callers_and_engine))
    client = TestClient(engine_app, raise_server_exceptions=False)
    service.start_run(NS, "wf-1")
    caller = {"X-Namespace": NS, "Authorization": f"Bearer {CALLER_TOKEN}"}
    engine_side = {"X-Namespace": NS, "Authorization": f"Bearer {TOKEN}"}
    update = ok(client.post(f"/admission{WF}/update/approve", json={"request_id": "u"}, headers=caller), 202)
    complete = f"/admission{WF}/updates/{update['update_id']}/complete"
    before = snapshot(engine)
    refused(client.post(complete, json={"result": cbor("mine")}, headers=caller), 403, "namespace_forbidden")
    refused(
        client.post(f"/admission{WF}/close", json={"status": "failed"}, headers=caller),
        403,
        "namespace_forbidden",
    )
    assert diff_snapshots(before, snapshot(engine)) == []
    done = ok(client.post(complete, json={"result": cbor("yes")}, headers=engine_side), 200)
    assert done["outcome"] == "completed"
    again = ok(client.post(f"/admission{WF}/update/approve", json={"request_id": "u"}, headers=caller), 200)
    assert again["result"] == "yes"
    # The helper names exactly the engine's routes of the document.
    document = client.get("/admission/openapi.json").json()
    assert {path for path in document["paths"] if is_engine_path(path)} == ENGINE_PATHS


# -- the document --------------------------------------------------------------------------


@ONE_BACKEND
def test_the_openapi_document_lists_the_engine_routes_with_their_answers(client: TestClient) -> None:
    document = client.get("/openapi.json").json()
    paths = document["paths"]
    expected = {
        "/api/workflows/{workflow_id}/runs": ("201", "RunAnswer", {"409"}),
        "/api/workflows/{workflow_id}/close": ("200", "RunAnswer", {"409"}),
        "/api/workflows/{workflow_id}/continue-as-new": ("201", "RunAnswer", {"409"}),
        "/api/workflows/{workflow_id}/signals/{command_id}/apply": ("200", "AdmissionAnswer", {"404", "409"}),
        "/api/workflows/{workflow_id}/updates/{update_id}/complete": (
            "200",
            "AdmissionAnswer",
            {"404", "409"},
        ),
        "/api/workflows/{workflow_id}/updates/{update_id}/fail": ("200", "AdmissionAnswer", {"404", "409"}),
    }
    for path, (success, model, refusals) in expected.items():
        responses = paths[path]["post"]["responses"]
        schema = responses[success]["content"]["application/json"]["schema"]
        assert schema["$ref"].endswith(f"/{model}"), path
        assert refusals | {"401", "403", "413", "422", "503"} <= set(responses), path
        for status in refusals | {"422"}:
            assert responses[status]["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorBody")
        assert any(p["name"] == "X-Namespace" for p in paths[path]["post"]["parameters"]), path
    schemas = document["components"]["schemas"]
    closing = schemas["CloseRunRequest"]["properties"]["status"]["enum"]
    assert closing == ["completed", "failed", "cancelled", "terminated"]
    assert set(closing) == set(CLOSE_EVENTS) - {"continued"}  # the service's closing statuses
    assert schemas["CloseRunRequest"]["additionalProperties"] is False
    assert "HTTPValidationError" not in schemas
