"""The app under uvicorn with either HTTP parser: `h11` (forced, as without `httptools`) and `httptools`.

``admission serve`` lets uvicorn pick (``httptools`` when installed, the
``http`` extra brings it); both must give a kept-alive client every answer
whole: admissions, a retry, a 404, and a 413 that closes the connection.
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from admission.http import JsonCodec, create_app, envelope
from admission.receipts import AdmissionService, MemoryStore
from tests.support.inthread import uvicorn_in_thread


@contextmanager
def serving(parser: str) -> Iterator[int]:
    """The app over a fresh service under uvicorn with ``parser``, in a thread; yields its port."""
    service = AdmissionService(MemoryStore())
    service.start_run("default", "wf")
    with uvicorn_in_thread(create_app(service, max_body_bytes=1000), http=parser) as port:
        yield port


@pytest.mark.parametrize("parser", ["h11", "httptools"])
def test_a_kept_alive_client_gets_every_answer_whole(parser: str) -> None:
    if parser == "httptools":
        pytest.importorskip("httptools")
    with serving(parser) as port:
        client = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        client.connect()
        sock = client.sock
        body = json.dumps({"request_id": "k1", "input": envelope(JsonCodec(), {"a": 1})})
        answers = []
        for method, path, content in (
            ("POST", "/api/workflows/wf/signal/go", body),
            ("POST", "/api/workflows/wf/signal/go", body),
            ("GET", "/api/none", None),
        ):
            client.request(method, path, body=content, headers={"Content-Type": "application/json"})
            response = client.getresponse()
            answers.append((response.status, json.loads(response.read())))
        assert client.sock is sock  # one connection throughout
        assert [(s, a.get("retained"), a.get("reason")) for s, a in answers] == [
            (202, False, None),
            (202, True, None),
            (404, None, "not_found"),
        ]
        # The 413 closes the connection, after its whole answer.
        client.request("POST", "/api/workflows/wf/signal/go", body=b"x" * 1001)
        response = client.getresponse()
        assert response.status == 413 and json.loads(response.read())["reason"] == "body_too_large"
        assert response.getheader("connection") == "close"
        client.close()
