"""Logs, spans and metrics (docs/observability.md): the exact spans and counts of a known sequence,
the same spans from the asyncio service, nothing secret in any log line, nothing of OpenTelemetry
imported when it is absent, and the version line naming the C accelerator's state.

The spans and measurements go to the SDK's in-memory exporter and reader, through providers handed
to :func:`admission.telemetry.configure` for each test (OpenTelemetry's global providers can be set
only once per process).
"""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import admission
from admission import AdmissionService, MemoryStore, telemetry
from admission.aio import AsyncAdmissionService
from admission.cli import main
from admission.errors import InputError, InvalidValueError, RetryableJobError, RunStateError, StorageError
from admission.intent import receipt_token
from admission.jobs import Job, JobRunner, MemoryJobStore
from admission.receipts import utc_now
from admission.testing import FaultyTarget, MemoryPublisher
from admission.worker import DurableWorker, MemoryWorkerStore, Scope, SqliteTarget
from tests.support.jobkit import Counting, jobs_on

NS = "payments"


@dataclass
class Recorded:
    exporter: InMemorySpanExporter
    reader: InMemoryMetricReader
    tracer_provider: TracerProvider

    def spans(self) -> list[tuple[str, dict[str, Any], str]]:
        """Every finished span: name, attributes, status, in the order they ended."""
        return [(s.name, dict(s.attributes or {}), s.status.status_code.name) for s in self.finished()]

    def finished(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())

    def points(self, name: str) -> dict[frozenset[tuple[str, Any]], int]:
        """The points of instrument ``name``: attributes -> the counter's value or the histogram's count."""
        found: dict[frozenset[tuple[str, Any]], int] = {}
        data = self.reader.get_metrics_data()
        for resource in data.resource_metrics if data else ():
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    if metric.name != name:
                        continue
                    for point in metric.data.data_points:
                        value = getattr(point, "count", None)
                        found[frozenset((point.attributes or {}).items())] = int(
                            point.value if value is None else value  # type: ignore[union-attr]
                        )
        return found

    def units(self) -> dict[str, str]:
        data = self.reader.get_metrics_data()
        return {
            metric.name: metric.unit or ""
            for resource in (data.resource_metrics if data else ())
            for scope in resource.scope_metrics
            for metric in scope.metrics
        }


@pytest.fixture
def otel() -> Iterator[Recorded]:
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])
    telemetry.configure(tracer_provider=tracer_provider, meter_provider=meter_provider)
    try:
        yield Recorded(exporter, reader, tracer_provider)
    finally:
        telemetry.configure()
        tracer_provider.shutdown()
        meter_provider.shutdown()


def sequence(service: AdmissionService) -> None:
    """Start, fresh, retry, conflicting retry, a signal, complete, close (and a refused close), a
    refused argument; a second instance: fresh, fail, continue-as-new; prune."""
    service.start_run(NS, "wf-1")
    fresh = service.admit_update(NS, "wf-1", "transfer", {"amount": 5}, request_id="k-1")
    service.admit_update(NS, "wf-1", "transfer", {"amount": 5}, request_id="k-1")
    service.admit_update(NS, "wf-1", "transfer", {"amount": 6}, request_id="k-1")
    service.admit_signal(NS, "wf-1", "poke", [], request_id="s-1")
    assert fresh.update_id is not None
    service.complete_update(NS, "wf-1", fresh.update_id, {"ok": True})
    service.close_run(NS, "wf-1", "completed")
    with pytest.raises(RunStateError):
        service.close_run(NS, "wf-1", "completed")
    with pytest.raises(InvalidValueError):
        service.admit_update(NS, "wf-1", "transfer", {"amount": {5}}, request_id="k-9")
    service.start_run(NS, "wf-2")
    second = service.admit_update(NS, "wf-2", "transfer", {"amount": 1}, request_id="k-2")
    assert second.update_id is not None
    service.fail_update(NS, "wf-2", second.update_id, "declined")
    service.continue_as_new(NS, "wf-2")
    service.prune(1, now=utc_now() + timedelta(days=40), max_clock_lead=None)


