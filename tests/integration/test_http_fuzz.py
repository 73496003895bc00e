"""API fuzzing: schemathesis against the app's own OpenAPI document, on SQLite.

Valid and invalid requests are generated from the document (positive and
negative modes).  Whatever arrives, no answer is a 5xx, and every 4xx is a
JSON object with a ``reason`` and a ``message`` string (wire contract).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode

from admission.aio import AsyncAdmissionService
from admission.http import AesGcmCodec, CborCodec, JsonCodec, codecs_from, create_app
from admission.receipts import AdmissionService, MemoryStore
from admission.sql import SqlStore
from tests.support.aio import AsyncTwins
from tests.support.backends import sqlite_url

MAX_EXAMPLES = 60
"""Per admission operation and mode: five operations, two modes, so up to 600 requests."""
ENGINE_EXAMPLES = 30
"""Per engine operation (runs and progress) and mode: six operations with small bodies, up to 360
requests more."""

TALLY: dict[str, int] = {}


def _schema(service: AdmissionService | AsyncAdmissionService) -> Any:
    ticks = itertools.count()
    app = create_app(
        service,
        codecs=codecs_from(JsonCodec(), CborCodec(), AesGcmCodec(bytes(32), "fuzz")),
        # A clock that jumps a second per reading: a generated 60-second wait ends at once.
        clock=lambda: float(next(ticks)),
        poll_interval_seconds=0.001,
    )
    return schemathesis.openapi.from_asgi("/openapi.json", app)


# The operations, read from the document itself (it does not depend on the store).
OPERATIONS = sorted(
    result.ok().label for result in _schema(AdmissionService(MemoryStore())).get_all_operations()
)


@pytest.fixture
def api_schema(tmp_path: Path) -> Iterator[Any]:
    store = SqlStore.open(sqlite_url(tmp_path))
    service = AdmissionService(store)
    # Some generated requests land on an open run, most on instances that do not exist.
    for workflow_id in ("wf", "a", "0", "x"):
        service.start_run("default", workflow_id)
    twins = AsyncTwins()
    try:
        # The app as admission serve runs it: the async service, awaited.
        yield _schema(twins.twin(service))
    finally:
        twins.close()
        store.dispose()


RUN_ROUTES = {
    "/api/workflows/{workflow_id}/runs",
    "/api/workflows/{workflow_id}/close",
    "/api/workflows/{workflow_id}/continue-as-new",
}
"""The engine's routes that answer with a run (``RunInfo.to_dict()``)."""
PROGRESS_ROUTES = {
    "/api/workflows/{workflow_id}/signals/{command_id}/apply",
    "/api/workflows/{workflow_id}/updates/{update_id}/complete",
    "/api/workflows/{workflow_id}/updates/{update_id}/fail",
}
"""The engine's routes that answer 200 with a receipt whose own ``http_status`` is the command's."""


def test_the_document_has_the_eleven_routes() -> None:
    assert len(OPERATIONS) == 11, OPERATIONS


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=str)
@pytest.mark.parametrize("label", OPERATIONS)
def test_no_request_yields_a_5xx_and_every_4xx_has_the_error_shape(
    api_schema: Any, label: str, mode: GenerationMode
) -> None:
    fuzz(api_schema, label, mode)


def fuzz(api_schema: Any, label: str, mode: GenerationMode) -> None:
    """Requests generated for operation ``label`` in ``mode``: none a 5xx, each 4xx of the error
    shape, each success of its route's shape; their statuses counted in :data:`TALLY`."""
    operation = next(r.ok() for r in api_schema.get_all_operations() if r.ok().label == label)
    engine_route = operation.path in RUN_ROUTES | PROGRESS_ROUTES

    @settings(
        max_examples=ENGINE_EXAMPLES if engine_route else MAX_EXAMPLES,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        database=None,
    )
    @given(case=operation.as_strategy(generation_mode=mode))
    def check(case: Any) -> None:
        response = case.call()
        status = response.status_code
        where = f"{case.method} {case.formatted_path} {case.body!r} -> {status}: {response.text[:500]}"
        assert status < 500, where
        TALLY[str(status)] = TALLY.get(str(status), 0) + 1
        body = json.loads(response.text)
        assert isinstance(body, dict), where
        assert status != 400, where  # a body that cannot be parsed is invalid input: 422
        if status >= 400:
            assert isinstance(body.get("reason"), str) and body["reason"], where
            assert isinstance(body.get("message"), str) and body["message"], where
        elif case.path in RUN_ROUTES:
            assert status in (200, 201) and isinstance(body["run_id"], str), where
        elif case.path in PROGRESS_ROUTES:
            assert status == 200 and isinstance(body["http_status"], int), where
        else:
            assert body["http_status"] == status, where

    check()


SIGNAL = "POST /api/workflows/{workflow_id}/signal/{name}"


def test_the_fuzzing_reached_successes_refusals_and_invalid_input(api_schema: Any) -> None:
    """The fuzz run above produced answers of each kind (it ran, and not only into 422s)."""
    from tests.conftest import SUMMARY_LINES

    if TALLY.get("422", 0) == 0 or TALLY.get("202", 0) + TALLY.get("409", 0) == 0:
        # This process ran too little of the fuzzing (a worker of its own, or this test alone):
        # the signal route, in both modes, then counts for it.
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            fuzz(api_schema, SIGNAL, mode)
    SUMMARY_LINES.append("http fuzz statuses: " + ", ".join(f"{k}={v}" for k, v in sorted(TALLY.items())))
    assert TALLY.get("422", 0) > 0
    assert TALLY.get("202", 0) + TALLY.get("409", 0) > 0
