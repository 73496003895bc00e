"""Admissions/s through the HTTP adapter beside the in-process service, measured in one run.

Per backend (SQLite, PostgreSQL), on one database, for a fresh admission
(``admit_signal`` with a new ``request_id`` each call, round-robin over 16
instances with an open run) and a retained one (a retry of one of 256
existing keys with the same intent, answered with the retained receipt),
five candidates peel the layers off one at a time:

- **in-process service**: ``AdmissionService.admit_signal`` (the floor);
- **in-process async service**: ``AsyncAdmissionService.admit_signal`` on an
  event loop, what ``admission serve`` awaits (the async bridge and driver);
- **app, no socket**: the ASGI app of ``create_app`` called in process with the
  request ``POST /api/workflows/{id}/signal/{name}`` (a JSON codec envelope),
  so the framework, validation, codec and JSON answer without any transport;
- **HTTP, stdlib keep-alive**: the same request over one persistent
  ``http.client.HTTPConnection`` to ``admission serve`` (uvicorn) in a
  subprocess on loopback, waiting for each answer before the next request
  (the connection is checked to be the same socket after every round);
- **HTTP, httpx keep-alive**: the same through one ``httpx.Client``.

Three more candidates measure the transport alone, a GET of an unknown route
(404): through the app with no socket, and through both clients; and a
fourth its floor: a retry's POST answered with a fixed body by a bare
asyncio HTTP/1.1 responder (no framework, no parsing beyond the headers'
end and the body's length) in a process of its own, which gives the most a
retry over HTTP could keep of the in-process rate on this machine.  Candidates
are interleaved: each round runs all of them for ``--seconds`` each, the
order reversed every other round; the table gives medians over the rounds,
the ratio to the in-process service and the microseconds each adds to it.
Where the time goes per request, each the difference of two rows: the
client is httpx less stdlib; the transport stdlib less the app; the framework
and codec the app less the async service; the async bridge the async service
less the in-process one.

Durability is the same for every candidate (it is one database): SQLite in
WAL with ``synchronous=FULL``; PostgreSQL with ``fsync=on``,
``synchronous_commit=on``, ``full_page_writes=on`` (the server this starts
when no ``--pg-url`` is given).

Usage: ``python bench/http.py [--seconds N] [--rounds N] [--markdown]
[--backend sqlite|postgresql|all] [--pg-url URL]``.  ``--pg-url`` must name a
scratch database: admission's schema is upgraded there and rows are written.
"""

from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

# This file is bench/http.py: its own directory must not shadow the package (or httpx's ``http``).
_HERE = Path(__file__).resolve().parent
ROOT = _HERE.parent
sys.path[:] = [p for p in sys.path if Path(p or os.getcwd()).resolve() != _HERE]
sys.path.insert(0, str(ROOT))

import asyncio  # noqa: E402
import http.client  # noqa: E402

import httpx  # noqa: E402

import admission  # noqa: E402
from admission.aio import AsyncAdmissionService, open_store  # noqa: E402
from admission.http import JsonCodec, create_app, envelope  # noqa: E402
from admission.receipts import AdmissionService  # noqa: E402
from admission.sql import (  # noqa: E402
    SqlStore,
    create_admission_engine,
    normalize_url,
    upgrade,
)

NAMESPACE = "bench"
SIGNAL = "payment_received"
ARGUMENTS = {"order_id": "ord-2026-000417", "amount": 4250, "currency": "EUR", "final": True}
INSTANCES = 16
RETAINED_KEYS = 256
DURABLE = {"fsync": "on", "synchronous_commit": "on", "full_page_writes": "on"}
Row = tuple[str, str, str, float, str, str]
Candidate = Callable[[float], float]
"""Runs for the given seconds; returns calls per second."""

