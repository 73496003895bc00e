"""Property-based conformance of admission and the run lifecycle (contract §2, §4, §5), on every store.

The shipped kit (``admission.conformance``) runs here against admission
itself: :func:`~admission.conformance.machine_for` over a
:class:`~admission.conformance.ServiceTarget` on each store of the contract
suite (memory, SQLite, PostgreSQL).  Its state machine drives random sequences
of run starts, signals and updates (fresh, keyed or not, to the instance or to
the current, an older or another instance's run), retries with the same intent
(spelt otherwise) and with a changed name, arguments, target or twin key,
applications, completions and failures, closures, continue-as-new and
pruning, across two namespaces and two or three workflow ids that share one
small pool of keys.  Every answer is predicted by the kit's reference model,
written from the contract's words (and ``docs/lifecycle.md`` where the
contract is silent), never by calling admission's own decision tables; after
every step the event log of the instances the step addressed (and of one
more, in turn) must equal the model's, event for event.

The async service (:class:`~admission.conformance.AsyncServiceTarget`), the
lost-response mode and the concurrent mode (three clients on one key) run on
memory and SQLite, with fewer examples.

The machine counts its steps per run and reports them at the end of the
module (``conformance steps: memory=... sqlite=... postgresql=...`` on the
process's real stderr, so CI logs show it, and as JSON, with what each run exercised, under
pytest's temporary directory).  ``CI`` selects the larger profile;
``CONFORMANCE_EXAMPLES`` and ``CONFORMANCE_STEPS`` override either.
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test

from admission.aio import open_store as open_async_store
from admission.conformance import AsyncServiceTarget, Options, ServiceTarget, Target, machine_for
from admission.conformance._determinism import without_local_constants
from admission.conformance._model import UPDATE_CLOSED
from admission.errors import UnknownCommandError, UnknownUpdateError
from admission.receipts import Admission, AdmissionService, Decision, MemoryStore, Store
from tests.conftest import SUMMARY_LINES
from tests.support.backends import SQL_BACKENDS, PostgresPool, database_url, open_store

# -- the run sizes ---------------------------------------------------------------------------

IN_CI = bool(os.environ.get("CI"))
# Default: the whole file in well under a minute on all three backends.  CI: enough examples
# to meet every coverage label of the derandomised run (checked at 200), the file in about
# two minutes on two cores.
MAX_EXAMPLES = int(os.environ.get("CONFORMANCE_EXAMPLES", 200 if IN_CI else 60))
STEP_COUNT = int(os.environ.get("CONFORMANCE_STEPS", 40 if IN_CI else 30))
# The async service and the two modes run a sixth as many examples: they add a path or a
# way of sending to what the main runs already check.
MODE_EXAMPLES = max(MAX_EXAMPLES // 6, 10)


def sized(examples: int) -> settings:
    return settings(
        max_examples=examples,
        stateful_step_count=STEP_COUNT,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        # The short runs (the async service, the two modes) draw the same cases every time, as
        # in CI: with ten random examples, 7 of 300 lost-answer runs and 10 of 300 concurrent
        # ones missed a coverage label (measured on memory), which would fail a run of the suite
        # for nothing.  The main runs, with six times the examples, stay random outside CI.
        derandomize=IN_CI or examples == MODE_EXAMPLES,
    )


# What every run must have exercised (labels the machine records as it goes).
COVERAGE = [
    "fresh received",
    "fresh accepted",
    "fresh rejected_not_current",
    "fresh run_not_active",
    "conflict",
]
CI_COVERAGE = [
    *COVERAGE,
    "retained received",
    "retained accepted",
    "retained completed",
    "retained failed",
    "retained rejected_not_current",
    "retained run_not_active",
    "handed off",
    "twin key",
    "twin arguments",
    "apply fresh",
    "apply again",
    "apply unknown",
    "apply rejected",
    "completed fresh",
    "completed again",
    "completed refused",
    "completed unknown",
    "failed fresh",
    "failed again",
    "start refused",
    "close refused",
    "continue refused",
    "pruned chain",
    "pruned chain (dry run)",
    "pruned run-less refusals",
    "fresh again after pruning",
]

STEPS: Counter[str] = Counter()
SEEN: dict[str, Counter[str]] = {}
SECONDS: dict[str, float] = {}


def run_kit(run: str, target: Target, options: Options, examples: int, coverage: list[str]) -> None:
    """Run the kit's machine over ``target``; it must pass, run enough steps and meet ``coverage``."""
    machine = machine_for(target, options)
    stats = machine.stats  # type: ignore[attr-defined]
    started = time.perf_counter()
    try:
        # Without the constants of the modules this process happened to import: the derandomised
        # sequence is then the same in every process, alone or after any other tests.
        with without_local_constants():
            run_state_machine_as_test(machine, settings=sized(examples))
    except AssertionError as failure:
        # The shrunk sequence, as the kit saw it, one line per call.
        trace = "\n".join(stats.trace)
        raise AssertionError(f"{failure}\n-- the failing example's calls --\n{trace}") from failure
    finally:
        SECONDS[run] = SECONDS.get(run, 0.0) + time.perf_counter() - started
        STEPS[run] += stats.steps
        SEEN.setdefault(run, Counter()).update(stats.labels)
    assert stats.steps >= examples * 10, (
        f"only {stats.steps} steps ran on {run}; at least {examples * 10} expected"
    )
    # Not a vacuous pass: the answers that matter turned up.  The CI profile (derandomised,
    # many examples) must meet every one of them.
    missing = [label for label in coverage if not stats.labels[label]]
    assert not missing, f"never seen on {run}: {missing}; seen {dict(stats.labels)}"


