"""``admission intent`` and ``admission vectors``: the commands that need no database."""

from __future__ import annotations

import argparse
import sys
from importlib.resources.abc import Traversable
from pathlib import Path

from admission.cli._common import (
    EXIT_FAILED,
    EXIT_OK,
    Commands,
    UsageError,
    arguments_from,
    print_json,
    typed_arguments,
)
from admission.intent import (
    INTENT_VERSION,
    arguments_digest,
    canonical_encode,
    intent_digest,
    receipt_token,
    shipped_vectors,
    validate_request_id,
    verify_vectors,
)

__all__ = ["add_parser"]


def _cmd_intent(args: argparse.Namespace) -> int:
    arguments = arguments_from(args)
    report: dict[str, object] = {
        "encoding": INTENT_VERSION,
        "command_type": args.type,
        "name": args.name,
        "target": args.target,
        "intent_digest": intent_digest(args.type, args.name, arguments, args.target),
        "arguments_digest": arguments_digest(arguments),
        "arguments_cbor": canonical_encode(arguments).hex(),
    }
    if args.request_id is not None:
        key = validate_request_id(args.request_id, args.type)
        report["request_id"] = key
        report["receipt_token"] = receipt_token(args.type, key)
    print_json(report)
    return EXIT_OK


def _cmd_vectors_verify(args: argparse.Namespace) -> int:
    directory: Path | Traversable
    if args.directory is None:
        directory = shipped_vectors()
    else:
        directory = Path(args.directory)
        if not directory.is_dir():
            raise UsageError("DIR", f"{directory} is not a directory")
    report = verify_vectors(directory)
    for line in report.failures:
        print(line, file=sys.stderr)
    print_json(
        {
            "directory": str(directory),
            "ok": report.ok,
            "counts": report.counts,
            "total": sum(report.counts.values()),
            "failures": len(report.failures),
        }
    )
    return EXIT_OK if report.ok else EXIT_FAILED


def add_parser(commands: Commands) -> None:
    """Add ``intent`` and ``vectors verify``."""
    intent = commands.add_parser("intent", help="print the receipt token and intent digest of a command")
    intent.add_argument("--type", required=True, choices=("signal", "update"), help="command type")
    intent.add_argument("--name", required=True, help="canonical command name")
    typed_arguments(intent, "--args", "arguments (a list or an object)")
    intent.add_argument("--target", help="selected run id (run scope); omit for instance scope")
    intent.add_argument("--request-id", help="the command key")
    intent.set_defaults(handler=_cmd_intent)

    vectors = commands.add_parser("vectors", help="golden vectors")
    vector_commands = vectors.add_subparsers(dest="vectors_command", required=True, metavar="ACTION")
    verify = vector_commands.add_parser("verify", help="re-derive every golden vector; exit 1 on a mismatch")
    verify.add_argument(
        "directory",
        nargs="?",
        default=None,
        metavar="DIR",
        help="the vectors to check (default: the ones installed with admission)",
    )
    verify.set_defaults(handler=_cmd_vectors_verify)
