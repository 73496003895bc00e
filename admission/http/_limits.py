"""The adapter's bounds: on a request body (an ASGI guard that answers 413), and on concurrent waits.

The framework reads a whole body before it parses it; a body of any size
would be held in memory before its 422.  :class:`BodyLimit` sits below the
framework: it refuses a declared ``Content-Length`` over the limit before
reading a byte, and otherwise reads the body itself, chunk by chunk, and
refuses it as soon as the bytes received pass the limit.  The app above it
is handed the body only once the whole of it is known to fit, so nothing
above the guard ever buffers more than the limit.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Final

from admission.intent._encoding import DEFAULT_MAX_SIZE

__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_MAX_WAITS",
    "BodyLimit",
    "check_max_body_bytes",
    "check_max_waits",
]

DEFAULT_MAX_BODY_BYTES: Final = 2 * DEFAULT_MAX_SIZE
"""The default bound on a request body, in bytes: 2 MiB (2,097,152).

The largest arguments the encoding accepts are 1 MiB encoded
(``DEFAULT_MAX_SIZE``); carried as ``cbor`` or ``aes-gcm`` their base64 blob
is at most 1,398,140 bytes, which leaves about 680 KiB for the envelope
(``request_id``, member names, the JSON string's own escapes)."""
DEFAULT_MAX_WAITS: Final = 64
"""How many updates one app waits for at once unless told otherwise (``_waits``)."""

_Scope = MutableMapping[str, Any]
_Message = MutableMapping[str, Any]
_Receive = Callable[[], Awaitable[_Message]]
_Send = Callable[[_Message], Awaitable[None]]
_App = Callable[[_Scope, _Receive, _Send], Awaitable[None]]


def check_max_body_bytes(value: int) -> int:
    """``value`` if it is a usable body limit (a positive ``int``); ``ValueError`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"max_body_bytes must be a positive integer, got {value!r}")
    return value


def check_max_waits(value: int) -> int:
    """``value`` if it is a usable bound on concurrent waits (a positive ``int``); else ``ValueError``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"max_waits must be a positive integer, got {value!r}")
    return value


def _declared_length(scope: _Scope) -> int | None:
    # A Content-Length the server accepted is digits only (RFC 9110 §8.6);
    # anything else is left to the streamed count, which is never wrong.
    for name, value in scope.get("headers", ()):
        if name.lower() == b"content-length":
            text = bytes(value).strip()
            return int(text) if text.isdigit() else None
    return None


class BodyLimit:
    """ASGI middleware: a request body over ``max_body_bytes`` is refused with 413, read no further.

    The answer is the adapter's error shape: ``reason: "body_too_large"``,
    ``message``, ``max_body_bytes`` and ``retryable: false`` (the same body
    is refused again; a smaller one is a different request).  It closes the
    connection, so the rest of the body is never read.
    """

    def __init__(self, app: _App, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> None:
        self.app = app
        self.max_body_bytes = check_max_body_bytes(max_body_bytes)

    async def __call__(self, scope: _Scope, receive: _Receive, send: _Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _declared_length(scope)
        if declared is not None and declared > self.max_body_bytes:
            await self._refuse(send)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # the client left before its body ended: nobody to answer
            if message["type"] != "http.request":
                continue
            chunk = bytes(message.get("body", b""))
            size += len(chunk)
            if size > self.max_body_bytes:
                await self._refuse(send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        del chunks
        replayed = False

        async def replay() -> _Message:
            # The body once, whole; then the server's own messages (a disconnect
            # is how a waiting update learns that its caller has gone).
            nonlocal replayed, body
            if not replayed:
                replayed = True
                message: _Message = {"type": "http.request", "body": body, "more_body": False}
                body = b""
                return message
            return await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, send: _Send) -> None:
        payload = json.dumps(
            {
                "reason": "body_too_large",
                "message": (
                    f"the request body is larger than {self.max_body_bytes} bytes; "
                    "it was not read to its end and nothing was recorded"
                ),
                "max_body_bytes": self.max_body_bytes,
                "retryable": False,
            }
        ).encode("utf-8")
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(payload)).encode("ascii")),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": payload, "more_body": False})
