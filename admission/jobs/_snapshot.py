"""The jobs snapshot: every job of a scope at one instant, as JSON, exported atomically (contract §6).

:meth:`JobService.snapshot <admission.jobs.JobService.snapshot>` and
:meth:`~admission.jobs.JobService.export_snapshot` (:class:`SnapshotMethods`,
which the service inherits) call :func:`take` and :func:`export`.  The store
reads the snapshot in one read transaction
(:meth:`JobStore.snapshot <admission.jobs.JobStore.snapshot>`); this module
turns it into the documented format (docs/jobs.md, "Snapshot") and writes it
with :func:`admission._files.write_json_atomically`: a reader of the file sees
the previous snapshot or the new one, whole, never a mix or a part.

Left out on purpose: payloads and recorded results (they may hold secrets, and
a snapshot is for dashboards), and checkpoint states (up to 64 KiB each, and
not every canonical value has a JSON form): a checkpoint shows its size and
the SHA-256 of its canonical bytes instead.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Final

from admission._files import write_json_atomically
from admission.errors import InputError, StorageError
from admission.jobs._store import AttemptRow, CheckpointDigest, JobsSnapshot, JobStore, SnapshotJob
from admission.jobs._values import MAX_SCOPE_LENGTH, check_text

__all__ = ["SNAPSHOT_FORMAT", "SnapshotMethods", "check_export_path", "document", "export", "take"]

SNAPSHOT_FORMAT: Final = "admission.jobs.snapshot.v1"
"""The ``format`` of a snapshot document; a change of its shape gets a new version."""


def _time(moment: datetime | None) -> str | None:
    return None if moment is None else moment.astimezone(UTC).isoformat()


def _checkpoint(digest: CheckpointDigest) -> dict[str, object]:
    return {
        "step": digest.step,
        "attempt_id": digest.attempt_id,
        "fence": digest.fence,
        "recorded_at": _time(digest.recorded_at),
        "size": digest.size,
        "sha256": digest.sha256,
    }


def _attempt(attempt: AttemptRow | None) -> dict[str, object] | None:
    if attempt is None:
        return None
    return {
        "attempt_id": attempt.attempt_id,
        "number": attempt.number,
        "fence": attempt.fence,
        "owner": attempt.owner,
        "started_at": _time(attempt.started_at),
        "ended_at": _time(attempt.ended_at),
        "outcome": attempt.outcome,
        "diagnostic": attempt.diagnostic,
    }


def _job(job: SnapshotJob) -> dict[str, object]:
    return {
        "job_id": job.job_id,
        "scope": job.scope,
        "position": job.position,
        "kind": job.kind,
        "state": job.state,
        "reason": job.reason,
        "paused": job.paused,
        "stop_requested": job.stop_requested,
        "cancel_requested": job.cancel_requested,
        "attempts": job.attempts,
        "max_attempts": job.max_attempts,
        "fence": job.fence,
        "owner": job.owner,
        "not_before": _time(job.not_before),
        "depends_on": list(job.depends_on),
        "created_at": _time(job.created_at),
        "updated_at": _time(job.updated_at),
        "result_recorded": job.result_recorded,
        "diagnostic": job.diagnostic,
        "checkpoint_step": job.checkpoint_step,
        "last_attempt": _attempt(job.last_attempt),
        "checkpoints": [_checkpoint(c) for c in job.checkpoints],
    }


def document(snapshot: JobsSnapshot, taken_at: datetime) -> dict[str, object]:
    """The JSON-ready snapshot document (format :data:`SNAPSHOT_FORMAT`; docs/jobs.md, "Snapshot")."""
    return {
        "format": SNAPSHOT_FORMAT,
        "taken_at": _time(taken_at),
        "scope": snapshot.scope,
        "counts": dict(sorted(snapshot.counts.items())),
        "jobs": [_job(job) for job in snapshot.jobs],
    }


def _check_scope(scope: str | None) -> None:
    # A scope no enqueue accepts names no jobs; refused rather than answered empty,
    # so that a typo of a dashboard's configuration shows.
    if scope is not None:
        check_text(scope, "scope", MAX_SCOPE_LENGTH, None)


def take(store: JobStore, scope: str | None, now: Callable[[], datetime]) -> dict[str, object]:
    """The snapshot document of ``scope``'s jobs (every scope's when ``None``), read at one instant.

    ``taken_at`` is ``now()`` read just before the store's read transaction begins.
    A scope that is not 1..255 printable characters is refused with
    :class:`~admission.errors.InvalidJobError` (``field="scope"``), nothing read.
    """
    _check_scope(scope)
    taken_at = now()
    return document(store.snapshot(scope), taken_at)


def check_export_path(path: str | os.PathLike[str]) -> Path:
    """``path`` if a snapshot can be written there: not a directory, in a folder that exists.

    Anything else is refused with :class:`~admission.errors.InputError`
    (``field="path"``) before anything is read or written.
    """
    if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
        raise InputError("path: must be a non-empty file path", field="path")
    target = Path(path)
    if target.is_dir():
        raise InputError(f"path: {target} is a directory", field="path")
    if not target.parent.is_dir():
        what = "is not a folder" if target.parent.exists() else "does not exist"
        raise InputError(f"path: the folder {target.parent} {what}", field="path")
    return target


def export(
    store: JobStore, path: str | os.PathLike[str], scope: str | None, now: Callable[[], datetime]
) -> dict[str, object]:
    """Write :func:`take`'s document to ``path`` atomically; returns what was written.

    A temporary file in the same folder, fsynced, renamed over ``path``, then
    the folder fsynced: a reader, or a crash at any point, leaves ``path`` the
    previous snapshot or the new one, whole.  Refused before anything is read
    or written: a bad ``scope`` (``InvalidJobError``), a ``path`` that cannot
    be a file (``InputError``, ``field="path"``).  A folder that refuses the
    file raises ``InputError`` (``field="path"``), any other failure of the
    file system :class:`~admission.errors.StorageError`; no temporary file is
    left behind either way.
    """
    _check_scope(scope)
    target = check_export_path(path)
    written = take(store, scope, now)
    try:
        write_json_atomically(target, written)
    except (PermissionError, FileNotFoundError, NotADirectoryError, IsADirectoryError) as exc:
        raise InputError(f"path: cannot write {target}: {exc.strerror}", field="path") from exc
    except OSError as exc:
        raise StorageError(f"the snapshot could not be written to {target}: {exc.strerror}") from exc
    return written


class SnapshotMethods:
    """The snapshot methods of :class:`~admission.jobs.JobService` (which sets ``store`` and ``now``)."""

    store: JobStore
    now: Callable[[], datetime]

    def snapshot(self, scope: str | None = None) -> dict[str, object]:
        """Every job of ``scope`` (of every scope when ``None``) read at one instant, as a JSON-ready
        document (docs/jobs.md, "Snapshot"): no payload, result or checkpoint state in it."""
        return take(self.store, scope, self.now)

    def export_snapshot(self, path: str | os.PathLike[str], scope: str | None = None) -> dict[str, object]:
        """Write :meth:`snapshot` to ``path`` atomically (contract §6); returns what was written.

        Temporary file in the same folder, fsync, rename, folder fsync: the file
        is always the previous snapshot or the new one, whole.  A bad ``scope``
        or a ``path`` that cannot be a file is refused (``field`` names it) with
        nothing written (see :func:`export`).
        """
        return export(self.store, path, scope, self.now)
