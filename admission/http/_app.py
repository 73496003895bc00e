"""The HTTP adapter: an ASGI app (FastAPI) over an :class:`AdmissionService`.

An engine mounts the app from :func:`create_app` in its own ASGI app, or runs
it alone with ``admission serve``.  Routes, bodies and statuses follow the
wire contract (``docs/http.md``; contract §2, §4, §7):

- ``POST /api/workflows/{workflow_id}/signal/{name}`` and the run-pinned
  ``.../runs/{run_id}/signal/{name}``;
- ``POST /api/workflows/{workflow_id}/update/{name}`` and
  ``.../runs/{run_id}/update/{name}``, with an optional wait for completion;
- ``GET /api/workflows/{workflow_id}/receipts/{command_type}?request_id=KEY``;
- the engine's routes, for runs and the progress of commands (``_lifecycle``).

The namespace comes from the ``X-Namespace`` header (default ``default``),
percent-encoded UTF-8.  With an ``authorize`` hook, every request is
authorised before its body is read (``admission.http._auth``): 401 or 403,
nothing written.
``X-Request-Id`` is echoed back as correlation only and never becomes a
command key (contract §2.7): the key travels in the body's ``request_id``.

An admission answer is ``Admission.to_dict()`` with its own status; every
4xx/5xx body is a JSON object with at least ``reason`` and ``message``.  Bad
input is refused before the service is called, or by the service before it
opens a transaction, so such a 422 (one without ``outcome``) never writes; a
422 that carries an admission's ``outcome`` is an answer (a failed update).

An :class:`~admission.aio.AsyncAdmissionService` is awaited on the event loop,
with no thread pool on the admission path; a synchronous service runs in the
thread pool (``_serving``).  Waiting for an update
to complete polls the receipt between sleeps on the event loop that double up
to a cap, never holding a transaction or a thread while it waits; the wait
ends when the client goes, and an app holds at most ``max_waits`` at once
(``_waits``).  A request body over ``max_body_bytes`` is refused with 413 by
an ASGI guard below the framework, before anything above it holds more than
the limit (``_limits``).

Requires the ``http`` extra (FastAPI, uvicorn).
"""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from typing import Annotated, Any, Final, Literal

from fastapi import Body, Depends, FastAPI, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from admission import __version__
from admission.aio import AsyncAdmissionService
from admission.errors import (
    AdmissionError,
    InvalidCommandTypeError,
    InvalidRequestIdError,
    InvalidValueError,
    ReservedRequestIdError,
    StorageError,
)
from admission.http._auth import install_gate
from admission.http._codecs import Codec, default_codecs
from admission.http._direct import DirectAdmissions
from admission.http._lifecycle import install_lifecycle_routes
from admission.http._limits import DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_WAITS, BodyLimit, check_max_body_bytes
from admission.http._serving import awaited
from admission.http._stored import StoreArguments, admitted_arguments, check_store_arguments
from admission.http._tokens import DEFAULT_NAMESPACE, NAMESPACE_HEADER, Authorizer
from admission.http._waits import WaitSlots, poll_delays, too_many_waits, wait_for_completion
from admission.http._wire import (
    AdmissionAnswer,
    Envelope,
    ErrorBody,
    NamespaceHeader,
    WorkflowIdPath,
    error_response,
    strict_body,
)
from admission.intent._keys import normalize_request_id
from admission.receipts._rules import Admission, Decision
from admission.receipts._service import AdmissionService

__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_MAX_WAITS",
    "DEFAULT_NAMESPACE",
    "MAX_WAIT_SECONDS",
    "NAMESPACE_HEADER",
    "REQUEST_ID_HEADER",
    "AdmissionAnswer",
    "Envelope",
    "ErrorBody",
    "SignalRequest",
    "UpdateRequest",
    "create_app",
]

