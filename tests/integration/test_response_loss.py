"""Real response loss over loopback sockets, recovered by the client (contract §2.7, §4, §7).

The server is ``admission serve`` (the HTTP adapter under uvicorn) in its own
OS process, on a real loopback socket, over a real database: one fresh
database and one server per SQL backend (SQLite and PostgreSQL, as
``ADMISSION_TEST_BACKEND`` selects), each test in a namespace of its own.  The
test plays the engine through its own service on the same database.  Between
client and server sits ``tests/tcp_proxy.py``: a TCP proxy that lets each
request through, reads the server's whole response, and then drops it (closes
the client's connection without sending a byte).  The server did the work;
the client saw nothing.  Nothing here mocks the network.

Each test then counts what the database holds: one command per logical call,
one admission event per command, and the ids the lost response carried are
the ids the recovered answer carries.  The tallies go into the run summary.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from sqlalchemy import Engine, func, select

from admission.client import (
    AdmissionClient,
    AsyncAdmissionClient,
    InvalidRequest,
    Receipt,
    SignalFailed,
    TransportFailed,
    TransportRetryPolicy,
    UpdateFailed,
)
from admission.http import AesGcmCodec, CborCodec, Codec, JsonCodec
from admission.intent import Value, receipt_token
from admission.receipts import AdmissionService
from admission.sql import (
    SqlStore,
    create_admission_engine,
    workflow_commands,
    workflow_history_events,
    workflow_instances,
)
from tests.conftest import SUMMARY_LINES
from tests.support.backends import SQL_BACKENDS, PostgresPool, database_url
from tests.support.processes import WAIT
from tests.support.tcp_proxy import Exchange, ProxiedRequest, ResponseDroppingProxy

# Short backoffs keep the run small; the schedule itself is tested in tests/test_client.py.
FAST = TransportRetryPolicy(max_attempts=3, initial_backoff_seconds=0.005, max_backoff_seconds=0.05)
ONE_ATTEMPT = TransportRetryPolicy(max_attempts=1)
STARTUP_SECONDS = 30.0
ADMISSION_EVENTS = ("SignalReceived", "UpdateAccepted")
TEST_KEY = bytes(range(32))
TEST_KEY_ID = "test-key-1"


@dataclass
class Served:
    """The app on a real socket, the proxy in front of it, and the database under both."""

    backend: str
    service: AdmissionService
    proxy: ResponseDroppingProxy
    engine: Engine

    def client(
        self, namespace: str, policy: TransportRetryPolicy = FAST, codec: Codec | None = None
    ) -> AdmissionClient:
        return AdmissionClient(self.proxy.url, namespace=namespace, policy=policy, codec=codec)

    def commands(self, namespace: str) -> list[tuple[str, str, str | None]]:
        """(id, command type, receipt token) of every command in the namespace."""
        query = (
            select(workflow_commands.c.id, workflow_commands.c.command_type, workflow_commands.c.request_id)
            .select_from(
                workflow_commands.join(
                    workflow_instances, workflow_instances.c.id == workflow_commands.c.instance_id
                )
            )
            .where(workflow_instances.c.namespace == namespace)
        )
        with self.engine.connect() as connection:
            return [(row.id, row.command_type, row.request_id) for row in connection.execute(query)]

    def events(self, namespace: str) -> Counter[tuple[str, str | None]]:
        """How many events of each (type, command id) the namespace's log holds."""
        query = select(
            workflow_history_events.c.event_type, workflow_history_events.c.command_id, func.count()
        ).where(workflow_history_events.c.namespace == namespace)
        query = query.group_by(workflow_history_events.c.event_type, workflow_history_events.c.command_id)
        with self.engine.connect() as connection:
            return Counter({(row[0], row[1]): row[2] for row in connection.execute(query)})


def _free_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as probe:
        return int(probe.getsockname()[1])


def _listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
    except OSError:
        return False
    return True


