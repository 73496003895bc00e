"""Core statements run on the driver: compiled once, stored exactly as Core would store them.

For the hot paths (an admission, a batch of worker transitions), where
SQLAlchemy's per-execution work (event dispatch, parameter construction,
result set-up) costs several times the statement itself.  The SQL is the
Core statement's own compilation and every value goes through its type's
bind processor for the dialect, which is what SQLAlchemy applies itself
(``tests/integration/test_raw_statements.py`` proves the rows the same).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from operator import itemgetter
from typing import Any, Final

from sqlalchemy import BindParameter, ClauseElement, Dialect, Table
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError
from sqlalchemy.sql.compiler import SQLCompiler

__all__ = ["BulkInsert", "BulkStatement", "RawStatement"]

_NAMED: Final = re.compile(r"(?<!%)%\(([^)]+)\)s")
"""A named parameter's placeholder in pyformat (``%(name)s``), not after an escaped ``%%``."""
_NOTHING: Any = object()
"""No value yet (``None`` is a value)."""


class RawStatement:
    """A Core statement compiled once for one dialect, executed on a DBAPI cursor.

    For the admission hot path, where SQLAlchemy's per-execution work (event
    dispatch, parameter construction, result set-up) costs several times the
    statement itself.  The SQL is the Core statement's own compilation, and
    every parameter goes through the bind processor of its type for this
    dialect, which is what SQLAlchemy applies itself: a row written here is
    stored exactly as Core would store it (``tests/integration/test_raw_statements.py``).
    Rows come back as the driver returns them, for the converters above.
    Engine-level execution events do not see these statements.
    """

    __slots__ = ("_binds", "_names", "_plain", "_positional", "sql", "wired")

    def __init__(
        self,
        statement: ClauseElement,
        dialect: Dialect,
        column_keys: Sequence[str] | None = None,
        *,
        binary: bool = False,
    ) -> None:
        compiled = statement.compile(dialect=dialect, column_keys=list(column_keys) if column_keys else None)
        assert isinstance(compiled, SQLCompiler)
        self.sql: str = compiled.string
        if binary:
            # psycopg's placeholder for a parameter sent in binary: an array is then
            # dumped element by element with no text quoting (several times cheaper).
            if compiled.positiontup is not None or dialect.paramstyle != "pyformat":
                raise ValueError("binary parameters need psycopg's named placeholders")
            self.sql = _NAMED.sub(r"%(\1)b", self.sql)
        by_name: dict[str, BindParameter[Any]] = {name: bind for bind, name in compiled.bind_names.items()}
        order = compiled.positiontup
        self._positional = order is not None
        # The result's column names, taken from the first execution: every
        # use of ``cursor.description`` makes psycopg build one object per
        # column, which costs more than fetching the row.
        self._names: list[str] | None = None
        self.wired: Any = None  # its libpq form, made on first use (admission/sql/_wire.py)
        names = list(order) if order is not None else list(by_name)
        # (rendered name, caller's key or None for a literal, processor, literal value)
        self._binds: list[tuple[str, str | None, Any, Any]] = []
        for name in names:
            bind = by_name[name]
            if bind.expanding:
                raise ValueError("expanding parameters are not supported here")
            processor = bind.type.dialect_impl(dialect).bind_processor(dialect)
            # Anonymous binds (``literal(0)``) carry their value; named ones come from the caller.
            key = None if bind.unique else bind.key
            self._binds.append((name, key, processor, bind.value))
        # Positional parameters that are the caller's values as given (no processor, no
        # literal: text columns on SQLite, a retry's receipt read) are taken in one C call.
        keys = [key for _, key, processor, _ in self._binds if key is not None and processor is None]
        plain = self._positional and len(keys) == len(self._binds) > 1
        self._plain: Callable[[Mapping[str, Any]], tuple[Any, ...]] | None = (
            itemgetter(*keys) if plain else None
        )

    def parameters(self, params: Mapping[str, Any]) -> Sequence[Any] | dict[str, Any]:
        """The driver's parameters for ``params``, processed as SQLAlchemy processes them."""
        if self._plain is not None:
            return self._plain(params)
        values = []
        for _, key, processor, literal_value in self._binds:
            value = literal_value if key is None else params[key]
            values.append(value if processor is None else processor(value))
        if self._positional:
            return values
        return {name: value for (name, *_), value in zip(self._binds, values, strict=True)}

    def ordered(self, names: Sequence[str]) -> Callable[[Mapping[str, Any]], list[Any]]:
        """A function giving :meth:`parameters`' values of the parameters ``names``, in that order."""
        binds = {name: (key, processor, literal) for name, key, processor, literal in self._binds}
        picks = [binds[name] for name in names]

        def values(params: Mapping[str, Any]) -> list[Any]:
            out = []
            for key, processor, literal_value in picks:
                value = literal_value if key is None else params[key]
                out.append(value if processor is None else processor(value))
            return out

        return values

    def parameter_sets(
        self, rows: Sequence[Mapping[str, Any]], common: Mapping[str, Any]
    ) -> list[list[Any]] | list[dict[str, Any]]:
        """:meth:`parameters` for many rows that share the values in ``common``.

        Shared values and literals are processed once; each row gives the rest.
        """
        template: list[Any] = []
        varying: list[tuple[int, str, Any]] = []
        for index, (_, key, processor, literal_value) in enumerate(self._binds):
            if key is not None and key not in common:
                template.append(None)
                varying.append((index, key, processor))
                continue
            value = literal_value if key is None else common[key]
            template.append(value if processor is None else processor(value))
        sets: list[list[Any]] = []
        # The last value each processor saw and what it made of it: rows written together
        # often share a value (a batch's one time), processed once then.
        last: list[tuple[Any, Any]] = [(_NOTHING, None)] * len(varying)
        for row in rows:
            values = template.copy()
            for at, (index, key, processor) in enumerate(varying):
                value = row[key]
                if processor is None:
                    values[index] = value
                    continue
                seen, made = last[at]
                if value is not seen:
                    made = processor(value)
                    last[at] = (value, made)
                values[index] = made
            sets.append(values)
        if self._positional:
            return sets
        names = [name for name, *_ in self._binds]
        return [dict(zip(names, values, strict=True)) for values in sets]

    def tuples(self, cursor: Any, params: Mapping[str, Any]) -> list[Any]:
        """Execute on ``cursor`` and return the driver's rows as they come, in column order."""
        cursor.execute(self.sql, self.parameters(params))
        return list(cursor.fetchall())

    def rows(self, cursor: Any, params: Mapping[str, Any]) -> list[dict[str, Any]]:
        """Execute on ``cursor`` and return every row as a dict by column name."""
        cursor.execute(self.sql, self.parameters(params))
        return self.fetched(cursor)

    def fetched(self, cursor: Any) -> list[dict[str, Any]]:
        """The rows this statement returned on ``cursor``, as dicts by column name; none for a
        statement that returns no rows (an ``INSERT`` without ``RETURNING``)."""
        if cursor.description is None:
            return []
        names = self._names
        if names is None:
            names = self._names = [column[0] for column in cursor.description]
        # fetchall also finishes the statement (SQLite keeps an unfinished one active).
        return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]

    def as_rows(self, description: Any, fetched: Sequence[Any]) -> list[dict[str, Any]]:
        """Rows this statement returned, fetched by the caller (an asyncio driver's cursor), as dicts."""
        names = self._names
        if names is None:
            names = self._names = [column[0] for column in description]
        return [dict(zip(names, row, strict=True)) for row in fetched]


