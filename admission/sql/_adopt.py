"""Adopting admission's tables that an older engine left without a stamp.

Engines that never used alembic created the receipt tables of revision
``0001`` themselves and recorded no revision anywhere.  Only the tables'
shape can tell which revision they are, so adoption compares it with
revision ``0001`` as this dialect builds it, structurally: tables, columns
(type as the dialect compiles it, nullability, default), primary keys,
indexes, unique constraints, foreign keys and check constraints.

The reference is built by running revision ``0001``'s own operations into a
scratch place of the same dialect, and reflected with the same inspector as
the live tables: a private in-memory database on SQLite; on PostgreSQL a
schema of a random name, created inside a transaction that is rolled back
(which needs the ``CREATE`` privilege on the database).

On an exact match the tables are stamped at ``0001`` in
``admission_alembic_version`` and upgraded, in the one transaction of the
migration: the comparison, the stamp and the upgrade commit together or not
at all.  On any difference :class:`SchemaDriftError` lists every one, and
nothing changes.  Tables of other names (a host's) are never compared.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Final

from sqlalchemy import Engine, create_engine, inspect, text
from sqlalchemy.engine import Connection

from admission.errors import InputError, SchemaDriftError, SchemaRevisionError
from admission.sql._engine import is_postgresql, wrap_exceptions
from admission.sql._migrate import _connected, _migrate, alembic_config, revision_of
from admission.sql._revisions import (
    HEAD_REVISION,
    KNOWN_REVISIONS,
    VERSION_TABLE,
    admission_tables_in,
    find_stamp,
    revision_id,
    upgrade_command,
    version_table_of,
)

__all__ = ["ADOPTED_REVISION", "AdoptionReport", "adopt"]

ADOPTED_REVISION: Final = KNOWN_REVISIONS[0]
"""The revision adoption compares with and stamps: the receipt schema older engines created."""

_SHORT: Final = ADOPTED_REVISION.removeprefix("admission_")

Attributes = dict[str, object]
"""One element's reflected attributes (a column's type, an index's columns, ...)."""
TableShape = dict[str, Attributes]
"""A table's elements by label: ``column id``, ``index ix_...``, ``primary key``, ``table``."""
Shape = dict[str, TableShape]
"""Tables by name."""


@dataclass(frozen=True, slots=True)
class AdoptionReport:
    """What :func:`adopt` did: the tables it compared and stamped, and where it left them."""

    tables: tuple[str, ...]
    """The tables found identical to revision ``0001``, sorted."""
    adopted: str
    """The revision they were stamped at: :data:`ADOPTED_REVISION`."""
    revision: str | None
    """The revision after the upgrade (the head, unless another was asked for)."""


def adopt(engine: Engine, revision: str = "head") -> AdoptionReport:
    """Adopt admission's tables that no stamp records: compare, then stamp ``0001`` and upgrade.

    The tables must be exactly revision ``0001``'s (see the module's
    docstring for what is compared); then, in one transaction, the stamp
    lands in ``admission_alembic_version`` and the schema is upgraded to
    ``revision`` (the head by default; ``0001`` only stamps).

    Raises :class:`SchemaDriftError` listing every difference, and changes
    nothing, when the tables differ; :class:`SchemaRevisionError` when the
    database records a revision already (``admission db upgrade`` is the way
    on) or holds none of admission's tables (nothing to adopt).
    """
    from alembic import command

    target = _target(revision)
    with _connected(engine) as conn:
        _refuse_unless_unstamped(conn)
    reference = _reference_shape(engine)
    adopted: list[str] = []

    def stamp_if_identical(conn: Connection) -> None:
        # Checked again in the migration's transaction: what is stamped is what was compared.
        _refuse_unless_unstamped(conn)
        # admission's names only: a host's tables share the database and are not ours to judge.
        live = _describe_tables(conn, admission_tables_in(conn))
        differences = _differences(reference, live)
        if differences:
            raise SchemaDriftError(
                f"refusing to adopt: admission's tables differ from revision {ADOPTED_REVISION} "
                f"in {len(differences)} places, and nothing was changed: {'; '.join(differences)}",
                compared_with=ADOPTED_REVISION,
                differences=tuple(differences),
            )
        own = version_table_of(VERSION_TABLE)
        # A downgrade to base leaves the version table, empty; it is reused.
        own.create(conn, checkfirst=True)
        conn.execute(own.insert().values(version_num=ADOPTED_REVISION))
        adopted.extend(sorted(live))

    _migrate(
        engine, alembic_config(engine), lambda c: command.upgrade(c, target), target, adopt=stamp_if_identical
    )
    return AdoptionReport(tuple(adopted), ADOPTED_REVISION, revision_of(engine))