def admitted(command_type: str, name: str, decision: str, outcome: str) -> dict[str, Any]:
    return {
        "admission.command_type": command_type,
        "admission.namespace": NS,
        "admission.name": name,
        "admission.decision": decision,
        "admission.outcome": outcome,
    }


EXPECTED_SPANS = [
    ("admission.start_run", {"admission.namespace": NS}, "UNSET"),
    ("admission.admit_update", admitted("update", "transfer", "fresh", "accepted"), "UNSET"),
    ("admission.admit_update", admitted("update", "transfer", "retained", "accepted"), "UNSET"),
    (
        "admission.admit_update",
        admitted("update", "transfer", "request_id_conflict", "request_id_conflict"),
        "UNSET",
    ),
    ("admission.admit_signal", admitted("signal", "poke", "fresh", "received"), "UNSET"),
    (
        "admission.complete_update",
        {
            "admission.command_type": "update",
            "admission.namespace": NS,
            "admission.decision": "fresh",
            "admission.outcome": "completed",
        },
        "UNSET",
    ),
    ("admission.close_run", {"admission.namespace": NS, "admission.close_status": "completed"}, "UNSET"),
    ("admission.close_run", {"error.type": "RunStateError"}, "ERROR"),
    (
        "admission.admit_update",
        {"admission.command_type": "update", "error.type": "InvalidValueError"},
        "ERROR",
    ),
    ("admission.start_run", {"admission.namespace": NS}, "UNSET"),
    ("admission.admit_update", admitted("update", "transfer", "fresh", "accepted"), "UNSET"),
    (
        "admission.fail_update",
        {
            "admission.command_type": "update",
            "admission.namespace": NS,
            "admission.decision": "fresh",
            "admission.outcome": "failed",
        },
        "UNSET",
    ),
    (
        "admission.continue_as_new",
        {"admission.namespace": NS, "admission.close_status": "continued"},
        "UNSET",
    ),
    (
        "admission.prune",
        {
            "admission.prune.chains": 1,
            "admission.prune.done": 1,
            "admission.prune.dry_run": False,
            "admission.prune.clock_capped": False,
        },
        "UNSET",
    ),
]


def test_a_known_sequence_makes_exactly_these_spans_and_counts(otel: Recorded) -> None:
    sequence(AdmissionService(MemoryStore()))
    assert otel.spans() == EXPECTED_SPANS
    # Every span is a root: no caller's span was current.
    assert all(span.parent is None for span in otel.finished())
    scopes = {(s.instrumentation_scope.name, s.instrumentation_scope.version) for s in otel.finished()}
    assert scopes == {("admission", admission.__version__)}
    assert {name for name, *_ in EXPECTED_SPANS} <= set(telemetry.SPANS)
    assert {key for _, attributes, _ in EXPECTED_SPANS for key in attributes} <= set(telemetry.ATTRIBUTES)

    def counted(command_type: str, decision: str, outcome: str) -> frozenset[tuple[str, Any]]:
        return frozenset(
            {
                "admission.command_type": command_type,
                "admission.decision": decision,
                "admission.outcome": outcome,
            }.items()
        )

    assert otel.points("admission.admissions") == {
        counted("update", "fresh", "accepted"): 2,
        counted("update", "retained", "accepted"): 1,
        counted("update", "request_id_conflict", "request_id_conflict"): 1,
        counted("signal", "fresh", "received"): 1,
    }

    def timed(command_type: str, **more: str) -> frozenset[tuple[str, Any]]:
        return frozenset({"admission.command_type": command_type, **more}.items())

    # One measurement per admit call, the refused one included (with its error type).
    assert otel.points("admission.admit.duration") == {
        timed("update", **{"admission.decision": "fresh"}): 2,
        timed("update", **{"admission.decision": "retained"}): 1,
        timed("update", **{"admission.decision": "request_id_conflict"}): 1,
        timed("signal", **{"admission.decision": "fresh"}): 1,
        timed("update", **{"error.type": "InvalidValueError"}): 1,
    }
    assert otel.units() == {"admission.admissions": "{admission}", "admission.admit.duration": "s"}


