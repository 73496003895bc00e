"""The admission service: validate, digest, lock, decide, write (contract §4, §5).

Every method validates its input before it opens a transaction (bad input
raises a typed error and writes nothing), then does all of its reading and
deciding for one workflow instance under the admission lock, so concurrent
first-time requests with one key admit exactly one command.  The decisions
are the pure tables of :mod:`admission.receipts._rules`; the run lifecycle
(``_lifecycle``), the answers (``_answers``) and retention (``_retention``)
are pure functions over a locked instance; this class validates, takes the
lock, and calls them.

Time and identifiers are parameters (``clock``, ``new_id``), so tests and
engines control them.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import UTC, datetime, timedelta
from typing import Final, cast

from admission import _bounds as bounds
from admission.errors import AdmissionError, InvalidValueError
from admission.intent._encoding import (
    DEFAULT_MAX_SIZE,
    INTENT_VERSION,
    canonical_decode,
    canonical_encode,
)
from admission.intent._keys import validated_token
from admission.receipts import _lifecycle as lifecycle
from admission.receipts._answers import (
    HistoryEvent,
    PruneReport,
    RunInfo,
    ambiguous,
    answer,
    answer_judgement,
    context_of,
    judge_locked,
    plainly_retained,
    stored_receipt,
)
from admission.receipts._batch import BatchAdmission, Prepared
from admission.receipts._release import KeyRelease
from admission.receipts._retention import DEFAULT_MAX_CLOCK_LEAD, prune_all, utc_clock
from admission.receipts._rules import (
    CLOSE_EVENTS,
    Admission,
    CommandType,
    Decision,
    Intent,
    judge_receipts,
    judge_target,
    select_receipt,
)
from admission.receipts._sealed import intent_and_stored
from admission.receipts._store import CommandRow, KeyedLocking, LockedInstance, Store, UpdateRow

__all__ = ["DEFAULT_RETENTION_DAYS", "AdmissionService", "time_ordered_id", "utc_now", "uuid_at"]

DEFAULT_RETENTION_DAYS: Final = 30
"""Receipts live as long as their run's history: 30 days after closure by default (contract §5)."""
RETRY_SHARE: Final = 0.25
"""Below this share of retries among recent keyed admissions, a store that can read a key's
receipts in the lock's round trip (:class:`~admission.receipts.KeyedLocking`) is asked to; above
it, the receipts are read first, without a transaction.  The first way saves a fresh key a round
trip and a second connection and costs a retry one more round trip (its transaction's ``COMMIT``),
so it pays while retries are about a quarter of the keyed admissions or fewer (docs/performance.md)."""
MAX_IDENTIFIER_LENGTH: Final = bounds.NAME
MAX_FAILURE_LENGTH: Final = bounds.TEXT


def utc_now() -> datetime:
    """The default clock: the current time, timezone-aware UTC."""
    return datetime.now(UTC)


_RANDOM_BITS: Final = 74
"""Random bits of a time-ordered id (RFC 9562 UUIDv7: 12 in ``rand_a``, 62 in ``rand_b``)."""


def time_ordered_id() -> str:
    """A fresh UUID (RFC 9562 version 7): the Unix time in milliseconds, then 74 random bits.

    The default ``new_id``.  Ids that grow with time land at the right end of
    every index keyed by them (``workflow_commands``' primary key, the
    updates' and runs' keys), so an admission dirties the same few index pages
    as the last one instead of a random page: on PostgreSQL that is the
    difference between a full-page image in the WAL after every checkpoint and
    none (docs/performance.md).  Uniqueness comes from the random bits, as
    with ``uuid4`` (2**74 per millisecond); order is only a storage
    optimisation, so a clock that steps back costs locality, never
    correctness.  The id reveals its creation time to the millisecond, which
    every receipt already reports (``received_at``).
    """
    # 80 bits from the system's generator (as uuid4 draws them), 74 kept; no uuid.UUID object
    # and no datetime arithmetic, which cost more than the rest of the id (~6 against ~3 µs).
    millis = int(datetime.now(UTC).timestamp() * 1000)
    return uuid_at(millis, int.from_bytes(secrets.token_bytes(10)) >> 80 - _RANDOM_BITS)


