"""The layout keeps its promises: pure modules stay pure, only ``sql/`` names a dialect, sizes stay small.

Read from the source (``ast``), not from running it, so a test fails the day
an import or a string crosses a line the architecture draws
(``docs/architecture.md``).
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import admission
from tools import architecture

PACKAGE = Path(admission.__file__).parent

PURE_MODULES = {
    "admission._bounds",
    "admission._table",
    "admission.client._errors",
    "admission.conformance._admit_rules",
    "admission.conformance._determinism",
    "admission.conformance._driver",
    "admission.conformance._engine_rules",
    "admission.conformance._machine",
    "admission.conformance._model",
    "admission.conformance._spellings",
    "admission.conformance._strategies",
    "admission.conformance._target",
    "admission.conformance._vocabulary",
    "admission.errors",
    "admission.http._codecs",
    "admission.http._stored",
    "admission.http._tokens",
    "admission.http._limits",
    "admission.intent._encoding",
    "admission.intent._keys",
    "admission.jobs._backoff",
    "admission.jobs._claims",
    "admission.jobs._enqueue",
    "admission.jobs._lifecycle",
    "admission.jobs._memory",
    "admission.jobs._states",
    "admission.jobs._store",
    "admission.jobs._values",
    "admission.receipts._answers",
    "admission.receipts._batch",
    "admission.receipts._lifecycle",
    "admission.receipts._memory",
    "admission.receipts._once",
    "admission.receipts._release",
    "admission.receipts._retention",
    "admission.receipts._rules",
    "admission.receipts._sealed",
    "admission.receipts._service",
    "admission.receipts._store",
    "admission.sql._compact",
    "admission.sql._times",
    "admission.worker._intake",
    "admission.worker._memory",
    "admission.worker._states",
    "admission.worker._store",
}
"""Modules that must stay pure: no database, no clock, no I/O, directly or through what they import."""

IMPURE = frozenset(
    {
        "alembic", "anyio", "asyncio", "fastapi", "fcntl", "httpx", "io", "os", "pathlib", "psycopg",
        "random", "shutil", "signal", "socket", "sqlalchemy", "sqlite3", "starlette", "subprocess",
        "tempfile", "time", "uvicorn",
    }
)  # fmt: skip
"""Top-level modules whose import makes a module impure: databases, files, processes, the clock."""

DIALECT_WORDS = frozenset({"sqlite", "postgresql", "postgres", "psycopg", "pysqlite"})
"""String constants that name a dialect or its driver."""

MAX_MODULE_LINES = 600
MAX_CLASS_LINES = 400


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py")) if "migrations" not in p.parts}


@cache
def tree(name: str) -> ast.Module:
    return ast.parse(MODULES[name].read_text(encoding="utf-8"))


def imports(name: str) -> set[str]:
    """The modules ``name`` imports, by their full names (``from x import y`` counts ``x`` and ``x.y``)."""
    found: set[str] = set()
    for node in ast.walk(tree(name)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def impurities(name: str) -> set[str]:
    """What makes ``name`` impure: its impure imports, and those of every admission module it reaches."""
    found: set[str] = set()
    seen, todo = {name}, [name]
    while todo:
        current = todo.pop()
        for imported in imports(current):
            if imported.split(".")[0] in IMPURE:
                found.add(f"{current} imports {imported}")
            elif imported in MODULES and imported not in seen and MODULES[imported].name != "__init__.py":
                seen.add(imported)
                todo.append(imported)
    return found


def test_every_pure_module_is_listed_and_every_listed_module_is_pure() -> None:
    impure_listed = {name: sorted(impurities(name)) for name in PURE_MODULES if impurities(name)}
    assert not impure_listed
    unlisted = {name for name in MODULES if not impurities(name) and name not in PURE_MODULES}
    # Faces only re-export; the test is about the modules that hold code.
    unlisted = {
        name for name in unlisted if MODULES[name].name != "__init__.py" and name != "admission.__main__"
    }
    assert not unlisted, f"pure but not listed as pure: {sorted(unlisted)}"


def test_only_the_sql_subpackage_names_a_dialect() -> None:
    offenders = []
    for name, path in MODULES.items():
        if name.startswith("admission.sql"):
            continue
        for node in ast.walk(tree(name)):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                if node.value.lower() in DIALECT_WORDS:
                    offenders.append(f"{path.name}:{node.lineno} {node.value!r}")
            elif isinstance(node, ast.Attribute) and node.attr in ("dialect", "get_backend_name"):
                offenders.append(f"{path.name}:{node.lineno} .{node.attr}")
        for imported in imports(name):
            if imported.startswith(("sqlalchemy.dialects", "psycopg")):
                offenders.append(f"{path.name}: imports {imported}")
    assert not offenders


def test_the_exception_tree_imports_nothing_of_admission() -> None:
    assert not {n for n in imports("admission.errors") if n.startswith("admission")}


def test_no_module_over_600_lines_and_no_class_over_400() -> None:
    long_modules = {
        name: n
        for name, path in MODULES.items()
        if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert not long_modules
    long_classes = {
        f"{name}.{node.name}": span
        for name in MODULES
        for node in ast.walk(tree(name))
        if isinstance(node, ast.ClassDef)
        and (span := (node.end_lineno or node.lineno) - node.lineno + 1) > MAX_CLASS_LINES
    }
    assert not long_classes


ALLOWED = {
    "errors": set(),
    "states": {"errors"},
    "telemetry": set(),
    "files": {"errors"},
    "intent": {"errors"},
    "receipts": {"states", "telemetry", "intent", "errors"},
    "worker": {"receipts", "states", "telemetry", "files", "intent", "errors"},
    "jobs": {"states", "telemetry", "files", "intent", "errors"},
    "sql": {"receipts", "worker", "jobs", "states", "telemetry", "intent", "errors"},
    "admission": {"sql", "receipts", "intent", "errors"},
    "aio": {"sql", "receipts", "worker", "jobs", "states", "intent", "errors"},
    "http": {"admission", "aio", "receipts", "intent", "errors"},
    "client": {"http", "intent", "errors"},
    "testing": {"worker", "jobs", "errors"},
    "conformance": {"http", "admission", "aio", "sql", "receipts", "states", "intent", "errors"},
    "cli": set(architecture.PARTS) - {"cli"},
}
"""Which parts each part may import: edges -> services -> ports -> rules -> intent -> errors;
adapters under sql/ import the core, never the reverse."""


def test_every_import_goes_the_way_the_layers_allow() -> None:
    assert set(ALLOWED) == set(architecture.PARTS)
    wrong = sorted(
        (source, target) for source, target in architecture.edges() if target not in ALLOWED[source]
    )
    assert not wrong


def test_the_architecture_page_holds_the_drawing_of_todays_imports() -> None:
    page = architecture.PAGE.read_text(encoding="utf-8")
    block = page[page.index(architecture.BEGIN) + len(architecture.BEGIN) + 1 : page.index(architecture.END)]
    assert block == architecture.mermaid()


FACES = ("intent", "receipts", "worker", "jobs", "sql", "aio", "http", "client", "cli")


def test_no_two_subsystems_export_different_things_under_one_name() -> None:
    import importlib

    owners: dict[str, tuple[str, object]] = {}
    clashes = []
    for face in FACES:
        module = importlib.import_module(f"admission.{face}")
        for name in module.__all__:
            value = getattr(module, name)
            if name in owners and owners[name][1] is not value:
                clashes.append(f"{name}: admission.{owners[name][0]} and admission.{face}")
            owners.setdefault(name, (face, value))
    assert not clashes


def test_every_face_exports_what_it_lists_with_docstrings() -> None:
    import importlib
    import inspect

    for face in ("", *(f".{name}" for name in FACES), ".errors", ".testing", ".telemetry"):
        module = importlib.import_module(f"admission{face}")
        assert module.__doc__, face
        for name in module.__all__:
            value = getattr(module, name)
            if inspect.isfunction(value) or inspect.isclass(value):
                assert inspect.getdoc(value), f"admission{face}.{name}"