def test_a_batch_makes_one_span_and_counts_each_answered_command(otel: Recorded) -> None:
    service = AdmissionService(MemoryStore())
    service.start_run(NS, "wf-1")
    otel.exporter.clear()
    service.admit_many(
        [
            admission.BatchCommand("update", NS, "wf-1", "transfer", {"amount": 5}, request_id="k-1"),
            admission.BatchCommand("update", NS, "wf-1", "transfer", {"amount": 5}, request_id="k-1"),
            admission.BatchCommand("update", NS, "wf-1", "transfer", {"amount": {5}}, request_id="k-2"),
        ]
    )
    assert otel.spans() == [
        ("admission.admit_many", {"admission.batch.size": 3, "admission.batch.refused": 1}, "UNSET")
    ]
    assert {"admission.admit_many"} <= set(telemetry.SPANS)
    assert {"admission.batch.size", "admission.batch.refused"} <= set(telemetry.ATTRIBUTES)
    counted = {
        frozenset(
            {"admission.command_type": "update", "admission.decision": d, "admission.outcome": o}.items()
        )
        for d, o in (("fresh", "accepted"), ("retained", "accepted"))
    }
    assert otel.points("admission.admissions") == dict.fromkeys(counted, 1)
    # The histogram times admit calls; a batch's items are not calls of their own.
    assert otel.points("admission.admit.duration") == {}


def test_the_async_service_makes_the_same_spans_as_children_of_the_callers_span(otel: Recorded) -> None:
    sequence(AdmissionService(MemoryStore()))
    synchronous = otel.spans()
    otel.exporter.clear()
    service = AsyncAdmissionService(MemoryStore())
    tracer = otel.tracer_provider.get_tracer("engine")

    async def engine() -> None:
        with tracer.start_as_current_span("engine.step"):
            await service.start_run(NS, "wf-1")
            fresh = await service.admit_update(NS, "wf-1", "transfer", {"amount": 5}, request_id="k-1")
            await service.admit_update(NS, "wf-1", "transfer", {"amount": 5}, request_id="k-1")
            await service.admit_update(NS, "wf-1", "transfer", {"amount": 6}, request_id="k-1")
            await service.admit_signal(NS, "wf-1", "poke", [], request_id="s-1")
            assert fresh.update_id is not None
            await service.complete_update(NS, "wf-1", fresh.update_id, {"ok": True})
            await service.close_run(NS, "wf-1", "completed")

    asyncio.run(engine())
    *inner, outer = otel.finished()
    assert outer.name == "engine.step"
    assert [(s.name, dict(s.attributes or {}), s.status.status_code.name) for s in inner] == synchronous[:7]
    assert all(s.parent is not None and s.parent.span_id == outer.context.span_id for s in inner)


