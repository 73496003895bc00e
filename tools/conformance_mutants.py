"""How well the conformance kit catches the deliberately broken targets of ``tests/support/mutants.py``.

Every mutant is run over K seeds (``run_conformance(mutant, examples=N, seed=s)``
for s in 0..K-1) and the tool prints a markdown table: how many seeds caught it,
the median and the largest number of examples hypothesis ran until its first
failure, the median number of target calls in the shrunk counterexample, and
the seconds spent.  ``docs/conformance.md`` quotes the table.

Usage: ``python tools/conformance_mutants.py [--seeds K] [--examples N] [--steps S] [--jobs J]
[--correct] [MUTANT ...]`` from the repository root; ``--correct`` adds the correct target as a
control row, ``--jobs`` runs seeds in parallel processes.  Each seed is first searched without
shrinking, which gives the examples to the first failure; a seed that caught the mutant is run
again through ``run_conformance``, whose shrunk counterexample gives the length, and whose time
is the seconds (for a seed that caught nothing, the search's time: the same run).
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
    seconds: float = 0.0

    def cells(self) -> list[str]:
        def median(values: list[int]) -> str:
            return f"{statistics.median(values):g}" if values else "-"

        return [
            f"`{self.name}`",
            f"{self.caught}/{self.runs}",
            median(self.examples),
            str(max(self.examples)) if self.examples else "-",
            median(self.lengths),
            f"{self.seconds:.1f}",
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


def one_seed(job: tuple[str, int, int, Options]) -> tuple[int, int, float]:
    """One mutant, one seed: (examples to the first failure or 0, shrunk calls, seconds).

    The seeded search runs first without shrinking; only a seed that caught the mutant is run
    again through ``run_conformance`` for its shrunk counterexample (the seconds are those of
    that call, search and shrinking; else of the search alone, which is what the full run
    would have cost)."""
    name, seed, examples, options = job
    make = memory_target if name == CORRECT else MUTANTS[name]
    started = time.perf_counter()
    first = first_failure(make(), examples, seed, options)
    if not first:
        return 0, 0, time.perf_counter() - started
    started = time.perf_counter()
    report = run_conformance(make(), examples=examples, seed=seed, options=options)
    seconds = time.perf_counter() - started
    if report.failure is None:  # the shrinking run must find what the search found
        raise AssertionError(f"{name}, seed {seed}: caught by the search, not by run_conformance")
    return first, len(report.failure.trace), seconds


def measure(name: str, seeds: int, examples: int, options: Options, jobs: int) -> Row:
    """Run the kit against a fresh target for every seed (``jobs`` processes at once)."""
    row = Row(name)
    work = [(name, seed, examples, options) for seed in range(seeds)]
    if jobs > 1:
        with multiprocessing.get_context("spawn").Pool(jobs) as pool:
            results = pool.map(one_seed, work)
    else:
        results = [one_seed(job) for job in work]
    for first, length, seconds in results:
        row.runs += 1
        row.seconds += seconds
        if first:
            row.caught += 1
            row.examples.append(first)
            row.lengths.append(length)
    return row


def table(rows: Sequence[Row]) -> str:
    """The markdown table of ``rows``."""
    head = [
        "mutant",
        "caught",
        "median examples to catch",
        "max examples to catch",
        "median shrunk calls",
        "seconds",
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
    parser.add_argument("--correct", action="store_true", help="add the correct target as a control row")
    args = parser.parse_args(argv)
    options = Options() if args.steps is None else Options(steps=args.steps)
    rows = []
    for name in [*(args.mutants or MUTANTS), *([CORRECT] if args.correct else [])]:
        rows.append(measure(name, args.seeds, args.examples, options, args.jobs))
        print(
            f"{name}: {rows[-1].caught}/{rows[-1].runs}, {rows[-1].seconds:.0f} s",
            file=sys.stderr,
            flush=True,
        )
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