def backend_of(request: pytest.FixtureRequest) -> str:
    return str(request.node.callspec.params["store"])


def test_admission_and_lifecycle_follow_the_contract(store: Store, request: pytest.FixtureRequest) -> None:
    backend = backend_of(request)
    # The in-memory store copies all its tables in every transaction: a fresh one per example
    # keeps long runs (and shrinking) linear.  The SQL stores keep every example's rows, so each
    # example also runs beside the others'.
    target = ServiceTarget.memory() if isinstance(store, MemoryStore) else ServiceTarget(store, name=backend)
    run_kit(backend, target, Options(steps=STEP_COUNT), MAX_EXAMPLES, CI_COVERAGE if IN_CI else COVERAGE)


# The other runs: memory, and SQLite (when the backend switch selects it) in the extra set,
# which CI runs as a step of its own: the default set stays short.
SMALL = ["memory", *(pytest.param(b, marks=pytest.mark.extra) for b in SQL_BACKENDS if b == "sqlite")]


@pytest.fixture(params=SMALL)
def small_backend(
    request: pytest.FixtureRequest, postgres_pool: PostgresPool, tmp_path: Path
) -> Iterator[tuple[str, str | None]]:
    """``memory`` or ``sqlite`` and, for SQLite, a fresh database's URL."""
    name = str(request.param)
    yield name, None if name == "memory" else database_url(name, postgres_pool, tmp_path)


def test_the_async_service_follows_the_contract(small_backend: tuple[str, str | None]) -> None:
    backend, url = small_backend
    if url is None:
        target = AsyncServiceTarget.memory()
    else:
        target = AsyncServiceTarget.opened(lambda: open_async_store(url), name=f"{backend} (async)")
    try:
        run_kit(f"{backend}-async", target, Options(steps=STEP_COUNT), MODE_EXAMPLES, COVERAGE)
    finally:
        target.close()


@pytest.mark.parametrize("mode", ["lost", "concurrent"])
def test_retries_after_lost_answers_and_concurrent_clients_are_retained(
    small_backend: tuple[str, str | None], mode: str
) -> None:
    """Lost answers: every keyed admission is sent twice and only the second answer is kept; it
    must be the first's receipt.  Concurrent clients: three send each keyed admission at once;
    exactly one admits it, the others get its receipt."""
    backend, url = small_backend
    options = Options(
        steps=STEP_COUNT, lost_responses=mode == "lost", concurrency=3 if mode == "concurrent" else 1
    )
    if url is None:
        run_kit(f"{backend}-{mode}", ServiceTarget.memory(), options, MODE_EXAMPLES, COVERAGE)
        return
    for store in open_store(url):
        run_kit(f"{backend}-{mode}", ServiceTarget(store, name=backend), options, MODE_EXAMPLES, COVERAGE)


