"""The write state machine table (worker contract §2): properties over random event sequences."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from admission.errors import RecordStateError
from admission.worker import (
    TERMINAL_WRITE_STATES,
    WRITE_TRANSITIONS,
    WriteState,
    after_before_write_error,
    write_diagram,
)

ROOT = Path(__file__).resolve().parents[2]
RESOLVE = {"resolve_confirm", "resolve_failed_safe", "resolve_release"}
EVENTS = WRITE_TRANSITIONS.events


def walk(events: list[str]) -> list[tuple[str, str, str]]:
    """Apply the allowed events in order from ``prepared``; the steps taken."""
    state, steps = "prepared", []
    for event in events:
        if (state, event) not in WRITE_TRANSITIONS:
            continue
        following = WRITE_TRANSITIONS.next_state(state, event)
        steps.append((state, event, following))
        state = following
    return steps


@settings(max_examples=300)
@given(st.lists(st.sampled_from(EVENTS), max_size=40))
def test_every_reachable_state_is_declared(events: list[str]) -> None:
    for _, _, state in walk(events):
        assert state in set(WriteState)


@settings(max_examples=300)
@given(st.lists(st.sampled_from(EVENTS), max_size=40))
def test_no_path_resends_an_uncertain_record_without_an_operator(events: list[str]) -> None:
    # After uncertain, the next dispatch needs an operator's release in between.
    uncertain_since_release = False
    for source, event, target in walk(events):
        if target == "uncertain":
            uncertain_since_release = True
        if event == "resolve_release":
            uncertain_since_release = False
        if event == "dispatch":
            assert not uncertain_since_release, (source, event)


@settings(max_examples=300)
@given(st.lists(st.sampled_from(EVENTS), max_size=40))
def test_only_a_before_write_error_or_a_release_leads_back_to_prepared(events: list[str]) -> None:
    for _, event, target in walk(events):
        if target == "prepared":
            assert event in {"before_write_error", "resolve_release"}


def test_uncertain_leaves_only_by_readback_or_resolve() -> None:
    leaving = {event for (state, event) in WRITE_TRANSITIONS if state == "uncertain"}
    assert leaving == {"readback_found"} | RESOLVE


def test_terminal_states_have_no_way_out_but_observed_missing() -> None:
    for (state, event), _ in WRITE_TRANSITIONS.items():
        if state in TERMINAL_WRITE_STATES:
            assert (state, event) == ("confirmed", "observed_missing")


@given(st.integers(1, 10), st.integers(1, 10))
@settings(max_examples=100)
def test_attempts_are_bounded(attempts: int, limit: int) -> None:
    event = after_before_write_error(attempts, limit)
    assert (event == "attempts_exhausted") == (attempts >= limit)
    assert WRITE_TRANSITIONS.next_state("in_flight", event) == (
        "failed_safe" if attempts >= limit else "prepared"
    )


@settings(max_examples=200)
@given(st.sampled_from(list(WriteState)), st.sampled_from([*EVENTS, "bogus"]))
def test_next_state_applies_the_table_and_refuses_every_other_pair(state: str, event: str) -> None:
    if (state, event) in WRITE_TRANSITIONS:
        assert WRITE_TRANSITIONS.next_state(state, event) == WRITE_TRANSITIONS[(state, event)]
    else:
        with pytest.raises(RecordStateError) as refused:
            WRITE_TRANSITIONS.next_state(state, event, subject="w-1")
        assert (refused.value.state, refused.value.write_id, refused.value.code) == (
            state,
            "w-1",
            "record_state",
        )


def test_docs_show_exactly_the_generated_diagram() -> None:
    text = (ROOT / "docs" / "worker.md").read_text(encoding="utf-8")
    assert f"```mermaid\n{write_diagram()}```" in text
