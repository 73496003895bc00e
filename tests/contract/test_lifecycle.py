"""Run lifecycle (contract §5): closure, continue-as-new handoff, receipts that outlive both."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

import pytest

from admission.errors import RunStateError, UnknownCommandError
from admission.receipts import AdmissionService, Decision, Store, lifecycle_diagram

pytestmark = pytest.mark.async_stores

NS = "tenant"
WF = "wf"


@pytest.fixture
def service(store: Store) -> AdmissionService:
    clock = itertools.count()
    return AdmissionService(
        store, clock=lambda: datetime(2026, 1, 1, tzinfo=UTC) + timedelta(seconds=next(clock))
    )


def events(service: AdmissionService) -> list[tuple[str, str | None]]:
    return [(e.event_type, e.command_id) for e in service.history(NS, WF)]


@pytest.mark.parametrize("status", ["completed", "failed", "cancelled", "terminated"])
def test_closing_a_run_rejects_unapplied_signals_and_keeps_their_receipts(
    service: AdmissionService, status: str
) -> None:
    run = service.start_run(NS, WF)
    applied = service.admit_signal(NS, WF, "a", [], request_id="applied")
    pending = service.admit_signal(NS, WF, "b", [1], request_id="pending")
    scoped = service.admit_signal(NS, WF, "c", [], request_id="scoped", run_id=run.run_id)
    service.apply_signal(NS, WF, applied.command_id)  # type: ignore[arg-type]
    service.close_run(NS, WF, status)
    log = events(service)
    assert ("SignalRejected", pending.command_id) in log and ("SignalRejected", scoped.command_id) in log
    assert ("SignalRejected", applied.command_id) not in log
    assert log.index(("SignalRejected", pending.command_id)) < log.index(("RunClosed", None))
    before = len(log)
    retry = service.admit_signal(NS, WF, "b", [1], request_id="pending")
    assert retry.decision is Decision.RETAINED and (retry.outcome, retry.http_status) == ("received", 202)
    assert (retry.command_id, retry.run_id, retry.received_at) == (
        pending.command_id,
        pending.run_id,
        pending.received_at,
    )
    assert retry.signal_status == "rejected" and retry.reason == "run_closed_before_signal_applied"
    assert service.admit_signal(NS, WF, "a", [], request_id="applied").signal_status == "applied"
    assert len(events(service)) == before


def test_closing_a_run_fails_updates_not_yet_completed(service: AdmissionService) -> None:
    service.start_run(NS, WF)
    update = service.admit_update(NS, WF, "resize", [2], request_id="u")
    service.close_run(NS, WF, "completed")
    retry = service.admit_update(NS, WF, "resize", [2], request_id="u")
    assert retry.retained and (retry.outcome, retry.http_status) == ("failed", 422)
    assert retry.failure == "run_closed_before_update_applied" and retry.update_id == update.update_id
    with pytest.raises(RunStateError):
        service.complete_update(NS, WF, update.update_id, 1)  # type: ignore[arg-type]


def test_continue_as_new_hands_instance_commands_to_the_successor_in_order(service: AdmissionService) -> None:
    first = service.start_run(NS, WF)
    s1 = service.admit_signal(NS, WF, "s", [1], request_id="s1")
    u1 = service.admit_update(NS, WF, "u", [1], request_id="u1")
    s2 = service.admit_signal(NS, WF, "s", [2])
    pinned = service.admit_signal(NS, WF, "s", [3], request_id="pinned", run_id=first.run_id)
    successor = service.continue_as_new(NS, WF)
    handed = [
        (e.command_id, e.payload) for e in service.history(NS, WF) if e.event_type == "CommandHandedOff"
    ]
    assert [c for c, _ in handed] == [s1.command_id, u1.command_id, s2.command_id]
    assert all(
        p
        == {
            "from_run_id": first.run_id,
            "to_run_id": successor.run_id,  # type: ignore[comparison-overlap]
            "command_sequence": p["command_sequence"],
        }
        for _, p in handed
    )  # type: ignore[index]
    # Run-scope commands stay with their run, which closed: rejected there.
    assert ("SignalRejected", pinned.command_id) in events(service)
    retry = service.admit_signal(NS, WF, "s", [3], request_id="pinned", run_id=first.run_id)
    assert retry.retained and retry.command_id == pinned.command_id and retry.signal_status == "rejected"
    # Handed-off commands are applied in the successor, and keep their identities.
    service.apply_signal(NS, WF, s1.command_id)  # type: ignore[arg-type]
    done = service.complete_update(NS, WF, u1.update_id, "ok")  # type: ignore[arg-type]
    assert done.http_status == 200
    finished = [e for e in service.history(NS, WF) if e.event_type in ("SignalApplied", "UpdateCompleted")]
    assert {e.run_id for e in finished} == {successor.run_id}
    again = service.admit_update(NS, WF, "u", [1], request_id="u1")
    assert (again.retained, again.http_status, again.result, again.run_id) == (True, 200, "ok", first.run_id)
    signal = service.admit_signal(NS, WF, "s", [1], request_id="s1")
    assert (signal.command_id, signal.run_id, signal.signal_status) == (
        s1.command_id,
        first.run_id,
        "applied",
    )


def test_a_chain_of_continuations_keeps_handing_off_until_applied(service: AdmissionService) -> None:
    first = service.start_run(NS, WF)
    signal = service.admit_signal(NS, WF, "s", {"n": 1}, request_id="k")
    runs = [service.continue_as_new(NS, WF) for _ in range(4)]
    assert len([e for e in events(service) if e == ("CommandHandedOff", signal.command_id)]) == 4
    service.apply_signal(NS, WF, signal.command_id)  # type: ignore[arg-type]
    retry = service.admit_signal(NS, WF, "s", {"n": 1}, request_id="k")
    assert (retry.retained, retry.command_id, retry.run_id, retry.received_at) == (
        True,
        signal.command_id,
        first.run_id,
        signal.received_at,
    )
    service.close_run(NS, WF, "completed")
    assert ("SignalRejected", signal.command_id) not in events(service)
    assert runs[-1].continued_from_run_id == runs[-2].run_id


def test_applying_a_signal_is_idempotent_and_checked(service: AdmissionService) -> None:
    service.start_run(NS, WF)
    signal = service.admit_signal(NS, WF, "s", [])
    first = service.apply_signal(NS, WF, signal.command_id)  # type: ignore[arg-type]
    again = service.apply_signal(NS, WF, signal.command_id)  # type: ignore[arg-type]
    assert (first.decision, again.decision, again.signal_status) == (
        Decision.FRESH,
        Decision.RETAINED,
        "applied",
    )
    assert [e for e, _ in events(service)].count("SignalApplied") == 1
    with pytest.raises(UnknownCommandError):
        service.apply_signal(NS, WF, "no-such-command")
    late = service.admit_signal(NS, WF, "s", [1])
    service.close_run(NS, WF, "terminated")
    with pytest.raises(RunStateError):
        service.apply_signal(NS, WF, late.command_id)  # type: ignore[arg-type]
    with pytest.raises(RunStateError):
        service.close_run(NS, WF, "completed")


def test_the_lifecycle_document_draws_the_codes_own_tables() -> None:
    from pathlib import Path

    document = (Path(__file__).resolve().parents[2] / "docs" / "lifecycle.md").read_text(encoding="utf-8")
    assert lifecycle_diagram() in document


def test_a_close_under_a_clock_stepped_back_is_recorded_after_everything_the_run_holds(
    store: Store,
) -> None:
    now = [datetime(2026, 1, 1, tzinfo=UTC)]
    service = AdmissionService(store, clock=lambda: now[0])
    run = service.start_run(NS, WF)
    now[0] += timedelta(hours=1)
    signal = service.admit_signal(NS, WF, "s", [], request_id="s")
    update = service.admit_update(NS, WF, "u", [], request_id="u")
    last = now[0]
    now[0] = last - timedelta(days=400)  # the clock steps back for the close
    closed = service.close_run(NS, WF, "completed")
    assert closed.closed_at == last and closed.started_at == run.started_at
    assert signal.received_at == update.received_at == last
    # Everything the close wrote carries the same time: the rejected signal, the
    # failed update, the close; the log's times never go back.
    closing = [
        e for e in service.history(NS, WF) if e.event_type in ("SignalRejected", "UpdateFailed", "RunClosed")
    ]
    assert [e.recorded_at for e in closing] == [last] * 3
    failed = service.admit_update(NS, WF, "u", [], request_id="u")
    assert failed.retained and failed.outcome == "failed" and failed.received_at == last
    # A later close (of a new run) under a clock that is right is taken as it is.
    now[0] = last + timedelta(minutes=5)
    service.start_run(NS, WF)
    assert service.close_run(NS, WF, "failed").closed_at == now[0]
