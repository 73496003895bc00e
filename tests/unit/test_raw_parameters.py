"""Parameters for many rows (``RawStatement.parameter_sets``) are each row's own parameters,
whatever values the rows share: a value processed once for several rows is processed right."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import bindparam, insert, literal_column, select
from sqlalchemy.dialects import postgresql, sqlite

from admission.sql import workflow_history_events
from admission.sql._raw import RawStatement

KEYS = (
    "namespace",
    "instance_id",
    "run_id",
    "event_type",
    "command_id",
    "update_id",
    "payload",
    "recorded_at",
)
BASE = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)
# A few time objects, reused across rows, and equal times made anew: a shared object and an
# equal one must give the same parameter, and a different one its own.
SHARED = [BASE, BASE + timedelta(microseconds=1), BASE.astimezone(UTC)]
times = st.one_of(st.sampled_from(SHARED), st.integers(0, 3).map(lambda s: BASE + timedelta(seconds=s)))
rows = st.lists(
    st.fixed_dictionaries(
        {
            "namespace": st.sampled_from(["ns", "other"]),
            "instance_id": st.text(min_size=1, max_size=4),
            "run_id": st.none() | st.just("run"),
            "event_type": st.just("SignalReceived"),
            "command_id": st.none() | st.just("c"),
            "update_id": st.none(),
            "payload": st.binary(max_size=4),
            "recorded_at": times,
        }
    ),
    max_size=8,
)


@given(rows, st.sampled_from([sqlite.dialect(), postgresql.psycopg.dialect()]))
def test_each_rows_parameters_are_its_own(given_rows: list[dict[str, object]], dialect: object) -> None:
    statement = RawStatement(insert(workflow_history_events), dialect, KEYS)  # type: ignore[arg-type]
    expected = [statement.parameters(row) for row in given_rows]
    got = statement.parameter_sets(given_rows, {})
    assert [list(v.values()) if isinstance(v, dict) else list(v) for v in got] == [
        list(v.values()) if isinstance(v, dict) else list(v) for v in expected
    ]


def test_binary_parameters_take_psycopgs_binary_placeholder_and_only_where_it_exists() -> None:
    # A literal "%%(" (an escaped percent sign) is no placeholder and is left as it is.
    statement = select(bindparam("a"), literal_column("'%(b)s'"))
    sql = RawStatement(statement, postgresql.psycopg.dialect(), binary=True).sql
    assert "%(a)b" in sql and "%(a)s" not in sql and "%%(b)s" in sql
    with pytest.raises(ValueError, match="binary"):
        RawStatement(statement, sqlite.dialect(), binary=True)
