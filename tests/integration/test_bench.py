"""The benchmarks start as the documented scripts (``python bench/NAME.py``).

Run as a script, ``bench/`` is the first entry of ``sys.path``, where
``bench/admission.py`` would shadow the package; each script must still
import admission itself.  Only ``--help`` is run: speed is measured by the
benchmarks, never asserted by tests.  The ``test`` extra installs the
digest benchmark's peers, so every script is checked.  Modules named ``_*`` are
parts of a script, not scripts.  The admission benchmark also runs once,
on SQLite with tiny sizes, as a check of its harness (the loaded database is
read back through the service; the bytes by table and column, and the pages
each kind of call writes, are reported), not of speed; in the extra set, its
PostgreSQL-only part of streams with retries, and its growth part on
PostgreSQL with the WAL read back by relation, run once each, briefly.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted(p.stem for p in (ROOT / "bench").glob("*.py") if not p.stem.startswith("_"))


def test_every_benchmark_is_listed() -> None:
    assert {"admission", "digest", "http", "jobs", "worker"} <= set(SCRIPTS)


@pytest.mark.parametrize("name", SCRIPTS)
def test_the_benchmark_starts_as_a_script(name: str, tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / f"{name}.py"), "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert "usage:" in result.stdout


def _admission_bench(tmp_path: Path, *options: str) -> str:
    """What ``bench/admission.py`` prints with ``options``, briefly (one round of 0.02 s), once it
    exited without error."""
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "admission.py"),
            "--rounds",
            "1",
            "--seconds",
            "0.02",
            *options,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_the_admission_benchmark_reports_every_part_on_sqlite(tmp_path: Path) -> None:
    out = _admission_bench(
        tmp_path, "--backend", "sqlite", "--big-receipts", "300", "--keys", "4", "--skip", "http"
    )
    assert "sqlite loaded database checked: 3 loaded keys retried" in out
    for goal in ("fresh (command", "retained (signal", "fresh at the loaded size", "bytes per receipt"):
        assert f"# goal: sqlite {goal}" in out, out
    # Bytes by table and column: the receipt token is the contract's hex text (contract §2.5).
    rows = [line.split() for line in out.splitlines() if line.startswith("sqlite ")]
    sizes = {row[1]: float(row[-1].replace(",", "")) for row in rows if len(row) == 3}
    assert sizes["workflow_commands.request_id"] == len("signal-v1:") + 64, out
    assert sizes["workflow_commands"] > sizes["workflow_commands_request_lookup"] > 0, out
    # Pages written per call, by b-tree: each kind writes the tables it inserts into, and the
    # batch writes more pages than one admission.
    pages = {line.split()[0]: line.split()[1:] for line in out.splitlines() if line.startswith("workflow_")}
    single, many, floor = (float(v.replace(",", "")) for v in pages["workflow_commands_request_lookup"])
    assert many > single >= 1.0 and floor == 0.0, out
    assert "bench_floor_commands" in out, out


@pytest.mark.extra  # a harness check of a PostgreSQL-only part; the default run stays short
def test_the_admission_benchmarks_mixed_part_runs_every_way(pg_url: str, tmp_path: Path) -> None:
    # Each stream checks every answer: a retry must come back retained, a new key fresh.
    out = _admission_bench(tmp_path, "--backend", "postgresql", "--pg-url", pg_url, "--only", "mixed")
    rows = [line for line in out.splitlines() if line.startswith("postgresql") and "keyed, " in line]
    for share in ("0%", "10%", "25%", "50%", "100%"):
        for way in ("read in the lock's round trip", "read first", "the service's choice"):
            assert any(f"keyed, {share} retries" in r and way in r for r in rows), out


@pytest.mark.extra  # starts a server of its own and loads it
def test_the_admission_benchmarks_growth_part_reads_the_wal_by_relation_on_postgresql(tmp_path: Path) -> None:
    # The growth part starts a server of its own (it creates databases): the loaded database is
    # read back through the service, and the WAL after a CHECKPOINT read again by relation.
    out = _admission_bench(
        tmp_path, "--backend", "postgresql", "--only", "growth", "--big-receipts", "2000",
        "--wal-admissions", "20", "--keys", "4",
    )  # fmt: skip
    assert "postgresql loaded database checked: " in out, out
    shares = [line.split() for line in out.splitlines() if line.startswith(("admission ", "floor "))]
    assert {"workflow_commands_request_lookup", "workflow_commands"} <= {row[1] for row in shares}, out
    assert "of it the receipt index alone" in out, out
