"""What the client returns and raises: the typed :class:`Receipt` and the :class:`ClientError` tree.

The failures carry the client's :class:`Receipt` (a retained refusal, a failed
update), which is why they live with the client and not in
:mod:`admission.errors`; :class:`ClientError` derives from its
:class:`~admission.errors.AdmissionError`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar

from admission.errors import AdmissionError


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


class AccessDenied(ClientError):
    """The server refused the caller, before reading the command: nothing was written, nothing retried.

    ``status`` 401 (``reason`` ``unauthenticated``: no token, or one the
    server does not know) or 403 (``namespace_forbidden``: the token is not
    granted this namespace).  Retrying cannot succeed until the token or the
    server's grants change.
    """

    code: ClassVar[str] = "access_denied"


class UnexpectedResponse(ClientError):
    """A response the wire contract does not describe (an unknown route, a body that is not JSON).

    Not retried: it is a definite answer from something, just not from an
    admission endpoint as documented.
    """

    code: ClassVar[str] = "unexpected_response"
