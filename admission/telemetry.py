"""Admission's spans and metrics (OpenTelemetry, optional) and the root of its loggers.

Every logger of the library is a child of ``admission`` (``admission.receipts``,
``admission.worker``, ``admission.jobs``, ``admission.http``...).  The library
never configures logging: it only puts a :class:`logging.NullHandler` on the
``admission`` logger, so that an application which configures nothing does not
get admission's warnings from Python's last-resort handler on stderr; the
``admission`` command configures its loggers (``--log-level``).  No log line,
span or metric carries a raw command key, an argument, a result, a failure
message, a URL's password or a bearer token (docs/observability.md).

With ``opentelemetry-api`` importable (``pip install 'admission[otel]'``),
admission makes the spans and instruments listed in :data:`SPANS` and
:data:`METRICS` through ``opentelemetry.trace.get_tracer("admission", version)``
and ``opentelemetry.metrics.get_meter(...)``: the global providers, or those given
to :func:`configure`.  Without it, every span is a no-op and nothing of
OpenTelemetry is imported; with it, nothing is imported before the first span
either, so ``import admission`` stays light.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Final

__all__ = ["ATTRIBUTES", "METRICS", "SPANS", "configure"]

ROOT_LOGGER: Final = "admission"
"""The parent of every logger of the library."""

# Python's documentation for libraries: a NullHandler on the top logger, nothing else.
logging.getLogger(ROOT_LOGGER).addHandler(logging.NullHandler())

SPANS: Final = (
    "admission.start_run",
    "admission.admit_signal",
    "admission.admit_update",
    "admission.admit_many",
    "admission.complete_update",
    "admission.fail_update",
    "admission.close_run",
    "admission.continue_as_new",
    "admission.prune",
    "admission.worker.cycle",
    "admission.job.step",
)
"""The names of the spans admission makes (their attributes: docs/observability.md)."""

_WORKER_COUNTS: Final = (
    "recovered", "reconciled", "still_uncertain", "sent", "confirmed", "retried", "failed_safe", "uncertain"
)  # fmt: skip

ATTRIBUTES: Final = (
    "admission.namespace",
    "admission.command_type",
    "admission.name",
    "admission.decision",
    "admission.outcome",
    "admission.batch.size",
    "admission.batch.refused",
    "admission.close_status",
    "admission.prune.chains",
    "admission.prune.done",
    "admission.prune.dry_run",
    "admission.prune.clock_capped",
    "admission.worker.queue",
    "admission.worker.token",
    *(f"admission.worker.{count}" for count in _WORKER_COUNTS),
    "admission.job.id",
    "admission.job.kind",
    "admission.job.step",
    "admission.job.attempt",
    "admission.job.outcome",
    "admission.replica.answer",
    "error.type",
)
"""Every attribute a span or a measurement of admission may carry: names, identifiers, counts and
decisions; never a command key, an argument, a result or a message."""

ADMISSIONS: Final = "admission.admissions"
ADMIT_DURATION: Final = "admission.admit.duration"
REPLICA_READS: Final = "admission.replica.reads"
METRICS: Final = (ADMISSIONS, ADMIT_DURATION, REPLICA_READS)
"""The instruments: a counter of answered admissions (attributes ``admission.command_type``,
``admission.decision``, ``admission.outcome``), a histogram of the time of every admit call,
in seconds (``admission.command_type`` and ``admission.decision``, or ``error.type``), and, for a
store with a read replica, a counter of its receipt reads by who answered
(``admission.replica.answer``: ``replica``, ``primary`` or ``unavailable``; docs/replicas.md)."""

Attributes = Mapping[str, str | int | bool]


@dataclass
class _Instruments:
    tracer: Any
    admissions: Any
    admit_duration: Any
    replica_reads: Any
    status_error: Any
    idle: Callable[[], bool]
    """Whether spans would record nothing: no provider given and no global one set yet."""
    unmeasured: Callable[[], bool]
    """The same for measurements: the API's instruments would pass them to no meter."""


