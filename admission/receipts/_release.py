"""Releasing a command key, and taking over an update in progress (``docs/lifecycle.md``).

The two service steps of :class:`~admission.receipts.AdmissionService` that
free a key: the front door (:class:`~admission.receipts.Once`) uses them for
its failure policy and its in-progress expiry.  Each validates its input
before the transaction (bad input writes nothing) and does its reading,
deciding and writing under the instance's admission lock, through
:mod:`admission.receipts._lifecycle`.

Pure: no SQLAlchemy, no clock (the service's clock is passed in).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from admission import _bounds as bounds
from admission.errors import InvalidValueError
from admission.receipts import _lifecycle as lifecycle
from admission.receipts._rules import Admission
from admission.receipts._store import LockedInstance

__all__ = ["KeyRelease"]


def _checked(value: object, field: str, width: int) -> None:
    fault = bounds.text_fault(value, width)
    if fault is not None:
        raise InvalidValueError(fault, field=field, path="")


class KeyRelease:
    """The key-freeing steps of the admission service (a part of :class:`AdmissionService`)."""

    if TYPE_CHECKING:
        _clock: Callable[[], datetime]

        def _locked(
            self, namespace: str, workflow_id: str, now: datetime, connection: object | None
        ) -> AbstractContextManager[LockedInstance]: ...

    def release_update(
        self,
        namespace: str,
        workflow_id: str,
        update_id: str,
        *,
        failure: str | None = None,
        connection: object | None = None,
    ) -> Admission:
        """Free the command key of a failed update, so the next admission with it is fresh.

        An update still ``accepted`` is first failed with ``failure`` (required
        then), in the same transaction: the failure and the release are
        recorded together (``UpdateFailed``, ``UpdateKeyReleased``) or not at
        all.  A completed update keeps its key (refused with
        :class:`RunStateError`); releasing again changes nothing.  The
        command, its update and its events stay; only the key stops
        answering (``docs/lifecycle.md``, "Releasing a key").
        """
        _checked(namespace, "namespace", bounds.NAME)
        _checked(workflow_id, "workflow_id", bounds.NAME)
        _checked(update_id, "update_id", bounds.ID)
        if failure is not None:
            _checked(failure, "failure", bounds.TEXT)
        now = self._clock()
        with self._locked(namespace, workflow_id, now, connection) as tx:
            return lifecycle.release_update(tx, update_id, failure, now)

    def take_over_update(
        self,
        namespace: str,
        workflow_id: str,
        update_id: str,
        *,
        expiry: timedelta,
        connection: object | None = None,
    ) -> Admission | None:
        """Take over an update whose handler has not finished within ``expiry``.

        Under the admission lock: if the update is still ``accepted`` and was
        accepted more than ``expiry`` ago by the service's clock
        (:func:`~admission.receipts.may_take_over`), it is failed with
        ``in_progress_expired`` and its key released, in one transaction, and
        the released update's answer is returned; otherwise nothing is
        written and the answer is ``None``.  Of several callers racing to take
        one update over, exactly one gets an answer; each then admits the key
        again, and only the fresh admission runs the handler.
        """
        _checked(namespace, "namespace", bounds.NAME)
        _checked(workflow_id, "workflow_id", bounds.NAME)
        _checked(update_id, "update_id", bounds.ID)
        if not isinstance(expiry, timedelta) or expiry <= timedelta(0):
            raise InvalidValueError("must be a positive timedelta", field="expiry", path="")
        now = self._clock()
        with self._locked(namespace, workflow_id, now, connection) as tx:
            return lifecycle.take_over_update(tx, update_id, expiry, now)
