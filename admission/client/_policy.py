"""The transport retry policy: which attempts are retried, how often, and the wait in between.

Retries are safe only because every attempt of one call resends the same key
and the same bytes (contract §2.7, §4); the policy decides nothing about keys.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Final

import httpx

from admission.errors import InvalidValueError

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