def test_a_worker_cycle_and_job_steps_make_their_spans(otel: Recorded, tmp_path: Path) -> None:
    scope = {"tenant": "t1", "form": "f1"}
    worker = DurableWorker(MemoryWorkerStore(), Scope.parse(scope), file_lock=False)
    for key in ("k1", "k2"):
        worker.accept({**scope, "source_key": key, "payload": {"n": 1}})
    report = worker.run_once(SqliteTarget(tmp_path / "target.db"))
    assert (report.sent, report.confirmed) == (2, 2)

    jobs = jobs_on(MemoryJobStore())
    jobs.enqueue(Job("j1", "tenant-a", "count", {"steps": 2}))
    jobs.enqueue(Job("j2", "tenant-a", "count", {"steps": 2}))
    handler = Counting(fail_at={1: RuntimeError("boom")})
    runner = JobRunner(jobs, MemoryPublisher(), {"count": Counting()}, heartbeat_every=None)
    assert runner.run("j1").state == "completed"
    assert (
        JobRunner(jobs, MemoryPublisher(), {"count": handler}, heartbeat_every=None).run("j2").state
        == "failed"
    )

    spans = otel.spans()
    counts = {f"admission.worker.{name}": 0 for name in telemetry._WORKER_COUNTS}
    assert spans[0] == (
        "admission.worker.cycle",
        {
            "admission.worker.queue": worker.queue,
            "admission.worker.token": report.token,
            **counts,
            "admission.worker.sent": 2,
            "admission.worker.confirmed": 2,
        },
        "UNSET",
    )

    def step(job_id: str, number: int) -> dict[str, Any]:
        return {
            "admission.job.id": job_id,
            "admission.job.kind": "count",
            "admission.job.step": number,
        }

    # The attempt id is the job's own (a fresh uuid per claim): one per job, the same on its steps.
    attempts = [attributes.pop("admission.job.attempt") for _, attributes, _ in spans[1:]]
    assert all(isinstance(attempt, str) for attempt in attempts)
    assert attempts[0] == attempts[1] != attempts[2]
    assert spans[1:] == [
        ("admission.job.step", {**step("j1", 1), "admission.job.outcome": "continue"}, "UNSET"),
        ("admission.job.step", {**step("j1", 2), "admission.job.outcome": "finish"}, "UNSET"),
        ("admission.job.step", {**step("j2", 1), "error.type": "RuntimeError"}, "ERROR"),
    ]
    assert {key for _, attributes, _ in spans for key in attributes} <= set(telemetry.ATTRIBUTES)
    assert {name for name, *_ in spans} <= set(telemetry.SPANS)


# -- what is never logged ---------------------------------------------------------------------------

SECRET_KEY = "key-Zq7Kp-never-logged"
SECRET_ARGUMENT = "argument-Xw9Lm-never-logged"
SECRET_RESULT = "result-Rt5Nb-never-logged"
SECRET_FAILURE = "failure-Fj2Hc-never-logged"
SECRET_PASSWORD = "password-Vb3Qs-never-logged"
SECRET_BEARER = "adm_" + "5e" * 32
WRONG_BEARER = "adm_" + "7f" * 32
SECRETS = (
    SECRET_KEY,
    SECRET_ARGUMENT,
    SECRET_RESULT,
    SECRET_FAILURE,
    SECRET_PASSWORD,
    SECRET_BEARER,
    WRONG_BEARER,
)


