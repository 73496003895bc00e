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
"""

from __future__ import annotations

import threading
import traceback
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Final, Literal, Protocol

from admission import telemetry
from admission.errors import AdmissionError, InvalidJobError, JobFencedError, RetryableJobError
from admission.intent._encoding import Value
from admission.jobs._service import JobService
from admission.jobs._values import JobLease, JobView, Publisher, bounded_diagnostic

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


class JobRunner:
    """Claims and runs jobs of a :class:`~admission.jobs.JobService`, publishing through a ``Publisher``.

    ``heartbeat_every``: seconds between lease renewals while a step runs
    (``"auto"``, the default: a third of the service's ``lease_seconds``;
    ``None``: renew only at checkpoints, so every step must end within the
    lease).
    """

    def __init__(
        self,
        service: JobService,
        publisher: Publisher,
        handlers: Mapping[str, StepHandler],
        *,
        fault: Fault | None = None,
        heartbeat_every: float | Literal["auto"] | None = "auto",
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
        """Claim ``job_id`` and take it as far as it goes; a final job is acknowledged, nothing runs."""
        claim = self.service.claim(job_id)
        if claim.lease is None:
            outcome = "final" if claim.outcome == "final" else "not_claimable"
            return RunReport(job_id, outcome, claim.state, claim.reason)
        return self._own(claim.lease)

    def run_next(self, scope: str) -> RunReport | None:
        """Claim and run the oldest claimable job of ``scope``; ``None`` when there is none."""
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
            return RunReport(lease.job_id, "fenced", exc.state or "unknown", "fenced")

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
