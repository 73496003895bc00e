"""Runs durable jobs step by step: claim, resume, checkpoint, publish, acknowledge (worker contract §4).

A job's kind names a :class:`StepHandler`: called with the job's payload, the
step number and the state the previous step left, it returns
:class:`Continue` (the new state, checkpointed before the next step) or
:class:`Finish` (the result).  The runner owns the order of the writes:

1. claim (a new fencing token);
2. if the lease carries a recorded result, **recover** and execute nothing:
   read the target back; consistent -> ``completed`` (``recovered_after_publish``),
   inconsistent -> ``recovery_required``, absent -> publish again with the
   recorded attempt id and result, then acknowledge;
3. otherwise run steps from ``resume_step + 1``, checkpointing each;
4. record the result (fenced), publish it, acknowledge (fenced).

While a step runs, a thread renews the lease every ``heartbeat_every``
seconds (default: a third of the service's ``lease_seconds``), so a step may
take longer than the lease without another owner reclaiming the job and
running it again; a renewal the database refuses (the lease was taken after
all, for instance while this process was paused) stops the renewals, and the
next fenced write ends the attempt (``fenced``).

A step that raises :class:`~admission.errors.RetryableJobError` ends the
attempt retryable, any other exception ends it failed.  A cancel request seen
at a step boundary stops the job there.  The runner never publishes after its
own lease deadline (monotonic clock): it stops and lets the next owner recover;
an owner paused past that check is stopped by the target, which refuses a
publication carrying an older fencing token than one it has seen
(:class:`~admission.jobs._values.Publisher`).  A target that fails (a read
back or a publication raises) has the failure recorded on the job
(``JobService.publication_failed``) before the exception goes on to the
caller; the job stays ``running`` and the next claim recovers it, a bounded
number of times.

**One runner per scope on a machine** (contract §3).  Each ``run`` and
``run_next`` holds a non-blocking OS file lock on the job's scope
(``<lock_dir>/<sha256(scope)[:32]>.lock``, :class:`~admission._files.FileLock`)
for its whole claim-step-publish-acknowledge cycle; a second runner on the
same machine is refused at once (:class:`~admission.errors.JobLockedError`)
before it claims or writes anything, for as long as the first process lives,
however long it stalls.  The OS drops the lock when the process dies.  The
lock does not shorten a takeover: the next runner still watches the dead
owner's lease for a whole lease before reclaiming, because a job may also
be claimed through :class:`~admission.jobs.JobService` directly, without the
lock; the lock proves that no *runner* of this machine lives, not that no
owner does.  Across machines (PostgreSQL) the lease and the fence decide.
"""

from __future__ import annotations

import hashlib
import os
import threading
import traceback
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal, Protocol

from admission import telemetry
from admission._files import FileLock
from admission.errors import (
    AdmissionError,
    InputError,
    InvalidJobError,
    JobFencedError,
    JobLockedError,
    OwnershipError,
    RetryableJobError,
)
from admission.intent._encoding import Value
from admission.jobs._service import JobService
from admission.jobs._values import MAX_ID_LENGTH, JobLease, JobView, Publisher, bounded_diagnostic, check_text

__all__ = ["Continue", "Finish", "JobRunner", "RunReport", "StepHandler"]

_log: Final = telemetry.logger("jobs")


@dataclass(frozen=True)
class Continue:
    """A step finished and the job goes on; ``state`` is checkpointed."""

    state: Value


@dataclass(frozen=True)
class Finish:
    """The last step finished with ``result`` (published, then acknowledged)."""

    result: Value


class StepHandler(Protocol):
    """One kind of job: run step ``step`` from ``state`` (``None`` before the first step)."""

    def __call__(self, payload: Value, step: int, state: Value) -> Continue | Finish:
        """Run one step."""


Fault = Callable[[str, int], None]
"""A test hook called at ``after_checkpoint`` (with the step), ``after_record`` and ``after_publish``
(with the last step): crash tests kill the process there."""


