"""Schema migrations: alembic, run on admission's own packaged revisions.

``upgrade`` and ``downgrade`` are what ``admission db upgrade`` and
``admission db downgrade`` call.  Nothing here runs at start-up: opening a
store only checks the revision (contract §6).  The revision is stamped in
admission's own version table (``admission.sql._revisions``); a stamp an
earlier build left in ``alembic_version`` is moved there first, in the same
transaction as the migration.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from sqlalchemy import Connection, Engine

from admission.errors import SchemaRevisionError, StorageError
from admission.sql._engine import schema_of, wrap_exceptions
from admission.sql._revisions import (
    HOST_VERSION_TABLE,
    KNOWN_REVISIONS,
    VERSION_TABLE,
    StampPlace,
    current_revision,
    find_stamp,
    move_legacy_stamp,
    refuse_unstamped,
    revision_id,
)

if TYPE_CHECKING:
    # Alembic is imported where a migration runs: every store and command
    # that only reads the revision starts without it.
    from alembic.config import Config

__all__ = ["alembic_config", "downgrade", "revision_of", "upgrade"]


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


def _migrate(
    engine: Engine,
    config: Config,
    step: Callable[[Config], None],
    *,
    adopt: Callable[[Connection], None] | None = None,
) -> None:
    # ``adopt`` (admission.sql._adopt) runs first in the migration's transaction,
    # on admission's tables that have no stamp; without it they are refused.
    with _connected(engine) as conn:
        stamp = find_stamp(conn)
        if stamp is None and adopt is None:
            refuse_unstamped(conn)
        conn.rollback()  # end the read's implicit transaction before the migration's own
        if stamp is not None and stamp.revision not in KNOWN_REVISIONS:
            raise SchemaRevisionError(
                f"the database is at schema revision {stamp.revision!r}, which this version of admission "
                "does not know; use the admission release that wrote it",
                revision=stamp.revision,
            )
        if stamp is not None and stamp.place is StampPlace.HOST:
            # The host's alembic owns that table and knows revisions admission
            # cannot locate: it runs admission's revisions itself.
            raise SchemaRevisionError(
                f"admission's revision {stamp.revision} is kept among a host project's heads in "
                f"{HOST_VERSION_TABLE}; upgrade it with the host's alembic (`alembic upgrade heads`)",
                revision=stamp.revision,
            )
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


def upgrade(engine: Engine, revision: str = "head") -> str | None:
    """Upgrade the database to ``revision`` (the head by default); returns the new revision.

    ``0002`` is short for ``admission_0002``.  A stamp an earlier build left
    in ``alembic_version`` is moved to admission's own table first.
    """
    from alembic import command

    target = revision_id(revision)
    _migrate(engine, alembic_config(engine), lambda config: command.upgrade(config, target))
    return revision_of(engine)


def downgrade(engine: Engine, revision: str, *, allow_unsafe: bool = False) -> str | None:
    """Downgrade to ``revision``.

    Refused once receipts with intent digests exist (below ``0002``), any
    worker record (below ``0003``) or any job (below ``0004``), unless ``allow_unsafe`` (docs/upgrading.md
    explains why an older writer is then unsafe).
    """
    from alembic import command

    config = alembic_config(engine, x_arguments={"allow-unsafe-downgrade": "yes"} if allow_unsafe else None)
    target = revision_id(revision)
    _migrate(engine, config, lambda c: command.downgrade(c, target))
    return revision_of(engine)


def revision_of(engine: Engine) -> str | None:
    """The revision stamped in the database (``None`` before the first upgrade)."""
    with _connected(engine) as conn:
        return current_revision(conn)
