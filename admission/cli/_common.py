"""What every command shares: exit codes, the input error, JSON output, the database URL, typed input.

Only the command line reads the environment; here it reads ``ADMISSION_DB``.
Everything that needs a database is imported inside the functions, so that
commands without one stay quick to start.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

from admission._bounds import mask_secrets
from admission.errors import AdmissionError
from admission.http import parse_json_value
from admission.intent import canonical_decode

if TYPE_CHECKING:
    from admission.aio import AsyncAdmissionService
    from admission.receipts import AdmissionService

__all__ = [
    "ENV_DB",
    "ENV_READ_DB",
    "ENV_SCHEMA",
    "EXIT_AMBIGUOUS",
    "EXIT_CONFLICT",
    "EXIT_DRIFTED",
    "EXIT_FAILED",
    "EXIT_FINDINGS",
    "EXIT_INTERNAL",
    "EXIT_INTERRUPTED",
    "EXIT_INVALID",
    "EXIT_OK",
    "EXIT_OWNED",
    "EXIT_PIPE",
    "EXIT_REFUSED",
    "EXIT_SCHEMA",
    "EXIT_STORAGE",
    "EXIT_TARGET",
    "EXIT_UNSTAMPED",
    "Commands",
    "UsageError",
    "arguments_from",
    "db_url",
    "engine_options",
    "json_file",
    "mask_secrets",
    "open_service",
    "print_error",
    "print_json",
    "read_db_url",
    "typed_arguments",
    "typed_input",
]

EXIT_OK = 0
"""The command did what was asked: a fresh or a retained answer."""
EXIT_FAILED = 1
"""A check ran and found a mismatch (for example a golden vector)."""
EXIT_INVALID = 2
"""The input was refused; nothing was written."""
EXIT_SCHEMA = 3
"""The database is not at the schema revision this version reads."""
EXIT_REFUSED = 4
"""Refused by run state: ``run_not_active``, ``rejected_not_current``, or a lifecycle call
that does not fit the run; ``db rebase-events`` with nothing to rebase, or no exact rebase."""
EXIT_STORAGE = 5
"""The database failed or is unavailable."""
EXIT_UNSTAMPED = 6
"""The database holds admission's tables but records no revision: ``db upgrade --adopt`` them."""
EXIT_DRIFTED = 7
"""``db upgrade --adopt``: the tables differ from revision ``0001``; nothing was changed."""
EXIT_FINDINGS = 8
"""``db check --deep``: the audit found a fault (a digest, an event, a reference); nothing was changed."""
EXIT_CONFLICT = 9
"""``request_id_conflict``: the key names another intent; nothing was written."""
EXIT_AMBIGUOUS = 10
"""``request_id_ambiguous``: the key cannot be proven to name one receipt; nothing was written."""

EXIT_OWNED = 11
"""``worker``: another worker holds the queue's file lock or live lease, or this worker was fenced."""

EXIT_TARGET = 12
"""``conformance``: the target could not be reached or answered outside the contract (401, 403, a 5xx)."""

EXIT_INTERNAL = 70
"""An error admission did not foresee (a bug): one line naming it, never a traceback (``EX_SOFTWARE``)."""
EXIT_INTERRUPTED = 130
"""Interrupted (SIGINT, Ctrl-C) before the command finished: 128 + SIGINT, as a shell reports it."""
EXIT_PIPE = 141
"""Standard output was closed before everything was written (``| head``): nothing on stderr; 128 +
SIGPIPE, as a shell reports a program that a closed pipe ended.  What the command wrote stays written."""

ENV_DB = "ADMISSION_DB"
"""The database URL when ``--db`` is not given."""

ENV_READ_DB = "ADMISSION_READ_DB"
"""A read replica's URL when ``serve --read-db`` is not given (docs/replicas.md)."""

ENV_SCHEMA = "ADMISSION_SCHEMA"
"""The PostgreSQL schema when ``--schema`` is not given."""

Commands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
"""The top-level subparsers, to which each command group adds its own."""


