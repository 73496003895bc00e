"""How long a failed job waits before it may be claimed again: exponential backoff with a cap and jitter.

A retryable failure that leaves attempts sends the job to ``retry_wait`` with
a ``not_before`` time: ``now`` plus :meth:`Backoff.delay` of the attempt that
failed.  Claims skip the job until then (docs/jobs.md, "Backoff").

The delay of attempt *n* (1 for the first attempt) has a ceiling,
``min(cap, base * factor ** (n - 1))``, and ``jitter`` is the share of it that
is drawn at random: the delay is ``ceiling * (1 - jitter * u)`` for ``u``
drawn uniformly from ``[0, 1)``, so it lies in ``(ceiling * (1 - jitter),
ceiling]``.  ``jitter=1`` is "full jitter" (anywhere up to the ceiling: retries
of many jobs that failed together spread out most), ``jitter=0`` none (the
ceiling itself, which never decreases from one attempt to the next).

Pure: the random draw is a parameter, as are times.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from admission.errors import InvalidJobError
from admission.intent._encoding import Value

__all__ = ["DEFAULT_BACKOFF", "MAX_BACKOFF_SECONDS", "NO_BACKOFF", "Backoff"]

MAX_BACKOFF_SECONDS: Final = 7 * 24 * 3600.0
"""The longest cap a backoff may have (a week): a longer wait is a schedule, not a retry."""


def _seconds(value: object, field: str, *, job_id: str | None, upper: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidJobError(f"must be a number, got {type(value).__name__}", field=field, job_id=job_id)
    number = float(value)
    if not (math.isfinite(number) and 0 <= number <= upper):
        raise InvalidJobError(f"must be 0..{upper:g}, got {value!r}", field=field, job_id=job_id)
    return number


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff with a cap and jitter (see the module docstring for the formula).

    ``base``: seconds before the first retry (the ceiling of attempt 1);
    ``factor``: how much the ceiling grows per attempt (at least 1);
    ``cap``: the largest ceiling, in seconds (at least ``base``, at most a week);
    ``jitter``: the share of the ceiling drawn at random, 0..1.
    """

    base: float = 1.0
    factor: float = 2.0
    cap: float = 300.0
    jitter: float = 0.5

    def check(self, job_id: str | None = None) -> Backoff:
        """Refuse a malformed policy with :class:`InvalidJobError` naming the field; return it."""
        _seconds(self.base, "backoff.base", job_id=job_id, upper=MAX_BACKOFF_SECONDS)
        _seconds(self.factor, "backoff.factor", job_id=job_id, upper=1000.0)
        if self.factor < 1:
            raise InvalidJobError(
                f"must be at least 1, got {self.factor!r}", field="backoff.factor", job_id=job_id
            )
        _seconds(self.cap, "backoff.cap", job_id=job_id, upper=MAX_BACKOFF_SECONDS)
        if self.cap < self.base:
            raise InvalidJobError(
                f"must be at least base ({self.base!r}), got {self.cap!r}", field="backoff.cap", job_id=job_id
            )
        _seconds(self.jitter, "backoff.jitter", job_id=job_id, upper=1.0)
        return self

    def ceiling(self, attempt: int) -> float:
        """The longest delay after attempt ``attempt`` (1-based): ``min(cap, base * factor ** (n - 1))``."""
        if attempt < 1:
            raise ValueError(f"attempts count from 1, got {attempt}")
        try:
            grown = self.base * float(self.factor) ** (attempt - 1)
        except OverflowError:
            grown = math.inf
        return min(float(self.cap), grown)

    def delay(self, attempt: int, draw: float) -> float:
        """The delay after attempt ``attempt``, for a uniform ``draw`` in ``[0, 1)``."""
        if not 0 <= draw < 1:
            raise ValueError(f"a draw is in [0, 1), got {draw!r}")
        ceiling = self.ceiling(attempt)
        return ceiling * (1 - self.jitter * draw)

    def to_value(self) -> dict[str, Value]:
        """The policy as a canonical value (stored in a job's content when the job sets its own)."""
        return {
            "base": float(self.base),
            "factor": float(self.factor),
            "cap": float(self.cap),
            "jitter": float(self.jitter),
        }

    @classmethod
    def from_value(cls, value: Mapping[str, Value]) -> Backoff:
        """The policy :meth:`to_value` stored."""
        numbers = {name: value.get(name) for name in ("base", "factor", "cap", "jitter")}
        if not all(isinstance(number, float) for number in numbers.values()):
            raise ValueError(f"not a stored backoff: {sorted(value)}")
        return cls(**numbers)  # type: ignore[arg-type]


DEFAULT_BACKOFF: Final = Backoff()
"""A service's policy unless it is given another: 1 s, doubling, at most 5 min, half of it jittered."""

NO_BACKOFF: Final = Backoff(base=0.0, factor=1.0, cap=0.0, jitter=0.0)
"""No wait: a failed job may be claimed again at once."""
