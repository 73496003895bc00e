"""The parser, assembled from one module per command group, and ``main``: the one map of errors to exit codes.

Each group module adds its commands with ``add_parser(commands)`` and sets a
``handler`` on each; ``main`` runs the handler and turns every error it
raises into one line on stderr and a documented exit code.  Nothing reaches
the user as a traceback: a refused command line, an error admission did not
foresee, an interrupt and a closed standard output each have their own code.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Final, NoReturn

from admission.cli import _conformance, _db, _intent, _jobs, _receipts, _serve, _token, _worker
from admission.cli._common import (
    ENV_DB,
    ENV_SCHEMA,
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_INVALID,
    EXIT_OWNED,
    EXIT_PIPE,
    EXIT_REFUSED,
    EXIT_SCHEMA,
    EXIT_STORAGE,
    EXIT_UNSTAMPED,
    Commands,
    UsageError,
    mask_secrets,
    print_error,
)
from admission.cli._logging import ENV_LOG_LEVEL, LOG_LEVELS, configure_logging, log_command, version_line
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
    UnstampedSchemaError,
    WorkerLockedError,
)

__all__ = ["WITHOUT_DATABASE", "build_parser", "leaf_commands", "main"]

if TYPE_CHECKING:
    from _typeshed import SupportsWrite

WITHOUT_DATABASE: Final = frozenset(
    {
        ("intent",),
        ("vectors", "verify"),
        ("token", "create"),
        ("token", "list"),
        ("token", "revoke"),
        ("conformance",),
    }
)
"""The commands that need no database; every other command takes ``--db`` before or after its name."""


class _Parser(argparse.ArgumentParser):
    """argparse with its refusal on one line, as every other failure: the message, then where the help is."""

    def error(self, message: str) -> NoReturn:
        # argparse echoes what it could not use: a URL given in the wrong place keeps its password masked.
        self.exit(EXIT_INVALID, f"admission: {mask_secrets(message)}; see `{self.prog} --help`\n")

    def print_help(self, file: SupportsWrite[str] | None = None) -> None:
        """Write the help; a closed standard output is raised, not passed over as argparse does.

        argparse swallows a failed write, so whether ``--help | head -c1``
        answered 0 or 141 depended on whether the text outgrew the buffer
        (the terminal's width decides its length); main answers 141 either way.
        """
        (file or sys.stdout).write(self.format_help())


def _cmd_demo(args: argparse.Namespace) -> int:
    if not 1 <= args.workers <= 64:
        raise UsageError("--workers", "must be 1 to 64")
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
    # Subparsers are built with the class of their parent: _Parser throughout.
    parser: argparse.ArgumentParser = _Parser(
        prog="admission",
        description="Safe retries of signals and updates for workflow engines.",
    )
    parser.add_argument("--version", action="version", version=version_line())
    parser.add_argument(
        "--log-level",
        dest="library_log_level",
        type=str.lower,
        choices=LOG_LEVELS,
        help=f"admission's log lines on stderr from this level on (default: ${ENV_LOG_LEVEL}, else none); "
        "serve's own --log-level is uvicorn's",
    )
    parser.add_argument(
        "--db",
        help=f"database URL (default: ${ENV_DB}, else an embedded SQLite file admission.sqlite3); "
        "also accepted after the command",
    )
    parser.add_argument(
        "--schema",
        help=f"PostgreSQL only: the schema of admission's tables (default: ${ENV_SCHEMA}, else the default)",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    # The order here is the order of ``admission --help``.
    _intent.add_parser(commands)
    _db.add_parser(commands)
    _receipts.add_parser(commands)
    _serve.add_parser(commands)
    _token.add_parser(commands)
    _demo_parser(commands)
    _worker.add_parser(commands, with_commands=worker_commands)
    _jobs.add_parser(commands)
    _conformance.add_parser(commands)
    # Added here, once, rather than by each group: a command added later
    # cannot forget them, and ``--db`` and ``--schema`` mean the same wherever
    # they are written.
    for path, command in leaf_commands(parser):
        if path not in WITHOUT_DATABASE and "--db" not in command._option_string_actions:
            command.add_argument(
                "--db",
                # SUPPRESS: unless given here, the URL given before the command
                # (or none) stays; argparse would otherwise overwrite it.
                default=argparse.SUPPRESS,
                help="database URL, as the --db before the command (this one wins if both are given)",
            )
        if path not in WITHOUT_DATABASE and "--schema" not in command._option_string_actions:
            command.add_argument(
                "--schema",
                default=argparse.SUPPRESS,
                help="PostgreSQL schema, as the --schema before the command (this one wins if both given)",
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
    """Run the command line; returns the exit code.

    Every failure is one line on stderr and a documented exit code, never a
    traceback; a closed standard output ends the command quietly (``EXIT_PIPE``).
    """
    try:
        try:
            return _run(sys.argv[1:] if argv is None else list(argv))
        finally:
            # Flushed here, inside the try: output still buffered when the
            # reader has gone would otherwise fail the interpreter's own flush
            # at exit, with a message of its own.
            if sys.stdout is not None:
                sys.stdout.flush()
    except BrokenPipeError:
        _discard_stdout()
        return EXIT_PIPE
    except KeyboardInterrupt:
        print_error("interrupted")
        return EXIT_INTERRUPTED


def _discard_stdout() -> None:
    # The recipe of the Python documentation (signal, "Note on SIGPIPE"):
    # point the descriptor at devnull, so that what is still buffered goes
    # nowhere instead of failing again at exit.
    if sys.stdout is None:
        return
    try:
        descriptor = sys.stdout.fileno()
    except (OSError, ValueError):  # not a file, e.g. a test's StringIO
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, descriptor)
    os.close(devnull)


def _undecodable(argv: Sequence[str]) -> UsageError | None:
    # Python hands bytes that are not UTF-8 over as lone surrogates; no
    # option, name or path of admission can hold one, and a driver given one
    # fails with an error of its own.  Refused here, once, naming the option.
    for index, word in enumerate(argv):
        try:
            word.encode("utf-8")
        except UnicodeEncodeError:
            if word.startswith("-") and "=" in word:
                field = word.split("=", 1)[0]
            elif index and argv[index - 1].startswith("-"):
                field = argv[index - 1]
            else:
                field = f"argument {index + 1}"
            return UsageError(field, "is not valid UTF-8")
    return None


def _is_revision_error(exc: Exception) -> bool:
    # alembic's CommandError: a revision it cannot find or reach (db upgrade
    # --revision, db downgrade REVISION), raised before a migration begins.
    # Looked up rather than imported: only a command that loaded alembic can
    # raise it, and every other command starts without alembic.
    errors = sys.modules.get("alembic.util.exc")
    return errors is not None and isinstance(exc, errors.CommandError)


def _run(argv: list[str]) -> int:
    refused = _undecodable(argv)
    if refused is not None:
        print_error(refused)
        return EXIT_INVALID
    # Adding the worker's commands imports SQLAlchemy.  A command line without
    # the word "worker" cannot reach them (argparse matches command names
    # exactly), so every other command starts without it.
    args = _build_parser(worker_commands="worker" in argv).parse_args(argv)
    try:
        configure_logging(args.library_log_level)
        log_command(args)
        code: int = args.handler(args)
    # Specific before general: a ScopeMismatchError is an InputError, yet the
    # worker's refusal of a record outside its scope exits 4, not 2.
    except UsageError as exc:
        print_error(exc)
        return EXIT_INVALID
    except UnstampedSchemaError as exc:
        print_error(exc)
        return EXIT_UNSTAMPED
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
    except BrokenPipeError:
        raise  # main's: standard output has gone, there is no one to tell
    except Exception as exc:
        if _is_revision_error(exc):
            print_error(f"revision: {exc}")
            return EXIT_INVALID
        # Not foreseen, so a bug: named on one line.  Only the first line of
        # the message: SQLAlchemy adds the statement and its parameters (keys,
        # arguments) on the lines below, and those are never printed.
        first_line = str(exc).splitlines()[0] if str(exc) else ""
        print_error(f"unexpected {type(exc).__name__}: {first_line} (a bug in admission; please report it)")
        return EXIT_INTERNAL
    return code
