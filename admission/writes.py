"""The write state machine of the durable worker, as one table (worker contract §2, §5).

Pure: no SQLAlchemy, no clock, no I/O.  The worker looks every transition
up here and never decides a state on its own.

The rules the table encodes:

* ``prepared --dispatch--> in_flight``: the worker commits ``in_flight``
  *before* it calls the adapter, so that a crash at any later point is
  visible at the next start.
* From ``in_flight`` only a typed before-write error (the adapter proves the
  request was never dispatched) returns the record to ``prepared``, and only
  while attempts remain (``before_write_error``); the last one ends it
  ``failed_safe`` (``attempts_exhausted``).
* Any other error, a timeout, an incomplete result, or an ``in_flight``
  record found by the next start (``crash_found``) makes it ``uncertain``:
  liveness is given up before a duplicate external write is risked.
* ``uncertain`` is left only by an exact positive readback carrying the same
  ``write_id`` (``readback_found`` -> ``confirmed``) or by an operator's
  ``resolve`` (``resolve_confirm``, ``resolve_failed_safe``,
  ``resolve_release`` -> ``prepared``), recorded with who and why.  No timer,
  empty read or restart is an event of this table, so none can re-send it.
* A confirmed record the target explicitly no longer has becomes
  ``confirmed_then_missing`` (``observed_missing``, §5); nothing leaves that
  state: it is never recreated automatically.
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "EVENTS",
    "STATES",
    "TERMINAL_STATES",
    "WAITING_STATES",
    "WRITE_TRANSITIONS",
    "after_before_write_error",
    "diagram",
    "next_state",
]

PREPARED: Final = "prepared"
IN_FLIGHT: Final = "in_flight"
CONFIRMED: Final = "confirmed"
FAILED_SAFE: Final = "failed_safe"
UNCERTAIN: Final = "uncertain"
CONFIRMED_THEN_MISSING: Final = "confirmed_then_missing"

STATES: Final = (PREPARED, IN_FLIGHT, CONFIRMED, FAILED_SAFE, UNCERTAIN, CONFIRMED_THEN_MISSING)
"""Every state a record can be in."""

WAITING_STATES: Final = frozenset({PREPARED, IN_FLIGHT, UNCERTAIN})
"""States that count against the queue bound: the record is not settled yet."""

TERMINAL_STATES: Final = frozenset({CONFIRMED, FAILED_SAFE, CONFIRMED_THEN_MISSING})
"""States no worker cycle changes (only observation moves ``confirmed``)."""

WRITE_TRANSITIONS: Final[dict[tuple[str, str], str]] = {
    (PREPARED, "dispatch"): IN_FLIGHT,
    (IN_FLIGHT, "acknowledged"): CONFIRMED,
    (IN_FLIGHT, "before_write_error"): PREPARED,
    (IN_FLIGHT, "attempts_exhausted"): FAILED_SAFE,
    (IN_FLIGHT, "error"): UNCERTAIN,
    (IN_FLIGHT, "timeout"): UNCERTAIN,
    (IN_FLIGHT, "incomplete"): UNCERTAIN,
    (IN_FLIGHT, "crash_found"): UNCERTAIN,
    (UNCERTAIN, "readback_found"): CONFIRMED,
    (UNCERTAIN, "resolve_confirm"): CONFIRMED,
    (UNCERTAIN, "resolve_failed_safe"): FAILED_SAFE,
    (UNCERTAIN, "resolve_release"): PREPARED,
    (CONFIRMED, "observed_missing"): CONFIRMED_THEN_MISSING,
}
"""(state, event) -> next state.  A pair that is not here is not allowed."""

EVENTS: Final = tuple(sorted({event for _, event in WRITE_TRANSITIONS}))
"""Every event the table knows."""


def next_state(state: str, event: str) -> str | None:
    """The state after ``event`` in ``state``, or ``None`` if the table does not allow it."""
    return WRITE_TRANSITIONS.get((state, event))


def after_before_write_error(attempts: int, max_attempts: int) -> str:
    """The event a before-write error becomes after ``attempts`` sends (contract §1: bounded)."""
    return "before_write_error" if attempts < max_attempts else "attempts_exhausted"


def diagram() -> str:
    """The table as a Mermaid state diagram (docs/worker.md embeds exactly this)."""
    lines = ["stateDiagram-v2", f"    [*] --> {PREPARED}"]
    for (source, event), target in WRITE_TRANSITIONS.items():
        lines.append(f"    {source} --> {target}: {event}")
    return "\n".join(lines) + "\n"
