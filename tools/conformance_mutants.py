"""How well the conformance kit catches the deliberately broken targets of ``tests/support/mutants.py``.

Every mutant is searched over K seeds (0..K-1) with the machine and settings of
``run_conformance(mutant, examples=N, seed=s)``, but without shrinking, so the
search stops at the first failure: how many seeds caught it, and the median and
largest number of examples run until the first failure.  Then the first S seeds
that caught it run through ``run_conformance`` itself, shrinking included: the
median number of target calls in the shrunk counterexample.  The seconds are
those of all the searches, and the median of one whole ``run_conformance``.
``docs/conformance.md`` quotes the table.

Usage: ``python tools/conformance_mutants.py [--seeds K] [--examples N] [--steps S] [--shrink S]
[--jobs J] [--correct] [MUTANT ...]`` from the repository root; ``--correct`` adds the correct
target as a control row, ``--jobs`` runs seeds in parallel processes.
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from admission.conformance import Options, Target, machine_for, run_conformance  # noqa: E402
from tests.support.mutants import MUTANTS, memory_target  # noqa: E402

CORRECT = "(correct)"
"""The control row: the correct target, which must never be caught."""


@dataclass
class Row:
    """One mutant's results over every seed."""

    name: str
    caught: int = 0
    runs: int = 0
    examples: list[int] = field(default_factory=list)  # to the first failure, per catching seed
    lengths: list[int] = field(default_factory=list)  # target calls in the shrunk sequence
    search_seconds: float = 0.0  # every seed's search without shrinking
    run_seconds: list[float] = field(default_factory=list)  # a shrunk seed's whole run_conformance

    def cells(self) -> list[str]:
        def median(values: list[int]) -> str:
            return f"{statistics.median(values):g}" if values else "-"

        return [
            f"`{self.name}`",
            f"{self.caught}/{self.runs}",
            median(self.examples),
            str(max(self.examples)) if self.examples else "-",
            f"{median(self.lengths)} ({len(self.lengths)})",
            f"{self.search_seconds:.0f}",
            f"{statistics.median(self.run_seconds):.0f}" if self.run_seconds else "-",
        ]


def first_failure(target: Target, examples: int, seed: int, options: Options) -> int:
    """How many examples the seeded search runs until its first failure (``0``: none failed).

    The same search as ``run_conformance`` (same seed, settings and machine), with the
    generate phase alone: it stops at the first failure instead of shrinking it, so the
    machine's count of examples is the count to the first failure.
    """
    from hypothesis import HealthCheck, Phase, settings
    from hypothesis import seed as seeded
    from hypothesis.stateful import get_state_machine_test

    machine = machine_for(target, options)
    chosen = settings(
        max_examples=examples,
        stateful_step_count=options.steps,
        database=None,
        deadline=None,
        report_multiple_bugs=False,
        suppress_health_check=list(HealthCheck),
        phases=[Phase.explicit, Phase.reuse, Phase.generate],
    )
    try:
        seeded(seed)(get_state_machine_test(machine, settings=chosen))()
    except Exception:  # the first disagreement, whatever the machine raised
        return int(machine.stats.examples)  # type: ignore[attr-defined]
    return 0


def search(job: tuple[str, int, int, Options]) -> tuple[int, float]:
    """One mutant, one seed, searched without shrinking: (examples to the first failure or 0,
    seconds)."""
    name, seed, examples, options = job
    make = memory_target if name == CORRECT else MUTANTS[name]
    started = time.perf_counter()
    first = first_failure(make(), examples, seed, options)
    return first, time.perf_counter() - started


def shrink(job: tuple[str, int, int, Options]) -> tuple[int, float]:
    """One mutant, one seed that caught it, through ``run_conformance``: (target calls of the
    shrunk counterexample, seconds of the whole run, search and shrinking)."""
    name, seed, examples, options = job
    make = memory_target if name == CORRECT else MUTANTS[name]
    started = time.perf_counter()
    report = run_conformance(make(), examples=examples, seed=seed, options=options)
    if report.failure is None:  # the full run must find what the search found
        raise AssertionError(f"{name}, seed {seed}: caught by the search, not by run_conformance")
    return len(report.failure.trace), time.perf_counter() - started


def measure(name: str, seeds: int, examples: int, options: Options, jobs: int, shrunk: int) -> Row:
    """Search every seed, then shrink the first ``shrunk`` seeds that caught the mutant (``jobs``
    processes at once)."""
    row = Row(name)
    work = [(name, seed, examples, options) for seed in range(seeds)]
    with multiprocessing.get_context("spawn").Pool(jobs) as pool:
        found = pool.map(search, work)
        catching = [job for job, (first, _) in zip(work, found, strict=True) if first][:shrunk]
        shrinks = pool.map(shrink, catching)
    for first, seconds in found:
        row.runs += 1
        row.search_seconds += seconds
        if first:
            row.caught += 1
            row.examples.append(first)
    for length, seconds in shrinks:
        row.lengths.append(length)
        row.run_seconds.append(seconds)
    return row


def table(rows: Sequence[Row]) -> str:
    """The markdown table of ``rows``."""
    head = [
        "mutant",
        "caught",
        "median examples to catch",
        "max examples to catch",
        "median shrunk calls (seeds shrunk)",
        "seconds: every search",
        "seconds: median run with shrinking",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(row.cells()) + " |" for row in rows]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mutants", nargs="*", choices=[[], *MUTANTS], metavar="MUTANT")
    parser.add_argument("--seeds", type=int, default=20, help="seeds per mutant (K, default 20)")
    parser.add_argument("--examples", type=int, default=100, help="examples per run (default 100)")
    parser.add_argument("--steps", type=int, default=None, help="steps per example (the kit's default)")
    parser.add_argument("--jobs", type=int, default=1, help="processes (seeds run in parallel)")
    parser.add_argument(
        "--shrink", type=int, default=None, help="shrink only the first N catching seeds (default: all)"
    )
    parser.add_argument("--correct", action="store_true", help="add the correct target as a control row")
    args = parser.parse_args(argv)
    options = Options() if args.steps is None else Options(steps=args.steps)
    rows = []
    for name in [*(args.mutants or MUTANTS), *([CORRECT] if args.correct else [])]:
        row = measure(name, args.seeds, args.examples, options, args.jobs, args.shrink or args.seeds)
        rows.append(row)
        print(" | ".join(row.cells()), file=sys.stderr, flush=True)
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
