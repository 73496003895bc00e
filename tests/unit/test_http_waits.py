"""The wait's schedule and its slots, for every first delay, cap, duration and order of calls."""

from __future__ import annotations

import math
from itertools import accumulate, islice, pairwise

import pytest
from hypothesis import given
from hypothesis import strategies as st

from admission.http._limits import check_max_waits
from admission.http._waits import MAX_POLL_INTERVAL_SECONDS, WaitSlots, poll_delays

FIRST = st.floats(min_value=0.001, max_value=5.0)
CAP = st.floats(min_value=0.001, max_value=5.0)


@given(first=FIRST, cap=CAP)
def test_delays_start_at_the_first_double_and_stay_at_the_cap(first: float, cap: float) -> None:
    ceiling = max(first, cap)
    delays = list(islice(poll_delays(first, cap), 40))
    assert delays[0] == first
    for before, after in pairwise(delays):
        assert after == min(before * 2, ceiling)  # doubles, never past the ceiling, never shrinks
    steps = math.ceil(math.log2(ceiling / first)) + 1
    assert all(d == ceiling for d in delays[steps:])


@given(first=FIRST, cap=CAP, duration=st.floats(min_value=0.0, max_value=120.0))
def test_the_reads_of_a_wait_grow_with_its_length_over_the_cap_not_over_the_first_delay(
    first: float, cap: float, duration: float
) -> None:
    # A read follows each delay that starts before the deadline.
    ceiling = max(first, cap)
    starts = accumulate(poll_delays(first, cap), initial=0.0)
    reads = sum(1 for _ in iter(lambda: next(starts) < duration, False))
    assert reads <= math.ceil(math.log2(ceiling / first)) + 1 + duration / ceiling + 1


def test_the_default_schedule_reads_six_times_in_the_first_second_then_twice_a_second() -> None:
    assert MAX_POLL_INTERVAL_SECONDS == 0.5
    assert list(islice(poll_delays(0.02), 8)) == [0.02, 0.04, 0.08, 0.16, 0.32, 0.5, 0.5, 0.5]


@given(limit=st.integers(1, 8), calls=st.lists(st.booleans(), max_size=60))
def test_slots_are_never_held_past_their_limit(limit: int, calls: list[bool]) -> None:
    slots = WaitSlots(limit)
    held = 0
    for acquire in calls:
        if acquire:
            took = slots.try_acquire()
            assert took == (held < limit)
            held += took
        elif held:
            slots.release()
            held -= 1
        else:
            with pytest.raises(RuntimeError):
                slots.release()
        assert slots.active == held <= limit


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, None, "3"])
def test_a_bound_on_waits_is_a_positive_integer(bad: object) -> None:
    with pytest.raises(ValueError, match="max_waits"):
        check_max_waits(bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_waits"):
        WaitSlots(bad)  # type: ignore[arg-type]
