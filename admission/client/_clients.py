"""Caller helpers over HTTP: one key per logical call, safe transport retries, typed failures.

A caller that loses a response cannot tell whether its command landed.  The
client makes the retry safe (contract §2.7, §7):

- When the caller gives no key, it generates ``sdk-python-signal-<32 hex>`` /
  ``sdk-python-update-<32 hex>`` once per logical call; the request body is
  serialised once and every automatic attempt resends those same bytes, so
  the server answers a retry after a lost response from the retained receipt.
- :class:`TransportRetryPolicy` retries only what cannot have been a definite
  answer: connection errors, disconnects before a response, timeouts, 5xx and
  429.  A 409 (conflict, ambiguity, refusal) or any other 4xx is an answer,
  and is never retried.
- Every exception raised after the key was chosen carries ``request_id``, so
  the caller can retry later with the same key, or read the receipt.

Transport correlation (``X-Request-Id``) is never sent: the key travels in the
body only (contract §2.7).  The wire format is ``docs/http.md``; the usage
guide is ``docs/client.md``.

Needs the ``http`` extra (httpx).  Time (``sleep``) and randomness (``random``,
``new_request_id``) are parameters.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import random as _random
import re
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, ClassVar, Final, Literal
from urllib.parse import quote

import httpx

from admission.errors import AdmissionError, InvalidValueError
from admission.http._codecs import CborCodec, Codec, envelope
from admission.intent._encoding import Value
from admission.intent._keys import normalize_request_id, validate_request_id

__all__ = [
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

CommandType = Literal["signal", "update"]
WaitFor = Literal["accepted", "completed"]

DEFAULT_TIMEOUT_SECONDS: Final = 10.0
"""Per-attempt HTTP timeout (connect, read, write, pool)."""
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


# -- the retry policy ---------------------------------------------------------------------------

# What is retried, and why it is safe: the request carries its command key, so
# a resend of the same bytes is answered from the retained receipt when the
# first attempt did land (contract §4).  What is retried is exactly what cannot
# be a definite answer from admission.  Local protocol errors, unsupported
# schemes and proxy errors are the caller's configuration: resending cannot help.
_DELTA_SECONDS: Final = re.compile(r"[0-9]{1,9}")
_RETRIED_ERRORS: Final = (httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError)


@dataclass(frozen=True)
class TransportRetryPolicy:
    """Which attempts are retried, how often, and how long to wait in between.

    ``max_attempts`` counts every attempt, the first included (1 = never
    retry).  The wait before retry ``n`` (1-based) is
    ``min(max_backoff, initial * multiplier ** (n - 1))``, scaled by a random
    factor in ``[1 - jitter, 1 + jitter]`` and capped at ``max_backoff``.
    """

    max_attempts: int = 3
    initial_backoff_seconds: float = 0.1
    max_backoff_seconds: float = 5.0
    backoff_multiplier: float = 2.0
    jitter: float = 0.25

    def __post_init__(self) -> None:
        if type(self.max_attempts) is not int or self.max_attempts < 1:
            raise InvalidValueError(
                f"must be an int >= 1, got {self.max_attempts!r}", field="max_attempts", path=""
            )
        for name in ("initial_backoff_seconds", "max_backoff_seconds", "backoff_multiplier", "jitter"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise InvalidValueError(f"must be a finite number, got {value!r}", field=name, path="")
            if value < 0:
                raise InvalidValueError(f"must not be negative, got {value!r}", field=name, path="")
        if self.initial_backoff_seconds > self.max_backoff_seconds:
            raise InvalidValueError(
                f"must not exceed max_backoff_seconds ({self.max_backoff_seconds!r}), "
                f"got {self.initial_backoff_seconds!r}",
                field="initial_backoff_seconds",
                path="",
            )
        if self.backoff_multiplier < 1:
            raise InvalidValueError(
                f"must be >= 1, got {self.backoff_multiplier!r}", field="backoff_multiplier", path=""
            )
        if self.jitter > 1:
            raise InvalidValueError(f"must be in [0, 1], got {self.jitter!r}", field="jitter", path="")

    def retries_status(self, status: int) -> bool:
        """True for 5xx and 429: the server did not decide, or asked to come back later.

        Every other status, 409 and the rest of 4xx included, is an answer.
        """
        return status == 429 or 500 <= status <= 599

    def retries_error(self, error: BaseException) -> bool:
        """True for connection errors, disconnects before a response and timeouts."""
        return isinstance(error, _RETRIED_ERRORS)

    def base_delay(self, retry: int) -> float:
        """The wait before retry ``retry`` (1-based), before jitter."""
        if retry < 1:
            raise InvalidValueError(f"must be >= 1, got {retry!r}", field="retry", path="")
        # Exponent capped so that a large retry number cannot overflow the float.
        exponent = min(retry - 1, 1024)
        try:
            grown = self.initial_backoff_seconds * self.backoff_multiplier**exponent
        except OverflowError:
            grown = math.inf
        return min(self.max_backoff_seconds, grown)

    def honour_retry_after(self, delay: float, retry_after: str | None) -> float:
        """The wait after a 429 / 5xx: at least the server's ``Retry-After`` (RFC 9110 §10.2.3, in
        seconds), but never more than ``max_backoff_seconds``; an HTTP-date or junk is ignored."""
        if retry_after is None or not _DELTA_SECONDS.fullmatch(retry_after.strip()):
            return delay
        return max(delay, min(float(retry_after.strip()), self.max_backoff_seconds))

    def delay(self, retry: int, unit: float) -> float:
        """The wait before retry ``retry`` (1-based), given ``unit`` uniform in ``[0, 1]``."""
        if not 0.0 <= unit <= 1.0:
            raise InvalidValueError(f"must be in [0, 1], got {unit!r}", field="unit", path="")
        factor = 1.0 + self.jitter * (2.0 * unit - 1.0)
        return max(0.0, min(self.max_backoff_seconds, self.base_delay(retry) * factor))


# -- answers and failures ------------------------------------------------------------------------


def _opt_str(body: Mapping[str, object], name: str) -> str | None:
    value = body.get(name)
    return value if isinstance(value, str) else None


@dataclass(frozen=True)
class Receipt:
    """An admission answer as the server sent it (contract §4 JSON), with its main fields typed.

    ``retained`` is true when the answer is an earlier admission of this key
    (the original ids, never new ones); ``intent_verified`` is false only for
    a legacy receipt that carries no digest.  ``raw`` is the body unchanged.
    """

    status: int
    outcome: str
    namespace: str
    workflow_id: str
    command_type: str
    request_id: str | None
    retained: bool
    intent_verified: bool
    target_scope: str
    command_id: str | None
    run_id: str | None
    command_sequence: int | None
    received_at: str | None
    update_id: str | None
    update_status: str | None
    result: object
    failure: str | None
    reason: str | None
    raw: Mapping[str, object] = field(repr=False, compare=False)

    @classmethod
    def from_body(cls, status: int, body: Mapping[str, object]) -> Receipt:
        """Read an admission body; a body without the contract §4 fields is :class:`ValueError`."""
        missing = [
            name
            for name, kind in (
                ("outcome", str),
                ("namespace", str),
                ("workflow_id", str),
                ("command_type", str),
                ("retained", bool),
                ("intent_verified", bool),
            )
            if not isinstance(body.get(name), kind)
        ]
        if missing:
            raise ValueError(f"not an admission answer: missing or mistyped {', '.join(missing)}")
        sequence = body.get("command_sequence")
        return cls(
            status=status,
            outcome=str(body["outcome"]),
            namespace=str(body["namespace"]),
            workflow_id=str(body["workflow_id"]),
            command_type=str(body["command_type"]),
            request_id=_opt_str(body, "request_id"),
            retained=body["retained"] is True,
            intent_verified=body["intent_verified"] is True,
            target_scope=_opt_str(body, "target_scope") or "instance",
            command_id=_opt_str(body, "command_id"),
            run_id=_opt_str(body, "run_id"),
            command_sequence=sequence if type(sequence) is int else None,
            received_at=_opt_str(body, "received_at"),
            update_id=_opt_str(body, "update_id"),
            update_status=_opt_str(body, "update_status"),
            result=body.get("result"),
            failure=_opt_str(body, "failure"),
            reason=_opt_str(body, "reason"),
            raw=dict(body),
        )

    @property
    def completed(self) -> bool:
        """True for an update that has completed (200)."""
        return self.update_status == "completed"


class ClientError(AdmissionError):
    """Base class of every failure the client raises.

    ``request_id`` is the key of the logical call (set on every failure raised
    after the key was chosen, contract §7); ``status`` and ``body`` are the
    last HTTP response, when there was one; ``reason`` is its stable word.
    """

    code: ClassVar[str] = "client_error"

    def __init__(
        self,
        message: str,
        *,
        request_id: str | None,
        status: int | None = None,
        reason: str | None = None,
        body: Mapping[str, object] | None = None,
    ) -> None:
        super().__init__(message)
        self.request_id = request_id
        self.status = status
        self.reason = reason
        self.body = dict(body) if body is not None else None


class SignalFailed(ClientError):
    """A signal was refused as ``request_id_conflict``: the key names a different intent.

    Nothing was written and the key was not consumed.  ``details`` holds the
    conflict fields (``retained_command_id``, ``retained_command_type``,
    ``retained_outcome``, ``conflict`` ⊆ {name, arguments, target}).
    """

    code: ClassVar[str] = "signal_failed"

    def __init__(
        self,
        message: str,
        *,
        request_id: str | None,
        status: int | None = None,
        reason: str | None = None,
        body: Mapping[str, object] | None = None,
        details: Mapping[str, object] | None = None,
    ) -> None:
        super().__init__(message, request_id=request_id, status=status, reason=reason, body=body)
        self.details = dict(details or {})


class UpdateFailed(ClientError):
    """An update was refused as ``request_id_conflict`` (as :class:`SignalFailed`), or it failed.

    ``reason`` tells which: ``"request_id_conflict"`` (``details`` holds the
    conflict fields, ``receipt`` is ``None``) or ``"update_failed"`` (the
    update was admitted and then failed, 422: ``receipt`` is its receipt,
    ``details`` holds ``update_id`` and ``failure``).
    """

    code: ClassVar[str] = "update_failed"

    def __init__(
        self,
        message: str,
        *,
        request_id: str | None,
        status: int | None = None,
        reason: str | None = None,
        body: Mapping[str, object] | None = None,
        details: Mapping[str, object] | None = None,
        receipt: Receipt | None = None,
    ) -> None:
        super().__init__(message, request_id=request_id, status=status, reason=reason, body=body)
        self.details = dict(details or {})
        self.receipt = receipt


class RequestIdAmbiguous(ClientError):
    """The key cannot be proven to name one receipt (409 ``request_id_ambiguous``, contract §6).

    Nothing was written and no receipt was selected.  Retrying unchanged
    fails the same way, so it is never retried; ``ambiguity`` names the shape.
    """

    code: ClassVar[str] = "request_id_ambiguous"

    def __init__(
        self,
        message: str,
        *,
        request_id: str | None,
        status: int | None = None,
        body: Mapping[str, object] | None = None,
        ambiguity: str | None = None,
    ) -> None:
        super().__init__(
            message, request_id=request_id, status=status, reason="request_id_ambiguous", body=body
        )
        self.ambiguity = ambiguity


class CommandRejected(ClientError):
    """The target refused the command: 409 ``run_not_active`` or ``rejected_not_current``.

    A keyed refusal is itself retained (contract §4): ``receipt`` is it, and
    a retry returns the same refusal.  ``outcome`` is the refusal;
    ``requested_run_id`` / ``resolved_run_id`` say which run was asked for
    and which is current.
    """

    code: ClassVar[str] = "command_rejected"

    def __init__(
        self,
        message: str,
        *,
        request_id: str | None,
        status: int | None = None,
        reason: str | None = None,
        body: Mapping[str, object] | None = None,
        receipt: Receipt | None = None,
    ) -> None:
        super().__init__(message, request_id=request_id, status=status, reason=reason, body=body)
        self.receipt = receipt
        self.outcome = receipt.outcome if receipt is not None else reason
        source = body or {}
        self.requested_run_id = _opt_str(source, "requested_run_id")
        self.resolved_run_id = _opt_str(source, "resolved_run_id")


class InvalidRequest(ClientError, ValueError):
    """The request was refused as invalid (422, or checked before sending); nothing was written.

    ``field`` names the input (``request_id``, ``input``, ``wait_for``, ...),
    ``reason`` the stable word (``request_id_invalid``, ``request_id_reserved``,
    ``input_invalid``).  Resending the same request cannot succeed.
    """

    code: ClassVar[str] = "invalid_request"

    def __init__(
        self,
        message: str,
        *,
        request_id: str | None,
        field: str | None,
        status: int | None = None,
        reason: str | None = None,
        body: Mapping[str, object] | None = None,
    ) -> None:
        super().__init__(message, request_id=request_id, status=status, reason=reason, body=body)
        self.field = field


class TransportFailed(ClientError):
    """No definite answer: every attempt failed in transport, or with 5xx / 429.

    The command may or may not have been admitted.  Retry later with the same
    ``request_id`` (a landed command is answered from its receipt), or read
    the receipt.  ``attempts`` counts the attempts made; ``status`` is the last
    response's status, ``None`` when the last attempt got no response.
    """

    code: ClassVar[str] = "transport_failed"

    def __init__(
        self,
        message: str,
        *,
        request_id: str | None,
        attempts: int,
        status: int | None = None,
        reason: str | None = None,
        body: Mapping[str, object] | None = None,
    ) -> None:
        super().__init__(message, request_id=request_id, status=status, reason=reason, body=body)
        self.attempts = attempts


class UnexpectedResponse(ClientError):
    """A response the wire contract does not describe (an unknown route, a body that is not JSON).

    Not retried: it is a definite answer from something, just not from an
    admission endpoint as documented.
    """

    code: ClassVar[str] = "unexpected_response"


# -- one logical call: prepared once, interpreted the same way by both clients ---------------


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


def _tag(error: Exception, request_id: str) -> None:
    # An exception the client does not translate still says which key it was
    # about (contract §7).
    if getattr(error, "request_id", None) is None:
        with contextlib.suppress(AttributeError):
            error.request_id = request_id  # type: ignore[attr-defined]


_HEADERS: Final = {"content-type": "application/json", "accept": "application/json"}


def _headers(namespace: str) -> dict[str, str]:
    return {**_HEADERS, "x-namespace": namespace}


def _check_namespace(namespace: object) -> str:
    if type(namespace) is not str or not namespace:
        raise InvalidValueError(f"must be a non-empty str, got {namespace!r}", field="namespace", path="")
    return namespace


class _Client:
    """What the two clients share: their settings, and how a call is built from a method's arguments."""

    def __init__(
        self,
        namespace: str,
        codec: Codec | None,
        policy: TransportRetryPolicy | None,
        timeout: float,
        random: Callable[[], float],
        new_request_id: Callable[[CommandType], str],
    ) -> None:
        self.namespace = _check_namespace(namespace)
        self.codec: Codec = codec if codec is not None else CborCodec()
        self.policy = policy if policy is not None else TransportRetryPolicy()
        self.timeout = timeout
        self._random = random
        self._new_request_id = new_request_id

    def _command(
        self,
        command_type: CommandType,
        workflow_id: str,
        name: str,
        arguments: Value,
        request_id: str | None,
        run_id: str | None,
        wait_for: WaitFor | None = None,
        wait_timeout_seconds: float | None = None,
    ) -> _Call:
        return _command_call(
            command_type,
            workflow_id,
            name,
            arguments,
            request_id=request_id,
            run_id=run_id,
            wait_for=wait_for,
            wait_timeout_seconds=wait_timeout_seconds,
            codec=self.codec,
            timeout=self.timeout,
            new_request_id=self._new_request_id,
        )

    def _request(self, call: _Call) -> dict[str, Any]:
        """The keyword arguments of one HTTP attempt of ``call``."""
        return {
            "content": call.content,
            "params": call.params,
            "headers": _headers(self.namespace),
            "timeout": call.timeout,
        }


