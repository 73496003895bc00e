"""``admission worker``: the durable outbox worker's commands (docs/worker.md).

The worker and its target are built from the command line here; the test
hooks that pause a worker at a named point are read from the environment.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from admission.cli._common import (
    EXIT_CONFLICT,
    EXIT_OK,
    Commands,
    UsageError,
    db_url,
    engine_options,
    json_file,
    print_json,
)
from admission.errors import StorageError

if TYPE_CHECKING:
    from admission.worker import DurableWorker, Target

__all__ = ["add_parser"]

ENV_STOP_AT = "ADMISSION_WORKER_STOP_AT"
"""Test hook: the worker pauses at this named point of a send (``admission.testing.CRASH_POINTS``)."""
ENV_STOP_MARKER = "ADMISSION_WORKER_STOP_MARKER"
"""Test hook: the file the paused worker creates, so a test knows when to kill it."""


def _stop_hook() -> Callable[[str], None] | None:
    # Test hook (contract: shown by crashing): pause at the named point so a
    # test can SIGKILL the process exactly there, or let it go on late.
    point = os.environ.get(ENV_STOP_AT)
    if not point:
        return None
    from admission.testing import pause_at

    return pause_at(point, os.environ.get(ENV_STOP_MARKER) or None)


def _file_path(value: str | None, option: str) -> str | None:
    # Checked before the worker is built, because building it pins its queue
    # in the database: a --lock or --export where no file can be made is
    # refused with nothing written.  (What is left, such as a folder without
    # write permission, is refused when the file is written.)
    if value is None:
        return None
    path = Path(value)
    if path.is_dir():
        raise UsageError(option, f"{path} is a directory")
    if not path.parent.is_dir():
        raise UsageError(option, f"there is no folder {path.parent}")
    return value


def _worker(args: argparse.Namespace) -> DurableWorker:
    # Every worker command builds its worker here and nowhere else, so that
    # the storage behind the commands can change in this one function.
    from admission.sql import SqlWorkerStore
    from admission.worker import DurableWorker, Scope

    # Opening the store checks the schema revision (contract §6) behind the
    # store's driver-error boundary, before anything else is read.
    store = SqlWorkerStore.open(db_url(args), **engine_options(args))
    scope = Scope.parse(json_file(args.scope, "--scope"))
    return DurableWorker(
        store,
        scope,
        queue=args.queue,
        lock_path=_file_path(args.lock, "--lock"),
        hook=_stop_hook(),
        lease_ttl=args.lease_ttl,
        claim_wait=args.wait,
        send_batch=getattr(args, "send_batch", 1),
    )


def _target(args: argparse.Namespace) -> Target:
    # Called before _worker: building the worker pins its queue in the
    # database, and a target that cannot be opened must leave nothing written.
    import sqlite3

    from admission.testing import FaultyTarget
    from admission.worker import SqliteTarget

    if args.target is None:
        raise UsageError("--target", "is required")
    try:
        target: Target = SqliteTarget(args.target)
    except (sqlite3.Error, OSError) as exc:
        # A database that cannot be opened, as for --db: a storage failure (5), before any send.
        raise StorageError(f"the target {args.target} cannot be opened: {exc}") from exc
    if args.fault is not None:
        target = FaultyTarget(target, args.fault)
    return target


def _cmd_worker_accept(args: argparse.Namespace) -> int:
    record = json_file(args.record, "--record")
    answer = _worker(args).accept(record)
    print_json({"outcome": answer.outcome, "write_id": answer.write_id, "state": answer.state})
    return EXIT_CONFLICT if answer.outcome == "conflict" else EXIT_OK


def _cycle_json(report: object) -> dict[str, object]:
    from dataclasses import asdict, is_dataclass

    assert is_dataclass(report) and not isinstance(report, type)
    return asdict(report)


def _cmd_worker_once(args: argparse.Namespace) -> int:
    target, worker = _target(args), _worker(args)
    print_json(_cycle_json(worker.run_once(target)))
    return EXIT_OK


def _cmd_worker_start(args: argparse.Namespace) -> int:
    import signal
    import time

    target, worker = _target(args), _worker(args)
    stop: list[int] = []

    def on_signal(signum: int, _frame: object) -> None:
        stop.append(signum)

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    cycles = 0
    try:
        with worker.owned():
            while not stop and (args.cycles is None or cycles < args.cycles):
                report = _cycle_json(worker.run_once(target))
                report["poll"] = _cycle_json(worker.poll_status(target, args.poll_limit))
                cycles += 1
                report["cycle"] = cycles
                print(json.dumps(report), flush=True)
                deadline = time.monotonic() + args.interval
                while not stop and (args.cycles is None or cycles < args.cycles):
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    worker.keep_lease()  # idle is no reason to lose the queue
                    time.sleep(min(left, 0.1))
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    print(json.dumps({"stopped": True, "cycles": cycles, "signal": stop[0] if stop else None}), flush=True)
    return EXIT_OK


def _cmd_worker_status(args: argparse.Namespace) -> int:
    _file_path(args.export, "--export")
    worker = _worker(args)
    if args.export:
        try:
            worker.export_status(args.export)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError) as exc:
            raise UsageError("--export", f"cannot write {args.export}: {exc.strerror}") from None
    print_json(worker.status())
    return EXIT_OK


def _cmd_worker_observe(args: argparse.Namespace) -> int:
    record = json_file(args.record, "--record")
    if (args.snapshot is None) == (not args.missing):
        raise UsageError("--snapshot", "give either --snapshot FILE or --missing")
    snapshot = None if args.missing else json_file(args.snapshot, "--snapshot")
    worker = _worker(args)
    source_key, _ = worker.validate(record)
    write_id = worker.find(source_key).write_id
    changed = worker.observe(write_id, snapshot, missing=args.missing)
    print_json({"write_id": write_id, "changed": changed, "state": worker.get(write_id).state})
    return EXIT_OK


def _cmd_worker_poll_status(args: argparse.Namespace) -> int:
    target, worker = _target(args), _worker(args)
    print_json(_cycle_json(worker.poll_status(target, args.poll_limit)))
    return EXIT_OK


def _cmd_worker_resolve(args: argparse.Namespace) -> int:
    worker = _worker(args)
    state = worker.resolve(args.write_id, args.decision, actor=args.actor, reason=args.reason)
    print_json({"write_id": args.write_id, "state": state, "actor": args.actor, "reason": args.reason})
    return EXIT_OK


def add_parser(commands: Commands, *, with_commands: bool = True) -> None:
    """Add ``worker`` and, unless ``with_commands`` is false, its commands from ``accept`` to ``resolve``."""
    worker = commands.add_parser("worker", help="the durable outbox worker (docs/worker.md)")
    if not with_commands:
        return
    # The --fault choices load admission.testing, and with it the worker and SQLAlchemy.
    from admission.testing import FAULTS

    sub = worker.add_subparsers(dest="worker_command", required=True, metavar="WORKER_COMMAND")

    def common(name: str, help_text: str, *, target: bool = False) -> argparse.ArgumentParser:
        parser = sub.add_parser(name, help=help_text)
        parser.add_argument("--scope", required=True, metavar="FILE", help="the scope, a JSON object")
        parser.add_argument("--queue", default="default", help="the queue name (default: default)")
        parser.add_argument("--lock", metavar="FILE", help="the lock file (default: next to a SQLite db)")
        parser.add_argument("--lease-ttl", type=float, default=30.0, help="lease takeover time, seconds")
        parser.add_argument(
            "--wait", type=float, default=0.0, help="keep claiming a held lease this long, seconds (0)"
        )
        if target:
            parser.add_argument("--target", metavar="FILE", help="the SQLite target database")
            parser.add_argument("--fault", choices=FAULTS, help="inject a fault into every write")
            parser.add_argument(
                "--send-batch",
                type=int,
                default=1,
                help="records put in flight per commit (1; more is faster, see docs/worker.md)",
            )
        return parser

    accept = common("accept", "accept a record into the queue")
    accept.add_argument("--record", metavar="FILE", help="the record, a JSON object")
    accept.add_argument("--target", metavar="FILE", help=argparse.SUPPRESS)
    accept.set_defaults(handler=_cmd_worker_accept)

    common("once", "one send/reconcile cycle", target=True).set_defaults(handler=_cmd_worker_once)

    start = common("start", "cycles in the foreground until --cycles or SIGINT/SIGTERM", target=True)
    start.add_argument("--interval", type=float, default=1.0, help="seconds between cycles (1)")
    start.add_argument("--cycles", type=int, help="stop after this many cycles (default: run until stopped)")
    start.add_argument("--poll-limit", type=int, default=100, help="records polled per cycle (100)")
    start.set_defaults(handler=_cmd_worker_start)

    status = common("status", "print the queue's state as JSON")
    status.add_argument("--export", metavar="FILE", help="also write it to FILE atomically")
    status.add_argument("--target", metavar="FILE", help=argparse.SUPPRESS)
    status.set_defaults(handler=_cmd_worker_status)

    observe = common("observe", "store a confirmed record's latest status snapshot")
    observe.add_argument("--record", metavar="FILE", help="the record, a JSON object")
    observe.add_argument("--snapshot", metavar="FILE", help="the snapshot, JSON")
    observe.add_argument("--missing", action="store_true", help="the target no longer has the row")
    observe.add_argument("--target", metavar="FILE", help=argparse.SUPPRESS)
    observe.set_defaults(handler=_cmd_worker_observe)

    poll = common("poll-status", "one bounded status polling pass", target=True)
    poll.add_argument("--poll-limit", type=int, default=100, help="records polled (1-1000, default 100)")
    poll.set_defaults(handler=_cmd_worker_poll_status)

    resolve = common("resolve", "settle an uncertain record (recorded with who and why)")
    resolve.add_argument("--write-id", required=True)
    resolve.add_argument("--decision", required=True, choices=("confirm", "failed_safe", "release"))
    resolve.add_argument("--actor", required=True, help="who decides")
    resolve.add_argument("--reason", required=True, help="why")
    resolve.add_argument("--target", metavar="FILE", help=argparse.SUPPRESS)
    resolve.set_defaults(handler=_cmd_worker_resolve)
