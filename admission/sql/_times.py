"""Stored times read back as timezone-aware UTC datetimes, on every backend."""

from __future__ import annotations

from datetime import UTC, datetime

__all__ = ["as_utc", "utc_or_none"]


def as_utc(value: datetime | str) -> datetime:
    """A stored time as a timezone-aware UTC datetime.

    SQLite hands back naive datetimes (text, when read through the driver
    itself); they were written as UTC.
    """
    if isinstance(value, str):
        try:
            # The common case, a naive text: read as UTC in one parse (``replace`` costs
            # several times the parse, on every receipt read).
            return datetime.fromisoformat(value + "+00:00")
        except ValueError:  # the text carries an offset of its own, or is no time
            value = datetime.fromisoformat(value)
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def utc_or_none(value: datetime | str | None) -> datetime | None:
    """:func:`as_utc` of a time that may be missing."""
    return None if value is None else as_utc(value)
