"""Every text column admission creates has one declared bound, and its validator holds it.

The walk goes over the SQLAlchemy metadata of every table: each text column
is either fed by input (:data:`PROBES`: the public call that stores a value
in it, the field its refusal names, the bound it declares) or written by the
library only (:data:`INTERNAL`: the values it can hold).  The column's width
must be the probe's bound; the probe must store exactly that many
characters and refuse one more, a NUL and a lone surrogate, naming the
field, on memory, SQLite and PostgreSQL alike.  A hypothesis property then
feeds any string to each probe on all three backends at once and asks for
one answer.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import JSON, LargeBinary, String, Text

from admission import _bounds as bounds
from admission.errors import AdmissionError, InputError
from admission.intent import receipt_token
from admission.jobs import Job, JobService, JobState, JobStore, MemoryJobStore
from admission.receipts import AdmissionService, MemoryStore, RunStatus, SignalStatus, Store, UpdateStatus
from admission.sql import SqlJobStore, SqlStore, SqlWorkerStore, metadata
from admission.testing import FaultyTarget
from admission.worker import (
    DurableWorker,
    MemoryWorkerStore,
    OutboxRelay,
    Scope,
    SqliteTarget,
    WorkerStore,
    record_outbox,
)
from admission.worker._states import WriteState
from tests.support.backends import SQL_BACKENDS, PostgresPool, database_url

NS = "ns"
SCOPE = {"tenant": "t1"}


class Bench:
    """The stores of one backend, and fresh names so that probes never collide."""

    def __init__(self, url: str | None, directory: Path) -> None:
        self.receipts: Store = MemoryStore() if url is None else SqlStore.open(url)
        self.workers: WorkerStore = MemoryWorkerStore() if url is None else SqlWorkerStore.open(url)
        self.jobs_store: JobStore = MemoryJobStore() if url is None else SqlJobStore.open(url)
        self.directory = directory
        self._names = itertools.count()

    def fresh(self, prefix: str) -> str:
        return f"{prefix}{next(self._names)}"

    def service(self, **options: object) -> AdmissionService:
        return AdmissionService(self.receipts, **options)  # type: ignore[arg-type]

    def worker(self, scope: dict[str, str] | None = None, **options: object) -> DurableWorker:
        options.setdefault("queue", self.fresh("q"))
        return DurableWorker(self.workers, Scope.parse(scope or SCOPE), file_lock=False, **options)  # type: ignore[arg-type]

    def jobs(self, **options: object) -> JobService:
        return JobService(self.jobs_store, **options)  # type: ignore[arg-type]

    def close(self) -> None:
        for store in (self.receipts, self.workers, self.jobs_store):
            dispose = getattr(store, "dispose", None)
            if dispose is not None:
                dispose()


# -- the probes: one public call that stores the value in the column --------------------------------


def _record(key: str, scope: dict[str, str] = SCOPE) -> dict[str, object]:
    return {**scope, "source_key": key, "payload": {"n": 1}}


def _namespace(b: Bench, v: str) -> None:
    b.service().start_run(v, b.fresh("wf"))


def _workflow_id(b: Bench, v: str) -> None:
    b.service().start_run(NS, v)


def _run_id(b: Bench, v: str) -> None:
    wf = b.fresh("wf")
    service = b.service()
    service.start_run(NS, wf, run_id=v)
    service.admit_signal(NS, wf, "go", {}, request_id="k", run_id=v)
    service.continue_as_new(NS, wf, run_id=v)


def _name(b: Bench, v: str) -> None:
    wf = b.fresh("wf")
    service = b.service()
    service.start_run(NS, wf)
    service.admit_update(NS, wf, v, {}, request_id="k")


def _failure(b: Bench, v: str) -> None:
    wf = b.fresh("wf")
    service = b.service()
    service.start_run(NS, wf)
    update_id = service.admit_update(NS, wf, "go", {}).update_id
    assert update_id is not None
    service.fail_update(NS, wf, update_id, v)


def _receipt_ids(b: Bench, v: str) -> None:
    wf = b.fresh("wf")
    service = b.service(new_id=lambda: v)
    service.start_run(NS, wf)
    service.admit_update(NS, wf, "go", {})


def _queue(b: Bench, v: str) -> None:
    b.worker(queue=v).accept(_record(b.fresh("k")))


def _holder(b: Bench, v: str) -> None:
    b.worker(holder=v).claim()


def _tenant(b: Bench, v: str) -> None:
    scope = {"tenant": v}
    b.worker(scope).accept(_record("k", scope))


def _source_key(b: Bench, v: str) -> None:
    b.worker(queue="default").accept(_record(v))


def _write_id(b: Bench, v: str) -> None:
    b.worker(new_id=lambda: v).accept(_record("k"))


def _actor(b: Bench, v: str) -> None:
    worker = b.worker()
    write_id = worker.accept(_record("k")).write_id
    worker.run_once(FaultyTarget(SqliteTarget(b.directory / f"{b.fresh('target')}.sqlite3"), "timeout"))
    worker.resolve(write_id, "release", actor=v, reason="checked")


def _consumer(b: Bench, v: str) -> None:
    worker = b.worker()
    wf = b.fresh("wf")
    AdmissionService(b.receipts).start_run(NS, wf)
    record_outbox(b.receipts, None, NS, wf, target="crm", source_key="k", content=_record("k"))
    OutboxRelay(b.receipts, worker, target="crm", consumer=v).pump()


def _job_id(b: Bench, v: str) -> None:
    jobs = b.jobs()
    # A scope of its own for each probe that claims: one running job per scope.
    scope = b.fresh("s")
    jobs.enqueue_all([Job(v, scope, "k"), Job(b.fresh("j"), scope, "k", depends_on=(v,))])
    jobs.claim(v)


def _job_scope(b: Bench, v: str) -> None:
    b.jobs().enqueue(Job(b.fresh("j"), v, "k"))


def _kind(b: Bench, v: str) -> None:
    b.jobs().enqueue(Job(b.fresh("j"), "s", v))


def _owner(b: Bench, v: str) -> None:
    jobs = b.jobs(owner=v)
    job_id = b.fresh("j")
    jobs.enqueue(Job(job_id, b.fresh("s"), "k"))
    jobs.claim(job_id)


def _attempt_id(b: Bench, v: str) -> None:
    jobs = b.jobs(new_id=lambda: v)
    job_id = b.fresh("j")
    jobs.enqueue(Job(job_id, b.fresh("s"), "k"))
    jobs.claim(job_id)


def _diagnostic(b: Bench, v: str) -> None:
    jobs = b.jobs()
    job_id = b.fresh("j")
    jobs.enqueue(Job(job_id, b.fresh("s"), "k"))
    lease = jobs.claim(job_id).lease
    assert lease is not None
    jobs.fail(lease, v, retryable=False)


@dataclass(frozen=True)
class Probe:
    """A public call that stores its value in some columns, the field its refusal names, its bound."""

    field: str
    width: int
    write: Callable[[Bench, str], None]


NAMESPACE = Probe("namespace", bounds.NAME, _namespace)
RUN_ID = Probe("run_id", bounds.ID, _run_id)
RECEIPT_IDS = Probe("new_id", bounds.ID, _receipt_ids)
JOB_ID = Probe("job_id", bounds.JOB_ID, _job_id)
ATTEMPT_ID = Probe("new_id", bounds.ID, _attempt_id)
QUEUE = Probe("queue", bounds.NAME, _queue)
WRITE_ID = Probe("new_id", bounds.ID, _write_id)
OWNER = Probe("owner", bounds.JOB_ID, _owner)
DIAGNOSTIC = Probe("diagnostic", bounds.TEXT, _diagnostic)

PROBES: dict[tuple[str, str], Probe] = {
    ("workflow_instances", "id"): RECEIPT_IDS,
    ("workflow_instances", "namespace"): NAMESPACE,
    ("workflow_instances", "workflow_id"): Probe("workflow_id", bounds.NAME, _workflow_id),
    ("workflow_instances", "current_run_id"): RUN_ID,
    ("workflow_runs", "id"): RUN_ID,
    ("workflow_runs", "instance_id"): RECEIPT_IDS,
    ("workflow_runs", "continued_from_run_id"): RUN_ID,
    ("workflow_commands", "id"): RECEIPT_IDS,
    ("workflow_commands", "instance_id"): RECEIPT_IDS,
    ("workflow_commands", "run_id"): RUN_ID,
    ("workflow_commands", "name"): Probe("name", bounds.NAME, _name),
    ("workflow_commands", "requested_run_id"): RUN_ID,
    ("workflow_updates", "id"): RECEIPT_IDS,
    ("workflow_updates", "command_id"): RECEIPT_IDS,
    ("workflow_updates", "instance_id"): RECEIPT_IDS,
    ("workflow_updates", "run_id"): RUN_ID,
    ("workflow_updates", "name"): Probe("name", bounds.NAME, _name),
    ("workflow_updates", "failure"): Probe("failure", bounds.TEXT, _failure),
    ("workflow_history_events", "namespace"): NAMESPACE,
    ("workflow_history_events", "instance_id"): RECEIPT_IDS,
    ("workflow_history_events", "run_id"): RUN_ID,
    ("workflow_history_events", "command_id"): RECEIPT_IDS,
    ("workflow_history_events", "update_id"): RECEIPT_IDS,
    ("worker_queues", "queue"): QUEUE,
    ("worker_leases", "queue"): QUEUE,
    ("worker_leases", "holder"): Probe("holder", bounds.NAME, _holder),
    ("worker_records", "write_id"): WRITE_ID,
    ("worker_records", "queue"): QUEUE,
    ("worker_records", "tenant"): Probe("scope.tenant", bounds.NAME, _tenant),
    ("worker_records", "source_key"): Probe("source_key", bounds.NAME, _source_key),
    ("worker_events", "queue"): QUEUE,
    ("worker_events", "write_id"): WRITE_ID,
    ("worker_events", "actor"): Probe("actor", bounds.NAME, _actor),
    ("outbox_cursors", "consumer"): Probe("consumer", bounds.NAME, _consumer),
    ("worker_job_scopes", "scope"): Probe("scope", bounds.NAME, _job_scope),
    ("worker_jobs", "job_id"): JOB_ID,
    ("worker_jobs", "scope"): Probe("scope", bounds.NAME, _job_scope),
    ("worker_jobs", "kind"): Probe("kind", bounds.JOB_ID, _kind),
    ("worker_jobs", "owner"): OWNER,
    ("worker_jobs", "attempt_id"): ATTEMPT_ID,
    ("worker_jobs", "publish_attempt_id"): ATTEMPT_ID,
    ("worker_jobs", "diagnostic"): DIAGNOSTIC,
    ("worker_job_dependencies", "job_id"): JOB_ID,
    ("worker_job_dependencies", "depends_on"): JOB_ID,
    ("worker_job_attempts", "attempt_id"): ATTEMPT_ID,
    ("worker_job_attempts", "job_id"): JOB_ID,
    ("worker_job_attempts", "owner"): OWNER,
    ("worker_job_attempts", "diagnostic"): DIAGNOSTIC,
    ("worker_job_checkpoints", "job_id"): JOB_ID,
    ("worker_job_checkpoints", "attempt_id"): ATTEMPT_ID,
    ("worker_job_events", "job_id"): JOB_ID,
    ("worker_job_events", "attempt_id"): ATTEMPT_ID,
    ("worker_job_events", "detail"): DIAGNOSTIC,
}
"""Text columns a caller's value reaches (directly, or through ``new_id``)."""

