"""Durable job throughput beside two floors measured in the same run (SQLite, docs/performance.md).

A job here has ``--steps`` steps (default 3) that do no work, so what is
measured is the job machinery: enqueue, claim, a checkpoint per step but the
last, record the result, publish it to the local target, acknowledge.  That
is ``steps + 3`` transactions on the job database and one on the target,
each durable (WAL, ``synchronous=FULL``).

Floors, on the same machine, in the same run, interleaved with the jobs:

* **target**: the same publications written directly with
  ``LocalPublisher.publish``, fenced as the runner's are (the external effect alone);
* **raw transactions**: the same number of durable transactions as a job
  needs, each one single-row INSERT through the raw ``sqlite3`` driver into a
  scratch table on a database configured like the job database, plus the
  publication.  This is the least any design with a checkpoint per step and
  a separate acknowledgement can cost.

Each round runs the three for ``--seconds`` each, alternating the order; the
table gives medians over ``--rounds`` rounds and the ratios of the job rate
to each floor.

Usage: ``python bench/jobs.py [--seconds N] [--rounds N] [--steps N] [--markdown]``.
"""

from __future__ import annotations

import argparse
import itertools
import os
import platform
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

# bench/admission.py sits beside this file: this directory must not shadow the package.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or os.getcwd()).resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))

from admission.intent import Value, canonical_encode  # noqa: E402
from admission.jobs import (  # noqa: E402
    Continue,
    Finish,
    Job,
    JobRunner,
    JobService,
    LocalPublisher,
)
from admission.sql import (  # noqa: E402
    SqlJobStore,
    create_admission_engine,
    upgrade,
)

RESULT = canonical_encode({"sum": 6})


def _steps(payload: Value, step: int, state: Value) -> Continue | Finish:
    assert isinstance(payload, dict) and isinstance(payload["steps"], int)
    return Finish({"sum": step}) if step >= payload["steps"] else Continue(step)


def _rate(work: Callable[[], None], seconds: float) -> float:
    done, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        work()
        done += 1
    return done / elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args(argv)

    directory = Path(tempfile.mkdtemp(prefix="admission-bench-jobs-"))
    engine = create_admission_engine(f"sqlite:///{directory / 'jobs.sqlite3'}")
    upgrade(engine)
    jobs = JobService(SqlJobStore(engine), max_waiting=1_000_000)
    runner = JobRunner(jobs, LocalPublisher(directory / "target.sqlite3"), {"steps": _steps})
    floor_target = LocalPublisher(directory / "floor-target.sqlite3")
    raw = sqlite3.connect(directory / "floor.sqlite3", isolation_level=None)
    raw.execute("PRAGMA journal_mode=WAL")
    raw.execute("PRAGMA synchronous=FULL")
    raw.execute("CREATE TABLE floor (id INTEGER PRIMARY KEY, job_id TEXT NOT NULL, state BLOB NOT NULL)")
    ids = itertools.count()
    # enqueue, claim, a checkpoint per step but the last, record, acknowledge
    transactions = args.steps + 3

    def one_job() -> None:
        job_id = f"job-{next(ids)}"
        jobs.enqueue(Job(job_id, "bench", "steps", {"steps": args.steps}))
        report = runner.run(job_id)
        assert report.state == "completed", report

    def one_publication() -> None:
        floor_target.publish(f"floor-{next(ids)}", "attempt", RESULT, fence=1)

    def raw_transactions() -> None:
        job_id = f"raw-{next(ids)}"
        for _ in range(transactions):
            raw.execute("BEGIN IMMEDIATE")
            raw.execute("INSERT INTO floor (job_id, state) VALUES (?, ?)", (job_id, RESULT))
            raw.execute("COMMIT")
        floor_target.publish(job_id, "attempt", RESULT, fence=1)

    candidates = {"jobs": one_job, "target": one_publication, "raw transactions": raw_transactions}
    rates: dict[str, list[float]] = {name: [] for name in candidates}
    for round_number in range(args.rounds):
        order = list(candidates) if round_number % 2 == 0 else list(reversed(candidates))
        for name in order:
            rates[name].append(_rate(candidates[name], args.seconds))
    median = {name: statistics.median(values) for name, values in rates.items()}

    header = (
        f"SQLite {sqlite3.sqlite_version}, Python {platform.python_version()}, {args.steps} steps per job "
        f"({transactions} job-database transactions + 1 publication), {args.rounds} rounds x "
        f"{args.seconds:g} s, medians"
    )
    rows = [
        ("jobs completed/s (enqueue .. acknowledge)", median["jobs"], "1.00"),
        (
            "floor: publications/s written directly",
            median["target"],
            f"{median['jobs'] / median['target']:.2f}",
        ),
        (
            f"floor: {transactions} raw durable transactions + 1 publication /s",
            median["raw transactions"],
            f"{median['jobs'] / median['raw transactions']:.2f}",
        ),
    ]
    if args.markdown:
        print(header + "\n")
        print("| measurement | per second | jobs / this |")
        print("|---|---:|---:|")
        for name, rate, ratio in rows:
            print(f"| {name} | {rate:,.0f} | {ratio} |")
    else:
        print(header)
        for name, rate, ratio in rows:
            print(f"{name:<60} {rate:>10,.0f}/s   jobs/this {ratio}")
    jobs.dispose()
    raw.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
