"""The job service on every job store, checked against a reference model of the table (contract §4).

The machine's jobs go to two scopes, alternately, so the model restates the rule
of one running job per scope too: a waiting job's claim answers ``scope_busy``
while another job of its scope runs, and a job of the other scope runs beside it."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import ClassVar

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from admission.errors import JobFencedError, JobQueueFullError, JobStateError
from admission.intent import canonical_encode
from admission.jobs import (
    FINAL_JOB_STATES,
    JOB_TRANSITIONS,
    UNFINISHED_JOB_STATES,
    WAITING_JOB_STATES,
    Backoff,
    Job,
    JobLease,
    JobService,
    initial_state,
)
from admission.testing import MemoryPublisher
from tests.conftest import SUMMARY_LINES
from tests.support.jobkit import LEASE, JobStores, ManualClock, WallClock, jobs_on

# -- the store against a reference model of the table -----------------------------------------------------

RESULT = canonical_encode({"done": True})
WHICH = st.sampled_from([-1, -1, -1, -2, 0])
"""Which lease of a job a write uses: mostly the newest, sometimes a stale one."""
STEPS: dict[str, int] = {}
BACKOFF = Backoff(base=LEASE / 2, factor=2.0, cap=LEASE, jitter=0.0)
"""A retry waits half a lease, then a lease: the steps of ``time_passes`` end it, or not yet."""


@dataclass
class ModelJob:
    deps: tuple[str, ...]
    max_attempts: int
    state: str
    attempts: int = 0
    fence: int = 0
    beat: int = 0
    paused: bool = False
    cancel: bool = False
    stop: bool = False
    step: int = 0
    result_attempt: str | None = None
    result_number: int = 0
    """The number of the attempt that recorded the result: the attempts after it are recoveries."""
    seen: tuple[tuple[int, int], float] | None = None
    published: list[tuple[str, bytes]] = field(default_factory=list)
    not_before: float | None = None
    scope: int = 0


class Model:
    """The job rules restated on plain data, from the table and docs/jobs.md."""

    def __init__(self, max_waiting: int, lease: float) -> None:
        self.jobs: dict[str, ModelJob] = {}
        self.max_waiting = max_waiting
        self.lease = lease
        self.now = 0.0

    def to(self, job_id: str, event: str) -> None:
        job = self.jobs[job_id]
        job.state = JOB_TRANSITIONS[(job.state, event)]
        if job.state != "retry_wait":
            job.not_before = None
        if job.state == "completed":
            for other_id, other in sorted(self.jobs.items()):
                ready = all(self.jobs[d].state == "completed" for d in other.deps)
                if other.state == "blocked" and job_id in other.deps and ready:
                    self.to(other_id, "unblock")
        elif job.state in ("failed", "cancelled"):
            for other_id, other in sorted(self.jobs.items()):
                if other.state == "blocked" and job_id in other.deps:
                    self.to(other_id, "dependency_failed")

    def enqueue(self, job_id: str, deps: tuple[str, ...], max_attempts: int) -> str:
        scope = len(self.jobs) % 2  # the bound is per scope
        waiting = sum(1 for j in self.jobs.values() if j.scope == scope and j.state in UNFINISHED_JOB_STATES)
        if waiting + 1 > self.max_waiting:
            return "full"
        state = initial_state([self.jobs[d].state for d in deps])
        self.jobs[job_id] = ModelJob(deps, max_attempts, state, scope=scope)
        if any(self.jobs[d].state in ("failed", "cancelled") for d in deps):
            self.to(job_id, "dependency_failed")
        return self.jobs[job_id].state

    def claim(self, job_id: str) -> tuple[str, str]:
        job = self.jobs[job_id]
        if job.state in FINAL_JOB_STATES:
            return "final", job.state
        if job.state in ("blocked", "recovery_required"):
            return "not_claimable", job.state
        if job.paused:
            return "not_claimable", "paused"
        if job.not_before is not None and self.now < job.not_before:
            return "not_claimable", "backoff"
        event = "claim"
        if job.state == "running":
            pair = (job.fence, job.beat)
            if job.seen is None or job.seen[0] != pair:
                job.seen = (pair, self.now)
                return "not_claimable", "lease_live"
            if self.now - job.seen[1] < self.lease:
                return "not_claimable", "lease_live"
            if job.result_attempt is None:
                ending = (
                    "cancelled_after_reconciliation" if job.cancel
                    else "stopped_before_restart" if job.stop
                    else "attempts_exhausted" if job.attempts >= job.max_attempts
                    else None
                )  # fmt: skip
                if ending is not None:
                    self.to(job_id, ending)
                    return "final", job.state
            elif job.attempts - job.result_number >= job.max_attempts:
                # Recovery is bounded by max_attempts too, counted from the recording attempt.
                self.to(job_id, "recovery_exhausted")
                return "not_claimable", "recovery_exhausted"
            event = "reclaim"
        elif any(other.state == "running" and other.scope == job.scope for other in self.jobs.values()):
            return "not_claimable", "scope_busy"  # one running job per scope
        self.to(job_id, event)
        job.fence += 1
        job.beat += 1
        job.attempts += 1
        job.seen = None
        return "claimed", "running"

    def fenced(self, job_id: str, fence: int) -> bool:
        job = self.jobs[job_id]
        return job.state == "running" and job.fence == fence

    def request(self, job_id: str, name: str) -> None:
        job = self.jobs[job_id]
        if job.state in WAITING_JOB_STATES:
            self.to(job_id, name)
        elif job.state == "running":
            setattr(job, name if name == "stop" else "cancel", True)

    def mark(self, job_id: str, paused: bool) -> None:
        job = self.jobs[job_id]
        if job.state not in FINAL_JOB_STATES:
            job.paused = paused


class JobMachine(RuleBasedStateMachine):
    """Random operations on one scope of a real store and on the model; they must agree after each."""

    store: JobService
    clock: ManualClock
    wall: WallClock
    counter = itertools.count()
    steps = 0
    backoffs = 0
    busy = 0
    enqueued: ClassVar[list[str]] = []

    def __init__(self) -> None:
        super().__init__()
        self.scope = f"scope-{next(self.counter)}"
        self.model = Model(self.store.max_waiting, LEASE)
        self.model.now = self.clock.now
        self.publisher = MemoryPublisher()
        self.leases: dict[str, list[JobLease]] = {}

    jobs = Bundle("jobs")

    def _id(self) -> str:
        return f"{self.scope}-j{len(self.model.jobs)}"

    @initialize(target=jobs)
    def first(self) -> str:
        return self._enqueue((), 2)

    @initialize(target=jobs)
    def second(self) -> str:
        return self._enqueue((), 3)

    @initialize(target=jobs)
    def recovered(self) -> str:
        """Every program also starts with a job recovered after a crash between its publication
        and its acknowledgement: the corner random rules reach least often, checked each time."""
        job_id = self._enqueue((), 3)
        self.crash_after_publish_then_recover(job_id, tampered=False)
        return job_id

    @initialize()
    def recovery_meets_its_bound(self) -> None:
        """Every program also runs a job whose target stays unreadable: the owner records why, then
        recovery after recovery dies, until the bound moves it to recovery_required; an operator
        resolves it (which frees its place in the scope's bound for the rest of the program)."""
        job_id = self._enqueue((), 1)
        self.claim(job_id)
        self.finish(job_id, -1, publish=False, ack=False)
        self._write(job_id, self.leases[job_id][-1], lambda: self._target_fails(job_id), lambda job: False)
        for _ in range(2):
            self.watch_then_claim(job_id)
        assert self.store.status(job_id).state == self.model.jobs[job_id].state == "recovery_required"
        self.store.resolve(job_id, "failed", who="model", why="target lost")
        self.model.to(job_id, "resolve_failed")

    def _target_fails(self, job_id: str) -> None:
        lease = self.leases[job_id][-1]
        self.store.publication_failed(lease, "ConnectionError: unreachable", reason="target_unreadable")

    @initialize(target=jobs)
    def retried(self) -> str:
        """And with a job that failed retryably and is claimed again at once: refused for its
        backoff (whichever draw follows, and whatever else of its scope runs, as the model says)."""
        job_id = self._enqueue((), 3)
        self.claim_then_fail(job_id, retryable=True)
        self.claim(job_id)
        return job_id

    def _enqueue(self, deps: tuple[str, ...], max_attempts: int) -> str:
        job_id = self._id()
        scope = f"{self.scope}-{len(self.model.jobs) % 2}"  # the model's scope of the job
        expected = self.model.enqueue(job_id, deps, max_attempts)
        try:
            answer = self.store.enqueue(Job(job_id, scope, "k", None, deps, max_attempts))
        except JobQueueFullError:
            assert expected == "full"
            return deps[0] if deps else f"{self.scope}-j0"
        assert (answer.outcome, answer.state) == ("enqueued", expected)
        JobMachine.enqueued.append(job_id)
        return job_id

    @rule(target=jobs, deps=st.lists(jobs, unique=True, max_size=2), max_attempts=st.integers(1, 3))
    def enqueue(self, deps: list[str], max_attempts: int) -> str:
        return self._enqueue(tuple(deps), max_attempts)

    @rule(target=jobs, max_attempts=st.integers(1, 3))
    def enqueue_independent(self, max_attempts: int) -> str:
        return self._enqueue((), max_attempts)

    @rule(job_id=jobs)
    def claim(self, job_id: str) -> None:
        expected = self.model.claim(job_id)
        answer = self.store.claim(job_id)
        JobMachine.backoffs += answer.reason == "backoff"
        JobMachine.busy += answer.reason == "scope_busy"
        assert (
            answer.outcome,
            answer.state if answer.outcome != "not_claimable" else answer.reason,
        ) == expected
        if answer.lease is not None:
            assert answer.lease.fence == self.model.jobs[job_id].fence
            assert (answer.lease.publish_result is not None) == (
                self.model.jobs[job_id].result_attempt is not None
            )
            self.leases.setdefault(job_id, []).append(answer.lease)

    @rule(job_id=jobs)
    def watch_then_claim(self, job_id: str) -> None:
        """A claim, a whole lease of silence, a claim: how an expired lease gets reclaimed."""
        self.claim(job_id)
        self.time_passes(LEASE)
        self.claim(job_id)

    @rule(seconds=st.sampled_from([LEASE / 2, LEASE]))
    def time_passes(self, seconds: float) -> None:
        self.clock.advance(seconds)
        self.wall.advance(seconds)
        self.model.now += seconds

    def _lease(self, job_id: str, which: int) -> JobLease | None:
        held = self.leases.get(job_id)
        return held[which % len(held)] if held else None

    def _write(self, job_id: str, lease: JobLease, action, model_action) -> None:  # type: ignore[no-untyped-def]
        job = self.model.jobs[job_id]
        if not self.model.fenced(job_id, lease.fence):
            with pytest.raises(JobFencedError):
                action()
            return
        refused = model_action(job)
        if refused:
            with pytest.raises(JobStateError):
                action()
            return
        action()
        job.beat += 1

    @rule(job_id=jobs, which=WHICH)
    def checkpoint(self, job_id: str, which: int) -> None:
        lease = self._lease(job_id, which)
        if lease is None:
            return
        step = self.model.jobs[job_id].step + 1

        def model_action(job: ModelJob) -> bool:
            job.step += 1
            return False

        self._write(job_id, lease, lambda: self.store.checkpoint(lease, step, step), model_action)

    @rule(job_id=jobs, which=WHICH, retryable=st.booleans())
    def fail(self, job_id: str, which: int, retryable: bool) -> None:
        lease = self._lease(job_id, which)
        if lease is None:
            return

        def model_action(job: ModelJob) -> bool:
            if job.result_attempt is not None:
                return True
            if not retryable:
                self.model.to(job_id, "fatal_failure")
            elif job.cancel:
                self.model.to(job_id, "cancelled_after_reconciliation")
            elif job.stop:
                self.model.to(job_id, "stopped_before_restart")
            elif job.attempts < job.max_attempts:
                self.model.to(job_id, "retryable_failure")
                job.not_before = self.model.now + BACKOFF.ceiling(job.attempts)
            else:
                self.model.to(job_id, "attempts_exhausted")
            return False

        self._write(job_id, lease, lambda: self.store.fail(lease, "x", retryable=retryable), model_action)

    @rule(job_id=jobs, which=WHICH, publish=st.sampled_from([True, True, False]), ack=st.booleans())
    def finish(self, job_id: str, which: int, publish: bool, ack: bool) -> None:
        """Record the result; maybe publish it; maybe acknowledge (else: a crash right there)."""
        lease = self._lease(job_id, which)
        if lease is None:
            return

        def model_action(job: ModelJob) -> bool:
            if job.result_attempt is not None:
                return True
            job.result_attempt, job.result_number = lease.attempt_id, lease.attempt_number
            return False

        before = self.model.jobs[job_id].result_attempt
        self._write(job_id, lease, lambda: self.store.record_result(lease, {"done": True}), model_action)
        if self.model.jobs[job_id].result_attempt is None or before is not None:
            return
        if publish:
            self.publisher.publish(job_id, lease.attempt_id, RESULT)
            self.model.jobs[job_id].published.append((lease.attempt_id, RESULT))
        if publish and ack:
            self.store.complete(lease)
            self.model.to(job_id, "complete")

    @rule(job_id=jobs)
    def tamper(self, job_id: str) -> None:
        """Someone else publishes for the job: the target no longer holds one consistent result."""
        self.publisher.publish(job_id, "intruder", b"\x00")
        self.model.jobs[job_id].published.append(("intruder", b"\x00"))

    @rule(job_id=jobs, which=WHICH)
    def recover(self, job_id: str, which: int) -> None:
        lease = self._lease(job_id, which)
        if lease is None:
            return
        job = self.model.jobs[job_id]
        verdict: list[str] = []

        def model_action(job: ModelJob) -> bool:
            if job.result_attempt is None:
                return True
            if not job.published:
                verdict.append("absent")
            elif job.published == [(job.result_attempt, RESULT)]:
                verdict.append("consistent")
                self.model.to(job_id, "recovered_after_publish")
            else:
                verdict.append("inconsistent")
                self.model.to(job_id, "inconsistent_publication")
            return False

        got: list[str] = []

        def action() -> None:
            got.append(self.store.recover(lease, self.publisher.read_published(job_id)))

        self._write(job_id, lease, action, model_action)
        assert got == verdict
        assert job is self.model.jobs[job_id]

    @rule(job_id=jobs, name=st.sampled_from(["cancel", "stop", "pause", "resume", "resume"]))
    def request(self, job_id: str, name: str) -> None:
        if name in ("pause", "resume"):
            self.model.mark(job_id, name == "pause")
        else:
            self.model.request(job_id, name)
        getattr(self.store, name)(job_id)

    @rule(job_id=jobs, tampered=st.booleans())
    def crash_after_publish_then_recover(self, job_id: str, tampered: bool) -> None:
        """Claim, publish without acknowledging, let the lease expire, reclaim, recover."""
        self.claim(job_id)
        self.finish(job_id, -1, publish=True, ack=False)
        if tampered:
            self.tamper(job_id)
        self.watch_then_claim(job_id)
        self.recover(job_id, -1)

    @rule(job_id=jobs)
    def reclaim_then_write_with_the_old_lease(self, job_id: str) -> None:
        """The old owner of a reclaimed job comes back and writes: the model says refused."""
        self.claim(job_id)
        self.watch_then_claim(job_id)
        self.checkpoint(job_id, -2)
        self.fail(job_id, -2, retryable=True)

    @rule(job_id=jobs, retryable=st.booleans())
    def claim_then_fail(self, job_id: str, retryable: bool) -> None:
        self.claim(job_id)
        self.checkpoint(job_id, -1)
        self.fail(job_id, -1, retryable)

    @invariant()
    def agree(self) -> None:
        JobMachine.steps += 1
        for job_id, job in self.model.jobs.items():
            view = self.store.status(job_id)
            got = (view.state, view.fence, view.attempts, view.paused, view.checkpoint_step)
            assert got == (job.state, job.fence, job.attempts, job.paused, job.step), job_id
            assert (view.cancel_requested, view.stop_requested) == (job.cancel, job.stop), job_id
            wall = None if job.not_before is None else self.wall.at(job.not_before - self.model.now)
            assert view.not_before == wall, job_id
        for scope in (0, 1):  # one running job per scope
            assert self.store.counts(f"{self.scope}-{scope}").get("running", 0) <= 1


def test_the_store_agrees_with_the_reference_model(job_stores: JobStores) -> None:
    clock, wall = ManualClock(), WallClock()
    store = jobs_on(job_stores.open(), clock, max_waiting=4, now=wall, backoff=BACKOFF)
    JobMachine.store, JobMachine.clock, JobMachine.steps, JobMachine.enqueued = store, clock, 0, []
    JobMachine.wall, JobMachine.backoffs, JobMachine.busy = wall, 0, 0
    run_state_machine_as_test(
        # Derandomised on every machine: the corners asserted below are
        # reached by this draw, while a random 20 programs can miss one.
        JobMachine,
        settings=settings(max_examples=20, stateful_step_count=50, deadline=None, derandomize=True),
    )
    # Every event belongs to a job the machine enqueued: read them all through the port.
    seen: dict[str, int] = {}
    for job_id in JobMachine.enqueued:
        for event in store.events(job_id):
            seen[event.event] = seen.get(event.event, 0) + 1
    SUMMARY_LINES.append(
        f"job model state machine on {job_stores.backend}: {JobMachine.steps} steps checked, "
        f"{JobMachine.backoffs} claims refused for a backoff, {JobMachine.busy} for a busy scope; events "
        + ", ".join(f"{event} {n}" for event, n in sorted(seen.items()))
    )
    # The run reached the interesting corners of the table, not only the easy ones.
    for event in (
        "reclaim",
        "recovered_after_publish",
        "inconsistent_publication",
        "recovery_exhausted",
        "publication_failed",
        "retryable_failure",
    ):
        assert seen.get(event, 0) > 0, (event, seen)
    assert JobMachine.backoffs > 0 and JobMachine.busy > 0
