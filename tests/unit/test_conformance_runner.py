"""The conformance runner: its report, its seed, its replay record, and how it stops on a broken target.

The targets are admission's own service on a memory store, honest or wrapped
so that it answers every retained admission as fresh (a server that forgets
its receipts), or so that it stops answering (a server gone away).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path

import pytest

from admission.conformance import (
    Answer,
    ConformanceTargetError,
    Failure,
    HttpTarget,
    LifecycleHooks,
    Options,
    Report,
    ServiceTarget,
    load_replay,
    run_conformance,
)
from admission.conformance._http_target import arguments_envelope
from admission.errors import InvalidValueError

SMALL = Options(steps=10)


class Wrapped:
    """A target that forwards every call to admission's memory service, except what a subclass breaks."""

    def __init__(self) -> None:
        self.inner = ServiceTarget.memory()
        self.calls = 0

    @property
    def now(self) -> datetime:
        return self.inner.now

    @now.setter
    def now(self, value: datetime) -> None:
        self.inner.now = value

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)


class FreshRetries(Wrapped):
    """Answers a retained admission as fresh: the retry looks like a second command."""

    def admit(self, *args: object, **kwargs: object) -> Answer:
        answer: Answer = self.inner.admit(*args, **kwargs)  # type: ignore[arg-type]
        if answer.body.get("retained") is True:
            return Answer(answer.status, {**answer.body, "retained": False})
        return answer