def drive_everything(tmp_path: Path) -> None:
    """Admissions, a failing storage, a worker cycle, job steps and the HTTP app with a bearer token,
    each handed the secrets above where a caller would hand them."""
    service = AdmissionService(MemoryStore())
    service.start_run(NS, "wf-1")
    fresh = service.admit_update(NS, "wf-1", "charge", {"card": SECRET_ARGUMENT}, request_id=SECRET_KEY)
    service.admit_update(NS, "wf-1", "charge", {"card": SECRET_ARGUMENT}, request_id=SECRET_KEY)
    service.admit_update(NS, "wf-1", "charge", {"card": SECRET_ARGUMENT + "!"}, request_id=SECRET_KEY)
    with pytest.raises(InvalidValueError):
        service.admit_update(NS, "wf-1", "charge", {SECRET_ARGUMENT: {1}}, request_id=SECRET_KEY + "2")
    assert fresh.update_id is not None
    service.complete_update(NS, "wf-1", fresh.update_id, {"receipt": SECRET_RESULT})
    other = service.admit_update(NS, "wf-1", "charge", [SECRET_ARGUMENT], request_id=SECRET_KEY + "3")
    assert other.update_id is not None
    service.fail_update(NS, "wf-1", other.update_id, SECRET_FAILURE)

    from admission.sql import SqlStore, create_admission_engine

    engine = create_admission_engine(f"postgresql+psycopg://admission:{SECRET_PASSWORD}@127.0.0.1:1/nowhere")
    try:
        failing = AdmissionService(SqlStore(engine, check=False))
        with pytest.raises(StorageError):
            failing.admit_update(NS, "wf-1", "charge", {"card": SECRET_ARGUMENT}, request_id=SECRET_KEY)
    finally:
        engine.dispose()

    scope = {"tenant": "t1", "form": "f1"}
    worker = DurableWorker(MemoryWorkerStore(), Scope.parse(scope), file_lock=False)
    worker.accept({**scope, "source_key": SECRET_KEY, "payload": {"card": SECRET_ARGUMENT}})
    worker.run_once(FaultyTarget(SqliteTarget(tmp_path / "target.db"), "timeout"))

    jobs = jobs_on(MemoryJobStore())
    for job_id in ("j1", "j2"):
        jobs.enqueue(Job(job_id, "tenant-a", "count", {"steps": 2, "card": SECRET_ARGUMENT}))
    failing_steps = {
        "j1": Counting(fail_at={2: RuntimeError(SECRET_ARGUMENT)}),
        "j2": Counting(fail_at={1: RetryableJobError(SECRET_ARGUMENT)}),
    }
    for job_id, handler in failing_steps.items():
        JobRunner(jobs, MemoryPublisher(), {"count": handler}, heartbeat_every=None).run(job_id)

    from fastapi.testclient import TestClient

    from admission.http import BearerTokens, TokenGrant, create_app, token_digest

    app = create_app(
        service, authorize=BearerTokens([TokenGrant("engine", token_digest(SECRET_BEARER), (NS,))])
    )
    with TestClient(app, raise_server_exceptions=False) as client:
        statuses = [
            client.post(
                "/api/workflows/wf-1/signal/poke",
                json={"request_id": SECRET_KEY, "input": {"codec": "json", "blob": f'["{SECRET_ARGUMENT}"]'}},
                headers={"X-Namespace": NS, "Authorization": f"Bearer {bearer}"},
            ).status_code
            for bearer in (SECRET_BEARER, WRONG_BEARER)
        ]
    assert statuses == [202, 401]


def test_no_log_line_holds_a_key_an_argument_a_result_or_a_secret(
    caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    caplog.set_level(logging.DEBUG, logger="admission")
    drive_everything(tmp_path)
    records = [r for r in caplog.records if r.name.startswith("admission")]
    for record in records:
        seen = " ".join(
            (
                record.getMessage(),
                repr(record.args),
                record.exc_text or "",
                repr(record.exc_info),
                record.name,
            )
        )
        assert not [secret for secret in SECRETS if secret in seen], record.getMessage()
    # The sequence was logged at all: every part spoke, and the receipt token (a digest) may appear.
    assert {
        "admission.receipts",
        "admission.sql",
        "admission.worker",
        "admission.jobs",
        "admission.http",
    } <= {r.name for r in records}
    token = receipt_token("update", SECRET_KEY)
    assert any(token in r.getMessage() for r in records)
    levels = {(r.name, r.levelname) for r in records}
    assert ("admission.receipts", "WARNING") in levels  # the storage error
    assert ("admission.receipts", "INFO") in levels  # the conflict
    assert ("admission.worker", "WARNING") in levels  # a record left uncertain
    assert ("admission.jobs", "WARNING") in levels  # a failed step


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    key=st.text(min_size=1, max_size=40).map(lambda text: f"key\u2063{text}"),
    argument=st.text(min_size=1, max_size=40).map(lambda text: f"argument\u2063{text}"),
    result=st.text(min_size=1, max_size=40).map(lambda text: f"result\u2063{text}"),
)
def test_no_key_argument_or_result_reaches_a_log_line_whatever_it_holds(
    caplog: pytest.LogCaptureFixture, key: str, argument: str, result: str
) -> None:
    # Each value carries a mark (U+2063) no message of admission holds, so that finding it means
    # the value itself was logged, never a word of admission's own that it happens to equal.
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="admission"):
        service = AdmissionService(MemoryStore())
        service.start_run(NS, "wf-1")
        try:
            fresh = service.admit_update(NS, "wf-1", "charge", {"card": argument}, request_id=key)
        except InputError:  # a key admission refuses (contract §2.3): nothing admitted, nothing to log
            return
        service.admit_update(NS, "wf-1", "charge", {"card": argument}, request_id=key)
        service.admit_update(NS, "wf-1", "charge", [argument], request_id=key)
        assert fresh.update_id is not None
        service.complete_update(NS, "wf-1", fresh.update_id, result)
        service.admit_signal(NS, "wf-1", "poke", [argument], request_id=key)
    records = [r for r in caplog.records if r.name.startswith("admission")]
    assert len(records) == 6  # start, fresh, retained, conflict, complete, signal
    for record in records:
        seen = record.getMessage() + repr(record.args)
        assert "\u2063" not in seen, seen


