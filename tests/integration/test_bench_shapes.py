"""The storage shapes of ``bench/shapes.py``: each holds the same receipts, read back exactly.

docs/performance.md reasons from the bytes each shape takes (issue #18's
<= 800 bytes per receipt). A shape counts only if every stored value comes
back from it; these tests run the measurement small on each backend and show
that the read-back refuses a shape that loses something. Sizes here are
not asserted beyond their order: the benchmark reports them.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from bench import shapes


def test_every_shape_reads_back_the_receipts_in_fewer_bytes(db_url: str) -> None:
    results, count, own = shapes.measure(db_url, 1600)  # 16 instances: a batch spans them all
    assert count == 1600
    assert [m.shape.name for m in results] == [s.name for s in shapes.shapes()]
    stored = results[0]
    # The control: the head's columns copied in the order written take what the receipt
    # tables take (the copy's pages are as full as the service's).
    assert 0.8 * own < stored.total < 1.2 * own, (stored.total, own)
    for measured in results:
        assert 0 < measured.total <= stored.total * 1.02, measured
    # Instance numbers, and the token's bytes, each save bytes.
    by_name = {m.shape.name: m for m in results}
    assert by_name["instance"].total < stored.total
    assert by_name["token"].commands < by_name["context"].commands
    assert by_name["token"].shape.allowed.startswith("no")
    # SQLite: the pages a transaction writes to the log, counted from its frames. Narrower index
    # entries split leaves less often, so a batch of 32 writes fewer pages.
    if db_url.startswith("sqlite"):
        single, batch = by_name["stored"].pages or (0.0, 0.0)
        assert 1 <= single < batch, (single, batch)
        assert (by_name["context"].pages or (0.0, batch))[1] < batch
    else:
        assert all(m.pages is None for m in results)


def test_a_shape_that_loses_a_value_is_refused(db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Times kept to the millisecond only: the read-back must notice the lost microseconds.
    keep = shapes.Codec._time

    def coarse(self: shapes.Codec, value: dt.datetime) -> Any:
        encoded = keep(self, value)
        return encoded // 1000 * 1000 if isinstance(encoded, int) else encoded

    monkeypatch.setattr(shapes.Codec, "_time", coarse)
    with pytest.raises(AssertionError, match=r"created_at .* is not read back"):
        shapes.measure(db_url, 60)


def test_an_event_without_the_literal_key_is_refused(db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # The row loses its key when the key is released: the event must keep it.
    keep = shapes.Codec.encode_event

    def forgetful(self: shapes.Codec, row: Any, command: Any) -> dict[str, Any]:
        out = keep(self, row, command)
        if command is not None and row["event_type"] in shapes.ADMISSION_EVENTS:
            out["payload"] = shapes.canonical_encode({})
        return out

    monkeypatch.setattr(shapes.Codec, "encode_event", forgetful)
    with pytest.raises(AssertionError, match=r"payload at .* is not read back"):
        shapes.measure(db_url, 60)
