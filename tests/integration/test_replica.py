"""A read replica answers retries exactly as the primary does (docs/replicas.md).

The replica here is a *stale copy*: a second database (a SQLite file, or a
PostgreSQL database on the suite's server) holding the primary's receipt tables
as they were at some earlier moment, copied row for row.  A hypothesis state
machine runs admissions, completions, failures, releases, applications,
closures, continue-as-new and pruning on the primary, refreshes the copy now
and then (never letting it fall a retention period behind: the documented
limit), and at every check asks the same retry of three services: the
primary-only one (which may admit), then the one with the replica, then the
primary-only one again.  The last two answers must be byte-identical (the JSON
form and the typed value), and the replica must have answered exactly when
the copy held the key's receipt final and of a run open in the copy, as
restated here from the contract (a refusal; a signal applied or rejected; an
update completed).

The streaming replica with replay paused is ``test_replica_streaming.py``'s
(the extra set).
"""

from __future__ import annotations

import itertools
import json
import os
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, rule, run_state_machine_as_test
from sqlalchemy import Engine, delete, insert, select

from admission.errors import AdmissionError, InputError
from admission.intent import receipt_token
from admission.receipts import Admission, AdmissionService
from admission.sql import SqlStore, create_admission_engine, upgrade
from admission.sql._replica import ReplicaCounts, replica_engine
from admission.sql._schema import (
    workflow_commands,
    workflow_history_events,
    workflow_instances,
    workflow_runs,
    workflow_updates,
)
from tests.conftest import SUMMARY_LINES
from tests.support.backends import PostgresPool, database_url

TABLES = (workflow_instances, workflow_runs, workflow_commands, workflow_updates, workflow_history_events)
"""The receipt tables, parents first."""

NAMESPACE = "ns"
WORKFLOWS = ("w1", "w2")
KEYS = ("k1", "k2", "k3")
ARGUMENTS = ({"a": 1}, {"a": 2})
RETENTION_DAYS = 1
TICK = timedelta(hours=12)
SEEN: Counter[str] = Counter()
EXAMPLES = int(os.environ.get("REPLICA_EXAMPLES", 30))
STEPS = int(os.environ.get("REPLICA_STEPS", 30))


def copy_tables(source: Engine, target: Engine) -> None:
    """Make ``target``'s receipt tables hold ``source``'s rows as they are now (one snapshot)."""
    with source.connect() as conn, conn.begin():
        rows = {table.name: [dict(r) for r in conn.execute(select(table)).mappings()] for table in TABLES}
    with target.begin() as conn:
        for table in reversed(TABLES):
            conn.execute(delete(table))
        for table in TABLES:
            if rows[table.name]:
                conn.execute(insert(table), rows[table.name])


def clear(engine: Engine) -> None:
    with engine.begin() as conn:
        for table in reversed(TABLES):
            conn.execute(delete(table))


def wire(answer: Admission | None) -> str:
    """The bytes a caller sees: the JSON form."""
    return "null" if answer is None else json.dumps(answer.to_dict(), ensure_ascii=False, default=str)


@dataclass
class Databases:
    primary: str
    copy: str


@pytest.fixture
def databases(sql_backend: str, postgres_pool: PostgresPool, tmp_path: Path) -> Databases:
    (tmp_path / "primary").mkdir()
    (tmp_path / "copy").mkdir()
    return Databases(
        database_url(sql_backend, postgres_pool, tmp_path / "primary"),
        database_url(sql_backend, postgres_pool, tmp_path / "copy"),
    )


def copy_says_final(copy: Engine, workflow: str, command_type: str, key: str, token: str) -> bool:
    """Whether the copy holds the key's receipt final and of a run open in the copy: what the
    contract makes immutable (§4: refusals are retained as they are; §5: an update completed;
    docs/lifecycle.md: a signal applied or rejected has no transition left, a failed update's
    key can still be released), restated here rather than asked of admission."""
    c, u, r = workflow_commands, workflow_updates, workflow_runs
    columns = (c.c.outcome, c.c.status, c.c.command_type, u.c.status.label("update_status"))
    query = (
        select(*columns, r.c.status.label("run"))
        .select_from(
            c.join(workflow_instances)
            .outerjoin(u, u.c.command_id == c.c.id)
            .outerjoin(r, r.c.id == c.c.run_id)
        )
        .where(
            workflow_instances.c.namespace == NAMESPACE,
            workflow_instances.c.workflow_id == workflow,
            c.c.command_type == command_type,
            c.c.request_id.in_([token, key]),
        )
    )
    with copy.connect() as conn:
        rows = conn.execute(query).mappings().all()

    def final(row: Any) -> bool:
        if row["outcome"] in ("run_not_active", "rejected_not_current"):
            return True
        if row["command_type"] == "signal":
            return row["status"] in ("applied", "rejected")
        return row["update_status"] == "completed"

    return bool(rows) and all(row["run"] == "open" and final(row) for row in rows)


