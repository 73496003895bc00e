"""The HTTP adapter's limits, each shown by the attack it stops: bodies too large, waits left behind.

Most tests drive the ASGI app directly, playing the server: the test decides
how the body arrives (declared length, chunks, a stream that never ends) and
when the client goes away, and counts what the app pulled and read.  One test
runs the deployable ``admission serve`` and streams 1 GiB at it.
"""

from __future__ import annotations

import contextlib
import json
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, MutableMapping
from itertools import accumulate
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
import uvicorn
from fastapi import FastAPI
from hypothesis import given, settings
from hypothesis import strategies as st

with warnings.catch_warnings():
    warnings.simplefilter("ignore")

from admission.cli import main
from admission.errors import InvalidValueError
from admission.http import (
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_WAITS,
    AesGcmCodec,
    CborCodec,
    JsonCodec,
    codecs_from,
    create_app,
    envelope,
)
from admission.http._waits import poll_delays
from admission.intent import DEFAULT_MAX_SIZE, canonical_encode
from admission.receipts import AdmissionService, MemoryStore
from admission.receipts._rules import Admission
from admission.sql import SqlStore, create_admission_engine
from tests.support.backends import SQL_BACKENDS, PostgresPool, database_url, sqlite_url
from tests.support.snapshot import diff_snapshots, snapshot

pytestmark = pytest.mark.filterwarnings("ignore:Using `httpx` with `starlette.testclient`")

NS = "tenant-a"
KEY = bytes(range(32))
_Message = MutableMapping[str, Any]


class CountingService(AdmissionService):
    """The service, counting the receipt reads a waiting update makes."""

    reads = 0

    def receipt(
        self, namespace: str, workflow_id: str, command_type: str, request_id: str
    ) -> Admission | None:
        self.reads += 1
        return super().receipt(namespace, workflow_id, command_type, request_id)


class Backend:
    """A service on one backend, and a fingerprint of everything it has written."""

    def __init__(self, name: str, url: str | None) -> None:
        self.name = name
        self.store = MemoryStore() if url is None else SqlStore.open(url)
        self.engine = None if url is None else create_admission_engine(url)
        self.service = CountingService(self.store)

    def written(self) -> object:
        if self.engine is None:
            # The event log of every workflow the tests touch: each admission appends to it.
            return [(w, self.service.history(NS, w)) for w in ("wf-1", "wf-2")]
        return snapshot(self.engine)

    def close(self) -> None:
        if self.engine is not None:
            self.engine.dispose()
        if isinstance(self.store, SqlStore):
            self.store.dispose()


@pytest.fixture(params=["memory", *SQL_BACKENDS])
def backend(request: pytest.FixtureRequest, postgres_pool: PostgresPool, tmp_path: Path) -> Iterator[Backend]:
    name = str(request.param)
    opened = Backend(name, None if name == "memory" else database_url(name, postgres_pool, tmp_path))
    try:
        opened.service.start_run(NS, "wf-1")
        yield opened
    finally:
        opened.close()


def assert_unchanged(backend: Backend, before: object) -> None:
    after = backend.written()
    if backend.engine is None:
        assert after == before
    else:
        assert diff_snapshots(before, after) == []  # type: ignore[arg-type]


# -- an ASGI exchange the test controls ------------------------------------------------------


