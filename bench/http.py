"""Admissions/s through the HTTP adapter beside the in-process service, measured in one run.

Per backend (SQLite, PostgreSQL), on one database, four candidates:

- **fresh / in-process**: ``AdmissionService.admit_signal`` with a new
  ``request_id`` each call, round-robin over 16 instances with an open run.
- **fresh / HTTP**: the same admission as ``POST
  /api/workflows/{id}/signal/{name}`` with a JSON codec envelope, sent by one
  ``httpx.Client`` (keep-alive) to ``admission serve`` (uvicorn) running in
  a subprocess on loopback, waiting for each answer before the next request.
- **retained / in-process** and **retained / HTTP**: a retry of one of 256
  existing keys with the same intent, answered with the retained receipt.

The in-process candidate is the floor: HTTP adds the client, the socket, the
server's parsing, validation, codec, threadpool hop and JSON answer around
the very same service call.  A fifth candidate, a GET of an unknown route
(404) through the same client and server, measures the transport alone.
Candidates are interleaved: each round runs all five for ``--seconds`` each,
the order reversed every other round; the table gives medians over the
rounds, the ratio HTTP / in-process and the microseconds HTTP adds.

Durability is the same for both sides (it is one database): SQLite in WAL
with ``synchronous=FULL``; PostgreSQL with ``fsync=on``,
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

# This file is bench/http.py: its own directory must not shadow the package (or httpx's ``http``).
_HERE = Path(__file__).resolve().parent
ROOT = _HERE.parent
sys.path[:] = [p for p in sys.path if Path(p or os.getcwd()).resolve() != _HERE]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

import admission  # noqa: E402
from admission.http import JsonCodec, envelope  # noqa: E402
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


def free_port() -> int:
    """A loopback port nobody listens on (for the server subprocess)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def server(url: str) -> Iterator[str]:
    """``admission serve`` on loopback in a subprocess; yields its base URL."""
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
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(timeout=30)


class Subject:
    """The five candidates on one database; ``tag`` keeps this run's workflow ids apart."""

    def __init__(self, url: str, base_url: str, tag: str) -> None:
        self.store = SqlStore.open(url)
        self.service = AdmissionService(self.store)
        self.http = httpx.Client(base_url=base_url, headers={"X-Namespace": NAMESPACE}, timeout=30)
        self.workflows = [f"{tag}-{k}" for k in range(INSTANCES)]
        for w in self.workflows:
            self.service.start_run(NAMESPACE, w)
        self.input = envelope(JsonCodec(), ARGUMENTS)
        self.retained = [(self.workflows[i % INSTANCES], f"{tag}-retained-{i}") for i in range(RETAINED_KEYS)]
        for workflow, key in self.retained:
            self.service.admit_signal(NAMESPACE, workflow, SIGNAL, ARGUMENTS, request_id=key)
        self._counter = itertools.count()
        self._tag = tag
        # Both paths must give the answers they are measured for.
        assert self.http_fresh() == 202 and self.http_retained() == 202
        assert self.local_fresh() and self.local_retained()

    def _next(self) -> tuple[str, str]:
        n = next(self._counter)
        return self.workflows[n % INSTANCES], f"{self._tag}-fresh-{n}"

    def local_fresh(self) -> bool:
        workflow, key = self._next()
        answer = self.service.admit_signal(NAMESPACE, workflow, SIGNAL, ARGUMENTS, request_id=key)
        return not answer.retained

    def local_retained(self) -> bool:
        workflow, key = self.retained[next(self._counter) % RETAINED_KEYS]
        return self.service.admit_signal(NAMESPACE, workflow, SIGNAL, ARGUMENTS, request_id=key).retained

    def _post(self, workflow: str, key: str) -> int:
        response = self.http.post(
            f"/api/workflows/{workflow}/signal/{SIGNAL}", json={"request_id": key, "input": self.input}
        )
        return response.status_code

    def http_fresh(self) -> int:
        return self._post(*self._next())

    def http_retained(self) -> int:
        return self._post(*self.retained[next(self._counter) % RETAINED_KEYS])

    def http_round_trip(self) -> int:
        # The transport alone: client, socket, uvicorn and routing, no admission.
        return self.http.get("/api/none").status_code

    def close(self) -> None:
        self.http.close()
        self.store.dispose()


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


def prepare(url: str) -> None:
    engine = create_admission_engine(url)
    try:
        upgrade(engine)
    finally:
        engine.dispose()


def bench(
    backend: str, url: str, tag: str, rounds: int, seconds: float
) -> list[Row]:
    """Rows (backend, measurement, candidate, median ops/s, ratio, µs added) for one backend."""
    prepare(url)
    with server(url) as base_url:
        subject = Subject(url, base_url, tag)
        try:
            candidates: dict[str, Callable[[], object]] = {
                "fresh/in-process": subject.local_fresh,
                "fresh/HTTP": subject.http_fresh,
                "retained/in-process": subject.local_retained,
                "retained/HTTP": subject.http_retained,
                "round trip/HTTP": subject.http_round_trip,
            }
            samples: dict[str, list[float]] = {name: [] for name in candidates}
            names = list(candidates)
            for r in range(rounds):
                for name in names if r % 2 == 0 else reversed(names):
                    samples[name].append(run_for(candidates[name], seconds))
        finally:
            subject.close()
    medians = {name: statistics.median(values) for name, values in samples.items()}
    rows = []
    for measurement in ("fresh", "retained"):
        floor = medians[f"{measurement}/in-process"]
        http = medians[f"{measurement}/HTTP"]
        added = 1e6 / http - 1e6 / floor
        rows.append((backend, measurement, "in-process service", floor, "floor", ""))
        rows.append(
            (
                backend,
                measurement,
                "HTTP (uvicorn, httpx keep-alive)",
                http,
                f"{http / floor:.2f}x",
                f"{added:,.0f}",
            )
        )
    trip = medians["round trip/HTTP"]
    rows.append((backend, "transport", "HTTP GET of an unknown route (404)", trip, "n/a", ""))
    return rows


def print_rows(rows: list[Row], markdown: bool) -> None:
    header = (
        "backend", "measurement", "candidate", "median ops/s", "median µs/op", "ratio to in-process",
        "µs added by HTTP",
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
        f"uvicorn {uvicorn.__version__}, httpx {httpx.__version__}, {os.cpu_count()} CPUs, "
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
    end_load = os.getloadavg()
    print(
        f"# load average (1 min) at start {load[0]:.2f}, at end {end_load[0]:.2f}; "
        f"total {time.monotonic() - started:.0f} s"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