@contextlib.contextmanager
def admission_serve(db_url: str) -> Iterator[int]:
    """``admission --db URL serve`` as its own OS process, on loopback; yields its port.

    It accepts ``json``, ``cbor`` and ``aes-gcm`` under the test key (given the
    way an operator gives it, in the environment).
    """
    environment = {
        **os.environ,
        "ADMISSION_AES_GCM_KEY": base64.b64encode(TEST_KEY).decode("ascii"),
        "ADMISSION_AES_GCM_KEY_ID": TEST_KEY_ID,
    }
    log = ""
    for _ in range(3):  # another process may take the probed port first
        port = _free_port()
        # The log goes to a file: a pipe nobody reads could fill and stall the server.
        with tempfile.TemporaryFile() as stderr:
            server = subprocess.Popen(
                [sys.executable, "-m", "admission", "--db", db_url, "serve", "--port", str(port)],
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                env=environment,
            )
            try:
                deadline = time.monotonic() + STARTUP_SECONDS
                while server.poll() is None and not _listening(port) and time.monotonic() < deadline:
                    time.sleep(0.02)
                if server.poll() is None and _listening(port):
                    yield port
                    return
            finally:
                if server.poll() is None:
                    server.terminate()
                    try:
                        server.wait(WAIT)
                    except subprocess.TimeoutExpired:
                        server.kill()
                        server.wait(WAIT)
                stderr.seek(0)
                log = stderr.read().decode("utf-8", "replace")
    raise RuntimeError(f"admission serve did not start: {log[-2000:]}")


@pytest.fixture(scope="module", params=SQL_BACKENDS)
def server(
    request: pytest.FixtureRequest, postgres_pool: PostgresPool, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, str, int]]:
    """One ``admission serve`` per backend for the module: (backend, database URL, port).

    Its tests keep apart by namespace, and count only their own namespace's rows.
    """
    backend = str(request.param)
    url = database_url(backend, postgres_pool, tmp_path_factory.mktemp("response-loss"))
    with admission_serve(url) as port:
        yield backend, url, port


@pytest.fixture
def served(server: tuple[str, str, int]) -> Iterator[Served]:
    # The server is the deployable one, in its own process; the test plays the
    # engine (starting runs, completing updates) through its own service on
    # the same database, and counts rows there.  Each test has its own proxy.
    backend, url, port = server
    store = SqlStore.open(url)
    engine = create_admission_engine(url)
    try:
        with ResponseDroppingProxy(("127.0.0.1", port)) as proxy:
            yield Served(backend, AdmissionService(store), proxy, engine)
            assert proxy.errors == [], proxy.errors
    finally:
        engine.dispose()
        store.dispose()


def first_sight() -> Callable[[ProxiedRequest], bool]:
    """A drop rule's condition: the first time a request body is seen (the first attempt of a call)."""
    seen: set[bytes] = set()

    def first(request: ProxiedRequest) -> bool:
        if request.body in seen:
            return False
        seen.add(request.body)
        return True

    return first


def body(exchange: Exchange) -> dict[str, object]:
    parsed = json.loads(exchange.response_body)
    assert isinstance(parsed, dict)
    return parsed


def assert_same_admission(lost: dict[str, object], receipt: Receipt) -> None:
    """The recovered answer carries the ids of the answer that was lost."""
    for field in ("command_id", "run_id", "command_sequence", "received_at", "request_id", "update_id"):
        assert receipt.raw.get(field) == lost.get(field), field


def calls(count: int) -> list[tuple[str, str, Value, bool]]:
    """``count`` logical calls across signals and updates, both scopes, several argument shapes."""
    plan: list[tuple[str, str, Value, bool]] = []
    for i in range(count):
        kind = "signal" if i % 2 == 0 else "update"
        arguments: Value = [i, float(i), {"note": "é" * (i % 3), "neg": -0.0}] if i % 4 < 2 else {"n": i}
        plan.append((kind, f"wf-{i % 4}", arguments, i % 3 == 0))
    return plan


