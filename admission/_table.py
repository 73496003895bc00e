"""State machines as tables: one rule for every (state, event) -> state table of admission.

Each subsystem writes its lifecycle as one :class:`StateTable` in one file,
under a comment that states its rules (after h11's ``_state.py``): the
receipts' runs, signals and updates (``admission.receipts``), the worker's
writes (``admission.worker``) and durable jobs (``admission.jobs``).  States
are ``StrEnum`` members, so the stored strings are their values.
:meth:`StateTable.next_state` is the one rule they share: a pair the table
holds gives the next state, any other pair is refused with the subsystem's
own :class:`~admission.errors.StateError`; nothing is ever guessed.

Pure: no I/O, no clock, no SQLAlchemy.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Generic, TypeVar, cast

from admission.errors import StateError

__all__ = ["StateTable"]

S = TypeVar("S", bound=enum.StrEnum)

Refusal = Callable[[str, str, str], StateError]
"""Builds the error for a refused pair from (subject, state, event)."""


class StateTable(Mapping[tuple[S, str], S], Generic[S]):
    """Every transition of one state machine: ``(state, event) -> state``.

    A read-only mapping of its rows.  ``refuse`` builds the error that
    :meth:`next_state` raises for a pair the table does not hold, from the
    subject's id (a job id, a write id...), the state and the event.
    """

    def __init__(self, rows: Mapping[tuple[S, str], S], *, refuse: Refusal) -> None:
        self._rows = dict(rows)
        self._refuse = refuse

    def __getitem__(self, key: tuple[S, str]) -> S:
        return self._rows[key]

    def __iter__(self) -> Iterator[tuple[S, str]]:
        return iter(self._rows)

    def __len__(self) -> int:
        return len(self._rows)

    def next_state(self, state: S | str, event: str, *, subject: str = "") -> S:
        """The state ``event`` takes ``state`` to; a pair the table does not hold is refused."""
        # A StrEnum member hashes and compares as its string, so a stored string finds its row.
        found = self._rows.get((cast(S, state), event))
        if found is None:
            raise self._refuse(subject, str(state), event)
        return found

    @property
    def events(self) -> tuple[str, ...]:
        """Every event the table knows, sorted."""
        return tuple(sorted({event for _, event in self._rows}))

    @property
    def final_states(self) -> frozenset[S]:
        """States the table reaches and never leaves."""
        return frozenset(self._rows.values()) - {state for state, _ in self._rows}

    def mermaid(self, starts: Sequence[S]) -> list[str]:
        """The table as the lines of a Mermaid ``stateDiagram-v2`` (``docs/`` embeds them)."""
        lines = ["stateDiagram-v2", *(f"    [*] --> {start}" for start in starts)]
        lines += [f"    {before} --> {after}: {event}" for (before, event), after in self._rows.items()]
        lines += [f"    {final} --> [*]" for final in sorted(self.final_states)]
        return lines