def test_the_command_line_logs_on_request_and_never_the_key_or_arguments(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'cli.sqlite3'}"
    assert main(["--db", url, "db", "upgrade"]) == 0
    assert main(["--db", url, "start", "wf-1"]) == 0
    admit = ["--db", url, "update", "wf-1", "charge", "--request-id", SECRET_KEY]
    admit += ["--args", f'{{"card": "{SECRET_ARGUMENT}"}}']
    # Without --log-level or ADMISSION_LOG_LEVEL nothing is configured: no line on stderr.
    monkeypatch.delenv("ADMISSION_LOG_LEVEL", raising=False)
    assert main(admit) == 0
    assert capsys.readouterr().err == ""
    # A level it does not know is refused, naming where it came from, before anything runs.
    monkeypatch.setenv("ADMISSION_LOG_LEVEL", "loud")
    assert main(["--db", url, "start", "wf-2"]) == 2
    assert (
        capsys.readouterr().err
        == "admission: ADMISSION_LOG_LEVEL: must be one of debug, info, warning, error\n"
    )
    # Configured in a process of its own: configuring adds a handler that would outlive a test.
    environ = {k: v for k, v in os.environ.items() if not k.startswith("ADMISSION_")}
    environ["ADMISSION_LOG_LEVEL"] = "debug"
    done = subprocess.run(
        [sys.executable, "-m", "admission", *admit], env=environ, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    token = receipt_token("update", SECRET_KEY)
    assert (
        f" DEBUG admission.receipts: admit_update charge in default: retained, accepted (token {token})"
        in (done.stderr)
    )
    assert not [secret for secret in SECRETS if secret in done.stderr]
    # A URL's password is masked in the line naming the database, and the storage error names no value.
    unreachable = f"postgresql+psycopg://admission:{SECRET_PASSWORD}@127.0.0.1:1/nowhere"
    failed = subprocess.run(
        [sys.executable, "-m", "admission", "--db", unreachable, "start", "wf-1"],
        env=environ,
        capture_output=True,
        text=True,
    )
    assert failed.returncode == 5
    assert "DEBUG admission.cli: command start, database postgresql+psycopg://admission:***@" in failed.stderr
    assert "INFO admission.sql: OperationalError from the driver became StorageError" in failed.stderr
    assert SECRET_PASSWORD not in failed.stderr
    # The option wins over the variable: at warning, a retained answer is not a line.
    quiet = subprocess.run(
        [sys.executable, "-m", "admission", "--log-level", "warning", *admit],
        env=environ,
        capture_output=True,
        text=True,
    )
    assert (quiet.returncode, quiet.stderr) == (0, "")


# -- without OpenTelemetry ----------------------------------------------------------------------------

WITHOUT_OTEL = """
import sys
from datetime import timedelta
sys.modules["opentelemetry"] = None  # as if not installed: every import of it fails
import admission
import admission
from admission import AdmissionService, MemoryStore, telemetry
from admission.receipts import utc_now
service = AdmissionService(MemoryStore())
service.start_run("ns", "wf")
fresh = service.admit_update("ns", "wf", "n", {"a": 1}, request_id="k")
retry = service.admit_update("ns", "wf", "n", {"a": 1}, request_id="k")
service.complete_update("ns", "wf", fresh.update_id, 1)
service.close_run("ns", "wf", "completed")
report = service.prune(1, now=utc_now() + timedelta(days=40), max_clock_lead=None)
print(fresh.decision, retry.decision, report.done)
print(sorted(m for m, v in sys.modules.items() if m.startswith("opentelemetry") and v is not None))
"""


def test_without_opentelemetry_admission_works_and_imports_none_of_it() -> None:
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_OTEL], capture_output=True, text=True, check=True, env=os.environ
    )
    assert done.stdout.splitlines() == ["fresh retained 1", "[]"]


