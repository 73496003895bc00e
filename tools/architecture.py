"""The package's dependency graph, drawn from its imports (``docs/architecture.md`` holds the drawing).

Every module of ``admission/`` is read with ``ast`` (nothing is run); an
import of another part of the package is an arrow from the importing part
to the imported one.  Imports under ``if TYPE_CHECKING:`` count too: a type
is a dependency.  ``tests/unit/test_layout.py`` checks that the page holds
exactly this drawing and that every arrow points the way the layers allow.

Usage: ``python tools/architecture.py`` prints the Mermaid block;
``python tools/architecture.py --write`` puts it into docs/architecture.md.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "admission"
PAGE = ROOT / "docs" / "architecture.md"
BEGIN = "<!-- generated: python tools/architecture.py -->"
END = "<!-- end generated -->"

PARTS = (
    "cli",
    "http",
    "client",
    "conformance",
    "testing",
    "aio",
    "admission",
    "sql",
    "worker",
    "jobs",
    "receipts",
    "states",
    "telemetry",
    "files",
    "intent",
    "errors",
)
"""The parts of the package, from the edges down to the exception tree.  ``admission`` is the
facade (``__init__.py``), ``states`` the shared pure rules: the state-table rule (``_table.py``) and
the declared bounds of stored text (``_bounds.py``); ``telemetry`` the spans, metrics and the
root of the loggers (``telemetry.py``), which the services use and which imports nothing of admission;
``files`` the local files (``_files.py``): the non-blocking file lock and the atomic JSON writer
that the worker and the job runner share."""


def part_of(module: str) -> str | None:
    """The part a module of the package belongs to (``None`` outside the package)."""
    names = module.split(".")
    if names[0] != "admission":
        return None
    if len(names) == 1:
        return "admission"
    head = names[1]
    if head in ("_table", "_bounds"):
        return "states"
    if head == "_files":
        return "files"
    if head == "__main__":
        return "cli"
    return head if head in PARTS else None


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported(tree: ast.Module) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def edges() -> set[tuple[str, str]]:
    """Every (importing part, imported part) pair of the package, the part itself left out."""
    pairs: set[tuple[str, str]] = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        if "migrations" in path.parts:
            continue
        source = part_of(_module_name(path))
        for imported in _imported(ast.parse(path.read_text(encoding="utf-8"))):
            # ``from admission import x`` names the facade unless x is a part of its own.
            target = part_of(imported) or part_of(imported.rsplit(".", 1)[0])
            if source is not None and target is not None and target != source:
                pairs.add((source, target))
    return pairs


def mermaid() -> str:
    """The graph as a Mermaid flowchart, parts in layer order, arrows sorted."""
    order = {part: index for index, part in enumerate(PARTS)}
    arrows = sorted(edges(), key=lambda pair: (order[pair[0]], order[pair[1]]))
    lines = ["```mermaid", "flowchart TD"]
    lines += [f"    {source} --> {target}" for source, target in arrows]
    lines += ["```"]
    return "\n".join(lines) + "\n"


def write() -> None:
    """Replace the generated block of docs/architecture.md with the drawing of today's imports."""
    page = PAGE.read_text(encoding="utf-8")
    start = page.index(BEGIN) + len(BEGIN) + 1
    end = page.index(END)
    PAGE.write_text(page[:start] + mermaid() + page[end:], encoding="utf-8")


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        write()
    else:
        sys.stdout.write(mermaid())