class Exchange:
    """One request as the server hands it to the app: its body in ``chunks``, then the client waits.

    ``pulled`` counts the body messages the app asked for; the client stays
    until ``leave()`` (its next message is then ``http.disconnect``) or the
    answer is complete.
    """

    def __init__(self, path: str, chunks: Iterable[bytes], *, declared: int | None = None) -> None:
        headers = [(b"host", b"test"), (b"content-type", b"application/json"), (b"x-namespace", NS.encode())]
        if declared is not None:
            headers.append((b"content-length", str(declared).encode()))
        self.scope: _Message = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "POST",
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "query_string": b"",
            "root_path": "",
            "headers": headers,
            "client": ("127.0.0.1", 50000),
            "server": ("127.0.0.1", 80),
        }
        self.chunks = iter(chunks)
        self.next_chunk: bytes | None = next(self.chunks, None)
        self.pulled = 0
        self.status: int | None = None
        self.body = b""
        self.gone = anyio.Event()

    def leave(self) -> None:
        self.gone.set()

    async def receive(self) -> _Message:
        if self.next_chunk is not None:
            chunk, self.next_chunk = self.next_chunk, next(self.chunks, None)
            self.pulled += 1
            return {"type": "http.request", "body": chunk, "more_body": self.next_chunk is not None}
        await self.gone.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: _Message) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
        elif message["type"] == "http.response.body":
            self.body += message.get("body", b"")
            if not message.get("more_body", False):
                self.leave()  # the answer is complete: the server's next message is a disconnect

    def json(self) -> dict[str, Any]:
        parsed = json.loads(self.body)
        assert isinstance(parsed, dict)
        return parsed

    async def run(self, app: FastAPI) -> None:
        await app(self.scope, self.receive, self.send)


def exchange(app: FastAPI, path: str, chunks: Iterable[bytes], *, declared: int | None = None) -> Exchange:
    request = Exchange(path, chunks, declared=declared)
    anyio.run(request.run, app)
    return request


def stream(chunk: bytes, count: int) -> Iterator[bytes]:
    """A body of ``count`` chunks, produced one at a time as the app asks for them."""
    for _ in range(count):
        yield chunk


# -- bounded request bodies ----------------------------------------------------------------------


def test_a_body_declared_over_the_limit_is_refused_413_before_a_byte_is_read(backend: Backend) -> None:
    app = create_app(backend.service, max_body_bytes=1000)
    before = backend.written()
    request = exchange(app, "/api/workflows/wf-1/signal/go", stream(b" " * 100, 50), declared=5000)
    body = request.json()
    assert request.status == 413 and request.pulled == 0
    assert (body["reason"], body["retryable"], body["max_body_bytes"]) == ("body_too_large", False, 1000)
    assert "1000 bytes" in body["message"]
    assert_unchanged(backend, before)


def test_a_chunked_body_over_the_default_limit_is_refused_413_as_soon_as_it_passes_it(
    backend: Backend,
) -> None:
    app = create_app(backend.service)
    before = backend.written()
    chunk = b" " * 65536
    # 4 MiB without a declared length; the guard stops at the chunk that passes 2 MiB.
    request = exchange(app, "/api/workflows/wf-1/update/go", stream(chunk, 64))
    assert request.status == 413, request.body
    assert request.pulled == DEFAULT_MAX_BODY_BYTES // len(chunk) + 1
    assert request.json()["reason"] == "body_too_large"
    assert_unchanged(backend, before)


@settings(max_examples=60)
@given(
    padding=st.integers(0, 200),
    limit=st.integers(1, 240),
    cuts=st.lists(st.integers(1, 64), max_size=12),
    declare=st.booleans(),
)
def test_a_body_is_refused_exactly_when_it_is_longer_than_the_limit(
    padding: int, limit: int, cuts: list[int], declare: bool
) -> None:
    service = AdmissionService(MemoryStore())
    service.start_run(NS, "wf-1")
    app = create_app(service, max_body_bytes=limit)
    body = b'{"request_id": "p"}' + b" " * padding
    # The same bytes in chunks of the drawn sizes (the rest in one last chunk).
    chunks, at = [], 0
    for size in cuts:
        chunks.append(body[at : at + size])
        at += size
    chunks.append(body[at:])
    request = exchange(
        app,
        "/api/workflows/wf-1/signal/go",
        [c for c in chunks if c],
        declared=len(body) if declare else None,
    )
    assert request.status == (413 if len(body) > limit else 202), request.body


