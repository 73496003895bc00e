"""``admission jobs``: a durable job's status, the operator's requests, and resolve (docs/jobs.md)."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from admission.cli._common import EXIT_OK, Commands, UsageError, db_url, engine_options, print_json

if TYPE_CHECKING:
    from admission.jobs import JobService

__all__ = ["add_parser"]


def _jobs(args: argparse.Namespace) -> JobService:
    # Every jobs command builds its service here and nowhere else, so that the
    # store behind the commands can change in this one function.
    from admission.jobs import JobService
    from admission.sql import SqlJobStore

    return JobService(SqlJobStore.open(db_url(args), **engine_options(args)))


def _export(args: argparse.Namespace) -> int:
    # Checked before the database is opened: a path where no file can be made,
    # or a scope no job can have, is refused with nothing read or written.
    from admission.errors import InputError
    from admission.jobs._snapshot import check_export_path

    if args.job_id is not None or args.events:
        raise UsageError("--export", "exports every job of a scope; give no JOB_ID and no --events")
    try:
        check_export_path(args.export)
    except InputError as exc:
        raise UsageError("--export", str(exc).removeprefix("path: ")) from None
    store = _jobs(args)
    try:
        try:
            written = store.export_snapshot(args.export, args.scope)
        except InputError as exc:
            if exc.field != "path":
                raise
            raise UsageError("--export", str(exc).removeprefix("path: ")) from None
    finally:
        store.dispose()
    jobs = written["jobs"]
    assert isinstance(jobs, list)
    summary = {"path": args.export, "scope": args.scope, "jobs": len(jobs), "counts": written["counts"]}
    print(json.dumps(summary, ensure_ascii=False))
    return EXIT_OK


def _cmd_jobs_status(args: argparse.Namespace) -> int:
    if args.export is not None:
        return _export(args)
    store = _jobs(args)
    try:
        if args.job_id is None:
            print_json({"scope": args.scope, "counts": store.counts(args.scope)})
        else:
            report: dict[str, object] = store.status(args.job_id).to_dict()
            if args.events:
                report["events"] = [
                    {**vars(e), "recorded_at": e.recorded_at.isoformat()} for e in store.events(args.job_id)
                ]
            print_json(report)
    finally:
        store.dispose()
    return EXIT_OK


def _cmd_jobs_request(args: argparse.Namespace) -> int:
    store = _jobs(args)
    try:
        view = getattr(store, args.jobs_command)(args.job_id)
        print_json(view.to_dict())
    finally:
        store.dispose()
    return EXIT_OK


def _cmd_jobs_resolve(args: argparse.Namespace) -> int:
    store = _jobs(args)
    try:
        print_json(store.resolve(args.job_id, args.outcome, who=args.who, why=args.why).to_dict())
    finally:
        store.dispose()
    return EXIT_OK


def add_parser(commands: Commands) -> None:
    """Add ``jobs status``, ``pause``, ``resume``, ``stop``, ``cancel`` and ``resolve``."""
    jobs = commands.add_parser("jobs", help="durable jobs: status, pause/resume/stop/cancel, resolve")
    actions = jobs.add_subparsers(dest="jobs_command", required=True, metavar="ACTION")
    status = actions.add_parser(
        "status", help="a job as JSON, the job counts by state, or (--export) a snapshot of every job"
    )
    status.add_argument("job_id", nargs="?", metavar="JOB_ID")
    status.add_argument("--scope", help="count (or export) only this scope's jobs (without JOB_ID)")
    status.add_argument("--events", action="store_true", help="include the job's events")
    status.add_argument(
        "--export",
        metavar="FILE",
        help="write every job (of --scope) at one instant to FILE, atomically (docs/jobs.md, Snapshot)",
    )
    status.set_defaults(handler=_cmd_jobs_status)
    for name, text in (
        ("pause", "stop new claims of the job"),
        ("resume", "let a paused job be claimed again"),
        ("stop", "prevent a new start of the job"),
        ("cancel", "end a waiting job; mark a running one for reconciliation"),
    ):
        request = actions.add_parser(name, help=text)
        request.add_argument("job_id", metavar="JOB_ID")
        request.set_defaults(handler=_cmd_jobs_request)
    resolve = actions.add_parser("resolve", help="settle a recovery_required job (recorded with who and why)")
    resolve.add_argument("job_id", metavar="JOB_ID")
    resolve.add_argument("--outcome", required=True, choices=("completed", "failed"))
    resolve.add_argument("--who", required=True, help="who decided")
    resolve.add_argument("--why", required=True, help="what was checked on the target")
    resolve.set_defaults(handler=_cmd_jobs_resolve)
