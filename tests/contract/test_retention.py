"""Retention (contract §5): pruning removes old runs' receipts and history, and frees their keys."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import delete, update

from admission.errors import InvalidValueError
from admission.receipts import AdmissionService, Decision, EventCursor, MemoryStore, PruneCounts, Store
from admission.sql import SqlStore
from admission.sql._schema import (
    workflow_commands,
    workflow_history_events,
    workflow_instances,
    workflow_runs,
    workflow_updates,
)

# On PostgreSQL the async path adds little to what test_service.py shows there, for much time.
pytestmark = pytest.mark.async_stores("memory", "sqlite")

T0 = datetime(2026, 1, 1, tzinfo=UTC)
# Most tests here let weeks pass with nothing written, as in an idle store:
# pruning's cap on a clock far ahead of the newest recorded time (tested
# under "clock faults" below) would hold them back, so they turn it off.
IDLE = None


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
    report = service.prune(30, max_clock_lead=IDLE)
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
    assert (
        service.prune(30, max_clock_lead=IDLE).counts.runs == 0
    )  # the first run closed 40 days ago, its successor is open
    service.close_run("ns", "wf", "completed")
    clock.now += timedelta(days=10)
    assert service.prune(30, max_clock_lead=IDLE).counts.runs == 0
    assert service.admit_signal("ns", "wf", "s", [], request_id="handed").command_id == handed.command_id
    clock.now += timedelta(days=21)
    report = service.prune(30, max_clock_lead=IDLE)
    assert report.counts.runs == 2 and report.chains == 1
    assert service.receipt("ns", "wf", "signal", "handed") is None


def test_refusals_without_a_run_are_pruned_by_their_age(service: AdmissionService, clock: Clock) -> None:
    refused = service.admit_signal("ns", "never-started", "s", [], request_id="k")
    assert refused.outcome == "run_not_active"
    clock.now += timedelta(days=31)
    report = service.prune(30, max_clock_lead=IDLE)
    assert report.counts.commands == 1
    assert service.receipt("ns", "never-started", "signal", "k") is None


def test_dry_run_counts_exactly_and_changes_nothing(service: AdmissionService, clock: Clock) -> None:
    for i in range(5):
        service.start_run("ns", f"wf{i}")
        service.admit_signal("ns", f"wf{i}", "s", [i], request_id="k")
        service.close_run("ns", f"wf{i}", "failed")
    clock.now += timedelta(days=31)
    before = service.store.read_events(EventCursor(), 1000)
    dry = service.prune(30, dry_run=True, batch_size=2, max_clock_lead=IDLE)
    assert service.store.read_events(EventCursor(), 1000) == before
    real = service.prune(30, max_clock_lead=IDLE)
    assert (dry.counts, dry.chains) == (real.counts, real.chains) and real.counts.runs == 5


def test_progress_is_reported_per_batch(service: AdmissionService, clock: Clock) -> None:
    for i in range(5):
        service.start_run("ns", f"wf{i}")
        service.close_run("ns", f"wf{i}", "completed")
    clock.now += timedelta(days=31)
    seen: list[int] = []
    service.prune(30, batch_size=2, max_clock_lead=IDLE, progress=lambda r: seen.append(r.done))
    assert seen == [2, 4, 5]


def test_pruning_never_crosses_a_namespace(service: AdmissionService, clock: Clock) -> None:
    for namespace in ("a", "b"):
        service.start_run(namespace, "wf")
        service.admit_signal(namespace, "wf", "s", [], request_id="k")
    service.close_run("a", "wf", "completed")
    clock.now += timedelta(days=31)
    service.prune(30, max_clock_lead=IDLE)
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
    service.prune(30, max_clock_lead=IDLE)
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
    # The store is idle for 40 days: the clock cap is lifted (see the clock faults below).
    idle = ("--now", later, "--max-clock-lead-days", "100")

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "admission", "--db", db_url, "prune", *idle, *args],
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


# -- clock faults: a clock stepped back or forward never drops a receipt early ------------------


def test_a_clock_stepped_back_while_a_run_closes_never_makes_it_prunable_early(
    service: AdmissionService, clock: Clock
) -> None:
    service.start_run("ns", "wf")
    signal = service.admit_signal("ns", "wf", "s", [], request_id="k")
    update = service.admit_update("ns", "wf", "u", [], request_id="k")
    right = clock.now
    clock.now = right - timedelta(days=400)  # the wall clock steps back while the run closes
    closed = service.close_run("ns", "wf", "completed")
    assert closed.closed_at is not None and update.received_at is not None
    assert closed.closed_at >= update.received_at
    clock.now = right  # ... and is corrected
    report = service.prune(30)
    assert report.counts == PruneCounts() and report.chains == 0
    kept = service.receipt("ns", "wf", "signal", "k")
    assert kept is not None and kept.command_id == signal.command_id
    # The store goes on working, and 31 days after the run's last time the run goes.
    clock.now = right + timedelta(days=31)
    service.start_run("ns", "busy")
    assert service.prune(30).counts.runs == 1
    assert service.receipt("ns", "wf", "signal", "k") is None


def test_a_refusal_recorded_after_the_close_keeps_the_run_as_long_as_itself(
    service: AdmissionService, clock: Clock
) -> None:
    service.start_run("ns", "wf")
    service.close_run("ns", "wf", "completed")
    clock.now += timedelta(days=20)
    late = service.admit_signal("ns", "wf", "s", [], request_id="late")  # recorded with the closed run
    assert late.outcome == "run_not_active"
    clock.now += timedelta(days=11)  # the close is 31 days old, the refusal 11
    report = service.prune(30, max_clock_lead=IDLE)
    assert (report.chains, report.counts) == (0, PruneCounts())
    assert service.receipt("ns", "wf", "signal", "late") is not None
    clock.now += timedelta(days=20)
    assert service.prune(30, max_clock_lead=IDLE).counts == PruneCounts(1, 1, 0, 3)
    assert service.receipt("ns", "wf", "signal", "late") is None


def test_a_clock_stepped_forward_at_prune_time_is_capped_at_the_newest_recorded_time(
    service: AdmissionService, clock: Clock
) -> None:
    service.start_run("ns", "wf")
    service.admit_signal("ns", "wf", "s", [], request_id="k")
    closed = service.close_run("ns", "wf", "completed")
    assert closed.closed_at is not None
    clock.now += timedelta(days=400)  # the wall clock jumps 400 days ahead
    for _ in range(3):  # again and again: the cap does not creep forward
        report = service.prune(30)
        assert report.counts == PruneCounts() and report.clock_capped
        assert report.as_of == closed.closed_at + timedelta(days=1)
        assert report.before == closed.closed_at + timedelta(days=1) - timedelta(days=30)
    assert service.receipt("ns", "wf", "signal", "k") is not None
    assert report.to_dict()["clock_capped"] is True
    # Within the allowed lead the clock is taken as it is.
    assert not service.prune(30, now=closed.closed_at + timedelta(hours=23)).clock_capped
    # An operator who knows the store was idle lifts the cap; the pruning is
    # recorded at the time given, since it was asked for.
    lifted = service.prune(30, max_clock_lead=timedelta(days=401))
    assert lifted.counts.runs == 1 and not lifted.clock_capped and lifted.as_of == clock.now
    assert service.receipt("ns", "wf", "signal", "k") is None


def test_a_clock_stepped_back_at_prune_time_prunes_nothing_more(
    service: AdmissionService, clock: Clock
) -> None:
    service.start_run("ns", "wf")
    service.close_run("ns", "wf", "completed")
    clock.now += timedelta(days=31)
    service.start_run("ns", "busy")
    report = service.prune(30, now=clock.now - timedelta(days=400))
    assert report.counts == PruneCounts() and not report.clock_capped
    assert service.prune(30).counts.runs == 1


def test_continue_as_new_under_a_clock_stepped_back_starts_the_successor_after_the_last_time(
    service: AdmissionService, clock: Clock
) -> None:
    service.start_run("ns", "wf")
    handed = service.admit_signal("ns", "wf", "s", [], request_id="k")
    clock.now -= timedelta(days=400)
    successor = service.continue_as_new("ns", "wf")
    assert handed.received_at is not None and successor.started_at >= handed.received_at
    times = [e.recorded_at for e in service.history("ns", "wf")]
    assert times == sorted(times)
    clock.now += timedelta(days=400 + 31)
    service.close_run("ns", "wf", "completed")
    assert service.prune(30, max_clock_lead=IDLE).counts.runs == 0  # the chain closed just now


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"retention_days": 10**10}, "retention_days"),
        ({"now": datetime(2026, 1, 1)}, "now"),  # a naive time
        ({"max_clock_lead": timedelta(days=-1)}, "max_clock_lead"),
        ({"max_clock_lead": 1}, "max_clock_lead"),
    ],
)
def test_bad_clock_arguments_to_prune_are_refused_by_field(
    service: AdmissionService, kwargs: dict[str, object], field: str
) -> None:
    service.start_run("ns", "wf")
    service.close_run("ns", "wf", "completed")
    before = service.history("ns", "wf")
    with pytest.raises(InvalidValueError) as info:
        service.prune(**kwargs)  # type: ignore[arg-type]
    assert info.value.field == field
    assert service.history("ns", "wf") == before


def test_a_retention_longer_than_the_calendar_reaches_prunes_nothing(service: AdmissionService) -> None:
    service.start_run("ns", "wf")
    service.close_run("ns", "wf", "completed")
    report = service.prune(999_999_999)
    assert report.counts == PruneCounts() and report.before.year == 1


def test_the_cli_prune_keeps_a_receipt_through_clock_faults(db_url: str) -> None:
    clock = Clock()
    store = SqlStore.open(db_url)
    service = AdmissionService(store, clock=clock)
    service.start_run("ns", "wf")
    service.admit_signal("ns", "wf", "s", [], request_id="k")
    right = clock.now
    clock.now = right - timedelta(days=400)
    service.close_run("ns", "wf", "completed")  # closed under a clock stepped back
    store.dispose()

    def prune(now: datetime, *args: str) -> tuple[int, dict[str, object], str]:
        done = subprocess.run(
            [sys.executable, "-m", "admission", "--db", db_url, "prune", "--now", now.isoformat(), *args],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert "Traceback" not in done.stderr
        return done.returncode, json.loads(done.stdout) if done.stdout else {}, done.stderr

    code, report, _ = prune(right + timedelta(seconds=5))  # the clock corrected
    assert (code, report["runs"], report["clock_capped"]) == (0, 0, False)
    code, report, err = prune(right + timedelta(days=400))  # the clock stepped forward
    assert (code, report["runs"], report["clock_capped"]) == (0, 0, True)
    assert "warning: the clock is more than 1 day ahead" in err
    code, report, _ = prune(right + timedelta(days=400), "--max-clock-lead-days", "500")
    assert (code, report["runs"], report["clock_capped"]) == (0, 1, False)
    code, _, err = prune(right, "--max-clock-lead-days", "-1")
    assert code == 2 and err.count("\n") == 1 and "--max-clock-lead-days" in err


# -- the rule over any sequence of clock readings ------------------------------------------------

# Clock readings around a base: steps back and forward by up to 400 days, and
# the boundaries of a 0, 1 or 30 day retention.
OFFSETS = st.builds(
    lambda days, seconds: timedelta(days=days, seconds=seconds),
    st.sampled_from((-400, -31, -30, -1, 0, 0, 1, 2, 29, 30, 31, 400)),
    st.integers(min_value=-2, max_value=2),
)
STEPS = st.lists(
    st.tuples(
        OFFSETS,
        st.one_of(
            st.tuples(st.just("start"), st.integers(0, 1)),
            st.tuples(st.just("admit"), st.integers(0, 1)),
            st.tuples(st.just("close"), st.integers(0, 1), st.booleans()),
            st.tuples(st.just("prune"), st.sampled_from((0, 1, 30)), st.sampled_from((None, 0, 1))),
        ),
    ),
    max_size=14,
)
_bases = itertools.count()


@dataclass(eq=False)
class ModelRun:
    """What the test knows of a run: the run it continues, and the latest time recorded on its rows."""

    wf: int
    id: str
    latest: datetime
    previous: ModelRun | None = None
    open: bool = True
    continued: bool = False
    keys: list[str] = field(default_factory=list)


def wipe(store: Store) -> None:
    """Empty a SQL store's receipt tables, so each example starts from nothing."""
    if isinstance(store, SqlStore):
        with store.engine.begin() as conn:
            for table in (workflow_history_events, workflow_updates, workflow_commands):
                conn.execute(delete(table))
            conn.execute(update(workflow_instances).values(current_run_id=None))
            conn.execute(delete(workflow_runs))
            conn.execute(delete(workflow_instances))