@pytest.mark.parametrize("codec", [CborCodec(), AesGcmCodec(KEY, "k" * 64)], ids=["cbor", "aes-gcm"])
def test_the_largest_arguments_the_encoding_accepts_fit_under_the_default_body_limit(codec: Any) -> None:
    # Arguments as long as the encoding allows: 1 MiB encoded (one byte more is refused by it).
    value = [b"\x00" * (DEFAULT_MAX_SIZE - 6)]
    assert len(canonical_encode(value)) == DEFAULT_MAX_SIZE
    with pytest.raises(InvalidValueError):
        canonical_encode([b"\x00" * (DEFAULT_MAX_SIZE - 5)])
    longest_key = "\U0001f600" * 255  # 12 bytes each once JSON-escaped
    raw = json.dumps({"request_id": longest_key, "input": envelope(codec, value)}).encode("ascii")
    assert len(raw) <= DEFAULT_MAX_BODY_BYTES
    service = AdmissionService(MemoryStore())
    service.start_run(NS, "wf-1")
    app = create_app(service, codecs=codecs_from(JsonCodec(), CborCodec(), AesGcmCodec(KEY, "k" * 64)))
    request = exchange(app, "/api/workflows/wf-1/signal/go", [raw], declared=len(raw))
    assert request.status == 202, request.body[:500]


def test_create_app_refuses_a_limit_that_is_not_a_positive_integer() -> None:
    service = AdmissionService(MemoryStore())
    for bad in (0, -1, 1.5, True, None):
        with pytest.raises(ValueError, match="max_body_bytes"):
            create_app(service, max_body_bytes=bad)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="max_waits"):
            create_app(service, max_waits=bad)  # type: ignore[arg-type]


# -- waits that end with their caller -----------------------------------------------------------


WAITING = {"request_id": "w-1", "wait_for": "completed", "wait_timeout_seconds": 5}


def test_a_client_that_leaves_mid_wait_ends_the_wait(backend: Backend) -> None:
    app = create_app(backend.service)
    request = Exchange("/api/workflows/wf-1/update/approve", [json.dumps(WAITING).encode()])
    seen: dict[str, int] = {}

    async def scenario() -> None:
        async with anyio.create_task_group() as group:
            group.start_soon(request.run, app)
            while backend.service.reads < 1:  # the update is admitted and its wait has read once
                await anyio.sleep(0.005)
            seen["active"] = app.state.waits.active
            seen["reads"] = backend.service.reads
            request.leave()

    anyio.run(scenario)
    assert seen["active"] == 1
    # At most the read already under way when the client left; the wait had up to 5 s to go.
    assert backend.service.reads - seen["reads"] <= 1
    assert app.state.waits.active == 0
    receipt = backend.service.receipt(NS, "wf-1", "update", "w-1")
    assert receipt is not None and receipt.outcome == "accepted"  # admitted: a retry finds it


def test_a_client_that_closes_its_socket_mid_wait_ends_the_wait_under_uvicorn() -> None:
    # The same, through a real server: uvicorn tells the app of the closed socket.
    service = CountingService(MemoryStore())
    service.start_run(NS, "wf-1")
    app = create_app(service)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        until(lambda: server.started)
        body = json.dumps({**WAITING, "wait_timeout_seconds": 60}).encode()
        with socket.create_connection(("127.0.0.1", port)) as client:
            client.sendall(
                b"POST /api/workflows/wf-1/update/approve HTTP/1.1\r\nHost: test\r\n"
                b"Content-Type: application/json\r\nX-Namespace: " + NS.encode() + b"\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
            )
            until(lambda: service.reads >= 1 and app.state.waits.active == 1)
        # The socket is closed; the wait had a minute to go.
        until(lambda: app.state.waits.active == 0)
        assert app.state.waits.active == 0
        reads = service.reads
        # Longer than the longest delay between reads: a wait left running would read again.
        until(lambda: service.reads > reads, rounds=60)
        assert service.reads == reads
    finally:
        server.should_exit = True
        thread.join(30)


def until(condition: Callable[[], bool], rounds: int = 3000) -> None:
    """Wait for ``condition``, checking every 10 ms, at most ``rounds`` times; no assertion on time."""
    for _ in range(rounds):
        if condition():
            return
        time.sleep(0.01)