REQUEST_ID_HEADER: Final = "X-Request-Id"
"""The correlation header: echoed unchanged, never a command key (contract §2.7)."""
MAX_WAIT_SECONDS: Final = 60.0
"""The longest ``wait_timeout_seconds`` an update may ask for."""
DEFAULT_WAIT_SECONDS: Final = 10.0
"""How long an update with ``wait_for: "completed"`` waits unless it says otherwise."""
DIRECT_PATH = True
"""Whether apps made from now on answer common admission requests without the framework's
per-request work (``_direct``); the tests turn it off to compare both paths."""


# -- bodies --------------------------------------------------------------------------------


class SignalRequest(BaseModel):
    """The body of a signal."""

    model_config = ConfigDict(extra="forbid", strict=True)

    request_id: str | None = Field(
        default=None,
        description="The command key. Surrounding whitespace is stripped; blank means no key (contract §2).",
    )
    input: Envelope | None = Field(default=None, description="The arguments; absent means `[]`.")


class UpdateRequest(SignalRequest):
    """The body of an update: a signal's, plus the optional wait for completion."""

    wait_for: Literal["accepted", "completed"] = Field(
        default="accepted",
        description="`completed` waits (up to `wait_timeout_seconds`) until the update completes or fails.",
    )
    wait_timeout_seconds: float = Field(
        default=DEFAULT_WAIT_SECONDS, ge=0, le=MAX_WAIT_SECONDS, allow_inf_nan=False
    )


_ERRORS: Final[dict[int | str, dict[str, Any]]] = {
    409: {"model": ErrorBody, "description": "Conflict, ambiguity, or refused by run state (contract §4)."},
    401: {"model": ErrorBody, "description": "No valid bearer token (an app with an authorizer)."},
    403: {"model": ErrorBody, "description": "The token is not granted this namespace."},
    422: {"model": ErrorBody, "description": "Invalid key or input (nothing written), or a failed update."},
    413: {"model": ErrorBody, "description": "The body is larger than the server's limit; nothing written."},
    503: {"model": ErrorBody, "description": "Storage unavailable, or too many waits; retryable."},
}
_ADMIT_RESPONSES: Final[dict[int | str, dict[str, Any]]] = {
    200: {"model": AdmissionAnswer, "description": "A completed update."},
    202: {"model": AdmissionAnswer, "description": "Received (signal) or accepted (update)."},
    **_ERRORS,
}
_RECEIPT_RESPONSES: Final[dict[int | str, dict[str, Any]]] = {
    **_ADMIT_RESPONSES,
    404: {"model": ErrorBody, "description": "No receipt for this key."},
}


# -- answers -------------------------------------------------------------------------------


def _message(answer: Admission, body: Mapping[str, object]) -> str:
    # A short human sentence for refusals; the fields carry the data.
    key = answer.request_id
    if answer.decision is Decision.CONFLICT:
        parts = ", ".join(answer.conflict) or "intent"
        return (
            f"request_id {key!r} already names another {answer.retained_command_type} "
            f"(differs in: {parts}); nothing was recorded"
        )
    if answer.decision is Decision.AMBIGUOUS:
        return (
            f"request_id {key!r} cannot be proven to name one receipt; nothing was recorded, "
            "and retrying unchanged fails the same way"
        )
    if answer.outcome == "rejected_not_current":
        return (
            f"run {answer.requested_run_id!r} is not the current run "
            f"(current: {answer.resolved_run_id!r}); the command was refused"
        )
    if answer.outcome == "run_not_active":
        return "the workflow instance has no open run; the command was refused"
    if answer.outcome == "failed":
        return f"the update failed: {body.get('failure')}"
    return str(answer.outcome)


def _respond(answer: Admission) -> JSONResponse:
    body = answer.to_dict()
    status = answer.http_status
    if status >= 400:
        # Every 4xx carries reason and message; to_dict() already has a reason
        # for every refusal except a failed update.
        body.setdefault("reason", "update_failed" if answer.outcome == "failed" else answer.outcome)
        body.setdefault("message", _message(answer, body))
    return JSONResponse(body, status_code=status)


