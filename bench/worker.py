"""Durable worker throughput beside the floor of the same target writes, measured in one run.

**worker**: records confirmed per second by ``DurableWorker.run_once`` through
the local SQLite target (records accepted before the clock starts): per
batch of ``send_batch`` records one queue commit (the previous batch's
confirms and this batch's ``in_flight``, with their events), then one
target write per record.  The worker owns the queue before the clock
starts, as ``admission worker start`` does for its whole life; the
**one-shot** row also times the claim and release of the lease (two more
commits), as ``admission worker once`` pays them.  **intake + worker**
includes ``accept`` (one commit per record, as contract §1 requires) in
the timed part.
**floor**: the same ``SqliteTarget.write`` calls done directly, nothing
else: the target's own durable commit per record.

Both sides use SQLite in WAL with ``synchronous=FULL``, files in one
temporary directory, and a fresh target file per round.  Candidates are
interleaved (the order alternates every round) and the table reports
medians over the rounds.

Usage: ``python bench/worker.py [--records N] [--rounds N] [--markdown]``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

# bench/admission.py would shadow the package when run as a script.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or os.getcwd()).resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))

from admission.intent import canonical_encode  # noqa: E402
from admission.sql import (  # noqa: E402
    SqlWorkerStore,
    create_admission_engine,
    upgrade,
)
from admission.worker import DurableWorker, Scope, SqliteTarget, TargetRecord, WorkerLimits  # noqa: E402

SCOPE = Scope.parse({"tenant": "t1", "account": "a1", "page": "p1", "form": "f1"})


def record(i: int) -> dict[str, object]:
    return {
        **SCOPE.as_dict(),
        "source_key": f"lead-{i}-{uuid.uuid4().hex}",
        "payload": {"n": i, "name": "x" * 40},
    }


def run_worker(
    directory: Path, n: int, *, with_intake: bool, send_batch: int, one_shot: bool = False
) -> float:
    url = f"sqlite:///{directory / f'q-{uuid.uuid4().hex}.sqlite3'}"
    engine = create_admission_engine(url)
    upgrade(engine)
    worker = DurableWorker(
        SqlWorkerStore(engine),
        SCOPE,
        limits=WorkerLimits(max_waiting=n),
        file_lock=False,
        send_batch=send_batch,
    )
    target = SqliteTarget(directory / f"t-{uuid.uuid4().hex}.sqlite3")
    records = [record(i) for i in range(n)]
    if not with_intake:
        for r in records:
            worker.accept(r)
    with contextlib.ExitStack() as owner:
        if not one_shot:
            owner.enter_context(worker.owned())
        start = time.perf_counter()
        if with_intake:
            for r in records:
                worker.accept(r)
        report = worker.run_once(target)
        elapsed = time.perf_counter() - start
    assert report.confirmed == n, report
    engine.dispose()
    return n / elapsed


def run_floor(directory: Path, n: int) -> float:
    target = SqliteTarget(directory / f"f-{uuid.uuid4().hex}.sqlite3")
    rows = [TargetRecord(str(uuid.uuid4()), "t1", f"lead-{i}", canonical_encode(record(i))) for i in range(n)]
    start = time.perf_counter()
    for row in rows:
        target.write(row)
    return n / (time.perf_counter() - start)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200, help="records per round (200)")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds (7)")
    parser.add_argument("--markdown", action="store_true", help="print a Markdown table")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="admission-worker-bench-") as tmp:
        directory = Path(tmp)
        candidates: dict[str, Callable[[], float]] = {
            "floor (target writes alone)": lambda: run_floor(directory, args.records),
            "worker, send_batch=1 (default)": lambda: run_worker(
                directory, args.records, with_intake=False, send_batch=1
            ),
            "worker, send_batch=32": lambda: run_worker(
                directory, args.records, with_intake=False, send_batch=32
            ),
            "worker one-shot, send_batch=32": lambda: run_worker(
                directory, args.records, with_intake=False, send_batch=32, one_shot=True
            ),
            "intake + worker, send_batch=32": lambda: run_worker(
                directory, args.records, with_intake=True, send_batch=32
            ),
        }
        rates: dict[str, list[float]] = {name: [] for name in candidates}
        for round_number in range(args.rounds):
            order = list(candidates)
            if round_number % 2:
                order.reverse()
            for name in order:
                rates[name].append(candidates[name]())
    medians = {name: statistics.median(values) for name, values in rates.items()}
    floor = medians["floor (target writes alone)"]
    print(
        f"# {args.records} records x {args.rounds} rounds; Python {platform.python_version()}, "
        f"SQLite WAL synchronous=FULL; {platform.machine()} {platform.system()}"
    )
    if args.markdown:
        print("| candidate | median records/s | ratio to the floor |")
        print("|---|---:|---:|")
    for name, rate in medians.items():
        if args.markdown:
            print(f"| {name} | {rate:,.0f} | {rate / floor:.2f}x |")
        else:
            print(f"{name:32} {rate:10,.0f}/s  {rate / floor:5.2f}x the floor")
    return 0


if __name__ == "__main__":
    sys.exit(main())
