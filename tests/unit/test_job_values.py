"""The pure job values: bounded diagnostics and the job errors (worker contract §1, §4)."""

from __future__ import annotations

import pickle

from hypothesis import given, settings
from hypothesis import strategies as st

from admission.errors import (
    InvalidJobError,
    JobFencedError,
    JobQueueFullError,
    JobStateError,
    RetryableJobError,
    UnknownJobError,
)
from admission.jobs import MAX_DIAGNOSTIC_BYTES, bounded_diagnostic


@given(st.text(max_size=3000))
@settings(max_examples=200)
def test_bounded_diagnostic_always_fits_and_only_cuts_what_does_not(text: str) -> None:
    cut = bounded_diagnostic(text)
    assert len(cut.encode()) <= MAX_DIAGNOSTIC_BYTES
    fits = len(text.encode("utf-8", "replace")) <= MAX_DIAGNOSTIC_BYTES
    if fits and text.encode("utf-8", "replace").decode() == text:
        assert cut == text
    elif not fits:
        assert cut.endswith("bytes]") and "[truncated " in cut


def test_job_errors_have_stable_codes_and_pickle_with_their_data() -> None:
    errors = [
        JobFencedError("m", job_id="j", fence=1, current_fence=2, state="running"),
        JobQueueFullError("m", scope="s", waiting=128, limit=128),
        JobStateError("m", job_id="j", state="completed", event="claim"),
        UnknownJobError("m", job_id="j"),
        InvalidJobError("too long", field="diagnostic", job_id="j"),
        RetryableJobError("again"),
    ]
    codes = [e.code for e in errors]
    assert codes == [
        "job_fenced",
        "job_queue_full",
        "job_state",
        "job_unknown",
        "job_invalid",
        "job_retryable",
    ]
    for error in errors:
        again = pickle.loads(pickle.dumps(error))
        assert type(again) is type(error) and vars(again) == vars(error) and str(again) == str(error)