_TOKENS = [receipt_token("signal", "k"), receipt_token("update", "k")]
_WRITE_STATES = [str(s) for s in WriteState]
_JOB_STATES = [str(s) for s in JobState]

INTERNAL: dict[tuple[str, str], list[str]] = {
    ("workflow_runs", "status"): [str(s) for s in RunStatus],
    ("workflow_commands", "command_type"): ["signal", "update"],
    ("workflow_commands", "target_scope"): ["instance", "run"],
    ("workflow_commands", "request_id"): _TOKENS,
    ("workflow_commands", "status"): [str(s) for s in (*SignalStatus, *UpdateStatus)],
    ("workflow_commands", "outcome"): ["received", "accepted", "rejected_not_current", "run_not_active"],
    ("workflow_commands", "rejection_reason"): ["rejected_not_current", "run_not_active"],
    ("workflow_commands", "intent_digest"): ["0" * 64],
    ("workflow_commands", "arguments_digest"): ["0" * 64],
    ("workflow_commands", "intent_encoding"): ["intent-v1"],
    ("workflow_updates", "status"): [str(s) for s in UpdateStatus],
    ("workflow_history_events", "event_type"): ["SignalReceived", "UpdateAccepted", "CommandRejected"],
    ("worker_records", "state"): _WRITE_STATES,
    ("worker_records", "diagnostic"): ["cut by bounded_text to WorkerLimits.max_diagnostic <= TEXT"],
    ("worker_records", "poll_health"): ["ok", "degraded"],
    ("worker_events", "event_type"): ["accepted", "resolve_release"],
    ("worker_events", "from_state"): _WRITE_STATES,
    ("worker_events", "to_state"): _WRITE_STATES,
    ("worker_events", "reason"): ["cut by bounded_text to WorkerLimits.max_diagnostic <= TEXT"],
    ("worker_jobs", "state"): _JOB_STATES,
    ("worker_jobs", "reason"): ["inconsistent_publication", "attempts_exhausted"],
    ("worker_job_attempts", "outcome"): ["lease_expired", "retryable_failure", "completed"],
    ("worker_job_events", "event"): ["inconsistent_publication", "resolve_completed"],
    ("worker_job_events", "from_state"): _JOB_STATES,
    ("worker_job_events", "to_state"): _JOB_STATES,
    ("worker_job_events", "reason"): ["inconsistent_publication", "attempts_exhausted"],
}
"""Text columns only the library writes, with the (longest) values it writes there."""

