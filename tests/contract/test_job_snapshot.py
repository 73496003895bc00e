"""The jobs snapshot, written once, run on every job store (contract §6; docs/jobs.md, "Snapshot").

A snapshot must show each job as the store's own reads of that job show it
(``status``, ``checkpoints``), in scope and queue order, with counts that
tally; it must leave out payloads, results and checkpoint states; bad input is
refused naming the field, with nothing written.  What only SQL can show (the
tables read directly, a writer between the reads, processes killed) is in
``tests/integration/test_job_snapshot.py``.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from admission.errors import InputError, InvalidJobError
from admission.intent import canonical_encode
from admission.jobs import Job, JobService, MemoryJobStore
from tests.support.jobkit import JobStores, ManualClock, jobs_on
from tests.support.jobsnapshot import SECRET, history_service, mixed_history, snapshot_faults

# The async path (the store's statements awaited, aiosqlite's streamed checkpoint rows) on SQLite
# by default, on PostgreSQL in the extra set.
pytestmark = pytest.mark.async_stores("sqlite")


@pytest.fixture
def history(job_stores: JobStores) -> tuple[JobService, dict[str, str]]:
    clock = ManualClock()
    jobs = history_service(None, clock, job_stores.open())
    return jobs, mixed_history(jobs, clock)


@pytest.fixture
def out(tmp_path: Path) -> Path:
    """A folder of its own for the snapshot file (a SQLite store keeps its files in ``tmp_path``)."""
    folder = tmp_path / "out"
    folder.mkdir()
    return folder


def agrees_with_reads(jobs: JobService, document: dict[str, Any]) -> None:
    """Each job of ``document`` as ``status`` and ``checkpoints`` show it; jobs in scope and queue order."""
    for job in document["jobs"]:
        view = jobs.status(job["job_id"]).to_dict()
        for name, value in view.items():
            assert job[name] == value, (job["job_id"], name)
        checkpoints = jobs.checkpoints(job["job_id"])
        assert [c["step"] for c in job["checkpoints"]] == [c.step for c in checkpoints]
        for shown, held in zip(job["checkpoints"], checkpoints, strict=True):
            state = canonical_encode(held.state)
            assert shown == {
                "step": held.step,
                "attempt_id": held.attempt_id,
                "fence": held.fence,
                "recorded_at": held.recorded_at.isoformat(),
                "size": len(state),
                "sha256": hashlib.sha256(state).hexdigest(),
            }
        attempt = job["last_attempt"]
        assert (attempt is None) == (job["attempts"] == 0)
        if attempt is not None:
            assert (attempt["number"], attempt["fence"]) == (job["attempts"], job["fence"])
    order = [(j["scope"], j["position"]) for j in document["jobs"]]
    assert order == sorted(order) and len(set(order)) == len(order)
    assert document["counts"] == dict(Counter(j["state"] for j in document["jobs"]))
    assert snapshot_faults(document) == []


def test_a_snapshot_shows_every_job_as_the_stores_own_reads_do(
    history: tuple[JobService, dict[str, str]],
) -> None:
    jobs, expected = history
    document = jobs.snapshot()
    assert {j["job_id"]: j["state"] for j in document["jobs"]} == expected
    assert document["counts"] == jobs.counts()
    agrees_with_reads(jobs, document)
    assert datetime.fromisoformat(document["taken_at"]).utcoffset() is not None
    text = json.dumps(document, allow_nan=False)  # plain JSON: no bytes, no NaN
    assert SECRET not in text
    by_id = {j["job_id"]: j for j in document["jobs"]}
    assert by_id["a-done"]["result_recorded"] and by_id["b-recovery"]["result_recorded"]
    assert not by_id["a-run"]["result_recorded"]
    assert by_id["b-retry"]["not_before"] is not None and by_id["b-retry"]["diagnostic"].startswith(
        "transient"
    )
    assert by_id["b-recovery"]["last_attempt"]["outcome"] == "recovery_required"
    assert by_id["a-run"]["stop_requested"] and by_id["g-run"]["cancel_requested"]
    assert by_id["a-paused"]["paused"] and by_id["a-blocked"]["depends_on"] == ["a-run"]
    for scope in ("alpha", "beta", "gamma"):
        part = jobs.snapshot(scope)
        assert part["scope"] == scope
        assert part["jobs"] == [j for j in document["jobs"] if j["scope"] == scope]
        assert part["counts"] == jobs.counts(scope)


def test_export_writes_the_snapshot_it_returns(history: tuple[JobService, dict[str, str]], out: Path) -> None:
    jobs, _ = history
    path = out / "jobs-snapshot.json"
    path.write_text("the previous snapshot")
    written = jobs.export_snapshot(str(path), scope="beta")
    assert json.loads(path.read_text(encoding="utf-8")) == written
    assert [j["job_id"] for j in written["jobs"]] == ["b-retry", "b-failed", "b-recovery"]
    assert [p.name for p in out.iterdir()] == [path.name]


def test_a_scope_no_job_can_have_is_refused_naming_the_field(
    history: tuple[JobService, dict[str, str]], out: Path
) -> None:
    jobs, _ = history
    path = out / "jobs-snapshot.json"
    for scope in ("", "x" * 256, "a\x00b", "tab\there", 7):
        with pytest.raises(InvalidJobError) as refused:
            jobs.snapshot(scope)  # type: ignore[arg-type]
        assert refused.value.field == "scope"
        with pytest.raises(InvalidJobError) as refused:
            jobs.export_snapshot(path, scope)  # type: ignore[arg-type]
        assert refused.value.field == "scope"
    assert list(out.iterdir()) == []


def test_a_path_that_cannot_be_a_file_is_refused_naming_the_field_and_nothing_is_written(
    history: tuple[JobService, dict[str, str]], out: Path
) -> None:
    jobs, _ = history
    existing = out / "jobs-snapshot.json"
    existing.write_text("previous")
    for path, why in (
        (out / "missing" / "s.json", "does not exist"),
        (out, "is a directory"),
        (existing / "s.json", "is not a folder"),
        ("", "non-empty"),
    ):
        with pytest.raises(InputError) as refused:
            jobs.export_snapshot(path)
        assert refused.value.field == "path" and why in str(refused.value), refused.value
    assert [p.name for p in out.iterdir()] == [existing.name]
    assert existing.read_text() == "previous"


# -- a property: whatever happened, the snapshot is the jobs as they are --------------------------------

_OPERATIONS = st.lists(
    st.tuples(
        st.sampled_from(["enqueue", "claim", "checkpoint", "checkpoint", "fail", "finish", "pause", "cancel"])
        | st.just("claim"),
        st.integers(0, 7),
    ),
    max_size=40,
)


@settings(max_examples=60)
@given(_OPERATIONS)
def test_after_any_history_the_snapshot_agrees_with_the_reads_of_each_job(
    operations: list[tuple[str, int]],
) -> None:
    jobs = jobs_on(MemoryJobStore())
    leases: dict[str, Any] = {}
    made = 0
    for operation, n in operations:
        snapshot = jobs.snapshot()
        agrees_with_reads(jobs, snapshot)  # after every step of the history, not only the last
        ids = sorted(j["job_id"] for j in snapshot["jobs"])
        if operation == "enqueue" or not ids:
            made += 1
            after = (ids[n % len(ids)],) if ids and n % 3 == 0 else ()  # blocked, then unblocked or failed
            jobs.enqueue(Job(f"j{made}", f"s{n % 3}", "count", {"steps": 3}, depends_on=after))
            continue
        job_id = ids[n % len(ids)]
        view = jobs.status(job_id)
        if operation == "claim":
            busy = any(j["state"] == "running" for j in jobs.snapshot(view.scope)["jobs"])
            answer = None if busy else jobs.claim(job_id)
            if answer is not None and answer.lease is not None:
                leases[job_id] = answer.lease
        elif operation in ("checkpoint", "fail", "finish") and leases:
            job_id = sorted(leases)[n % len(leases)]
            lease = leases.pop(job_id)
            if jobs.status(job_id).state != "running":
                continue
            if operation == "checkpoint":
                jobs.checkpoint(lease, jobs.status(job_id).checkpoint_step + 1, [n, b"\x00"])
                leases[job_id] = lease
            elif operation == "fail":
                jobs.fail(lease, f"attempt failed: {n}", retryable=n % 2 == 0)
            else:
                jobs.record_result(lease, n)
                jobs.complete(lease)
        elif operation == "pause":
            jobs.pause(job_id)
        elif operation == "cancel":
            jobs.cancel(job_id)
    agrees_with_reads(jobs, jobs.snapshot())
