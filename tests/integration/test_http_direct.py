"""The direct path of the admission routes answers exactly as the framework's route does.

Two apps over two services in the same state, one with the direct path
(``admission.http._direct``) and one without, are sent the same generated
requests, valid and not (duplicate members, constants, bad envelopes, other
content types, unknown members, non-objects); every status, body and echoed
header must be the same, and the direct path must really take the valid ones.
"""

from __future__ import annotations

import itertools
import json
import warnings
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

with warnings.catch_warnings():
    # The framework's test client warns about its own future; it is not ours to fix.
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

import admission.http._app as app_module
from admission.aio import AsyncAdmissionService
from admission.http import CborCodec, JsonCodec, create_app, envelope
from admission.http import _direct as direct_module
from admission.receipts import AdmissionService, MemoryStore

pytestmark = pytest.mark.filterwarnings("ignore:Using `httpx` with `starlette.testclient`")

ROUTES = (
    "/api/workflows/{w}/signal/go",
    "/api/workflows/{w}/update/go",
    "/api/workflows/{w}/runs/run-1/signal/go",
    "/api/workflows/{w}/runs/other/update/go",
    "/api/workflows/{w}/signal/go/",  # no such route: the framework's 404 either way
)
CONTENT_TYPES = (
    "application/json",
    "APPLICATION/JSON",
    "application/json; charset=utf-8",
    "text/plain",
    None,
)


def service() -> AsyncAdmissionService:
    counter = itertools.count(1)

    def clock() -> datetime:
        return datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)

    def new_id() -> str:
        return f"id-{next(counter)}"

    sync = AdmissionService(MemoryStore(), clock=clock, new_id=new_id)
    sync.start_run("default", "wf", run_id="run-1")
    sync.start_run("tenant", "wf", run_id="run-2")
    return AsyncAdmissionService(sync.store, clock=clock, new_id=new_id)


def client(direct: bool, monkeypatch: pytest.MonkeyPatch) -> TestClient:
    with monkeypatch.context() as patch:
        patch.setattr(app_module, "DIRECT_PATH", direct)
        app = create_app(service(), poll_interval_seconds=0.001)
    return TestClient(app, raise_server_exceptions=False)


values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 3),
    st.text(max_size=4),
    st.lists(st.integers(0, 2), max_size=2),
)
envelopes = st.one_of(
    st.sampled_from(
        [
            envelope(JsonCodec(), {"a": 1}),
            envelope(JsonCodec(), [1, "x"]),
            envelope(CborCodec(), {"a": 1}),
            {"codec": "json", "blob": "{not json"},
            {"codec": "nope", "blob": "[]"},
            {"codec": "json"},
            {"codec": "json", "blob": "[]", "extra": 1},
            "a string",
        ]
    ),
    values,
)
members = st.fixed_dictionaries(
    {},
    optional={
        "request_id": st.one_of(st.sampled_from(["k1", "k2", " k1 ", "", "   ", "x" * 300]), values),
        "input": envelopes,
        "wait_for": st.sampled_from(["accepted", "completed", "later", 1]),
        "wait_timeout_seconds": st.sampled_from([0, 0.01, -1, "1", 61, True]),
        "unknown": values,
    },
)


@st.composite
def bodies(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["object", "object", "object", "duplicate", "constant", "other"]))
    if kind == "object":
        return json.dumps(draw(members)).encode()
    if kind == "duplicate":
        return b'{"request_id": "k1", "request_id": "k2"}'
    if kind == "constant":
        return b'{"request_id": "k1", "input": {"codec": "json", "blob": NaN}}'
    return draw(
        st.sampled_from([b"", b"  ", b"[]", b"null", b'"k1"', b"{", b"\xff", b'{"request_id": 1e999}'])
    )


requests = st.lists(
    st.tuples(
        st.sampled_from(ROUTES),
        st.sampled_from(["wf", "missing", "w%20f"]),
        st.sampled_from(CONTENT_TYPES),
        st.sampled_from([None, "tenant", "%ZZ"]),
        bodies(),
    ),
    min_size=1,
    max_size=4,
)


def outcome(response: Any) -> tuple[int, Any, str | None, str | None]:
    try:
        body = response.json()
    except ValueError:
        body = response.text
    return (
        response.status_code,
        body,
        response.headers.get("x-request-id"),
        response.headers.get("content-type"),
    )


Batch = list[tuple[str, str, str | None, str | None, bytes]]
FIXTURE = [HealthCheck.function_scoped_fixture]


@settings(max_examples=6, deadline=None, suppress_health_check=FIXTURE)
@given(batch=requests)
def test_the_direct_path_answers_as_the_framework_does(batch: Batch, monkeypatch: pytest.MonkeyPatch) -> None:
    same_answers(batch, monkeypatch)


@pytest.mark.extra  # the same on many more generated requests
@settings(max_examples=60, deadline=None, suppress_health_check=FIXTURE)
@given(batch=requests)
def test_the_direct_path_answers_as_the_framework_does_on_many_requests(
    batch: Batch, monkeypatch: pytest.MonkeyPatch
) -> None:
    same_answers(batch, monkeypatch)


def same_answers(batch: Batch, monkeypatch: pytest.MonkeyPatch) -> None:
    """Both paths, each over a fresh service, answer ``batch`` alike."""
    direct, framework = client(True, monkeypatch), client(False, monkeypatch)
    for route, workflow, content_type, namespace, body in batch:
        headers = {"X-Request-Id": "corr-1"}
        if content_type is not None:
            headers["Content-Type"] = content_type
        if namespace is not None:
            headers["X-Namespace"] = namespace
        path = route.format(w=workflow)
        answers = [outcome(c.post(path, content=body, headers=headers)) for c in (direct, framework)]
        assert answers[0] == answers[1], (path, content_type, namespace, body)


def test_the_direct_path_takes_a_valid_request_and_hands_over_the_rest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    taken: list[str] = []
    answer = direct_module._Direct.answer

    async def spy(self: Any, *args: Any) -> Any:
        try:
            response = await answer(self, *args)
        except direct_module._Unsure:
            taken.append("framework")
            raise
        taken.append("direct")
        return response

    monkeypatch.setattr(direct_module._Direct, "answer", spy)
    app = client(True, monkeypatch)
    valid = {"request_id": "k1", "input": envelope(JsonCodec(), {"a": 1})}
    assert app.post("/api/workflows/wf/signal/go", json=valid).status_code == 202
    assert app.post("/api/workflows/wf/signal/go", json=valid).json()["retained"] is True
    assert app.post("/api/workflows/wf/update/go", json={"request_id": "u1"}).status_code == 202
    duplicate = b'{"request_id": "k1", "request_id": "k2"}'
    refused = app.post(
        "/api/workflows/wf/signal/go", content=duplicate, headers={"Content-Type": "application/json"}
    )
    assert refused.status_code == 422 and refused.json()["field"] == "body"
    assert app.post("/api/workflows/wf/signal/go", json={"request_id": 1}).status_code == 422
    assert taken == ["direct", "direct", "direct", "framework", "framework"]
