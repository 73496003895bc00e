"""The front door: run a handler once per command key (``docs/once.md``).

:class:`Once` admits an update under the caller's command key, runs the
handler only when that admission is fresh, records its return value as the
update's completion (or its exception as a failure, kept or released by
policy), and answers every retry with what was recorded.  It is the glue
around ``start_run``, ``admit_update`` and ``complete_update`` that the common
case needs, and nothing more: every decision is the service's, under the
admission lock, so the handler runs once however many processes retry.

Instances: a front door speaks for one ``namespace``; each handler gets a
workflow instance of its own, named by ``workflow_id`` if given once for the
front door, else by the handler's command name, and the front door starts its
run the first time it needs one.  The intent of a call is the command name
and the handler's bound arguments (the key excluded), digested as every
admission is: a key reused with other arguments is a typed conflict.

The async front door (:class:`admission.aio.AsyncOnce`) runs this code through
:func:`admission.aio.run_sync`; nothing here is copied for it.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Final, Literal, ParamSpec, TypeVar

from admission.errors import (
    InputError,
    InvalidValueError,
    RequestIdAmbiguousError,
    RequestIdConflictError,
    RunStateError,
    UpdateFailedError,
    UpdateInProgressError,
)
from admission.intent._encoding import Value
from admission.receipts._rules import Admission, Decision
from admission.receipts._service import AdmissionService

__all__ = ["Attempt", "OnFailure", "Once", "failure_name"]

P = ParamSpec("P")
R = TypeVar("R")

OnFailure = Literal["keep", "release"]
"""What a handler's exception leaves behind: ``keep`` records it as the update's failure (retries
get :class:`~admission.errors.UpdateFailedError`); ``release`` records it and frees the key, so a
retry runs the handler again."""

NOT_COMPLETED: Final = "attempt_not_completed"
"""The failure recorded when an attempt's block ends without an exception and without a result."""

# A takeover and a release each end with the key admitted again; a few rounds
# are enough to see the outcome of any race (one admission is fresh, the rest
# find it), and the bound keeps a pathological store from looping for ever.
_ROUNDS: Final = 4


def failure_name(error: BaseException) -> str:
    """The default failure text: the exception's qualified class name, never its message,
    which may carry arguments or secrets."""
    kind = type(error)
    return f"{kind.__module__}.{kind.__qualname__}"


class Attempt:
    """One call under a command key, as :meth:`Once.attempt` gives it.

    ``done`` is true when the key already has a completed update: ``result``
    is its recorded value (decoded: tuples come back as lists), and the block
    must not run the handler.  Otherwise this call holds the key and must call
    :meth:`complete` with the handler's value (an exception leaving the block
    records a failure instead, by the front door's policy).
    """

    def __init__(self, once: Once, workflow_id: str, admission: Admission) -> None:
        self._once = once
        self.workflow_id = workflow_id
        self.admission = admission
        self.done = admission.update_status == "completed"
        self.result: Value = admission.result if self.done else None
        self._open = not self.done

    @property
    def update_id(self) -> str:
        """The update this attempt admitted or found."""
        assert self.admission.update_id is not None
        return self.admission.update_id

    def complete(self, value: object) -> Value:
        """Record ``value`` as the update's result; returns it as a retry will see it (decoded).

        A value the canonical encoding refuses is recorded as a failure (by
        policy) and the :class:`~admission.errors.InvalidValueError` raised.
        """
        if not self._open:
            raise RunStateError(
                "this attempt has no update in progress to complete", reason="attempt_closed", run_id=None
            )
        service, namespace = self._once.service, self._once.namespace
        try:
            completed = service.complete_update(namespace, self.workflow_id, self.update_id, value)
        except InputError as exc:
            self.fail(exc)
            raise
        except RunStateError:
            # Taken over after its expiry (or finished by someone else): no longer this attempt's.
            self._open = False
            raise
        self._open = False
        self.done = True
        self.result = completed.result
        return completed.result

    @property
    def holds_key(self) -> bool:
        """True while this attempt holds the key and has recorded neither a result nor a failure."""
        return self._open

    def fail(self, error: BaseException) -> None:
        """Record ``error``, as the front door's ``describe`` puts it, as the update's failure,
        kept or with the key released, by policy."""
        self.record(self._once.describe(error))

    def record(self, failure: str) -> None:
        """Record the failure text ``failure`` (nothing if this attempt no longer holds the key)."""
        if not self._open:
            return
        self._open = False
        self._once.record_failure(self.workflow_id, self.update_id, failure)


