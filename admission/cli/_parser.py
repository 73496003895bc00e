"""The parser, assembled from one module per command group, and ``main``: the one map of errors to exit codes.

Each group module adds its commands with ``add_parser(commands)`` and sets a
``handler`` on each; ``main`` runs the handler and turns every error it
raises into one line on stderr and a documented exit code.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from admission import __version__
from admission.cli import _db, _intent, _jobs, _receipts, _serve, _worker
from admission.cli._common import (
    ENV_DB,
    ENV_SCHEMA,
    EXIT_INVALID,
    EXIT_OWNED,
    EXIT_REFUSED,
    EXIT_SCHEMA,
    EXIT_STORAGE,
    EXIT_UNSTAMPED,
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
    UnstampedSchemaError,
    WorkerLockedError,
)

__all__ = ["build_parser", "main"]


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
        "--db", help=f"database URL (default: ${ENV_DB}, else an embedded SQLite file admission.sqlite3)"
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
    _demo_parser(commands)
    _worker.add_parser(commands, with_commands=worker_commands)
    _jobs.add_parser(commands)
    return parser


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
    return code