class Recording(Wrapped):
    """Records every admission as it was asked: what a seed made, to the argument."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: list[str] = []

    def admit(self, namespace: str, workflow_id: str, *args: object, **kwargs: object) -> Answer:
        # Workflow ids start with a prefix each run draws anew, and run ids are the service's.
        run = kwargs.get("run_id")
        asked = (namespace, workflow_id.partition("-")[2], args, kwargs.get("request_id"), run is None)
        self.asked.append(repr(asked))
        answer: Answer = self.inner.admit(namespace, workflow_id, *args, **kwargs)  # type: ignore[arg-type]
        return answer


class GoesAway(Wrapped):
    """Answers a few admissions, then every call fails as a server that went away would."""

    def admit(self, *args: object, **kwargs: object) -> Answer:
        self.calls += 1
        if self.calls > 5:
            raise ConformanceTargetError("the server answered 503 (storage_unavailable)", status=503)
        answer: Answer = self.inner.admit(*args, **kwargs)  # type: ignore[arg-type]
        return answer


def test_admission_on_memory_agrees_and_the_report_names_what_ran() -> None:
    report = run_conformance(ServiceTarget.memory(), examples=8, seed=1, options=SMALL)
    assert report.ok and report.failure is None and report.seed == 1
    assert report.examples >= 8 and report.steps > 0
    assert report.rules and all(count > 0 for count in report.rules.values())
    text = report.text()
    assert "every answer agreed with the model" in text and "seed 1" in text
    for rule in report.rules:
        assert rule in text
    assert json.loads(json.dumps(report.to_dict()))["ok"] is True


def test_the_seed_derandomises_the_run() -> None:
    first = run_conformance(ServiceTarget.memory(), examples=5, seed=42, options=SMALL)
    second = run_conformance(ServiceTarget.memory(), examples=5, seed=42, options=SMALL)
    assert (first.rules, first.labels, first.steps) == (second.rules, second.labels, second.steps)


def test_the_seed_derandomises_the_run_whatever_the_process_imported_before(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Hypothesis also draws, now and then, constants it found in the local modules loaded in
    # the process, so what a process imported before would change what a seed asks.  Here the
    # second run is in a process that holds many more of them (as one that ran other tests).
    from hypothesis.internal.conjecture import providers
    from hypothesis.internal.constants_ast import Constants

    first, second = Recording(), Recording()
    run_conformance(first, examples=60, seed=7)  # type: ignore[arg-type]
    more = Constants(
        integers={n * 101 for n in range(-300, 300) if abs(n * 101) >= 100},
        floats={n / 7 + 0.5 for n in range(300)},
        strings={f"{c}{n}" for c in "abkxy" for n in range(60)} | {"signal", "update", "approve", "ns"},
    )
    monkeypatch.setattr(providers, "_get_local_constants", lambda: more)
    providers.CONSTANTS_CACHE.cache.clear()
    try:
        run_conformance(second, examples=60, seed=7)  # type: ignore[arg-type]
    finally:
        providers.CONSTANTS_CACHE.cache.clear()
    assert first.asked and first.asked == second.asked


@pytest.fixture(scope="module")
def caught() -> Report:
    """One run against the broken target (shrinking is most of its time: shared by the tests below)."""
    return run_conformance(FreshRetries(), examples=100, seed=5, options=SMALL)  # type: ignore[arg-type]


def first_line(failure: Failure | None) -> str:
    assert failure is not None
    return failure.message.splitlines()[0]


def test_a_server_that_answers_retries_as_fresh_is_caught_with_a_shrunk_sequence(caught: Report) -> None:
    assert not caught.ok
    failure = caught.failure
    assert failure is not None
    assert failure.sequence and failure.sequence[0].startswith("state = ")
    assert failure.trace, "the machine's trace of the minimal case"
    assert failure.replay["seed"] == 5 and failure.replay["blob"]
    text = caught.text()
    assert "DISAGREEMENT" in text and "minimal failing sequence:" in text
    assert first_line(failure) in text
    for line in failure.trace:
        assert line in text


def test_the_replay_record_brings_the_same_failure_back_and_an_honest_target_passes_it(
    caught: Report, tmp_path: Path
) -> None:
    assert caught.failure is not None
    record = tmp_path / "replay.json"
    record.write_text(json.dumps(dict(caught.failure.replay)), encoding="utf-8")
    whole = tmp_path / "report.json"
    whole.write_text(json.dumps(caught.to_dict()), encoding="utf-8")
    for source in (record, whole, caught.failure.replay):
        again = run_conformance(FreshRetries(), replay=source)  # type: ignore[arg-type]
        assert again.replayed is True and again.failure is not None
        assert first_line(again.failure) == first_line(caught.failure)
        assert again.examples == 1  # exactly the recorded case, no search
        assert len(again.failure.trace) == len(caught.failure.trace)
        assert again.failure.replay["blob"] == caught.failure.replay["blob"]
    honest = run_conformance(ServiceTarget.memory(), replay=record)
    assert honest.ok and honest.replayed is False


def test_a_record_from_another_hypothesis_falls_back_to_the_seeded_search(caught: Report) -> None:
    assert caught.failure is not None
    old = {**caught.failure.replay, "hypothesis": "0.0.1"}
    again = run_conformance(FreshRetries(), replay=old)  # type: ignore[arg-type]
    assert first_line(again.failure) == first_line(caught.failure)
    assert any("seeded search runs again" in note for note in again.notes)


@pytest.mark.parametrize(
    "record",
    [{}, {"format": "other"}, {"format": "admission-conformance-replay/1", "seed": "1", "examples": 1}],
)
def test_a_replay_that_is_no_replay_record_is_refused(record: Mapping[str, object]) -> None:
    with pytest.raises(InvalidValueError) as refused:
        load_replay(record)
    assert refused.value.field == "replay"


def test_a_target_outside_the_contract_stops_the_run_at_once() -> None:
    target = GoesAway()
    with pytest.raises(ConformanceTargetError, match="503"):
        run_conformance(target, examples=50, seed=1, options=SMALL)  # type: ignore[arg-type]
    assert target.calls == 6  # the failing call was the last: nothing shrunk, nothing retried


def test_arguments_travel_as_json_when_json_keeps_them_and_as_cbor_otherwise() -> None:
    assert arguments_envelope([1, 1.0, -0.0, float("nan"), float("inf"), "ü", {"k": None}])["codec"] == "json"
    assert arguments_envelope((1, 2)) == {"codec": "json", "blob": "[1,2]"}
    assert arguments_envelope([b"\x00"])["codec"] == "cbor"
    with pytest.raises(InvalidValueError):  # a lone surrogate: refused here, as the service refuses it
        arguments_envelope(["\ud800"])
    assert arguments_envelope({"deep": [[[[[]]]]]})["codec"] == "json"


def test_lifecycle_hooks_give_the_capabilities_their_steps_allow() -> None:
    def run(namespace: str, workflow_id: str, *rest: object) -> Mapping[str, object]:
        raise AssertionError("not called")

    without_progress = HttpTarget("http://127.0.0.1:9", lifecycle=LifecycleHooks(run, run, run))
    assert without_progress.capabilities == {"lifecycle"}
    answer = Answer(202, {})
    full = LifecycleHooks(run, run, run, lambda *a: answer, lambda *a: answer, lambda *a: answer)
    assert HttpTarget("http://127.0.0.1:9", lifecycle=full).capabilities == {"lifecycle", "progress"}
    assert HttpTarget("http://127.0.0.1:9", lifecycle="none").capabilities == frozenset()
    with pytest.raises(InvalidValueError) as refused:
        HttpTarget("ftp://127.0.0.1:9", lifecycle="none")
    assert refused.value.field == "url"
    token = "adm_secret value"
    with pytest.raises(InvalidValueError) as bad_token:
        HttpTarget("http://127.0.0.1:9", token=token, lifecycle="none")
    assert token not in str(bad_token.value)
