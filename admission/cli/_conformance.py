"""``admission conformance``: run the conformance kit against a server that speaks the wire contract.

It prints the report (text, ``docs/conformance.md``) and exits 0 when every
answer agreed with the model, 1 on a disagreement, 2 on bad usage and 12 when
the target cannot be reached or answers outside the contract (401, 403, a
5xx).  The bearer token comes from ``$ADMISSION_TOKEN`` or ``--token-file``,
never from the command line (where any user of the machine could read it in
the process list), and is never printed.  Needs no database; hypothesis (the
``conformance`` extra) and httpx (the ``http`` extra) are imported when it runs.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Final

from admission.cli._common import EXIT_FAILED, EXIT_OK, EXIT_TARGET, Commands, UsageError, print_error
from admission.conformance._http_target import ConformanceTargetError
from admission.errors import InvalidValueError

__all__ = ["ENV_TOKEN", "add_parser"]

ENV_TOKEN: Final = "ADMISSION_TOKEN"
"""The bearer token ``admission conformance`` sends, when ``--token-file`` is not given."""
_MAX_TOKEN_FILE_BYTES: Final = 4096


def _token(args: argparse.Namespace) -> str | None:
    if args.token_file is not None:
        try:
            raw = Path(args.token_file).read_bytes()[: _MAX_TOKEN_FILE_BYTES + 1]
        except OSError as exc:
            raise UsageError("--token-file", f"cannot read {args.token_file}: {exc.strerror}") from None
        if len(raw) > _MAX_TOKEN_FILE_BYTES:
            raise UsageError("--token-file", f"is larger than {_MAX_TOKEN_FILE_BYTES} bytes: not a token")
        try:
            token = raw.decode("ascii").strip()
        except UnicodeDecodeError:
            raise UsageError("--token-file", "must hold the token as ASCII text") from None
        field = "--token-file"
    else:
        token = os.environ.get(ENV_TOKEN, "").strip()
        field = f"${ENV_TOKEN}"
        if not token:
            return None
    # Checked here so that the message names where the token came from, never what it is.
    if not token or not all("\x21" <= c <= "\x7e" for c in token):
        raise UsageError(field, "must be one token: printable ASCII without spaces")
    return token


def _positive(value: int, option: str, bound: int) -> int:
    if not 1 <= value <= bound:
        raise UsageError(option, f"must be 1 to {bound}, got {value}")
    return value


def _cmd_conformance(args: argparse.Namespace) -> int:
    if args.token is not None:
        raise UsageError(
            "--token",
            f"is not taken on the command line, where every user of the machine can read it: "
            f"set ${ENV_TOKEN} or give --token-file",
        )
    try:
        import hypothesis  # noqa: F401

        from admission.conformance import HttpTarget, Options, load_replay, run_conformance
    except ImportError as exc:
        raise UsageError(
            "conformance", f"needs the conformance extra: pip install 'admission[conformance]' ({exc})"
        ) from None
    try:
        import httpx  # noqa: F401
    except ImportError as exc:
        raise UsageError("--http", f"needs the http extra: pip install 'admission[http]' ({exc})") from None
    examples = _positive(args.examples, "--examples", 1_000_000)
    if args.seed is not None and not 0 <= args.seed < 2**64:
        raise UsageError("--seed", "must be 0 to 2**64 - 1")
    if args.report is not None and Path(args.report).is_dir():
        raise UsageError("--report", f"{args.report} is a directory")
    token = _token(args)
    chosen: dict[str, object] = {}
    if args.namespace:
        if any(not ns for ns in args.namespace) or len(set(args.namespace)) != len(args.namespace):
            raise UsageError("--namespace", "must be non-empty and given once each")
        chosen["namespaces"] = tuple(args.namespace)
    if args.steps is not None:
        chosen["steps"] = _positive(args.steps, "--steps", 1000)
    if args.concurrency is not None:
        chosen["concurrency"] = _positive(args.concurrency, "--concurrency", 64)
    if args.lost_responses:
        chosen["lost_responses"] = True
    replay: dict[str, object] | None = None
    if args.replay is not None:
        if chosen or args.seed is not None:
            raise UsageError("--replay", "replays the recorded seed and options: give no other run options")
        try:
            replay = load_replay(args.replay)
        except InvalidValueError as exc:
            raise UsageError("--replay", exc.reason) from None
    try:
        probe = args.namespace[0] if args.namespace else Options().namespaces[0]
        target = HttpTarget(args.http, token=token, timeout=args.timeout, probe_namespace=probe)
    except InvalidValueError as exc:
        raise UsageError("--http" if exc.field == "url" else f"--{exc.field}", exc.reason) from None
    except ConformanceTargetError as exc:
        print_error(exc)
        return EXIT_TARGET
    try:
        report = run_conformance(
            target,
            examples=examples,
            seed=args.seed,
            options=Options(**chosen),  # type: ignore[arg-type]
            replay=replay,
        )
    except ConformanceTargetError as exc:
        print_error(exc)
        return EXIT_TARGET
    except InvalidValueError as exc:
        raise UsageError(f"--{exc.field}", exc.reason) from None
    finally:
        target.close()
    print(report.text(), end="")
    if args.report is not None:
        try:
            Path(args.report).write_text(json.dumps(report.to_dict(), indent=2) + "\n", encoding="utf-8")
        except OSError as exc:
            raise UsageError("--report", f"cannot write {args.report}: {exc.strerror}") from None
    return EXIT_OK if report.ok else EXIT_FAILED


def add_parser(commands: Commands) -> None:
    """Add ``conformance``."""
    parser = commands.add_parser(
        "conformance",
        help="check a server against the retry contract with the conformance kit (docs/conformance.md)",
        description="Drive a server that speaks the wire contract (docs/http.md) with random sequences "
        "of admissions, retries and run steps, compare every answer with the contract's model, and print "
        f"a report. The bearer token comes from ${ENV_TOKEN} or --token-file, never the command line. "
        "Exit 0: every answer agreed; 1: a disagreement (the report shows it, shrunk, and how to replay "
        "it); 2: bad usage; 12: the server could not be reached or answered outside the contract.",
    )
    parser.add_argument("--http", required=True, metavar="URL", help="the server's base URL")
    parser.add_argument(
        "--namespace",
        action="append",
        metavar="NS",
        help="a namespace the kit may use (repeat for more; default: conformance-a and conformance-b)",
    )
    parser.add_argument("--examples", type=int, default=100, help="cases to run (default 100)")
    parser.add_argument("--seed", type=int, help="derandomise the run (default: a random seed, reported)")
    parser.add_argument("--steps", type=int, help="steps per case (default 30)")
    parser.add_argument(
        "--lost-responses",
        action="store_true",
        help="send each keyed admission twice, drop the first answer: the second must be retained",
    )
    parser.add_argument(
        "--concurrency", type=int, metavar="N", help="send each keyed admission from N clients at once"
    )
    parser.add_argument(
        "--replay", metavar="FILE", help="run the failing case of a replay record (or a --report file) again"
    )
    parser.add_argument("--report", metavar="FILE", help="also write the report as JSON to FILE")
    parser.add_argument(
        "--token-file", metavar="FILE", help=f"read the bearer token from FILE (default: ${ENV_TOKEN})"
    )
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds per request (default 30)")
    # Refused with its own message (and never echoed): a token on a command line is in the process list.
    parser.add_argument("--token", help=argparse.SUPPRESS)
    parser.set_defaults(handler=_cmd_conformance)