def _target(revision: str) -> str:
    target = revision_id(revision)
    if target not in ("head", "heads", *KNOWN_REVISIONS):
        raise InputError(
            f"adoption upgrades to the head or to a revision from {KNOWN_REVISIONS[0]} to "
            f"{HEAD_REVISION}, not {revision!r}",
            field="revision",
        )
    return target


def _refuse_unless_unstamped(conn: Connection) -> None:
    stamp = find_stamp(conn)
    if stamp is not None:
        raise SchemaRevisionError(
            f"nothing to adopt: the database records admission's revision {stamp.stamped} in "
            f"{stamp.table}; {upgrade_command(stamp)} upgrades it",
            revision=stamp.revision,
        )
    if not admission_tables_in(conn):
        raise SchemaRevisionError(
            "nothing to adopt: the database holds none of admission's tables; "
            "`admission db upgrade --db URL` creates them",
            revision=None,
        )


# -- the reference: revision 0001 as this dialect builds it -------------------------------------------


def _reference_shape(engine: Engine) -> Shape:
    with _scratch(engine) as (conn, schema):
        _run_revision(engine, conn, ADOPTED_REVISION)
        return _describe_tables(conn, inspect(conn).get_table_names(schema=schema), schema=schema)


@contextmanager
def _scratch(engine: Engine) -> Iterator[tuple[Connection, str | None]]:
    """A connection to an empty place of ``engine``'s dialect, forgotten afterwards."""
    if is_postgresql(engine.dialect):
        # DDL is transactional on PostgreSQL: the schema, its tables and their
        # sequences vanish with the rollback, and no other session sees them.
        name = f"admission_adopt_{secrets.token_hex(6)}"
        with wrap_exceptions(engine.dialect), engine.connect() as conn, conn.begin() as transaction:
            conn.exec_driver_sql(f'CREATE SCHEMA "{name}"')
            conn.exec_driver_sql(f'SET LOCAL search_path TO "{name}"')
            try:
                yield conn, name
            finally:
                transaction.rollback()
        return
    # The same SQLite library as the live database: the same DDL, the same reflection.
    scratch = create_engine("sqlite://")
    try:
        with wrap_exceptions(scratch.dialect), scratch.connect() as conn:
            yield conn, None
    finally:
        scratch.dispose()


def _run_revision(engine: Engine, conn: Connection, revision: str) -> None:
    # The revision's own upgrade(), through alembic's operations on this
    # connection: no version table, no env.py, nothing but its DDL.
    from alembic.migration import MigrationContext
    from alembic.operations import Operations
    from alembic.script import ScriptDirectory

    script = ScriptDirectory.from_config(alembic_config(engine)).get_revision(revision)
    if script is None:  # pragma: no cover - the packaged revisions always hold it
        raise SchemaRevisionError(f"revision {revision} is not packaged", revision=None)
    with Operations.context(MigrationContext.configure(conn)):
        script.module.upgrade()


# -- reflection, normalised --------------------------------------------------------------------------

_SPACES: Final = re.compile(r"\s+")
_AUTOINCREMENT: Final = re.compile(r"\bAUTOINCREMENT\b", re.IGNORECASE)


def _describe_tables(conn: Connection, tables: Sequence[str], *, schema: str | None = None) -> Shape:
    """The structure of ``tables`` as plain, comparable data, read with SQLAlchemy's inspector.

    Types are compared as the dialect compiles them; names of ``schema``
    (where the reference was built) are taken out of defaults and foreign
    keys, so that the same DDL in two schemas describes the same.  Comments
    are left out: they change no behaviour.
    """
    inspector = inspect(conn)
    return {table: _describe(conn, inspector, table, schema) for table in tables}


def _plain(value: Any, schema: str | None = None) -> Any:
    if value is None or isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, Mapping):
        return {str(k): _plain(v, schema) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, (list, tuple)):
        return [_plain(v, schema) for v in value]
    words = _SPACES.sub(" ", str(value)).strip()
    if schema is not None:
        words = words.replace(f'"{schema}".', "").replace(f"{schema}.", "")
    return words


def _present(attributes: Mapping[str, Any]) -> Attributes:
    # A key one dialect leaves out and another reports empty means the same.
    return {k: v for k, v in attributes.items() if v not in (None, [], {}, "")}


