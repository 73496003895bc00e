"""The backoff policy of retried jobs, pure (docs/jobs.md, "Backoff"): its bounds and its growth."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from admission.jobs import DEFAULT_BACKOFF, MAX_BACKOFF_SECONDS, NO_BACKOFF, Backoff

policies = st.builds(
    lambda base, factor, extra, jitter: Backoff(base=base, factor=factor, cap=base + extra, jitter=jitter),
    base=st.floats(0, 3600),
    factor=st.floats(1, 1000),
    extra=st.floats(0, 3600),
    jitter=st.floats(0, 1),
)
attempts = st.integers(1, 100)
draws = st.floats(0, 1, exclude_max=True)


@given(policies, attempts, draws)
def test_a_delay_lies_between_the_unjittered_share_of_its_ceiling_and_the_ceiling_within_the_cap(
    policy: Backoff, attempt: int, draw: float
) -> None:
    assert policy.check() is policy
    ceiling = policy.ceiling(attempt)
    assert ceiling <= policy.cap
    assert ceiling * (1 - policy.jitter) <= policy.delay(attempt, draw) <= ceiling
    assert policy.delay(attempt, 0.0) == ceiling


@given(policies, attempts)
def test_without_jitter_the_delay_never_decreases_and_grows_by_the_factor_until_the_cap(
    policy: Backoff, attempt: int
) -> None:
    steady = Backoff(base=policy.base, factor=policy.factor, cap=policy.cap, jitter=0.0)
    first, second = steady.delay(attempt, 0.5), steady.delay(attempt + 1, 0.5)
    assert first <= second
    if second < steady.cap:
        assert second == pytest.approx(first * steady.factor)
    assert steady.delay(1, 0.9) == steady.base


def test_the_defaults_and_no_backoff() -> None:
    assert (DEFAULT_BACKOFF.base, DEFAULT_BACKOFF.factor, DEFAULT_BACKOFF.cap) == (1.0, 2.0, 300.0)
    assert DEFAULT_BACKOFF.jitter == 0.5 and DEFAULT_BACKOFF.ceiling(20) == 300.0
    assert [NO_BACKOFF.delay(n, 0.5) for n in (1, 2, 50)] == [0.0, 0.0, 0.0]
    assert Backoff(cap=MAX_BACKOFF_SECONDS, factor=1000.0).ceiling(100) == MAX_BACKOFF_SECONDS


def test_a_stored_policy_reads_back_as_itself_and_bad_input_to_the_formula_is_refused() -> None:
    policy = Backoff(base=2, factor=3, cap=50, jitter=0.25)
    assert Backoff.from_value(policy.to_value()) == policy
    with pytest.raises(ValueError):
        Backoff.from_value({"base": 1.0})
    with pytest.raises(ValueError):
        policy.delay(0, 0.5)
    with pytest.raises(ValueError):
        policy.delay(1, 1.0)
