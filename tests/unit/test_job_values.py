"""The pure job values: bounded diagnostics and the job errors (worker contract §1, §4)."""

from __future__ import annotations

import pickle
import re

from hypothesis import given, settings
from hypothesis import strategies as st

from admission import _bounds as bounds
from admission.errors import (
    InvalidJobError,
    JobFencedError,
    JobLockedError,
    JobQueueFullError,
    JobStateError,
    RetryableJobError,
    UnknownJobError,
)
from admission.jobs import MAX_DIAGNOSTIC_BYTES, bounded_diagnostic
from admission.jobs._values import check_diagnostic


@given(st.text(max_size=3000))
@settings(max_examples=200)
def test_bounded_diagnostic_always_fits_and_only_cuts_what_does_not(text: str) -> None:
    cut = bounded_diagnostic(text)
    assert len(cut.encode()) <= MAX_DIAGNOSTIC_BYTES
    assert bounds.text_fault(cut, bounds.TEXT) is None or cut == ""  # every backend stores it
    storable = bounds.storable_text(bounds.mask_secrets(text))
    fits = len(storable.encode()) <= MAX_DIAGNOSTIC_BYTES
    if fits:
        assert cut == storable
    else:
        assert cut.endswith("bytes]") and "[truncated " in cut


_PIECES = st.sampled_from(["a", "é", "€", "😀", "\x00", "\ud800", "[truncated 9 bytes]"]) | st.characters()
_SHORT = st.lists(_PIECES, max_size=40).map("".join)
_TEXTS = st.builds(lambda head, unit, times: head + unit * times, _SHORT, _SHORT, st.integers(0, 600))
"""Characters of every UTF-8 width, what is mended (NUL, a lone surrogate), and a marker look-alike;
a short run repeated, so that about half of the texts are long enough to be cut, anywhere."""


@given(_TEXTS)
@settings(max_examples=200)
def test_the_truncation_marker_counts_the_bytes_cut(text: str) -> None:
    cut = bounded_diagnostic(text)
    # URL passwords masked, NUL and lone surrogates U+FFFD (3 bytes), first.
    mended = bounds.storable_text(bounds.mask_secrets(text)).encode()
    assert len(cut.encode()) <= MAX_DIAGNOSTIC_BYTES
    if len(mended) <= MAX_DIAGNOSTIC_BYTES:
        assert cut.encode() == mended
        return
    match = re.fullmatch(r"(.*) \[truncated (\d+) bytes\]", cut, re.DOTALL)
    assert match is not None
    kept = match.group(1).encode()
    assert mended.startswith(kept) and len(kept) + int(match.group(2)) == len(mended)
    # As much is kept as the marker leaves room for, short of a character cut in two.
    assert MAX_DIAGNOSTIC_BYTES - len(cut.encode()) <= 3 + len(str(len(mended))) - len(match.group(2))


# Any password a URL can carry unencoded: no separator of the URL, no space, no control character.
_PASSWORDS = st.text(
    st.characters(codec="utf-8", exclude_categories=("Z", "C"), exclude_characters="@&/:"), min_size=1
)


@given(_PASSWORDS)
def test_a_diagnostic_never_keeps_a_urls_password(password: str) -> None:
    # An exception's text may quote the URL it was given: the stored diagnostic masks it.
    text = (
        f"step 2: OperationalError: connection to postgresql://svc:{password}@db.internal:5432/app "
        f"failed; retry with host=db2&password={password}&sslmode=require"
    )
    assert bounded_diagnostic(text) == (
        "step 2: OperationalError: connection to postgresql://svc:***@db.internal:5432/app "
        "failed; retry with host=db2&password=***&sslmode=require"
    )


def test_job_errors_have_stable_codes_and_pickle_with_their_data() -> None:
    errors = [
        JobFencedError("m", job_id="j", fence=1, current_fence=2, state="running"),
        JobLockedError("m", scope="s", lock_path="/run/locks/0123.lock"),
        JobQueueFullError("m", scope="s", waiting=128, limit=128),
        JobStateError("m", job_id="j", state="completed", event="claim"),
        UnknownJobError("m", job_id="j"),
        InvalidJobError("too long", field="diagnostic", job_id="j"),
        RetryableJobError("again"),
    ]
    codes = [e.code for e in errors]
    assert codes == [
        "job_fenced",
        "job_locked",
        "job_queue_full",
        "job_state",
        "job_unknown",
        "job_invalid",
        "job_retryable",
    ]
    for error in errors:
        again = pickle.loads(pickle.dumps(error))
        assert type(again) is type(error) and vars(again) == vars(error) and str(again) == str(error)


def test_a_diagnostic_no_backend_can_store_is_refused_naming_it() -> None:
    for diagnostic in ("a\x00b", "a\ud800", "x" * (MAX_DIAGNOSTIC_BYTES + 1)):
        try:
            check_diagnostic(diagnostic, "j1")
        except InvalidJobError as refused:
            assert refused.field == "diagnostic" and refused.job_id == "j1"
        else:
            raise AssertionError(f"{diagnostic[:8]!r} was not refused")
    check_diagnostic("x" * MAX_DIAGNOSTIC_BYTES, "j1")