def _describe(conn: Connection, inspector: Any, table: str, schema: str | None) -> TableShape:
    shape: TableShape = {}
    options = _plain(inspector.get_table_options(table, schema=schema))
    if not is_postgresql(conn.dialect):
        # SQLite reports AUTOINCREMENT nowhere else; 0001 relies on it so that
        # event positions are never reused.
        sql = conn.execute(
            text("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = :name"), {"name": table}
        ).scalar()
        options["sqlite_autoincrement"] = bool(sql and _AUTOINCREMENT.search(sql))
    shape["table"] = _present(options)
    for column in inspector.get_columns(table, schema=schema):
        collation = column.get("collation") or getattr(column["type"], "collation", None)
        shape[f"column {column['name']}"] = {
            "type": _plain(column["type"].compile(dialect=conn.dialect)).upper(),
            "nullable": bool(column["nullable"]),
            "default": _plain(column.get("default"), schema),
            **_present(
                {
                    "autoincrement": column.get("autoincrement"),
                    "computed": _plain(column.get("computed"), schema),
                    "identity": _plain(column.get("identity"), schema),
                    "collation": collation,
                }
            ),
        }
    pk = inspector.get_pk_constraint(table, schema=schema)
    if pk.get("constrained_columns"):
        shape["primary key"] = {"name": pk.get("name"), "columns": list(pk["constrained_columns"])}
    for ix in inspector.get_indexes(table, schema=schema):
        if ix.get("duplicates_constraint"):
            continue  # the index behind a unique constraint, which is compared as one
        shape[f"index {_name(ix, 'column_names')}"] = {
            "columns": list(ix["column_names"]),
            "unique": bool(ix["unique"]),
            **_present({key: _plain(ix.get(key), schema) for key in _INDEX_EXTRAS}),
        }
    for uq in inspector.get_unique_constraints(table, schema=schema):
        shape[f"unique constraint {_name(uq, 'column_names')}"] = {"columns": list(uq["column_names"])}
    for fk in inspector.get_foreign_keys(table, schema=schema):
        referred_schema = fk.get("referred_schema")
        shape[f"foreign key {_name(fk, 'constrained_columns')}"] = {
            "columns": list(fk["constrained_columns"]),
            "referred_table": fk["referred_table"],
            "referred_columns": list(fk["referred_columns"]),
            **_present(
                {
                    "referred_schema": None if referred_schema in (None, schema) else referred_schema,
                    "options": _plain(fk.get("options")),
                }
            ),
        }
    for ck in inspector.get_check_constraints(table, schema=schema):
        shape[f"check constraint {_name(ck, 'sqltext')}"] = {"sqltext": _plain(ck["sqltext"], schema)}
    return shape


_INDEX_EXTRAS: Final = ("expressions", "column_sorting", "include_columns", "dialect_options")


def _name(item: Mapping[str, Any], what: str) -> str:
    name = item.get("name")
    if name:
        return str(name)
    parts = item.get(what)
    shown = ", ".join(str(p) for p in parts) if isinstance(parts, list) else _plain(parts)
    return f"(unnamed, on {shown})"


# -- the comparison ----------------------------------------------------------------------------------


def _show(value: object) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list):
        return f"({', '.join(_show(v) for v in value)})"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}={_show(v)}" for k, v in value.items()) + "}"
    return str(value)


def _differences(reference: Shape, live: Shape) -> list[str]:
    """One line per difference, ``<table>: <element>: <what>``, in a stable order."""
    lines: list[str] = []
    for table in sorted(reference.keys() | live.keys()):
        if table not in live:
            lines.append(f"{table}: table missing")
        elif table not in reference:
            lines.append(f"{table}: table not in revision {_SHORT}")
        else:
            lines.extend(_table_differences(table, reference[table], live[table]))
    return lines


def _table_differences(table: str, reference: TableShape, live: TableShape) -> list[str]:
    lines: list[str] = []
    for label in sorted(reference.keys() | live.keys()):
        if label not in live:
            lines.append(f"{table}: {label}: missing")
        elif label not in reference:
            lines.append(f"{table}: {label}: not in revision {_SHORT}")
        else:
            want, got = reference[label], live[label]
            for key in sorted(want.keys() | got.keys()):
                if want.get(key) != got.get(key):
                    lines.append(
                        f"{table}: {label}: {key} {_show(got.get(key))}, "
                        f"revision {_SHORT} has {_show(want.get(key))}"
                    )
    return lines