@pytest.fixture(scope="module", autouse=True)
def report_steps(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Save the steps each run executed, and leave them for the run's summary (CI logs keep it)."""
    yield
    if not STEPS:
        return
    profile = "ci" if IN_CI else "default"
    line = (
        "conformance steps: "
        + " ".join(f"{run}={STEPS[run]}" for run in STEPS)
        + f" (profile {profile}: {MAX_EXAMPLES} examples ({MODE_EXAMPLES} for the async service and the"
        + f" modes) x <= {STEP_COUNT} steps; seconds "
        + " ".join(f"{run}={SECONDS.get(run, 0.0):.1f}" for run in STEPS)
        + ")"
    )
    path = tmp_path_factory.mktemp("conformance") / "steps.json"
    path.write_text(
        json.dumps(
            {
                "profile": profile,
                "steps": dict(STEPS),
                "seconds": {k: round(v, 2) for k, v in SECONDS.items()},
                "seen": {k: dict(sorted(v.items())) for k, v in SEEN.items()},
            },
            indent=2,
        ),
        encoding="utf-8",
    )
    SUMMARY_LINES.append(f"{line} (details: {path})")


# -- namespace isolation, spelled out ----------------------------------------------------------


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = datetime(2030, 1, 1, tzinfo=UTC)

    def __call__(self) -> datetime:
        self.now += timedelta(seconds=1)
        return self.now

    def advance(self, **delta: float) -> None:
        self.now += timedelta(**delta)


A, B, WF, KEY_K = "tenant-a", "tenant-b", "order-1", "k"


def commands_in(service: AdmissionService, namespace: str) -> set[str]:
    return {e.command_id for e in service.history(namespace, WF) if e.command_id is not None}


def snapshot(service: AdmissionService, namespace: str) -> list[dict[str, object]]:
    return [e.to_dict() for e in service.history(namespace, WF)]


def test_the_same_workflow_and_key_in_two_namespaces_never_interact(store: Store) -> None:
    service = AdmissionService(store, clock=Clock())
    run_a = service.start_run(A, WF)
    run_b = service.start_run(B, WF)
    signal_a = service.admit_signal(A, WF, "approve", [1], request_id=KEY_K)
    # The same key with another intent in the other namespace: a fresh command, not a conflict.
    signal_b = service.admit_signal(B, WF, "reject", {"x": 2}, request_id=KEY_K)
    assert (signal_a.decision, signal_b.decision) == (Decision.FRESH, Decision.FRESH)
    assert signal_a.command_id != signal_b.command_id and signal_b.run_id == run_b.run_id
    # The same key on an update is another receipt (contract §2.6).
    update_a = service.admit_update(A, WF, "approve", [1], request_id=KEY_K)
    assert update_a.decision is Decision.FRESH and update_a.outcome == "accepted"

    # Retries are answered from their own namespace's receipt only.
    retry_a = service.admit_signal(A, WF, "approve", [1], request_id=KEY_K)
    assert (retry_a.decision, retry_a.command_id) == (Decision.RETAINED, signal_a.command_id)
    crossed = service.admit_signal(B, WF, "approve", [1], request_id=KEY_K)
    assert crossed.decision is Decision.CONFLICT
    assert (crossed.retained_command_id, crossed.conflict) == (signal_b.command_id, ("name", "arguments"))

    # Receipt lookup.
    found_a = service.receipt(A, WF, "signal", KEY_K)
    found_b = service.receipt(B, WF, "signal", KEY_K)
    assert found_a is not None and found_a.command_id == signal_a.command_id
    assert found_b is not None and found_b.command_id == signal_b.command_id
    assert service.receipt(B, WF, "update", KEY_K) is None

    # History: each namespace sees its own events only.
    assert commands_in(service, A) == {signal_a.command_id, update_a.command_id}
    assert commands_in(service, B) == {signal_b.command_id}
    assert {e.run_id for e in service.history(A, WF)} == {run_a.run_id}
    assert {e.run_id for e in service.history(B, WF)} == {run_b.run_id}

    # The engine cannot reach a command through the other namespace.
    with pytest.raises(UnknownCommandError):
        service.apply_signal(B, WF, signal_a.command_id)  # type: ignore[arg-type]
    with pytest.raises(UnknownUpdateError):
        service.complete_update(B, WF, update_a.update_id, "ok")  # type: ignore[arg-type]
    # A run of the other namespace is never the current run here.
    pinned = service.admit_update(B, WF, "approve", [1], run_id=run_a.run_id)
    assert (pinned.outcome, pinned.requested_run_id, pinned.resolved_run_id) == (
        "rejected_not_current",
        run_a.run_id,
        run_b.run_id,
    )

    # Closing A's run closes A's pending commands only.
    before_b = snapshot(service, B)
    service.close_run(A, WF, "terminated")
    assert snapshot(service, B) == before_b
    rejected = service.admit_signal(A, WF, "approve", [1], request_id=KEY_K)
    assert (rejected.retained, rejected.signal_status) == (True, "rejected")
    untouched = service.admit_signal(B, WF, "reject", {"x": 2}, request_id=KEY_K)
    assert (untouched.retained, untouched.signal_status) == (True, "received")
    failed = service.admit_update(A, WF, "approve", [1], request_id=KEY_K)
    assert (failed.http_status, failed.failure) == (422, UPDATE_CLOSED)
    # A has no open run now; B still admits.
    assert service.admit_update(A, WF, "x", [], request_id="k2").outcome == "run_not_active"
    assert service.admit_update(B, WF, "x", [], request_id="k2").outcome == "accepted"


def test_pruning_one_namespace_leaves_the_others_identical_rows_untouched(store: Store) -> None:
    clock = Clock()
    service = AdmissionService(store, clock=clock)

    def fill(namespace: str, close: bool) -> dict[str, Admission]:
        service.start_run(namespace, WF)
        made = {
            "signal": service.admit_signal(namespace, WF, "approve", [1], request_id=KEY_K),
            "update": service.admit_update(namespace, WF, "approve", [1], request_id=KEY_K),
            "pending": service.admit_update(namespace, WF, "resize", [2], request_id="k2"),
        }
        service.apply_signal(namespace, WF, made["signal"].command_id)  # type: ignore[arg-type]
        service.complete_update(namespace, WF, made["update"].update_id, {"ok": True})  # type: ignore[arg-type]
        if close:
            service.continue_as_new(namespace, WF)  # a chain of two runs, "pending" handed on
            service.close_run(namespace, WF, "completed")
        return made

    c = "tenant-c"
    made_a = fill(A, close=True)
    closed_a = clock.now
    clock.advance(days=20)
    made_b = fill(B, close=True)  # the same rows, closed 20 days later
    made_c = fill(c, close=False)  # the same rows, run still open
    before = {ns: snapshot(service, ns) for ns in (B, c)}

    # Nothing is written after B closes: the cap on a clock far ahead of the newest
    # recorded time would hold the pruning back, so it is turned off.
    idle: dict[str, Any] = {"max_clock_lead": None}
    report = service.prune(retention_days=30, now=closed_a + timedelta(days=31), **idle)
    counts = getattr(report, "counts", None)
    if counts is not None:
        assert (counts.runs, counts.commands, counts.updates) == (2, 3, 2)

    # B and C: every event and every receipt exactly as before.
    assert {ns: snapshot(service, ns) for ns in (B, c)} == before
    for ns, made in ((B, made_b), (c, made_c)):
        again = service.admit_update(ns, WF, "approve", [1], request_id=KEY_K)
        assert (again.decision, again.command_id, again.http_status, again.result) == (
            Decision.RETAINED,
            made["update"].command_id,
            200,
            {"ok": True},
        )
        found = service.receipt(ns, WF, "signal", KEY_K)
        assert found is not None and found.command_id == made["signal"].command_id
    # A: its runs, commands and events are gone and its keys are free again.
    assert service.receipt(A, WF, "signal", KEY_K) is None
    assert service.receipt(A, WF, "update", KEY_K) is None
    assert not [e for e in service.history(A, WF) if e.run_id is not None or e.command_id is not None]
    service.start_run(A, WF)
    fresh = service.admit_update(A, WF, "approve", [1], request_id=KEY_K)
    assert fresh.decision is Decision.FRESH and fresh.command_id != made_a["update"].command_id

    # Later B expires too; A's new rows (an open run) and C stay.
    before = {ns: snapshot(service, ns) for ns in (A, c)}
    service.prune(retention_days=30, now=clock.now + timedelta(days=31), **idle)
    assert {ns: snapshot(service, ns) for ns in (A, c)} == before
    assert service.receipt(B, WF, "update", KEY_K) is None
    kept = service.receipt(A, WF, "update", KEY_K)
    assert kept is not None and kept.command_id == fresh.command_id
