"""Two processes never both run a handler under one command key (docs/once.md), shown with real OS processes.

Each worker opens its own :class:`SqlStore` on the test's database and its own
:class:`Once`, and its handler appends a line to a file shared by all of them,
so the file says how many times the handler really ran.  The first race holds
the winner inside its handler until every other process has answered; the
second kills the holder with SIGKILL inside its handler and lets retriers whose
clock is past the in-progress expiry race to take the update over.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import traceback
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from admission.errors import UpdateInProgressError
from admission.receipts import IN_PROGRESS_EXPIRED, AdmissionService, Once
from admission.sql import SqlStore, audit, create_admission_engine
from tests.support.processes import WAIT, running

CTX = multiprocessing.get_context("spawn")
NS = "tenant-once"
EXPIRY = timedelta(minutes=30)
RETRIERS = 2


def _worker(
    db_url: str,
    ledger: str,
    barrier: Any,
    results: Any,
    hold: Any,
    entered: Any,
    clock_lead: float,
) -> None:
    """Call the decorated handler once with the shared key; report what happened.

    The handler appends this process's pid to ``ledger``, sets ``entered`` and, with
    ``hold``, waits for it before returning (the parent lets it go, or kills it).
    """
    lead = timedelta(seconds=clock_lead)
    store = SqlStore.open(db_url)
    service = AdmissionService(store, clock=lambda: datetime.now(UTC) + lead)
    once = Once(service, namespace=NS, workflow_id="charges", in_progress_expiry=EXPIRY)

    @once(name="charge")
    def charge(key: str, amount: int) -> dict[str, int]:
        with open(ledger, "a") as file:
            file.write(f"{os.getpid()}\n")
        entered.set()
        if hold is not None:
            hold.wait(WAIT)
        return {"amount": amount, "pid": os.getpid()}

    try:
        store.find_instance(NS, "warm-up")  # connect before the race, not during it
        barrier.wait(WAIT)
        try:
            value = charge("order-7", 100)
        except UpdateInProgressError:
            results.put({"pid": os.getpid(), "answer": "in_progress"})
        else:
            results.put({"pid": os.getpid(), "answer": "value", "value": value})
    except BaseException:
        results.put({"pid": os.getpid(), "error": traceback.format_exc()})
    finally:
        store.dispose()


def _collect(results: Any, count: int) -> list[dict[str, Any]]:
    got = [results.get(timeout=WAIT) for _ in range(count)]
    errors = [r["error"] for r in got if "error" in r]
    assert not errors, errors[0]
    return got


def _ran(ledger: Path) -> list[int]:
    return [int(line) for line in ledger.read_text().split()] if ledger.exists() else []


def test_processes_racing_one_key_run_the_handler_once(db_url: str, tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    n = RETRIERS + 1
    barrier, results, hold, entered = CTX.Barrier(n), CTX.Queue(), CTX.Event(), CTX.Event()
    workers = [
        CTX.Process(target=_worker, args=(db_url, str(ledger), barrier, results, hold, entered, 0.0))
        for _ in range(n)
    ]
    with running(*workers):
        # The winner stays inside its handler until every other process has answered.
        losers = _collect(results, n - 1)
        assert all(r["answer"] == "in_progress" for r in losers) and entered.wait(WAIT)
        hold.set()
        (winner,) = _collect(results, 1)
    assert _ran(ledger) == [winner["pid"]]
    assert winner["value"] == {"amount": 100, "pid": winner["pid"]}
    # A later retry gets the recorded result and runs nothing.
    store = SqlStore.open(db_url)
    try:
        once = Once(AdmissionService(store), namespace=NS, workflow_id="charges")

        @once(name="charge")
        def charge(key: str, amount: int) -> dict[str, int]:
            raise AssertionError("the handler ran again")

        assert charge("order-7", 100) == winner["value"]
    finally:
        store.dispose()
    assert _ran(ledger) == [winner["pid"]]


def test_after_the_holder_dies_exactly_one_retrier_takes_over(db_url: str, tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    # Every synchronisation object lives in a variable until the processes end: one only
    # referenced by a Process's arguments could be collected before the child unpickles it.
    results, entered, never, alone = CTX.Queue(), CTX.Event(), CTX.Event(), CTX.Barrier(1)
    holder = CTX.Process(target=_worker, args=(db_url, str(ledger), alone, results, never, entered, 0.0))
    with running(holder):
        assert entered.wait(WAIT)
        assert holder.pid is not None
        os.kill(holder.pid, signal.SIGKILL)  # dies inside the handler: the update stays accepted
    assert results.empty() and _ran(ledger) == [holder.pid]
    # The retriers' clocks read past the expiry; they race to take the update over.
    barrier, inside = CTX.Barrier(RETRIERS), CTX.Event()
    lead = (EXPIRY + timedelta(minutes=1)).total_seconds()
    retriers = [
        CTX.Process(target=_worker, args=(db_url, str(ledger), barrier, results, None, inside, lead))
        for _ in range(RETRIERS)
    ]
    with running(*retriers):
        answers = _collect(results, RETRIERS)
    ran = _ran(ledger)
    assert len(ran) == 2 and ran[0] == holder.pid
    (taker,) = [a for a in answers if a["pid"] == ran[1]]
    assert taker["value"] == {"amount": 100, "pid": taker["pid"]}
    # The others found the new holder in progress, or its recorded result: never a run of their own.
    assert all(a["answer"] == "in_progress" or a["value"] == taker["value"] for a in answers)
    store = SqlStore.open(db_url)
    try:
        history = AdmissionService(store).history(NS, "charges")
    finally:
        store.dispose()
    kinds = Counter(e.event_type for e in history)
    assert (kinds["UpdateAccepted"], kinds["UpdateKeyReleased"], kinds["UpdateCompleted"]) == (2, 1, 1)
    failed = [e.payload for e in history if e.event_type == "UpdateFailed"]
    assert [p["failure"] for p in failed] == [IN_PROGRESS_EXPIRED]
    # The released command is consistent with its events and its (cleared) key.
    engine = create_admission_engine(db_url)
    try:
        report = audit(engine)
    finally:
        engine.dispose()
    assert report.ok, report
