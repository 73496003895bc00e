"""The benchmarks start as the documented scripts (``python bench/NAME.py``).

Run as a script, ``bench/`` is the first entry of ``sys.path``, where
``bench/admission.py`` would shadow the package; each script must still
import admission itself.  Only ``--help`` is run: speed is measured by the
benchmarks, never asserted by tests.  The ``test`` extra installs the
digest benchmark's peers, so every script is checked.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted(p.stem for p in (ROOT / "bench").glob("*.py"))


def test_every_benchmark_is_listed() -> None:
    assert {"admission", "digest", "http", "jobs", "worker"} <= set(SCRIPTS)


@pytest.mark.parametrize("name", SCRIPTS)
def test_the_benchmark_starts_as_a_script(name: str, tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / f"{name}.py"), "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert "usage:" in result.stdout
