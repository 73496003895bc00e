"""Soak: 1,000 records through seeded random faults and real restarts (issue 6 item 8).

On SQLite.  Every life of the worker is its own OS process (``spawn``): it
offers the next records to the intake, runs send/reconcile cycles against a
target whose every write draws a fault (a before-write outage, a timeout after
or instead of the write, an error after the write, a failed readback), and,
when its life draws a crash, SIGKILLs itself at a random point of a send
(``admission.worker._worker.CRASH_POINTS``).  The parent starts the next life until
every record is accepted and none is waiting to be sent, then settles what is
left with a fault-free target.  At the end every record is accounted for and
the target holds no duplicate.  The tally goes into the run's summary.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import signal
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import pytest

from admission.errors import BeforeWriteError, QueueFullError, TargetTimeoutError
from admission.sql import SqlWorkerStore, create_admission_engine
from admission.worker import (
    CRASH_POINTS,
    DurableWorker,
    Readback,
    Scope,
    SqliteTarget,
    StatusRead,
    TargetRecord,
    write_json_atomically,
)
from tests.conftest import SUMMARY_LINES
from tests.support.backends import sqlite_url
from tests.support.processes import running

# Long: CI runs it in its step of extra tests (ADMISSION_TEST_SET=extra, .ci/run).
pytestmark = pytest.mark.extra

CTX = multiprocessing.get_context("spawn")
SCOPE = {"tenant": "t1", "account": "a1", "page": "p1", "form": "f1"}
RECORDS = 1000
SEED = 20261201
CYCLES_PER_LIFE = 3
MAX_LIVES = 60


class Chaos:
    """A target whose every write (and some readbacks) draws a seeded fault."""

    def __init__(self, inner: SqliteTarget, rng: random.Random) -> None:
        self.inner = inner
        self.rng = rng
        self.drawn: Counter[str] = Counter()

    def write(self, record: TargetRecord) -> None:
        fault = self.rng.choices(
            ["ok", "outage", "timeout_after", "timeout_lost", "error_after"], [70, 12, 8, 4, 6]
        )[0]
        self.drawn[fault] += 1
        if fault == "outage":
            raise BeforeWriteError("drawn outage")
        if fault == "timeout_lost":
            raise TargetTimeoutError("drawn timeout; the request was lost")
        self.inner.write(record)
        if fault == "timeout_after":
            raise TargetTimeoutError("drawn timeout after the write landed")
        if fault == "error_after":
            raise ConnectionResetError("drawn reset after the write landed")

    def read_back(self, write_id: str) -> Readback:
        if self.rng.random() < 0.2:
            return Readback("unknown", write_id, detail="drawn failed readback")
        return self.inner.read_back(write_id)

    def observe_status(self, write_ids: Sequence[str]) -> list[StatusRead]:
        return self.inner.observe_status(write_ids)


def _life(url: str, target_path: str, progress_path: str, seed: int) -> None:
    """One life of the worker, in its own process; it may end by SIGKILLing itself."""
    rng = random.Random(seed)
    progress = json.loads(Path(progress_path).read_text())
    chaos = Chaos(SqliteTarget(target_path), rng)
    crash_cycle = rng.randrange(CYCLES_PER_LIFE) if rng.random() < 0.9 else None
    crash_point = rng.choice(CRASH_POINTS)
    armed = False

    def hook(point: str) -> None:
        if armed and point == crash_point:
            os.kill(os.getpid(), signal.SIGKILL)  # a real crash: nothing after this line runs

    engine = create_admission_engine(url)
    # The local worker's own ownership: the file lock, which a killed life releases at once.
    worker = DurableWorker(
        SqlWorkerStore(engine), Scope.parse(SCOPE), hook=hook, send_batch=rng.choice([1, 8])
    )
    for cycle in range(CYCLES_PER_LIFE):
        offered = progress["accepted"]
        for i in range(offered, min(offered + 150, RECORDS)):
            try:
                # A record accepted by a life killed before it wrote its progress is
                # offered again: the intake answers ``duplicate`` and writes nothing.
                worker.accept({**SCOPE, "source_key": f"lead-{i}", "payload": {"k": i}})
            except QueueFullError:
                progress["refusals"] += 1  # refused, not dropped: offered again next cycle
                break
            progress["accepted"] = i + 1
        armed = cycle == crash_cycle
        worker.run_once(chaos)
        armed = False
        for fault, n in chaos.drawn.items():
            progress["drawn"][fault] = progress["drawn"].get(fault, 0) + n
        chaos.drawn.clear()
        write_json_atomically(progress_path, progress)
    engine.dispose()


def test_a_thousand_records_through_random_faults_and_real_restarts(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path)
    target_path = tmp_path / "target.sqlite3"
    target = SqliteTarget(target_path)
    progress_path = tmp_path / "progress.json"
    write_json_atomically(progress_path, {"accepted": 0, "refusals": 0, "drawn": {}})
    engine = create_admission_engine(url)
    observer = DurableWorker(SqlWorkerStore(engine), Scope.parse(SCOPE))
    kills = lives = 0
    while True:
        life = CTX.Process(target=_life, args=(url, str(target_path), str(progress_path), SEED + lives))
        with running(life):
            pass
        lives += 1
        assert life.exitcode in (0, -signal.SIGKILL), f"life {lives} exited {life.exitcode}"
        kills += life.exitcode == -signal.SIGKILL
        counts = observer.status(records=False)["counts"]
        assert isinstance(counts, dict)
        accepted = json.loads(progress_path.read_text())["accepted"]
        if accepted == RECORDS and not counts.get("prepared"):
            break
        assert lives < MAX_LIVES, f"no end after {lives} lives: {counts}"
    # Settle: in-flight leftovers become uncertain, and readbacks confirm what landed.
    for _ in range(3):
        observer.run_once(target)

    progress = json.loads(progress_path.read_text())
    records = observer.status()["records"]
    assert isinstance(records, list)
    states = {r["write_id"]: r["state"] for r in records}
    tally = Counter(states.values())
    landed = target.write_ids()
    duplicates = len(landed) - len(set(landed)) + target.duplicate_attempts()

    assert len(states) == RECORDS  # every record accounted for, each once
    assert {r["source_key"] for r in records} == {f"lead-{i}" for i in range(RECORDS)}
    assert set(tally) <= {"confirmed", "failed_safe", "uncertain"}
    assert duplicates == 0
    assert {w for w, s in states.items() if s == "confirmed"} == set(landed)
    # What is still uncertain never reached the target: its request was lost.
    assert not {w for w, s in states.items() if s == "uncertain"} & set(landed)
    assert progress["refusals"] > 0 and kills > 0  # the bound and real crashes were exercised
    SUMMARY_LINES.append(
        f"worker soak: {RECORDS} records, seed {SEED}: confirmed={tally['confirmed']} "
        f"failed_safe={tally['failed_safe']} uncertain={tally['uncertain']} duplicates={duplicates}; "
        f"{lives} worker processes, {kills} SIGKILLed mid-send, {progress['refusals']} queue-full "
        f"refusals, faults drawn {dict(sorted(progress['drawn'].items()))}"
    )
    engine.dispose()
