"""The share of retries that picks a keyed admission's path (``receipts._service._share_after``).

docs/performance.md explains the ``mixed`` benchmark's 25% row by how this
measure moves when every fourth admission is a retry; these tests hold that
explanation and the measure's range.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from admission.receipts._service import RETRY_SHARE, _share_after


@given(st.floats(0.0, 1.0), st.lists(st.booleans(), max_size=200))
def test_the_share_stays_between_none_and_all(start: float, retries: list[bool]) -> None:
    share = start
    for retry in retries:
        share = _share_after(share, retry=retry)
        assert 0.0 <= share <= 1.0


@given(st.floats(0.0, 1.0))
def test_three_retries_in_a_row_turn_to_reading_first_and_thirty_fresh_keys_back(start: float) -> None:
    share = start
    for _ in range(3):
        share = _share_after(share, retry=True)
    assert share >= RETRY_SHARE
    for _ in range(30):
        share = _share_after(share, retry=False)
    assert share < RETRY_SHARE


def test_with_every_fourth_a_retry_the_retry_and_the_key_after_it_take_the_way_that_suits_them_less() -> None:
    # The lock's round trip suits a fresh key, reading first a retry (docs/performance.md).
    share, ways = 0.0, []
    for n in range(400):
        retry = n % 4 == 3
        reads_first = share >= RETRY_SHARE
        ways.append((retry, reads_first))
        share = _share_after(share, retry=retry)
    settled = ways[200:]
    retries = [reads_first for retry, reads_first in settled if retry]
    after_a_retry = [settled[i + 1][1] for i, (retry, _) in enumerate(settled[:-1]) if retry]
    assert not any(retries)  # each retry takes the lock's round trip
    assert all(after_a_retry)  # and the fresh key after it reads first
