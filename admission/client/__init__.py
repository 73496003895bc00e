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
  and is never retried; a 401 or 403 (no token, or a namespace the token is
  not granted) raises :class:`AccessDenied`.
- Every exception raised after the key was chosen carries ``request_id``, so
  the caller can retry later with the same key, or read the receipt.

Transport correlation (``X-Request-Id``) is never sent: the key travels in the
body only (contract §2.7).  The wire format is ``docs/http.md``; the usage
guide is ``docs/client.md``.

Needs the ``http`` extra (httpx), but not FastAPI: the codecs come from
``admission.http``, whose face loads the app only on first use.  Time
(``sleep``) and randomness (``random``, ``new_request_id``) are parameters.
"""

from admission.client._calls import generate_request_id
from admission.client._clients import AdmissionClient, AsyncAdmissionClient
from admission.client._errors import (
    AccessDenied,
    ClientError,
    CommandRejected,
    InvalidRequest,
    Receipt,
    RequestIdAmbiguous,
    SignalFailed,
    TransportFailed,
    UnexpectedResponse,
    UpdateFailed,
)
from admission.client._policy import TransportRetryPolicy

__all__ = [
    "AccessDenied",
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
