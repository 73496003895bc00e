"""An ASGI app under uvicorn on loopback, in a thread of the test's own process."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from tests.support.pgserver import free_port


@contextmanager
def uvicorn_in_thread(app: Any, **config: Any) -> Iterator[int]:
    """``app`` served by uvicorn (``config``: more of ``uvicorn.Config``'s arguments); yields the port."""
    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", **config))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        for _ in range(3000):
            if server.started:
                break
            time.sleep(0.01)
        assert server.started
        yield port
    finally:
        server.should_exit = True
        thread.join(30)