def test_a_receipt_is_pruned_only_once_the_retention_has_passed_since_its_latest_recorded_time(
    store: Store,
) -> None:
    """Over any sequence of clock readings, stepped back or forward: pruning removes a
    receipt exactly when ``as_of - latest recorded time of its chain > retention``, where
    ``as_of`` is the reading, capped at the newest recorded time plus the lead; so never
    before the retention has passed since its latest recorded time on a clock that
    never went backwards overall (as_of is never later than the reading)."""
    # The in-memory store is cheap: it explores most; the SQL stores check they agree.
    examples = 400 if isinstance(store, MemoryStore) else 40

    @settings(max_examples=examples, deadline=None)
    @given(steps=STEPS)
    def check(steps: list[tuple[timedelta, tuple[Any, ...]]]) -> None:
        replay(store, steps)

    check()


def replay(store: Store, steps: list[tuple[timedelta, tuple[Any, ...]]]) -> None:
    """One example of the property above: the steps, each checked against the model."""
    wipe(store)
    base = T0 + timedelta(days=1000 * next(_bases))
    now = base
    service = AdmissionService(store if isinstance(store, SqlStore) else MemoryStore(), clock=lambda: now)
    current: dict[int, ModelRun | None] = {}
    ended: list[ModelRun] = []  # the ends of closed chains still stored
    runless: dict[int, list[tuple[str, datetime]]] = {0: [], 1: []}
    gone: set[str] = set()
    newest: datetime | None = None
    keys = itertools.count()

    def chain(run: ModelRun) -> list[ModelRun]:
        return [run, *chain(run.previous)] if run.previous is not None else [run]

    def record(time: datetime) -> None:
        nonlocal newest
        newest = time if newest is None else max(newest, time)

    for offset, (op, *args) in steps:
        now = base + offset
        if op == "start":
            run = current.get(args[0])
            if run is not None and run.open:
                continue
            info = service.start_run("ns", f"wf{args[0]}")
            current[args[0]] = ModelRun(args[0], info.run_id, now)
            record(now)
        elif op == "admit":
            key = f"k{next(keys)}"
            service.admit_signal("ns", f"wf{args[0]}", "s", [], request_id=key)
            run = current.get(args[0])
            if run is None:
                runless[args[0]].append((key, now))
            else:  # admitted, or refused with the closed current run
                run.latest = max(run.latest, now)
                run.keys.append(key)
            record(now)
        elif op == "close":
            run = current.get(args[0])
            if run is None or not run.open:
                continue
            info = (
                service.continue_as_new("ns", f"wf{args[0]}")
                if args[1]
                else service.close_run("ns", f"wf{args[0]}", "completed")
            )
            at = max([now, *(r.latest for r in chain(run))])
            assert (info.started_at if args[1] else info.closed_at) == at  # never before the latest
            run.open, run.continued, run.latest = False, bool(args[1]), at
            if args[1]:
                current[args[0]] = ModelRun(args[0], info.run_id, at, previous=run)
            else:
                ended.append(run)
            record(at)
        else:
            retention, lead_days = timedelta(days=args[0]), args[1]
            lead = None if lead_days is None else timedelta(days=lead_days)
            capped = lead is not None and newest is not None and now - newest > lead
            as_of = newest + lead if capped and newest is not None and lead is not None else now
            report = service.prune(args[0], max_clock_lead=lead)
            assert (report.as_of, report.clock_capped) == (as_of, capped)
            assert report.as_of is not None and report.as_of <= now  # never later than the reading
            targets = runs = 0
            for run in list(ended):
                latest = max(r.latest for r in chain(run))
                if as_of - retention > latest:
                    assert now - latest > retention
                    gone.update(k for r in chain(run) for k in r.keys)
                    ended.remove(run)
                    targets, runs = targets + 1, runs + len(chain(run))
                    current.update({wf: None for wf, c in current.items() if c is run})
            for wf, refusals in runless.items():
                old = [(k, t) for k, t in refusals if t < as_of - retention]
                gone.update(k for k, _ in old)
                runless[wf] = [r for r in refusals if r not in old]
                targets += bool(old)
            assert (report.chains, report.counts.runs) == (targets, runs)
            pruned = targets > 0
            if pruned:
                record(newest if capped and newest is not None else now)
        live = [(wf, k) for wf, refusals in runless.items() for k, _ in refusals]
        for wf, run in current.items():
            if run is not None and run.open:
                live += [(wf, k) for r in chain(run) for k in r.keys]
        for run in ended:
            live += [(run.wf, k) for r in chain(run) for k in r.keys]
        for wf, key in live:
            assert service.receipt("ns", f"wf{wf}", "signal", key) is not None, key
        for key in gone:
            assert all(service.receipt("ns", f"wf{wf}", "signal", key) is None for wf in (0, 1)), key