def uuid_at(millis: int, random: int) -> str:
    """The version-7 UUID of Unix time ``millis`` (48 bits kept) and ``random`` (74 bits)."""
    millis &= (1 << 48) - 1
    rand_a, rand_b = random >> 62 & 0xFFF, random & (1 << 62) - 1
    # The canonical text of the 128 bits, built directly: uuid.UUID costs several times more.
    h = f"{millis << 80 | 0x7 << 76 | rand_a << 64 | 0b10 << 62 | rand_b:032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def _identifier(value: object, field: str, width: int = bounds.NAME) -> str:
    """``value`` if every backend can store it in a column of ``width`` (refused naming ``field``)."""
    fault = bounds.text_fault(value, width)
    if fault is not None:
        raise InvalidValueError(fault, field=field, path="")
    assert isinstance(value, str)
    return value


def _run_id(value: object, field: str = "run_id") -> str:
    # Run ids live in ID-wide columns (runs, commands, events), narrower than names.
    return _identifier(value, field, bounds.ID)


def _checked_ids(new_id: Callable[[], str]) -> Callable[[], str]:
    """``new_id`` whose every id is checked against the id columns' width (contract §4: bad
    input writes nothing; an id raised on inside the lock rolls its transaction back); the
    default's ids, 36 ASCII characters, need no check."""
    if new_id is time_ordered_id:
        return new_id

    def checked() -> str:
        return _identifier(new_id(), "new_id", bounds.ID)

    return checked


def _judge_key(tx: LockedInstance, intent: Intent, key: str, token: str) -> Admission | None:
    return judge_locked(tx, tx.find_commands(intent.command_type, [token, key]), intent, key, token)


def _judge_committed(
    store: Store, namespace: str, workflow_id: str, intent: Intent, key: str, token: str
) -> Admission | None:
    """Answer a retry from committed receipts, without the lock, when a receipt exists.

    Receipts are immutable (an update's status only advances, by its own
    committed transaction), so a committed receipt gives the answer the
    lock would give; with none, the caller takes the lock and decides.
    """
    found = store.read_receipts(namespace, workflow_id, intent.command_type, [token, key])
    return _judge_found(namespace, workflow_id, found, intent, key, token) if found else None


def _judge_found(
    namespace: str,
    workflow_id: str,
    found: list[tuple[CommandRow, UpdateRow | None]],
    intent: Intent,
    key: str,
    token: str,
) -> Admission | None:
    """The answer of a key's committed receipts (``found``, not empty), or ``None`` when only the
    lock can decide (see :func:`_judge_committed`)."""
    if (plain := plainly_retained(namespace, workflow_id, found, key, token, intent.digest)) is not None:
        return plain  # the common case, without building the judgement below
    rows = [row for row, _ in found]
    judgement = judge_receipts([stored_receipt(r, key) for r in rows], key, token, intent)
    if judgement.decision is None:
        return None
    updates = {row.id: update for row, update in found}
    return answer_judgement(namespace, workflow_id, judgement, rows, updates.get, key, intent.command_type)


def _share_after(share: float, *, retry: bool) -> float:
    """The share of retries among about the last ten keyed admissions made outside a caller's
    transaction, after one more (``retry``: its key had a receipt); it picks the path
    (:data:`RETRY_SHARE`).  A service updates it without a lock: a lost update among threads only
    delays a change of path."""
    return share * 0.9 + (0.1 if retry else 0.0)


