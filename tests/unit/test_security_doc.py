"""docs/security.md stays true: every setting its table names exists, and every test file it cites is there.

The page is the threat model an operator reads before exposing a server; a
setting renamed in code but not there would send them to an option that does
not exist, and a cited regression test that was removed would leave an attack
untested while the page still claims it is kept.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from admission.cli import build_parser
from admission.cli._parser import leaf_commands
from admission.http import create_app
from admission.receipts import AdmissionService
from admission.sql import audit

ROOT = Path(__file__).resolve().parents[2]
PAGE = (ROOT / "docs" / "security.md").read_text(encoding="utf-8")
TABLE = PAGE.split("## Limits and settings", 1)[1].split("\n\n", 2)[1]
ROWS = [line.split("|")[1:-1] for line in TABLE.splitlines()[2:]]

FLAG = re.compile(r"`admission ([a-z -]+?) (--[a-z-]+)")
KEYWORD = re.compile(r"`([\w.]+)\(([^`]*?)(\w+)=\.\.\.\)`")
CALLABLES = {
    "create_app": create_app,
    "AdmissionService.prune": AdmissionService.prune,
    "AdmissionService": AdmissionService,
    "admission.sql.audit": audit,
}
CITED = sorted(set(re.findall(r"`(tests/[\w/]+\.py)`", PAGE)))


def options_of(command: str) -> set[str]:
    for path, parser in leaf_commands(build_parser()):
        if " ".join(path) == command:
            return set(parser._option_string_actions)
    raise AssertionError(f"docs/security.md names a command that does not exist: admission {command}")


def test_the_table_has_a_row_per_limit() -> None:
    assert len(ROWS) >= 8 and all(len(row) == 4 for row in ROWS)


@pytest.mark.parametrize(("command", "flag"), sorted({m for row in ROWS for m in FLAG.findall(row[3])}))
def test_every_command_line_setting_exists(command: str, flag: str) -> None:
    assert flag in options_of(command)


@pytest.mark.parametrize(
    ("function", "keyword"), sorted({(m[0], m[2]) for row in ROWS for m in KEYWORD.findall(row[2])})
)
def test_every_python_setting_exists(function: str, keyword: str) -> None:
    assert keyword in inspect.signature(CALLABLES[function]).parameters


def test_the_settings_found_cover_the_table() -> None:
    # Rows without a setting say so with an empty cell or a plain name; the rest must parse.
    flags = [m for row in ROWS for m in FLAG.findall(row[3])]
    keywords = [m for row in ROWS for m in KEYWORD.findall(row[2])]
    assert len(flags) >= 7 and len(keywords) >= 6


@pytest.mark.parametrize("cited", CITED)
def test_every_cited_regression_test_exists(cited: str) -> None:
    assert (ROOT / cited).is_file()
    assert "def test_" in (ROOT / cited).read_text(encoding="utf-8")


def test_the_page_cites_a_test_for_every_attack_it_names() -> None:
    assert len(CITED) >= 12