class BulkStatement:
    """One Core DML statement run for many parameter sets, in one ``executemany``
    on the transaction's own cursor.

    For statements repeated row by row on a hot path (the worker's state
    transitions and their events): the SQL is the Core statement's own
    compilation, built once, and every value goes through its type's bind
    processor, as with :class:`RawStatement`, so rows are stored exactly as Core
    would store them, without SQLAlchemy's per-execution work.  Parameters
    are named by ``bindparam`` keys (or by column for an INSERT given
    ``keys``).  A driver error is raised as Core raises it (a
    :class:`sqlalchemy.exc.DBAPIError` keeping the driver's exception), so
    callers translate it as they translate any other statement's.
    """

    def __init__(self, statement: ClauseElement, dialect: Dialect, keys: Sequence[str] | None = None) -> None:
        self._raw = RawStatement(statement, dialect, keys)
        self._error: type[Exception] = dialect.loaded_dbapi.Error

    def execute(
        self,
        connection: Connection,
        rows: Sequence[Mapping[str, Any]],
        common: Mapping[str, Any] | None = None,
    ) -> int:
        """Run the statement once per row inside ``connection``'s transaction; the rows it changed.

        ``common`` holds the values every row shares (processed once).
        """
        if not rows:
            return 0
        dbapi = connection.connection.dbapi_connection
        assert dbapi is not None
        cursor: Any = dbapi.cursor()
        parameters = self._raw.parameter_sets(rows, common or {})
        try:
            cursor.executemany(self._raw.sql, parameters)
            return int(cursor.rowcount)
        except self._error as exc:
            raise DBAPIError.instance(self._raw.sql, parameters, exc, self._error) from exc
        finally:
            cursor.close()


class BulkInsert:
    """Many rows into one table in one ``executemany`` (a :class:`BulkStatement`).

    For append-only logs written row by row on a hot path (the worker's
    events).  ``keys`` are the columns given; the others take their defaults
    (an autoincrement key).  A driver error is raised as Core raises it, for
    the caller's boundary (:func:`~admission.sql._engine.wrap_exceptions`).
    """

    def __init__(self, table: Table, dialect: Dialect, keys: Sequence[str]) -> None:
        self._statement = BulkStatement(table.insert(), dialect, keys)

    def insert(
        self,
        connection: Connection,
        rows: Sequence[Mapping[str, Any]],
        common: Mapping[str, Any] | None = None,
    ) -> None:
        """Insert ``rows`` inside ``connection``'s transaction (``common``: values they share)."""
        self._statement.execute(connection, rows, common)