def start_runs(served: Served, namespace: str, count: int = 4) -> dict[str, str]:
    return {f"wf-{i}": served.service.start_run(namespace, f"wf-{i}").run_id for i in range(count)}


def send(
    client: AdmissionClient,
    kind: str,
    workflow_id: str,
    arguments: Value,
    run_id: str | None,
    **options: object,
) -> Receipt:
    if kind == "signal":
        return client.signal(workflow_id, "paid", arguments, run_id=run_id, **options)  # type: ignore[arg-type]
    return client.update(workflow_id, "approve", arguments, run_id=run_id, **options)  # type: ignore[arg-type]


def assert_one_command_per_call(served: Served, namespace: str, keys: list[tuple[str, str]]) -> int:
    commands = served.commands(namespace)
    tokens = Counter(token for _, _, token in commands)
    for kind, key in keys:
        assert tokens[receipt_token(kind, key)] == 1, key
    assert len(commands) == len(keys)
    events = served.events(namespace)
    for command_id, kind, _ in commands:
        admitted = "SignalReceived" if kind == "signal" else "UpdateAccepted"
        assert events[(admitted, command_id)] == 1
    assert sum(n for (event_type, _), n in events.items() if event_type in ADMISSION_EVENTS) == len(keys)
    return len(commands)


def test_24_lost_202s_are_recovered_by_the_automatic_retry_as_the_original(served: Served) -> None:
    namespace = "loss-auto"
    runs = start_runs(served, namespace)
    clients = [served.client(namespace, codec=JsonCodec()), served.client(namespace, codec=CborCodec())]
    served.proxy.drop(24, when=first_sight())
    keys: list[tuple[str, str]] = []
    recovered = 0
    for i, (kind, workflow_id, arguments, pinned) in enumerate(calls(24)):
        before = len(served.proxy.dropped)
        receipt = send(clients[i % 2], kind, workflow_id, arguments, runs[workflow_id] if pinned else None)
        lost = served.proxy.dropped[before:]
        assert len(lost) == 1 and lost[0].status == 202
        original = body(lost[0])
        assert original["retained"] is False and original["request_id"] == receipt.request_id
        assert receipt.status == 202 and receipt.retained and receipt.intent_verified
        assert_same_admission(original, receipt)
        assert receipt.target_scope == ("run" if pinned else "instance")
        assert receipt.request_id is not None and receipt.request_id.startswith(f"sdk-python-{kind}-")
        keys.append((kind, receipt.request_id))
        recovered += 1
    for client in clients:
        client.close()
    statuses = served.proxy.dropped_statuses()
    assert statuses == Counter({202: 24}) and served.proxy.armed() == 0
    assert len(served.proxy.exchanges) == 48  # one lost and one recovering attempt per call
    in_db = assert_one_command_per_call(served, namespace, keys)
    SUMMARY_LINES.append(
        f"response loss [{served.backend}] automatic retry: dropped {sum(statuses.values())} "
        f"(by status {dict(statuses)}), recovered {recovered} as retained, commands in db {in_db}"
    )


def test_24_lost_202s_with_caller_keys_are_recovered_by_a_manual_retry(served: Served) -> None:
    namespace = "loss-manual"
    runs = start_runs(served, namespace)
    client = served.client(namespace, policy=ONE_ATTEMPT)
    keys: list[tuple[str, str]] = []
    recovered = 0
    for i, (kind, workflow_id, arguments, pinned) in enumerate(calls(24)):
        key = [f"payment:{i}", f"Zahlung-ß-{i}", f"order/{i}/😀", f"A{i}" * 40][i % 4]
        run_id = runs[workflow_id] if pinned else None
        served.proxy.drop(1)
        with pytest.raises(TransportFailed) as caught:
            send(client, kind, workflow_id, arguments, run_id, request_id=key)
        assert caught.value.request_id == key and caught.value.attempts == 1
        lost = served.proxy.dropped[-1]
        assert lost.status == 202 and body(lost)["request_id"] == key
        receipt = send(client, kind, workflow_id, arguments, run_id, request_id=key)  # the caller's retry
        assert receipt.retained and receipt.intent_verified and receipt.request_id == key
        assert_same_admission(body(lost), receipt)
        keys.append((kind, key))
        recovered += 1
    client.close()
    statuses = served.proxy.dropped_statuses()
    assert statuses == Counter({202: 24})
    in_db = assert_one_command_per_call(served, namespace, keys)
    SUMMARY_LINES.append(
        f"response loss [{served.backend}] caller key, manual retry: dropped {sum(statuses.values())} "
        f"(by status {dict(statuses)}), recovered {recovered} as retained, commands in db {in_db}"
    )


