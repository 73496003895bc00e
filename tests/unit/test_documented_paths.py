"""Every import path the documentation names works: ``from admission.x import y`` and ``admission.x.y``."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

from admission import telemetry
from admission.jobs._snapshot import SNAPSHOT_FORMAT

ROOT = Path(__file__).resolve().parents[2]
PAGES = [
    *sorted((ROOT / "docs").glob("*.md")),
    ROOT / "README.md",
    ROOT / "CHANGELOG.md",
    ROOT / "vectors" / "README.md",
    ROOT / "admission" / "intent" / "vectors" / "README.md",
]
FROM_IMPORT = re.compile(r"^from (admission[\w.]*) import ([\w, ]+)$", re.MULTILINE)
DOTTED = re.compile(r"(?<![\w/.])admission(?:\.\w+)+")
# The names of spans, instruments and attributes (docs/observability.md) and the jobs snapshot's
# format (docs/jobs.md) are dotted too, but no paths.
NOT_PATHS = {
    "admission.sqlite3",
    "admission.py",
    SNAPSHOT_FORMAT,
    *telemetry.SPANS,
    *telemetry.METRICS,
    *telemetry.ATTRIBUTES,
}


def resolve(dotted: str) -> object:
    """The object ``dotted`` names: the longest importable module prefix, then attributes."""
    parts = dotted.split(".")
    for split in range(len(parts), 0, -1):
        try:
            found: object = importlib.import_module(".".join(parts[:split]))
        except ModuleNotFoundError:
            continue
        for attribute in parts[split:]:
            found = getattr(found, attribute)
        return found
    raise ModuleNotFoundError(dotted)


def documented() -> list[tuple[str, str]]:
    found = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for module, names in FROM_IMPORT.findall(text):
            found += [(page.name, f"{module}.{name.strip()}") for name in names.split(",")]
        for dotted in DOTTED.findall(text):
            if dotted not in NOT_PATHS and not dotted.endswith(".md"):
                found.append((page.name, dotted.rstrip(".")))
    return sorted(set(found))


@pytest.mark.parametrize(("page", "dotted"), documented())
def test_every_documented_import_path_resolves(page: str, dotted: str) -> None:
    assert resolve(dotted) is not None or dotted.endswith("None")


def test_the_pages_name_import_paths_at_all() -> None:
    assert len(documented()) > 30