_TEXT_TYPES = (String, Text, JSON)


def _text_columns() -> Iterator[tuple[str, str, int | None]]:
    for table in metadata.sorted_tables:
        for column in table.columns:
            if isinstance(column.type, _TEXT_TYPES) and not isinstance(column.type, LargeBinary):
                yield table.name, column.name, getattr(column.type, "length", None)


_DECLARED = {value for name, value in vars(bounds).items() if name.isupper() and isinstance(value, int)}


def test_every_text_column_is_probed_or_internal_and_declares_a_bound_of_the_probes_width() -> None:
    columns = list(_text_columns())
    assert len(columns) > 60  # the walk saw the whole schema
    for table, column, width in columns:
        where = f"{table}.{column}"
        assert width in _DECLARED, f"{where}: width {width} is not a bound declared in admission._bounds"
        assert ((table, column) in PROBES) != ((table, column) in INTERNAL), f"{where}: classify it"
        if (table, column) in PROBES:
            assert PROBES[table, column].width == width, f"{where}: the validator's bound is not the column's"
        else:
            assert max(len(v) for v in INTERNAL[table, column]) <= width, where
    assert set(PROBES) | set(INTERNAL) == {(t, c) for t, c, _ in columns}


def test_internal_states_fit_their_columns() -> None:
    assert max(len(s) for s in _WRITE_STATES) <= bounds.WRITE_STATE
    assert max(len(s) for s in _JOB_STATES) <= bounds.JOB_STATE
    assert max(len(s) for s in RunStatus) <= bounds.STATUS
    assert len(_TOKENS[0]) <= bounds.TOKEN


