"""Shared pieces of the job tests: a manual monotonic clock, step handlers, a store factory."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy import Engine, func, select

from admission.intent import Value
from admission.jobs import Continue, Finish, JobStore
from admission.sql import (
    create_admission_engine,
    worker_job_attempts,
    worker_job_checkpoints,
    worker_job_events,
    worker_jobs,
)

LEASE = 10.0


@dataclass
class ManualClock:
    """A monotonic clock that only moves when told to."""

    now: float = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def open_jobs(url: str, clock: ManualClock | None = None, **options: object) -> JobStore:
    """A job store on ``url`` driven by a manual clock."""
    return JobStore(
        create_admission_engine(url), clock=clock or ManualClock(), lease_seconds=LEASE, **options
    )  # type: ignore[arg-type]


@dataclass
class Counting:
    """A step handler: ``payload["steps"]`` steps, each adds its number to the state; the result is the sum.

    Every call is recorded in ``calls``; ``fail_at`` maps a step to the exception it raises once.
    """

    calls: list[tuple[int, Value]] = field(default_factory=list)
    fail_at: dict[int, BaseException] = field(default_factory=dict)
    log: Path | None = None

    def __call__(self, payload: Value, step: int, state: Value) -> Continue | Finish:
        self.calls.append((step, state))
        if self.log is not None:
            with open(self.log, "a", encoding="utf-8") as out:
                out.write(f"{os.getpid()} {step}\n")
                out.flush()
                os.fsync(out.fileno())
        if step in self.fail_at:
            raise self.fail_at.pop(step)
        assert isinstance(payload, dict)
        total = (state if isinstance(state, int) else 0) + step
        steps = payload["steps"]
        assert isinstance(steps, int)
        return Finish({"sum": total}) if step >= steps else Continue(total)


def counts(engine: Engine) -> dict[str, int]:
    """Rows in each job table: a refused write leaves them all unchanged."""
    with engine.connect() as conn:
        return {
            table.name: int(conn.execute(select(func.count()).select_from(table)).scalar_one())
            for table in (worker_jobs, worker_job_events, worker_job_attempts, worker_job_checkpoints)
        }


def expire(store: JobStore, clock: ManualClock, job_id: str) -> None:
    """Let ``store`` watch ``job_id`` for a whole lease, so that its next claim reclaims it."""
    answer = store.claim(job_id)
    assert (answer.outcome, answer.reason) == ("not_claimable", "lease_live"), answer
    clock.advance(LEASE)


def sum_of(steps: int) -> Callable[[], dict[str, int]]:
    return lambda: {"sum": steps * (steps + 1) // 2}