class AdmissionService(KeyRelease, BatchAdmission):
    """Admits signals and updates with command keys, on any :class:`Store`.

    ``clock`` returns timezone-aware datetimes (kept in UTC); ``new_id`` fresh identifiers;
    ``max_size`` bounds the encoded arguments and results.  Arguments given as
    :class:`~admission.receipts.SealedArguments` are digested by their plaintext and stored sealed.
    """

    def __init__(
        self,
        store: Store,
        *,
        clock: Callable[[], datetime] = utc_now,
        new_id: Callable[[], str] = time_ordered_id,
        max_size: int = DEFAULT_MAX_SIZE,
    ) -> None:
        self.store = store
        self._clock = utc_clock(clock)
        self._new_id = _checked_ids(new_id)
        self._max_size = max_size
        self._retry_share = 0.0  # see _share_after

    def _locked(
        self, namespace: str, workflow_id: str, now: datetime, connection: object | None
    ) -> AbstractContextManager[LockedInstance]:
        """The instance's lock (callers check their input first: bad input writes nothing)."""
        return self.store.locked(
            namespace, workflow_id, created_at=now, new_id=self._new_id(), connection=connection
        )

    # -- runs ---------------------------------------------------------------------

    def start_run(
        self, namespace: str, workflow_id: str, *, run_id: str | None = None, connection: object | None = None
    ) -> RunInfo:
        """Start a new run of an instance, registering the instance if it is new.

        Refused with :class:`RunStateError` while the instance has an open run.
        """
        _identifier(namespace, "namespace")
        _identifier(workflow_id, "workflow_id")
        new_run_id = self._new_id() if run_id is None else _run_id(run_id)
        now = self._clock()
        with self._locked(namespace, workflow_id, now, connection) as tx:
            return lifecycle.start_run(tx, new_run_id, now)

    def close_run(
        self,
        namespace: str,
        workflow_id: str,
        status: str,
        *,
        run_id: str | None = None,
        connection: object | None = None,
    ) -> RunInfo:
        """Close the current run as completed, failed, cancelled or terminated."""
        if status not in CLOSE_EVENTS or status == "continued":
            raise InvalidValueError(
                "must be one of completed, failed, cancelled, terminated", field="status", path=""
            )
        return self._close(namespace, workflow_id, status, run_id, None, connection)

    def continue_as_new(
        self,
        namespace: str,
        workflow_id: str,
        *,
        run_id: str | None = None,
        new_run_id: str | None = None,
        connection: object | None = None,
    ) -> RunInfo:
        """Close the current run as ``continued`` and open its successor; returns the new run."""
        return self._close(namespace, workflow_id, "continued", run_id, new_run_id, connection)

    def _close(
        self,
        namespace: str,
        workflow_id: str,
        status: str,
        run_id: str | None,
        new_run_id: str | None,
        connection: object | None,
    ) -> RunInfo:
        _identifier(namespace, "namespace")
        _identifier(workflow_id, "workflow_id")
        if run_id is not None:
            _run_id(run_id)
        successor_id = self._new_id() if new_run_id is None else _run_id(new_run_id, "new_run_id")
        now = self._clock()
        with self._locked(namespace, workflow_id, now, connection) as tx:
            return lifecycle.close_run(
                tx, status, run_id, successor_id, now, continue_as_new=status == "continued"
            )

    def apply_signal(
        self, namespace: str, workflow_id: str, command_id: str, *, connection: object | None = None
    ) -> Admission:
        """Record that the engine delivered a received signal to its (current) run.

        Applying it again is a retry and changes nothing; a signal that is not
        pending in the current open run (rejected at closure, unknown) is
        refused with :class:`RunStateError` or :class:`UnknownCommandError`.
        """
        _identifier(namespace, "namespace")
        _identifier(workflow_id, "workflow_id")
        _identifier(command_id, "command_id", bounds.ID)
        now = self._clock()
        with self._locked(namespace, workflow_id, now, connection) as tx:
            return lifecycle.apply_signal(tx, command_id, now)

    # -- admission ----------------------------------------------------------------

    def admit_signal(
        self,
        namespace: str,
        workflow_id: str,
        name: str,
        arguments: object,
        *,
        request_id: str | None = None,
        run_id: str | None = None,
        connection: object | None = None,
    ) -> Admission:
        """Admit a signal to the instance (or, with ``run_id``, to that run).

        Returns fresh (202 received), retained, ``request_id_conflict``,
        ``request_id_ambiguous``, ``run_not_active`` or ``rejected_not_current``.
        """
        return self._admit("signal", namespace, workflow_id, name, arguments, request_id, run_id, connection)

    def admit_update(
        self,
        namespace: str,
        workflow_id: str,
        name: str,
        arguments: object,
        *,
        request_id: str | None = None,
        run_id: str | None = None,
        connection: object | None = None,
    ) -> Admission:
        """Admit an update: fresh is 202 accepted; a retry after completion returns 200 completed."""
        return self._admit("update", namespace, workflow_id, name, arguments, request_id, run_id, connection)

    def _admit(
        self,
        command_type: CommandType,
        namespace: str,
        workflow_id: str,
        name: str,
        arguments: object,
        request_id: str | None,
        run_id: str | None,
        connection: object | None,
    ) -> Admission:
        item = self._prepare(command_type, namespace, workflow_id, name, arguments, request_id, run_id)
        key, token, intent = item.key, item.token, item.intent
        now = self._clock()
        if key is not None and token is not None and connection is None:
            if self._retry_share < RETRY_SHARE and getattr(self.store, "keyed_locks", False):
                # The key's receipts read in the lock's round trip (KeyedLocking).
                keyed = cast(KeyedLocking, self.store)
                with keyed.locked_unless_retained(
                    namespace, workflow_id, command_type, [token, key], created_at=now, new_id=self._new_id()
                ) as held:
                    if not isinstance(held, list):
                        self._retry_share = _share_after(self._retry_share, retry=False)
                        return self._place(held, item, now, read_before=False, last=True)
                self._retry_share = _share_after(self._retry_share, retry=True)
                known = _judge_found(namespace, workflow_id, held, intent, key, token)
            else:
                known = _judge_committed(self.store, namespace, workflow_id, intent, key, token)
                self._retry_share = _share_after(self._retry_share, retry=known is not None)
            if known is not None:
                return known
        with self.store.locked(
            namespace, workflow_id, created_at=now, new_id=self._new_id(), connection=connection
        ) as tx:
            return self._place(tx, item, now, read_before=connection is None, last=True)

    def _prepare(
        self,
        command_type: CommandType,
        namespace: str,
        workflow_id: str,
        name: str,
        arguments: object,
        request_id: str | None,
        run_id: str | None,
    ) -> Prepared:
        """Validate and digest a command (raising its typed error) before any transaction."""
        # Everything is validated before the transaction: bad input writes nothing.
        _identifier(namespace, "namespace")
        _identifier(workflow_id, "workflow_id")
        key, token = (None, None) if request_id is None else validated_token(request_id, command_type)
        target = None if run_id is None else _run_id(run_id)
        encoded, stored = intent_and_stored(command_type, name, arguments, target, self._max_size)
        # The name is stored as well as digested: it must fit its column (the digest takes any text).
        _identifier(name, "name")
        intent = Intent(command_type, name, target, encoded.digest, encoded.arguments_digest)
        return Prepared(command_type, namespace, workflow_id, name, target, key, token, intent, stored)

    def _place(
        self, tx: LockedInstance, item: Prepared, now: datetime, *, read_before: bool, last: bool = False
    ) -> Admission:
        """Decide and write one prepared command under its instance's lock (``read_before``: its
        key's committed receipts were read, without the lock, and did not answer it; ``last``: the
        transaction writes nothing after it, see :meth:`LockedInstance.insert_admitted`)."""
        command_type, name, target, stored = item.command_type, item.name, item.target, item.stored
        key, token, intent = item.key, item.token, item.intent
        # After a read before the lock, the only receipt that can have been
        # committed for this key since is a token row made by another admission,
        # and the insert below finds that one on the unique index and answers
        # with it: reading the key again under the lock would find nothing more
        # (docs/guide.md, section 4).  Inside a caller's transaction, and in a
        # batch, there was no read before, so the lock reads.
        if key is not None and token is not None and not read_before:
            known = _judge_key(tx, intent, key, token)
            if known is not None:
                return known
        instance = tx.instance
        current = tx.current_run()
        placed = judge_target(
            command_type, instance.current_run_id, current.status if current else None, target
        )
        refused = placed.reason is not None
        row = CommandRow(
            id=self._new_id(),
            instance_id=instance.id,
            run_id=placed.run_id if not refused else placed.resolved_run_id,
            command_sequence=tx.next_command_sequence(),
            command_type=command_type,
            name=name,
            target_scope="instance" if target is None else "run",
            requested_run_id=target,
            request_id=token,
            context=context_of(key),
            arguments=stored,
            status="rejected" if refused else placed.outcome,
            outcome=placed.outcome,
            rejection_reason=placed.reason,
            created_at=now,
            intent_digest=intent.digest,
            arguments_digest=intent.arguments_digest,
            intent_encoding=INTENT_VERSION,
        )
        admitted = lifecycle.admitted(tx, row, key, self._new_id, now, last=last)
        if admitted is None:
            # The unique index (contract §4): another caller committed this
            # key after the unlocked read (or wrote it outside the lock).
            # The answer is the receipt now stored, never an error.
            assert key is not None and token is not None
            known = _judge_key(tx, intent, key, token)
            if known is None:
                raise AdmissionError("receipt index reported a duplicate that cannot be read back")
            return known
        return admitted

    # -- update lifecycle -------------------------------------------------------------

    def complete_update(
        self,
        namespace: str,
        workflow_id: str,
        update_id: str,
        result: object = None,
        *,
        connection: object | None = None,
    ) -> Admission:
        """Complete an accepted update with its result (which may be ``None``).

        Completing an update twice with the same result returns the completed
        receipt again; a different result, or completing a failed update, is
        refused with :class:`RunStateError`.
        """
        encoded = canonical_encode(result, max_size=self._max_size)
        return self._finish(namespace, workflow_id, update_id, "completed", encoded, None, connection)

    def fail_update(
        self,
        namespace: str,
        workflow_id: str,
        update_id: str,
        failure: str,
        *,
        connection: object | None = None,
    ) -> Admission:
        """Fail an accepted update with a message (422 ``failed``)."""
        _identifier(failure, "failure", MAX_FAILURE_LENGTH)
        return self._finish(namespace, workflow_id, update_id, "failed", None, failure, connection)

    def _finish(
        self,
        namespace: str,
        workflow_id: str,
        update_id: str,
        status: str,
        result: bytes | None,
        failure: str | None,
        connection: object | None,
    ) -> Admission:
        _identifier(namespace, "namespace")
        _identifier(workflow_id, "workflow_id")
        _identifier(update_id, "update_id", bounds.ID)
        now = self._clock()
        with self._locked(namespace, workflow_id, now, connection) as tx:
            return lifecycle.finish_update(tx, update_id, status, result, failure, now)

    # -- retention ----------------------------------------------------------------------

    def prune(
        self,
        retention_days: int = DEFAULT_RETENTION_DAYS,
        *,
        now: datetime | None = None,
        batch_size: int = 100,
        dry_run: bool = False,
        progress: Callable[[PruneReport], None] | None = None,
        max_clock_lead: timedelta | None = DEFAULT_MAX_CLOCK_LEAD,
    ) -> PruneReport:
        """Remove the history and receipts of runs closed more than ``retention_days`` ago.

        A chain of runs linked by continue-as-new goes as a whole, once its
        last run has closed and the latest time recorded on any of its rows
        (start, close, commands, updates, events) is older than the cutoff (a
        command handed to a successor lives with it); refusals recorded while
        an instance had no run go once they are older than the cutoff.  Each
        chain is pruned in its own transaction under its instance's lock and
        recorded as a ``RunsPruned`` event; afterwards its keys are free
        (contract §5).  ``progress`` is called after every ``batch_size``
        chains.  With ``dry_run`` every deletion is made and rolled back, so
        the counts are exact and nothing changes.

        ``now`` (default: the clock) more than ``max_clock_lead`` ahead of the
        newest time the store has recorded is capped at that time plus the
        lead, and the report says so (``clock_capped``): a clock stepped
        forward must not drop receipts whose retention has not passed.
        ``None`` turns the cap off.
        """
        return prune_all(
            self.store,
            retention_days,
            self._clock() if now is None else now,
            batch_size=batch_size,
            dry_run=dry_run,
            progress=progress,
            max_clock_lead=max_clock_lead,
            new_id=self._new_id,
        )

    # -- reading ------------------------------------------------------------------------

    def receipt(
        self, namespace: str, workflow_id: str, command_type: CommandType, request_id: str
    ) -> Admission | None:
        """Read the receipt a key names, without admitting anything.

        Returns ``None`` if the key has no receipt, the retained receipt
        (``intent_verified`` says whether it carries a digest), or a
        ``request_id_ambiguous`` answer (contract §6).
        """
        _identifier(namespace, "namespace")
        _identifier(workflow_id, "workflow_id")
        key, token = validated_token(request_id, command_type)
        found = self.store.read_receipts(namespace, workflow_id, command_type, [token, key])
        selected, ambiguity = select_receipt([stored_receipt(row, key) for row, _ in found], key, token)
        if ambiguity is not None:
            return ambiguous(namespace, workflow_id, command_type, key, ambiguity)
        if selected is None:
            return None
        row, update = next((r, u) for r, u in found if r.id == selected.command_id)
        return answer(
            Decision.RETAINED,
            namespace,
            workflow_id,
            row,
            update,
            key,
            intent_verified=row.intent_digest is not None,
        )

    def history(self, namespace: str, workflow_id: str) -> list[HistoryEvent]:
        """The event log of one instance, oldest first."""
        _identifier(namespace, "namespace")
        _identifier(workflow_id, "workflow_id")
        instance = self.store.find_instance(namespace, workflow_id)
        if instance is None:
            return []
        return [
            HistoryEvent(
                e.position,
                e.event_type,
                e.run_id,
                e.command_id,
                e.update_id,
                e.recorded_at,
                canonical_decode(e.payload),
            )
            for e in self.store.read_history(instance.id)
        ]
