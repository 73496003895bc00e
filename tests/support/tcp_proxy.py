"""A real TCP proxy on 127.0.0.1 that loses responses after the server has answered.

Between a client and an HTTP/1.1 server: every request is forwarded to the
server and the server's full response is read.  Then, while a drop rule is
armed and the request matches it, the response is DROPPED: the client's
connection is closed without a single byte of it.  The server has done its
work; the client sees a disconnect before any response, which is exactly the
lost response a command key exists for (contract §2.7, §7).

A rule can also cut the response instead: the head and part of the body go
out, then the close (a connection lost in the middle of a response).

Everything is recorded: each exchange (method, path, request body, the
server's status code from its status line, the response body, and whether it
was dropped), so a test can count what was lost and read the ids the server
gave in a response the client never saw.

Threads and blocking sockets only; each client connection gets its own
upstream connection, so keep-alive works as it would through a real proxy.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import TracebackType
from typing import BinaryIO

MAX_HEAD = 64 * 1024


@dataclass(frozen=True)
class ProxiedRequest:
    """A request as the proxy forwarded it."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass(frozen=True)
class Exchange:
    """One request and the server's response to it, as the proxy saw them."""

    number: int
    request: ProxiedRequest
    status: int
    response_body: bytes
    dropped: bool


@dataclass
class _Rule:
    remaining: int
    when: Callable[[ProxiedRequest], bool]
    keep: int | None


class ProtocolBroken(Exception):
    """The bytes on a connection are not HTTP/1.1 as the proxy understands it."""


def _read_head(stream: BinaryIO) -> list[bytes] | None:
    """The start line and header lines of a message; ``None`` at a clean end of stream."""
    lines: list[bytes] = []
    size = 0
    while True:
        line = stream.readline(MAX_HEAD + 1)
        if not line:
            if lines:
                raise ProtocolBroken("connection closed inside a message head")
            return None
        size += len(line)
        if size > MAX_HEAD:
            raise ProtocolBroken("message head too large")
        if line in (b"\r\n", b"\n"):
            if not lines:
                continue  # tolerated blank lines between messages (RFC 9112 §2.2)
            return lines
        lines.append(line)


def _headers(lines: list[bytes]) -> dict[str, str]:
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    return headers


def _read_exact(stream: BinaryIO, size: int) -> bytes:
    data = stream.read(size)
    if len(data) != size:
        raise ProtocolBroken(f"connection closed after {len(data)} of {size} body bytes")
    return data