_explicit: dict[str, object | None] = {"tracer_provider": None, "meter_provider": None}
_instruments: list[_Instruments | None] = []  # empty: not looked up yet; [None]: no OpenTelemetry


def configure(*, tracer_provider: object | None = None, meter_provider: object | None = None) -> None:
    """Make admission's spans and metrics with these providers (``None``: OpenTelemetry's global ones).

    OpenTelemetry lets the global providers be set once per process; a test or
    an application that keeps providers of its own hands them over here
    instead.  Calling it again replaces both.
    """
    _explicit["tracer_provider"] = tracer_provider
    _explicit["meter_provider"] = meter_provider
    _instruments.clear()


def _version() -> str | None:
    # Imported here: importlib.metadata is not light, and only the first span needs it.
    from importlib import metadata

    try:
        return metadata.version("admission")
    except metadata.PackageNotFoundError:
        return None


def _lookup() -> _Instruments | None:
    if not _instruments:
        _instruments.append(_create())
    return _instruments[0]


def _measuring() -> _Instruments | None:
    """The instruments, or ``None`` when a measurement would reach no meter (see ``unmeasured``)."""
    found = _lookup()
    return None if found is None or found.unmeasured() else found


def _create() -> _Instruments | None:
    try:
        from opentelemetry import metrics, trace
    except ImportError:
        return None
    version = _version()
    tracer = trace.get_tracer(
        "admission",
        version,
        tracer_provider=_explicit["tracer_provider"],  # type: ignore[arg-type]
    )
    meter = metrics.get_meter(
        "admission",
        version or "",
        meter_provider=_explicit["meter_provider"],  # type: ignore[arg-type]
    )
    admissions = meter.create_counter(
        ADMISSIONS, unit="{admission}", description="Admissions answered, by command type and decision."
    )
    duration = meter.create_histogram(
        ADMIT_DURATION, unit="s", description="Time of an admit call (signal or update)."
    )
    replica = meter.create_counter(
        REPLICA_READS,
        unit="{read}",
        description="Receipt reads of a store with a read replica, by who answered them.",
    )
    return _Instruments(
        tracer,
        admissions,
        duration,
        replica,
        trace.Status(trace.StatusCode.ERROR),
        _idle(trace),
        _unmeasured(),
    )


def _idle(trace: Any) -> Callable[[], bool]:
    # Without an SDK, the API's spans record nothing yet cost a context switch each; skipping
    # them leaves the caller's span current, which is all a non-recording span would pass on.
    # Asked at every span: the global provider may be set after admission made its tracer
    # (the API's proxy tracer then delegates to it).
    if _explicit["tracer_provider"] is not None:
        return lambda: False
    placeholders = (trace.ProxyTracerProvider, trace.NoOpTracerProvider)
    from opentelemetry.environment_variables import OTEL_PYTHON_TRACER_PROVIDER

    if OTEL_PYTHON_TRACER_PROVIDER in os.environ or not hasattr(trace, "_TRACER_PROVIDER"):
        return lambda: isinstance(trace.get_tracer_provider(), placeholders)
    # While no provider is set, get_tracer_provider() looks the environment up on every call
    # (for a provider named there, none here): the global it sets is read instead, the
    # environment once.
    return lambda: (found := trace._TRACER_PROVIDER) is None or isinstance(found, placeholders)


def _unmeasured() -> Callable[[], bool]:
    # As for spans: until a meter provider is set, the API's instruments drop every measurement,
    # after building its attributes and reading the clock here.  Looked up through the global the
    # API sets (its lookup function reads the environment on every call while none is set).
    if _explicit["meter_provider"] is not None:
        return lambda: False
    from opentelemetry.environment_variables import OTEL_PYTHON_METER_PROVIDER

    try:
        from opentelemetry.metrics import _internal as api
    except ImportError:  # pragma: no cover - an API laid out otherwise: measure every time
        return lambda: False
    if OTEL_PYTHON_METER_PROVIDER in os.environ or not hasattr(api, "_METER_PROVIDER"):
        return lambda: False
    return lambda: api._METER_PROVIDER is None


