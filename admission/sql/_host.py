"""For a host project whose own alembic environment includes admission's revisions.

The recipe in ``alembic/`` (docs/upgrading.md) lists admission's packaged
revisions in its ``version_locations`` and makes its own revisions depend on
the ``admission`` branch; admission's head is then one of the host's heads in
the host's version table.  Two helpers make that safe: ``host_include_object``
keeps admission's tables out of the host's autogenerate, and
``prepare_host_database`` hands the host's alembic a database whose
admission revision is stamped elsewhere (by ``admission db upgrade``, or by
an earlier build).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import inspect
from sqlalchemy.engine import Connection

from admission.errors import SchemaRevisionError
from admission.sql._revisions import (
    HOST_VERSION_TABLE,
    VERSION_TABLE,
    StampPlace,
    find_stamp,
    refuse_unstamped,
    version_table_of,
)
from admission.sql._schema import metadata

__all__ = ["ADMISSION_TABLES", "host_include_object", "prepare_host_database"]

ADMISSION_TABLES = frozenset({*metadata.tables, VERSION_TABLE})
"""Every table admission's revisions create, its own version table included."""


def host_include_object(obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any) -> bool:
    """alembic's ``include_object`` hook: ``False`` for admission's tables and what they hold.

    Pass it to ``context.configure`` in the host's ``env.py`` so that
    ``alembic revision --autogenerate`` proposes nothing about them.
    """
    if type_ == "table":
        return name not in ADMISSION_TABLES
    table = getattr(obj, "table", None)
    return getattr(table, "name", None) not in ADMISSION_TABLES


def prepare_host_database(connection: Connection, version_table: str = HOST_VERSION_TABLE) -> None:
    """Put admission's stamp among the host's heads, if it is kept anywhere else.

    Call it in the host's ``env.py`` inside ``context.begin_transaction()``,
    before ``context.run_migrations()``.  A stamp in
    ``admission_alembic_version`` moves to ``version_table`` (and the own
    table goes); an earlier build's id (``0004``) in ``version_table`` is
    rewritten as today's (``admission_0004``).  admission's tables with no
    stamp at all are refused (:class:`~admission.errors.UnstampedSchemaError`:
    adopt them first with ``admission db upgrade --adopt``).  Anything else
    is left alone, so the call is cheap to repeat.
    """
    stamp = find_stamp(connection)
    if stamp is None:
        # Tables an older engine left with no stamp would make the host's
        # upgrade create them again: they are adopted first, by admission.
        refuse_unstamped(connection)
        return
    if stamp.place is StampPlace.HOST:
        return
    if version_table != HOST_VERSION_TABLE and stamp.place is StampPlace.LEGACY:
        raise SchemaRevisionError(
            f"an earlier admission stamped {stamp.stamped} in {HOST_VERSION_TABLE}, and the host "
            f"keeps its heads in {version_table}; run `admission db upgrade --db URL` first",
            revision=stamp.revision,
        )
    host = version_table_of(version_table)
    source = version_table_of(stamp.table)
    if not inspect(connection).has_table(version_table):
        host.create(connection)
    connection.execute(source.delete().where(source.c.version_num == stamp.stamped))
    connection.execute(host.insert().values(version_num=stamp.revision))
    if stamp.place is StampPlace.OWN:
        source.drop(connection)
