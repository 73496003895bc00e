"""The conformance kit can fail: it catches every deliberately broken target, with a shrunk counterexample.

Each mutant of ``tests/support/mutants.py`` wraps the correct in-process
target and breaks one rule of the contract; the kit, run with a fixed seed,
must report a disagreement whose shrunk sequence is short and names the field
that disagrees, while the correct target passes with the same settings.  One
broken server is driven end to end over HTTP through ``admission conformance
--http URL``: admission's own app behind an ASGI wrapper that gives every
retained answer a new command id on the wire (a retry answered as fresh over
HTTP is ``tests/integration/test_conformance_http.py``'s).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import uuid
from collections.abc import Awaitable, Callable, Iterator, MutableMapping
from contextlib import contextmanager
from typing import Any

import pytest

from admission.conformance import run_conformance
from admission.receipts import AdmissionService, MemoryStore
from tests.support.inthread import uvicorn_in_thread
from tests.support.mutants import MUTANTS, memory_target
from tests.support.processes import ROOT

SEED = 0
EXAMPLES = 100
MAX_SHRUNK_CALLS = 6
# Shrinking keeps a few receipt reads of another instance in this one's counterexample (10 calls
# at seed 0, the story itself is 4: start, admit, continue as new, retry).
LONGER = {"loses-receipts-at-continue-as-new": 12}
# Signed zeros take the longest to meet (tools/conformance_mutants.py: 41 examples the median
# over 20 seeds, 101 the most); in a test process seed 0 needs more than 150.
MORE_EXAMPLES = {"signed-zero": 300}
HTTP_RUN = ("--examples", "10", "--steps", "6", "--seed", str(SEED))
# The default set runs two mutants the kit catches fastest; the others run under ``extra``
# (each costs up to a minute, shrinking included: tools/conformance_mutants.py measures them).
DEFAULT = ("retry-as-fresh", "trims-keys")

# The fields a shrunk failure may name: what a caller of each mutant sees wrong first.
FIELDS = {
    "ignores-arguments": {"conflict", "outcome", "status", "http_status", "retained"},
    "int-float": {"conflict", "outcome", "status", "http_status", "retained"},
    "signed-zero": {"conflict", "outcome", "status", "http_status", "retained"},
    "retry-as-fresh": {"retained", "status", "http_status"},
    "conflict-consumes-key": {"answer", "retained", "command_id", "outcome", "status"},
    "loses-receipts-at-continue-as-new": {"answer", "retained", "command_id", "outcome", "status"},
    "new-id-on-retained": {"command_id"},
    "trims-keys": {"request_id", "retained", "command_id", "outcome", "status"},
    "truncates-keys": {"request_id", "retained", "command_id", "outcome", "status", "conflict"},
}
DIFFERING = re.compile(r"^  (\w[\w ]*): actual ", re.MULTILINE)
"""A line of the failure message naming a field that differs (``  command_id: actual ..., expected ...``)."""


def caught(name: str) -> None:
    """The kit fails the mutant with a short shrunk counterexample naming a field the mutant breaks."""
    examples = MORE_EXAMPLES.get(name, EXAMPLES)
    report = run_conformance(MUTANTS[name](), examples=examples, seed=SEED)
    assert not report.ok, f"{name} was not caught in {examples} examples"
    failure = report.failure
    assert failure is not None
    assert 1 <= len(failure.trace) <= LONGER.get(name, MAX_SHRUNK_CALLS), "\n".join(failure.trace)
    assert failure.sequence and failure.replay["seed"] == SEED
    named = set(DIFFERING.findall(failure.message))
    assert named & FIELDS[name], failure.message


@pytest.mark.parametrize("name", DEFAULT)
def test_the_kit_catches_a_broken_target_with_a_short_counterexample(name: str) -> None:
    caught(name)


@pytest.mark.extra
@pytest.mark.parametrize("name", sorted(set(MUTANTS) - set(DEFAULT)))
def test_the_kit_catches_every_broken_target_with_a_short_counterexample(name: str) -> None:
    caught(name)


def test_the_correct_target_passes_with_the_same_settings() -> None:
    report = run_conformance(memory_target(), examples=EXAMPLES, seed=SEED)
    assert report.ok, report.text()
    assert report.examples >= EXAMPLES and report.steps > EXAMPLES


# -- over HTTP, end to end -------------------------------------------------------------------

ASGIApp = Callable[
    [MutableMapping[str, Any], Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]],
    Awaitable[None],
]


def new_id_on_retained_answers(app: ASGIApp) -> ASGIApp:
    """``app`` behind a wrapper that breaks contract §4/§5 on the wire: a JSON answer with
    ``"retained": true`` gets a new ``command_id`` (as a server that builds the answer from a new
    record would); the body's length header follows."""

    async def broken(scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        start: dict[str, Any] = {}
        chunks: list[bytes] = []

        async def rewrite(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                start.update(message)
                return
            if message["type"] != "http.response.body":
                await send(message)
                return
            chunks.append(message.get("body", b""))
            if message.get("more_body", False):
                return
            body = b"".join(chunks)
            try:
                parsed = json.loads(body)
            except ValueError:
                parsed = None
            if isinstance(parsed, dict) and parsed.get("retained") is True and "command_id" in parsed:
                parsed["command_id"] = str(uuid.uuid4())
                body = json.dumps(parsed).encode()
            headers = [(k, v) for k, v in start.get("headers", []) if k.lower() != b"content-length"]
            headers.append((b"content-length", str(len(body)).encode()))
            await send({**start, "headers": headers})
            await send({"type": "http.response.body", "body": body, "more_body": False})

        await app(scope, receive, rewrite)

    return broken


@contextmanager
def serving(app: ASGIApp) -> Iterator[str]:
    """``app`` under uvicorn on loopback, in a thread of this process; its base URL."""
    with uvicorn_in_thread(app) as port:
        yield f"http://127.0.0.1:{port}"


def conformance_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """``python -m admission conformance ARGS``, as a user runs it."""
    return subprocess.run(
        [sys.executable, "-m", "admission", "conformance", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )


# Shrinking over HTTP costs half a minute of CPU; the default set has a broken server over HTTP
# already (tests/integration/test_conformance_http.py).
@pytest.mark.extra
def test_the_command_catches_a_server_giving_retained_answers_new_ids_and_prints_the_shrunk_calls() -> None:
    pytest.importorskip("uvicorn")
    from admission.http import create_app

    app = new_id_on_retained_answers(create_app(AdmissionService(MemoryStore())))
    with serving(app) as url:
        done = conformance_cli("--http", url, *HTTP_RUN)
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stderr == ""
    report = done.stdout
    assert "DISAGREEMENT" in report
    message = report.split("first disagreement:\n", 1)[1].split("minimal failing sequence:", 1)[0]
    assert "command_id: actual" in message
    calls = report.split("target calls of that sequence:\n", 1)[1].split("replay record", 1)[0]
    shrunk = [line for line in calls.splitlines() if line.strip()]
    assert 1 <= len(shrunk) <= MAX_SHRUNK_CALLS, calls
    assert any(" retained " in line for line in shrunk)
