"""The processes of the failover tests (``tests/integration/test_failover.py``), importable by ``spawn``.

:func:`admit_until_stopped` is one client: it admits keyed signals and updates
through its own :class:`~admission.sql.SqlStore` until a stop file appears,
retrying a key that failed until it is answered, and logs every call (one JSON
line: key, kind, wall-clock start and end, the answer or the error's code).
:func:`follow_event_log` follows the event log with its cursor, as a consumer
would, and logs every row it reads.  :func:`hold_leases` claims a job and a
worker queue, reports its fencing tokens, waits to be told to write, then
tries its fenced writes and reports what each answered.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from admission.errors import AdmissionError, StorageError
from admission.jobs import Job, JobService
from admission.receipts import AdmissionService, EventCursor
from admission.sql import SqlJobStore, SqlStore, SqlWorkerStore, create_admission_engine
from admission.worker import DurableWorker, Scope, SqliteTarget

NS = "failover"
RETRY_PAUSE = 0.02
"""What a client waits before it retries a key that failed (the server may be down for a while)."""


def arguments_of(key: str) -> dict[str, str]:
    """The arguments a key is always admitted with, so that a retry is the same intent."""
    return {"key": key}


def kind_of(n: int) -> str:
    return "update" if n % 2 else "signal"


def admit(service: AdmissionService, workflow_id: str, kind: str, key: str) -> Any:
    method = service.admit_update if kind == "update" else service.admit_signal
    return method(NS, workflow_id, "set" if kind == "update" else "go", arguments_of(key), request_id=key)


def open_store(url: str) -> SqlStore:
    """``SqlStore.open(url)``, retried while the server answers a retryable ``StorageError``: a
    process may start (a spawned one takes seconds) while the primary is down."""
    while True:
        try:
            return SqlStore.open(url)
        except StorageError:
            time.sleep(RETRY_PAUSE)


def admit_until_stopped(url: str, index: int, log: str, stop: str) -> None:
    """One client process: keys ``c<index>-<n>`` on workflow ``wf<index>``, until ``stop`` exists."""
    store = open_store(url)
    service = AdmissionService(store)
    workflow_id = f"wf{index}"
    with open(log, "a", encoding="utf-8", buffering=1) as out:
        n = 0
        while not os.path.exists(stop):
            key, kind = f"c{index}-{n}", kind_of(n)
            while True:  # a key is retried until it is answered
                line: dict[str, Any] = {"key": key, "kind": kind, "start": time.time()}
                try:
                    answer = admit(service, workflow_id, kind, key)
                except AdmissionError as exc:
                    line.update(end=time.time(), error=exc.code, retryable=isinstance(exc, StorageError))
                    out.write(json.dumps(line) + "\n")
                    if not isinstance(exc, StorageError):
                        break  # not retryable: logged for the test to see, never expected
                    time.sleep(RETRY_PAUSE)
                    continue
                line.update(
                    end=time.time(),
                    decision=str(answer.decision),
                    command_id=answer.command_id,
                    retained=answer.retained,
                )
                out.write(json.dumps(line) + "\n")
                break
            n += 1
    store.dispose()


def follow_event_log(url: str, log: str, stop: str) -> None:
    """Read the event log after a cursor, 50 rows at a time, until ``stop`` exists and a read is empty."""
    store = open_store(url)
    cursor = EventCursor()
    with open(log, "a", encoding="utf-8", buffering=1) as out:
        while True:
            stopping = os.path.exists(stop)
            try:
                rows = store.read_events(cursor, 50)
            except StorageError as exc:
                out.write(json.dumps({"error": exc.code, "at": time.time()}) + "\n")
                time.sleep(RETRY_PAUSE)
                continue
            for row in rows:
                out.write(json.dumps({"tx_id": row.tx_id, "position": row.position}) + "\n")
            if rows:
                cursor = EventCursor(rows[-1].tx_id, rows[-1].position)
            elif stopping:
                break
            else:
                time.sleep(0.005)
    store.dispose()


def read_lines(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The complete JSON lines of a log (a line still being written is left for the next read)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text.splitlines(keepends=True) if line.endswith("\n")]


# -- leases ------------------------------------------------------------------------------------------

SCOPE = {"tenant": "t1", "account": "a1", "page": "p1", "form": "f1"}
QUEUE = "failover"
JOB = "job-1"


class StillClock:
    """A monotonic clock that never moves: this owner never sees its own lease as due for renewal."""

    def __call__(self) -> float:
        return 1000.0


def _until_answered(call: Any) -> tuple[str, int]:
    """``call()``'s outcome as an error code ('ok' if none), and how many storage errors came first."""
    failures = 0
    while True:
        try:
            call()
        except StorageError:
            failures += 1
            time.sleep(RETRY_PAUSE)
            continue
        except AdmissionError as exc:
            return exc.code, failures
        return "ok", failures


def hold_leases(url: str, target: str, results: Any, go: Any) -> None:
    """Claim ``JOB`` and queue ``QUEUE`` (one accepted record), report the tokens; on ``go``, write.

    The writes: a job heartbeat, a checkpoint and a completion under the job's
    fence; a worker cycle (the record's update carries the queue token) and a
    lease renewal.  Each is retried past storage errors (connections to a dead
    server) until the database answers, and its answer is reported.
    """
    jobs = JobService(SqlJobStore.open(url), clock=StillClock(), lease_seconds=5.0, owner="old-owner")
    jobs.enqueue(Job(JOB, scope="s", kind="count", payload={"steps": 3}))
    claim = jobs.claim(JOB)
    assert claim.lease is not None, claim
    engine = create_admission_engine(url)
    worker = DurableWorker(
        SqlWorkerStore(engine),
        Scope.parse(SCOPE),
        queue=QUEUE,
        holder="old-owner",
        file_lock=False,
        lease_ttl=5.0,
        monotonic=StillClock(),
    )
    token = worker.claim()
    write_id = worker.accept({**SCOPE, "source_key": "k1", "payload": {"n": 1}}).write_id
    results.put({"pid": os.getpid(), "fence": claim.lease.fence, "token": token, "write_id": write_id})
    go.get()
    lease = claim.lease
    answers = {
        "job_heartbeat": _until_answered(lambda: jobs.heartbeat(lease)),
        "job_checkpoint": _until_answered(lambda: jobs.checkpoint(lease, 1, 1)),
        "job_complete": _until_answered(lambda: jobs.complete(lease)),
        "worker_cycle": _until_answered(lambda: worker.run_once(SqliteTarget(target))),
        "worker_renew": _until_answered(worker.renew),
    }
    results.put({"answers": answers})
    jobs.dispose()
    engine.dispose()
