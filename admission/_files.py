"""Local files: the ownership lock file and atomic JSON export (worker contract §3, §6).

Shared by the durable worker (a lock per queue) and the job runner (a lock per scope).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from admission.errors import InputError, OwnershipError, WorkerLockedError

__all__ = ["FileLock", "write_json_atomically"]


def write_json_atomically(path: str | os.PathLike[str], payload: object) -> None:
    """Write JSON to ``path`` so that a reader sees the old file or the new one, never half:
    a temporary file in the same directory, fsync, rename, fsync of the directory."""
    target = Path(path)
    # A name of its own (threads and processes may export at once), removed
    # if anything fails before the rename.
    descriptor, temporary = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        os.fchmod(descriptor, 0o644)  # as an ordinary new file, not mkstemp's 0600
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            json.dump(payload, handle, indent=2, sort_keys=True)
            handle.write("\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise
    directory = os.open(target.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def _worker_locked(path: Path) -> OwnershipError:
    return WorkerLockedError(
        f"another worker holds {path}; only one local worker may own the queue", lock_path=str(path)
    )


class FileLock:
    """A non-blocking exclusive ``fcntl.flock`` on a lock file (contract §3).

    The OS drops it when the process dies, however it dies, so a second
    worker can start exactly when the first is gone.

    ``refusal`` makes the error raised when another process holds the lock
    (default: :class:`~admission.errors.WorkerLockedError`).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        refusal: Callable[[Path], OwnershipError] | None = None,
    ) -> None:
        self.path = Path(path)
        self._refusal = refusal or _worker_locked
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock, or raise the refusal (``WorkerLockedError``) at once if another process has it.

        A path where no lock file can be made (a directory, a missing or
        unwritable folder) raises :class:`~admission.errors.InputError`.
        """
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError) as exc:
            # A path no lock file can be made at: the input is wrong, and nothing was written.
            message = f"cannot open the lock file {self.path}: {exc.strerror}"
            raise InputError(message, field="lock_path") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise self._refusal(self.path) from None
        self._fd = fd

    def release(self) -> None:
        """Let the lock go."""
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    @property
    def held(self) -> bool:
        """Whether this object holds the lock."""
        return self._fd is not None