def test_a_response_lost_after_the_update_completed_is_recovered_as_200_completed(served: Served) -> None:
    namespace = "loss-completed"
    served.service.start_run(namespace, "wf-0")
    key = "approve-order-17"
    completed: list[str] = []

    def worker() -> None:
        # The engine's side: complete the update once it has been admitted.
        deadline = time.monotonic() + STARTUP_SECONDS
        while time.monotonic() < deadline:
            receipt = served.service.receipt(namespace, "wf-0", "update", key)
            if receipt is not None and receipt.update_id is not None:
                served.service.complete_update(namespace, "wf-0", receipt.update_id, {"approved": True})
                completed.append(receipt.update_id)
                return
            time.sleep(0.005)

    thread = threading.Thread(target=worker)
    thread.start()
    served.proxy.drop(1)
    with served.client(namespace) as client:
        receipt = client.update(
            "wf-0", "approve", [17], request_id=key, wait_for="completed", wait_timeout_seconds=30
        )
    thread.join(STARTUP_SECONDS)
    (lost,) = served.proxy.dropped
    assert lost.status == 200 and body(lost)["update_status"] == "completed"
    assert receipt.status == 200 and receipt.completed and receipt.retained
    assert receipt.result == {"approved": True} and receipt.update_id == completed[0]
    assert_same_admission(body(lost), receipt)
    events = served.events(namespace)
    (command_id, _, _), *others = served.commands(namespace)
    assert others == []
    assert events[("UpdateAccepted", command_id)] == 1 and events[("UpdateCompleted", command_id)] == 1
    SUMMARY_LINES.append(
        f"response loss [{served.backend}] after completion: dropped {len(served.proxy.dropped)} "
        f"(by status {dict(served.proxy.dropped_statuses())}), recovered 1 as 200 completed, "
        f"commands in db {1 + len(others)}"
    )


# Each racing client is an OS process of its own that imports only the client, so
# the four start fast; they announce "ready", then all send when told "go".
CALLER = """
import json, sys
from admission.client import AdmissionClient, TransportRetryPolicy

url, namespace, kind, key = sys.argv[1:5]
policy = TransportRetryPolicy(max_attempts=8, initial_backoff_seconds=0.001, max_backoff_seconds=0.02)
with AdmissionClient(url, namespace=namespace, policy=policy) as client:
    print("ready", flush=True)
    sys.stdin.readline()
    if kind == "signal":
        receipt = client.signal("wf-0", "paid", {"amount": 12.5}, request_id=key)
    else:
        receipt = client.update("wf-0", "approve", {"amount": 12.5}, request_id=key)
print(json.dumps(dict(receipt.raw)), flush=True)
"""