def test_import_admission_loads_nothing_of_opentelemetry_before_the_first_span() -> None:
    script = "import sys, admission; print(any(m.startswith('opentelemetry') for m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


# -- global providers ---------------------------------------------------------------------------------

GLOBAL_PROVIDERS = """
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from admission import AdmissionService, MemoryStore

def counted(reader):
    data = reader.get_metrics_data()
    return sum(
        point.value
        for resource in (data.resource_metrics if data else ())
        for scope in resource.scope_metrics
        for metric in scope.metrics
        if metric.name == "admission.admissions"
        for point in metric.data.data_points
    )

service = AdmissionService(MemoryStore())
service.start_run("ns", "wf")
service.admit_signal("ns", "wf", "poke", [], request_id="before")  # no provider yet: nothing kept
exporter, reader = InMemorySpanExporter(), InMemoryMetricReader()
tracer_provider = TracerProvider()
tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(tracer_provider)
metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
service.admit_signal("ns", "wf", "poke", [], request_id="after")
service.admit_signal("ns", "wf", "poke", [], request_id="after")
print(sorted(s.name for s in exporter.get_finished_spans()), counted(reader))
"""


def test_global_providers_set_after_the_first_admission_get_every_later_span_and_count() -> None:
    # In a process of its own: OpenTelemetry's global providers can be set once per process.
    done = subprocess.run(
        [sys.executable, "-c", GLOBAL_PROVIDERS], capture_output=True, text=True, check=True, env=os.environ
    )
    # The spans and counts of the two admissions made after the providers were set, none before.
    assert done.stdout.splitlines() == ["['admission.admit_signal', 'admission.admit_signal'] 2"]


def test_a_tracer_provider_named_in_the_environment_gets_the_spans() -> None:
    # OpenTelemetry loads a provider named by OTEL_PYTHON_TRACER_PROVIDER (an entry point, here
    # the SDK's) at its first lookup: admission's spans are then recorded, not skipped as idle.
    script = (
        "import admission.telemetry as t\n"
        "from admission import AdmissionService, MemoryStore\n"
        "AdmissionService(MemoryStore()).start_run('ns', 'wf')\n"
        "found = t._lookup()\n"
        "print(found is not None and found.idle())\n"
    )
    environ = dict(os.environ, OTEL_PYTHON_TRACER_PROVIDER="sdk_tracer_provider")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=environ)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


# -- the version line ---------------------------------------------------------------------------------


def version(prelude: str = "", **env: str) -> str:
    environ = {k: v for k, v in os.environ.items() if k != "ADMISSION_PURE_PYTHON"} | env
    script = f"import sys\n{prelude}\nfrom admission.cli import main\nsys.exit(main(['--version']))"
    done = subprocess.run([sys.executable, "-c", script], env=environ, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_the_version_line_says_whether_the_c_accelerator_is_active() -> None:
    from importlib.util import find_spec

    from admission import __version__

    built = find_spec("admission.intent._speedups") is not None
    expected = "active" if built else "not built, pure Python"
    assert version() == f"admission {__version__} (C accelerator: {expected})"
    assert version(ADMISSION_PURE_PYTHON="1") == (
        f"admission {__version__} (C accelerator: off (ADMISSION_PURE_PYTHON), pure Python)"
    )
    # The extension missing altogether, as where no compiler was found at install time.
    hidden = version(prelude="sys.modules['admission.intent._speedups'] = None")
    assert hidden == f"admission {__version__} (C accelerator: not built, pure Python)"
