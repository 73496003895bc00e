"""One logical call: its key and bytes chosen once, its answer interpreted the same way by both clients.

A call is built before the first attempt (:func:`_command_call`,
:func:`_receipt_call`), so that every automatic attempt sends the same key and
the same bytes; :class:`_Attempts` decides, attempt by attempt, whether a
response is the answer or what to wait before the next one; :func:`_interpret`
turns the answer into a :class:`~admission.client.Receipt` or a typed failure.
Nothing here does I/O: the two clients send and sleep.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Final, Literal
from urllib.parse import quote

import httpx

from admission.client._errors import (
    AccessDenied,
    CommandRejected,
    InvalidRequest,
    Receipt,
    RequestIdAmbiguous,
    SignalFailed,
    TransportFailed,
    UnexpectedResponse,
    UpdateFailed,
    _opt_str,
)
from admission.client._policy import TransportRetryPolicy
from admission.errors import InvalidValueError
from admission.http._codecs import Codec, envelope
from admission.intent._encoding import Value
from admission.intent._keys import normalize_request_id, validate_request_id

CommandType = Literal["signal", "update"]
WaitFor = Literal["accepted", "completed"]

SERVER_DEFAULT_WAIT_SECONDS: Final = 10.0
"""The server's wait when ``wait_for="completed"`` comes without a timeout (docs/http.md)."""
MAX_WAIT_SECONDS: Final = 60.0
CONFLICT_FIELDS: Final = (
    "request_id",
    "retained_command_id",
    "retained_command_type",
    "retained_outcome",
    "conflict",
)
"""The fields of a ``request_id_conflict`` answer that a failure's ``details`` keeps."""


def generate_request_id(command_type: CommandType) -> str:
    """A fresh key for one logical call: ``sdk-python-<type>-`` + ``uuid4().hex`` (contract §7)."""
    return f"sdk-python-{command_type}-{uuid.uuid4().hex}"


@dataclass(frozen=True)
class _Call:
    method: str
    path: str
    command_type: CommandType
    request_id: str
    content: bytes | None
    params: Mapping[str, str]
    timeout: float
    reads_receipt: bool = False


def _segment(value: object, name: str, request_id: str | None) -> str:
    if type(value) is not str or not value:
        raise InvalidRequest(
            f"{name}: must be a non-empty str, got {value!r}", request_id=request_id, field=name
        )
    if value in (".", ".."):
        # URL normalisation would remove a dot segment and change the route.
        raise InvalidRequest(f"{name}: must not be {value!r}", request_id=request_id, field=name)
    return quote(value, safe="")


def _choose_key(
    command_type: CommandType, given: object, new_request_id: Callable[[CommandType], str]
) -> str:
    # The server strips a key and treats a blank one as "no key" (contract
    # §2.1); the client does the same first, so that a blank key can never
    # become an unkeyed command that an automatic retry would record twice.
    try:
        key = normalize_request_id(given)
        if key is None:
            key = new_request_id(command_type)
        return validate_request_id(key, command_type)
    except InvalidRequest:
        raise
    except (InvalidValueError, ValueError) as exc:
        reason = getattr(exc, "code", "request_id_invalid")
        raise InvalidRequest(
            str(exc),
            request_id=given if isinstance(given, str) else None,
            field="request_id",
            reason=reason,
        ) from exc


