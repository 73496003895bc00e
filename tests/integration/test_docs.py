"""The guides stay runnable: their Python blocks run, in order, as one program."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)


@pytest.mark.parametrize("name", ["guide.md", "once.md"])
def test_every_python_block_of_the_guide_runs(name: str) -> None:
    blocks = BLOCK.findall((DOCS / name).read_text(encoding="utf-8"))
    assert len(blocks) >= 5
    namespace: dict[str, object] = {"__name__": f"docs.{name}"}
    for number, block in enumerate(blocks, 1):
        try:
            exec(compile(block, f"{name}[block {number}]", "exec"), namespace)
        except Exception as exc:  # pragma: no cover - the message says which block broke
            raise AssertionError(f"{name} block {number} failed: {exc!r}") from exc
