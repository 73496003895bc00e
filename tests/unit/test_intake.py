"""The pure intake rules (worker contract §1) as properties: scope, fields, bounds."""

from __future__ import annotations

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from admission import _bounds as bounds
from admission.errors import InvalidRecordError, ScopeMismatchError
from admission.worker._intake import RESERVED_FIELDS, Scope, bounded_text, validate_record

NAMES = st.builds(
    lambda head, tail: head + tail,
    st.sampled_from("abcdefghijklmnopqrstuvwxyz"),
    st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789_", max_size=10),
).filter(lambda n: n not in RESERVED_FIELDS)
# Scope values every backend stores: no NUL, no lone surrogate.
VALUES = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), min_size=1, max_size=20
)
SCOPES = st.dictionaries(NAMES, VALUES, min_size=0, max_size=5).flatmap(
    lambda extra: st.builds(lambda tenant: {"tenant": tenant, **extra}, VALUES)
)


@settings(max_examples=150)
@given(SCOPES, st.data())
def test_a_record_differing_in_any_scope_field_is_refused_naming_it(
    scope: dict[str, str], data: st.DataObject
) -> None:
    parsed = Scope.parse(scope)
    record = {**scope, "source_key": "k"}
    source_key, content = validate_record(parsed, record, queue="q")
    assert source_key == "k" and content
    name = data.draw(st.sampled_from(sorted(scope)))
    other = data.draw(VALUES.filter(lambda v: v != scope[name]))
    with pytest.raises(ScopeMismatchError) as refused:
        validate_record(parsed, {**record, name: other}, queue="q")
    assert refused.value.field == name
    with pytest.raises(InvalidRecordError) as missing:
        validate_record(parsed, {k: v for k, v in record.items() if k != name}, queue="q")
    assert missing.value.field == name


@settings(max_examples=150)
@given(SCOPES, NAMES)
def test_a_field_outside_the_allowlist_is_refused_naming_it(scope: dict[str, str], extra: str) -> None:
    assume(extra not in scope)
    with pytest.raises(InvalidRecordError) as refused:
        validate_record(Scope.parse(scope), {**scope, "source_key": "k", extra: 1}, queue="q")
    assert refused.value.field == extra


@settings(max_examples=150)
@given(st.text(max_size=3000), st.integers(20, 2048))
def test_bounded_text_never_exceeds_its_bound_and_marks_a_cut(text: str, limit: int) -> None:
    bounded = bounded_text(text, limit)
    assert len(bounded.encode("utf-8")) <= limit
    assert "\x00" not in bounded  # NUL and lone surrogates are mended, so every backend stores it
    storable = bounds.storable_text(text)
    if bounded != storable:
        assert bounded.endswith("...[truncated]")
    else:
        assert len(storable.encode("utf-8")) <= limit


@settings(max_examples=300)
@given(st.text(st.characters(blacklist_categories=()), max_size=300), st.sampled_from(["tenant", "form"]))
def test_a_scope_value_is_accepted_exactly_when_every_backend_can_store_it(value: str, name: str) -> None:
    scope = {"tenant": "t1", **{name: value}}
    fault = bounds.text_fault(value, bounds.NAME)
    if fault is None:
        assert Scope.parse(scope).as_dict()[name] == value
    else:
        with pytest.raises(InvalidRecordError) as refused:
            Scope.parse(scope)
        assert refused.value.field == f"scope.{name}" and fault in str(refused.value)


@pytest.mark.parametrize("key", ["k\x00", "k\ud800", "k" * 256, ""])
def test_a_source_key_no_backend_can_store_is_refused_naming_it(key: str) -> None:
    scope = Scope.parse({"tenant": "t1"})
    with pytest.raises(InvalidRecordError) as refused:
        validate_record(scope, {"tenant": "t1", "source_key": key}, queue="q")
    assert refused.value.field == "source_key"
