"""``admission jobs ...``: status as JSON, pause/resume/stop/cancel and resolve, run as a separate process."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import datetime
from pathlib import Path

from admission.intent import canonical_encode
from admission.jobs import Backoff, Job
from admission.testing import MemoryPublisher
from tests.support.jobkit import ManualClock, expire, open_jobs

ROOT = Path(__file__).resolve().parents[2]


def cli(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "admission", "--db", url, "jobs", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )


def test_status_and_requests_print_the_job_as_json(db_url: str) -> None:
    store = open_jobs(db_url, backoff=Backoff(base=3600.0, cap=3600.0, jitter=0.0))
    store.enqueue_all(
        [Job("a", "tenant", "count", {"steps": 1}), Job("b", "tenant", "count", depends_on=("a",))]
    )
    result = cli(db_url, "status", "b")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == store.status("b").to_dict()
    assert json.loads(result.stdout)["not_before"] is None
    # A job waiting out a retry's backoff shows until when, beside its state.
    store.enqueue(Job("r", "elsewhere", "count", {"steps": 1}))
    lease = store.claim("r").lease
    assert lease is not None
    store.fail(lease, "transient", retryable=True)
    view = store.status("r")
    assert view.not_before is not None
    shown = json.loads(cli(db_url, "status", "r").stdout)
    assert (shown["state"], shown["not_before"]) == ("retry_wait", view.not_before.isoformat())
    assert datetime.fromisoformat(shown["not_before"]) == view.not_before
    assert json.loads(cli(db_url, "pause", "a").stdout)["paused"] is True
    assert store.status("a").paused
    assert json.loads(cli(db_url, "resume", "a").stdout)["paused"] is False
    cancelled = json.loads(cli(db_url, "cancel", "a").stdout)
    assert (cancelled["state"], cancelled["reason"]) == ("cancelled", "cancelled")
    assert store.status("b").state == "failed"
    report = json.loads(cli(db_url, "status", "--scope", "tenant").stdout)
    assert report == {"scope": "tenant", "counts": {"cancelled": 1, "failed": 1}}
    events = json.loads(cli(db_url, "status", "a", "--events").stdout)["events"]
    assert [e["event"] for e in events] == ["enqueue", "paused", "resumed", "cancel"]
    store.dispose()


def test_resolve_settles_only_a_recovery_required_job_and_an_unknown_job_is_refused(db_url: str) -> None:
    clock = ManualClock()
    store = open_jobs(db_url, clock)
    store.enqueue(Job("j", "tenant", "count", {"steps": 1}))
    lease = store.claim("j").lease
    assert lease is not None
    store.record_result(lease, {"sum": 1})
    target = MemoryPublisher()
    target.publish("j", "someone-else", canonical_encode({"sum": 2}))
    refused = cli(db_url, "resolve", "j", "--outcome", "completed", "--who", "ops", "--why", "checked")
    assert refused.returncode == 4 and "does not apply to a running job" in refused.stderr
    expire(store, clock, "j")
    lease = store.claim("j").lease
    assert lease is not None
    assert store.recover(lease, target.read_published("j")) == "inconsistent"
    result = cli(
        db_url, "resolve", "j", "--outcome", "failed", "--who", "ops", "--why", "wrong result on target"
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["state"] == "failed"
    assert store.events("j")[-1].detail == "ops: wrong result on target"
    unknown = cli(db_url, "status", "ghost")
    assert unknown.returncode == 2 and "no job 'ghost'" in unknown.stderr
    store.dispose()