def _field_of(loc: tuple[int | str, ...]) -> str:
    # ("body", "input", "blob") -> "input.blob"; ("path", "workflow_id") -> "workflow_id";
    # ("body",) -> "body"; the header's alias as sent.
    if not loc:
        return "body"
    rest = [str(part) for part in loc[1:]]
    if not rest:
        return str(loc[0])
    return ".".join(rest)


def _validation_error(exc: RequestValidationError) -> JSONResponse:
    errors = exc.errors()
    details = [
        {
            # A JSON syntax error's location is a character offset, not a field.
            "field": "body" if e.get("type") == "json_invalid" else _field_of(tuple(e.get("loc", ()))),
            "message": str(e.get("msg", "")),
            "type": e.get("type"),
        }
        for e in errors
    ]
    first = details[0] if details else {"field": "body", "message": "invalid request"}
    field = str(first["field"])
    reason = "request_id_invalid" if field == "request_id" else "input_invalid"
    return error_response(422, reason, f"{field}: {first['message']}", field=field, errors=details)


# -- the app -------------------------------------------------------------------------------


class _EchoRequestId:
    """ASGI middleware: copy ``X-Request-Id`` from the request to the response, unchanged."""

    def __init__(self, app: Callable[..., Awaitable[None]]) -> None:
        self.app = app

    async def __call__(
        self,
        scope: MutableMapping[str, Any],
        receive: Callable[[], Awaitable[MutableMapping[str, Any]]],
        send: Callable[[MutableMapping[str, Any]], Awaitable[None]],
    ) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        header = REQUEST_ID_HEADER.lower().encode("latin-1")
        echoed = [value for name, value in scope.get("headers", ()) if name == header][:1]

        async def send_echoing(message: MutableMapping[str, Any]) -> None:
            if echoed and message["type"] == "http.response.start":
                headers = [h for h in message.get("headers", ()) if h[0].lower() != header]
                message["headers"] = [*headers, (header, echoed[0])]
            await send(message)

        await self.app(scope, receive, send_echoing)


# Parameter types, at module level so the framework can resolve them.
_RunId = Annotated[str, Path(description="The selected run (run scope).")]
_Name = Annotated[str, Path(description="The signal's or update's name.")]
_CommandType = Annotated[Literal["signal", "update"], Path(description="`signal` or `update`.")]
_Key = Annotated[str, Query(description="The command key (stripped like the body's).")]
_SignalBody = Annotated[SignalRequest | None, Body()]
_UpdateBody = Annotated[UpdateRequest | None, Body()]