class Span:
    """The span of one operation (nothing without OpenTelemetry), given attributes as they are known."""

    __slots__ = ("_span",)

    def __init__(self, span: Any) -> None:
        self._span = span

    @property
    def recording(self) -> bool:
        """Whether attributes given to :meth:`set` are kept (callers skip building them if not)."""
        return self._span is not None

    def set(self, attributes: Attributes) -> None:
        """Add ``attributes`` (never a key, an argument or a result: docs/observability.md)."""
        if self._span is not None:
            self._span.set_attributes(attributes)


_NOT_RECORDING: Final = Span(None)


class span:  # lower case: it reads as a function, ``with span(name, attributes) as current:``
    """A span named ``name`` around the block, the current span its parent.

    An exception leaving the block sets ``error.type`` (its class name) and
    the error status; its message is not recorded, since a driver's message
    may quote a value.  A class rather than a generator: it wraps every
    admission, and without a provider it costs one check.
    """

    __slots__ = ("_context", "_found", "_span")

    def __init__(self, name: str, attributes: Attributes) -> None:
        found = _lookup()
        self._found = None if found is None or found.idle() else found
        self._context: Any = None
        if self._found is not None:
            self._context = self._found.tracer.start_as_current_span(
                name, attributes=attributes, record_exception=False, set_status_on_exception=False
            )

    def __enter__(self) -> Span:
        if self._context is None:
            return _NOT_RECORDING
        self._span = self._context.__enter__()
        return Span(self._span)

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        if self._context is None:
            return
        if error is not None and self._found is not None:
            self._span.set_attribute("error.type", type(error).__name__)
            self._span.set_status(self._found.status_error)
        self._context.__exit__(kind, error, trace)


class Timer:
    """Measures one admit call and records it in the instruments (nothing without OpenTelemetry)."""

    __slots__ = ("_start",)

    def __init__(self) -> None:
        self._start = time.perf_counter()

    def answered(self, command_type: str, decision: str, outcome: str) -> None:
        """Count an answered admission and record its time."""
        found = _measuring()
        if found is None:
            return
        seconds = time.perf_counter() - self._start
        decision = str(decision)  # a StrEnum member is given: its plain value is recorded
        found.admissions.add(
            1,
            {
                "admission.command_type": command_type,
                "admission.decision": decision,
                "admission.outcome": outcome,
            },
        )
        found.admit_duration.record(
            seconds, {"admission.command_type": command_type, "admission.decision": decision}
        )

    def failed(self, command_type: str, error: BaseException) -> None:
        """Record the time of an admit call that raised."""
        found = _measuring()
        if found is None:
            return
        seconds = time.perf_counter() - self._start
        found.admit_duration.record(
            seconds, {"admission.command_type": command_type, "error.type": type(error).__name__}
        )


def batch_answered(command_type: str, decision: str, outcome: str) -> None:
    """Count one answered command of a batch (``admit_many``): in the admissions counter, not in
    the duration histogram, whose every value is the time of one admit call."""
    found = _measuring()
    if found is not None:
        found.admissions.add(
            1,
            {
                "admission.command_type": command_type,
                "admission.decision": decision,
                "admission.outcome": outcome,
            },
        )


def replica_read(answer: str) -> None:
    """Count a receipt read of a store with a read replica: ``replica``, ``primary`` or ``unavailable``."""
    found = _measuring()
    if found is not None:
        found.replica_reads.add(1, {"admission.replica.answer": answer})


def logger(part: str) -> logging.Logger:
    """The logger of a part of the library: ``admission.<part>``."""
    return logging.getLogger(f"{ROOT_LOGGER}.{part}")
