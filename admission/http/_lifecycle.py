"""The engine's routes: runs (start, close, continue as new) and the progress of commands.

A remote engine, or a conformance run against ``admission serve``, drives a
whole lifecycle through these routes (contract §5; ``docs/http.md``, "Runs and
the engine's progress"):

- ``POST /api/workflows/{workflow_id}/runs``: start a run (201, the run);
- ``POST /api/workflows/{workflow_id}/close``: close the current run (200, the closed run);
- ``POST /api/workflows/{workflow_id}/continue-as-new``: close it as ``continued`` and
  open its successor (201, the successor);
- ``POST /api/workflows/{workflow_id}/signals/{command_id}/apply``: record that a
  received signal was delivered (200, its receipt);
- ``POST /api/workflows/{workflow_id}/updates/{update_id}/complete`` and ``.../fail``:
  finish an accepted update (200, its receipt).

They sit behind the app's gate like every route (the namespace header, the
authorizer, 401/403 before the body is read), refuse unknown body members and
bad path values with 422 naming the field before the service is called, and
answer the service's refusals with the app's error body: :class:`RunStateError`
409 ``run_state``, :class:`UnknownCommandError` 404 ``command_unknown``,
:class:`UnknownUpdateError` 404 ``update_unknown``.  A progress step answers 200
with the command's receipt, ``Admission.to_dict()``: its own ``http_status`` is
what a caller's retry of the command gets, not the status of this answer.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any, Final, Literal, get_args

from fastapi import Body, Depends, FastAPI, Path, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from admission.errors import InvalidValueError, RunStateError, UnknownCommandError, UnknownUpdateError
from admission.http._codecs import Codec, decode_envelope
from admission.http._serving import AwaitedService
from admission.http._tokens import DEFAULT_NAMESPACE
from admission.http._wire import (
    AdmissionAnswer,
    Envelope,
    ErrorBody,
    NamespaceHeader,
    WorkflowIdPath,
    error_response,
    strict_body,
)
from admission.intent._encoding import Value
from admission.receipts._answers import RunInfo
from admission.receipts._rules import Admission

__all__ = [
    "CLOSING_STATUSES",
    "ApplySignalRequest",
    "CloseRunRequest",
    "CompleteUpdateRequest",
    "ContinueAsNewRequest",
    "FailUpdateRequest",
    "RunAnswer",
    "StartRunRequest",
    "install_lifecycle_routes",
    "is_engine_path",
]

_ClosingStatus = Literal["completed", "failed", "cancelled", "terminated"]
CLOSING_STATUSES: Final[tuple[str, ...]] = get_args(_ClosingStatus)
"""What ``close`` may close a run as; ``continued`` is reached only through ``continue-as-new``."""

# The engine's paths as the router matches them: a path segment is anything but "/".
_ENGINE_PATH: Final = re.compile(
    r"/api/workflows/[^/]+/(?:runs|close|continue-as-new|signals/[^/]+/apply|updates/[^/]+/(?:complete|fail))"
)


def is_engine_path(path: str) -> bool:
    """Whether ``path`` (inside the app, as ``AuthRequest.path`` gives it) is one of the engine's
    routes: starting, closing or continuing a run, applying a signal, completing or failing an update.

    An authorizer that serves callers and the engine on one app refuses these paths to callers
    (``docs/http.md``, "Who may call the engine's routes").
    """
    return _ENGINE_PATH.fullmatch(path) is not None


# -- bodies --------------------------------------------------------------------------------


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class StartRunRequest(_Strict):
    """The body of a run's start (optional)."""

    run_id: str | None = Field(
        default=None, description="The new run's id; absent: the server makes one (a UUID)."
    )


class CloseRunRequest(_Strict):
    """The body of a close: the status the current run closes as."""

    status: _ClosingStatus = Field(
        description="`completed`, `failed`, `cancelled` or `terminated` (`continued`: continue-as-new)."
    )
    run_id: str | None = Field(
        default=None, description="Close only if this is the current open run; otherwise 409 `run_state`."
    )


class ContinueAsNewRequest(_Strict):
    """The body of a continue-as-new (optional)."""

    run_id: str | None = Field(
        default=None, description="Continue only if this is the current open run; otherwise 409 `run_state`."
    )
    new_run_id: str | None = Field(
        default=None, description="The successor's id; absent: the server makes one (a UUID)."
    )


class ApplySignalRequest(_Strict):
    """The body of a signal's application: nothing (absent, or ``{}``)."""