def create_app(
    service: AdmissionService | AsyncAdmissionService,
    *,
    codecs: Mapping[str, Codec] | None = None,
    store_arguments: StoreArguments = "plaintext",
    poll_interval_seconds: float = 0.02,
    clock: Callable[[], float] = time.monotonic,
    title: str = "admission",
    authorize: Authorizer | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    max_waits: int = DEFAULT_MAX_WAITS,
) -> FastAPI:
    """The ASGI app over ``service``.

    An :class:`~admission.aio.AsyncAdmissionService` is awaited on the event loop (no
    thread pool on the admission path); a synchronous
    :class:`~admission.receipts.AdmissionService` runs in the thread pool.
    ``codecs`` maps codec names to the codecs this server accepts (default
    ``json`` and ``cbor``; add an :class:`~admission.http._codecs.AesGcmCodec` with
    the application's key to accept encrypted input).  ``store_arguments`` is
    what the commands table keeps: ``"plaintext"`` (the decoded arguments) or
    ``"envelope"`` (the envelope as received; docs/http.md).  An update waiting for
    completion re-reads its receipt after ``poll_interval_seconds``, then after
    delays that double up to half a second, until its deadline on ``clock``
    (a monotonic clock, a parameter so tests control it) or until its client
    disconnects.  At most ``max_waits`` requests wait at once (the count is
    ``app.state.waits.active``); one more is refused with 503
    ``too_many_waits`` before it is admitted.  A request body over
    ``max_body_bytes`` is refused with 413 ``body_too_large``.
    ``authorize`` is asked before every request is read (``docs/http.md``,
    "Authentication"): :class:`~admission.http.BearerTokens` is one; without
    it every caller may act in every namespace.
    """
    if not (math.isfinite(poll_interval_seconds) and poll_interval_seconds > 0):
        raise ValueError("poll_interval_seconds must be a positive number")
    check_max_body_bytes(max_body_bytes)
    calls = awaited(service)
    waits = WaitSlots(max_waits)
    registry: Mapping[str, Codec] = default_codecs() if codecs is None else codecs
    stored_as = check_store_arguments(store_arguments)
    app = FastAPI(
        title=title,
        version=__version__,
        description="Safe retries of signals and updates: command keys, intent digests, retained receipts.",
    )
    app.state.waits = waits
    if DIRECT_PATH:
        # Innermost: the common admission request skips the framework's per-request work (_direct).
        app.add_middleware(DirectAdmissions, routes=app.router.routes, handlers=app.exception_handlers)
    # Added before the gate, so inside it: the gate's 401 comes before a body is read, and a
    # 413 still echoes X-Request-Id.
    app.add_middleware(BodyLimit, max_body_bytes=max_body_bytes)
    install_gate(app, authorize)
    app.add_middleware(_EchoRequestId)  # added last, so outermost: it echoes the gate's refusals too

    def arguments(body: SignalRequest | None) -> object:
        if body is None or body.input is None:
            return []
        return admitted_arguments(registry, body.input.model_dump(), stored_as)

    async def admit(
        command_type: Literal["signal", "update"],
        namespace: str,
        workflow_id: str,
        name: str,
        run_id: str | None,
        body: SignalRequest | None,
        request: Request | None = None,
    ) -> JSONResponse:
        # Decoding and key normalisation happen before the service is called;
        # the service validates the rest before it opens a transaction.
        key = normalize_request_id(None if body is None else body.request_id)
        values = arguments(body)
        call = calls.admit_signal if command_type == "signal" else calls.admit_update
        wait_seconds = 0.0
        if isinstance(body, UpdateRequest) and body.wait_for == "completed" and key is not None:
            wait_seconds = body.wait_timeout_seconds
        waiting = wait_seconds > 0
        # The slot is taken before the admission, so a refusal writes nothing;
        # the retry, with the same key, is then admitted as if for the first time.
        if waiting and not waits.try_acquire():
            return too_many_waits(waits.limit)
        try:
            answer = await call(namespace, workflow_id, name, values, request_id=key, run_id=run_id)
            if waiting and key is not None and answer.outcome == "accepted":
                answer = await wait_for_completion(
                    calls,
                    answer,
                    key,
                    timeout=wait_seconds,
                    receive=None if request is None else request.receive,
                    delays=poll_delays(poll_interval_seconds),
                    clock=clock,
                )
        finally:
            if waiting:
                waits.release()
        return _respond(answer)

    strict = [Depends(strict_body)]

    @app.post(
        "/api/workflows/{workflow_id}/signal/{name}",
        status_code=202,
        responses=_ADMIT_RESPONSES,
        dependencies=strict,
        summary="Signal a workflow instance",
    )
    async def signal_instance(
        workflow_id: WorkflowIdPath,
        name: _Name,
        body: _SignalBody = None,
        x_namespace: NamespaceHeader = DEFAULT_NAMESPACE,
    ) -> JSONResponse:
        return await admit("signal", x_namespace, workflow_id, name, None, body)

    @app.post(
        "/api/workflows/{workflow_id}/runs/{run_id}/signal/{name}",
        status_code=202,
        responses=_ADMIT_RESPONSES,
        dependencies=strict,
        summary="Signal a selected run",
    )
    async def signal_run(
        workflow_id: WorkflowIdPath,
        run_id: _RunId,
        name: _Name,
        body: _SignalBody = None,
        x_namespace: NamespaceHeader = DEFAULT_NAMESPACE,
    ) -> JSONResponse:
        return await admit("signal", x_namespace, workflow_id, name, run_id, body)

    @app.post(
        "/api/workflows/{workflow_id}/update/{name}",
        status_code=202,
        responses=_ADMIT_RESPONSES,
        dependencies=strict,
        summary="Send an update to a workflow instance",
    )
    async def update_instance(
        workflow_id: WorkflowIdPath,
        name: _Name,
        request: Request,
        body: _UpdateBody = None,
        x_namespace: NamespaceHeader = DEFAULT_NAMESPACE,
    ) -> JSONResponse:
        return await admit("update", x_namespace, workflow_id, name, None, body, request)

    @app.post(
        "/api/workflows/{workflow_id}/runs/{run_id}/update/{name}",
        status_code=202,
        responses=_ADMIT_RESPONSES,
        dependencies=strict,
        summary="Send an update to a selected run",
    )
    async def update_run(
        workflow_id: WorkflowIdPath,
        run_id: _RunId,
        name: _Name,
        request: Request,
        body: _UpdateBody = None,
        x_namespace: NamespaceHeader = DEFAULT_NAMESPACE,
    ) -> JSONResponse:
        return await admit("update", x_namespace, workflow_id, name, run_id, body, request)

    @app.get(
        "/api/workflows/{workflow_id}/receipts/{command_type}",
        responses=_RECEIPT_RESPONSES,
        summary="Read the receipt a key names",
    )
    async def read_receipt(
        workflow_id: WorkflowIdPath,
        command_type: _CommandType,
        request_id: _Key,
        x_namespace: NamespaceHeader = DEFAULT_NAMESPACE,
    ) -> JSONResponse:
        key = normalize_request_id(request_id)
        if key is None:
            raise InvalidRequestIdError("must not be blank", request_id=request_id)
        answer = await calls.receipt(x_namespace, workflow_id, command_type, key)
        if answer is None:
            return error_response(
                404,
                "receipt_not_found",
                f"no {command_type} receipt for request_id {key!r}",
                request_id=key,
                command_type=command_type,
            )
        return _respond(answer)

    install_lifecycle_routes(app, calls, registry)
    _install_error_handlers(app)
    return app


