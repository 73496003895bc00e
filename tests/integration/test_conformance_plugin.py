"""The conformance kit's pytest plugin, run as a user runs it: pytest in its own process.

Both ways are shown passing and failing: ``--admission-target=module:attribute``
with no test file at all, and a ``conftest.py`` that overrides the
``admission_target`` fixture with a module that imports ``test_retry_contract``.
The plugin is named with ``-p`` and entry-point autoloading is off, so the runs
do not depend on how the package was installed; the entry point itself is read
from ``pyproject.toml``.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib

import pytest

from tests.support.processes import ROOT

pytest_plugins = ["pytester"]

TARGETS = '''
from admission.conformance import Answer, ServiceTarget


NOT_A_TARGET = 42


def honest():
    return ServiceTarget.memory()


class FreshRetries:
    """Admission on memory, but a retained answer comes back as fresh."""

    def __init__(self):
        object.__setattr__(self, "inner", ServiceTarget.memory())

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def __setattr__(self, name, value):
        setattr(self.inner, name, value)

    def admit(self, *args, **kwargs):
        answer = self.inner.admit(*args, **kwargs)
        if answer.body.get("retained") is True:
            return Answer(answer.status, {**answer.body, "retained": False})
        return answer
'''

SMALL = ("--admission-examples=12", "--admission-steps=10", "--admission-seed=4")


@pytest.fixture
def user_project(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    monkeypatch.setenv("PYTHONPATH", f"{ROOT}")
    pytester.makepyfile(user_targets=TARGETS)
    return pytester


def run(project: pytest.Pytester, *args: str) -> pytest.RunResult:
    return project.runpytest_subprocess(
        "-p", "admission.conformance._plugin", "-p", "no:cacheprovider", *args
    )


@pytest.mark.parametrize(("factory", "passes"), [("honest", True), ("FreshRetries", False)])
def test_the_option_adds_the_conformance_test(
    user_project: pytest.Pytester, factory: str, passes: bool
) -> None:
    result = run(user_project, f"--admission-target=user_targets:{factory}", *SMALL)
    if passes:
        result.assert_outcomes(passed=1)
    else:
        result.assert_outcomes(failed=1)
        result.stdout.fnmatch_lines(["*DISAGREEMENT*", "*minimal failing sequence:*", "*--replay FILE*"])


@pytest.mark.parametrize(("factory", "passes"), [("honest", True), ("FreshRetries", False)])
def test_an_overridden_fixture_and_one_import_run_the_conformance_test(
    user_project: pytest.Pytester, factory: str, passes: bool
) -> None:
    user_project.makeconftest(
        f"""
import pytest

import user_targets


@pytest.fixture
def admission_target():
    return user_targets.{factory}()
"""
    )
    user_project.makepyfile(
        test_engine="from admission.conformance import test_retry_contract  # noqa: F401\n"
    )
    result = run(user_project, *SMALL)
    if passes:
        result.assert_outcomes(passed=1)
    else:
        result.assert_outcomes(failed=1)
        result.stdout.fnmatch_lines(
            ["*test_retry_contract*", "*DISAGREEMENT*", "*minimal failing sequence:*"]
        )


def test_without_a_target_the_imported_test_is_skipped_saying_how_to_give_one(
    user_project: pytest.Pytester,
) -> None:
    user_project.makepyfile(
        test_engine="from admission.conformance import test_retry_contract  # noqa: F401\n"
    )
    result = run(user_project, "-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*--admission-target*admission_target fixture*"])


def test_a_target_option_that_names_no_target_is_a_usage_error(user_project: pytest.Pytester) -> None:
    result = run(user_project, "--admission-target=user_targets:NOT_A_TARGET")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--admission-target*neither a Target nor a factory*"])
    missing = run(user_project, "--admission-target=user_targets:nothing_here")
    assert missing.ret == pytest.ExitCode.USAGE_ERROR
    missing.stderr.fnmatch_lines(["*--admission-target: cannot find user_targets:nothing_here*"])


def test_the_plugin_is_an_entry_point_and_loads_without_hypothesis_or_httpx() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert project["project"]["entry-points"]["pytest11"] == {"admission": "admission.conformance._plugin"}
    loaded = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, admission.conformance._plugin; "
            "print(sorted(m for m in ('hypothesis', 'httpx') if m in sys.modules))",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=True,
    )
    assert loaded.stdout.strip() == "[]"
