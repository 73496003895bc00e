"""The public surface: the facade's and the CLI's pinned ``__all__`` (the layout's rules: test_layout.py)."""

from __future__ import annotations

import inspect
from pathlib import Path

import admission

PACKAGE = Path(admission.__file__).parent


def test_public_api_is_pinned() -> None:
    assert sorted(admission.__all__) == sorted(
        [
            "DEFAULT_MAX_SIZE",
            "INTENT_VERSION",
            "MAX_DEPTH",
            "Admission",
            "AdmissionError",
            "AdmissionService",
            "BatchCommand",
            "BeforeWriteError",
            "CodecError",
            "CommandKeyError",
            "Decision",
            "EncodedIntent",
            "EventLogMovedError",
            "FencedError",
            "InputError",
            "InvalidCommandTypeError",
            "InvalidJobError",
            "InvalidRecordError",
            "InvalidRequestIdError",
            "InvalidValueError",
            "JobFencedError",
            "JobLockedError",
            "JobQueueFullError",
            "JobStateError",
            "LeaseHeldError",
            "MemoryStore",
            "Once",
            "OwnershipError",
            "QueueFullError",
            "RecordStateError",
            "RequestIdAmbiguousError",
            "RequestIdConflictError",
            "ReservedRequestIdError",
            "RetryableJobError",
            "RunStateError",
            "SchemaDriftError",
            "SchemaRevisionError",
            "ScopeMismatchError",
            "SqlStore",
            "StateError",
            "StorageError",
            "TargetError",
            "TargetTimeoutError",
            "UnknownCommandError",
            "UnknownError",
            "UnknownJobError",
            "UnknownUpdateError",
            "UnstampedSchemaError",
            "UpdateFailedError",
            "UpdateInProgressError",
            "Value",
            "WorkerLockedError",
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
    )
    for name in admission.__all__:
        assert hasattr(admission, name), name


def test_cli_face_is_pinned() -> None:
    import admission.cli as cli

    assert sorted(cli.__all__) == sorted(
        [
            "EXIT_AMBIGUOUS",
            "EXIT_CONFLICT",
            "EXIT_DRIFTED",
            "EXIT_FAILED",
            "EXIT_FINDINGS",
            "EXIT_INTERNAL",
            "EXIT_INTERRUPTED",
            "EXIT_INVALID",
            "EXIT_OK",
            "EXIT_OWNED",
            "EXIT_PIPE",
            "EXIT_REFUSED",
            "EXIT_SCHEMA",
            "EXIT_STORAGE",
            "EXIT_TARGET",
            "EXIT_UNSTAMPED",
            "build_parser",
            "main",
        ]
    )
    assert [cli.EXIT_OK, cli.EXIT_FAILED, cli.EXIT_INVALID, cli.EXIT_SCHEMA, cli.EXIT_REFUSED] == [
        0,
        1,
        2,
        3,
        4,
    ]
    assert [cli.EXIT_STORAGE, cli.EXIT_CONFLICT, cli.EXIT_AMBIGUOUS, cli.EXIT_OWNED] == [5, 9, 10, 11]
    assert cli.EXIT_TARGET == 12
    assert [cli.EXIT_UNSTAMPED, cli.EXIT_DRIFTED, cli.EXIT_FINDINGS] == [6, 7, 8]
    assert [cli.EXIT_INTERNAL, cli.EXIT_INTERRUPTED, cli.EXIT_PIPE] == [70, 130, 141]


def test_public_callables_and_classes_have_docstrings() -> None:
    for name in admission.__all__:
        obj = getattr(admission, name)
        if inspect.isfunction(obj) or inspect.isclass(obj):
            assert inspect.getdoc(obj), name


def test_py_typed_marker_ships() -> None:
    assert (PACKAGE / "py.typed").exists()