def test_a_wait_backs_off_between_reads(backend: Backend) -> None:
    app = create_app(backend.service)
    timeout = 1.0
    request = exchange(
        app,
        "/api/workflows/wf-1/update/approve",
        [json.dumps({**WAITING, "wait_timeout_seconds": timeout}).encode()],
    )
    assert request.status == 202 and request.json()["outcome"] == "accepted"
    # A read follows each delay that starts before the deadline: 20, 40, 80, 160, 320 ms, then one
    # cut short by the deadline, where a fixed 20 ms would read 50 times.
    starts = accumulate(poll_delays(0.02), initial=0.0)
    bound = sum(1 for _ in iter(lambda: next(starts) < timeout, False))
    assert bound == 6
    # One read of slack for a timer that wakes a hair early.
    assert 1 <= backend.service.reads - 1 <= bound + 1  # minus the admission's own read, if any


def test_waits_past_the_bound_are_refused_503_retryable_and_write_nothing(backend: Backend) -> None:
    backend.service.start_run(NS, "wf-2")
    app = create_app(backend.service, max_waits=2)
    answers: dict[str, httpx.Response] = {}

    async def post(client: httpx.AsyncClient, name: str, body: dict[str, object]) -> None:
        answers[name] = await client.post(
            "/api/workflows/wf-1/update/approve", json=body, headers={"X-Namespace": NS}
        )

    def receipt(key: str) -> Admission | None:
        return backend.service.receipt(NS, "wf-1", "update", key)

    async def scenario() -> None:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            async with anyio.create_task_group() as group:
                for key in ("w-1", "w-2"):
                    group.start_soon(
                        post, client, key, {**WAITING, "request_id": key, "wait_timeout_seconds": 30}
                    )
                while app.state.waits.active < 2 or receipt("w-1") is None or receipt("w-2") is None:
                    await anyio.sleep(0.005)
                before = backend.written()
                await post(client, "w-3", {**WAITING, "request_id": "w-3"})
                assert_unchanged(backend, before)
                # An update that does not wait needs no slot.
                await post(client, "w-4", {"request_id": "w-4"})
                for key in ("w-1", "w-2"):
                    found = receipt(key)
                    assert found is not None and found.update_id is not None
                    await anyio.to_thread.run_sync(
                        backend.service.complete_update, NS, "wf-1", found.update_id, key
                    )
            assert app.state.waits.active == 0
            await post(client, "w-3 again", {**WAITING, "request_id": "w-3", "wait_timeout_seconds": 0.05})

    anyio.run(scenario)
    refused = answers["w-3"]
    body = refused.json()
    assert refused.status_code == 503
    assert (body["reason"], body["retryable"], body["max_waits"]) == ("too_many_waits", True, 2)
    assert refused.headers["retry-after"] == "1"
    assert answers["w-4"].status_code == 202
    assert [answers[k].status_code for k in ("w-1", "w-2")] == [200, 200]
    assert answers["w-3 again"].status_code == 202 and answers["w-3 again"].json()["retained"] is False
    assert app.state.waits.active == 0 and app.state.waits.limit == 2


def test_the_default_bound_on_waits_is_64() -> None:
    app = create_app(AdmissionService(MemoryStore()))
    assert app.state.waits.limit == DEFAULT_MAX_WAITS == 64


# -- admission serve, with 1 GiB streamed at it ---------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def memory_kib(pid: int) -> dict[str, int]:
    """The process's resident memory now (``VmRSS``) and at its peak (``VmHWM``), in KiB."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, rest = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            fields[name] = int(rest.split()[0])
    return fields


@contextlib.contextmanager
def serving(url: str, *extra: str) -> Iterator[tuple[int, int, dict[str, Any]]]:
    """``admission serve`` as its own process: (port, pid, the JSON line it printed)."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "admission", "--db", url, "serve", "--port", str(port), *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        announced = json.loads(process.stdout.readline() or "null")
        assert announced is not None, process.stderr.read() if process.stderr else ""
        for _ in range(600):
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                assert process.poll() is None, process.stderr.read() if process.stderr else ""
                time.sleep(0.05)
        yield port, process.pid, announced
    finally:
        process.send_signal(signal.SIGTERM)
        _, log = process.communicate(timeout=30)
        assert process.returncode == -signal.SIGTERM, log
        assert "Traceback" not in log, log