def race(url: str, namespace: str, kind: str, key: str, count: int) -> list[dict[str, object]]:
    """Start ``count`` client processes, release them together, and return their receipts."""
    callers = [
        subprocess.Popen(
            [sys.executable, "-c", CALLER, url, namespace, kind, key],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(count)
    ]
    try:
        for caller in callers:
            assert caller.stdout is not None and caller.stdout.readline().strip() == "ready"
        for caller in callers:
            assert caller.stdin is not None
            caller.stdin.write("go\n")
            caller.stdin.flush()
        outputs = [caller.communicate(timeout=WAIT)[0] for caller in callers]
        assert [caller.returncode for caller in callers] == [0] * count
        return [json.loads(output) for output in outputs]
    finally:
        for caller in callers:
            if caller.poll() is None:
                caller.kill()
                caller.wait(WAIT)


@pytest.mark.parametrize("kind", ["signal", "update"])
def test_four_concurrent_clients_retrying_one_key_admit_one_command(served: Served, kind: str) -> None:
    namespace = f"loss-race-{kind}"
    served.service.start_run(namespace, "wf-0")
    key = f"one-key-{kind}"
    served.proxy.drop(4)  # the first four answers, whichever client they were for
    receipts = race(served.proxy.url, namespace, kind, key, 4)
    assert len({r["command_id"] for r in receipts}) == 1 and all(r["request_id"] == key for r in receipts)
    answers = [body(e) for e in served.proxy.exchanges]
    assert len(served.proxy.dropped) == 4
    # Across every answer the server gave, delivered or lost, exactly one was fresh.
    assert sum(1 for a in answers if a["retained"] is False) == 1
    assert {a["command_id"] for a in answers} == {receipts[0]["command_id"]}
    in_db = assert_one_command_per_call(served, namespace, [(kind, key)])
    SUMMARY_LINES.append(
        f"response loss [{served.backend}] 4 concurrent client processes, one {kind} key: dropped "
        f"{len(served.proxy.dropped)}, answers {len(answers)} (1 fresh), commands in db {in_db}"
    )


def test_a_changed_intent_retry_after_a_lost_response_gets_the_typed_conflict_and_writes_nothing(
    served: Served,
) -> None:
    namespace = "loss-conflict"
    runs = start_runs(served, namespace, 1)
    client = served.client(namespace, policy=ONE_ATTEMPT)
    served.proxy.drop(2)
    with pytest.raises(TransportFailed):
        client.signal("wf-0", "paid", [1], request_id="k-signal")
    with pytest.raises(TransportFailed):
        client.update("wf-0", "approve", [1], request_id="k-update")
    commands, events = served.commands(namespace), served.events(namespace)
    exchanges = len(served.proxy.exchanges)
    changes: list[tuple[Callable[[], Receipt], type[Exception], list[str]]] = [
        (lambda: client.signal("wf-0", "paid", [2], request_id="k-signal"), SignalFailed, ["arguments"]),
        (lambda: client.signal("wf-0", "refund", [1], request_id="k-signal"), SignalFailed, ["name"]),
        (
            lambda: client.signal("wf-0", "paid", [1], request_id="k-signal", run_id=runs["wf-0"]),
            SignalFailed,
            ["target"],
        ),
        (
            lambda: client.update("wf-0", "reject", {"why": 1}, request_id="k-update"),
            UpdateFailed,
            ["arguments", "name"],
        ),
    ]
    for change, failure, parts in changes:
        with pytest.raises(failure) as caught:
            change()
        error = caught.value
        assert isinstance(error, (SignalFailed, UpdateFailed))
        assert error.reason == "request_id_conflict" and error.status == 409
        assert error.request_id in ("k-signal", "k-update")
        conflict, retained_type = error.details["conflict"], error.details["retained_command_type"]
        assert isinstance(conflict, list) and sorted(conflict) == parts
        assert retained_type in ("signal", "update") and error.request_id is not None
        token = receipt_token(retained_type, error.request_id)
        assert [c[0] for c in commands if c[2] == token] == [error.details["retained_command_id"]]
    client.close()
    # Each conflict was one request (never retried), and nothing was written.
    assert len(served.proxy.exchanges) == exchanges + len(changes)
    assert served.commands(namespace) == commands and served.events(namespace) == events
    assert len(commands) == 2
    SUMMARY_LINES.append(
        f"response loss [{served.backend}] changed intent: dropped 2, conflicts {len(changes)} "
        f"(one request each), commands in db {len(commands)} (unchanged)"
    )


def test_the_async_client_recovers_lost_responses_the_same_way(served: Served) -> None:
    namespace = "loss-async"
    runs = start_runs(served, namespace)
    served.proxy.drop(8, when=first_sight())

    async def scenario() -> list[Receipt]:
        async with AsyncAdmissionClient(served.proxy.url, namespace=namespace, policy=FAST) as client:
            receipts = []
            for kind, workflow_id, arguments, pinned in calls(8):
                run_id = runs[workflow_id] if pinned else None
                if kind == "signal":
                    receipts.append(await client.signal(workflow_id, "paid", arguments, run_id=run_id))
                else:
                    receipts.append(await client.update(workflow_id, "approve", arguments, run_id=run_id))
            return receipts

    receipts = asyncio.run(scenario())
    lost = served.proxy.dropped
    assert len(lost) == 8 and all(r.retained and r.intent_verified for r in receipts)
    for exchange, receipt in zip(lost, receipts, strict=True):
        assert_same_admission(body(exchange), receipt)
    keys = [(r.command_type, r.request_id) for r in receipts if r.request_id is not None]
    in_db = assert_one_command_per_call(served, namespace, keys)
    SUMMARY_LINES.append(
        f"response loss [{served.backend}] async client: dropped {len(lost)}, "
        f"recovered {len(receipts)} as retained, commands in db {in_db}"
    )


def test_encrypted_arguments_retried_by_hand_under_a_new_nonce_are_the_same_intent(served: Served) -> None:
    namespace = "loss-encrypted"
    runs = start_runs(served, namespace)
    codec = AesGcmCodec(TEST_KEY, TEST_KEY_ID)
    by_hand = served.client(namespace, policy=ONE_ATTEMPT, codec=codec)
    keys: list[tuple[str, str]] = []
    for i, (kind, workflow_id, arguments, pinned) in enumerate(calls(8)):
        key, run_id = f"secret-{i}", runs[workflow_id] if pinned else None
        served.proxy.drop(1)
        with pytest.raises(TransportFailed):
            send(by_hand, kind, workflow_id, arguments, run_id, request_id=key)
        receipt = send(by_hand, kind, workflow_id, arguments, run_id, request_id=key)
        lost, retry = served.proxy.exchanges[-2:]
        assert lost.dropped and not retry.dropped
        blobs = [json.loads(e.request.body)["input"]["blob"] for e in (lost, retry)]
        assert blobs[0] != blobs[1]  # encrypted again, under a fresh nonce
        assert receipt.retained and receipt.intent_verified  # the digest is over the plaintext
        assert_same_admission(body(lost), receipt)
        keys.append((kind, key))
    by_hand.close()
    # The automatic retry resends the very same ciphertext: the body was serialised once.
    with served.client(namespace, codec=codec) as automatic:
        served.proxy.drop(1)
        receipt = automatic.signal("wf-0", "paid", {"card": "4111 1111 1111 1111"})
    lost, retry = served.proxy.exchanges[-2:]
    assert lost.dropped and lost.request.body == retry.request.body and receipt.retained
    assert receipt.request_id is not None
    keys.append(("signal", receipt.request_id))
    # A blob under another key fails authentication: 422 input_invalid, nothing written.
    before = served.commands(namespace)
    stranger = served.client(namespace, codec=AesGcmCodec(bytes(32), TEST_KEY_ID))
    with stranger, pytest.raises(InvalidRequest) as caught:
        stranger.signal("wf-0", "paid", [1], request_id="forged")
    assert caught.value.reason == "input_invalid" and caught.value.field == "input"
    assert caught.value.request_id == "forged" and served.commands(namespace) == before
    in_db = assert_one_command_per_call(served, namespace, keys)
    SUMMARY_LINES.append(
        f"response loss [{served.backend}] aes-gcm: dropped {len(served.proxy.dropped)}, recovered "
        f"{len(keys) - 1} by hand under new nonces and 1 automatically with the same ciphertext, "
        f"all retained; commands in db {in_db}"
    )


@pytest.mark.parametrize("keep", [0, 25])
def test_responses_cut_after_the_head_are_recovered_by_the_automatic_retry(served: Served, keep: int) -> None:
    namespace = f"loss-cut-{keep}"
    runs = start_runs(served, namespace)
    served.proxy.drop(6, when=first_sight(), keep=keep)
    with served.client(namespace) as client:
        receipts = [
            send(client, kind, workflow_id, arguments, runs[workflow_id] if pinned else None)
            for kind, workflow_id, arguments, pinned in calls(6)
        ]
    cut = served.proxy.dropped
    assert len(cut) == 6 and all(len(e.response_body) > keep for e in cut)  # the client saw a part only
    for exchange, receipt in zip(cut, receipts, strict=True):
        assert receipt.retained and receipt.intent_verified
        assert_same_admission(body(exchange), receipt)
    keys = [(r.command_type, r.request_id) for r in receipts if r.request_id is not None]
    in_db = assert_one_command_per_call(served, namespace, keys)
    SUMMARY_LINES.append(
        f"response loss [{served.backend}] responses cut after the head and {keep} body bytes: "
        f"{len(cut)}, recovered {len(receipts)} as retained, commands in db {in_db}"
    )


GUIDE = Path(__file__).resolve().parents[2] / "docs" / "client.md"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)


