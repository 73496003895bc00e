"""The default ``new_id``: RFC 9562 version-7 UUIDs, unique and ordered by their millisecond."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from hypothesis import given
from hypothesis import strategies as st

from admission.receipts._service import time_ordered_id, uuid_at

_MILLIS = st.integers(0, 2**48 - 1)
_RANDOM = st.integers(0, 2**74 - 1)


def test_ids_are_version_7_uuids_of_the_current_millisecond() -> None:
    before = int(datetime.now(UTC).timestamp() * 1000) - 1
    ids = [time_ordered_id() for _ in range(2_000)]
    after = int(datetime.now(UTC).timestamp() * 1000) + 1
    assert len(set(ids)) == len(ids)
    for text in ids:
        value = uuid.UUID(text)
        assert str(value) == text
        assert value.version == 7
        assert value.variant == uuid.RFC_4122
        assert before <= value.int >> 80 <= after


@given(_MILLIS, _RANDOM)
def test_time_and_random_bits_round_trip(millis: int, random: int) -> None:
    value = uuid.UUID(uuid_at(millis, random))
    assert (value.version, value.variant) == (7, uuid.RFC_4122)
    assert value.int >> 80 == millis
    assert (value.int >> 64 & 0xFFF) << 62 | value.int & (1 << 62) - 1 == random


@given(_MILLIS, _MILLIS, _RANDOM, _RANDOM)
def test_a_later_millisecond_sorts_after_as_text_and_as_bytes(m1: int, m2: int, r1: int, r2: int) -> None:
    if m1 != m2:
        (early, late) = sorted((m1, m2))
        first, second = uuid_at(early, r1), uuid_at(late, r2)
        assert first < second
        assert uuid.UUID(first).bytes < uuid.UUID(second).bytes
