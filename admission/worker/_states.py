"""The write state machine of the durable worker, as one table (worker contract §2, §5).

Pure: no SQLAlchemy, no clock, no I/O.  The worker looks every transition
up here (``WRITE_TRANSITIONS.next_state``) and never decides a state on its own.

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

import enum
from typing import Final

from admission._table import StateTable
from admission.errors import RecordStateError

__all__ = [
    "TERMINAL_WRITE_STATES",
    "WAITING_WRITE_STATES",
    "WRITE_TRANSITIONS",
    "WriteState",
    "after_before_write_error",
    "write_diagram",
]


class WriteState(enum.StrEnum):
    """Every state a worker record can be in; the values are the stored strings."""

    PREPARED = "prepared"
    IN_FLIGHT = "in_flight"
    CONFIRMED = "confirmed"
    FAILED_SAFE = "failed_safe"
    UNCERTAIN = "uncertain"
    CONFIRMED_THEN_MISSING = "confirmed_then_missing"


WAITING_WRITE_STATES: Final = frozenset({WriteState.PREPARED, WriteState.IN_FLIGHT, WriteState.UNCERTAIN})
"""States that count against the queue bound: the record is not settled yet."""

TERMINAL_WRITE_STATES: Final = frozenset(
    {WriteState.CONFIRMED, WriteState.FAILED_SAFE, WriteState.CONFIRMED_THEN_MISSING}
)
"""States no worker cycle changes (only observation moves ``confirmed``)."""


def _refuse(write_id: str, state: str, event: str) -> RecordStateError:
    return RecordStateError(
        f"record {write_id} is {state}; {event} is not allowed there", write_id=write_id or None, state=state
    )


_P, _F, _C = WriteState.PREPARED, WriteState.IN_FLIGHT, WriteState.CONFIRMED
_U, _S, _M = WriteState.UNCERTAIN, WriteState.FAILED_SAFE, WriteState.CONFIRMED_THEN_MISSING

WRITE_TRANSITIONS: Final = StateTable[WriteState](
    {
        (_P, "dispatch"): _F,
        (_F, "acknowledged"): _C,
        (_F, "before_write_error"): _P,
        (_F, "attempts_exhausted"): _S,
        (_F, "error"): _U,
        (_F, "timeout"): _U,
        (_F, "incomplete"): _U,
        (_F, "crash_found"): _U,
        (_U, "readback_found"): _C,
        (_U, "resolve_confirm"): _C,
        (_U, "resolve_failed_safe"): _S,
        (_U, "resolve_release"): _P,
        (_C, "observed_missing"): _M,
    },
    refuse=_refuse,
)
"""(state, event) -> next state.  A pair that is not here is refused (:class:`RecordStateError`)."""


def after_before_write_error(attempts: int, max_attempts: int) -> str:
    """The event a before-write error becomes after ``attempts`` sends (contract §1: bounded)."""
    return "before_write_error" if attempts < max_attempts else "attempts_exhausted"


def write_diagram() -> str:
    """The table as a Mermaid state diagram (docs/worker.md embeds exactly this)."""
    return "\n".join(WRITE_TRANSITIONS.mermaid([WriteState.PREPARED])) + "\n"
