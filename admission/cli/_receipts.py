"""Commands on receipts: start, close, signal, update, complete-update, receipt, history, prune."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from admission.cli._common import (
    EXIT_AMBIGUOUS,
    EXIT_CONFLICT,
    EXIT_FAILED,
    EXIT_OK,
    EXIT_REFUSED,
    Commands,
    UsageError,
    arguments_from,
    open_service,
    print_json,
    typed_arguments,
    typed_input,
)
from admission.receipts import Admission, Decision
from admission.receipts._retention import DEFAULT_MAX_CLOCK_LEAD, MAX_DAYS

if TYPE_CHECKING:
    from admission.receipts import PruneReport

__all__ = ["add_parser"]


def _exit_for(answer: Admission) -> int:
    if answer.decision is Decision.CONFLICT:
        return EXIT_CONFLICT
    if answer.decision is Decision.AMBIGUOUS:
        return EXIT_AMBIGUOUS
    if answer.outcome in ("run_not_active", "rejected_not_current"):
        return EXIT_REFUSED
    return EXIT_OK


def _instance_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("workflow_id", metavar="WORKFLOW_ID")
    parser.add_argument("--namespace", default="default", help="isolation boundary (default: default)")


def _cmd_start(args: argparse.Namespace) -> int:
    print_json(open_service(args).start_run(args.namespace, args.workflow_id, run_id=args.run_id).to_dict())
    return EXIT_OK


def _cmd_close(args: argparse.Namespace) -> int:
    service = open_service(args)
    if args.status == "continued":
        run = service.continue_as_new(args.namespace, args.workflow_id, run_id=args.run)
    else:
        run = service.close_run(args.namespace, args.workflow_id, args.status, run_id=args.run)
    print_json(run.to_dict())
    return EXIT_OK


def _cmd_admit(args: argparse.Namespace) -> int:
    arguments = arguments_from(args)
    service = open_service(args)
    admit = service.admit_signal if args.command == "signal" else service.admit_update
    answer = admit(
        args.namespace, args.workflow_id, args.name, arguments, request_id=args.request_id, run_id=args.run
    )
    print_json(answer.to_dict())
    return _exit_for(answer)


def _cmd_complete_update(args: argparse.Namespace) -> int:
    service = open_service(args)
    if args.fail is not None:
        if args.result is not None or args.result_cbor is not None:
            raise UsageError("--fail", "a failed update has no result")
        answer = service.fail_update(args.namespace, args.workflow_id, args.update_id, args.fail)
    else:
        result = typed_input(args.result, args.result_cbor, "--result", None)
        answer = service.complete_update(args.namespace, args.workflow_id, args.update_id, result)
    print_json(answer.to_dict())
    return EXIT_OK


def _cmd_receipt(args: argparse.Namespace) -> int:
    answer = open_service(args).receipt(args.namespace, args.workflow_id, args.type, args.request_id)
    if answer is None:
        print_json({"request_id": args.request_id, "command_type": args.type, "receipt": None})
        return EXIT_FAILED
    print_json(answer.to_dict())
    return _exit_for(answer)


def _cmd_history(args: argparse.Namespace) -> int:
    events = open_service(args).history(args.namespace, args.workflow_id)
    print_json([e.to_dict() for e in events])
    return EXIT_OK


def _cmd_prune(args: argparse.Namespace) -> int:
    from datetime import datetime, timedelta

    for flag, days in (("--retention-days", args.retention_days), ("--max-clock-lead-days", args.lead)):
        if not 0 <= days <= MAX_DAYS:
            raise UsageError(flag, f"give a number of days from 0 to {MAX_DAYS}")

    now = None
    if args.now is not None:
        try:
            now = datetime.fromisoformat(args.now)
        except ValueError:
            raise UsageError("--now", "not an ISO 8601 date and time") from None
        if now.tzinfo is None:
            raise UsageError("--now", "give a time zone, e.g. 2026-11-29T12:00:00+00:00")

    def show(report: PruneReport) -> None:
        # Progress goes to stderr, so stdout stays one JSON document.
        done = f"{report.done}/{report.chains}"
        counts = report.counts
        print(
            f"\rpruning{' (dry run)' if report.dry_run else ''}: {done} targets, {counts.runs} runs, "
            f"{counts.commands} commands, {counts.updates} updates, {counts.events} events",
            end="" if sys.stderr.isatty() else "\n",
            file=sys.stderr,
            flush=True,
        )

    report = open_service(args).prune(
        args.retention_days,
        now=now,
        batch_size=args.batch_size,
        dry_run=args.dry_run,
        progress=show,
        max_clock_lead=timedelta(days=args.lead),
    )
    if sys.stderr.isatty() and report.chains:
        print(file=sys.stderr)
    if report.clock_capped and report.as_of is not None:
        # Not a failure: pruning went ahead, as of the capped time.
        print(
            f"warning: the clock is more than {args.lead} day{'' if args.lead == 1 else 's'} ahead of "
            "the newest time the store "
            f"recorded; pruned as of {report.as_of.isoformat()} (see --max-clock-lead-days)",
            file=sys.stderr,
        )
    print_json(report.to_dict())
    return EXIT_OK


def add_parser(commands: Commands) -> None:
    """Add the commands on runs and receipts, from ``start`` to ``prune``."""
    start = commands.add_parser("start", help="start a run of a workflow instance")
    _instance_arguments(start)
    start.add_argument("--run-id", help="the new run's id (default: generated)")
    start.set_defaults(handler=_cmd_start)

    close = commands.add_parser("close", help="close the current run")
    _instance_arguments(close)
    close.add_argument(
        "--status",
        required=True,
        choices=("completed", "failed", "cancelled", "terminated", "continued"),
        help="how the run ends; continued starts a successor (continue-as-new)",
    )
    close.add_argument("--run", help="the run expected to be current")
    close.set_defaults(handler=_cmd_close)

    for command in ("signal", "update"):
        admit = commands.add_parser(command, help=f"admit a{'n' if command == 'update' else ''} {command}")
        _instance_arguments(admit)
        admit.add_argument("name", metavar="NAME")
        typed_arguments(admit, "--args", "arguments (a list or an object)")
        admit.add_argument("--request-id", help="the command key that makes retries safe")
        admit.add_argument("--run", help="select this run (run scope) instead of the current one")
        admit.set_defaults(handler=_cmd_admit)

    complete = commands.add_parser("complete-update", help="complete (or fail) an accepted update")
    _instance_arguments(complete)
    complete.add_argument("update_id", metavar="UPDATE_ID")
    typed_arguments(complete, "--result", "the result (default null)")
    complete.add_argument("--fail", metavar="MESSAGE", help="fail the update with this message instead")
    complete.set_defaults(handler=_cmd_complete_update)

    receipt = commands.add_parser("receipt", help="read the receipt a key names")
    _instance_arguments(receipt)
    receipt.add_argument("--type", required=True, choices=("signal", "update"))
    receipt.add_argument("--request-id", required=True)
    receipt.set_defaults(handler=_cmd_receipt)

    history = commands.add_parser("history", help="print the event log of an instance")
    _instance_arguments(history)
    history.set_defaults(handler=_cmd_history)

    prune = commands.add_parser("prune", help="remove receipts and history of runs closed long ago")
    prune.add_argument("--retention-days", type=int, default=30, help="keep runs closed fewer days ago (30)")
    prune.add_argument("--dry-run", action="store_true", help="count what would go; change nothing")
    prune.add_argument("--batch-size", type=int, default=100, help="targets between progress reports (100)")
    prune.add_argument("--now", help="prune as of this ISO 8601 time instead of the clock")
    prune.add_argument(
        "--max-clock-lead-days",
        dest="lead",
        type=int,
        default=DEFAULT_MAX_CLOCK_LEAD.days,
        help="cap the clock (or --now) at this many days after the newest recorded time "
        f"({DEFAULT_MAX_CLOCK_LEAD.days})",
    )
    prune.set_defaults(handler=_cmd_prune)