class ReplicaMachine(RuleBasedStateMachine):
    """Operations on the primary; checks that compare the replica's answers with the primary's."""

    def __init__(self, primary: SqlStore, replicated: SqlStore, copy: Engine) -> None:
        super().__init__()
        self.now = datetime(2026, 1, 1, tzinfo=UTC)
        ids = itertools.count()
        clock = lambda: self.now  # noqa: E731 - the machine moves time
        self.primary = AdmissionService(primary, clock=clock, new_id=lambda: f"id-{next(ids)}")
        self.replicated = AdmissionService(replicated, clock=clock, new_id=lambda: f"id-{next(ids)}")
        self.store = replicated
        self.copy = copy
        self.copied_at = self.now
        self.updates: list[tuple[str, str]] = []
        self.signals: list[tuple[str, str]] = []
        self.runs: list[str] = []
        self.sent: list[tuple[str, str, bool, str | None]] = []  # (workflow, key, update, run_id)
        clear(primary.engine)
        clear(copy)
        self.before = replicated.replica_counts()

    @initialize()
    def start(self) -> None:
        for workflow in WORKFLOWS:
            self.runs.append(self.primary.start_run(NAMESPACE, workflow).run_id)

    def _try(self, call: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return call(*args, **kwargs)
        except AdmissionError:
            return None  # a lifecycle call that does not fit the run: nothing changes

    @rule(
        workflow=st.sampled_from(WORKFLOWS),
        key=st.sampled_from(KEYS),
        arguments=st.sampled_from(ARGUMENTS),
        update=st.booleans(),
        scoped=st.booleans(),
    )
    def admit(self, workflow: str, key: str, arguments: dict[str, int], update: bool, scoped: bool) -> None:
        admit = self.primary.admit_update if update else self.primary.admit_signal
        run_id = self.runs[-1] if scoped and self.runs else None
        if (workflow, key, update, run_id) not in self.sent:
            self.sent.append((workflow, key, update, run_id))
        answer = admit(NAMESPACE, workflow, "cmd", arguments, request_id=key, run_id=run_id)
        if answer.update_id is not None:
            self.updates.append((workflow, answer.update_id))
        if answer.command_type == "signal" and answer.command_id is not None:
            self.signals.append((workflow, answer.command_id))

    @rule(data=st.data(), how=st.sampled_from(["complete", "fail", "release"]), copy=st.booleans())
    def finish(self, data: st.DataObject, how: str, copy: bool) -> None:
        """An update completes, fails or has its key released (then, if ``copy``, the copy is refreshed)."""
        if not self.updates:
            return
        workflow, update_id = data.draw(st.sampled_from(self.updates))
        if how == "complete":
            self._try(self.primary.complete_update, NAMESPACE, workflow, update_id, {"r": 1})
        elif how == "fail":
            self._try(self.primary.fail_update, NAMESPACE, workflow, update_id, "no")
        else:
            self._try(self.primary.release_update, NAMESPACE, workflow, update_id)
        if copy:
            self.snapshot()

    @rule(data=st.data(), copy=st.booleans())
    def apply(self, data: st.DataObject, copy: bool) -> None:
        """A signal is applied (then, if ``copy``, the copy is refreshed)."""
        if self.signals:
            workflow, command_id = data.draw(st.sampled_from(self.signals))
            self._try(self.primary.apply_signal, NAMESPACE, workflow, command_id)
            if copy:
                self.snapshot()

    @rule(workflow=st.sampled_from(WORKFLOWS), how=st.sampled_from(["close", "continue", "start"]))
    def lifecycle(self, workflow: str, how: str) -> None:
        if how == "close":
            self._try(self.primary.close_run, NAMESPACE, workflow, "completed")
        elif how == "continue":
            run = self._try(self.primary.continue_as_new, NAMESPACE, workflow)
            if run is not None:
                self.runs.append(run.run_id)
        else:
            run = self._try(self.primary.start_run, NAMESPACE, workflow)
            if run is not None:
                self.runs.append(run.run_id)

    @rule(prune=st.booleans())
    def tick(self, prune: bool) -> None:
        """Time passes (and, if ``prune``, retention prunes what it may)."""
        self.now += TICK
        if self.now - self.copied_at >= timedelta(days=RETENTION_DAYS):
            # The documented limit: a replica lags less than the retention pruning uses.
            self.snapshot()
        if prune:
            self.primary.prune(RETENTION_DAYS, max_clock_lead=None)

    @rule()
    def snapshot(self) -> None:
        copy_tables(self.primary.store.engine, self.copy)  # type: ignore[attr-defined]
        self.copied_at = self.now

    @rule(data=st.data())
    def retry(self, data: st.DataObject) -> None:
        """Retries of commands sent before (their arguments drawn again: the same, or a conflict)."""
        if not self.sent:
            return
        for sent in data.draw(st.lists(st.sampled_from(self.sent), min_size=1, max_size=4, unique=True)):
            self.check(*sent, data.draw(st.sampled_from(ARGUMENTS)))

    def check(
        self, workflow: str, key: str, update: bool, run_id: str | None, arguments: dict[str, int]
    ) -> None:
        command_type = "update" if update else "signal"
        first = self.primary.admit_update if update else self.primary.admit_signal
        first(NAMESPACE, workflow, "cmd", arguments, request_id=key, run_id=run_id)  # may admit
        expected = copy_says_final(self.copy, workflow, command_type, key, receipt_token(command_type, key))
        before = self.store.replica_counts()
        assert before is not None
        again = self.replicated.admit_update if update else self.replicated.admit_signal
        replicated = again(NAMESPACE, workflow, "cmd", arguments, request_id=key, run_id=run_id)
        truth = first(NAMESPACE, workflow, "cmd", arguments, request_id=key, run_id=run_id)
        assert wire(replicated) == wire(truth)
        assert replicated == truth
        read = self.replicated.receipt(NAMESPACE, workflow, command_type, key)
        assert wire(read) == wire(self.primary.receipt(NAMESPACE, workflow, command_type, key))
        after = self.store.replica_counts()
        assert after is not None
        assert after.answered - before.answered == (2 if expected else 0)
        assert after.unavailable == before.unavailable
        state = truth.signal_status or truth.update_status or truth.outcome
        label = f"{'replica' if expected else 'primary'}: {truth.decision} {state}"
        event(label)
        SEEN[label] += 1


def test_a_stale_copy_answers_every_retry_as_the_primary_does(databases: Databases) -> None:
    primary = SqlStore.open(databases.primary)
    replicated = SqlStore.open(databases.primary, read_url=databases.copy)
    copy = create_admission_engine(databases.copy)
    answered: list[int] = []

    class Machine(ReplicaMachine):
        def __init__(self) -> None:
            super().__init__(primary, replicated, copy)

        def teardown(self) -> None:
            counts = self.store.replica_counts()
            assert counts is not None
            answered.append(counts.answered)

    try:
        run_state_machine_as_test(
            Machine,
            settings=settings(
                max_examples=EXAMPLES, stateful_step_count=STEPS, deadline=None, derandomize=True
            ),
        )
    finally:
        primary.dispose()
        replicated.dispose()
        copy.dispose()
    SUMMARY_LINES.append(f"replica machine ({databases.primary.split(':')[0]}): {dict(sorted(SEEN.items()))}")
    SEEN.clear()
    # The property is not vacuous: the copy answered final retries.
    assert answered[-1] > 0


def completed_update(store: SqlStore) -> tuple[AdmissionService, Admission]:
    service = AdmissionService(store)
    service.start_run(NAMESPACE, "w1")
    accepted = service.admit_update(NAMESPACE, "w1", "cmd", {"a": 1}, request_id="k1")
    assert accepted.update_id is not None
    service.complete_update(NAMESPACE, "w1", accepted.update_id, {"r": 1})
    return service, service.admit_update(NAMESPACE, "w1", "cmd", {"a": 1}, request_id="k1")


def test_an_unreachable_replica_falls_back_to_the_primary_and_is_tried_again_after_its_interval(
    databases: Databases, tmp_path: Path
) -> None:
    primary = SqlStore.open(databases.primary)
    _, truth = completed_update(primary)
    # A replica that cannot be reached: a SQLite file in a directory that does not exist yet,
    # or a PostgreSQL port nothing listens on.
    if databases.copy.startswith("sqlite"):
        missing = tmp_path / "later" / "copy.sqlite3"
        read_url, reachable = f"sqlite:///{missing}", f"sqlite:///{missing}"
    else:
        read_url, reachable = (
            databases.copy.replace(databases.copy.split("@")[1].split("/")[0], "127.0.0.1:1"),
            None,
        )
    copy = create_admission_engine(databases.copy)
    copy_tables(primary.engine, copy)
    waiting = SqlStore(
        create_admission_engine(databases.primary),
        read_engine=replica_engine(read_url, {}),
        replica_retry=3600.0,
    )
    eager = SqlStore(
        create_admission_engine(databases.primary),
        read_engine=replica_engine(read_url, {}),
        replica_retry=0.0,
    )
    try:
        for store in (waiting, eager):
            answer = AdmissionService(store).admit_update(NAMESPACE, "w1", "cmd", {"a": 1}, request_id="k1")
            assert wire(answer) == wire(truth)
            assert store.replica_counts() == ReplicaCounts(answered=0, primary=0, unavailable=1)
        if reachable is not None:
            # The replica comes back: the store that waits its interval does not try it yet; the
            # one whose interval has passed answers from it.
            missing.parent.mkdir()
            later = create_admission_engine(reachable)
            upgrade(later)
            copy_tables(primary.engine, later)
            later.dispose()
            for store, counts in ((waiting, ReplicaCounts(0, 0, 2)), (eager, ReplicaCounts(1, 0, 1))):
                answer = AdmissionService(store).admit_update(
                    NAMESPACE, "w1", "cmd", {"a": 1}, request_id="k1"
                )
                assert wire(answer) == wire(truth)
                assert store.replica_counts() == counts
    finally:
        for store in (primary, waiting, eager):
            store.dispose()
        copy.dispose()


def test_the_async_store_answers_final_retries_from_its_replica(databases: Databases) -> None:
    import asyncio

    from admission.aio import AsyncAdmissionService, open_store, run_sync

    primary = SqlStore.open(databases.primary)
    _, truth = completed_update(primary)
    copy = create_admission_engine(databases.copy)
    copy_tables(primary.engine, copy)
    copy.dispose()

    async def retried() -> tuple[Admission, ReplicaCounts | None]:
        store = await open_store(databases.primary, read_url=databases.copy)
        try:
            answer = await AsyncAdmissionService(store).admit_update(
                NAMESPACE, "w1", "cmd", {"a": 1}, request_id="k1"
            )
            return answer, await run_sync(store.sync.replica_counts)  # type: ignore[attr-defined]
        finally:
            await store.dispose()

    try:
        answer, counts = asyncio.run(retried())
    finally:
        primary.dispose()
    assert wire(answer) == wire(truth)
    assert counts == ReplicaCounts(answered=1, primary=0, unavailable=0)


def test_a_read_url_that_cannot_be_used_is_refused_naming_read_url(
    databases: Databases, tmp_path: Path
) -> None:
    with pytest.raises(InputError) as caught:
        SqlStore.open(databases.primary, read_url="nosuchdb://x")
    assert caught.value.field == "read_url"
    if databases.primary.startswith("postgresql"):
        other = create_admission_engine(f"sqlite:///{tmp_path / 'other.sqlite3'}")
        with pytest.raises(InputError) as refused:
            SqlStore(create_admission_engine(databases.primary), read_engine=other)
        assert refused.value.field == "read_engine"


def test_serve_takes_its_replica_from_the_environment_and_answers_a_retry_as_the_primary(
    tmp_path: Path,
) -> None:
    """The command line's wiring (the library's routing is the tests' above): on SQLite only."""
    import httpx

    from tests.integration.test_http import NS as HTTP_NS
    from tests.integration.test_http import json_input, serving
    from tests.support.backends import sqlite_url

    databases = Databases(sqlite_url(tmp_path), sqlite_url(tmp_path))
    primary = SqlStore.open(databases.primary)
    service = AdmissionService(primary)
    service.start_run(HTTP_NS, "wf-1")
    body = {"request_id": "u-1", "input": json_input({"amount": 5})}
    try:
        with serving(databases.primary) as (base, announced), httpx.Client(base_url=base) as http:
            assert announced["read_database"] is None
            first = http.post(
                "/api/workflows/wf-1/update/approve", json=body, headers={"X-Namespace": HTTP_NS}
            )
            accepted = first.json()
            service.complete_update(HTTP_NS, "wf-1", accepted["update_id"], {"ok": True})
            truth = http.post(
                "/api/workflows/wf-1/update/approve", json=body, headers={"X-Namespace": HTTP_NS}
            )
        copy = create_admission_engine(databases.copy)
        copy_tables(primary.engine, copy)
        copy.dispose()
        with (
            serving(databases.primary, env={"ADMISSION_READ_DB": databases.copy}) as (base, announced),
            httpx.Client(base_url=base) as http,
        ):
            assert announced["read_database"] == databases.copy  # no password here to mask
            retry = http.post(
                "/api/workflows/wf-1/update/approve", json=body, headers={"X-Namespace": HTTP_NS}
            )
    finally:
        primary.dispose()
    assert truth.status_code == retry.status_code == 200
    assert retry.content == truth.content
