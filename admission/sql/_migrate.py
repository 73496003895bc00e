"""Schema migrations: alembic, run on admission's own packaged revisions.

``upgrade`` and ``downgrade`` are what ``admission db upgrade`` and
``admission db downgrade`` call.  Nothing here runs at start-up: opening a
store only checks the revision (contract §6).  The revision is stamped in
admission's own version table (``admission.sql._revisions``); a stamp an
earlier build left in ``alembic_version`` is moved there first, in the same
transaction as the migration.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from sqlalchemy import Connection, Engine
from sqlalchemy.sql.expression import Executable

from admission.errors import InputError, SchemaRevisionError, StorageError
from admission.sql._engine import schema_of, wrap_exceptions
from admission.sql._revisions import (
    HEAD_REVISION,
    HOST_VERSION_TABLE,
    KNOWN_REVISIONS,
    VERSION_TABLE,
    Stamp,
    StampPlace,
    current_revision,
    find_stamp,
    legacy_stamp_move,
    move_legacy_stamp,
    refuse_unstamped,
    revision_id,
    upgrade_command,
)

if TYPE_CHECKING:
    # Alembic is imported where a migration runs: every store and command
    # that only reads the revision starts without it.
    from alembic.config import Config

__all__ = ["alembic_config", "downgrade", "revision_of", "upgrade", "upgrade_sql"]


def alembic_config(engine: Engine, *, x_arguments: dict[str, str] | None = None) -> Config:
    """An alembic configuration for admission's packaged migrations on ``engine``."""
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", "admission.sql:migrations")
    config.attributes["engine"] = engine
    config.attributes["version_table"] = VERSION_TABLE
    if x_arguments:
        config.cmd_opts = _XArguments([f"{k}={v}" for k, v in x_arguments.items()])  # type: ignore[assignment]
    return config


class _XArguments:
    """What alembic reads for ``-x`` options when run from code."""

    def __init__(self, x: list[str]) -> None:
        self.x = x


@contextmanager
def _connected(engine: Engine) -> Iterator[Connection]:
    # Migrations run outside every store: the driver's errors become admission's
    # at the same boundary the stores wear, keeping the cause.
    with wrap_exceptions(engine.dialect), engine.connect() as conn:
        yield conn


def _migratable_stamp(conn: Connection, target: str | None = None, *, adopting: bool = False) -> Stamp | None:
    """The database's stamp, refused unless admission's own commands may migrate from it.

    A stamp among a host's heads passes only when it is at ``target`` already:
    there is nothing for admission to do then.  admission's tables without a
    stamp are refused unless they are being adopted.
    """
    stamp = find_stamp(conn)
    if stamp is None and not adopting:
        refuse_unstamped(conn)
    conn.rollback()  # end the read's implicit transaction before the migration's own
    if stamp is not None and stamp.revision not in KNOWN_REVISIONS:
        raise SchemaRevisionError(
            f"the database is at schema revision {stamp.revision!r}, which this version of admission "
            "does not know; use the admission release that wrote it",
            revision=stamp.revision,
        )
    if stamp is not None and stamp.place is StampPlace.HOST:
        if target is not None and stamp.revision == (HEAD_REVISION if target == "head" else target):
            return stamp
        raise SchemaRevisionError(
            f"admission's revision {stamp.revision} is kept among a host project's heads in "
            f"{HOST_VERSION_TABLE}; upgrade it with {upgrade_command(stamp)}",
            revision=stamp.revision,
        )
    return stamp


