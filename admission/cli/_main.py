"""The ``admission`` command line: the composition root.

This is the only module that reads the environment or parses command-line
input.  Every command prints JSON on stdout.  Bad input prints one clear line
naming the field on stderr, exits 2 and writes nothing.

Exit codes: 0 fresh or retained; 1 a check found a mismatch; 2 invalid
input; 3 the database is not at the schema revision this version reads;
4 refused by run state (``run_not_active``, ``rejected_not_current``, a
lifecycle call that does not fit; for ``worker``: a full queue, a record
outside the scope, a record in the wrong state; for ``jobs``: an event that
does not fit the job's state); 9 ``request_id_conflict`` (``worker accept``:
changed content under an accepted key); 10 ``request_id_ambiguous``; 11
another worker owns the queue (file lock or lease) or this one was fenced; 5
a storage failure; 73 the injected ``crash-after-write`` fault
(docs/worker.md).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from admission import __version__
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
from admission.http._codecs import parse_json_value
from admission.intent._encoding import (
    INTENT_VERSION,
    arguments_digest,
    canonical_decode,
    canonical_encode,
    intent_digest,
)
from admission.intent._keys import receipt_token, validate_request_id
from admission.receipts._rules import Admission, Decision

if TYPE_CHECKING:
    from admission.jobs._service import JobService
    from admission.receipts._service import AdmissionService
    from admission.worker._targets import Target
    from admission.worker._worker import DurableWorker

__all__ = [
    "EXIT_AMBIGUOUS",
    "EXIT_CONFLICT",
    "EXIT_FAILED",
    "EXIT_INVALID",
    "EXIT_OK",
    "EXIT_OWNED",
    "EXIT_REFUSED",
    "EXIT_SCHEMA",
    "EXIT_STORAGE",
    "build_parser",
    "main",
    "parse_json_value",
]

EXIT_OK = 0
"""The command did what was asked: a fresh or a retained answer."""
EXIT_FAILED = 1
"""A check ran and found a mismatch (for example a golden vector)."""
EXIT_INVALID = 2
"""The input was refused; nothing was written."""
EXIT_SCHEMA = 3
"""The database is not at the schema revision this version reads."""
EXIT_REFUSED = 4
"""Refused by run state: ``run_not_active``, ``rejected_not_current``, or a lifecycle call
that does not fit the run."""
EXIT_STORAGE = 5
"""The database failed or is unavailable."""
EXIT_CONFLICT = 9
"""``request_id_conflict``: the key names another intent; nothing was written."""
EXIT_AMBIGUOUS = 10
"""``request_id_ambiguous``: the key cannot be proven to name one receipt; nothing was written."""

EXIT_OWNED = 11
"""``worker``: another worker holds the queue's file lock or live lease, or this worker was fenced."""

ENV_DB = "ADMISSION_DB"
ENV_STOP_AT = "ADMISSION_WORKER_STOP_AT"
"""Test hook: the worker pauses at this named point of a send (``admission.testing.CRASH_POINTS``)."""
ENV_STOP_MARKER = "ADMISSION_WORKER_STOP_MARKER"
"""Test hook: the file the paused worker creates, so a test knows when to kill it."""


