"""Who may call the HTTP adapter: bearer tokens, the authorisation hook, the namespace header.

Each refusal is checked against the whole database: a snapshot before and
after shows that nothing was written (the gate runs before the body is read).
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
from fastapi import FastAPI
from sqlalchemy import Engine

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

from admission.client import AccessDenied, AdmissionClient
from admission.http import (
    AuthenticationError,
    AuthRequest,
    BearerTokens,
    NamespaceForbiddenError,
    Principal,
    TokenGrant,
    create_app,
    principal_in,
    token_digest,
)
from admission.receipts import AdmissionService
from tests.support.backends import SQL_BACKENDS
from tests.support.snapshot import diff_snapshots, snapshot

pytestmark = [
    pytest.mark.filterwarnings("ignore:Using `httpx` with `starlette.testclient`"),
    pytest.mark.filterwarnings("ignore:You should not use the 'timeout' argument with the TestClient"),
]

# The gate answers before any store call: what it decides does not depend on the
# backend, so these run on the first one selected; the refusals that must write
# nothing run on every backend.
ONE_BACKEND = pytest.mark.parametrize("sql_backend", SQL_BACKENDS[:1], indirect=True)

TOKEN_A = "adm_" + "a1" * 32
TOKEN_OTHER = "adm_" + "0f" * 32
SIGNAL = "/api/workflows/wf-1/signal/go"


def grants() -> BearerTokens:
    return BearerTokens([TokenGrant("engine-a", token_digest(TOKEN_A), ("a", "über"))])


def guarded(service: AdmissionService, authorize: Any = None) -> TestClient:
    app = create_app(service, authorize=grants() if authorize is None else authorize)
    return TestClient(app, raise_server_exceptions=False)


def send(client: TestClient, namespace: str | bytes, token: str | None, **body: object) -> Any:
    headers: dict[str, str | bytes] = {"X-Namespace": namespace, "X-Request-Id": "corr-1"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    return client.post(SIGNAL, json={"request_id": "k", **body}, headers=headers)


@pytest.fixture
def open_runs(service: AdmissionService) -> None:
    for namespace in ("a", "b", "über"):
        service.start_run(namespace, "wf-1")


# -- bearer tokens --------------------------------------------------------------------------


@pytest.mark.usefixtures("open_runs")
@pytest.mark.parametrize(
    ("namespace", "token", "status", "reason"),
    [
        ("a", None, 401, "unauthenticated"),
        ("a", TOKEN_OTHER, 401, "unauthenticated"),
        ("a", token_digest(TOKEN_A), 401, "unauthenticated"),  # the stored hash is not the token
        ("b", TOKEN_A, 403, "namespace_forbidden"),
        ("default", TOKEN_A, 403, "namespace_forbidden"),
    ],
)
def test_a_request_the_tokens_do_not_allow_is_refused_and_writes_nothing(
    service: AdmissionService, engine: Engine, namespace: str, token: str | None, status: int, reason: str
) -> None:
    client = guarded(service)
    before = snapshot(engine)
    response = send(client, namespace, token)
    assert diff_snapshots(before, snapshot(engine)) == []
    body = response.json()
    assert (response.status_code, body["reason"]) == (status, reason)
    assert isinstance(body["message"], str) and body["message"]
    assert "outcome" not in body and "retryable" not in body
    assert response.headers["x-request-id"] == "corr-1"  # echoed, as on every answer
    if status == 401:
        challenge = response.headers["www-authenticate"]
        assert challenge.startswith("Bearer ")
        assert ('error="invalid_token"' in challenge) == (token is not None)
    else:
        assert "www-authenticate" not in response.headers
    assert TOKEN_A not in response.text and token_digest(TOKEN_A) not in response.text
    for key in ("a", "b"):
        assert service.receipt(key, "wf-1", "signal", "k") is None


@pytest.mark.usefixtures("open_runs")
def test_a_granted_token_acts_in_its_namespace(service: AdmissionService) -> None:
    client = guarded(service)
    response = send(client, "a", TOKEN_A)
    assert response.status_code == 202 and response.json()["namespace"] == "a"
    receipt = service.receipt("a", "wf-1", "signal", "k")
    assert receipt is not None and receipt.command_id == response.json()["command_id"]
    # Reading a receipt is guarded the same way.
    path = "/api/workflows/wf-1/receipts/signal"
    read = client.get(path, params={"request_id": "k"}, headers={"X-Namespace": "a"})
    assert read.status_code == 401
    read = client.get(
        path, params={"request_id": "k"}, headers={"X-Namespace": "b", "Authorization": f"Bearer {TOKEN_A}"}
    )
    assert read.status_code == 403
    read = client.get(
        path, params={"request_id": "k"}, headers={"X-Namespace": "a", "Authorization": f"Bearer {TOKEN_A}"}
    )
    assert read.status_code == 202 and read.json()["command_id"] == response.json()["command_id"]


@pytest.mark.usefixtures("open_runs")
def test_authorisation_comes_before_the_body_is_read(service: AdmissionService, engine: Engine) -> None:
    client = guarded(service)
    before = snapshot(engine)
    for content in (b"{not json", b'{"request_id": "k", "request_id": "k2"}', b"x" * 100_000):
        response = client.post(
            SIGNAL, content=content, headers={"X-Namespace": "a", "Content-Type": "application/json"}
        )
        assert response.status_code == 401, response.text
    assert diff_snapshots(before, snapshot(engine)) == []


@ONE_BACKEND
def test_the_openapi_document_stays_open_and_lists_the_refusals(service: AdmissionService) -> None:
    client = guarded(service)
    document = client.get("/openapi.json")
    assert document.status_code == 200
    responses = document.json()["paths"]["/api/workflows/{workflow_id}/signal/{name}"]["post"]["responses"]
    assert {"401", "403"} <= set(responses)
    assert client.get("/no/such/route").status_code == 401  # the routes are not listed to a stranger


@ONE_BACKEND
@pytest.mark.usefixtures("open_runs")
def test_a_mounted_app_is_guarded_under_its_prefix(service: AdmissionService) -> None:
    engine_app = FastAPI()
    engine_app.mount("/admission", create_app(service, authorize=grants()))
    client = TestClient(engine_app)
    path = f"/admission{SIGNAL}"
    assert client.post(path, json={}, headers={"X-Namespace": "a"}).status_code == 401
    allowed = client.post(path, json={}, headers={"X-Namespace": "a", "Authorization": f"Bearer {TOKEN_A}"})
    assert allowed.status_code == 202
    assert client.get("/admission/openapi.json").status_code == 200


# -- the hook -------------------------------------------------------------------------------


@pytest.mark.usefixtures("open_runs")
def test_the_hook_sees_the_decoded_namespace_and_can_refuse(
    service: AdmissionService, engine: Engine
) -> None:
    seen: list[AuthRequest] = []

    def engine_policy(request: AuthRequest) -> Principal:
        seen.append(request)
        if request.headers.get("x-engine-user") is None:
            raise AuthenticationError("the engine's session is missing")
        if request.namespace != "über":
            raise NamespaceForbiddenError("not yours", namespace=request.namespace)
        return Principal(str(request.headers["x-engine-user"]))

    client = guarded(service, engine_policy)
    before = snapshot(engine)
    assert send(client, "%C3%BCber", None).status_code == 401
    refused = client.post(SIGNAL, json={}, headers={"X-Namespace": "a", "X-Engine-User": "ada"})
    assert (refused.status_code, refused.json()["reason"]) == (403, "namespace_forbidden")
    assert diff_snapshots(before, snapshot(engine)) == []
    allowed = client.post(SIGNAL, json={}, headers={"X-Namespace": "%C3%BCber", "X-Engine-User": "ada"})
    assert allowed.status_code == 202 and allowed.json()["namespace"] == "über"
    assert [(r.namespace, r.method, r.path) for r in seen] == [
        ("über", "POST", SIGNAL),
        ("a", "POST", SIGNAL),
        ("über", "POST", SIGNAL),
    ]


@ONE_BACKEND
@pytest.mark.usefixtures("open_runs")
def test_an_async_hook_is_awaited_and_the_principal_reaches_the_route(service: AdmissionService) -> None:
    async def engine_policy(request: AuthRequest) -> Principal:
        return Principal(f"user-of-{request.namespace}")

    app = create_app(service, authorize=engine_policy)
    principals: list[Principal | None] = []

    @app.middleware("http")
    async def record(request: Any, call_next: Any) -> Any:
        response = await call_next(request)
        principals.append(principal_in(request.scope))
        return response

    client = TestClient(app)
    assert client.post(SIGNAL, json={}, headers={"X-Namespace": "b"}).status_code == 202
    assert principals == [Principal("user-of-b")]


@pytest.mark.usefixtures("open_runs")
@pytest.mark.parametrize("kind", ["raises", "returns-none"])
def test_a_broken_hook_lets_no_one_in(service: AdmissionService, engine: Engine, kind: str) -> None:
    def broken(request: AuthRequest) -> Any:
        if kind == "raises":
            raise RuntimeError("the policy service is down")
        return None

    client = guarded(service, broken)
    before = snapshot(engine)
    response = send(client, "a", TOKEN_A)
    assert (response.status_code, response.json()["reason"]) == (500, "internal_error")
    assert diff_snapshots(before, snapshot(engine)) == []


# -- the namespace header -------------------------------------------------------------------


@pytest.mark.usefixtures("open_runs")
def test_a_percent_encoded_namespace_is_admitted_and_found_there(service: AdmissionService) -> None:
    client = guarded(service)
    response = send(client, "%C3%BCber", TOKEN_A)
    assert response.status_code == 202, response.text
    assert response.json()["namespace"] == "über"
    receipt = service.receipt("über", "wf-1", "signal", "k")
    assert receipt is not None and receipt.command_id == response.json()["command_id"]
    # The client encodes it the same way, and reads the receipt back.
    with AdmissionClient(http_client=client, namespace="über", token=TOKEN_A) as caller:
        found = caller.receipt("wf-1", "signal", "k")
        assert found is not None and found.command_id == receipt.command_id
        again = caller.signal("wf-1", "go", [], request_id="k2")
        assert again.namespace == "über"
    with AdmissionClient(http_client=client, namespace="b", token=TOKEN_A) as caller:
        with pytest.raises(AccessDenied) as refused:
            caller.signal("wf-1", "go", [], request_id="k3")
        assert (refused.value.status, refused.value.reason) == (403, "namespace_forbidden")
    with AdmissionClient(http_client=client, namespace="a") as caller:
        with pytest.raises(AccessDenied) as refused:
            caller.signal("wf-1", "go", [], request_id="k4")
        assert refused.value.status == 401 and refused.value.request_id == "k4"
    assert service.receipt("b", "wf-1", "signal", "k3") is None
    assert service.receipt("a", "wf-1", "signal", "k4") is None


@ONE_BACKEND
@pytest.mark.usefixtures("open_runs")
@pytest.mark.parametrize("authorize", [False, True])
@pytest.mark.parametrize("raw", ["über".encode("latin-1"), "über".encode(), b"%FCber", b"100%"])
def test_a_namespace_header_that_is_not_percent_encoded_utf8_is_refused(
    service: AdmissionService, engine: Engine, raw: bytes, authorize: bool
) -> None:
    app = create_app(service, authorize=grants() if authorize else None)
    client = TestClient(app)
    before = snapshot(engine)
    response = send(client, raw, TOKEN_A)
    assert diff_snapshots(before, snapshot(engine)) == []
    body = response.json()
    assert (response.status_code, body["reason"], body["field"]) == (422, "input_invalid", "namespace")
    assert "X-Namespace" in body["message"]
    assert "Ã¼ber" not in response.text


@ONE_BACKEND
@pytest.mark.usefixtures("open_runs")
def test_without_a_hook_every_caller_acts_as_before(service: AdmissionService) -> None:
    client = TestClient(create_app(service))
    assert send(client, "b", None).status_code == 202
    assert client.post(SIGNAL, json={}).json()["namespace"] == "default"  # no header, no run there