def test_every_python_block_of_the_client_guide_runs(served: Served) -> None:
    # The guide's address is where `admission serve` listens by default; here, the test's server.
    blocks = [
        b.replace("http://127.0.0.1:8000", served.proxy.url) for b in BLOCK.findall(GUIDE.read_text("utf-8"))
    ]
    assert len(blocks) >= 5
    served.service.start_run("default", "order-42")
    namespace: dict[str, object] = {"__name__": "docs.client"}
    for number, block in enumerate(blocks, 1):
        try:
            exec(compile(block, f"client.md[block {number}]", "exec"), namespace)
        except Exception as exc:
            raise AssertionError(f"client.md block {number} failed: {exc!r}") from exc
    assert served.proxy.dropped == [] and len(served.proxy.exchanges) >= 6


class _Upstream(BaseHTTPRequestHandler):
    """A plain HTTP/1.1 server for the proxy's own test: sized, chunked and echoed bodies."""

    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        if self.path == "/chunked":
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for chunk in (b"hello, ", b"chunked world"):
                self.wfile.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
            self.wfile.write(b"0\r\n\r\n")
            return
        payload = b"sized body"
        self.send_response(200)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def do_POST(self) -> None:
        payload = self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(201)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_the_proxy_forwards_what_it_is_not_told_to_drop_and_tallies_what_it_drops() -> None:
    upstream = ThreadingHTTPServer(("127.0.0.1", 0), _Upstream)
    thread = threading.Thread(target=upstream.serve_forever, daemon=True)
    thread.start()
    try:
        with ResponseDroppingProxy(("127.0.0.1", upstream.server_address[1])) as proxy:
            proxy.drop(2, when=lambda request: request.path == "/echo")
            with httpx.Client(base_url=proxy.url) as client:
                assert client.get("/sized").content == b"sized body"
                assert client.get("/chunked").content == b"hello, chunked world"
                for attempt in (b"first", b"second"):
                    with pytest.raises(httpx.RemoteProtocolError):
                        client.post("/echo", content=attempt)
                third = client.post("/echo", content=b"third")
                assert third.status_code == 201 and third.content == b"third"
            assert proxy.dropped_statuses() == Counter({201: 2}) and proxy.armed() == 0
            assert [e.request.body for e in proxy.dropped] == [b"first", b"second"]
            assert [e.response_body for e in proxy.dropped] == [b"first", b"second"]  # the server answered
            assert [(e.request.path, e.dropped) for e in proxy.exchanges] == [
                ("/sized", False),
                ("/chunked", False),
                ("/echo", True),
                ("/echo", True),
                ("/echo", False),
            ]
            assert proxy.errors == []
    finally:
        upstream.shutdown()
        upstream.server_close()