# -- each probe holds its bound on every backend ------------------------------------------------------


@pytest.fixture
def bench(backend_url: str | None, tmp_path: Path) -> Iterator[Bench]:
    built = Bench(backend_url, tmp_path)
    yield built
    built.close()


def _unique_probes() -> list[tuple[str, Probe]]:
    seen: dict[int, tuple[str, Probe]] = {}
    for (table, column), probe in PROBES.items():
        seen.setdefault(id(probe), (f"{table}.{column}", probe))
    return sorted(seen.values(), key=lambda pair: pair[0])


UNIQUE = _unique_probes()


def _fill(width: int, seed: str) -> str:
    return (seed * width)[:width]


@pytest.mark.parametrize(("column", "probe"), UNIQUE, ids=[c for c, _ in UNIQUE])
def test_a_probe_stores_exactly_its_width_and_refuses_more_nul_and_lone_surrogates(
    bench: Bench, column: str, probe: Probe
) -> None:
    probe.write(bench, _fill(probe.width, "a"))
    for bad in (_fill(probe.width + 1, "b"), "c\x00d", "e\ud800f"):
        with pytest.raises(InputError) as refused:
            probe.write(bench, bad)
        assert refused.value.field == probe.field, (column, refused.value)


# -- the same answer on every backend, for any string ----------------------------------------------------


def _answer(probe: Probe, bench: Bench, value: str) -> str:
    try:
        probe.write(bench, value)
    except InputError as exc:
        return f"refused {exc.field}"
    except AdmissionError as exc:
        return type(exc).__name__
    return "accepted"


@pytest.fixture
def benches(postgres_pool: PostgresPool, tmp_path: Path) -> Iterator[dict[str, Bench]]:
    built = {"memory": Bench(None, tmp_path / "memory")}
    (tmp_path / "memory").mkdir()
    for backend in SQL_BACKENDS:
        (tmp_path / backend).mkdir()
        built[backend] = Bench(database_url(backend, postgres_pool, tmp_path / backend), tmp_path / backend)
    yield built
    for bench in built.values():
        bench.close()


def _value(width: int) -> st.SearchStrategy[str]:
    around = st.sampled_from([width - 1, width, width + 1]).flatmap(
        lambda n: st.text(st.sampled_from("ab\x00\ud800é\U0001f600"), min_size=n, max_size=n)
    )
    short = st.text(st.characters(blacklist_categories=()), max_size=8)
    return st.one_of(short, around)


@pytest.mark.parametrize(("column", "probe"), UNIQUE, ids=[c for c, _ in UNIQUE])
def test_any_string_gets_one_answer_on_memory_sqlite_and_postgresql(
    benches: dict[str, Bench], column: str, probe: Probe
) -> None:
    answers: dict[str, dict[str, str]] = {}

    @settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(_value(probe.width))
    def one_answer(value: str) -> None:
        # A replayed value keeps its first answers: the stores remember what the first try wrote.
        if value not in answers:
            answers[value] = {name: _answer(probe, bench, value) for name, bench in benches.items()}
        assert len(set(answers[value].values())) == 1, (column, value, answers[value])

    one_answer()
