"""The app's gate: the namespace header decoded once, and the authorizer asked, before anything else runs.

An ASGI middleware, so that a request is refused before its body is read,
parsed or handed to the service: nothing is written and nothing is decoded
for a caller that may not act.  The order, for every route of the app (the
OpenAPI document and its pages excepted):

1. ``X-Namespace`` is decoded (:func:`~admission.http._tokens.decode_namespace`);
   a header that cannot be is 422 ``input_invalid``, ``field: "namespace"``;
2. the authorizer, if there is one, is asked; :class:`AuthenticationError`
   is 401 with ``WWW-Authenticate: Bearer`` (RFC 6750 §3),
   :class:`NamespaceForbiddenError` 403; anything else it raises is a 500
   (the request is refused: the gate fails closed);
3. the route runs with the decoded namespace (:func:`namespace_in`).

Refusals have the app's error body (``reason``, ``message``) and never quote
a header's value: a token does not reach a response or a log line.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable, Collection, MutableMapping
from typing import Annotated, Any, Final

from fastapi import FastAPI, Header, Request
from starlette.datastructures import Headers
from starlette.responses import JSONResponse

from admission.errors import InvalidValueError
from admission.http._tokens import (
    DEFAULT_NAMESPACE,
    NAMESPACE_HEADER,
    AccessError,
    AuthenticationError,
    Authorizer,
    AuthRequest,
    Principal,
    decode_namespace,
)

__all__ = ["Gate", "install_gate", "namespace_in", "principal_in", "request_namespace"]

_log = logging.getLogger("admission.http")

_NAMESPACE_KEY: Final = "admission.namespace"
_PRINCIPAL_KEY: Final = "admission.principal"

_Scope = MutableMapping[str, Any]
_Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
_Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


def namespace_in(scope: MutableMapping[str, Any], default: str) -> str:
    """The namespace the gate decoded for this request (``default`` outside the gate)."""
    value = scope.get(_NAMESPACE_KEY, default)
    return value if isinstance(value, str) else default


def principal_in(scope: MutableMapping[str, Any]) -> Principal | None:
    """The :class:`Principal` the authorizer returned for this request; ``None`` without one."""
    value = scope.get(_PRINCIPAL_KEY)
    return value if isinstance(value, Principal) else None


async def request_namespace(
    request: Request,
    _header: Annotated[
        str | None,
        Header(alias=NAMESPACE_HEADER, description="The namespace, percent-encoded UTF-8."),
    ] = None,
) -> str:
    """A route's dependency: the namespace the gate decoded.

    The header is declared for the OpenAPI document; its value is the gate's,
    percent-decoded and never read as Latin-1.  It is ``async`` although it
    awaits nothing: the framework runs a plain function dependency on its
    thread pool, and that hop, on every request, cost more than the retained
    admission itself.
    """
    return namespace_in(request.scope, DEFAULT_NAMESPACE)


def install_gate(app: FastAPI, authorize: Authorizer | None) -> None:
    """Put the :class:`Gate` in front of ``app``'s routes; its OpenAPI document and pages stay open."""
    docs = {app.openapi_url, app.docs_url, app.redoc_url, app.swagger_ui_oauth2_redirect_url}
    app.add_middleware(
        Gate,
        authorize=authorize,
        header=NAMESPACE_HEADER,
        default_namespace=DEFAULT_NAMESPACE,
        open_paths={path for path in docs if path},
    )


def _route_path(scope: _Scope) -> str:
    # The path inside this app: a mounted app sees its prefix in root_path.
    path = str(scope.get("path", ""))
    root = str(scope.get("root_path", ""))
    if root and path.startswith(root):
        return path[len(root) :] or "/"
    return path


class Gate:
    """ASGI middleware: decode ``X-Namespace`` and ask the authorizer, before the route runs."""

    def __init__(
        self,
        app: Callable[[_Scope, _Receive, _Send], Awaitable[None]],
        *,
        authorize: Authorizer | None,
        header: str,
        default_namespace: str,
        open_paths: Collection[str] = (),
    ) -> None:
        self.app = app
        self.authorize = authorize
        self.header = header
        self._raw_header = header.lower().encode("ascii")
        self.default_namespace = default_namespace
        self.open_paths = frozenset(open_paths)

    async def __call__(self, scope: _Scope, receive: _Receive, send: _Send) -> None:
        """Refuse the request, or pass it on with its namespace (and principal) in the scope."""
        if scope["type"] != "http" or _route_path(scope) in self.open_paths:
            await self.app(scope, receive, send)
            return
        raw = [value for name, value in scope.get("headers", ()) if name.lower() == self._raw_header]
        try:
            namespace = decode_namespace(raw, self.default_namespace, header=self.header)
        except InvalidValueError as exc:
            await _refuse(422, "input_invalid", exc.message, scope, receive, send, field="namespace")
            return
        scope[_NAMESPACE_KEY] = namespace
        if self.authorize is not None:
            request = AuthRequest(namespace, Headers(scope=scope), str(scope["method"]), _route_path(scope))
            try:
                principal = await _ask(self.authorize, request)
            except AccessError as exc:
                await _refused_access(exc, scope, receive, send)
                return
            scope[_PRINCIPAL_KEY] = principal
        await self.app(scope, receive, send)


async def _ask(authorize: Authorizer, request: AuthRequest) -> Principal:
    answer = authorize(request)
    if inspect.isawaitable(answer):
        answer = await answer
    if not isinstance(answer, Principal):
        # A hook that forgot to return is a bug, and a bug lets no one in.
        raise TypeError(f"the authorizer returned {type(answer).__name__}, not a Principal")
    return answer


async def _refused_access(exc: AccessError, scope: _Scope, receive: _Receive, send: _Send) -> None:
    headers: dict[str, str] = {}
    if isinstance(exc, AuthenticationError):
        # RFC 6750 §3: the challenge; invalid_token when a token was sent and refused.
        challenge = 'Bearer realm="admission"'
        if exc.invalid:
            challenge += ', error="invalid_token"'
        headers["WWW-Authenticate"] = challenge
    _log.debug("refused %s %s: %s", scope.get("method"), _route_path(scope), exc.code)
    await _refuse(exc.status, exc.code, exc.message, scope, receive, send, headers=headers)


async def _refuse(
    status: int,
    reason: str,
    message: str,
    scope: _Scope,
    receive: _Receive,
    send: _Send,
    *,
    field: str | None = None,
    headers: dict[str, str] | None = None,
) -> None:
    body: dict[str, object] = {"reason": reason, "message": message}
    if field is not None:
        body["field"] = field
    await JSONResponse(body, status_code=status, headers=headers)(scope, receive, send)