def _install_error_handlers(app: FastAPI) -> None:
    async def on_validation(_request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        return _validation_error(exc)

    async def on_http(_request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        if exc.status_code == 400:
            # The framework could not parse the body (not JSON, bad form data): invalid input.
            return error_response(422, "input_invalid", f"body: {exc.detail}", field="body")
        reasons = {404: "not_found", 405: "method_not_allowed"}
        reason = reasons.get(exc.status_code, "http_error")
        response = error_response(exc.status_code, reason, str(exc.detail))
        if exc.headers:
            response.headers.update(exc.headers)
        return response

    async def on_admission_error(_request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, AdmissionError)
        if isinstance(exc, (InvalidRequestIdError, ReservedRequestIdError)):
            return error_response(422, exc.code, exc.message, field="request_id", request_id=exc.request_id)
        if isinstance(exc, InvalidValueError):
            return error_response(422, "input_invalid", exc.message, field=exc.field)
        if isinstance(exc, InvalidCommandTypeError):
            return error_response(422, "input_invalid", exc.message, field="command_type")
        if isinstance(exc, StorageError):
            # Retryable: nothing was committed, or the retry finds the receipt.
            return error_response(503, "storage_unavailable", exc.message)
        return error_response(500, exc.code, exc.message)

    async def on_unexpected(request: Request, exc: Exception) -> JSONResponse:
        answer = error_response(500, "internal_error", f"{type(exc).__name__} while handling the request")
        # Starlette answers an unhandled exception outside every middleware,
        # _EchoRequestId included, so the echo is made here for this one answer.
        echoed = request.headers.get(REQUEST_ID_HEADER)
        if echoed is not None:
            answer.headers[REQUEST_ID_HEADER] = echoed
        return answer

    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(StarletteHTTPException, on_http)
    app.add_exception_handler(AdmissionError, on_admission_error)
    app.add_exception_handler(Exception, on_unexpected)
