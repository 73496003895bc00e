"""admission: safe retries of signals and updates for workflow engines.

A caller whose response was lost retries with the same command key; admission
answers with the original receipt instead of recording the command twice,
refuses a reused key whose intent changed, and says so plainly when it cannot
tell.
"""

from admission.encoding import (
    DEFAULT_MAX_SIZE,
    INTENT_VERSION,
    MAX_DEPTH,
    EncodedIntent,
    Value,
    arguments_digest,
    canonical_decode,
    canonical_encode,
    encode_intent,
    intent_digest,
    intent_record,
)
from admission.errors import (
    AdmissionError,
    InvalidCommandTypeError,
    InvalidRequestIdError,
    InvalidValueError,
    ReservedRequestIdError,
)
from admission.keys import normalize_request_id, receipt_token, validate_request_id

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_MAX_SIZE",
    "INTENT_VERSION",
    "MAX_DEPTH",
    "AdmissionError",
    "EncodedIntent",
    "InvalidCommandTypeError",
    "InvalidRequestIdError",
    "InvalidValueError",
    "ReservedRequestIdError",
    "Value",
    "__version__",
    "arguments_digest",
    "canonical_decode",
    "canonical_encode",
    "encode_intent",
    "intent_digest",
    "intent_record",
    "normalize_request_id",
    "receipt_token",
    "validate_request_id",
]