# The candidates of one measurement, in the order the table lists them.
LAYERS = (
    ("in-process", "in-process service"),
    ("async", "in-process async service (what the server awaits)"),
    ("app", "app called in process, no socket (framework, codec)"),
    ("stdlib", "HTTP, http.client keep-alive (uvicorn)"),
    ("httpx", "HTTP, httpx keep-alive (uvicorn)"),
)
TRANSPORT = (
    ("app", "404 through the app, no socket"),
    ("stdlib", "404 over HTTP, http.client keep-alive"),
    ("httpx", "404 over HTTP, httpx keep-alive"),
    ("bare", "a retry's POST answered by a bare asyncio responder, http.client keep-alive"),
)
BARE_ANSWER = b"HTTP/1.1 202 Accepted\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"


class _BareResponder(asyncio.Protocol):
    """HTTP/1.1 with nothing done: every request, read to its body's end, gets one fixed answer."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport, self.buffer = transport, b""

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while True:
            head, found, rest = self.buffer.partition(b"\r\n\r\n")
            if not found:
                return
            length = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            if len(rest) < length:
                return
            self.buffer = rest[length:]
            self.transport.write(BARE_ANSWER)


def _bare_serve(port: int) -> None:
    async def main() -> None:
        served = await asyncio.get_running_loop().create_server(_BareResponder, "127.0.0.1", port)
        await served.serve_forever()

    asyncio.run(main())


@contextmanager
def bare_server() -> Iterator[int]:
    """:class:`_BareResponder` on loopback in a process of its own (the floor of any Python
    HTTP server here: the sockets, the event loop and the wake-ups, nothing else); its port."""
    port = free_port()
    process = multiprocessing.get_context("spawn").Process(target=_bare_serve, args=(port,), daemon=True)
    process.start()
    try:
        for _ in range(600):
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                if not process.is_alive():
                    raise RuntimeError("the bare responder exited") from None
                time.sleep(0.05)
        yield port
    finally:
        process.terminate()
        process.join(30)


def free_port() -> int:
    """A loopback port nobody listens on (for the server subprocess)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def server(url: str) -> Iterator[int]:
    """``admission serve`` on loopback in a subprocess; yields its port."""
    port = free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "admission",
            "--db",
            url,
            "serve",
            "--port",
            str(port),
            "--log-level",
            "warning",
        ],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        assert process.stdout is not None
        json.loads(process.stdout.readline())
        for _ in range(600):
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                if process.poll() is not None:
                    raise RuntimeError("admission serve exited") from None
                time.sleep(0.05)
        yield port
    finally:
        process.terminate()
        process.wait(timeout=30)


def run_for(fn: Callable[[], object], seconds: float) -> float:
    """Call ``fn`` for ``seconds``; returns calls per second."""
    calls = 0
    start = time.perf_counter()
    end = start + seconds
    while True:
        fn()
        calls += 1
        now = time.perf_counter()
        if now >= end:
            return calls / (now - start)


async def run_for_async(fn: Callable[[], Any], seconds: float) -> float:
    """Await ``fn()`` for ``seconds`` (on the loop it runs on); returns calls per second."""
    calls = 0
    start = time.perf_counter()
    end = start + seconds
    while True:
        await fn()
        calls += 1
        now = time.perf_counter()
        if now >= end:
            return calls / (now - start)


