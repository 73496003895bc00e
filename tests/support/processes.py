"""Helpers for tests that race real OS processes."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from multiprocessing.process import BaseProcess
from pathlib import Path

WAIT = 60.0
"""How long a test waits for one of its processes, at the most."""

ROOT = Path(__file__).resolve().parents[2]


def admission_cli(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``python -m admission --db URL ARGS``, run as a user runs it, its output captured as text."""
    return subprocess.run(
        [sys.executable, "-m", "admission", "--db", url, *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )


@contextmanager
def running(*processes: BaseProcess) -> Iterator[None]:
    """Start the processes; whatever happens, none outlives the test (they are ours: kill by handle)."""
    for process in processes:
        process.start()
    try:
        yield
        for process in processes:
            process.join(WAIT)
    finally:
        for process in processes:
            if process.is_alive():
                process.kill()
                process.join(WAIT)
