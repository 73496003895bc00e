"""The pytest plugin of the conformance kit (entry point ``pytest11``: ``admission``).

Two ways to run the kit under pytest:

- ``pytest --admission-target=URL`` (an ``http://`` or ``https://`` URL, the
  token in ``$ADMISSION_TOKEN``) or ``--admission-target=module:attribute``
  (a :class:`~admission.conformance.Target`, or a callable without arguments
  that returns one): the plugin adds the conformance test itself, no test
  file needed.
- Override the ``admission_target`` fixture in a ``conftest.py`` and collect
  the test with one line in a test module::

      from admission.conformance import test_retry_contract  # noqa: F401

``--admission-examples`` (default 100), ``--admission-steps`` (default 30)
and ``--admission-seed`` (default: a random seed, shown in the report) size
and fix the run.  A disagreement fails
the test with the report: the shrunk sequence and its replay record.

Loading the plugin imports nothing heavy (pytest is loaded already):
hypothesis and httpx are imported when a conformance test runs.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Final

import pytest

if TYPE_CHECKING:
    from admission.conformance._target import Target

__all__ = [
    "admission_target",
    "pytest_addoption",
    "pytest_collection_modifyitems",
    "target_from",
    "test_retry_contract",
]

ENV_TOKEN: Final = "ADMISSION_TOKEN"
"""The bearer token an ``--admission-target`` URL is called with."""
_ITEM_NAME: Final = "admission-conformance"
_HELP_TARGET: Final = "give --admission-target=URL|module:attribute, or override the admission_target fixture"


def pytest_addoption(parser: pytest.Parser) -> None:
    """The plugin's options."""
    group = parser.getgroup("admission", "admission conformance kit (docs/conformance.md)")
    group.addoption(
        "--admission-target",
        metavar="URL|MODULE:ATTR",
        help="run the conformance test against this target: an http(s) URL (token in "
        f"${ENV_TOKEN}) or module:attribute naming a Target or a factory of one",
    )
    group.addoption("--admission-examples", type=int, default=100, help="cases to run (default 100)")
    group.addoption("--admission-seed", type=int, default=None, help="derandomise the run (default: random)")
    group.addoption(
        "--admission-steps", type=int, default=None, help="steps per case (default: the kit's, 30)"
    )


def _factory(spec: str) -> Callable[[], Target]:
    # What the option names, checked without building a target: a bad option is a usage error
    # at collection, not a failed test.
    if spec.startswith(("http://", "https://")):

        def http() -> Target:
            from admission.conformance._http_target import HttpTarget

            return HttpTarget(spec, token=os.environ.get(ENV_TOKEN) or None)

        return http
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise pytest.UsageError(
            f"--admission-target: {spec!r} is neither an http(s) URL nor module:attribute"
        )
    try:
        found: object = importlib.import_module(module_name)
        for part in attribute.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError) as exc:
        raise pytest.UsageError(f"--admission-target: cannot find {spec}: {exc}") from None
    if hasattr(found, "admit") and hasattr(found, "capabilities") and not isinstance(found, type):
        target = found
        return lambda: target  # type: ignore[return-value]
    if callable(found):
        return found
    raise pytest.UsageError(f"--admission-target: {spec} names neither a Target nor a factory of one")


def target_from(spec: str) -> Target:
    """The target ``spec`` names: an http(s) URL, or ``module:attribute`` (a Target or a factory of one)."""
    target = _factory(spec)()
    if not (hasattr(target, "admit") and hasattr(target, "capabilities")):
        raise TypeError(f"--admission-target: {spec} made {type(target).__name__}, not a conformance Target")
    return target


def _closed(target: object) -> None:
    close = getattr(target, "close", None)
    if callable(close):
        close()


@pytest.fixture
def admission_target(request: pytest.FixtureRequest) -> Iterator[Target]:
    """The target the conformance test drives: the one ``--admission-target`` names.

    Override it in a ``conftest.py`` to give your own (admission's
    ``ServiceTarget``, an :class:`~admission.conformance.HttpTarget` with hooks, ...).
    """
    spec = request.config.getoption("admission_target")
    if not spec:
        pytest.skip(f"no conformance target: {_HELP_TARGET}")
    target = target_from(spec)
    try:
        yield target
    finally:
        _closed(target)


def _run(target: Target, config: pytest.Config) -> None:
    from admission.conformance._machine import Options
    from admission.conformance._runner import run_conformance

    steps = config.getoption("admission_steps")
    report = run_conformance(
        target,
        examples=config.getoption("admission_examples"),
        seed=config.getoption("admission_seed"),
        options=Options() if steps is None else Options(steps=steps),
    )
    if not report.ok:
        pytest.fail(report.text(), pytrace=False)
    # Shown with -s or -rP: the seed and what ran.
    print(report.text(), end="")


def test_retry_contract(admission_target: Target, request: pytest.FixtureRequest) -> None:
    """The conformance test: the kit's machine over ``admission_target`` agrees with the contract's model.

    Collect it in a test module with ``from admission.conformance import test_retry_contract``.
    """
    _run(admission_target, request.config)


class ConformanceItem(pytest.Item):
    """The conformance test ``--admission-target`` adds: the target it names, driven by the kit."""

    def runtest(self) -> None:
        """Run the kit against the option's target."""
        target = target_from(self.config.getoption("admission_target"))
        try:
            _run(target, self.config)
        finally:
            _closed(target)

    def reportinfo(self) -> tuple[str, int, str]:
        """Where the test is: nowhere in the user's files; named by its target."""
        return _ITEM_NAME, 0, f"conformance of {self.config.getoption('admission_target')}"


def pytest_collection_modifyitems(
    session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
) -> None:
    """With ``--admission-target``, add the conformance test: no test file needed."""
    spec = config.getoption("admission_target")
    if spec:
        _factory(spec)
        items.append(ConformanceItem.from_parent(session, name=_ITEM_NAME))
