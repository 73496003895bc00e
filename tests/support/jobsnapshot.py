"""Pieces of the jobs-snapshot tests: a mixed history, the invariants of one instant, and the
comparison of a snapshot document with the ``worker_job*`` tables read directly with SQL."""

from __future__ import annotations

import hashlib
from collections import Counter, defaultdict
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import Engine, select

from admission.intent import canonical_encode
from admission.jobs import Backoff, Job, JobService
from admission.sql._schema import (
    worker_job_attempts,
    worker_job_checkpoints,
    worker_job_dependencies,
    worker_jobs,
)
from admission.sql._times import as_utc
from admission.testing import MemoryPublisher
from tests.support.jobkit import ManualClock, expire, jobs_on

SECRET = "payload-secret-7f3a"
"""Put in every payload and result of the mixed history: it must appear nowhere in a snapshot."""

HOUR = Backoff(base=3600.0, cap=3600.0, jitter=0.0)
"""The mixed history's retry backoff: a failed job waits in ``retry_wait`` with a ``not_before``."""


def mixed_history(jobs: JobService, clock: ManualClock) -> dict[str, str]:
    """Jobs in every state the snapshot must show, in three scopes, at most one running per scope.

    Returns the expected state of each job.  ``jobs`` must retry with :data:`HOUR`.
    """
    secret = {"steps": 3, "token": SECRET}
    jobs.enqueue_all(
        [
            Job("a-done", "alpha", "count", secret),
            Job("a-run", "alpha", "count", secret),
            Job("a-blocked", "alpha", "count", secret, depends_on=("a-run",)),
            Job("a-paused", "alpha", "count", secret),
            Job("b-retry", "beta", "count", secret, max_attempts=3),
            Job("b-failed", "beta", "count", secret),
            Job("b-recovery", "beta", "count", secret),
            Job("g-queued", "gamma", "count", secret, depends_on=("a-done",)),
            Job("g-cancelled", "gamma", "count", secret),
            Job("g-run", "gamma", "count", secret),
        ]
    )
    # alpha: one completed (checkpointed), then one running with two checkpoints and a stop request.
    lease = jobs.claim("a-done").lease
    assert lease is not None
    jobs.checkpoint(lease, 1, 1)
    jobs.checkpoint(lease, 2, {"partial": [1, 2], "big": "x" * 3000})
    jobs.record_result(lease, {"sum": 3, "token": SECRET})
    jobs.complete(lease)
    lease = jobs.claim("a-run").lease
    assert lease is not None
    jobs.checkpoint(lease, 1, 1)
    jobs.checkpoint(lease, 2, b"\x00bytes, not JSON")
    jobs.stop("a-run")
    jobs.pause("a-paused")
    # beta: a failure, a recovery that finds someone else's publication, a retry waiting out its backoff.
    lease = jobs.claim("b-failed").lease
    assert lease is not None
    jobs.fail(lease, "fatal: the input is wrong", retryable=False)
    lease = jobs.claim("b-recovery").lease
    assert lease is not None
    jobs.record_result(lease, {"sum": 6, "token": SECRET})
    target = MemoryPublisher()
    target.publish("b-recovery", "someone-else", canonical_encode({"sum": 7}))
    expire(jobs, clock, "b-recovery")
    lease = jobs.claim("b-recovery").lease
    assert lease is not None
    assert jobs.recover(lease, target.read_published("b-recovery")) == "inconsistent"
    lease = jobs.claim("b-retry").lease
    assert lease is not None
    jobs.checkpoint(lease, 1, -0.0)
    jobs.fail(lease, "transient: the target timed out, é ☃", retryable=True)
    # gamma: one queued (its dependency completed), one cancelled, one running with a cancel request.
    jobs.cancel("g-cancelled")
    lease = jobs.claim("g-run").lease
    assert lease is not None
    jobs.checkpoint(lease, 1, None)
    jobs.cancel("g-run")
    return {
        "a-done": "completed",
        "a-run": "running",
        "a-blocked": "blocked",
        "a-paused": "queued",
        "b-retry": "retry_wait",
        "b-failed": "failed",
        "b-recovery": "recovery_required",
        "g-queued": "queued",
        "g-cancelled": "cancelled",
        "g-run": "running",
    }


def history_service(url: str | None, clock: ManualClock, store: Any = None) -> JobService:
    """A service that retries with :data:`HOUR`, on ``store`` or on the SQL database at ``url``."""
    from admission.sql import SqlJobStore

    return jobs_on(store if store is not None else SqlJobStore.open(str(url)), clock, backoff=HOUR)


# -- one instant --------------------------------------------------------------------------------------


