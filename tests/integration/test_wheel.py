"""The wheel, installed as a user installs it: into a fresh virtual environment, not editable.

The wheel is built from a copy of the sources (so the build's own ``build/``
and ``*.egg-info`` stay out of the checkout, and nothing stale in them reaches
the wheel), without build isolation and without an index: the test extra
brings the setuptools the build needs, and nothing is downloaded.  The fresh
environment gets admission from the wheel alone; its run-time dependencies
come from the environment running the tests (see ``fresh_venv``).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from email.parser import Parser
from importlib.metadata import version
from pathlib import Path

import pytest

from admission.intent._vectors import VECTOR_CATEGORIES

ROOT = Path(__file__).resolve().parents[2]
VECTORS = ROOT / "admission" / "intent" / "vectors"
MIGRATIONS = ROOT / "admission" / "sql" / "migrations"

SOURCES = ("admission", "pyproject.toml", "setup.py", "README.md", "LICENSE")
"""What the build reads: the package, its declarations, the long description and the licence."""

APACHE_2_SHA256 = "cfc7749b96f63bd31c3c42b5c471bf756814053e847c10f3eb003417bc523d30"
"""SHA-256 of the Apache License 2.0 as the Apache Software Foundation publishes it (LICENSE-2.0.txt)."""

MIN_SETUPTOOLS = (77,)
"""The first setuptools that reads ``license-files`` and an SPDX ``license`` (pyproject's build-system)."""


def run(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    # The test run's PYTHONPATH would put the checkout back in front of the wheel.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    return subprocess.run(
        [str(a) for a in args], capture_output=True, text=True, cwd=cwd, env=env, timeout=300, check=False
    )


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """admission's wheel, built once for this module from a copy of the sources."""
    found = tuple(int(part) for part in version("setuptools").split(".")[:1])
    assert found >= MIN_SETUPTOOLS, f"setuptools {version('setuptools')} is too old: pip install -e '.[test]'"
    work = tmp_path_factory.mktemp("wheel")
    source = work / "source"
    source.mkdir()
    skip = shutil.ignore_patterns("__pycache__", "*.so", "*.pyd", "*.egg-info")
    for name in SOURCES:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, source / name, ignore=skip)
        else:
            shutil.copy2(path, source / name)
    dist = work / "dist"
    built = run(
        sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
        "--disable-pip-version-check", "-q", "-w", dist, source,
    )  # fmt: skip
    assert built.returncode == 0, built.stdout + built.stderr
    (found_wheel,) = dist.glob("admission-*.whl")
    return found_wheel


@pytest.fixture(scope="module")
def fresh_venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A new virtual environment with the wheel installed in it, not editable; its ``bin`` folder.

    The dependencies (SQLAlchemy, alembic) are those of the environment running
    the tests, reached through a ``.pth`` line that names its site-packages:
    no download, and the checkout's editable install stays out, because the
    ``.pth`` files in a folder named that way are not run.
    """
    venv = tmp_path_factory.mktemp("venv") / "fresh"
    created = run(sys.executable, "-m", "venv", "--without-pip", venv)
    assert created.returncode == 0, created.stderr
    scripts = venv / ("Scripts" if os.name == "nt" else "bin")
    python = scripts / ("python.exe" if os.name == "nt" else "python")
    installed = run(
        sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index",
        "--disable-pip-version-check", "-q", wheel,
    )  # fmt: skip
    assert installed.returncode == 0, installed.stdout + installed.stderr
    site = run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").stdout.strip()
    outer = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
    (Path(site) / "admission-test-dependencies.pth").write_text("\n".join(outer) + "\n", "utf-8")
    return scripts


def names(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as archive:
        return set(archive.namelist())


def test_the_wheel_carries_the_vectors_the_licence_the_type_marker_and_the_migrations(wheel: Path) -> None:
    inside = names(wheel)
    vectors = {f"admission/intent/vectors/{c}.json" for c in VECTOR_CATEGORIES}
    vectors |= {"admission/intent/vectors/MANIFEST", "admission/intent/vectors/README.md"}
    assert vectors <= inside, sorted(vectors - inside)
    assert {p for p in inside if p.startswith("admission/intent/vectors/")} == vectors
    assert "admission/py.typed" in inside
    versions = sorted((MIGRATIONS / "versions").glob("*.py"))
    migrations = {f"admission/sql/migrations/versions/{p.name}" for p in versions}
    assert len(migrations) >= 4
    assert migrations <= inside, sorted(migrations - inside)
    assert "admission/sql/migrations/script.py.mako" in inside
    assert "admission/sql/migrations/env.py" in inside
    (licence,) = [p for p in inside if p.endswith(".dist-info/licenses/LICENSE")]
    with zipfile.ZipFile(wheel) as archive:
        assert archive.read(licence) == (ROOT / "LICENSE").read_bytes()
        for name in sorted(vectors):
            assert archive.read(name) == (VECTORS / name.rsplit("/", 1)[1]).read_bytes(), name


def test_the_wheel_metadata_declares_apache_2_and_names_the_licence_file(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        (metadata_name,) = [p for p in archive.namelist() if p.endswith(".dist-info/METADATA")]
        metadata = Parser().parsestr(archive.read(metadata_name).decode("utf-8"))
    assert metadata["License-Expression"] == "Apache-2.0"
    assert metadata.get_all("License-File") == ["LICENSE"]
    # cbor2 is a test and bench tool, not something the package imports.
    required = metadata.get_all("Requires-Dist") or []
    assert not [r for r in required if r.startswith("cbor2") and "extra ==" not in r], required


def test_the_licence_is_the_unmodified_apache_2_text() -> None:
    assert hashlib.sha256((ROOT / "LICENSE").read_bytes()).hexdigest() == APACHE_2_SHA256


def test_vectors_verify_with_no_folder_passes_from_an_unrelated_directory_after_a_plain_install(
    fresh_venv: Path, tmp_path: Path
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    python = fresh_venv / ("python.exe" if os.name == "nt" else "python")
    located = run(python, "-c", "import admission; print(admission.__file__)", cwd=elsewhere)
    assert located.returncode == 0, located.stderr
    venv = fresh_venv.parent
    assert Path(located.stdout.strip()).is_relative_to(venv), located.stdout
    result = run(fresh_venv / "admission", "vectors", "verify", cwd=elsewhere)
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["ok"] is True
    assert Path(report["directory"]).is_relative_to(venv), report["directory"]
    assert list(report["counts"]) == list(VECTOR_CATEGORIES)
    assert report["total"] >= 150


def test_the_installed_migrations_create_a_database(fresh_venv: Path, tmp_path: Path) -> None:
    database = tmp_path / "fresh.sqlite3"
    result = run(fresh_venv / "admission", "--db", f"sqlite:///{database}", "db", "upgrade", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert database.is_file()