def _command_call(
    command_type: CommandType,
    workflow_id: object,
    name: object,
    arguments: Value,
    *,
    request_id: object,
    run_id: object,
    wait_for: object,
    wait_timeout_seconds: object,
    codec: Codec,
    timeout: float,
    new_request_id: Callable[[CommandType], str],
) -> _Call:
    key = _choose_key(command_type, request_id, new_request_id)
    path = f"/api/workflows/{_segment(workflow_id, 'workflow_id', key)}"
    if run_id is not None:
        path += f"/runs/{_segment(run_id, 'run_id', key)}"
    path += f"/{command_type}/{_segment(name, 'name', key)}"
    try:
        payload = envelope(codec, list(arguments) if isinstance(arguments, tuple) else arguments)
    except InvalidValueError as exc:
        raise InvalidRequest(f"input: {exc}", request_id=key, field="input", reason="input_invalid") from exc
    body: dict[str, object] = {"request_id": key, "input": payload}
    wait = 0.0
    if command_type == "signal" and (wait_for is not None or wait_timeout_seconds is not None):
        raise InvalidRequest("wait_for: signals do not wait", request_id=key, field="wait_for")
    if wait_for is not None:
        if wait_for not in ("accepted", "completed"):
            raise InvalidRequest(
                f"wait_for: must be 'accepted' or 'completed', got {wait_for!r}",
                request_id=key,
                field="wait_for",
            )
        body["wait_for"] = wait_for
    if wait_timeout_seconds is not None:
        if (
            isinstance(wait_timeout_seconds, bool)
            or not isinstance(wait_timeout_seconds, (int, float))
            or not 0 <= wait_timeout_seconds <= MAX_WAIT_SECONDS
        ):
            raise InvalidRequest(
                f"wait_timeout_seconds: must be a number from 0 to {MAX_WAIT_SECONDS:g}, "
                f"got {wait_timeout_seconds!r}",
                request_id=key,
                field="wait_timeout_seconds",
            )
        body["wait_timeout_seconds"] = wait_timeout_seconds
    if wait_for == "completed":
        # The server holds the response while it waits; the read must outlast that.
        wait = (
            float(wait_timeout_seconds) if wait_timeout_seconds is not None else SERVER_DEFAULT_WAIT_SECONDS
        )
    # Serialised once: every automatic attempt sends exactly these bytes.
    content = json.dumps(body, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode("utf-8")
    return _Call("POST", path, command_type, key, content, {}, timeout + wait)


def _receipt_call(workflow_id: object, command_type: object, request_id: object, timeout: float) -> _Call:
    if command_type not in ("signal", "update"):
        raise InvalidRequest(
            f"command_type: must be 'signal' or 'update', got {command_type!r}",
            request_id=request_id if isinstance(request_id, str) else None,
            field="command_type",
        )
    kind: CommandType = "signal" if command_type == "signal" else "update"

    def refuse(_: CommandType) -> str:
        raise InvalidRequest("request_id: a receipt is read by its key", request_id=None, field="request_id")

    key = _choose_key(kind, request_id, refuse)
    path = f"/api/workflows/{_segment(workflow_id, 'workflow_id', key)}/receipts/{kind}"
    return _Call("GET", path, kind, key, None, {"request_id": key}, timeout, reads_receipt=True)


def _json_body(response: httpx.Response) -> dict[str, object] | None:
    try:
        body = json.loads(response.content)
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


def _interpret(call: _Call, response: httpx.Response) -> Receipt | None:
    """The answer to a call, or its typed failure; ``None`` only for a receipt that does not exist."""
    status = response.status_code
    body = _json_body(response)
    key = call.request_id
    if body is None:
        raise UnexpectedResponse(
            f"HTTP {status}: the body is not a JSON object", request_id=key, status=status
        )
    reason = _opt_str(body, "reason")
    outcome = _opt_str(body, "outcome")
    message = _opt_str(body, "message")
    if call.reads_receipt and status == 404 and reason == "receipt_not_found":
        return None
    if reason == "request_id_ambiguous" or outcome == "request_id_ambiguous":
        raise RequestIdAmbiguous(
            message or f"{call.command_type} request_id {key!r} cannot be proven to name one receipt",
            request_id=key,
            status=status,
            body=body,
            ambiguity=_opt_str(body, "ambiguity"),
        )
    if reason == "request_id_conflict" or outcome == "request_id_conflict":
        details: dict[str, object] = {name: body[name] for name in CONFLICT_FIELDS if name in body}
        failure = SignalFailed if call.command_type == "signal" else UpdateFailed
        raise failure(
            message or f"{call.command_type} request_id already retained with a different intent",
            request_id=key,
            status=status,
            reason="request_id_conflict",
            body=body,
            details=details,
        )
    receipt: Receipt | None = None
    if outcome is not None:
        try:
            receipt = Receipt.from_body(status, body)
        except ValueError as exc:
            raise UnexpectedResponse(
                f"HTTP {status}: {exc}", request_id=key, status=status, reason=reason, body=body
            ) from exc
        if receipt.request_id != key or receipt.command_type != call.command_type:
            # The answer must be about this key; anything else is not ours to return.
            raise UnexpectedResponse(
                f"HTTP {status}: the answer names {receipt.command_type} key {receipt.request_id!r}, "
                f"not {call.command_type} key {key!r}",
                request_id=key,
                status=status,
                reason=reason,
                body=body,
            )
        if call.reads_receipt or status in (200, 202):
            return receipt
        if outcome in ("run_not_active", "rejected_not_current"):
            raise CommandRejected(
                message or f"{call.command_type} refused: {outcome}",
                request_id=key,
                status=status,
                reason=reason or outcome,
                body=body,
                receipt=receipt,
            )
        if outcome == "failed" and call.command_type == "update":
            raise UpdateFailed(
                message or f"update failed: {receipt.failure}",
                request_id=key,
                status=status,
                reason="update_failed",
                body=body,
                details={"update_id": receipt.update_id, "failure": receipt.failure},
                receipt=receipt,
            )
    if status in (401, 403):
        raise AccessDenied(
            message or f"HTTP {status}: {reason or 'access denied'}",
            request_id=key,
            status=status,
            reason=reason,
            body=body,
        )
    if status == 422:
        raise InvalidRequest(
            message or f"HTTP 422: {reason}",
            request_id=key,
            field=_opt_str(body, "field"),
            status=status,
            reason=reason,
            body=body,
        )
    raise UnexpectedResponse(
        message or f"HTTP {status}: {reason or 'no admission answer'}",
        request_id=key,
        status=status,
        reason=reason,
        body=body,
    )


class _Attempts:
    """The attempts of one call under a policy: which answer ends it, how long to wait, when to give up."""

    def __init__(self, policy: TransportRetryPolicy, call: _Call, random: Callable[[], float]) -> None:
        self.policy = policy
        self.call = call
        self.random = random

    def __iter__(self) -> Iterator[int]:
        return iter(range(1, self.policy.max_attempts + 1))

    def _wait(self, attempt: int) -> float | None:
        if attempt >= self.policy.max_attempts:
            return None
        return self.policy.delay(attempt, self.random())

    def answered(self, attempt: int, response: httpx.Response) -> float | None:
        """``None``: this response is the answer.  Else the wait before the next attempt."""
        if not self.policy.retries_status(response.status_code):
            return None
        wait = self._wait(attempt)
        if wait is not None:
            wait = self.policy.honour_retry_after(wait, response.headers.get("retry-after"))
        if wait is None:
            body = _json_body(response)
            raise TransportFailed(
                f"no definite answer after {attempt} attempt(s): last HTTP {response.status_code}",
                request_id=self.call.request_id,
                attempts=attempt,
                status=response.status_code,
                reason=_opt_str(body, "reason") if body else None,
                body=body,
            )
        return wait

    def failed(self, attempt: int, error: httpx.HTTPError) -> float:
        """The wait before the next attempt after a transport error; raises when there is none."""
        if not self.policy.retries_error(error):
            raise TransportFailed(
                f"not retried: {type(error).__name__}: {error}",
                request_id=self.call.request_id,
                attempts=attempt,
            ) from error
        wait = self._wait(attempt)
        if wait is None:
            raise TransportFailed(
                f"no definite answer after {attempt} attempt(s): {type(error).__name__}: {error}",
                request_id=self.call.request_id,
                attempts=attempt,
            ) from error
        return wait
