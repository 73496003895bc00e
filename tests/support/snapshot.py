"""A full logical snapshot of a database, and a readable diff of two snapshots.

``snapshot(engine)`` captures, through SQLAlchemy's inspector, every table of
the default schema (``alembic_version`` included): its columns (type as stable
text, nullability, default, and whatever else the dialect reports:
autoincrement, identity, computed, comment), primary key, indexes, unique
constraints, foreign keys, check constraints, and every row, typed and sorted
by primary key.  On PostgreSQL the sequences and their positions are captured
too, so a migration that resets one shows up.

Row values are plain JSON-like data: ``None`` for NULL, ints as ints, strings
as strings, bytes as ``\\x`` + lowercase hex, datetimes as ISO 8601 in UTC
(SQLite hands back naive datetimes, which admission writes as UTC).

``diff_snapshots(before, after)`` lists every difference as one line, e.g.
``tables.workflow_commands.columns.intent_digest: added {...}`` or
``tables.workflow_commands.rows[id='…'].intent_digest: added None``.
"""

from __future__ import annotations

import copy
import datetime as dt
import decimal
import math
import re
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import Engine, MetaData, Table, inspect, select, text
from sqlalchemy.engine import Connection, Dialect

__all__ = ["diff_snapshots", "normalize_value", "snapshot", "without_command_run_key"]

_SPACES = re.compile(r"\s+")


def _text(value: object) -> str:
    return _SPACES.sub(" ", str(value)).strip()


def _type_text(type_: Any, dialect: Dialect) -> str:
    try:
        rendered = type_.compile(dialect=dialect)
    except Exception:  # a type the dialect cannot render (NullType): its repr is still stable
        rendered = repr(type_)
    return _text(rendered).upper()


