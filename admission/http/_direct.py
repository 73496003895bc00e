"""The admission routes' direct path: the route's own endpoint, without the framework's per-request work.

For every request the framework solves the route's dependencies, matches
its parameters against each kind of input and validates the body; on a
retried admission that machinery cost several times the admission itself.
:class:`DirectAdmissions` sits below the gate and the body limit and takes
the common case, a ``POST`` to an admission route (``.../signal/{name}``,
``.../update/{name}``, run-pinned or not) with a ``Content-Type:
application/json`` body that is one strict JSON object, valid for the
route's body model.  It then does what the framework would: the same route
(matched by the router's own routes, in the router's order), the body parsed
once with the strict rules of :func:`~admission.http._wire.strict_body`
(duplicate member names and ``NaN`` refused), validated by the route's own
body field, and the route's own endpoint awaited with the namespace the gate
decoded; an exception is answered by the app's own handler.

Everything else, a body that is not such an object, one the model refuses,
another content type, any other route, goes to the framework with its body
unread, so every refusal is the framework's own (``docs/http.md``).  The
answers are the same either way: ``tests/integration/test_http_direct.py``
compares the two paths on generated requests.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any, Final

from fastapi import Request
from fastapi.routing import APIRoute
from starlette.routing import BaseRoute, Match

from admission.http._auth import namespace_in
from admission.http._tokens import DEFAULT_NAMESPACE
from admission.http._wire import refuse_constant, refuse_duplicates

__all__ = ["DirectAdmissions"]

_Scope = MutableMapping[str, Any]
_Message = MutableMapping[str, Any]
_Receive = Callable[[], Awaitable[_Message]]
_Send = Callable[[_Message], Awaitable[None]]
_App = Callable[[_Scope, _Receive, _Send], Awaitable[None]]
_Handler = Callable[[Request, Any], Any]

_JSON: Final = b"application/json"
# The endpoint parameters the direct path knows how to fill; a route with any other is left alone.
_KNOWN: Final = frozenset({"workflow_id", "run_id", "name", "body", "x_namespace", "request"})


class _Unsure(Exception):
    """The direct path cannot be sure of the framework's answer: hand the request over."""


def _strict_object(raw: bytes) -> dict[str, Any]:
    # The rules of strict_body; anything they (or the framework's parse) would refuse is unsure.
    try:
        value = json.loads(raw, object_pairs_hook=refuse_duplicates, parse_constant=refuse_constant)
    except (ValueError, RecursionError) as exc:  # InvalidValueError too
        raise _Unsure from exc
    if not isinstance(value, dict):
        raise _Unsure
    return value


class _Direct:
    """One admission route, as the direct path calls it."""

    def __init__(self, route: APIRoute) -> None:
        self.route = route
        self.takes_request = "request" in inspect.signature(route.endpoint).parameters
        self.body = route.dependant.body_params[0]

    @classmethod
    def of(cls, route: BaseRoute) -> _Direct | None:
        """The direct twin of ``route`` if it is an admission route whose inputs the path fills alike."""
        if not isinstance(route, APIRoute) or route.methods != {"POST"}:
            return None
        names = set(inspect.signature(route.endpoint).parameters)
        dependant = route.dependant
        plain_paths = all(
            p.field_info.annotation is str and not p.field_info.metadata for p in dependant.path_params
        )
        if not names <= _KNOWN or "body" not in names or len(dependant.body_params) != 1 or not plain_paths:
            return None
        if dependant.query_params or dependant.cookie_params:
            return None
        return cls(route)

    async def answer(
        self, scope: _Scope, receive: _Receive, raw: bytes, params: MutableMapping[str, Any]
    ) -> Any:
        """The endpoint's response, or :class:`_Unsure` before anything is called."""
        value, errors = self.body.validate(_strict_object(raw), {}, loc=("body",))
        if errors:
            raise _Unsure
        kwargs: dict[str, Any] = {
            **params,
            "body": value,
            "x_namespace": namespace_in(scope, DEFAULT_NAMESPACE),
        }
        if self.takes_request:
            kwargs["request"] = Request(scope, receive)
        return await self.route.endpoint(**kwargs)


class DirectAdmissions:
    """ASGI middleware: answer an admission request with its route's endpoint directly (module docstring).

    ``routes`` are the router's routes, in its order; ``handlers`` the app's
    exception handlers (the catch-all ``Exception`` handler stays with the
    framework's outermost layer, as it does for a route).
    """

    def __init__(self, app: _App, *, routes: Iterable[BaseRoute], handlers: dict[Any, _Handler]) -> None:
        self.app = app
        self.routes = list(routes)
        self.direct = {id(route): d for route in self.routes if (d := _Direct.of(route)) is not None}
        self.handlers = {kind: h for kind, h in handlers.items() if kind is not Exception}

    def _match(self, scope: _Scope) -> tuple[_Direct, MutableMapping[str, Any]] | None:
        for route in self.routes:
            match, child = route.matches(scope)
            if match is Match.FULL:
                direct = self.direct.get(id(route))
                return None if direct is None else (direct, child)
            if match is Match.PARTIAL:
                return None  # the framework's 405 or a later full match: its own business
        return None

    async def __call__(self, scope: _Scope, receive: _Receive, send: _Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or not _json_content(scope):
            await self.app(scope, receive, send)
            return
        found = self._match(scope)
        if found is None:
            await self.app(scope, receive, send)
            return
        direct, child = found
        messages: list[_Message] = []
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request" or not message.get("more_body", False):
                break
        if message["type"] != "http.request":
            await self.app(scope, _replaying(messages, receive), send)
            return
        raw = b"".join(bytes(m.get("body", b"")) for m in messages)
        routed = {**scope, **child, "route": direct.route}
        try:
            response = await direct.answer(routed, receive, raw, child["path_params"])
        except _Unsure:
            await self.app(scope, _replaying(messages, receive), send)
            return
        except Exception as exc:
            handler = self._handler(exc)
            if handler is None:
                raise  # the framework's outermost layer answers, as for a route
            response = handler(Request(routed, receive), exc)
            if inspect.isawaitable(response):
                response = await response
        await response(routed, receive, send)

    def _handler(self, exc: Exception) -> _Handler | None:
        for kind in type(exc).__mro__:
            if kind in self.handlers:
                return self.handlers[kind]
        return None


def _json_content(scope: _Scope) -> bool:
    for name, value in scope.get("headers", ()):
        if bytes(name).lower() == b"content-type":
            return bytes(value).lower() == _JSON
    return False


def _replaying(messages: list[_Message], receive: _Receive) -> _Receive:
    # What was read, once, in order; then the server's own messages.
    pending = list(reversed(messages))

    async def replay() -> _Message:
        if pending:
            return pending.pop()
        return await receive()

    return replay
