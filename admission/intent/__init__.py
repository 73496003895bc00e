"""The intent: canonical encoding ``intent-v1``, digests, command keys, golden vectors (contract §2, §3).

Pure: nothing here touches a database, a clock or the network.  The optional
C accelerator (``_speedups``) encodes the same bytes faster.
"""

from admission.intent._encoding import (
    ACCELERATED,
    DEFAULT_MAX_SIZE,
    INTENT_TAG,
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
from admission.intent._keys import (
    MAX_REQUEST_ID_LENGTH,
    RESERVED_SIGNAL_PREFIX,
    TOKEN_PATTERN,
    normalize_request_id,
    receipt_token,
    validate_request_id,
)
from admission.intent._location import shipped_vectors
from admission.intent._vectors import (
    VECTOR_CATEGORIES,
    VECTORS_FORMAT,
    VectorFormatError,
    case_digest,
    load_manifest,
    load_vectors,
    typed_value,
)
from admission.intent._verify import VerifyReport, verify_vectors

__all__ = [
    "ACCELERATED",
    "DEFAULT_MAX_SIZE",
    "INTENT_TAG",
    "INTENT_VERSION",
    "MAX_DEPTH",
    "MAX_REQUEST_ID_LENGTH",
    "RESERVED_SIGNAL_PREFIX",
    "TOKEN_PATTERN",
    "VECTORS_FORMAT",
    "VECTOR_CATEGORIES",
    "EncodedIntent",
    "Value",
    "VectorFormatError",
    "VerifyReport",
    "arguments_digest",
    "canonical_decode",
    "canonical_encode",
    "case_digest",
    "encode_intent",
    "intent_digest",
    "intent_record",
    "load_manifest",
    "load_vectors",
    "normalize_request_id",
    "receipt_token",
    "shipped_vectors",
    "typed_value",
    "validate_request_id",
    "verify_vectors",
]