class UsageError(Exception):
    """Bad command-line input, reported as ``<field>: <reason>``."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")


def typed_input(json_text: str | None, cbor_hex: str | None, field: str, default: object) -> object:
    """The value given as JSON (``field``) or as canonical CBOR in hex (``field-cbor``), else ``default``."""
    if json_text is not None and cbor_hex is not None:
        raise UsageError(field, f"give either {field} or {field}-cbor, not both")
    if cbor_hex is not None:
        try:
            data = bytes.fromhex(cbor_hex)
        except ValueError:
            raise UsageError(f"{field}-cbor", "not a hex string") from None
        try:
            return canonical_decode(data)
        except AdmissionError as exc:
            raise UsageError(f"{field}-cbor", str(exc)) from None
    if json_text is not None:
        return parse_json_value(json_text, field)
    return default


def arguments_from(args: argparse.Namespace) -> object:
    """The command's arguments from ``--args`` or ``--args-cbor`` (default: an empty object)."""
    return typed_input(args.args, args.args_cbor, "--args", {})


def typed_arguments(parser: argparse.ArgumentParser, flag: str, what: str) -> None:
    """Add ``flag`` (JSON) and ``flag-cbor`` (canonical CBOR in hex), read back by :func:`typed_input`."""
    parser.add_argument(flag, help=f"{what} as JSON (1 and 1.0, -0.0 and NaN are kept apart)")
    parser.add_argument(f"{flag}-cbor", help=f"{what} as canonical CBOR, in hex")


def print_json(payload: object) -> None:
    """Print ``payload`` as one indented JSON document on stdout."""
    print(json.dumps(payload, indent=2, ensure_ascii=False))


# Messages never quote a URL on purpose (masked_url is for that), but a driver's or argparse's may
# echo what it was given: the command line masks on the way out (mask_secrets, re-exported here).


def print_error(exc: BaseException | str) -> None:
    """Print ``exc`` as one line on stderr, ``admission: <message>``, with URL passwords masked."""
    # A driver's message can span lines (psycopg adds a hint on a second
    # line); one failure stays one line, so a script can read it as one.
    message = " ".join(line.strip() for line in str(exc).splitlines())
    print(f"admission: {mask_secrets(message)}", file=sys.stderr)


def json_file(path: str | None, field: str) -> object:
    """The JSON value in the file at ``path``; ``field`` names the option in errors."""
    if path is None:
        raise UsageError(field, "is required")
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(field, f"cannot read {path}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise UsageError(field, f"{path} is not UTF-8 text (byte {exc.start})") from None
    return parse_json_value(text, field)


def db_url(args: argparse.Namespace) -> str:
    """The database URL: ``--db``, else ``$ADMISSION_DB``, else the embedded SQLite default."""
    from admission.sql import DEFAULT_URL

    url: str = args.db or os.environ.get(ENV_DB) or DEFAULT_URL
    return url


def read_db_url(args: argparse.Namespace) -> str | None:
    """A read replica's URL: ``--read-db``, else ``$ADMISSION_READ_DB``, else none."""
    url: str | None = getattr(args, "read_db", None) or os.environ.get(ENV_READ_DB) or None
    return url


def engine_options(args: argparse.Namespace) -> dict[str, Any]:
    """The engine options the command names: the PostgreSQL schema, if any."""
    schema = getattr(args, "schema", None) or os.environ.get(ENV_SCHEMA)
    return {"schema": schema} if schema else {}


def open_service(args: argparse.Namespace) -> AdmissionService:
    """The admission service on the database the command names."""
    # Imported here so that commands without a database stay quick to start.
    from admission.receipts import AdmissionService
    from admission.sql import SqlStore

    return AdmissionService(SqlStore.open(db_url(args), **engine_options(args)))


def open_async_service(args: argparse.Namespace) -> AsyncAdmissionService:
    """The async service on the database the command names, checked, its connections closed.

    The store is opened (and its revision checked) on a loop of its own, which
    ends here: closing what that loop opened lets the server's loop open its own.
    """
    import asyncio

    from admission.aio import AsyncAdmissionService, open_store

    async def opened() -> AsyncAdmissionService:
        store = await open_store(db_url(args), read_url=read_db_url(args), **engine_options(args))
        await store.dispose()
        return AsyncAdmissionService(store)

    return asyncio.run(opened())
