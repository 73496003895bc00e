"""The shared rule for storable text (:func:`admission._bounds.text_fault`), whatever the text."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from admission._bounds import text_fault


def reference_fault(value: object, width: int) -> str | None:
    """The rule as written, step by step, without the shortcut for ASCII text."""
    if type(value) is not str:
        return f"must be a string, got {type(value).__name__}"
    if not value:
        return "must not be empty"
    if len(value) > width:
        return f"must have at most {width} characters, got {len(value)}"
    if "\x00" in value:
        return f"must not contain NUL (at index {value.index(chr(0))})"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"contains a lone surrogate at index {exc.start}"
    return None


TEXTS = st.one_of(
    st.text(max_size=20),
    st.text(alphabet=st.characters(max_codepoint=127), max_size=20),
    st.text(alphabet=st.sampled_from(["a", "\x00", "\ud800", "\udfff", "é", "\x7f"]), max_size=8),
)


@given(st.one_of(TEXTS, st.integers(), st.binary(max_size=4), st.none()), st.integers(1, 12))
def test_every_value_gets_the_answer_of_the_rule_as_written(value: object, width: int) -> None:
    assert text_fault(value, width) == reference_fault(value, width)
