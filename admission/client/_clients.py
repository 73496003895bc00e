"""The two clients: :class:`AdmissionClient` (httpx.Client) and :class:`AsyncAdmissionClient`.

Both build a call and interpret its answer through the same code
(:mod:`admission.client._calls`) and share their settings through
:class:`_Client`; only sending an attempt and sleeping between attempts
differ, and the async client awaits them.
"""

from __future__ import annotations

import asyncio
import contextlib
import random as _random
import time
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any, Final

import httpx

from admission.client._calls import (
    CommandType,
    WaitFor,
    _Attempts,
    _Call,
    _command_call,
    _interpret,
    _receipt_call,
    generate_request_id,
)
from admission.client._errors import ClientError, Receipt
from admission.client._policy import TransportRetryPolicy
from admission.errors import InvalidValueError
from admission.http._codecs import CborCodec, Codec
from admission.http._tokens import encode_namespace
from admission.intent._encoding import Value

DEFAULT_TIMEOUT_SECONDS: Final = 10.0
"""Per-attempt HTTP timeout (connect, read, write, pool)."""


def _tag(error: Exception, request_id: str) -> None:
    # An exception the client does not translate still says which key it was
    # about (contract §7).
    if getattr(error, "request_id", None) is None:
        with contextlib.suppress(AttributeError):
            error.request_id = request_id  # type: ignore[attr-defined]


_HEADERS: Final = {"content-type": "application/json", "accept": "application/json"}


def _headers(namespace: str, token: str | None) -> dict[str, str]:
    # Percent-encoded UTF-8: the server refuses raw non-ASCII bytes (docs/http.md, "Headers").
    headers = {**_HEADERS, "x-namespace": encode_namespace(namespace)}
    if token is not None:
        headers["authorization"] = f"Bearer {token}"
    return headers


def _check_namespace(namespace: object) -> str:
    if type(namespace) is not str or not namespace:
        raise InvalidValueError(f"must be a non-empty str, got {namespace!r}", field="namespace", path="")
    try:
        encode_namespace(namespace)
    except UnicodeEncodeError:
        reason = "is not valid Unicode (a lone surrogate)"
        raise InvalidValueError(reason, field="namespace", path="") from None
    return namespace


def _check_token(token: object) -> str | None:
    # The token is never quoted back: an error says what is wrong with it, not what it is.
    if token is None:
        return None
    if type(token) is not str or not token:
        raise InvalidValueError("must be a non-empty str", field="token", path="")
    if not all("\x21" <= c <= "\x7e" for c in token):
        raise InvalidValueError("must be printable ASCII without spaces", field="token", path="")
    return token


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
        token: str | None = None,
    ) -> None:
        self.namespace = _check_namespace(namespace)
        self._token = _check_token(token)
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
            "headers": _headers(self.namespace, self._token),
            "timeout": call.timeout,
        }


def _issued(receipt: Receipt | None) -> Receipt:
    # A command always has a receipt: _interpret raises for every other answer.
    assert receipt is not None
    return receipt


class AdmissionClient(_Client):
    """The synchronous client, on :class:`httpx.Client`.

    ``base_url`` is where the admission app is mounted; ``namespace`` goes in
    the ``X-Namespace`` header (percent-encoded UTF-8); ``token`` is sent as
    ``Authorization: Bearer`` to a server that requires one (``admission
    serve --tokens``); ``codec`` encodes arguments into the input
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
        token: str | None = None,
    ) -> None:
        super().__init__(namespace, codec, policy, timeout, random, new_request_id, token)
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
    :class:`AdmissionClient`, awaited (``token`` too).  ``sleep`` is awaited between attempts."""

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
        token: str | None = None,
    ) -> None:
        super().__init__(namespace, codec, policy, timeout, random, new_request_id, token)
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