class CompleteUpdateRequest(_Strict):
    """The body of an update's completion (optional)."""

    result: Envelope | None = Field(
        default=None, description="The result, any typed value, in a codec envelope; absent means `null`."
    )


class FailUpdateRequest(_Strict):
    """The body of an update's failure."""

    failure: str = Field(description="Why the update failed: the text its receipt then carries.")


class RunAnswer(BaseModel):
    """A run: ``RunInfo.to_dict()``."""

    model_config = ConfigDict(extra="allow")

    namespace: str
    workflow_id: str
    run_id: str
    run_number: int
    status: str
    started_at: str
    closed_at: str | None
    continued_from_run_id: str | None


# -- the OpenAPI document's answers ----------------------------------------------------------

_GATE: Final[dict[int | str, dict[str, Any]]] = {
    401: {"model": ErrorBody, "description": "No valid bearer token (an app with an authorizer)."},
    403: {"model": ErrorBody, "description": "The token is not granted this namespace."},
    413: {"model": ErrorBody, "description": "The body is larger than the server's limit; nothing written."},
    422: {"model": ErrorBody, "description": "Invalid input, naming its `field`; nothing written."},
    503: {"model": ErrorBody, "description": "Storage unavailable; retryable."},
}
_RUN_STATE: Final[dict[str, Any]] = {
    "model": ErrorBody,
    "description": "`run_state`: the run's state does not allow the step (`state_reason` says why).",
}
_RUN_RESPONSES: Final[dict[int | str, dict[str, Any]]] = {
    **_GATE,
    409: _RUN_STATE,
}
_SIGNAL_RESPONSES: Final[dict[int | str, dict[str, Any]]] = {
    200: {"model": AdmissionAnswer, "description": "The signal's receipt, applied."},
    404: {"model": ErrorBody, "description": "`command_unknown`: no admitted signal with this id."},
    **_RUN_RESPONSES,
}
_UPDATE_RESPONSES: Final[dict[int | str, dict[str, Any]]] = {
    200: {"model": AdmissionAnswer, "description": "The update's receipt, completed or failed."},
    404: {"model": ErrorBody, "description": "`update_unknown`: no update with this id."},
    **_RUN_RESPONSES,
}

# Parameter types, at module level so the framework can resolve them.
_CommandId = Annotated[str, Path(description="The signal's `command_id`, from its receipt.")]
_UpdateId = Annotated[str, Path(description="The update's `update_id`, from its receipt.")]
_StartBody = Annotated[StartRunRequest | None, Body()]
_CloseBody = Annotated[CloseRunRequest | None, Body()]
_ContinueBody = Annotated[ContinueAsNewRequest | None, Body()]
_ApplyBody = Annotated[ApplySignalRequest | None, Body()]
_CompleteBody = Annotated[CompleteUpdateRequest | None, Body()]
_FailBody = Annotated[FailUpdateRequest | None, Body()]


def _run(info: RunInfo, status: int) -> JSONResponse:
    return JSONResponse(info.to_dict(), status_code=status)


def _receipt(answer: Admission) -> JSONResponse:
    # 200: the step was done (or was already); the body's http_status is the command's own.
    return JSONResponse(answer.to_dict(), status_code=200)


