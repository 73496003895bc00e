"""The worker's intake rules, pure: scopes, records, bounds (worker contract §1).

No SQLAlchemy, no clock: the durable worker stores what these functions
accept, and refuses with their typed errors before it writes anything.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Literal

from admission import _bounds as bounds
from admission.errors import InvalidRecordError, InvalidValueError, ScopeMismatchError
from admission.intent._encoding import canonical_encode

__all__ = [
    "MAX_CONTENT",
    "RESERVED_FIELDS",
    "Intake",
    "Scope",
    "WorkerLimits",
    "bounded_text",
    "check_name",
    "validate_record",
]

RESERVED_FIELDS: Final = ("source_key", "payload")
"""Record fields that are not scope fields: the source key and the free payload."""

MAX_CONTENT: Final = 64 * 1024
"""The largest canonical record the intake accepts, in bytes."""

_FIELD_NAME: Final = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
_TRUNCATED: Final = "...[truncated]"


def check_name(value: object, field: str) -> str:
    """``value`` if every backend can store it as a name (:data:`admission._bounds.NAME`
    characters, no NUL, valid Unicode); else :class:`InvalidRecordError` naming ``field``."""
    fault = bounds.text_fault(value, bounds.NAME)
    if fault is not None:
        raise InvalidRecordError(fault, field=field)
    assert isinstance(value, str)
    return value


def bounded_text(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` UTF-8 bytes, visibly marked when cut (contract §1).

    The password of any URL in it is masked (a target's error may quote the
    URL it was given); NUL and lone surrogates, which no backend stores, become
    U+FFFD: free text the library keeps is mended, never refused.
    """
    text = bounds.storable_text(bounds.mask_secrets(text))
    raw = text.encode("utf-8")
    if len(raw) <= limit:
        return text
    keep = raw[: max(0, limit - len(_TRUNCATED))].decode("utf-8", "ignore")
    return keep + _TRUNCATED


@dataclass(frozen=True)
class Scope:
    """An exact allowlist of field values, e.g. tenant, account, page, form (contract §1).

    ``tenant`` is required: with the source key it forms the intake key.
    """

    fields: tuple[tuple[str, str], ...]

    @classmethod
    def parse(cls, value: object) -> Scope:
        """Validate a JSON object of field -> non-empty string; raise InvalidRecordError naming the field."""
        if not isinstance(value, Mapping):
            raise InvalidRecordError("a scope is a JSON object of field names to strings", field="scope")
        if not 1 <= len(value) <= 16:
            raise InvalidRecordError("a scope has 1 to 16 fields", field="scope")
        items = []
        for name, field_value in value.items():
            if not isinstance(name, str) or not _FIELD_NAME.match(name) or name in RESERVED_FIELDS:
                raise InvalidRecordError(
                    f"scope field {name!r} must be a lower-case name of 1-64 characters, "
                    f"not {' or '.join(RESERVED_FIELDS)}",
                    field="scope",
                )
            check_name(field_value, f"scope.{name}")
            items.append((name, field_value))
        if "tenant" not in value:
            raise InvalidRecordError("a scope must name its tenant", field="scope.tenant")
        return cls(tuple(sorted(items)))

    @property
    def tenant(self) -> str:
        """The scope's tenant."""
        return dict(self.fields)["tenant"]

    def as_dict(self) -> dict[str, str]:
        """The scope as a JSON-able object."""
        return dict(self.fields)

    def encode(self) -> bytes:
        """The canonical encoding pinned in the database."""
        return canonical_encode(self.as_dict())


@dataclass(frozen=True)
class WorkerLimits:
    """The bounds of contract §1.  ``max_diagnostic`` (UTF-8 bytes) is at most the
    diagnostic columns' width, :data:`admission._bounds.TEXT`."""

    max_waiting: int = 128
    max_attempts: int = 3
    max_diagnostic: int = bounds.TEXT

    def __post_init__(self) -> None:
        # A longer cut would pass SQLite and fail PostgreSQL's VARCHAR(2048) mid-transition.
        if type(self.max_diagnostic) is not int or not 64 <= self.max_diagnostic <= bounds.TEXT:
            raise InvalidRecordError(f"must be an int from 64 to {bounds.TEXT}", field="max_diagnostic")


@dataclass(frozen=True)
class Intake:
    """The answer to ``accept``: ``accepted``, ``duplicate`` (same canonical content) or
    ``conflict`` (changed content under the same key; nothing written)."""

    outcome: Literal["accepted", "duplicate", "conflict"]
    write_id: str
    state: str


def validate_record(scope_: Scope, record: object, *, queue: str) -> tuple[str, bytes]:
    """Check a record against the scope; return its source key and canonical content.

    Raises InvalidRecordError or ScopeMismatchError naming the field; nothing is written.
    """
    if not isinstance(record, Mapping):
        raise InvalidRecordError("a record is a JSON object", field="record")
    scope = scope_.as_dict()
    for name in record:
        if name not in scope and name not in RESERVED_FIELDS:
            raise InvalidRecordError(
                f"is not an allowed field (allowed: {', '.join([*scope, *RESERVED_FIELDS])})",
                field=str(name),
            )
    for name, expected in scope.items():
        if name not in record:
            raise InvalidRecordError("is required by the scope", field=name)
        if record[name] != expected:
            raise ScopeMismatchError(
                f"{name}: the record's value is outside the worker's scope (no fallback)",
                field=name,
                queue=queue,
            )
    source_key = record.get("source_key")
    check_name(source_key, "source_key")
    assert isinstance(source_key, str)
    try:
        content = canonical_encode(dict(record), max_size=MAX_CONTENT)
    except InvalidValueError as exc:
        raise InvalidRecordError(exc.message, field="payload") from exc
    return source_key, content