class Subject:
    """Every candidate on one database; ``tag`` keeps this run's workflow ids apart."""

    def __init__(self, url: str, port: int, tag: str, bare_port: int) -> None:
        self.bare = http.client.HTTPConnection("127.0.0.1", bare_port, timeout=30)
        self.store = SqlStore.open(url)
        self.service = AdmissionService(self.store)
        self.loop = asyncio.Runner()
        self.async_service = AsyncAdmissionService(self.loop.run(open_store(url)))
        self.app = create_app(self.async_service)
        self.httpx = httpx.Client(
            base_url=f"http://127.0.0.1:{port}", headers={"X-Namespace": NAMESPACE}, timeout=30
        )
        self.stdlib = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        self.stdlib.connect()
        self._socket = self.stdlib.sock
        self.workflows = [f"{tag}-{k}" for k in range(INSTANCES)]
        for w in self.workflows:
            self.service.start_run(NAMESPACE, w)
        self.input = envelope(JsonCodec(), ARGUMENTS)
        self.retained = [(self.workflows[i % INSTANCES], f"{tag}-retained-{i}") for i in range(RETAINED_KEYS)]
        for workflow, key in self.retained:
            self.service.admit_signal(NAMESPACE, workflow, SIGNAL, ARGUMENTS, request_id=key)
        self._counter = itertools.count()
        self._tag = tag
        # Every path must give the answers it is measured for.
        for next_key, expected in ((self.fresh_key, False), (self.retained_key, True)):
            workflow, key = next_key()
            assert (
                self.service.admit_signal(NAMESPACE, workflow, SIGNAL, ARGUMENTS, request_id=key).retained
                is expected
            )
            answer = self.loop.run(
                self.async_service.admit_signal(NAMESPACE, workflow, SIGNAL, ARGUMENTS, request_id=key)
            )
            assert answer.retained is True  # the key the line above admitted
            for status, body in (
                self.loop.run(self._app_post(*next_key())),
                self._stdlib_post(*next_key()),
                self._httpx_post(*next_key()),
            ):
                assert status == 202 and json.loads(body)["retained"] is expected, (status, body)
        self.check_kept_alive()

    def fresh_key(self) -> tuple[str, str]:
        n = next(self._counter)
        return self.workflows[n % INSTANCES], f"{self._tag}-fresh-{n}"

    def retained_key(self) -> tuple[str, str]:
        return self.retained[next(self._counter) % RETAINED_KEYS]

    def _body(self, key: str) -> bytes:
        return json.dumps({"request_id": key, "input": self.input}).encode()

    def _stdlib_post(
        self, workflow: str, key: str, to: http.client.HTTPConnection | None = None
    ) -> tuple[int, bytes]:
        connection = self.stdlib if to is None else to
        connection.request(
            "POST",
            f"/api/workflows/{workflow}/signal/{SIGNAL}",
            body=self._body(key),
            headers={"Content-Type": "application/json", "X-Namespace": NAMESPACE},
        )
        response = connection.getresponse()
        return response.status, response.read()

    def _httpx_post(self, workflow: str, key: str) -> tuple[int, bytes]:
        response = self.httpx.post(
            f"/api/workflows/{workflow}/signal/{SIGNAL}", json={"request_id": key, "input": self.input}
        )
        return response.status_code, response.content

    async def _app_call(self, method: str, path: str, body: bytes) -> tuple[int, bytes]:
        # One request through the ASGI app as uvicorn would hand it over, with no socket.
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": method,
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "query_string": b"",
            "root_path": "",
            "headers": [
                (b"host", b"127.0.0.1"),
                (b"content-type", b"application/json"),
                (b"x-namespace", NAMESPACE.encode()),
                (b"content-length", str(len(body)).encode()),
            ],
            "client": ("127.0.0.1", 1),
            "server": ("127.0.0.1", 2),
        }
        pending = [{"type": "http.request", "body": body, "more_body": False}]
        sent: list[dict[str, Any]] = []

        async def receive() -> dict[str, Any]:
            if pending:
                return pending.pop()
            await asyncio.Event().wait()  # the client never leaves
            raise AssertionError("unreachable")

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        await self.app(scope, receive, send)
        return sent[0]["status"], b"".join(m.get("body", b"") for m in sent[1:])

    async def _app_post(self, workflow: str, key: str) -> tuple[int, bytes]:
        return await self._app_call("POST", f"/api/workflows/{workflow}/signal/{SIGNAL}", self._body(key))

    def check_kept_alive(self) -> None:
        """The stdlib client still talks on the socket it opened: no request reconnected."""
        assert self.stdlib.sock is self._socket, "the server closed the keep-alive connection"

    def _kept_alive(self, fn: Callable[[], object], seconds: float) -> float:
        # uvicorn closes a connection idle for 5 s (its keep-alive timeout), and the other
        # candidates run longer than that: connect anew before the run, outside the timing,
        # then every call of the run must go over that one connection.
        self.stdlib.close()
        self.stdlib.connect()
        self._socket = self.stdlib.sock
        rate = run_for(fn, seconds)
        self.check_kept_alive()
        return rate

    def candidates(self, measurement: str) -> dict[str, Candidate]:
        """The candidates of ``measurement`` (fresh, retained or transport), by layer."""
        if measurement == "transport":

            def stdlib_404() -> None:
                self.stdlib.request("GET", "/api/none")
                self.stdlib.getresponse().read()

            def bare_post() -> None:
                if self._stdlib_post(*self.retained_key(), to=self.bare) != (202, b"{}"):
                    raise RuntimeError("the bare responder answered something else")

            return {
                "app": lambda s: self.loop.run(
                    run_for_async(lambda: self._app_call("GET", "/api/none", b""), s)
                ),
                "stdlib": lambda s: self._kept_alive(stdlib_404, s),
                "httpx": lambda s: run_for(lambda: self.httpx.get("/api/none"), s),
                "bare": lambda s: run_for(bare_post, s),
            }
        key = self.fresh_key if measurement == "fresh" else self.retained_key

        def local() -> object:
            workflow, k = key()
            return self.service.admit_signal(NAMESPACE, workflow, SIGNAL, ARGUMENTS, request_id=k)

        def awaited() -> Any:
            workflow, k = key()
            return self.async_service.admit_signal(NAMESPACE, workflow, SIGNAL, ARGUMENTS, request_id=k)

        return {
            "in-process": lambda s: run_for(local, s),
            "async": lambda s: self.loop.run(run_for_async(awaited, s)),
            "app": lambda s: self.loop.run(run_for_async(lambda: self._app_post(*key()), s)),
            "stdlib": lambda s: self._kept_alive(lambda: self._stdlib_post(*key()), s),
            "httpx": lambda s: run_for(lambda: self._httpx_post(*key()), s),
        }

    def close(self) -> None:
        self.bare.close()
        self.httpx.close()
        self.stdlib.close()
        self.loop.run(self.async_service.store.dispose())
        self.loop.close()
        self.store.dispose()


