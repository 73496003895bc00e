"""Helpers for tests that race real OS processes."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from multiprocessing.process import BaseProcess

WAIT = 60.0
"""How long a test waits for one of its processes, at the most."""


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