def _migrate(
    engine: Engine,
    config: Config,
    step: Callable[[Config], None],
    target: str,
    *,
    adopt: Callable[[Connection], None] | None = None,
) -> None:
    # ``adopt`` (admission.sql._adopt) runs first in the migration's transaction,
    # on admission's tables that have no stamp; without it they are refused.
    with _connected(engine) as conn:
        stamp = _migratable_stamp(conn, target, adopting=adopt is not None)
        if stamp is not None and stamp.place is StampPlace.HOST:
            return  # at the target already, in the host's table: nothing to do
        schema = schema_of(engine)
        sqlite = conn.dialect.name == "sqlite"
        if sqlite:
            # SQLite rebuilds a table to drop a column, and the rebuild's DROP
            # TABLE trips foreign keys; they can only be switched off outside a
            # transaction, and are checked as a whole before commit instead.
            conn.connection.driver_connection.execute("PRAGMA foreign_keys=OFF")  # type: ignore[union-attr]
        try:
            with conn.begin():
                if schema is not None:
                    conn.exec_driver_sql(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
                if stamp is not None and stamp.place is StampPlace.LEGACY:
                    move_legacy_stamp(conn, stamp)
                if adopt is not None:
                    adopt(conn)
                config.attributes["connection"] = conn
                step(config)
                if sqlite:
                    _check_foreign_keys(conn)
        finally:
            if sqlite:
                conn.connection.driver_connection.execute("PRAGMA foreign_keys=ON")  # type: ignore[union-attr]


def _check_foreign_keys(conn: Connection) -> None:
    violations = conn.exec_driver_sql("PRAGMA foreign_key_check").fetchall()
    if violations:
        raise StorageError(f"the migration would break {len(violations)} foreign keys; nothing was changed")


@contextmanager
def _unknown_revision_refused(revision: str) -> Iterator[None]:
    # The stamp was checked before alembic ran: what alembic cannot resolve
    # now is the revision the caller named, refused as input.
    from alembic.util import CommandError

    try:
        yield
    except CommandError as exc:
        raise InputError(f"cannot migrate to {revision!r}: {exc}", field="revision") from exc


def upgrade(engine: Engine, revision: str = "head") -> str | None:
    """Upgrade the database to ``revision`` (the head by default); returns the new revision.

    ``0002`` is short for ``admission_0002``.  A stamp an earlier build left
    in ``alembic_version`` is moved to admission's own table first.
    """
    from alembic import command

    target = revision_id(revision)
    with _unknown_revision_refused(revision):
        _migrate(engine, alembic_config(engine), lambda config: command.upgrade(config, target), target)
    return revision_of(engine)


def upgrade_sql(engine: Engine, revision: str = "head") -> str:
    """The SQL :func:`upgrade` would run, as a script to review; nothing is changed.

    The database is only read, for the revision it is at: the script goes
    from there to ``revision`` (the head by default).  alembic renders it
    offline for the engine's dialect, with literal values, in one transaction
    (``BEGIN`` ... ``COMMIT``), after a comment naming both revisions.  It
    holds everything the online upgrade runs: first, with a PostgreSQL schema
    (``create_admission_engine(schema=...)``), ``CREATE SCHEMA IF NOT EXISTS``
    and ``SET LOCAL search_path`` to it; then the move of a legacy stamp from
    ``alembic_version`` to ``admission_alembic_version``; then each revision
    and its stamp.

    The script assumes the revision it was read at: run it once, on that
    database, before anything else upgrades it.  At ``revision`` already, or
    past it, the transaction is empty, as :func:`upgrade` then changes
    nothing.  A revision admission does not know raises
    :class:`~admission.errors.InputError` (``field`` ``revision``); an
    unknown stamp, or one a host's alembic keeps, :class:`SchemaRevisionError`.
    """
    from alembic import command
    from alembic.util import CommandError

    target = revision_id(revision)
    with _connected(engine) as conn:
        stamp = _migratable_stamp(conn)
    prelude: list[str | Executable] = []
    schema = schema_of(engine)
    if schema is not None:
        # Online, each connection starts in the schema; a hand-run script does not.
        prelude += [f'CREATE SCHEMA IF NOT EXISTS "{schema}"', f'SET LOCAL search_path TO "{schema}"']
    if stamp is not None and stamp.place is StampPlace.LEGACY:
        prelude += legacy_stamp_move(stamp)
    config = alembic_config(engine)
    config.output_buffer = buffer = io.StringIO()
    start = stamp.revision if stamp is not None else "no revision"
    buffer.write(f"-- admission db upgrade, {engine.dialect.name}: from {start} (read from the database) ")
    buffer.write(f"to {revision}\n\n")
    config.attributes["url"] = engine.url
    config.attributes["offline_prelude"] = prelude
    steps = target if stamp is None else f"{stamp.revision}:{target}"
    try:
        command.upgrade(config, steps, sql=True)
    except CommandError as exc:
        raise InputError(f"cannot upgrade from {start} to {revision}: {exc}", field="revision") from exc
    return buffer.getvalue()


def downgrade(engine: Engine, revision: str, *, allow_unsafe: bool = False) -> str | None:
    """Downgrade to ``revision``.

    Refused once receipts with intent digests exist (below ``0002``), any
    worker record (below ``0003``) or any job (below ``0004``), unless ``allow_unsafe`` (docs/upgrading.md
    explains why an older writer is then unsafe).
    """
    from alembic import command

    config = alembic_config(engine, x_arguments={"allow-unsafe-downgrade": "yes"} if allow_unsafe else None)
    target = revision_id(revision)
    with _unknown_revision_refused(revision):
        _migrate(engine, config, lambda c: command.downgrade(c, target), target)
    return revision_of(engine)


def revision_of(engine: Engine) -> str | None:
    """The revision stamped in the database (``None`` before the first upgrade)."""
    with _connected(engine) as conn:
        return current_revision(conn)