def prepare(url: str) -> None:
    engine = create_admission_engine(url)
    try:
        upgrade(engine)
    finally:
        engine.dispose()


def bench(backend: str, url: str, tag: str, rounds: int, seconds: float) -> list[Row]:
    """Rows (backend, measurement, candidate, median ops/s, ratio, µs added) for one backend."""
    prepare(url)
    with server(url) as port, bare_server() as bare_port:
        subject = Subject(url, port, tag, bare_port)
        try:
            candidates = {
                (measurement, layer): fn
                for measurement in ("fresh", "retained", "transport")
                for layer, fn in subject.candidates(measurement).items()
            }
            samples: dict[tuple[str, str], list[float]] = {name: [] for name in candidates}
            names = list(candidates)
            for r in range(rounds):
                for name in names if r % 2 == 0 else reversed(names):
                    samples[name].append(candidates[name](seconds))
        finally:
            subject.close()
    medians = {name: statistics.median(values) for name, values in samples.items()}
    rows: list[Row] = []
    for measurement in ("fresh", "retained"):
        floor = medians[(measurement, "in-process")]
        for layer, label in LAYERS:
            ops = medians[(measurement, layer)]
            if layer == "in-process":
                rows.append((backend, measurement, label, ops, "floor", ""))
            else:
                added = 1e6 / ops - 1e6 / floor
                rows.append((backend, measurement, label, ops, f"{ops / floor:.2f}x", f"{added:,.0f}"))
    for layer, label in TRANSPORT:
        rows.append((backend, "transport", label, medians[("transport", layer)], "n/a", ""))
    return rows


HTTP_GOALS = {"fresh": 0.5, "retained": 0.25}
"""Issue #18's goals through ``admission serve`` with a keep-alive client: the in-process rate's share."""


def goals(rows: list[Row]) -> list[str]:
    """Each goal, met or not, by this run's http.client rows."""
    stdlib = LAYERS[3][1]
    lines = []
    for backend, measurement, candidate, _, ratio, _ in rows:
        goal = HTTP_GOALS.get(measurement)
        if goal is None or candidate != stdlib:
            continue
        met = float(ratio.rstrip("x")) >= goal
        lines.append(
            f"{backend} HTTP {measurement} (http.client keep-alive): {ratio} the in-process rate, "
            f"goal >= {goal}x: {'met' if met else 'NOT met'}"
        )
    return lines