def _read_body(stream: BinaryIO, headers: dict[str, str], *, until_close: bool) -> tuple[bytes, bytes]:
    """(the raw bytes to forward, the decoded body)."""
    if "chunked" in headers.get("transfer-encoding", "").lower():
        raw = bytearray()
        body = bytearray()
        while True:
            size_line = stream.readline(MAX_HEAD)
            raw += size_line
            size = int(size_line.split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while True:  # trailer section, up to its blank line
                    trailer = stream.readline(MAX_HEAD)
                    raw += trailer
                    if trailer in (b"\r\n", b"\n", b""):
                        return bytes(raw), bytes(body)
            chunk = _read_exact(stream, size + 2)
            raw += chunk
            body += chunk[:-2]
    if "content-length" in headers:
        data = _read_exact(stream, int(headers["content-length"]))
        return data, data
    if until_close:
        data = stream.read()
        return data, data
    return b"", b""


class ResponseDroppingProxy:
    """Forwards 127.0.0.1:<port> to ``upstream``, dropping armed responses after the server answered.

    ``drop(count, when=...)`` arms a rule: the next ``count`` responses to
    requests for which ``when(request)`` is true are dropped.  Rules are
    checked in the order they were armed.  ``exchanges`` is everything seen,
    ``dropped`` what was lost, ``dropped_statuses()`` a tally by status code.
    """

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self._lock = threading.Lock()
        self._rules: list[_Rule] = []
        self._exchanges: list[Exchange] = []
        self._listener: socket.socket | None = None
        self._threads: list[threading.Thread] = []
        self._sockets: set[socket.socket] = set()
        self._stopping = threading.Event()
        self.errors: list[BaseException] = []

    # -- control --------------------------------------------------------------------------

    def start(self) -> ResponseDroppingProxy:
        listener = socket.create_server(("127.0.0.1", 0))
        listener.settimeout(0.2)
        self._listener = listener
        thread = threading.Thread(target=self._accept, name="proxy-accept", daemon=True)
        thread.start()
        self._threads.append(thread)
        return self

    @property
    def port(self) -> int:
        assert self._listener is not None, "start() first"
        return int(self._listener.getsockname()[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def drop(
        self, count: int, when: Callable[[ProxiedRequest], bool] | None = None, *, keep: int | None = None
    ) -> None:
        """Drop the next ``count`` responses to requests matching ``when`` (all requests if ``None``).

        With ``keep``, the response is cut instead: its head and the first
        ``keep`` bytes of its body are sent, then the connection is closed.
        """
        with self._lock:
            self._rules.append(_Rule(count, when or (lambda _request: True), keep))

    def armed(self) -> int:
        """How many drops are still armed."""
        with self._lock:
            return sum(rule.remaining for rule in self._rules)

    @property
    def exchanges(self) -> list[Exchange]:
        with self._lock:
            return list(self._exchanges)

    @property
    def dropped(self) -> list[Exchange]:
        return [e for e in self.exchanges if e.dropped]

    def dropped_statuses(self) -> Counter[int]:
        """How many responses were dropped, by the status code the server had sent."""
        return Counter(e.status for e in self.dropped)

    def stop(self) -> None:
        self._stopping.set()
        if self._listener is not None:
            self._listener.close()
        with self._lock:
            sockets = list(self._sockets)
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        for thread in self._threads:
            thread.join(10)

    def __enter__(self) -> ResponseDroppingProxy:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # -- the work ---------------------------------------------------------------------------

    def _accept(self) -> None:
        assert self._listener is not None
        while not self._stopping.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            client.settimeout(None)
            with self._lock:
                self._sockets.add(client)
            thread = threading.Thread(target=self._serve, args=(client,), name="proxy-conn", daemon=True)
            with self._lock:
                self._threads.append(thread)
            thread.start()

    def _should_drop(self, request: ProxiedRequest) -> _Rule | None:
        # Called with the lock held.
        for rule in self._rules:
            if rule.remaining > 0 and rule.when(request):
                rule.remaining -= 1
                return rule
        return None

    def _serve(self, client: socket.socket) -> None:
        upstream: socket.socket | None = None
        try:
            with contextlib.ExitStack() as stack:
                client_in = stack.enter_context(client.makefile("rb"))
                upstream_in: BinaryIO | None = None
                for answered, (request_head, request) in enumerate(self._requests(client_in)):
                    if upstream is None:
                        upstream = socket.create_connection(self.upstream)
                        with self._lock:
                            self._sockets.add(upstream)
                        upstream_in = stack.enter_context(upstream.makefile("rb"))
                    assert upstream_in is not None
                    try:
                        upstream.sendall(request_head + request.body)
                    except OSError:
                        if answered:
                            return  # as below: a kept-alive connection the server closed
                        raise
                    response_head = _read_head(upstream_in)
                    if response_head is None:
                        if answered:
                            # The server closed a kept-alive connection as this request
                            # arrived: pass the close on, as a proxy does; not a fault.
                            return
                        raise ProtocolBroken("server closed the connection without answering")
                    status = int(response_head[0].split()[1])
                    response_headers = _headers(response_head)
                    if status in (204, 304) or 100 <= status < 200:
                        raw = body = b""
                    else:
                        raw, body = _read_body(upstream_in, response_headers, until_close=True)
                    with self._lock:
                        rule = self._should_drop(request)
                        number = len(self._exchanges) + 1
                        self._exchanges.append(Exchange(number, request, status, body, rule is not None))
                    if rule is not None:
                        # The server answered; the client gets nothing (or a cut response), then the close.
                        if rule.keep is not None:
                            client.sendall(b"".join(response_head) + b"\r\n" + raw[: rule.keep])
                        return
                    client.sendall(b"".join(response_head) + b"\r\n" + raw)
                    if response_headers.get("connection", "").lower() == "close":
                        return
        except (OSError, ProtocolBroken, ValueError) as exc:
            if not self._stopping.is_set():
                self.errors.append(exc)
        finally:
            for sock in (client, upstream):
                if sock is None:
                    continue
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()
                with self._lock:
                    self._sockets.discard(sock)

    def _requests(self, stream: BinaryIO) -> Iterator[tuple[bytes, ProxiedRequest]]:
        while True:
            head = _read_head(stream)
            if head is None:
                return
            method, target, _version = head[0].decode("latin-1").split(" ", 2)
            headers = _headers(head)
            _raw, body = _read_body(stream, headers, until_close=False)
            if "chunked" in headers.get("transfer-encoding", "").lower():
                # Forwarded with a length instead, so the server reads exactly what was decoded.
                lines = [
                    line
                    for line in head
                    if not line.lower().startswith((b"transfer-encoding:", b"content-length:"))
                ]
                lines.append(f"Content-Length: {len(body)}\r\n".encode("ascii"))
                head = lines
            yield b"".join(head) + b"\r\n", ProxiedRequest(method, target, headers, body)
