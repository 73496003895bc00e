"""Retention (contract §5): pruning removes old runs' receipts and history, and frees their keys."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from admission.errors import InvalidValueError
from admission.receipts import AdmissionService, Decision, EventCursor, Store
from admission.sql import SqlStore

T0 = datetime(2026, 1, 1, tzinfo=UTC)


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        self.now += timedelta(seconds=1)
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def service(store: Store, clock: Clock) -> AdmissionService:
    return AdmissionService(store, clock=clock)


def keys_of(service: AdmissionService, namespace: str, workflow_id: str) -> list[str]:
    return [e.event_type for e in service.history(namespace, workflow_id)]


def test_pruning_frees_the_keys_of_runs_closed_longer_ago_than_the_retention(
    service: AdmissionService, clock: Clock
) -> None:
    service.start_run("ns", "old")
    old = service.admit_update("ns", "old", "go", [1], request_id="k")
    service.complete_update("ns", "old", old.update_id, None)  # type: ignore[arg-type]
    service.close_run("ns", "old", "completed")
    service.start_run("ns", "recent")
    recent = service.admit_signal("ns", "recent", "go", [], request_id="k")
    clock.now += timedelta(days=29)
    service.close_run("ns", "recent", "completed")
    clock.now += timedelta(days=2)  # "old" closed 31 days ago, "recent" 2 days ago
    report = service.prune(30)
    assert (report.counts.runs, report.counts.commands, report.counts.updates) == (1, 1, 1)
    assert keys_of(service, "ns", "old") == ["RunsPruned"]
    assert service.receipt("ns", "old", "update", "k") is None
    service.start_run("ns", "old")
    again = service.admit_update("ns", "old", "go", [1], request_id="k")
    assert again.decision is Decision.FRESH and again.command_id != old.command_id
    kept = service.admit_signal("ns", "recent", "go", [], request_id="k")
    assert kept.retained and kept.command_id == recent.command_id


def test_a_chain_of_continued_runs_is_kept_while_its_last_run_is_recent(
    service: AdmissionService, clock: Clock
) -> None:
    service.start_run("ns", "wf")
    handed = service.admit_signal("ns", "wf", "s", [], request_id="handed")
    service.continue_as_new("ns", "wf")
    clock.now += timedelta(days=40)
    assert service.prune(30).counts.runs == 0  # the first run closed 40 days ago, its successor is open
    service.close_run("ns", "wf", "completed")
    clock.now += timedelta(days=10)
    assert service.prune(30).counts.runs == 0
    assert service.admit_signal("ns", "wf", "s", [], request_id="handed").command_id == handed.command_id
    clock.now += timedelta(days=21)
    report = service.prune(30)
    assert report.counts.runs == 2 and report.chains == 1
    assert service.receipt("ns", "wf", "signal", "handed") is None


def test_refusals_without_a_run_are_pruned_by_their_age(service: AdmissionService, clock: Clock) -> None:
    refused = service.admit_signal("ns", "never-started", "s", [], request_id="k")
    assert refused.outcome == "run_not_active"
    clock.now += timedelta(days=31)
    report = service.prune(30)
    assert report.counts.commands == 1
    assert service.receipt("ns", "never-started", "signal", "k") is None


def test_dry_run_counts_exactly_and_changes_nothing(service: AdmissionService, clock: Clock) -> None:
    for i in range(5):
        service.start_run("ns", f"wf{i}")
        service.admit_signal("ns", f"wf{i}", "s", [i], request_id="k")
        service.close_run("ns", f"wf{i}", "failed")
    clock.now += timedelta(days=31)
    before = service.store.read_events(EventCursor(), 1000)
    dry = service.prune(30, dry_run=True, batch_size=2)
    assert service.store.read_events(EventCursor(), 1000) == before
    real = service.prune(30)
    assert (dry.counts, dry.chains) == (real.counts, real.chains) and real.counts.runs == 5


def test_progress_is_reported_per_batch(service: AdmissionService, clock: Clock) -> None:
    for i in range(5):
        service.start_run("ns", f"wf{i}")
        service.close_run("ns", f"wf{i}", "completed")
    clock.now += timedelta(days=31)
    seen: list[int] = []
    service.prune(30, batch_size=2, progress=lambda r: seen.append(r.done))
    assert seen == [2, 4, 5]


def test_pruning_never_crosses_a_namespace(service: AdmissionService, clock: Clock) -> None:
    for namespace in ("a", "b"):
        service.start_run(namespace, "wf")
        service.admit_signal(namespace, "wf", "s", [], request_id="k")
    service.close_run("a", "wf", "completed")
    clock.now += timedelta(days=31)
    service.prune(30)
    assert service.receipt("a", "wf", "signal", "k") is None
    assert service.receipt("b", "wf", "signal", "k") is not None
    assert keys_of(service, "b", "wf") == ["RunStarted", "SignalReceived"]


def test_positions_are_never_reused_after_pruning_the_newest_events(
    service: AdmissionService, clock: Clock
) -> None:
    service.start_run("ns", "wf")
    service.close_run("ns", "wf", "completed")
    last = service.store.read_events(EventCursor(), 100)[-1].position
    clock.now += timedelta(days=31)
    service.prune(30)
    service.start_run("ns", "wf")
    assert min(e.position for e in service.store.read_events(EventCursor(), 100)) > last


@pytest.mark.parametrize(
    ("kwargs", "field"), [({"retention_days": -1}, "retention_days"), ({"batch_size": 0}, "batch_size")]
)
def test_bad_prune_arguments_are_refused(
    service: AdmissionService, kwargs: dict[str, int], field: str
) -> None:
    with pytest.raises(InvalidValueError) as info:
        service.prune(**kwargs)  # type: ignore[arg-type]
    assert info.value.field == field


def test_the_cli_prunes_with_a_dry_run_and_progress(db_url: str, tmp_path: Path) -> None:
    store = SqlStore.open(db_url)
    service = AdmissionService(store, clock=Clock())
    for i in range(3):
        service.start_run("ns", f"wf{i}")
        service.admit_signal("ns", f"wf{i}", "s", [], request_id="k")
        service.close_run("ns", f"wf{i}", "completed")
    store.dispose()
    later = (T0 + timedelta(days=40)).isoformat()

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "admission", "--db", db_url, "prune", "--now", later, *args],
            capture_output=True,
            text=True,
            timeout=120,
        )

    dry = cli("--dry-run", "--batch-size", "1")
    assert dry.returncode == 0, dry.stderr
    assert json.loads(dry.stdout)["runs"] == 3 and dry.stderr.count("pruning (dry run)") == 3
    real = cli()
    assert json.loads(real.stdout)["runs"] == 3 and json.loads(cli().stdout)["runs"] == 0
    assert cli("--now", "yesterday").returncode == 2
