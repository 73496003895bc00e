"""Where admission keeps its schema revision, and the check every store makes.

admission's alembic revisions are ``admission_0001`` to ``admission_0007``
under the branch label ``admission``, stamped in a version table of its own,
``admission_alembic_version``: a host engine that runs its own alembic on the
same database keeps its ``alembic_version`` to itself (docs/upgrading.md).

Two other places are recognised, so that no database written before is lost:

- **legacy**: builds before the own table stamped ``0001`` to ``0004`` in the
  default ``alembic_version``.  A store refuses such a database with the
  command that moves the stamp (``admission db upgrade``), and that command
  moves it, once, changing nothing else.
- **host**: a host project that includes admission's revisions in its own
  alembic environment (the recipe in ``alembic/``) keeps admission's head
  among its own heads, in its own version table.  admission finds it there by
  its ids, which no host revision can carry.

A database may also hold admission's tables and no stamp anywhere: engines
that never used alembic created the receipt tables themselves.  It is told
apart from an empty one by admission's table names, and refused with the
command that adopts it (``admission db upgrade --adopt``, in ``_adopt``).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Final

from sqlalchemy import Column, MetaData, PrimaryKeyConstraint, String, Table, inspect, select
from sqlalchemy.engine import Connection
from sqlalchemy.schema import CreateTable, DropTable
from sqlalchemy.sql.expression import Executable

from admission.errors import InputError, SchemaRevisionError, UnstampedSchemaError
from admission.sql._schema import metadata

__all__ = [
    "ADOPT_COMMAND",
    "BRANCH_LABEL",
    "HEAD_REVISION",
    "HOST_VERSION_TABLE",
    "KNOWN_REVISIONS",
    "LEGACY_REVISIONS",
    "VERSION_TABLE",
    "Stamp",
    "StampPlace",
    "admission_tables_in",
    "check_revision",
    "current_revision",
    "find_stamp",
    "legacy_stamp_move",
    "move_legacy_stamp",
    "refuse_unstamped",
    "revision_id",
    "upgrade_command",
    "version_table_of",
]

BRANCH_LABEL: Final = "admission"
"""The alembic branch label every admission revision carries."""

KNOWN_REVISIONS: Final = (
    "admission_0001",
    "admission_0002",
    "admission_0003",
    "admission_0004",
    "admission_0005",
    "admission_0006",
    "admission_0007",
)
"""Every revision admission has shipped, oldest first."""

HEAD_REVISION: Final = KNOWN_REVISIONS[-1]
"""The schema revision this version of admission reads and writes."""

VERSION_TABLE: Final = "admission_alembic_version"
"""The table where ``admission db upgrade`` stamps admission's revision."""

HOST_VERSION_TABLE: Final = "alembic_version"
"""alembic's default version table: a host's, or a legacy admission stamp."""

_SHORT_IDS: Final = {name.removeprefix("admission_"): name for name in KNOWN_REVISIONS}

LEGACY_REVISIONS: Final = {short: _SHORT_IDS[short] for short in ("0001", "0002", "0003", "0004")}
"""The ids earlier builds stamped in ``alembic_version``, and what each is now (those builds
ended at ``0004``: no build ever stamped a later short id there)."""

ADOPT_COMMAND: Final = "admission db upgrade --adopt --db URL"
"""The command that adopts admission's tables left without a stamp."""


class StampPlace(enum.StrEnum):
    """Where a database keeps admission's revision."""

    OWN = "own"
    """``admission_alembic_version``: written by ``admission db upgrade``."""
    HOST = "host"
    """Among a host's heads in ``alembic_version``: the host's alembic upgrades it."""
    LEGACY = "legacy"
    """``alembic_version`` holding an id of an earlier build: ``admission db upgrade`` moves it."""


@dataclass(frozen=True, slots=True)
class Stamp:
    """admission's revision as a database records it."""

    revision: str
    """admission's revision id (a legacy id is given as the revision it names now)."""
    place: StampPlace
    table: str
    stamped: str
    """The id as written in ``table``."""


def version_table_of(name: str) -> Table:
    """A version table named ``name``, in alembic's own shape and constraint name."""
    return Table(
        name,
        MetaData(),
        Column("version_num", String(32), nullable=False),
        PrimaryKeyConstraint("version_num", name=f"{name}_pkc"),
    )


def _stamped(connection: Connection, name: str) -> list[str]:
    if not inspect(connection).has_table(name):
        return []
    return [str(row) for row in connection.execute(select(version_table_of(name).c.version_num)).scalars()]


def find_stamp(connection: Connection) -> Stamp | None:
    """Where and at which revision the database records admission's schema, if anywhere.

    Raises :class:`SchemaRevisionError` when the places disagree: two stamps
    of admission at once, or a version table of admission's own that holds
    anything but one known revision.
    """
    own = _stamped(connection, VERSION_TABLE)
    host_rows = _stamped(connection, HOST_VERSION_TABLE)
    ours_in_host = [row for row in host_rows if row.startswith("admission_")]
    if own:
        if len(own) != 1:
            raise SchemaRevisionError(
                f"{VERSION_TABLE} holds {len(own)} rows; expected exactly one", revision=None
            )
        if ours_in_host:
            raise SchemaRevisionError(
                f"admission's revision is stamped twice: {own[0]} in {VERSION_TABLE} and "
                f"{ours_in_host[0]} in {HOST_VERSION_TABLE}; keep the one the database matches "
                "(docs/upgrading.md, 'Inside a host's alembic')",
                revision=own[0],
            )
        return Stamp(own[0], StampPlace.OWN, VERSION_TABLE, own[0])
    if len(ours_in_host) > 1:
        raise SchemaRevisionError(
            f"{HOST_VERSION_TABLE} holds {len(ours_in_host)} admission heads; expected one",
            revision=None,
        )
    if ours_in_host:
        return Stamp(ours_in_host[0], StampPlace.HOST, HOST_VERSION_TABLE, ours_in_host[0])
    if len(host_rows) == 1 and host_rows[0] in LEGACY_REVISIONS:
        # Earlier builds owned the default table alone: one row, one of their ids.
        return Stamp(LEGACY_REVISIONS[host_rows[0]], StampPlace.LEGACY, HOST_VERSION_TABLE, host_rows[0])
    return None


