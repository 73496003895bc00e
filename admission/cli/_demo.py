"""``admission demo``: a lost response, a retry, a changed intent and a burst, on SQLite.

Everything the demo prints is read back from a real embedded SQLite database:
the answers are the service's own, the counts are ``SELECT count(*)``.
"""

from __future__ import annotations

import json
import tempfile
import threading
from pathlib import Path

from sqlalchemy import func, select

from admission.receipts._rules import Admission
from admission.receipts._service import AdmissionService
from admission.sql import SqlStore, create_admission_engine, masked_url
from admission.sql._migrate import upgrade
from admission.sql._schema import workflow_commands

__all__ = ["run_demo"]

NAMESPACE = "demo"
WORKFLOW = "order-42"


def _say(text: str = "") -> None:
    print(text)


def _brief(answer: Admission) -> str:
    parts = [f"{answer.http_status} {answer.outcome}", f"retained: {str(answer.retained).lower()}"]
    if answer.command_id:
        parts.append(f"command {answer.command_id[:8]}")
    if answer.received_at:
        parts.append(f"received_at {answer.received_at.isoformat(timespec='milliseconds')}")
    if answer.conflict:
        parts.append(f"conflict: {', '.join(answer.conflict)}")
    return ", ".join(parts)


def _commands_for(store: SqlStore, token: str | None = None) -> int:
    query = select(func.count()).select_from(workflow_commands)
    if token is not None:
        query = query.where(workflow_commands.c.request_id == token)
    with store.engine.connect() as conn:
        return int(conn.execute(query).scalar_one())


def run_demo(db_url: str | None = None, *, workers: int = 8) -> int:
    """Play the demo on ``db_url`` (default: a new SQLite file in a temporary directory)."""
    from admission.intent._keys import receipt_token

    if db_url is None:
        db_url = f"sqlite:///{Path(tempfile.mkdtemp(prefix='admission-demo-')) / 'demo.sqlite3'}"
    engine = create_admission_engine(db_url)
    upgrade(engine)
    store = SqlStore(engine)
    service = AdmissionService(store)
    _say(f"admission demo on {masked_url(db_url)}")
    _say()
    run = service.start_run(NAMESPACE, WORKFLOW)
    _say(f"Workflow {WORKFLOW!r} is running (run {run.run_id[:8]}).")
    _say()

    key = "approve-order-42"
    arguments = {"amount": 12.5, "currency": "EUR"}
    _say(f"1. A caller sends the update 'approve' {json.dumps(arguments)} with request_id {key!r}.")
    first = service.admit_update(NAMESPACE, WORKFLOW, "approve", arguments, request_id=key)
    _say(f"   The server records it: {_brief(first)}.")
    _say("   ...but the response is lost on its way back. The caller cannot tell whether it landed.")
    _say()
    _say("2. So the caller retries, with the same request_id and the same arguments.")
    retry = service.admit_update(
        NAMESPACE, WORKFLOW, "approve", {"currency": "EUR", "amount": 12.5}, request_id=key
    )
    _say(f"   -> {_brief(retry)}.")
    same = retry.command_id == first.command_id and retry.received_at == first.received_at
    _say(
        "   It is the original receipt: same command, same time." if same else "   UNEXPECTED: a new command."
    )
    _say(f"   Commands stored for this key: {_commands_for(store, receipt_token('update', key))}.")
    _say()
    _say("3. A buggy caller reuses the key for a different amount, 13.")
    conflict = service.admit_update(
        NAMESPACE, WORKFLOW, "approve", {"amount": 13, "currency": "EUR"}, request_id=key
    )
    _say(f"   -> {_brief(conflict)}.")
    _say("   Refused, and nothing was written: the key still names the first intent.")
    _say()
    burst_key = "ship-order-42"
    _say(f"4. {workers} callers send the signal 'ship' with one new request_id at the same moment.")
    answers: list[Admission] = []
    barrier = threading.Barrier(workers)

    def caller() -> None:
        barrier.wait()
        answers.append(service.admit_signal(NAMESPACE, WORKFLOW, "ship", ["dhl"], request_id=burst_key))

    threads = [threading.Thread(target=caller) for _ in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    fresh = sum(1 for a in answers if not a.retained)
    ids = {a.command_id for a in answers}
    _say(f"   -> {fresh} fresh, {len(answers) - fresh} retained, all naming {len(ids)} command.")
    stored = _commands_for(store, receipt_token("signal", burst_key))
    _say(f"   Commands stored for this key: {stored}.")
    _say()
    events = [e.event_type for e in service.history(NAMESPACE, WORKFLOW)]
    _say(f"History of {WORKFLOW!r}: {len(events)} events: {', '.join(events)}.")
    store.dispose()
    ok = same and conflict.outcome == "request_id_conflict" and fresh == 1 and len(ids) == 1 and stored == 1
    return 0 if ok else 1
