"""The parser, assembled from one module per command group, and ``main``: the one map of errors to exit codes.

Each group module adds its commands with ``add_parser(commands)`` and sets a
``handler`` on each; ``main`` runs the handler and turns every error it
raises into one line on stderr and a documented exit code.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator, Sequence
from typing import Final

from admission import __version__
from admission.cli import _db, _intent, _jobs, _receipts, _serve, _worker
from admission.cli._common import (
    ENV_DB,
    EXIT_INVALID,
    EXIT_OWNED,
    EXIT_REFUSED,
    EXIT_SCHEMA,
    EXIT_STORAGE,
    Commands,
    UsageError,
    print_error,
)
from admission.errors import (
    AdmissionError,
    FencedError,
    JobStateError,
    LeaseHeldError,
    QueueFullError,
    RecordStateError,
    RunStateError,
    SchemaRevisionError,
    ScopeMismatchError,
    StorageError,
    WorkerLockedError,
)

__all__ = ["WITHOUT_DATABASE", "build_parser", "leaf_commands", "main"]

WITHOUT_DATABASE: Final = frozenset({("intent",), ("vectors", "verify")})
"""The commands that need no database; every other command takes ``--db`` before or after its name."""


def _cmd_demo(args: argparse.Namespace) -> int:
    # _demo imports SQLAlchemy at its top: loaded only when the demo runs.
    from admission.cli._demo import run_demo

    return run_demo(args.db, workers=args.workers)


def _demo_parser(commands: Commands) -> None:
    demo = commands.add_parser("demo", help="play a lost response, a retry, a conflict and a burst")
    demo.add_argument("--workers", type=int, default=8, help="concurrent callers in the burst (default 8)")
    demo.set_defaults(handler=_cmd_demo)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``admission`` command."""
    return _build_parser(worker_commands=True)


def _build_parser(*, worker_commands: bool) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="admission",
        description="Safe retries of signals and updates for workflow engines.",
    )
    parser.add_argument("--version", action="version", version=f"admission {__version__}")
    parser.add_argument(
        "--db",
        help=f"database URL (default: ${ENV_DB}, else an embedded SQLite file admission.sqlite3); "
        "also accepted after the command",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    # The order here is the order of ``admission --help``.
    _intent.add_parser(commands)
    _db.add_parser(commands)
    _receipts.add_parser(commands)
    _serve.add_parser(commands)
    _demo_parser(commands)
    _worker.add_parser(commands, with_commands=worker_commands)
    _jobs.add_parser(commands)
    # Added here, once, rather than by each group: a command added later
    # cannot forget it, and ``--db`` means the same wherever it is written.
    for path, command in leaf_commands(parser):
        if path not in WITHOUT_DATABASE and "--db" not in command._option_string_actions:
            command.add_argument(
                "--db",
                # SUPPRESS: unless given here, the URL given before the command
                # (or none) stays; argparse would otherwise overwrite it.
                default=argparse.SUPPRESS,
                help="database URL, as the --db before the command (this one wins if both are given)",
            )
    return parser


def leaf_commands(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """Every command ``parser`` runs, as (its words, its parser): ``(("db", "check"), ...)``."""
    groups = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not groups:
        yield path, parser
        return
    for group in groups:
        for name, command in group.choices.items():
            yield from leaf_commands(command, (*path, name))


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code."""
    argv = sys.argv[1:] if argv is None else list(argv)
    # Adding the worker's commands imports SQLAlchemy.  A command line without
    # the word "worker" cannot reach them (argparse matches command names
    # exactly), so every other command starts without it.
    args = _build_parser(worker_commands="worker" in argv).parse_args(argv)
    try:
        code: int = args.handler(args)
    # Specific before general: a ScopeMismatchError is an InputError, yet the
    # worker's refusal of a record outside its scope exits 4, not 2.
    except UsageError as exc:
        print_error(exc)
        return EXIT_INVALID
    except SchemaRevisionError as exc:
        print_error(exc)
        return EXIT_SCHEMA
    except (WorkerLockedError, LeaseHeldError, FencedError) as exc:
        print_error(exc)
        return EXIT_OWNED
    except (RunStateError, JobStateError, QueueFullError, ScopeMismatchError, RecordStateError) as exc:
        print_error(exc)
        return EXIT_REFUSED
    except StorageError as exc:
        print_error(exc)
        return EXIT_STORAGE
    except AdmissionError as exc:
        print_error(exc)
        return EXIT_INVALID
    return code