class Once:
    """Runs handlers once per command key: a decorator (``@once()``) and a context manager
    (``once.attempt(...)``) over an :class:`~admission.receipts.AdmissionService`.

    ``namespace`` holds every instance the front door uses; ``workflow_id``,
    when given, is the one instance of all its handlers, else each handler's
    command name is its instance.  ``in_progress_expiry`` (a positive
    ``timedelta``; ``None``, the default, never) lets a retry take over an
    update whose handler has not finished in that time, such as one whose
    process died; choose it longer than any handler runs, because the
    handler of an update taken over may run again.  ``on_failure`` is the
    :data:`OnFailure` policy; ``describe`` turns an exception into the
    recorded failure text (default :func:`failure_name`).
    """

    def __init__(
        self,
        service: AdmissionService,
        *,
        namespace: str,
        workflow_id: str | None = None,
        in_progress_expiry: timedelta | None = None,
        on_failure: OnFailure = "keep",
        describe: Callable[[BaseException], str] = failure_name,
    ) -> None:
        if on_failure not in ("keep", "release"):
            raise InvalidValueError("must be 'keep' or 'release'", field="on_failure", path="")
        if in_progress_expiry is not None and (
            not isinstance(in_progress_expiry, timedelta) or in_progress_expiry <= timedelta(0)
        ):
            raise InvalidValueError(
                "must be a positive timedelta or None", field="in_progress_expiry", path=""
            )
        self.service = service
        self.namespace = namespace
        self.workflow_id = workflow_id
        self.in_progress_expiry = in_progress_expiry
        self.on_failure: OnFailure = on_failure
        self.describe = describe
        self._started: set[str] = set()

    # -- the context manager -----------------------------------------------------------------

    @contextmanager
    def attempt(self, name: str, key: str, arguments: object) -> Iterator[Attempt]:
        """Admit ``name(arguments)`` under ``key`` and give the block an :class:`Attempt`.

        Raises before the block runs when the handler must not run here:
        :class:`~admission.errors.RequestIdConflictError` (the key names other
        arguments), :class:`~admission.errors.RequestIdAmbiguousError`,
        :class:`~admission.errors.UpdateInProgressError` (another call holds
        the key; retryable) or :class:`~admission.errors.UpdateFailedError`
        (a kept failure).  An exception leaving the block is recorded as the
        update's failure by policy and propagates; a block that ends without
        :meth:`Attempt.complete` is recorded as failed (``attempt_not_completed``)
        and refused with :class:`~admission.errors.RunStateError`.
        """
        attempt = self.begin(name, key, arguments)
        try:
            yield attempt
        except Exception as exc:
            self.end(attempt, exc)
            raise
        self.end(attempt, None)

    def end(self, attempt: Attempt, error: Exception | None) -> None:
        """What the end of an attempt's block records: ``error`` as the failure, or, when the
        block ended without :meth:`Attempt.complete`, ``attempt_not_completed`` (then refused)."""
        if error is not None:
            attempt.fail(error)
            return
        if attempt.holds_key:
            attempt.record(NOT_COMPLETED)
            raise RunStateError(
                "the attempt's block ended without complete()", reason=NOT_COMPLETED, run_id=None
            )

    # -- the decorator -------------------------------------------------------------------------

    def __call__(
        self, name: str | None = None, *, key_param: str = "key", key: Callable[..., str] | None = None
    ) -> Callable[[Callable[P, R]], Callable[P, Value]]:
        """Decorate a handler so that it runs once per command key.

        ``name`` is the command name (default: the function's ``__name__``);
        the key is the argument named ``key_param``, or what ``key`` returns
        when called with the handler's arguments.  The intent's arguments are
        the handler's bound arguments (defaults applied), without the key
        parameter when it gives the key.  The decorated function returns the
        recorded result: the handler's value as the canonical encoding
        decodes it, the same on the first call and on every retry.
        """

        def decorate(handler: Callable[P, R]) -> Callable[P, Value]:
            command, intent_of = self._binding(handler, name, key_param, key)

            @functools.wraps(handler)
            def call(*args: P.args, **kwargs: P.kwargs) -> Value:
                request_id, arguments = intent_of(*args, **kwargs)
                with self.attempt(command, request_id, arguments) as attempt:
                    if attempt.done:
                        return attempt.result
                    return attempt.complete(handler(*args, **kwargs))

            return call

        return decorate

    def _binding(
        self, handler: Callable[..., object], name: str | None, key_param: str, key: Callable[..., str] | None
    ) -> tuple[str, Callable[..., tuple[str, dict[str, object]]]]:
        """The command name, and how a call's arguments give its key and its intent's arguments."""
        signature = inspect.signature(handler)
        if key is None and key_param not in signature.parameters:
            raise InvalidValueError(
                "names no parameter of the handler (or pass key=)", field="key_param", path=""
            )

        def intent_of(*args: object, **kwargs: object) -> tuple[str, dict[str, object]]:
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            arguments = dict(bound.arguments)
            if key is not None:
                return key(*args, **kwargs), arguments
            request_id = arguments.pop(key_param)
            if not isinstance(request_id, str):
                raise InvalidValueError("the command key must be a string", field=key_param, path="")
            return request_id, arguments

        return name if name is not None else handler.__name__, intent_of

    # -- the steps, shared by both forms and by the async front door ----------------------------

    def instance_of(self, name: str) -> str:
        """The workflow instance a command name's updates go to."""
        return self.workflow_id if self.workflow_id is not None else name

    def begin(self, name: str, key: str, arguments: object) -> Attempt:
        """Admit the call and decide: an :class:`Attempt` that holds the key or is done, or an error."""
        workflow_id = self.instance_of(name)
        self._ensure_run(workflow_id)
        took_over = False
        for _ in range(_ROUNDS):
            answer = self.service.admit_update(self.namespace, workflow_id, name, arguments, request_id=key)
            if answer.decision is Decision.CONFLICT:
                raise RequestIdConflictError(
                    f"the command key of {name!r} names an update with other {', '.join(answer.conflict)}",
                    request_id=key,
                    conflict=answer.conflict,
                    retained_command_id=answer.retained_command_id,
                    retained_outcome=answer.retained_outcome,
                )
            if answer.decision is Decision.AMBIGUOUS:
                raise RequestIdAmbiguousError(
                    f"the command key of {name!r} cannot be proven to name one receipt",
                    request_id=key,
                    ambiguity=answer.ambiguity,
                )
            if not answer.accepted:
                # run_not_active: someone closed the front door's run (docs/once.md).
                raise RunStateError(
                    f"workflow {workflow_id!r} refused the update: {answer.outcome}",
                    reason=answer.reason or answer.outcome,
                    run_id=answer.run_id,
                )
            if answer.decision is Decision.FRESH or answer.update_status == "completed":
                return Attempt(self, workflow_id, answer)
            assert answer.update_id is not None
            if answer.update_status == "failed":
                if self.on_failure == "keep":
                    raise UpdateFailedError(
                        f"the handler of {name!r} failed under this command key; the failure is kept",
                        request_id=key,
                        update_id=answer.update_id,
                        failure=answer.failure,
                    )
                # Failed but still holding its key (a run closed under it, or a front door
                # that keeps failures shares the instance): this policy frees it and runs again.
                self.service.release_update(self.namespace, workflow_id, answer.update_id)
                continue
            if self.in_progress_expiry is None or took_over:
                break
            # The service decides under the lock, by its own clock; of several
            # retriers only one takes the update over, and then all admit again.
            taken = self.service.take_over_update(
                self.namespace, workflow_id, answer.update_id, expiry=self.in_progress_expiry
            )
            if taken is None:
                break  # not expired yet (or finished meanwhile: the next retry sees it)
            took_over = True
        raise UpdateInProgressError(
            f"the handler of {name!r} is still running under this command key",
            request_id=key,
            update_id=answer.update_id,
            state="accepted",
        )

    def record_failure(self, workflow_id: str, update_id: str, failure: str) -> None:
        """Record a handler's failure on its update, releasing the key if the policy says so."""
        if self.on_failure == "release":
            self.service.release_update(self.namespace, workflow_id, update_id, failure=failure)
        else:
            self.service.fail_update(self.namespace, workflow_id, update_id, failure)

    def _ensure_run(self, workflow_id: str) -> None:
        """Open the instance's run the first time this front door uses it (an open run is kept)."""
        if workflow_id in self._started:
            return
        try:
            self.service.start_run(self.namespace, workflow_id)
        except RunStateError as exc:
            if exc.reason != "run_already_open":
                raise
        self._started.add(workflow_id)