def _issued(receipt: Receipt | None) -> Receipt:
    # A command always has a receipt: _interpret raises for every other answer.
    assert receipt is not None
    return receipt


class AdmissionClient(_Client):
    """The synchronous client, on :class:`httpx.Client`.

    ``base_url`` is where the admission app is mounted; ``namespace`` goes in
    the ``X-Namespace`` header; ``codec`` encodes arguments into the input
    envelope (canonical CBOR by default: every typed value round-trips).
    Give ``http_client`` to reuse a configured client (it is then not closed
    here), or ``transport`` to replace the network (tests).
    """

    def __init__(
        self,
        base_url: str = "http://127.0.0.1:8000",
        *,
        namespace: str = "default",
        codec: Codec | None = None,
        policy: TransportRetryPolicy | None = None,
        timeout: float = DEFAULT_TIMEOUT_SECONDS,
        http_client: httpx.Client | None = None,
        transport: httpx.BaseTransport | None = None,
        sleep: Callable[[float], None] = time.sleep,
        random: Callable[[], float] = _random.random,
        new_request_id: Callable[[CommandType], str] = generate_request_id,
    ) -> None:
        super().__init__(namespace, codec, policy, timeout, random, new_request_id)
        self._owned = http_client is None
        self._http = (
            http_client
            if http_client is not None
            else httpx.Client(base_url=base_url, transport=transport, timeout=timeout)
        )
        self._sleep = sleep

    def signal(
        self,
        workflow_id: str,
        name: str,
        arguments: Value = (),
        *,
        request_id: str | None = None,
        run_id: str | None = None,
    ) -> Receipt:
        """Send a signal; the receipt is fresh (``retained`` false) or the key's original one.

        Raises :class:`SignalFailed` (conflict), :class:`RequestIdAmbiguous`,
        :class:`CommandRejected`, :class:`InvalidRequest`,
        :class:`TransportFailed` or :class:`UnexpectedResponse`, each with
        ``request_id``.
        """
        return _issued(self._run(self._command("signal", workflow_id, name, arguments, request_id, run_id)))

    def update(
        self,
        workflow_id: str,
        name: str,
        arguments: Value = (),
        *,
        request_id: str | None = None,
        run_id: str | None = None,
        wait_for: WaitFor | None = None,
        wait_timeout_seconds: float | None = None,
    ) -> Receipt:
        """Send an update; with ``wait_for="completed"`` the server waits up to the timeout.

        The receipt is 202 accepted (possibly still pending after the wait) or
        200 completed; a failed update raises :class:`UpdateFailed` with
        ``reason="update_failed"`` and its receipt.  Other failures as for
        :meth:`signal`, with :class:`UpdateFailed` for a conflict.
        """
        call = self._command(
            "update", workflow_id, name, arguments, request_id, run_id, wait_for, wait_timeout_seconds
        )
        return _issued(self._run(call))

    def receipt(self, workflow_id: str, command_type: CommandType, request_id: str) -> Receipt | None:
        """Read the receipt a key names, admitting nothing; ``None`` when there is none.

        Any retained state is returned as a :class:`Receipt` (a failed update,
        a retained refusal); an ambiguous key raises :class:`RequestIdAmbiguous`.
        """
        return self._run(_receipt_call(workflow_id, command_type, request_id, self.timeout))

    def _run(self, call: _Call) -> Receipt | None:
        try:
            return _interpret(call, self._send(call))
        except ClientError:
            raise
        except Exception as exc:
            _tag(exc, call.request_id)
            raise

    def _send(self, call: _Call) -> httpx.Response:
        plan = _Attempts(self.policy, call, self._random)
        for attempt in plan:
            try:
                response = self._http.request(call.method, call.path, **self._request(call))
            except httpx.HTTPError as exc:
                self._sleep(plan.failed(attempt, exc))
                continue
            wait = plan.answered(attempt, response)
            if wait is None:
                return response
            self._sleep(wait)
        raise AssertionError("unreachable: the last attempt returns or raises")

    def close(self) -> None:
        """Close the HTTP client, unless it was given by the caller."""
        if self._owned:
            self._http.close()

    def __enter__(self) -> AdmissionClient:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class AsyncAdmissionClient(_Client):
    """The asynchronous client, on :class:`httpx.AsyncClient`; the same calls and failures as
    :class:`AdmissionClient`, awaited.  ``sleep`` is awaited between attempts."""

    def __init__(
        self,
        base_url: str = "http://127.0.0.1:8000",
        *,
        namespace: str = "default",
        codec: Codec | None = None,
        policy: TransportRetryPolicy | None = None,
        timeout: float = DEFAULT_TIMEOUT_SECONDS,
        http_client: httpx.AsyncClient | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        random: Callable[[], float] = _random.random,
        new_request_id: Callable[[CommandType], str] = generate_request_id,
    ) -> None:
        super().__init__(namespace, codec, policy, timeout, random, new_request_id)
        self._owned = http_client is None
        self._http = (
            http_client
            if http_client is not None
            else httpx.AsyncClient(base_url=base_url, transport=transport, timeout=timeout)
        )
        self._sleep = sleep

    async def signal(
        self,
        workflow_id: str,
        name: str,
        arguments: Value = (),
        *,
        request_id: str | None = None,
        run_id: str | None = None,
    ) -> Receipt:
        """Send a signal (see :meth:`AdmissionClient.signal`)."""
        call = self._command("signal", workflow_id, name, arguments, request_id, run_id)
        return _issued(await self._run(call))

    async def update(
        self,
        workflow_id: str,
        name: str,
        arguments: Value = (),
        *,
        request_id: str | None = None,
        run_id: str | None = None,
        wait_for: WaitFor | None = None,
        wait_timeout_seconds: float | None = None,
    ) -> Receipt:
        """Send an update (see :meth:`AdmissionClient.update`)."""
        call = self._command(
            "update", workflow_id, name, arguments, request_id, run_id, wait_for, wait_timeout_seconds
        )
        return _issued(await self._run(call))

    async def receipt(self, workflow_id: str, command_type: CommandType, request_id: str) -> Receipt | None:
        """Read the receipt a key names (see :meth:`AdmissionClient.receipt`)."""
        return await self._run(_receipt_call(workflow_id, command_type, request_id, self.timeout))

    async def _run(self, call: _Call) -> Receipt | None:
        try:
            return _interpret(call, await self._send(call))
        except ClientError:
            raise
        except Exception as exc:
            _tag(exc, call.request_id)
            raise

    async def _send(self, call: _Call) -> httpx.Response:
        plan = _Attempts(self.policy, call, self._random)
        for attempt in plan:
            try:
                response = await self._http.request(call.method, call.path, **self._request(call))
            except httpx.HTTPError as exc:
                await self._sleep(plan.failed(attempt, exc))
                continue
            wait = plan.answered(attempt, response)
            if wait is None:
                return response
            await self._sleep(wait)
        raise AssertionError("unreachable: the last attempt returns or raises")

    async def aclose(self) -> None:
        """Close the HTTP client, unless it was given by the caller."""
        if self._owned:
            await self._http.aclose()

    async def __aenter__(self) -> AsyncAdmissionClient:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()