def admission_tables_in(connection: Connection) -> tuple[str, ...]:
    """The tables of any admission revision the database holds, version tables aside, sorted."""
    return tuple(sorted(set(inspect(connection).get_table_names()) & set(metadata.tables)))


def refuse_unstamped(connection: Connection) -> None:
    """Raise :class:`UnstampedSchemaError` if admission's tables are there with no stamp.

    Call it when :func:`find_stamp` found none: a database with none of
    admission's tables is empty as far as admission is concerned (a version
    table that a downgrade to ``base`` left empty included).
    """
    tables = admission_tables_in(connection)
    if tables:
        raise UnstampedSchemaError(
            f"the database holds admission's tables ({', '.join(tables)}) but records no admission "
            f"revision; if an older engine created them, run `{ADOPT_COMMAND}`, which compares them "
            f"with revision {KNOWN_REVISIONS[0]} and stamps and upgrades them only if they match",
            tables=tables,
        )


def upgrade_command(stamp: Stamp) -> str:
    """The command that upgrades a database whose revision ``stamp`` records, as a hint shows it."""
    if stamp.place is StampPlace.HOST:
        # The host's alembic owns that table and knows revisions admission cannot locate.
        return "`alembic upgrade heads` in the host project"
    return "`admission db upgrade --db URL`"


def current_revision(connection: Connection) -> str | None:
    """admission's schema revision in the database, or ``None`` if it has none."""
    stamp = find_stamp(connection)
    return stamp.revision if stamp is not None else None


def check_revision(connection: Connection) -> str:
    """Refuse to run against a schema revision other than the head (contract §6).

    Nothing upgrades at start-up: an older revision, or a stamp in the place
    earlier builds used, names the upgrade command; admission's tables with
    no stamp name the adoption command (:class:`UnstampedSchemaError`); a
    newer or unknown revision is refused as well.
    """
    stamp = find_stamp(connection)
    if stamp is None:
        refuse_unstamped(connection)
        raise SchemaRevisionError(
            "the database has no admission schema; run `admission db upgrade --db URL`",
            revision=None,
        )
    if stamp.place is StampPlace.LEGACY:
        raise SchemaRevisionError(
            f"the database keeps admission's revision {stamp.stamped} in {HOST_VERSION_TABLE}, "
            f"where earlier builds stamped it; run `admission db upgrade --db URL` to move it to "
            f"{VERSION_TABLE} and upgrade",
            revision=stamp.revision,
        )
    if stamp.revision == HEAD_REVISION:
        return stamp.revision
    if stamp.revision in KNOWN_REVISIONS:
        raise SchemaRevisionError(
            f"the database is at schema revision {stamp.revision}, older than {HEAD_REVISION}; "
            f"back it up, then run {upgrade_command(stamp)}",
            revision=stamp.revision,
        )
    raise SchemaRevisionError(
        f"the database is at schema revision {stamp.revision!r}, which this version of admission "
        f"does not know (it knows {', '.join(KNOWN_REVISIONS)}); use the admission release "
        "that wrote it",
        revision=stamp.revision,
    )


def move_legacy_stamp(connection: Connection, stamp: Stamp) -> None:
    """Move a stamp of an earlier build into admission's own version table.

    Runs in the caller's transaction: the row leaves ``alembic_version`` (the
    table goes too, being empty and admission's alone) and the revision it
    names lands in ``admission_alembic_version``.  Nothing else changes.
    """
    for statement in legacy_stamp_move(stamp):
        connection.execute(statement)


def legacy_stamp_move(stamp: Stamp) -> list[Executable]:
    """The statements :func:`move_legacy_stamp` runs, in order, for ``stamp``.

    Given as statements so that ``admission db upgrade --sql`` prints the very
    move the online upgrade makes.
    """
    if stamp.place is not StampPlace.LEGACY:
        raise ValueError(f"not a legacy stamp: {stamp}")
    own = version_table_of(VERSION_TABLE)
    legacy = version_table_of(HOST_VERSION_TABLE)
    return [
        CreateTable(own),
        own.insert().values(version_num=stamp.revision),
        legacy.delete().where(legacy.c.version_num == stamp.stamped),
        DropTable(legacy),
    ]


def revision_id(name: str) -> str:
    """The alembic id for a revision a user names: ``0002`` is short for ``admission_0002``.

    ``head``, ``base``, relative steps and full ids pass unchanged.
    """
    if not isinstance(name, str) or not name:
        raise InputError("expected a revision id such as 0004 or admission_0004, or head", field="revision")
    return _SHORT_IDS.get(name, name)
