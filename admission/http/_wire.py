"""What every route of the HTTP adapter shares on the wire: bodies, error bodies, the strict parse.

The admission routes (``_app``) and the lifecycle routes (``_lifecycle``)
answer errors alike: a JSON object with at least ``reason`` and ``message``
(:func:`error_response`), and refuse a body whose meaning a JSON parser would
choose silently (duplicate member names, ``NaN``: :func:`strict_body`).
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from fastapi import Depends, Path, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from admission.errors import InvalidValueError
from admission.http._auth import request_namespace

__all__ = [
    "AdmissionAnswer",
    "Envelope",
    "ErrorBody",
    "NamespaceHeader",
    "WorkflowIdPath",
    "error_response",
    "refuse_constant",
    "refuse_duplicates",
    "strict_body",
]


class Envelope(BaseModel):
    """A codec envelope: the codec's name and the blob it decodes."""

    model_config = ConfigDict(extra="forbid", strict=True)

    codec: str = Field(description="The codec's name: `json`, `cbor`, or one the server adds (`aes-gcm`).")
    blob: str = Field(description="The codec's text form of the value (arguments: a list or an object).")


class ErrorBody(BaseModel):
    """The shape of every 4xx/5xx body: at least ``reason`` and ``message``."""

    model_config = ConfigDict(extra="allow")

    reason: str
    message: str


class AdmissionAnswer(BaseModel):
    """An admission answer: ``Admission.to_dict()`` (contract §4)."""

    model_config = ConfigDict(extra="allow")

    outcome: str
    http_status: int
    namespace: str
    workflow_id: str
    command_type: Literal["signal", "update"]
    request_id: str | None
    retained: bool
    intent_verified: bool


def _json_safe(value: object) -> object:
    # Only what strict JSON in UTF-8 can carry goes back into an error body.
    try:
        json.dumps(value, ensure_ascii=False, allow_nan=False).encode("utf-8")
    except (TypeError, ValueError, UnicodeEncodeError):
        return None
    return value


def error_response(status: int, reason: str, message: str, **extra: object) -> JSONResponse:
    """An error answer: ``reason``, ``message``, the ``extra`` members strict JSON can carry,
    and for a 5xx whether a retry may succeed (``retryable``)."""
    body: dict[str, object] = {"reason": reason, "message": message}
    for name, value in extra.items():
        safe = _json_safe(value)
        if safe is not None:
            body[name] = safe
    if status >= 500:
        body.setdefault("retryable", status == 503)
    return JSONResponse(body, status_code=status)


def refuse_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``json.loads``'s ``object_pairs_hook``: an object, refused if a member name repeats."""
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise InvalidValueError(f"duplicate object key {key!r}", field="body", path="")
        result[key] = value
    return result


def refuse_constant(name: str) -> float:
    """``json.loads``'s ``parse_constant``: ``NaN`` and ``Infinity`` are not JSON."""
    raise InvalidValueError(f"{name} is not JSON", field="body", path="")


async def strict_body(request: Request) -> None:
    """A route's dependency: refuse a body with duplicate member names or ``NaN`` / ``Infinity``."""
    # The framework's JSON parser keeps the last of duplicate keys and accepts
    # NaN; a body whose meaning depends on that is refused instead.  The body
    # is parsed twice, here and by the framework; BodyLimit bounds both.
    raw = await request.body()
    if raw.strip():
        try:
            json.loads(raw, object_pairs_hook=refuse_duplicates, parse_constant=refuse_constant)
        except (ValueError, RecursionError) as exc:
            if isinstance(exc, InvalidValueError):
                raise
            # Malformed JSON is reported by the framework's own parse.


# Parameter types, at module level so the framework can resolve them.
NamespaceHeader = Annotated[str, Depends(request_namespace)]
"""The namespace the gate decoded from ``X-Namespace`` (declared for the OpenAPI document)."""
WorkflowIdPath = Annotated[str, Path(description="The workflow instance.")]
"""The path's ``workflow_id``."""