def test_a_clock_in_another_zone_keeps_the_same_instants_on_every_backend(store: Store) -> None:
    behind = timezone(timedelta(hours=-10))
    now = [datetime(2026, 1, 1, 2, tzinfo=behind)]  # 12:00 UTC
    service = AdmissionService(store, clock=lambda: now[0])
    run = service.start_run("ns", "wf")
    signal = service.admit_signal("ns", "wf", "s", [], request_id="k")
    closed = service.close_run("ns", "wf", "completed")
    noon = datetime(2026, 1, 1, 12, tzinfo=UTC)
    assert run.started_at == signal.received_at == closed.closed_at == noon
    assert {e.recorded_at for e in service.history("ns", "wf")} == {noon}
    assert all(e.recorded_at.utcoffset() == timedelta(0) for e in service.history("ns", "wf"))
    # 30 days later minus one second by the same zone's clock: not yet, on every backend.
    now[0] += timedelta(days=30, seconds=-1)
    assert service.prune(30, max_clock_lead=IDLE).counts.runs == 0
    now[0] += timedelta(seconds=2)
    assert service.prune(30, max_clock_lead=IDLE).counts.runs == 1


def test_a_clock_that_returns_a_naive_time_is_refused_before_anything_is_written(store: Store) -> None:
    service = AdmissionService(store, clock=lambda: datetime(2026, 1, 1))  # naive: no instant
    with pytest.raises(InvalidValueError) as info:
        service.start_run("ns", "wf")
    assert info.value.field == "clock"
    assert store.find_instance("ns", "wf") is None
