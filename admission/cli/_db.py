"""``admission db``: upgrade, check and downgrade the schema revision (alembic), adopt unstamped tables,
rebase the event log after a move to another cluster."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from admission.cli._common import (
    EXIT_DRIFTED,
    EXIT_FINDINGS,
    EXIT_OK,
    EXIT_REFUSED,
    EXIT_SCHEMA,
    EXIT_UNSTAMPED,
    Commands,
    db_url,
    engine_options,
    print_error,
    print_json,
)
from admission.errors import (
    AdmissionError,
    SchemaDriftError,
    SchemaRevisionError,
    StateError,
    UnstampedSchemaError,
)

if TYPE_CHECKING:
    from sqlalchemy import Engine

    from admission.receipts import EventCursor

__all__ = ["add_parser"]


def _cmd_db_upgrade(args: argparse.Namespace) -> int:
    from admission.sql import create_admission_engine, masked_url, revision_of, upgrade

    if args.sql:
        return _print_upgrade_sql(args)
    if args.adopt:
        return _adopt(args)
    engine = create_admission_engine(db_url(args), **engine_options(args))
    before = revision_of(engine)
    after = upgrade(engine, args.revision)
    engine.dispose()
    print_json({"database": masked_url(db_url(args)), "from_revision": before, "revision": after})
    return EXIT_OK


def _print_upgrade_sql(args: argparse.Namespace) -> int:
    # The SQL itself on stdout, not JSON: it is what a reviewer reads and a DBA runs.
    from admission.sql import create_admission_engine, upgrade_sql

    engine = create_admission_engine(db_url(args), **engine_options(args))
    try:
        print(upgrade_sql(engine, args.revision), end="")
    finally:
        engine.dispose()
    return EXIT_OK


def _adopt(args: argparse.Namespace) -> int:
    from admission.sql import adopt, create_admission_engine, masked_url

    engine = create_admission_engine(db_url(args), **engine_options(args))
    database = masked_url(db_url(args))
    try:
        report = adopt(engine, args.revision)
    except SchemaDriftError as exc:
        # Every difference in the report, one per entry; the failure itself is one line.
        print_json({"database": database, "compared_with": exc.compared_with, "differences": exc.differences})
        print_error(exc)
        return EXIT_DRIFTED
    finally:
        engine.dispose()
    print_json(
        {
            "database": database,
            "from_revision": None,
            "adopted": report.adopted,
            "tables": report.tables,
            "revision": report.revision,
        }
    )
    return EXIT_OK


def _cmd_db_downgrade(args: argparse.Namespace) -> int:
    from admission.sql import create_admission_engine, downgrade, masked_url, revision_of

    engine = create_admission_engine(db_url(args), **engine_options(args))
    before = revision_of(engine)
    try:
        after = downgrade(engine, args.revision, allow_unsafe=args.allow_unsafe)
    except AdmissionError:
        raise  # a storage or schema error is one too, and keeps its own exit code (5, 3)
    except RuntimeError as exc:
        print_error(exc)
        return EXIT_REFUSED
    finally:
        engine.dispose()
    print_json({"database": masked_url(db_url(args)), "from_revision": before, "revision": after})
    return EXIT_OK


def _cmd_db_check(args: argparse.Namespace) -> int:
    from admission.sql import HEAD_REVISION, check_revision, create_admission_engine, masked_url, revision_of

    engine = create_admission_engine(db_url(args), **engine_options(args))
    database = masked_url(db_url(args))
    try:
        revision = revision_of(engine)
        report: dict[str, object] = {"database": database, "revision": revision, "head": HEAD_REVISION}
        try:
            with engine.connect() as conn:
                check_revision(conn)
        except SchemaRevisionError as exc:
            report["ok"] = False
            report["message"] = str(exc)
            print_json(report)
            return EXIT_UNSTAMPED if isinstance(exc, UnstampedSchemaError) else EXIT_SCHEMA
        if args.deep:
            return _deep_check(engine, report, args.max_findings)
    finally:
        engine.dispose()
    report["ok"] = True
    print_json(report)
    return EXIT_OK


def _deep_check(engine: Engine, report: dict[str, object], max_findings: int) -> int:
    """The audit of a database at the head: exit 0 with nothing but notes, 8 with any fault."""
    from admission.sql import audit

    found = audit(engine, max_findings=max_findings)
    report.update(found.to_dict())
    print_json(report)
    if found.ok:
        return EXIT_OK
    faults = ", ".join(f"{kind} {count}" for kind, count in found.faults.items())
    print_error(f"the audit found faults ({faults}); each finding is listed on standard output")
    return EXIT_FINDINGS


def _cmd_db_rebase_events(args: argparse.Namespace) -> int:
    from admission.sql import create_admission_engine, masked_url, rebase_event_log

    engine = create_admission_engine(db_url(args), **engine_options(args))
    try:
        report = rebase_event_log(engine, args.cursor)
    except StateError as exc:
        print_error(exc)
        return EXIT_REFUSED
    finally:
        engine.dispose()
    if not report.needed:
        print_error(
            "the event log needs no rebase: every transaction id it and its cursors hold is below this "
            "server's next one, and every position sequence is past its table's positions; nothing changed"
        )
        return EXIT_REFUSED
    print_json(
        {
            "database": masked_url(db_url(args)),
            "next_tx_id": report.next_tx_id,
            "rebased": report.rebased,
            "events": report.events,
            "consumers": [
                {"consumer": name, "before": _cursor_json(before), "after": _cursor_json(after)}
                for name, before, after in report.consumers
            ],
            "cursors": [{"before": _cursor_json(b), "after": _cursor_json(a)} for b, a in report.cursors],
            "sequences": list(report.sequences),
        }
    )
    return EXIT_OK


def _cursor_json(cursor: EventCursor) -> dict[str, int]:
    return {"tx_id": cursor.tx_id, "position": cursor.position}


def _event_cursor(text: str) -> EventCursor:
    from admission.receipts import EventCursor

    tx_id, sep, position = text.partition(":")
    try:
        values = (int(tx_id, 10), int(position, 10)) if sep else None
    except ValueError:
        values = None
    if values is None or min(values) < 0:
        raise argparse.ArgumentTypeError(f"expected TX_ID:POSITION, two whole numbers, got {text!r}")
    return EventCursor(*values)


def _count(text: str) -> int:
    try:
        value = int(text, 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected 0 or more, got {value}")
    return value


def add_parser(commands: Commands) -> None:
    """Add ``db upgrade``, ``db check``, ``db downgrade`` and ``db rebase-events``."""
    db = commands.add_parser("db", help="schema revisions (alembic)")
    db_commands = db.add_subparsers(dest="db_command", required=True, metavar="ACTION")
    db_upgrade = db_commands.add_parser("upgrade", help="upgrade the schema (to the head by default)")
    db_upgrade.add_argument("--revision", default="head")
    # Printing the SQL and adopting are two different runs: one at a time.
    how = db_upgrade.add_mutually_exclusive_group()
    how.add_argument(
        "--sql",
        action="store_true",
        help="print the SQL the upgrade would run, from the database's revision, and change nothing",
    )
    how.add_argument(
        "--adopt",
        action="store_true",
        help="adopt admission's tables that have no stamp: compare them with revision 0001, then "
        "stamp and upgrade them in one transaction (exit 7, changing nothing, if they differ)",
    )
    db_upgrade.set_defaults(handler=_cmd_db_upgrade)
    db_check = db_commands.add_parser(
        "check",
        help="print the revision; exit 3 unless it is the head, 6 if admission's tables have no stamp",
    )
    db_check.add_argument(
        "--deep",
        action="store_true",
        help="also audit every row, read-only: re-verify each stored digest from its stored bytes, "
        "every event and reference; exit 8 if anything is wrong (docs/cli.md)",
    )
    db_check.add_argument(
        "--max-findings",
        type=_count,
        default=1000,  # DEFAULT_MAX_FINDINGS, without importing SQLAlchemy to build the parser
        metavar="N",
        help="--deep: list at most N findings (the counts stay exact; default 1000)",
    )
    db_check.set_defaults(handler=_cmd_db_check)
    db_downgrade = db_commands.add_parser("downgrade", help="downgrade (see docs/upgrading.md first)")
    db_downgrade.add_argument("revision", metavar="REVISION")
    db_downgrade.add_argument(
        "--allow-unsafe",
        action="store_true",
        help="downgrade even though receipts with intent digests, worker records or jobs exist",
    )
    db_downgrade.set_defaults(handler=_cmd_db_downgrade)
    db_rebase = db_commands.add_parser(
        "rebase-events",
        help="after moving a PostgreSQL database to another cluster, with its writers and readers "
        "stopped: rewrite the event log's transaction ids below the new cluster's, keeping every "
        "cursor's place, and move position sequences up (exit 4 if nothing needs it; docs/event-log.md)",
    )
    db_rebase.add_argument(
        "--cursor",
        type=_event_cursor,
        action="append",
        default=[],
        metavar="TX_ID:POSITION",
        help="a reader's own cursor to carry over too (repeatable); the output gives its new value",
    )
    db_rebase.set_defaults(handler=_cmd_db_rebase_events)
