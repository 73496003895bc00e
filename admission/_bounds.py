"""The declared bound of every stored text field: how many characters, and what they may be.

Each width is declared once, here.  ``admission.sql._schema`` sizes its
columns with these constants and the validators (receipts, worker, jobs)
refuse input against the same constants before any transaction opens, so a
value is accepted or refused alike on memory, SQLite and PostgreSQL: SQLite
would store anything, while PostgreSQL's ``VARCHAR(n)`` holds at most n
characters and its text holds no NUL, and a lone surrogate is not UTF-8 at
all.  A value no backend can hold is input that resending cannot fix, so it
is a typed input error naming the field, never a retryable storage error.

Widths are in characters (code points), as ``VARCHAR(n)`` counts them on
PostgreSQL, and equal the column widths every released schema has.

Pure: no I/O, no clock, no SQLAlchemy.
"""

from __future__ import annotations

import re
from typing import Final

__all__ = [
    "CODE",
    "DIGEST",
    "ID",
    "JOB_ID",
    "JOB_STATE",
    "NAME",
    "OUTCOME",
    "SCOPE_KIND",
    "STATUS",
    "TEXT",
    "TOKEN",
    "WRITE_STATE",
    "mask_secrets",
    "storable_text",
    "text_fault",
]

ID: Final = 36
"""Identifiers the library stores as ids (a UUID's text form is 36): run ids,
command, update, instance, attempt and write ids."""

NAME: Final = 255
"""Names: namespaces, workflow ids, command names, queues, scope values
(tenants...), source keys, targets, actors, lease holders, outbox consumers, job scopes."""

TOKEN: Final = 191
"""A receipt token (``update-v1:<64 hex>``) or a legacy row's raw key."""

JOB_ID: Final = 128
"""Job ids, job kinds and job owners."""

TEXT: Final = 2048
"""Free text the library keeps: update failures, diagnostics, worker event
reasons, job event details.  Diagnostics and reasons are cut to fit (with a
visible marker); an update's failure message is refused past it."""

DIGEST: Final = 64
"""A lowercase hex SHA-256."""

CODE: Final = 64
"""Event types and reason codes the library writes."""

STATUS: Final = 16
"""Run, command and update statuses, command types, the intent encoding, poll health."""

OUTCOME: Final = 32
"""A command's outcome."""

WRITE_STATE: Final = 32
"""A worker record's write state."""

JOB_STATE: Final = 24
"""A job's state."""

SCOPE_KIND: Final = 8
"""A command's target scope: ``instance`` or ``run``."""


def text_fault(value: object, width: int) -> str | None:
    """Why ``value`` cannot be stored in a text field of ``width`` characters, or ``None``.

    The rule every backend shares: a non-empty ``str`` of at most ``width``
    code points, with no NUL (PostgreSQL text cannot hold it) and no lone
    surrogate (it has no UTF-8 form).
    """
    if type(value) is not str:
        return f"must be a string, got {type(value).__name__}"
    if 0 < len(value) <= width and value.isascii() and "\x00" not in value:
        return None  # the common case, decided without encoding (ASCII has no surrogate)
    if not value:
        return "must not be empty"
    if len(value) > width:
        return f"must have at most {width} characters, got {len(value)}"
    nul = value.find("\x00")
    if nul >= 0:
        return f"must not contain NUL (at index {nul})"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"contains a lone surrogate at index {exc.start}"
    return None


def storable_text(text: str) -> str:
    """``text`` with what no backend can store replaced: NUL and lone surrogates become U+FFFD.

    For free text the library keeps rather than refuses (diagnostics, reasons):
    an exception's message must not turn a recorded failure into a storage error.
    """
    if "\x00" in text:
        text = text.replace("\x00", "\ufffd")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        # One replacement per surrogate keeps the length, so a cut text stays within its width.
        text = "".join("\ufffd" if "\ud800" <= c <= "\udfff" else c for c in text)
    return text


_URL_PASSWORD: Final = re.compile(r"(?P<keep>[A-Za-z][\w+.-]*://[^\s:/@]*:)[^\s@]*@")
_QUERY_PASSWORD: Final = re.compile(r"(?P<keep>[?&][^\s=&]*password=)[^\s&]*", re.IGNORECASE)


def mask_secrets(text: str) -> str:
    """``text`` with the password of every URL in it as ``***`` (``user:***@``, ``?password=***``).

    For text the library did not write itself but keeps or prints: an
    exception's message or traceback (a driver's may quote the URL it was
    given) becomes a job's diagnostic, and the command line prints errors.
    """
    return _QUERY_PASSWORD.sub(r"\g<keep>***", _URL_PASSWORD.sub(r"\g<keep>***@", text))