@dataclass(frozen=True)
class RunReport:
    """What one ``run`` did.  ``steps`` are the step numbers executed in this run (none on recovery)."""

    job_id: str
    outcome: str
    state: str
    reason: str
    steps: tuple[int, ...] = ()
    published: bool = False


class _Renewal:
    """The lease renewals made while one step runs (see :meth:`JobRunner._renewing`)."""

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline
        self.stop = threading.Event()


def _lock_name(scope: str) -> str:
    """The name of ``scope``'s lock file: a digest, so that any scope makes a short, safe file name."""
    return f"{hashlib.sha256(scope.encode('utf-8', 'surrogatepass')).hexdigest()[:32]}.lock"


def _lock_directory(lock_dir: str | os.PathLike[str]) -> Path:
    """``lock_dir``, made (mode 0700) if it is missing; one that cannot be made is refused."""
    directory = Path(lock_dir)
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        # Nothing was written: a file in the way, a parent that cannot be written.
        raise InputError(f"lock_dir: cannot make {directory}: {exc.strerror}", field="lock_dir") from exc
    return directory


class JobRunner:
    """Claims and runs jobs of a :class:`~admission.jobs.JobService`, publishing through a ``Publisher``.

    ``heartbeat_every``: seconds between lease renewals while a step runs
    (``"auto"``, the default: a third of the service's ``lease_seconds``;
    ``None``: renew only at checkpoints, so every step must end within the
    lease).

    ``lock_dir``: where the scopes' lock files live (made, mode 0700, if
    missing; default: the store's :meth:`~admission.jobs.JobStore.default_lock_dir`,
    ``<file>.job-locks`` beside a SQLite database, none on PostgreSQL).
    ``file_lock``: ``None`` (the default) locks when there is a directory,
    ``False`` never locks, ``True`` requires a directory
    (:class:`~admission.errors.InvalidJobError` naming ``lock_dir`` without one).
    """

    def __init__(
        self,
        service: JobService,
        publisher: Publisher,
        handlers: Mapping[str, StepHandler],
        *,
        fault: Fault | None = None,
        heartbeat_every: float | Literal["auto"] | None = "auto",
        lock_dir: str | os.PathLike[str] | None = None,
        file_lock: bool | None = None,
    ) -> None:
        self.service = service
        self.publisher = publisher
        self.handlers = dict(handlers)
        self.fault = fault
        if heartbeat_every == "auto":
            heartbeat_every = service.lease_seconds / 3
        if heartbeat_every is not None and (
            isinstance(heartbeat_every, bool)
            or not isinstance(heartbeat_every, (int, float))
            or not 0 < heartbeat_every < service.lease_seconds
        ):
            raise InvalidJobError(
                f"must be a number of seconds, positive and shorter than the lease "
                f"({service.lease_seconds} s), got {heartbeat_every!r}",
                field="heartbeat_every",
            )
        self.heartbeat_every: float | None = heartbeat_every
        if lock_dir is None and file_lock is not False:
            lock_dir = service.store.default_lock_dir()
            if lock_dir is None and file_lock:
                raise InvalidJobError("a file lock needs a lock_dir on this store", field="lock_dir")
        self.lock_dir = None if lock_dir is None or file_lock is False else _lock_directory(lock_dir)

    @contextmanager
    def _holding(self, scope: str | None) -> Iterator[None]:
        """Hold the lock file of ``scope`` for the block, or raise JobLockedError at once."""
        if self.lock_dir is None or scope is None:
            yield
            return
        name: str = scope

        def refusal(path: Path) -> OwnershipError:
            # The lock file, not the scope or the payload: the scope is the error's data.
            return JobLockedError(
                f"another job runner on this machine holds {path}, the lock of the job's scope; "
                "one runner per scope runs at a time: nothing was claimed",
                scope=name,
                lock_path=str(path),
            )

        lock = FileLock(self.lock_dir / _lock_name(scope), refusal=refusal)
        lock.acquire()
        try:
            yield
        finally:
            lock.release()

    def _scope_of(self, job_id: str) -> str | None:
        """The job's scope, read before claiming, to lock it; ``None`` without a lock to take."""
        if self.lock_dir is None:
            return None
        # The answers a claim gives without a lock: a malformed id, then an unknown job.
        check_text(job_id, "job_id", MAX_ID_LENGTH, None)
        return self.service.status(job_id).scope

    @contextmanager
    def _renewing(self, lease: JobLease, deadline: float) -> Iterator[_Renewal]:
        """Renew ``lease`` every ``heartbeat_every`` seconds until the block ends."""
        renewal = _Renewal(deadline)
        interval = self.heartbeat_every
        if interval is None:
            yield renewal
            return

        def renew() -> None:
            while not renewal.stop.wait(interval):
                try:
                    control = self.service.heartbeat(lease)
                except JobFencedError:
                    return  # another owner has the job: the step's next fenced write says so
                except AdmissionError:
                    continue  # busy or unavailable: the next beat tries again, the deadline stands
                renewal.deadline = max(renewal.deadline, control.deadline)

        thread = threading.Thread(target=renew, name=f"lease-renewal-{lease.job_id}", daemon=True)
        thread.start()
        try:
            yield renewal
        finally:
            renewal.stop.set()
            thread.join()

    @contextmanager
    def _target_failure(
        self, lease: JobLease, reason: Literal["target_unreadable", "publish_failed"]
    ) -> Iterator[None]:
        """Record on the job why the target failed (``publication_failed``), then let the exception go on.

        The job stays ``running`` with its recorded result: whether a publication landed is
        unknown, so nothing is retried blindly; the next claim recovers, within the recovery
        bound, and a job past it says why with this diagnostic.  A refusal by the target's fence
        is not a failure of the target (a newer owner was there): it goes on untouched.
        """
        try:
            yield
        except JobFencedError:
            raise
        except Exception as exc:
            # The exception's text goes to the job's diagnostic, not to the log: it may quote the result.
            _log.warning("job %s: %s, %s", lease.job_id, reason, type(exc).__name__)
            diagnostic = bounded_diagnostic(f"{type(exc).__name__}: {exc}")
            try:
                self.service.publication_failed(lease, diagnostic, reason=reason)
            except Exception as failure:
                # Fenced, or a busy database: the caller still gets the target's own exception.
                _log.warning("job %s: %s not recorded, %s", lease.job_id, reason, type(failure).__name__)
            raise

    def _step_span(self, lease: JobLease, number: int) -> AbstractContextManager[telemetry.Span]:
        return telemetry.span(
            "admission.job.step",
            {
                "admission.job.id": lease.job_id,
                "admission.job.kind": lease.kind,
                "admission.job.step": number,
                "admission.job.attempt": lease.attempt_id,
            },
        )

    def run(self, job_id: str) -> RunReport:
        """Claim ``job_id`` and take it as far as it goes; a final job is acknowledged, nothing runs.

        Raises :class:`~admission.errors.JobLockedError` when another runner on
        this machine holds the job's scope (nothing claimed, nothing written).
        """
        with self._holding(self._scope_of(job_id)):
            claim = self.service.claim(job_id)
            if claim.lease is None:
                outcome = "final" if claim.outcome == "final" else "not_claimable"
                return RunReport(job_id, outcome, claim.state, claim.reason)
            return self._own(claim.lease)

    def run_next(self, scope: str) -> RunReport | None:
        """Claim and run the oldest claimable job of ``scope``; ``None`` when there is none.

        Raises :class:`~admission.errors.JobLockedError` when another runner on
        this machine holds ``scope`` (nothing claimed, nothing written).
        """
        with self._holding(scope):
            claim = self.service.claim_next(scope)
            if claim is None or claim.lease is None:
                return None
            return self._own(claim.lease)

    def _own(self, lease: JobLease) -> RunReport:
        try:
            if lease.publish_result is not None:
                return self._recover(lease)
            return self._execute(lease)
        except JobFencedError as exc:
            # Another owner took over: this one stops without touching anything else.
            return RunReport(lease.job_id, "fenced", exc.state or self._state_now(lease.job_id), "fenced")

    def _state_now(self, job_id: str) -> str:
        """The job's state as stored: a refusal by the target (a late publication) carries none."""
        try:
            return self.service.status(job_id).state
        except AdmissionError:
            return "unknown"  # the database cannot say right now; the report must not hide the fencing

    def _report(self, view: JobView, steps: list[int], published: bool) -> RunReport:
        return RunReport(view.job_id, view.state, view.state, view.reason, tuple(steps), published)

    def _execute(self, lease: JobLease) -> RunReport:
        handler = self.handlers.get(lease.kind)
        if handler is None:
            view = self.service.fail(lease, f"no handler for job kind {lease.kind!r}", retryable=False)
            return self._report(view, [], False)
        step, state, deadline = lease.resume_step, lease.resume_state, lease.deadline
        steps: list[int] = []
        while True:
            number = step + 1
            try:
                with self._step_span(lease, number) as span, self._renewing(lease, deadline) as renewal:
                    outcome = handler(lease.payload, number, state)
                    span.set(
                        {"admission.job.outcome": "finish" if isinstance(outcome, Finish) else "continue"}
                    )
            except RetryableJobError as exc:
                # The exception's text goes to the job's diagnostic, not to the log: it may quote the payload.
                _log.info("job %s step %d: retryable %s", lease.job_id, number, type(exc).__name__)
                view = self.service.fail(lease, bounded_diagnostic(f"step {number}: {exc}"), retryable=True)
                return self._report(view, steps, False)
            except Exception as exc:
                _log.warning("job %s step %d: failed, %s", lease.job_id, number, type(exc).__name__)
                diagnostic = bounded_diagnostic(f"step {number}: {traceback.format_exc()}")
                view = self.service.fail(lease, diagnostic, retryable=False)
                return self._report(view, steps, False)
            _log.debug("job %s step %d: %s", lease.job_id, number, type(outcome).__name__.lower())
            steps.append(number)
            deadline = renewal.deadline
            if isinstance(outcome, Finish):
                break
            control = self.service.checkpoint(lease, number, outcome.state)
            deadline = control.deadline
            step, state = number, outcome.state
            if self.fault is not None:
                self.fault("after_checkpoint", number)
            if control.cancel_requested:
                return self._report(self.service.cancel_running(lease), steps, False)
        result = self.service.record_result(lease, outcome.result)
        if self.fault is not None:
            self.fault("after_record", steps[-1])
        if self.service.clock() >= deadline:
            # Too late to publish safely: the next owner recovers with the recorded ids.
            return RunReport(lease.job_id, "lease_lost", "running", "lease_lost", tuple(steps))
        with self._target_failure(lease, "publish_failed"):
            self.publisher.publish(lease.job_id, lease.attempt_id, result, fence=lease.fence)
        if self.fault is not None:
            self.fault("after_publish", steps[-1])
        view = self.service.complete(lease)
        return self._report(view, steps, True)

    def _recover(self, lease: JobLease) -> RunReport:
        assert lease.publish_result is not None and lease.publish_attempt_id is not None
        # The fenced read: from here on, an older owner's publication is refused by the target.
        with self._target_failure(lease, "target_unreadable"):
            published = self.publisher.read_published(lease.job_id, fence=lease.fence)
        verdict = self.service.recover(lease, published)
        if verdict != "absent":
            return self._report(self.service.status(lease.job_id), [], False)
        if self.service.clock() >= lease.deadline:
            return RunReport(lease.job_id, "lease_lost", "running", "lease_lost")
        # The publication never landed: replay it with the recorded ids (never re-execute).
        with self._target_failure(lease, "publish_failed"):
            self.publisher.publish(
                lease.job_id, lease.publish_attempt_id, lease.publish_result, fence=lease.fence
            )
        if self.fault is not None:
            self.fault("after_publish", lease.resume_step)
        view = self.service.complete(lease, reason="published_on_replay")
        return self._report(view, [], True)