class _InputError(Exception):
    """Bad command-line input, reported as ``<field>: <reason>``."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")


def _typed_input(json_text: str | None, cbor_hex: str | None, field: str, default: object) -> object:
    if json_text is not None and cbor_hex is not None:
        raise _InputError(field, f"give either {field} or {field}-cbor, not both")
    if cbor_hex is not None:
        try:
            data = bytes.fromhex(cbor_hex)
        except ValueError:
            raise _InputError(f"{field}-cbor", "not a hex string") from None
        try:
            return canonical_decode(data)
        except AdmissionError as exc:
            raise _InputError(f"{field}-cbor", str(exc)) from None
    if json_text is not None:
        return parse_json_value(json_text, field)
    return default


def _arguments_from(args: argparse.Namespace) -> object:
    return _typed_input(args.args, args.args_cbor, "--args", {})


def _print_json(payload: object) -> None:
    print(json.dumps(payload, indent=2, ensure_ascii=False))


# -- commands without a database ---------------------------------------------------------


def _cmd_intent(args: argparse.Namespace) -> int:
    arguments = _arguments_from(args)
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
    _print_json(report)
    return EXIT_OK


def _cmd_vectors_verify(args: argparse.Namespace) -> int:
    from admission.intent import verify_vectors

    directory = Path(args.directory)
    if not directory.is_dir():
        raise _InputError("DIR", f"{directory} is not a directory")
    report = verify_vectors(directory)
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


# -- commands on a database ---------------------------------------------------------------


def _db_url(args: argparse.Namespace) -> str:
    from admission.sql import DEFAULT_URL

    url: str = args.db or os.environ.get(ENV_DB) or DEFAULT_URL
    return url


def _service(args: argparse.Namespace) -> AdmissionService:
    # Imported here so that commands without a database stay quick to start.
    from admission.receipts._service import AdmissionService
    from admission.sql import SqlStore

    return AdmissionService(SqlStore.open(_db_url(args)))


def _exit_for(answer: Admission) -> int:
    if answer.decision is Decision.CONFLICT:
        return EXIT_CONFLICT
    if answer.decision is Decision.AMBIGUOUS:
        return EXIT_AMBIGUOUS
    if answer.outcome in ("run_not_active", "rejected_not_current"):
        return EXIT_REFUSED
    return EXIT_OK


def _cmd_db_upgrade(args: argparse.Namespace) -> int:
    from admission.sql import create_admission_engine
    from admission.sql._migrate import revision_of, upgrade

    engine = create_admission_engine(_db_url(args))
    before = revision_of(engine)
    after = upgrade(engine, args.revision)
    engine.dispose()
    _print_json({"database": _db_url(args), "from_revision": before, "revision": after})
    return EXIT_OK


def _cmd_db_downgrade(args: argparse.Namespace) -> int:
    from admission.sql import create_admission_engine
    from admission.sql._migrate import downgrade, revision_of

    engine = create_admission_engine(_db_url(args))
    before = revision_of(engine)
    try:
        after = downgrade(engine, args.revision, allow_unsafe=args.allow_unsafe)
    except RuntimeError as exc:
        print(f"admission: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    finally:
        engine.dispose()
    _print_json({"database": _db_url(args), "from_revision": before, "revision": after})
    return EXIT_OK


def _cmd_db_check(args: argparse.Namespace) -> int:
    from admission.sql import create_admission_engine
    from admission.sql._migrate import revision_of
    from admission.sql._schema import HEAD_REVISION, check_revision

    engine = create_admission_engine(_db_url(args))
    revision = revision_of(engine)
    report: dict[str, object] = {"database": _db_url(args), "revision": revision, "head": HEAD_REVISION}
    try:
        with engine.connect() as conn:
            check_revision(conn)
    except SchemaRevisionError as exc:
        report["ok"] = False
        report["message"] = str(exc)
        _print_json(report)
        return EXIT_SCHEMA
    finally:
        engine.dispose()
    report["ok"] = True
    _print_json(report)
    return EXIT_OK


def _cmd_start(args: argparse.Namespace) -> int:
    _print_json(_service(args).start_run(args.namespace, args.workflow_id, run_id=args.run_id).to_dict())
    return EXIT_OK


def _cmd_close(args: argparse.Namespace) -> int:
    service = _service(args)
    if args.status == "continued":
        run = service.continue_as_new(args.namespace, args.workflow_id, run_id=args.run)
    else:
        run = service.close_run(args.namespace, args.workflow_id, args.status, run_id=args.run)
    _print_json(run.to_dict())
    return EXIT_OK


def _cmd_admit(args: argparse.Namespace) -> int:
    arguments = _arguments_from(args)
    service = _service(args)
    admit = service.admit_signal if args.command == "signal" else service.admit_update
    answer = admit(
        args.namespace, args.workflow_id, args.name, arguments, request_id=args.request_id, run_id=args.run
    )
    _print_json(answer.to_dict())
    return _exit_for(answer)


def _cmd_complete_update(args: argparse.Namespace) -> int:
    service = _service(args)
    if args.fail is not None:
        if args.result is not None or args.result_cbor is not None:
            raise _InputError("--fail", "a failed update has no result")
        answer = service.fail_update(args.namespace, args.workflow_id, args.update_id, args.fail)
    else:
        result = _typed_input(args.result, args.result_cbor, "--result", None)
        answer = service.complete_update(args.namespace, args.workflow_id, args.update_id, result)
    _print_json(answer.to_dict())
    return EXIT_OK


def _cmd_receipt(args: argparse.Namespace) -> int:
    answer = _service(args).receipt(args.namespace, args.workflow_id, args.type, args.request_id)
    if answer is None:
        _print_json({"request_id": args.request_id, "command_type": args.type, "receipt": None})
        return EXIT_FAILED
    _print_json(answer.to_dict())
    return _exit_for(answer)


def _cmd_history(args: argparse.Namespace) -> int:
    events = _service(args).history(args.namespace, args.workflow_id)
    _print_json([e.to_dict() for e in events])
    return EXIT_OK


def _cmd_prune(args: argparse.Namespace) -> int:
    from datetime import datetime

    from admission.receipts._service import PruneReport

    now = None
    if args.now is not None:
        try:
            now = datetime.fromisoformat(args.now)
        except ValueError:
            raise _InputError("--now", "not an ISO 8601 date and time") from None
        if now.tzinfo is None:
            raise _InputError("--now", "give a time zone, e.g. 2026-11-29T12:00:00+00:00")

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

    report = _service(args).prune(
        args.retention_days, now=now, batch_size=args.batch_size, dry_run=args.dry_run, progress=show
    )
    if sys.stderr.isatty() and report.chains:
        print(file=sys.stderr)
    _print_json(report.to_dict())
    return EXIT_OK


ENV_AES_GCM_KEY = "ADMISSION_AES_GCM_KEY"
ENV_AES_GCM_KEY_ID = "ADMISSION_AES_GCM_KEY_ID"


def _aes_gcm_key() -> tuple[bytes, str] | None:
    # The key comes from the environment, never the command line, where any
    # user of the machine could read it in the process list.
    text = os.environ.get(ENV_AES_GCM_KEY)
    if not text:
        return None
    import base64

    try:
        key = base64.b64decode(text.strip(), validate=True)
    except ValueError:  # binascii.Error, and text that is not ASCII at all
        raise _InputError(ENV_AES_GCM_KEY, "not standard base64") from None
    if len(key) not in (16, 24, 32):
        raise _InputError(ENV_AES_GCM_KEY, f"must decode to 16, 24 or 32 bytes, got {len(key)}")
    return key, os.environ.get(ENV_AES_GCM_KEY_ID) or "default"


def _cmd_serve(args: argparse.Namespace) -> int:
    try:
        import uvicorn

        from admission.http._app import create_app
        from admission.http._codecs import AesGcmCodec, CborCodec, Codec, JsonCodec, codecs_from
    except ImportError as exc:
        raise _InputError("serve", f"needs the http extra: pip install 'admission[http]' ({exc})") from None
    if not 0 < args.port < 65536:
        raise _InputError("--port", "must be 1 to 65535")
    codecs: list[Codec] = [JsonCodec(), CborCodec()]
    aes = _aes_gcm_key()
    if aes is not None:
        codecs.append(AesGcmCodec(aes[0], aes[1]))
    service = _service(args)
    app = create_app(service, codecs=codecs_from(*codecs))
    # One JSON line saying where it listens, then uvicorn's log on stderr.
    print(
        json.dumps(
            {
                "serving": f"http://{args.host}:{args.port}",
                "database": _db_url(args),
                "codecs": [c.name for c in codecs],
                "aes_gcm_key_id": None if aes is None else aes[1],
            }
        ),
        flush=True,
    )
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level, access_log=args.access_log)
    return EXIT_OK


def _cmd_demo(args: argparse.Namespace) -> int:
    from admission.cli._demo import run_demo

    return run_demo(args.db, workers=args.workers)


# -- the parser ------------------------------------------------------------------------------


# -- durable jobs (docs/jobs.md) ------------------------------------------------------------


def _jobs(args: argparse.Namespace) -> JobService:
    from admission.jobs._service import JobService
    from admission.sql._jobs import SqlJobStore

    return JobService(SqlJobStore.open(_db_url(args)))


def _cmd_jobs_status(args: argparse.Namespace) -> int:
    store = _jobs(args)
    try:
        if args.job_id is None:
            _print_json({"scope": args.scope, "counts": store.counts(args.scope)})
        else:
            report: dict[str, object] = store.status(args.job_id).to_dict()
            if args.events:
                report["events"] = [
                    {**vars(e), "recorded_at": e.recorded_at.isoformat()} for e in store.events(args.job_id)
                ]
            _print_json(report)
    finally:
        store.dispose()
    return EXIT_OK


def _cmd_jobs_request(args: argparse.Namespace) -> int:
    store = _jobs(args)
    try:
        view = getattr(store, args.jobs_command)(args.job_id)
        _print_json(view.to_dict())
    finally:
        store.dispose()
    return EXIT_OK


def _cmd_jobs_resolve(args: argparse.Namespace) -> int:
    store = _jobs(args)
    try:
        _print_json(store.resolve(args.job_id, args.outcome, who=args.who, why=args.why).to_dict())
    finally:
        store.dispose()
    return EXIT_OK


def _jobs_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    jobs = commands.add_parser("jobs", help="durable jobs: status, pause/resume/stop/cancel, resolve")
    actions = jobs.add_subparsers(dest="jobs_command", required=True, metavar="ACTION")
    status = actions.add_parser("status", help="a job as JSON, or the job counts by state")
    status.add_argument("job_id", nargs="?", metavar="JOB_ID")
    status.add_argument("--scope", help="count only this scope's jobs (without JOB_ID)")
    status.add_argument("--events", action="store_true", help="include the job's events")
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


def _instance_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("workflow_id", metavar="WORKFLOW_ID")
    parser.add_argument("--namespace", default="default", help="isolation boundary (default: default)")


def _typed_arguments(parser: argparse.ArgumentParser, flag: str, what: str) -> None:
    parser.add_argument(flag, help=f"{what} as JSON (1 and 1.0, -0.0 and NaN are kept apart)")
    parser.add_argument(f"{flag}-cbor", help=f"{what} as canonical CBOR, in hex")


# -- the durable worker (docs/worker.md) --------------------------------------------------------


def _json_file(path: str | None, field: str) -> object:
    if path is None:
        raise _InputError(field, "is required")
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise _InputError(field, f"cannot read {path}: {exc.strerror}") from None
    return parse_json_value(text, field)


def _stop_hook() -> Callable[[str], None] | None:
    # Test hook (contract: shown by crashing): pause at the named point so a
    # test can SIGKILL the process exactly there, or let it go on late.
    point = os.environ.get(ENV_STOP_AT)
    if not point:
        return None
    from admission.testing import pause_at

    return pause_at(point, os.environ.get(ENV_STOP_MARKER) or None)


def _worker(args: argparse.Namespace) -> DurableWorker:
    from admission.sql import create_admission_engine
    from admission.worker._worker import DurableWorker, Scope

    scope = Scope.parse(_json_file(args.scope, "--scope"))
    return DurableWorker(
        create_admission_engine(_db_url(args)),
        scope,
        queue=args.queue,
        lock_path=args.lock,
        hook=_stop_hook(),
        lease_ttl=args.lease_ttl,
        claim_wait=args.wait,
        send_batch=getattr(args, "send_batch", 1),
    )


def _target(args: argparse.Namespace) -> Target:
    from admission.testing import FaultyTarget
    from admission.worker._targets import SqliteTarget

    if args.target is None:
        raise _InputError("--target", "is required")
    target: Target = SqliteTarget(args.target)
    if args.fault is not None:
        target = FaultyTarget(target, args.fault)
    return target


def _check_worker_schema(args: argparse.Namespace) -> None:
    from admission.sql import create_admission_engine
    from admission.sql._schema import check_revision

    engine = create_admission_engine(_db_url(args))
    try:
        with engine.connect() as conn:
            check_revision(conn)
    finally:
        engine.dispose()


def _cmd_worker_accept(args: argparse.Namespace) -> int:
    record = _json_file(args.record, "--record")
    _check_worker_schema(args)
    answer = _worker(args).accept(record)
    _print_json({"outcome": answer.outcome, "write_id": answer.write_id, "state": answer.state})
    return EXIT_CONFLICT if answer.outcome == "conflict" else EXIT_OK


def _cycle_json(report: object) -> dict[str, object]:
    from dataclasses import asdict, is_dataclass

    assert is_dataclass(report) and not isinstance(report, type)
    return asdict(report)


def _cmd_worker_once(args: argparse.Namespace) -> int:
    _check_worker_schema(args)
    worker, target = _worker(args), _target(args)
    _print_json(_cycle_json(worker.run_once(target)))
    return EXIT_OK


def _cmd_worker_start(args: argparse.Namespace) -> int:
    import signal
    import time

    _check_worker_schema(args)
    worker, target = _worker(args), _target(args)
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
    _check_worker_schema(args)
    worker = _worker(args)
    if args.export:
        worker.export_status(args.export)
    _print_json(worker.status())
    return EXIT_OK


def _cmd_worker_observe(args: argparse.Namespace) -> int:
    record = _json_file(args.record, "--record")
    if (args.snapshot is None) == (not args.missing):
        raise _InputError("--snapshot", "give either --snapshot FILE or --missing")
    snapshot = None if args.missing else _json_file(args.snapshot, "--snapshot")
    _check_worker_schema(args)
    worker = _worker(args)
    source_key, _ = worker.validate(record)
    write_id = worker.find(source_key)["write_id"]
    changed = worker.observe(write_id, snapshot, missing=args.missing)
    _print_json({"write_id": write_id, "changed": changed, "state": worker.get(write_id)["state"]})
    return EXIT_OK


def _cmd_worker_poll_status(args: argparse.Namespace) -> int:
    _check_worker_schema(args)
    worker, target = _worker(args), _target(args)
    _print_json(_cycle_json(worker.poll_status(target, args.poll_limit)))
    return EXIT_OK


def _cmd_worker_resolve(args: argparse.Namespace) -> int:
    _check_worker_schema(args)
    worker = _worker(args)
    state = worker.resolve(args.write_id, args.decision, actor=args.actor, reason=args.reason)
    _print_json({"write_id": args.write_id, "state": state, "actor": args.actor, "reason": args.reason})
    return EXIT_OK


def _worker_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from admission.testing import FAULTS

    worker = commands.add_parser("worker", help="the durable outbox worker (docs/worker.md)")
    sub = worker.add_subparsers(dest="worker_command", required=True, metavar="WORKER_COMMAND")

    def common(name: str, help_text: str, *, target: bool = False) -> argparse.ArgumentParser:
        parser = sub.add_parser(name, help=help_text)
        parser.add_argument("--db", default=argparse.SUPPRESS, help="database URL (as the global --db)")
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


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``admission`` command."""
    parser = argparse.ArgumentParser(
        prog="admission",
        description="Safe retries of signals and updates for workflow engines.",
    )
    parser.add_argument("--version", action="version", version=f"admission {__version__}")
    parser.add_argument(
        "--db", help=f"database URL (default: ${ENV_DB}, else an embedded SQLite file admission.sqlite3)"
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    intent = commands.add_parser("intent", help="print the receipt token and intent digest of a command")
    intent.add_argument("--type", required=True, choices=("signal", "update"), help="command type")
    intent.add_argument("--name", required=True, help="canonical command name")
    _typed_arguments(intent, "--args", "arguments (a list or an object)")
    intent.add_argument("--target", help="selected run id (run scope); omit for instance scope")
    intent.add_argument("--request-id", help="the command key")
    intent.set_defaults(handler=_cmd_intent)

    vectors = commands.add_parser("vectors", help="golden vectors")
    vector_commands = vectors.add_subparsers(dest="vectors_command", required=True, metavar="ACTION")
    verify = vector_commands.add_parser("verify", help="re-derive every golden vector; exit 1 on a mismatch")
    verify.add_argument("directory", nargs="?", default="vectors", metavar="DIR")
    verify.set_defaults(handler=_cmd_vectors_verify)

    db = commands.add_parser("db", help="schema revisions (alembic)")
    db_commands = db.add_subparsers(dest="db_command", required=True, metavar="ACTION")
    db_upgrade = db_commands.add_parser("upgrade", help="upgrade the schema (to the head by default)")
    db_upgrade.add_argument("--revision", default="head")
    db_upgrade.set_defaults(handler=_cmd_db_upgrade)
    db_check = db_commands.add_parser("check", help="print the revision; exit 3 unless it is the head")
    db_check.set_defaults(handler=_cmd_db_check)
    db_downgrade = db_commands.add_parser("downgrade", help="downgrade (see docs/upgrading.md first)")
    db_downgrade.add_argument("revision", metavar="REVISION")
    db_downgrade.add_argument(
        "--allow-unsafe",
        action="store_true",
        help="downgrade even though receipts with intent digests, worker records or jobs exist",
    )
    db_downgrade.set_defaults(handler=_cmd_db_downgrade)

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
        _typed_arguments(admit, "--args", "arguments (a list or an object)")
        admit.add_argument("--request-id", help="the command key that makes retries safe")
        admit.add_argument("--run", help="select this run (run scope) instead of the current one")
        admit.set_defaults(handler=_cmd_admit)

    complete = commands.add_parser("complete-update", help="complete (or fail) an accepted update")
    _instance_arguments(complete)
    complete.add_argument("update_id", metavar="UPDATE_ID")
    _typed_arguments(complete, "--result", "the result (default null)")
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
    prune.set_defaults(handler=_cmd_prune)

    serve = commands.add_parser("serve", help="serve the HTTP API with uvicorn (needs the http extra)")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default: loopback only)")
    serve.add_argument("--port", type=int, default=8000, help="port to listen on (default 8000)")
    serve.add_argument(
        "--log-level", default="info", choices=("critical", "error", "warning", "info", "debug")
    )
    serve.add_argument("--access-log", action="store_true", help="log every request on stderr")
    serve.set_defaults(handler=_cmd_serve)

    demo = commands.add_parser("demo", help="play a lost response, a retry, a conflict and a burst")
    demo.add_argument("--workers", type=int, default=8, help="concurrent callers in the burst (default 8)")
    demo.set_defaults(handler=_cmd_demo)

    _worker_parser(commands)
    _jobs_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code."""
    args = build_parser().parse_args(argv)
    try:
        code: int = args.handler(args)
    except _InputError as exc:
        print(f"admission: {exc}", file=sys.stderr)
        return EXIT_INVALID
    except SchemaRevisionError as exc:
        print(f"admission: {exc}", file=sys.stderr)
        return EXIT_SCHEMA
    except (WorkerLockedError, LeaseHeldError, FencedError) as exc:
        print(f"admission: {exc}", file=sys.stderr)
        return EXIT_OWNED
    except (RunStateError, JobStateError, QueueFullError, ScopeMismatchError, RecordStateError) as exc:
        print(f"admission: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    except StorageError as exc:
        print(f"admission: {exc}", file=sys.stderr)
        return EXIT_STORAGE
    except AdmissionError as exc:
        print(f"admission: {exc}", file=sys.stderr)
        return EXIT_INVALID
    return code