def _plain(value: Any) -> Any:
    """Dialect option values and the like, as JSON-like data."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return _text(value)


def normalize_value(value: Any) -> Any:
    """One row value as plain, typed, backend-independent data."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return "\\x" + bytes(value).hex()
    if isinstance(value, dt.datetime):
        aware = value.replace(tzinfo=dt.UTC) if value.tzinfo is None else value.astimezone(dt.UTC)
        return aware.isoformat()
    if isinstance(value, (dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, (decimal.Decimal, uuid.UUID)):
        return str(value)
    return repr(value)


def _columns(conn: Connection, inspector: Any, table: str) -> tuple[dict[str, Any], list[str]]:
    columns: dict[str, Any] = {}
    order: list[str] = []
    for column in inspector.get_columns(table):
        name = column["name"]
        order.append(name)
        info: dict[str, Any] = {
            "type": _type_text(column["type"], conn.dialect),
            "nullable": bool(column["nullable"]),
            "default": None if column.get("default") is None else _text(column["default"]),
        }
        for extra in ("autoincrement", "comment", "computed", "identity", "collation"):
            if column.get(extra) is not None:
                info[extra] = _plain(column[extra])
        if getattr(column["type"], "collation", None):
            info["collation"] = column["type"].collation
        columns[name] = info
    return columns, order


def _named(items: Sequence[Mapping[str, Any]], columns_key: str) -> dict[str, Mapping[str, Any]]:
    out: dict[str, Mapping[str, Any]] = {}
    for item in items:
        name = item.get("name") or f"<unnamed {','.join(str(c) for c in item.get(columns_key) or [])}>"
        out[str(name)] = item
    return dict(sorted(out.items()))


def _schema(conn: Connection, inspector: Any, table: str) -> dict[str, Any]:
    columns, order = _columns(conn, inspector, table)
    pk = inspector.get_pk_constraint(table)
    indexes = {
        name: {
            "columns": list(ix["column_names"]),
            "unique": bool(ix["unique"]),
            **({"expressions": list(ix["expressions"])} if ix.get("expressions") else {}),
            **({"include_columns": list(ix["include_columns"])} if ix.get("include_columns") else {}),
            **({"column_sorting": _plain(ix["column_sorting"])} if ix.get("column_sorting") else {}),
            **(
                {"duplicates_constraint": ix["duplicates_constraint"]}
                if ix.get("duplicates_constraint")
                else {}
            ),
            **({"dialect_options": _plain(ix["dialect_options"])} if ix.get("dialect_options") else {}),
        }
        for name, ix in _named(inspector.get_indexes(table), "column_names").items()
    }
    uniques = {
        name: list(uq["column_names"])
        for name, uq in _named(inspector.get_unique_constraints(table), "column_names").items()
    }
    foreign_keys = {
        name: {
            "columns": list(fk["constrained_columns"]),
            "referred_schema": fk.get("referred_schema"),
            "referred_table": fk["referred_table"],
            "referred_columns": list(fk["referred_columns"]),
            "options": _plain(fk.get("options") or {}),
        }
        for name, fk in _named(inspector.get_foreign_keys(table), "constrained_columns").items()
    }
    try:
        checks = {
            name: _text(ck["sqltext"])
            for name, ck in _named(inspector.get_check_constraints(table), "sqltext").items()
        }
    except NotImplementedError:  # pragma: no cover - both supported dialects implement it
        checks = {}
    try:
        comment = inspector.get_table_comment(table).get("text")
    except NotImplementedError:  # SQLite has no table comments
        comment = None
    return {
        "columns": columns,
        "column_order": order,
        "primary_key": {"name": pk.get("name"), "columns": list(pk.get("constrained_columns") or [])},
        "indexes": indexes,
        "unique_constraints": uniques,
        "foreign_keys": foreign_keys,
        "check_constraints": checks,
        "comment": comment,
    }


def _sort_key(row: Mapping[str, Any], columns: Sequence[str]) -> tuple[Any, ...]:
    # (is-null, type name, value) keeps mixed types and NULLs orderable, the same on every backend.
    return tuple(
        (row[c] is None, type(row[c]).__name__, row[c] if row[c] is not None else 0) for c in columns
    )


def _rows(conn: Connection, table: str, key: Sequence[str], order: Sequence[str]) -> list[dict[str, Any]]:
    reflected = Table(table, MetaData(), autoload_with=conn)
    rows = [
        {name: normalize_value(value) for name, value in row.items()}
        for row in conn.execute(select(reflected)).mappings()
    ]
    # Sorted here, by code point, not by the database's collation.
    rows.sort(key=lambda r: _sort_key(r, list(key) or list(order)))
    return rows


def _sequences(conn: Connection, inspector: Any) -> dict[str, Any]:
    if conn.dialect.name != "postgresql":
        return {}
    out: dict[str, Any] = {}
    for name in sorted(inspector.get_sequence_names()):
        quoted = conn.dialect.identifier_preparer.quote(name)
        last_value, is_called = conn.execute(text(f"SELECT last_value, is_called FROM {quoted}")).one()
        out[name] = {"last_value": int(last_value), "is_called": bool(is_called)}
    return out


def snapshot(engine: Engine) -> dict[str, Any]:
    """Every table's schema and rows, and (PostgreSQL) every sequence, as plain data."""
    with engine.connect() as conn:
        inspector = inspect(conn)
        tables: dict[str, Any] = {}
        for table in sorted(inspector.get_table_names()):
            schema = _schema(conn, inspector, table)
            schema["rows"] = _rows(conn, table, schema["primary_key"]["columns"], schema["column_order"])
            tables[table] = schema
        result = {
            "dialect": conn.dialect.name,
            "tables": tables,
            "views": sorted(inspector.get_view_names()),
            "sequences": _sequences(conn, inspector),
        }
        conn.rollback()
    return result


def without_command_run_key(state: dict[str, Any]) -> dict[str, Any]:
    """``state`` as revision 0006 leaves it: ``workflow_commands`` without the foreign key to its
    run and the index by run (both must be there), every row and every other element as they were."""
    expected = copy.deepcopy(state)
    commands = expected["tables"]["workflow_commands"]
    del commands["foreign_keys"]["fk_workflow_commands_run_id_workflow_runs"]
    del commands["indexes"]["ix_workflow_commands_run_id"]
    return expected


def with_compact_payloads(state: dict[str, Any], head: dict[str, Any]) -> dict[str, Any]:
    """``state`` as revision 0007 leaves it: the event log with the nullable ``compact_payload``
    column as ``head`` (a snapshot at the head) declares it, NULL on every row; every other element
    as it was."""
    expected = copy.deepcopy(state)
    events = expected["tables"]["workflow_history_events"]
    assert "compact_payload" not in events["columns"]
    declared = head["tables"]["workflow_history_events"]["columns"]["compact_payload"]
    assert declared["nullable"] and declared["default"] is None
    events["columns"]["compact_payload"] = copy.deepcopy(declared)
    events["column_order"].append("compact_payload")
    for row in events["rows"]:
        row["compact_payload"] = None
    return expected


# -- the diff --------------------------------------------------------------------------------


def _row_id(row: Mapping[str, Any], key: Sequence[str]) -> str:
    if not key:
        return repr(tuple(row.items()))
    return ", ".join(f"{c}={row.get(c)!r}" for c in key)


def _diff_rows(
    path: str, before: Sequence[Mapping[str, Any]], after: Sequence[Mapping[str, Any]], key: Sequence[str]
) -> list[str]:
    lines: list[str] = []
    old = {_row_id(r, key): r for r in before}
    new = {_row_id(r, key): r for r in after}
    if len(old) != len(before):
        lines.append(f"{path}: before has rows with duplicate keys")
    if len(new) != len(after):
        lines.append(f"{path}: after has rows with duplicate keys")
    for rid in old.keys() - new.keys():
        lines.append(f"{path}[{rid}]: removed {dict(old[rid])!r}")
    for rid in new.keys() - old.keys():
        lines.append(f"{path}[{rid}]: added {dict(new[rid])!r}")
    for rid in old.keys() & new.keys():
        lines.extend(_diff(f"{path}[{rid}]", old[rid], new[rid]))
    order_before = [rid for rid in old if rid in new]
    order_after = [rid for rid in new if rid in old]
    if not lines and order_before != order_after:
        lines.append(f"{path}: the same rows in another order")
    return sorted(lines)


def _diff(path: str, before: Any, after: Any, key: Sequence[str] = ()) -> list[str]:
    if isinstance(before, Mapping) and isinstance(after, Mapping):
        lines: list[str] = []
        for name in sorted(before.keys() | after.keys(), key=str):
            where = f"{path}.{name}" if path else str(name)
            if name not in after:
                lines.append(f"{where}: removed {before[name]!r}")
            elif name not in before:
                lines.append(f"{where}: added {after[name]!r}")
            elif name == "rows" and isinstance(before[name], list) and isinstance(after[name], list):
                primary_key = after.get("primary_key") or before.get("primary_key") or {}
                lines.extend(_diff_rows(where, before[name], after[name], primary_key.get("columns") or []))
            else:
                lines.extend(_diff(where, before[name], after[name]))
        return lines
    if before == after and type(before) is type(after):
        return []
    return [f"{path}: {before!r} -> {after!r}"]


def diff_snapshots(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[str]:
    """Every difference between two snapshots, one readable line each (empty: identical)."""
    return _diff("", before, after)