def install_lifecycle_routes(app: FastAPI, calls: AwaitedService, codecs: Mapping[str, Codec]) -> None:
    """Add the engine's routes to ``app`` (made by ``create_app``), over ``calls``.

    ``codecs`` decode an update's result, as they decode arguments.  The
    handlers for the service's refusals are added too.
    """
    strict = [Depends(strict_body)]

    def result_of(body: CompleteUpdateRequest | None) -> Value:
        if body is None or body.result is None:
            return None
        try:
            return decode_envelope(codecs, body.result.model_dump())
        except InvalidValueError as exc:
            # The codec names its input "input"; here the input is the result.
            raise InvalidValueError(exc.reason, field="result", path=exc.path) from None

    @app.post(
        "/api/workflows/{workflow_id}/runs",
        status_code=201,
        responses={201: {"model": RunAnswer, "description": "The new run."}, **_RUN_RESPONSES},
        dependencies=strict,
        summary="Start a run of a workflow instance",
    )
    async def start_run(
        workflow_id: WorkflowIdPath,
        body: _StartBody = None,
        x_namespace: NamespaceHeader = DEFAULT_NAMESPACE,
    ) -> JSONResponse:
        run_id = None if body is None else body.run_id
        return _run(await calls.start_run(x_namespace, workflow_id, run_id=run_id), 201)

    @app.post(
        "/api/workflows/{workflow_id}/close",
        responses={200: {"model": RunAnswer, "description": "The closed run."}, **_RUN_RESPONSES},
        dependencies=strict,
        summary="Close the current run",
    )
    async def close_run(
        workflow_id: WorkflowIdPath,
        body: _CloseBody = None,
        x_namespace: NamespaceHeader = DEFAULT_NAMESPACE,
    ) -> JSONResponse:
        if body is None:
            closing = ", ".join(CLOSING_STATUSES)
            raise InvalidValueError(f"required: one of {closing}", field="status", path="")
        info = await calls.close_run(x_namespace, workflow_id, body.status, run_id=body.run_id)
        return _run(info, 200)

    @app.post(
        "/api/workflows/{workflow_id}/continue-as-new",
        status_code=201,
        responses={201: {"model": RunAnswer, "description": "The successor run."}, **_RUN_RESPONSES},
        dependencies=strict,
        summary="Continue the current run as new",
    )
    async def continue_as_new(
        workflow_id: WorkflowIdPath,
        body: _ContinueBody = None,
        x_namespace: NamespaceHeader = DEFAULT_NAMESPACE,
    ) -> JSONResponse:
        run_id = None if body is None else body.run_id
        new_run_id = None if body is None else body.new_run_id
        info = await calls.continue_as_new(x_namespace, workflow_id, run_id=run_id, new_run_id=new_run_id)
        return _run(info, 201)

    @app.post(
        "/api/workflows/{workflow_id}/signals/{command_id}/apply",
        responses=_SIGNAL_RESPONSES,
        dependencies=strict,
        summary="Record that a signal was delivered to its run",
    )
    async def apply_signal(
        workflow_id: WorkflowIdPath,
        command_id: _CommandId,
        body: _ApplyBody = None,
        x_namespace: NamespaceHeader = DEFAULT_NAMESPACE,
    ) -> JSONResponse:
        return _receipt(await calls.apply_signal(x_namespace, workflow_id, command_id))

    @app.post(
        "/api/workflows/{workflow_id}/updates/{update_id}/complete",
        responses=_UPDATE_RESPONSES,
        dependencies=strict,
        summary="Complete an accepted update with its result",
    )
    async def complete_update(
        workflow_id: WorkflowIdPath,
        update_id: _UpdateId,
        body: _CompleteBody = None,
        x_namespace: NamespaceHeader = DEFAULT_NAMESPACE,
    ) -> JSONResponse:
        result = result_of(body)
        try:
            answer = await calls.complete_update(x_namespace, workflow_id, update_id, result)
        except InvalidValueError as exc:
            if exc.field != "value":
                raise
            # The service names the value it encodes "value": here, the result (too large,
            # an int past 64 bits, a lone surrogate).
            raise InvalidValueError(exc.reason, field="result", path=exc.path) from None
        return _receipt(answer)

    @app.post(
        "/api/workflows/{workflow_id}/updates/{update_id}/fail",
        responses=_UPDATE_RESPONSES,
        dependencies=strict,
        summary="Fail an accepted update",
    )
    async def fail_update(
        workflow_id: WorkflowIdPath,
        update_id: _UpdateId,
        body: _FailBody = None,
        x_namespace: NamespaceHeader = DEFAULT_NAMESPACE,
    ) -> JSONResponse:
        if body is None:
            raise InvalidValueError("required", field="failure", path="")
        return _receipt(await calls.fail_update(x_namespace, workflow_id, update_id, body.failure))

    _install_refusals(app)


def _install_refusals(app: FastAPI) -> None:
    # More specific than the app's AdmissionError handler, so these answer first.
    async def on_run_state(_request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RunStateError)
        return error_response(409, "run_state", exc.message, state_reason=exc.reason, run_id=exc.run_id)

    async def on_unknown_command(_request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, UnknownCommandError)
        return error_response(404, "command_unknown", exc.message, command_id=exc.command_id)

    async def on_unknown_update(_request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, UnknownUpdateError)
        return error_response(404, "update_unknown", exc.message, update_id=exc.update_id)

    app.add_exception_handler(RunStateError, on_run_state)
    app.add_exception_handler(UnknownCommandError, on_unknown_command)
    app.add_exception_handler(UnknownUpdateError, on_unknown_update)
