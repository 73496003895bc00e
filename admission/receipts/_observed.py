"""The admission service, observed: its spans, metrics and log lines, added in this one place.

:mod:`admission.receipts._service` stays pure (no clock, no I/O): this module
wraps the service's writing methods, once, when the package loads, with a
span (:mod:`admission.telemetry`), the admission counter and latency
histogram, and a log line on ``admission.receipts``.  Every caller of
:class:`AdmissionService` goes through the wrappers, the asyncio service too
(it runs these same methods in a greenlet).

What is recorded comes from the answer, after the service has validated the
input: the namespace, the command type and name, the decision and outcome,
the receipt token (in DEBUG lines).  Never the command key, the arguments, a
result or a failure message; of an error only its class and ``code``.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any, Final, TypeVar

from admission import telemetry
from admission.errors import AdmissionError, InputError, StateError, StorageError
from admission.intent._keys import receipt_token
from admission.receipts._answers import PruneReport, RunInfo
from admission.receipts._rules import Admission, CommandType, Decision
from admission.receipts._service import AdmissionService

__all__ = ["AdmissionService"]

_log: Final = telemetry.logger("receipts")

R = TypeVar("R")
Method = Callable[..., R]

_NOTEWORTHY: Final = frozenset({Decision.CONFLICT, Decision.AMBIGUOUS})
"""Decisions logged at INFO: a key reused for another intent, or one that cannot be proven."""


def _refused(operation: str, exc: BaseException) -> None:
    """One line for an error leaving the service: its class and code, never its message (a
    driver's message may quote a value, an input error's path may name an argument's field)."""
    code = getattr(exc, "code", "")
    if isinstance(exc, StorageError):
        _log.warning("%s failed: %s (%s)", operation, type(exc).__name__, code)
    elif isinstance(exc, InputError):
        _log.debug("%s refused: %s (%s, field %s)", operation, type(exc).__name__, code, exc.field)
    elif isinstance(exc, (StateError, AdmissionError)):
        _log.info("%s refused: %s (%s)", operation, type(exc).__name__, code)
    elif isinstance(exc, Exception):
        _log.warning("%s failed: %s", operation, type(exc).__name__)


def _argument(args: tuple[Any, ...], kwargs: dict[str, Any], index: int, name: str) -> object:
    return args[index] if len(args) > index else kwargs.get(name)


def _admission_attributes(answer: Admission) -> dict[str, str | int | bool]:
    return {
        "admission.namespace": answer.namespace,
        "admission.decision": str(answer.decision),
        "admission.outcome": answer.outcome,
    }


def _token(answer: Admission) -> str:
    return receipt_token(answer.command_type, answer.request_id) if answer.request_id else "-"


def _admit(command_type: CommandType, method: Method[Admission]) -> Method[Admission]:
    operation = f"admit_{command_type}"
    span_name = f"admission.{operation}"

    @functools.wraps(method)
    def admit(self: AdmissionService, *args: Any, **kwargs: Any) -> Admission:
        with telemetry.span(span_name, {"admission.command_type": command_type}) as span:
            timer = telemetry.Timer()
            try:
                answer = method(self, *args, **kwargs)
            except BaseException as exc:
                timer.failed(command_type, exc)
                _refused(operation, exc)
                raise
            timer.answered(command_type, answer.decision, answer.outcome)
            # Validated by the service by now: a name that fits its column.  Looked up only
            # for a span that records or a line that is written (the retry path is short).
            if span.recording:
                attributes = _admission_attributes(answer)
                name = _argument(args, kwargs, 2, "name")
                if isinstance(name, str):
                    attributes["admission.name"] = name
                span.set(attributes)
            level = logging.INFO if answer.decision in _NOTEWORTHY else logging.DEBUG
            if _log.isEnabledFor(level):
                _log.log(
                    level,
                    "%s %s in %s: %s, %s (token %s)",
                    operation,
                    _argument(args, kwargs, 2, "name"),
                    answer.namespace,
                    answer.decision,
                    answer.outcome,
                    _token(answer),
                )
            return answer

    return admit


def _admit_many(method: Method[list[Admission | AdmissionError]]) -> Method[list[Admission | AdmissionError]]:
    @functools.wraps(method)
    def admit_many(self: AdmissionService, *args: Any, **kwargs: Any) -> list[Admission | AdmissionError]:
        with telemetry.span("admission.admit_many", {}) as span:
            try:
                answers = method(self, *args, **kwargs)
            except BaseException as exc:
                _refused("admit_many", exc)
                raise
            refused = 0
            for answer in answers:
                if isinstance(answer, Admission):
                    telemetry.batch_answered(answer.command_type, str(answer.decision), answer.outcome)
                else:
                    refused += 1
            span.set({"admission.batch.size": len(answers), "admission.batch.refused": refused})
            _log.debug("admit_many: %d commands, %d refused", len(answers), refused)
            return answers

    return admit_many


def _finish(operation: str, method: Method[Admission]) -> Method[Admission]:
    @functools.wraps(method)
    def finish(self: AdmissionService, *args: Any, **kwargs: Any) -> Admission:
        with telemetry.span(f"admission.{operation}", {"admission.command_type": "update"}) as span:
            try:
                answer = method(self, *args, **kwargs)
            except BaseException as exc:
                _refused(operation, exc)
                raise
            span.set(_admission_attributes(answer))
            _log.debug(
                "%s %s in %s: %s, %s",
                operation,
                answer.update_id,
                answer.namespace,
                answer.decision,
                answer.outcome,
            )
            return answer

    return finish


def _run(operation: str, method: Method[RunInfo], closing: str | None = None) -> Method[RunInfo]:
    @functools.wraps(method)
    def run(self: AdmissionService, *args: Any, **kwargs: Any) -> RunInfo:
        with telemetry.span(f"admission.{operation}", {}) as span:
            try:
                info = method(self, *args, **kwargs)
            except BaseException as exc:
                _refused(operation, exc)
                raise
            attributes: dict[str, str | int | bool] = {"admission.namespace": info.namespace}
            status = closing or _argument(args, kwargs, 2, "status")
            if isinstance(status, str):
                attributes["admission.close_status"] = status
            span.set(attributes)
            _log.debug("%s in %s: run %s is %s", operation, info.namespace, info.run_id, info.status)
            return info

    return run


def _prune(method: Method[PruneReport]) -> Method[PruneReport]:
    @functools.wraps(method)
    def prune(self: AdmissionService, *args: Any, **kwargs: Any) -> PruneReport:
        with telemetry.span("admission.prune", {}) as span:
            try:
                report = method(self, *args, **kwargs)
            except BaseException as exc:
                _refused("prune", exc)
                raise
            span.set(
                {
                    "admission.prune.chains": report.chains,
                    "admission.prune.done": report.done,
                    "admission.prune.dry_run": report.dry_run,
                    "admission.prune.clock_capped": report.clock_capped,
                }
            )
            _log.info(
                "prune: %d of %d chains%s%s",
                report.done,
                report.chains,
                " (dry run)" if report.dry_run else "",
                " (clock capped)" if report.clock_capped else "",
            )
            return report

    return prune


def _observe(cls: type[AdmissionService]) -> None:
    # Once: a second wrapping (a reload) would count every admission twice.
    if getattr(cls, "_observed", False):
        return
    cls.admit_signal = _admit("signal", cls.admit_signal)  # type: ignore[method-assign]
    cls.admit_update = _admit("update", cls.admit_update)  # type: ignore[method-assign]
    cls.admit_many = _admit_many(cls.admit_many)  # type: ignore[method-assign]
    cls.complete_update = _finish("complete_update", cls.complete_update)  # type: ignore[method-assign]
    cls.fail_update = _finish("fail_update", cls.fail_update)  # type: ignore[method-assign]
    cls.start_run = _run("start_run", cls.start_run)  # type: ignore[method-assign]
    cls.close_run = _run("close_run", cls.close_run)  # type: ignore[method-assign]
    cls.continue_as_new = _run("continue_as_new", cls.continue_as_new, "continued")  # type: ignore[method-assign]
    cls.prune = _prune(cls.prune)  # type: ignore[method-assign]
    cls._observed = True  # type: ignore[attr-defined]


_observe(AdmissionService)
