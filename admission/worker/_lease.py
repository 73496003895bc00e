"""Exclusive ownership of a worker queue: a file lock and a lease with a fencing token (worker contract §3).

On one machine a non-blocking ``fcntl.flock`` (:class:`~admission.worker.FileLock`)
covers the whole time a worker owns the queue.  Every owner also claims the
queue's lease in its store, which increments the fencing ``token``; the
worker writes that token into every record it updates, and the store
refuses a token that is not current (on SQL, the trigger ``worker_records_fence``).

Liveness is judged only on the claimant's own monotonic clock: a held lease
is taken over after the claimant has watched its (token, heartbeat) stand
still for ``ttl`` seconds; the holder bumps the heartbeat at least every
``ttl / 2`` of its own monotonic clock.  No stored wall-clock time decides.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from admission._files import FileLock
from admission.errors import FencedError, LeaseHeldError, RecordStateError
from admission.worker._store import WorkerStore

__all__ = ["QueueLease"]


@dataclass
class _Observation:
    token: int
    heartbeat: int
    seen_at: float


@dataclass
class _Ownership:
    token: int
    renewed_at: float
    lock: FileLock | None = field(default=None)


class QueueLease:
    """The ownership of one queue by one holder.

    The lease lives in ``store``; ``local_exclusive``: the file lock alone
    proves no other worker is alive (an embedded database on one machine), so
    a claim holding it takes the lease at once, still with a new token.
    """

    def __init__(
        self,
        queue: str,
        holder: str,
        *,
        store: WorkerStore,
        lock_path: str | os.PathLike[str] | None,
        local_exclusive: bool,
        lease_ttl: float,
        claim_wait: float,
        now: Callable[[], datetime],
        monotonic: Callable[[], float],
    ) -> None:
        self.queue = queue
        self.holder = holder
        self.lock_path = None if lock_path is None else Path(lock_path)
        self.lease_ttl = lease_ttl
        self.claim_wait = claim_wait
        self._store = store
        self._local_exclusive = local_exclusive
        self._now = now
        self._monotonic = monotonic
        self._observed: _Observation | None = None
        self._owned: _Ownership | None = None

    @property
    def token(self) -> int | None:
        """The fencing token while owned, else ``None``."""
        return None if self._owned is None else self._owned.token

    @contextmanager
    def owned(self) -> Iterator[int]:
        """Own the queue for the block: file lock (if any), then a lease claim; yields the token."""
        if self._owned is not None:
            yield self._owned.token
            return
        self.claim()
        try:
            assert self._owned is not None
            yield self._owned.token
        finally:
            self.release()

    def claim(self) -> int:
        """Take the file lock and claim the lease with a new fencing token.

        A lease held by another holder is taken over only if it was released,
        or if this claimant has watched its heartbeat stand still for
        ``lease_ttl`` seconds of its own monotonic clock (a stored time alone
        never proves an owner dead), or, on SQLite, because the file lock held
        here proves no other local worker is alive.
        """
        lock = FileLock(self.lock_path) if self.lock_path is not None else None
        if lock is not None:
            lock.acquire()
        deadline = self._monotonic() + self.claim_wait
        try:
            while True:
                try:
                    token = self._claim_lease(local_exclusive=lock is not None and self._local_exclusive)
                    break
                except LeaseHeldError:
                    # ``claim_wait`` lets a claimant watch a dead owner's heartbeat
                    # stand still for the ttl, then take over.
                    if self._monotonic() >= deadline:
                        raise
                    time.sleep(min(self.lease_ttl / 4, max(0.0, deadline - self._monotonic()), 1.0))
        except BaseException:
            if lock is not None:
                lock.release()
            raise
        self._owned = _Ownership(token, self._monotonic(), lock)
        return token

    def _claim_lease(self, *, local_exclusive: bool) -> int:
        with self._store.transaction(self.queue) as tx:
            lease = tx.lease()
            seen = self._monotonic()
            pair = (lease.token, lease.heartbeat)
            observed = self._observed
            stale = (
                observed is not None
                and (observed.token, observed.heartbeat) == pair
                and seen - observed.seen_at >= self.lease_ttl
            )
            if lease.holder is not None and not local_exclusive and not stale:
                if observed is None or (observed.token, observed.heartbeat) != pair:
                    self._observed = _Observation(lease.token, lease.heartbeat, seen)
                raise LeaseHeldError(
                    f"queue {self.queue!r} is leased to {lease.holder} (token {lease.token}); "
                    f"it is taken over only after its heartbeat stands still for {self.lease_ttl}s",
                    queue=self.queue,
                    holder=lease.holder,
                    token=lease.token,
                )
            token = lease.token + 1
            tx.take_lease(token, self.holder, self._now())
        self._observed = None
        return token

    def renew(self) -> None:
        """Bump the heartbeat under the current token; FencedError if the lease was taken."""
        owned = self._require_owned()
        with self._store.transaction(self.queue) as tx:
            renewed = tx.renew_lease(owned.token)
        if not renewed:
            raise FencedError(
                f"the lease of queue {self.queue!r} is no longer token {owned.token}",
                queue=self.queue,
                token=owned.token,
            )
        owned.renewed_at = self._monotonic()

    def release(self) -> None:
        """Give the lease up (if still ours) and drop the file lock."""
        owned = self._owned
        if owned is None:
            return
        self._owned = None
        try:
            with self._store.transaction(self.queue) as tx:
                tx.release_lease(owned.token)
        finally:
            if owned.lock is not None:
                owned.lock.release()

    def _require_owned(self) -> _Ownership:
        if self._owned is None:
            raise RecordStateError("the worker does not own its queue", write_id=None, state=None)
        return self._owned

    def keep(self) -> None:
        """Renew if half the ttl has passed on this holder's monotonic clock."""
        # Renew at half the ttl, so a claimant (who waits a whole ttl after the
        # heartbeat stops) never sees a live owner as stale.
        owned = self._require_owned()
        if self._monotonic() - owned.renewed_at >= self.lease_ttl / 2:
            self.renew()