def retained_bounds(rows: list[Row]) -> list[str]:
    """Per backend, the most a retry over HTTP could keep of the in-process rate on this machine:
    the in-process retry's time plus a bare exchange's, which any server adds at the least."""
    rate = {(b, m, c): ops for b, m, c, ops, _, _ in rows}
    lines = []
    for backend in dict.fromkeys(b for b, *_ in rows):
        local = 1e6 / rate[(backend, "retained", LAYERS[0][1])]
        bare = 1e6 / rate[(backend, "transport", TRANSPORT[-1][1])]
        lines.append(
            f"{backend} retained: an in-process retry takes {local:,.0f} µs and a bare HTTP exchange "
            f"{bare:,.0f} µs, so over HTTP a retry keeps at most {local / (local + bare):.2f}x of the "
            f"in-process rate here, with no framework at all"
        )
    return lines


def print_rows(rows: list[Row], markdown: bool) -> None:
    header = (
        "backend", "measurement", "candidate", "median ops/s", "median µs/op", "ratio to in-process",
        "µs added to in-process",
    )  # fmt: skip
    lines = [
        (b, m, c, f"{ops:,.0f}", f"{1e6 / ops:,.0f}", ratio, added) for b, m, c, ops, ratio, added in rows
    ]
    if markdown:
        print("| " + " | ".join(header) + " |")
        print("|---|---|---|---:|---:|---|---:|")
        for line in lines:
            print("| " + " | ".join(line) + " |")
        return
    widths = [max(len(str(x)) for x in col) for col in zip(header, *lines, strict=False)]
    for line in (header, *lines):
        print("  ".join(str(x).ljust(w) for x, w in zip(line, widths, strict=True)))


def _parser() -> str:
    # What uvicorn's "auto" picks in the server: httptools when installed, else h11.
    try:
        import httptools
    except ImportError:
        import h11

        return f"h11 {h11.__version__}"
    return f"httptools {httptools.__version__}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--seconds", type=float, default=1.0, help="seconds per candidate and round (default 1)"
    )
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds (default 7)")
    parser.add_argument("--markdown", action="store_true", help="print a Markdown table")
    parser.add_argument("--backend", choices=("sqlite", "postgresql", "all"), default="all")
    parser.add_argument("--pg-url", help="a scratch PostgreSQL database (default: start a private server)")
    args = parser.parse_args(argv)

    import fastapi
    import uvicorn

    tag = uuid.uuid4().hex[:8]
    started = time.monotonic()
    load = os.getloadavg()
    print(
        f"# python {platform.python_version()}, admission {admission.__version__}, "
        f"fastapi {fastapi.__version__}, "
        f"uvicorn {uvicorn.__version__} (HTTP parser: {_parser()}), httpx {httpx.__version__}, "
        f"{os.cpu_count()} CPUs, "
        f"rounds={args.rounds}, seconds={args.seconds:g}"
    )
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="admission-bench-http-") as directory:
        if args.backend in ("sqlite", "all"):
            rows += bench(
                "sqlite", f"sqlite:///{directory}/admission.sqlite3", tag, args.rounds, args.seconds
            )
        if args.backend in ("postgresql", "all"):
            pg = None
            url = args.pg_url
            if url is None:
                from tests.support.pgserver import PostgresServer

                pg = PostgresServer(settings=DURABLE).start()
                url = pg.create_database("admission_bench_http")
            try:
                rows += bench("postgresql", normalize_url(url), tag, args.rounds, args.seconds)
            finally:
                if pg is not None:
                    pg.stop()
    print_rows(rows, args.markdown)
    for line in retained_bounds(rows):
        print(f"# {line}")
    for line in goals(rows):
        print(f"# goal: {line}")
    end_load = os.getloadavg()
    print(
        f"# load average (1 min) at start {load[0]:.2f}, at end {end_load[0]:.2f}; "
        f"total {time.monotonic() - started:.0f} s"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