def snapshot_faults(document: Mapping[str, Any]) -> list[str]:
    """What in a snapshot document could not hold at one instant of the store (empty: nothing).

    Each checkpoint is written with the job's ``checkpoint_step`` in one transaction, every claim
    adds an attempt and raises the fence in one, and ``counts`` is read by a query of its own:
    a document made of reads at different instants breaks one of these.
    """
    faults = []
    for job in document["jobs"]:
        steps = [c["step"] for c in job["checkpoints"]]
        if steps != list(range(1, job["checkpoint_step"] + 1)):
            faults.append(f"{job['job_id']}: checkpoint_step {job['checkpoint_step']}, checkpoints {steps}")
        attempt = job["last_attempt"]
        seen = (0, 0) if attempt is None else (attempt["number"], attempt["fence"])
        if seen != (job["attempts"], job["fence"]):
            faults.append(
                f"{job['job_id']}: attempts/fence {(job['attempts'], job['fence'])}, attempt {seen}"
            )
    tally = dict(Counter(job["state"] for job in document["jobs"]))
    if tally != document["counts"]:
        faults.append(f"counts {document['counts']} but the jobs tally {tally}")
    return faults


# -- the file against the tables ----------------------------------------------------------------------


def _time(text: str | None) -> datetime | None:
    return None if text is None else datetime.fromisoformat(text)


def _stored_time(value: Any) -> datetime | None:
    return None if value is None else as_utc(value)


def compare_with_tables(engine: Engine, document: Mapping[str, Any], scope: str | None) -> int:
    """Check every field of every job and checkpoint of ``document`` against the tables, read directly;
    returns how many fields were compared."""
    with engine.connect() as conn:
        query = select(worker_jobs)
        if scope is not None:
            query = query.where(worker_jobs.c.scope == scope)
        rows = {r["job_id"]: r for r in conn.execute(query).mappings()}
        depends: dict[str, list[str]] = defaultdict(list)
        for job_id, on in conn.execute(select(worker_job_dependencies)):
            depends[job_id].append(on)
        checkpoints: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
        for c in conn.execute(select(worker_job_checkpoints)).mappings():
            checkpoints[c["job_id"]].append(c)
        attempts: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
        for a in conn.execute(select(worker_job_attempts)).mappings():
            attempts[a["job_id"]].append(a)
    shown = document["jobs"]
    assert document["scope"] == scope
    assert [j["job_id"] for j in shown] == sorted(rows, key=lambda j: (rows[j]["scope"], rows[j]["position"]))
    assert document["counts"] == dict(Counter(r["state"] for r in rows.values()))
    compared = 0
    for job in shown:
        row = rows[job["job_id"]]
        plain = (
            "job_id", "scope", "position", "kind", "state", "reason", "paused", "stop_requested",
            "cancel_requested", "attempts", "max_attempts", "fence", "owner", "diagnostic", "checkpoint_step",
        )  # fmt: skip
        for name in plain:
            assert job[name] == row[name], (job["job_id"], name, job[name], row[name])
        for name in ("created_at", "updated_at", "not_before"):
            assert _time(job[name]) == _stored_time(row[name]), (job["job_id"], name)
        assert job["result_recorded"] == (row["publish_result"] is not None)
        assert job["depends_on"] == sorted(depends[job["job_id"]])
        compared += len(plain) + 5
        held = sorted(attempts[job["job_id"]], key=lambda a: a["number"])
        if not held:
            assert job["last_attempt"] is None
        else:
            latest, got = held[-1], job["last_attempt"]
            for name in ("attempt_id", "number", "fence", "owner", "outcome", "diagnostic"):
                assert got[name] == latest[name], (job["job_id"], "last_attempt", name)
            for name in ("started_at", "ended_at"):
                assert _time(got[name]) == _stored_time(latest[name]), (job["job_id"], "last_attempt", name)
            compared += 8
        stored = sorted(checkpoints[job["job_id"]], key=lambda c: c["step"])
        assert [c["step"] for c in job["checkpoints"]] == [c["step"] for c in stored]
        for got, want in zip(job["checkpoints"], stored, strict=True):
            state = bytes(want["state"])
            assert (got["attempt_id"], got["fence"]) == (want["attempt_id"], want["fence"])
            assert _time(got["recorded_at"]) == _stored_time(want["recorded_at"])
            assert (got["size"], got["sha256"]) == (len(state), hashlib.sha256(state).hexdigest())
            compared += 6
        assert set(job) == {*plain, "created_at", "updated_at", "not_before", "result_recorded"} | {
            "depends_on", "last_attempt", "checkpoints",
        }  # fmt: skip
    return compared
