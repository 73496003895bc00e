"""The ``admission`` command line: the composition root.

This is the only module that reads the environment or parses command-line
input.  Every command prints JSON on stdout; bad input prints one clear line
naming the field on stderr, exits 2 and writes nothing.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from admission import __version__
from admission.encoding import (
    INTENT_VERSION,
    arguments_digest,
    canonical_decode,
    canonical_encode,
    intent_digest,
)
from admission.errors import AdmissionError
from admission.keys import receipt_token, validate_request_id

__all__ = ["EXIT_FAILED", "EXIT_INVALID", "EXIT_OK", "build_parser", "main", "parse_json_arguments"]

EXIT_OK = 0
"""The command did what was asked."""

EXIT_FAILED = 1
"""A check ran and found a mismatch (for example a golden vector)."""

EXIT_INVALID = 2
"""The input was refused; nothing was written."""


class _InputError(Exception):
    """Bad command-line input, reported as ``<field>: <reason>``."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")


def _refuse_duplicates(pairs: list[tuple[str, object]]) -> dict[str, object]:
    result: dict[str, object] = {}
    for key, value in pairs:
        if key in result:
            # JSON parsers keep the last duplicate silently; for an intent that
            # would hash a value the caller may not have meant.
            raise _InputError("--args", f"duplicate object key {key!r}")
        result[key] = value
    return result


def parse_json_arguments(text: str) -> object:
    """Parse ``--args`` JSON so that the typed value survives exactly.

    ``1`` stays an int and ``1.0`` a float, ``-0.0`` keeps its sign, and
    ``NaN`` / ``Infinity`` / ``-Infinity`` are accepted as floats.  Duplicate
    object keys are refused.
    """
    try:
        return json.loads(text, object_pairs_hook=_refuse_duplicates)
    except json.JSONDecodeError as exc:
        raise _InputError("--args", f"not valid JSON ({exc.msg} at char {exc.pos})") from None


def _arguments_from(args: argparse.Namespace) -> object:
    if args.args is not None and args.args_cbor is not None:
        raise _InputError("--args", "give either --args or --args-cbor, not both")
    if args.args_cbor is not None:
        try:
            data = bytes.fromhex(args.args_cbor)
        except ValueError:
            raise _InputError("--args-cbor", "not a hex string") from None
        try:
            return canonical_decode(data)
        except AdmissionError as exc:
            raise _InputError("--args-cbor", str(exc)) from None
    if args.args is not None:
        return parse_json_arguments(args.args)
    return {}


def _cmd_intent(args: argparse.Namespace) -> int:
    arguments = _arguments_from(args)
    digest = intent_digest(args.type, args.name, arguments, args.target)
    report: dict[str, object] = {
        "encoding": INTENT_VERSION,
        "command_type": args.type,
        "name": args.name,
        "target": args.target,
        "intent_digest": digest,
        "arguments_digest": arguments_digest(arguments),
        "arguments_cbor": canonical_encode(arguments).hex(),
    }
    if args.request_id is not None:
        key = validate_request_id(args.request_id, args.type)
        report["request_id"] = key
        report["receipt_token"] = receipt_token(args.type, key)
    _print_json(report)
    return EXIT_OK


def _cmd_vectors_verify(args: argparse.Namespace) -> int:
    from admission.vectors import verify

    directory = Path(args.directory)
    if not directory.is_dir():
        raise _InputError("DIR", f"{directory} is not a directory")
    report = verify(directory)
    for line in report.failures:
        print(line, file=sys.stderr)
    _print_json(
        {
            "directory": str(directory),
            "ok": report.ok,
            "counts": report.counts,
            "total": sum(report.counts.values()),
            "failures": len(report.failures),
        }
    )
    return EXIT_OK if report.ok else EXIT_FAILED


def _print_json(payload: dict[str, object]) -> None:
    print(json.dumps(payload, indent=2, ensure_ascii=False))


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``admission`` command."""
    parser = argparse.ArgumentParser(
        prog="admission",
        description="Safe retries of signals and updates for workflow engines.",
    )
    parser.add_argument("--version", action="version", version=f"admission {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    intent = commands.add_parser(
        "intent",
        help="print the receipt token and intent digest of a command",
        description="Print the canonical encoding, intent digest and receipt token of a command.",
    )
    intent.add_argument("--type", required=True, choices=("signal", "update"), help="command type")
    intent.add_argument("--name", required=True, help="canonical command name")
    intent.add_argument("--args", help="arguments as JSON (a list or an object)")
    intent.add_argument("--args-cbor", help="arguments as canonical CBOR, in hex")
    intent.add_argument("--target", help="selected run id (run scope); omit for instance scope")
    intent.add_argument("--request-id", help="the command key")
    intent.set_defaults(handler=_cmd_intent)

    vectors = commands.add_parser("vectors", help="golden vectors")
    vector_commands = vectors.add_subparsers(dest="vectors_command", required=True, metavar="ACTION")
    verify = vector_commands.add_parser(
        "verify", help="re-derive every golden vector; exit 1 on any mismatch"
    )
    verify.add_argument("directory", nargs="?", default="vectors", metavar="DIR")
    verify.set_defaults(handler=_cmd_vectors_verify)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code."""
    args = build_parser().parse_args(argv)
    try:
        code: int = args.handler(args)
    except _InputError as exc:
        print(f"admission: {exc}", file=sys.stderr)
        return EXIT_INVALID
    except AdmissionError as exc:
        print(f"admission: {exc}", file=sys.stderr)
        return EXIT_INVALID
    return code
