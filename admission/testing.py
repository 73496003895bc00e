"""Fakes for users' tests: faulty targets, memory publishers, crash points.

Nothing here is needed in production.  These are real implementations of
admission's ports that fail on purpose or keep everything in memory, so that
an engine's own tests can drive admission through the failures the contracts
talk about (worker contract §6) without a second system:

* :class:`FaultyTarget` wraps a worker target with one injected fault
  (``outage``, ``timeout``, ``crash-after-write``);
* :class:`MemoryPublisher` is a job publication target in a list, fenced like
  :class:`~admission.jobs.LocalPublisher`;
* :data:`CRASH_POINTS` names the points of a send where the durable worker
  calls its ``hook``, and :func:`pause_at` makes a hook that stops the process
  there, so that a test can kill it at exactly that point.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Final

from admission.errors import BeforeWriteError, InvalidRecordError, TargetTimeoutError
from admission.jobs._states import PublishedResult
from admission.jobs._target import refused_publication
from admission.worker._targets import Readback, StatusRead, Target, TargetRecord
from admission.worker._worker import CRASH_POINTS

__all__ = [
    "CRASH_EXIT_CODE",
    "CRASH_POINTS",
    "FAULTS",
    "FaultyTarget",
    "MemoryPublisher",
    "pause_at",
]

CRASH_EXIT_CODE: Final = 73
"""The exit code of the ``crash-after-write`` fault (worker contract §6)."""

FAULTS: Final = ("outage", "timeout", "crash-after-write")
"""The faults a :class:`FaultyTarget` injects."""


class FaultyTarget:
    """A target with one injected fault (worker contract §6).

    ``outage``: every write raises BeforeWriteError before dispatch.
    ``timeout``: the write lands, then the call reports a timeout.
    ``crash-after-write``: the write lands and commits, then the process exits
    with code 73 at once (``exit`` is a parameter so that tests in one process
    can substitute another way to stop).
    """

    def __init__(self, inner: Target, fault: str, *, exit: Callable[[int], None] = os._exit) -> None:
        if fault not in FAULTS:
            raise InvalidRecordError(f"must be one of {', '.join(FAULTS)}, not {fault!r}", field="fault")
        self.inner = inner
        self.fault = fault
        self._exit = exit

    def write(self, record: TargetRecord) -> None:
        """Write through the fault."""
        if self.fault == "outage":
            raise BeforeWriteError("injected outage: the request was not dispatched")
        self.inner.write(record)
        if self.fault == "timeout":
            raise TargetTimeoutError("injected timeout: the target did not answer")
        self._exit(CRASH_EXIT_CODE)

    def read_back(self, write_id: str) -> Readback:
        """Readback is not faulted: reconciliation uses the trusted adapter."""
        return self.inner.read_back(write_id)

    def observe_status(self, write_ids: Sequence[str]) -> list[StatusRead]:
        """Observation is not faulted."""
        return self.inner.observe_status(write_ids)


class MemoryPublisher:
    """The in-memory target: the same behaviour as :class:`LocalPublisher`, in a list."""

    def __init__(self) -> None:
        self.publications: list[PublishedResult] = []
        self.fences: dict[str, int] = {}
        self._lock = threading.Lock()

    def _fence(self, job_id: str, fence: int | None, action: str) -> None:
        if fence is None:
            return
        current = self.fences.get(job_id)
        if current is not None and current > fence:
            raise refused_publication(job_id, fence, current, action)
        self.fences[job_id] = fence

    def publish(self, job_id: str, attempt_id: str, result: bytes, *, fence: int | None = None) -> None:
        """Append one publication; with ``fence``, only if no newer owner was here."""
        with self._lock:
            self._fence(job_id, fence, "publish")
            self.publications.append(PublishedResult(job_id, attempt_id, bytes(result)))

    def read_published(self, job_id: str, *, fence: int | None = None) -> Sequence[PublishedResult]:
        """Every publication of ``job_id``, oldest first (with ``fence``: raising the job's token)."""
        with self._lock:
            self._fence(job_id, fence, "read")
            return [p for p in self.publications if p.job_id == job_id]


def pause_at(point: str, marker: str | os.PathLike[str] | None = None) -> Callable[[str], None]:
    """A worker ``hook`` that stops the process at the named point of a send.

    Without ``marker`` it sleeps there for good (the test kills it).  With a
    marker file it writes the point's name into it and waits until the test
    deletes the file, then goes on: the late write of a worker whose lease
    was taken meanwhile.
    """
    if point not in CRASH_POINTS:
        raise InvalidRecordError(f"must be one of {', '.join(CRASH_POINTS)}, not {point!r}", field="point")

    def hook(reached: str) -> None:
        if reached != point:
            return
        if marker is None:
            while True:
                time.sleep(60)
        Path(marker).write_text(reached, encoding="utf-8")
        while Path(marker).exists():
            time.sleep(0.02)

    return hook