def stream_chunked(port: int, path: str, total: int, chunk_size: int = 1 << 20) -> tuple[int, bytes]:
    """POST ``total`` bytes with chunked transfer encoding; stop when the server answers or closes.

    Returns (bytes sent, the response's bytes, possibly empty if the server
    closed the connection before the client could read it).
    """
    sock = socket.create_connection(("127.0.0.1", port))
    sock.settimeout(60)  # a guard against a hang, never reached when the server answers
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"X-Namespace: {NS}\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    # The start of a valid update, whose blob then never ends.
    opening = b'{"request_id": "huge", "input": {"codec": "json", "blob": "['
    chunk = b"1," * (chunk_size // 2)
    sent, response = 0, b""
    with sock:
        try:
            sock.sendall(head.encode() + b"%x\r\n%s\r\n" % (len(opening), opening))
            while sent < total:
                if select.select([sock], [], [], 0)[0]:
                    break  # the server has answered (or closed): stop streaming
                sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                sent += len(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass
        with contextlib.suppress(OSError):
            while part := sock.recv(65536):
                response += part
    return sent, response


def test_admission_serve_refuses_a_1_gib_stream_with_bounded_memory(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path)
    store = SqlStore.open(url)
    engine = create_admission_engine(url)
    try:
        service = AdmissionService(store)
        service.start_run(NS, "wf-1")
        with (
            serving(url) as (port, pid, announced),
            httpx.Client(base_url=f"http://127.0.0.1:{port}") as http,
        ):
            assert announced["max_body_bytes"] == DEFAULT_MAX_BODY_BYTES
            warm = http.post(
                "/api/workflows/wf-1/signal/warm", json={"request_id": "warm"}, headers={"X-Namespace": NS}
            )
            assert warm.status_code == 202
            before = memory_kib(pid)
            db_before = snapshot(engine)
            sent, response = stream_chunked(port, "/api/workflows/wf-1/update/go", 1 << 30)
            after = memory_kib(pid)
            # The server read about 2 MiB of the 1 GiB and closed; its peak grew by less than 64 MiB.
            assert sent < 1 << 30
            assert response == b"" or response.startswith(b"HTTP/1.1 413 "), response[:200]
            assert after["VmHWM"] - before["VmHWM"] < 64 * 1024, (before, after)
            assert diff_snapshots(db_before, snapshot(engine)) == []
            # The server is still there, and answers the next request.
            again = http.post(
                "/api/workflows/wf-1/signal/warm", json={"request_id": "warm"}, headers={"X-Namespace": NS}
            )
            assert again.status_code == 202 and again.json()["retained"] is True
    finally:
        engine.dispose()
        store.dispose()


def test_admission_serve_announces_and_applies_its_limits(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path)
    with serving(url, "--max-body-bytes", "4096", "--max-waits", "3") as (port, _, announced):
        assert (announced["max_body_bytes"], announced["max_waits"]) == (4096, 3)
        try:
            import httptools  # noqa: F401
        except ImportError:
            assert announced["http_parser"] == "h11"
        else:
            assert announced["http_parser"] == "httptools"  # the C parser whenever it is there
        big = httpx.post(
            f"http://127.0.0.1:{port}/api/workflows/wf-1/signal/go",
            content=b" " * 4097,
            headers={"Content-Type": "application/json", "X-Request-Id": "corr-413"},
        )
        assert big.status_code == 413 and big.json()["max_body_bytes"] == 4096
        assert big.headers["x-request-id"] == "corr-413"  # echoed, as on every answer


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--max-body-bytes", "0", "--max-body-bytes: must be a positive integer, got 0"),
        ("--max-waits", "-2", "--max-waits: must be a positive integer, got -2"),
        ("--max-waits", "many", "argument --max-waits: invalid int value: 'many'"),
    ],
)
def test_admission_serve_refuses_a_limit_that_is_not_positive_before_listening(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], option: str, value: str, message: str
) -> None:
    url = sqlite_url(tmp_path)
    try:
        code = main(["--db", url, "serve", "--port", str(free_port()), option, value])
    except SystemExit as exc:  # argparse's own refusal
        code = exc.code
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert message in err and "Traceback" not in err
