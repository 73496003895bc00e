"""``admission token``: mint, list and revoke the bearer tokens of a token file (``serve --tokens``).

The file holds each token's SHA-256, never the token: ``token create``
prints the token once, on stdout, and writes only its hash.  Every write
replaces the file atomically (a new file, mode 0600, renamed over the old
one), so a server starting meanwhile reads the old grants or the new ones,
never half of them.  The commands are not meant to run concurrently on one
file: the last rename wins.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import tempfile
from pathlib import Path

from admission.cli._common import EXIT_OK, Commands, UsageError, print_json
from admission.http import BearerTokens, TokenFileError, TokenGrant, mint_token, token_digest

__all__ = ["ENV_TOKENS", "add_parser", "load_tokens"]

ENV_TOKENS = "ADMISSION_TOKENS"
"""The token file of ``admission serve`` (and the default ``--file`` of ``admission token``)."""


def load_tokens(path: str, field: str) -> BearerTokens:
    """The grants of the token file at ``path``; a bad file is a :class:`UsageError` naming ``field``."""
    from admission.http import read_token_file

    try:
        return read_token_file(path)
    except TokenFileError as exc:
        raise UsageError(field, exc.reason if exc.field == "file" else exc.message) from None


def _file(args: argparse.Namespace) -> str:
    path: str | None = args.file or os.environ.get(ENV_TOKENS)
    if not path:
        raise UsageError("--file", f"is required (or set ${ENV_TOKENS})")
    return path


def _write(path: str, tokens: BearerTokens) -> None:
    # A new file beside the old one, 0600 from its creation, flushed, then
    # renamed over it: readers see the old grants or the new, never a part.
    target = Path(path)
    folder = target.parent
    try:
        descriptor, temporary = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=folder)
    except OSError as exc:
        raise UsageError("--file", f"cannot write in {folder}: {exc.strerror}") from None
    try:
        os.fchmod(descriptor, 0o600)
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            handle.write(tokens.to_json())
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, target)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise UsageError("--file", f"cannot write {path}: {exc.strerror}") from None
    with contextlib.suppress(OSError):  # the rename itself made durable, where the platform allows
        folder_descriptor = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(folder_descriptor)
        finally:
            os.close(folder_descriptor)


def _existing(path: str) -> BearerTokens:
    return load_tokens(path, "--file") if os.path.lexists(path) else BearerTokens()


def _cmd_create(args: argparse.Namespace) -> int:
    path = _file(args)
    tokens = _existing(path)
    if any(grant.name == args.name for grant in tokens.grants):
        raise UsageError("--name", f"{path} already has a token named {args.name!r} (revoke it first)")
    token = mint_token(secrets.token_bytes)
    try:
        grant = TokenGrant(args.name, token_digest(token), tuple(args.namespace))
        updated = tokens.with_grant(grant)
    except TokenFileError as exc:
        # The new grant's own fields, named as the options that gave them.
        raise UsageError("--name" if exc.field.endswith(".name") else "--namespace", exc.reason) from None
    _write(path, updated)
    # The token is shown once, here; the file keeps only its hash.
    print_json({"name": grant.name, "namespaces": list(grant.namespaces), "file": path, "token": token})
    return EXIT_OK


def _cmd_list(args: argparse.Namespace) -> int:
    path = _file(args)
    tokens = load_tokens(path, "--file")
    grants = [{"name": g.name, "namespaces": list(g.namespaces)} for g in tokens.grants]
    print_json({"file": path, "tokens": grants})
    return EXIT_OK


def _cmd_revoke(args: argparse.Namespace) -> int:
    path = _file(args)
    try:
        updated = load_tokens(path, "--file").without(args.name)
    except TokenFileError as exc:
        raise UsageError("--name", exc.reason) from None
    _write(path, updated)
    print_json({"revoked": args.name, "file": path})
    return EXIT_OK


def add_parser(commands: Commands) -> None:
    """Add ``token create``, ``token list`` and ``token revoke``."""
    token = commands.add_parser("token", help="mint, list and revoke the bearer tokens of `serve --tokens`")
    actions = token.add_subparsers(dest="action", required=True, metavar="ACTION")
    file_help = f"the token file (default: ${ENV_TOKENS}); written 0600, atomically"

    create = actions.add_parser("create", help="mint a token: print it once, write only its hash")
    create.add_argument("--name", required=True, help="the token's name (unique in the file)")
    create.add_argument(
        "--namespace",
        action="append",
        required=True,
        help="a namespace the token may act in (repeat for more; '*' grants every namespace)",
    )
    create.add_argument("--file", help=file_help)
    create.set_defaults(handler=_cmd_create)

    listing = actions.add_parser("list", help="the names and namespaces of the file's tokens (no hashes)")
    listing.add_argument("--file", help=file_help)
    listing.set_defaults(handler=_cmd_list)

    revoke = actions.add_parser(
        "revoke", help="remove a token from the file (a running server keeps it until restarted)"
    )
    revoke.add_argument("--name", required=True, help="the token's name")
    revoke.add_argument("--file", help=file_help)
    revoke.set_defaults(handler=_cmd_revoke)
