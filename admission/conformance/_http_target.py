"""A conformance target for any HTTP endpoint that speaks the wire contract (``docs/http.md``).

:class:`HttpTarget` sends each admission the way a caller would: the routes and
bodies of ``docs/http.md``, the namespace in ``X-Namespace`` (UTF-8,
percent-encoded), the arguments in a ``json`` envelope when JSON carries them
exactly and in a ``cbor`` one (canonical ``intent-v1`` CBOR, base64) otherwise.
It strips nothing itself: the server's own normalisation of keys is under test
(``strips_keys``, contract §2.1).

Runs and the engine's progress go through the lifecycle routes of admission's
adapter (``docs/http.md``, "Runs and progress"), or through
:class:`LifecycleHooks` the user supplies for a server that has no such routes;
with neither, the target declares neither :data:`LIFECYCLE` nor :data:`PROGRESS`
and the machine leaves those rules out.

Anything outside the contract (no answer at all, 401, 403, a 5xx, a route that
does not exist, a body that is not a JSON object) raises
:class:`~admission.errors.ConformanceTargetError` with what the server answered:
the run cannot go on without an answer to compare.  The bearer token is never
part of a message.  httpx (the ``http`` extra) is imported when a target is built.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, ClassVar, Final, Literal
from urllib.parse import quote, urlsplit, urlunsplit

from admission.conformance._target import LIFECYCLE, PROGRESS, Answer, CommandType, Refusal
from admission.errors import AdmissionError, InvalidValueError
from admission.http._codecs import CborCodec, JsonCodec
from admission.http._tokens import encode_namespace

if TYPE_CHECKING:
    import httpx

__all__ = ["ConformanceTargetError", "HttpTarget", "LifecycleHooks", "LifecycleMode", "arguments_envelope"]


class ConformanceTargetError(AdmissionError, RuntimeError):
    """The target could not be reached, or answered outside the wire contract (401, 403, a 5xx, a
    route it does not have, a body that is not a JSON object).

    The run stops at once: without an answer there is nothing to compare.  Any
    target may raise it to stop a run.  ``status`` is the HTTP status, ``None``
    when nothing was answered; the message never holds the bearer token.
    """

    code: ClassVar[str] = "conformance_target"

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


LifecycleMode = Literal["auto", "routes", "none"]
"""How an :class:`HttpTarget` reaches runs and progress: ``auto`` asks the server whether it has the
lifecycle routes, ``routes`` requires them, ``none`` leaves lifecycle and progress out."""

_ADMISSION_STATUSES: Final = frozenset({200, 202, 409, 422})
"""The statuses an admission route answers with a body to compare (docs/http.md, "Answers and statuses")."""
_REFUSALS: Final = {409: ("run_state",), 404: ("command_unknown", "update_unknown")}
"""The lifecycle and progress refusals a route answers with, by status (docs/http.md)."""
_PROBE_WORKFLOW: Final = "conformance-probe-without-runs"


@dataclass(frozen=True)
class LifecycleHooks:
    """The lifecycle and progress steps of a target whose HTTP API has no routes for them.

    Each hook reaches the implementation under test by its own means (its
    engine's API, its database).  ``start_run``, ``close_run`` and
    ``continue_as_new`` return ``RunInfo.to_dict()`` bodies and give
    :data:`LIFECYCLE`; the three progress hooks, all given, give
    :data:`PROGRESS` and return :class:`Answer`.  A step the target refuses
    raises :class:`Refusal` with its reason.
    """

    start_run: Callable[[str, str], Mapping[str, object]]
    """``(namespace, workflow_id)``: start a run."""
    close_run: Callable[[str, str, str], Mapping[str, object]]
    """``(namespace, workflow_id, status)``: close the current run."""
    continue_as_new: Callable[[str, str], Mapping[str, object]]
    """``(namespace, workflow_id)``: continue the current run as new; the successor."""
    apply_signal: Callable[[str, str, str], Answer] | None = None
    """``(namespace, workflow_id, command_id)``: the engine delivers a signal."""
    complete_update: Callable[[str, str, str, object], Answer] | None = None
    """``(namespace, workflow_id, update_id, result)``: the engine completes an update."""
    fail_update: Callable[[str, str, str, str], Answer] | None = None
    """``(namespace, workflow_id, update_id, failure)``: the engine fails an update."""

    @property
    def progress(self) -> bool:
        """Whether every progress hook is given."""
        return None not in (self.apply_signal, self.complete_update, self.fail_update)


def _plain_json(value: object) -> bool:
    # True when the json codec carries ``value`` exactly: no bytes, and text JSON can
    # hold (valid Unicode).  Floats survive it, -0.0 and NaN included (docs/http.md, "Codecs").
    if value is None or type(value) in (bool, int):
        return True
    if type(value) is float:
        return True
    if type(value) is str:
        return _valid_text(value)
    if isinstance(value, (list, tuple)):
        return all(_plain_json(v) for v in value)
    if isinstance(value, dict):
        return all(type(k) is str and _valid_text(k) and _plain_json(v) for k, v in value.items())
    return False


def _valid_text(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def arguments_envelope(arguments: object) -> dict[str, str]:
    """The envelope for a value: ``json`` when JSON carries it exactly, else ``cbor``.

    Tuples travel as lists, as the canonical encoding reads them.  A value
    the canonical encoding refuses raises :class:`~admission.errors.InvalidValueError`.
    """
    value = list(arguments) if isinstance(arguments, tuple) else arguments
    if _plain_json(value):
        try:
            return {"codec": "json", "blob": JsonCodec().encode(value)}  # type: ignore[arg-type]
        except InvalidValueError:
            pass  # nested too deeply for the JSON encoder: CBOR has no such limit
    return {"codec": "cbor", "blob": CborCodec().encode(value)}  # type: ignore[arg-type]


def _segment(value: str) -> str:
    # Every character but unreserved ones is escaped, "/" included; a dot segment
    # would be removed by URL normalisation, so its dots are escaped too.
    if value in (".", ".."):
        return value.replace(".", "%2E")
    return quote(value, safe="")


def _shown(url: str) -> str:
    # The URL without user name and password, for names and messages.
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path.rstrip("/"), "", ""))


class HttpTarget:
    """A :class:`~admission.conformance.Target` over HTTP: any server that speaks the wire contract.

    ``url`` is the base the routes hang from (``http://127.0.0.1:8000``, or
    the prefix an engine mounts the app under).  ``token`` is sent as
    ``Authorization: Bearer`` and never shown.  ``lifecycle``: ``"auto"``
    (the default) asks the server once, with a close of a workflow that has no
    run (refused as ``run_state`` by a server with the routes, writes
    nothing), whether it has the lifecycle routes; ``"routes"`` requires them;
    ``"none"`` goes without; a :class:`LifecycleHooks` uses the hooks.
    ``probe_namespace`` is the namespace that question is asked in (one the
    token is granted).  ``timeout`` bounds each request in seconds.  Safe to share between
    threads: each caller at a time has its own client (keep-alive connections), from a
    pool that grows to the most callers ever at once.
    """

    strips_keys: bool = True
    """A server applies the HTTP-input normalisation of keys (contract §2.1)."""

    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        lifecycle: LifecycleMode | LifecycleHooks = "auto",
        timeout: float = 30.0,
        name: str | None = None,
        probe_namespace: str = "default",
    ) -> None:
        import httpx  # the http extra; a clear error, not an ImportError deep in a run

        self._httpx = httpx
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise InvalidValueError("must be an http:// or https:// URL with a host", field="url", path="")
        if token is not None and (not token or not all("\x21" <= c <= "\x7e" for c in token)):
            raise InvalidValueError("must be printable ASCII without spaces", field="token", path="")
        if not timeout > 0:
            raise InvalidValueError("must be a positive number of seconds", field="timeout", path="")
        self._base = url.rstrip("/")
        self._probe_namespace = probe_namespace
        self._token = token
        self._timeout = timeout
        self.name = name if name is not None else _shown(url)
        self.now = datetime.now(UTC)
        self._clients: list[httpx.Client] = []
        self._idle: list[httpx.Client] = []
        self._lock = threading.Lock()
        self._hooks = lifecycle if isinstance(lifecycle, LifecycleHooks) else None
        if isinstance(lifecycle, LifecycleHooks):
            self._routes = False
        elif lifecycle == "auto":
            self._routes = self._has_lifecycle_routes()
        elif lifecycle == "routes":
            if not self._has_lifecycle_routes():
                raise ConformanceTargetError(
                    f"{self.name} has no lifecycle routes (POST /api/workflows/{{id}}/close answered "
                    "not_found); give lifecycle hooks, or lifecycle='none'"
                )
            self._routes = True
        elif lifecycle == "none":
            self._routes = False
        else:
            raise InvalidValueError(
                "must be 'auto', 'routes', 'none' or LifecycleHooks", field="lifecycle", path=""
            )
        capabilities: set[str] = set()
        if self._routes or self._hooks is not None:
            capabilities.add(LIFECYCLE)
        if self._routes or (self._hooks is not None and self._hooks.progress):
            capabilities.add(PROGRESS)
        self.capabilities: frozenset[str] = frozenset(capabilities)

    # -- transport ------------------------------------------------------------------------------

    def _take(self) -> httpx.Client:
        # A client per caller at a time, returned after its request: the concurrent mode's
        # threads come and go, and the pool (keep-alive connections) stays as large as the
        # most callers ever at once.
        with self._lock:
            if self._idle:
                return self._idle.pop()
        client = self._httpx.Client(timeout=self._timeout)
        with self._lock:
            self._clients.append(client)
        return client

    def _give_back(self, client: httpx.Client) -> None:
        with self._lock:
            if client in self._clients:
                self._idle.append(client)

    def close(self) -> None:
        """Close every connection."""
        with self._lock:
            clients, self._clients, self._idle = self._clients, [], []
        for client in clients:
            client.close()

    def __enter__(self) -> HttpTarget:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _send(
        self,
        method: str,
        path: str,
        namespace: str,
        body: Mapping[str, object] | None = None,
        params: Mapping[str, str] | None = None,
    ) -> tuple[int, Mapping[str, object] | None, str]:
        headers = {"accept": "application/json", "x-namespace": encode_namespace(namespace)}
        if self._token is not None:
            headers["authorization"] = f"Bearer {self._token}"
        content = None
        if body is not None:
            headers["content-type"] = "application/json"
            # ASCII JSON: a key holding a lone surrogate travels as its escape and the server judges it.
            content = json.dumps(body, ensure_ascii=True, separators=(",", ":")).encode("ascii")
        client = self._take()
        try:
            response = client.request(
                method, self._base + path, content=content, params=params, headers=headers
            )
        except self._httpx.HTTPError as exc:
            raise ConformanceTargetError(
                f"{self.name} could not be reached or did not answer: {type(exc).__name__}: {exc}"
            ) from None
        finally:
            self._give_back(client)
        parsed: object = None
        try:
            parsed = response.json()
        except ValueError:
            parsed = None
        return response.status_code, parsed if isinstance(parsed, dict) else None, response.text

    def _outside(
        self, method: str, route: str, status: int, body: Mapping[str, object] | None, text: str
    ) -> str:
        if body is not None:
            said = f"{body.get('reason', '?')}: {body.get('message', '')}".strip()
        else:
            said = "a body that is not a JSON object: " + (text[:120] if text else "(empty)")
        return f"{self.name} answered {method} {route} with {status} ({said}), outside the contract"

    def _fail(
        self, method: str, route: str, status: int, body: Mapping[str, object] | None, text: str
    ) -> ConformanceTargetError:
        return ConformanceTargetError(self._outside(method, route, status, body, text), status=status)

    # -- the Target protocol ------------------------------------------------------------------------

    def begin(self, example: int) -> None:
        """Nothing to reset: the server keeps its state, the machine's ids keep examples apart."""

    def admit(
        self,
        namespace: str,
        workflow_id: str,
        command_type: CommandType,
        name: str,
        arguments: object,
        *,
        request_id: str | None,
        run_id: str | None,
    ) -> Answer:
        """POST the signal or update (docs/http.md, "Routes"); any admission answer is returned."""
        path = f"/api/workflows/{_segment(workflow_id)}"
        route = "/api/workflows/{workflow_id}"
        if run_id is not None:
            path += f"/runs/{_segment(run_id)}"
            route += "/runs/{run_id}"
        path += f"/{command_type}/{_segment(name)}"
        route += f"/{command_type}/{{name}}"
        body: dict[str, object] = {"input": arguments_envelope(arguments)}
        if request_id is not None:
            body["request_id"] = request_id
        status, answer, text = self._send("POST", path, namespace, body)
        if status in _ADMISSION_STATUSES and answer is not None:
            return Answer(status, _without_message(answer))
        raise self._fail("POST", route, status, answer, text)

    def receipt(
        self, namespace: str, workflow_id: str, command_type: CommandType, request_id: str
    ) -> Answer | None:
        """GET the receipt a key names; ``None`` on 404 ``receipt_not_found``."""
        path = f"/api/workflows/{_segment(workflow_id)}/receipts/{command_type}"
        route = "/api/workflows/{workflow_id}/receipts/" + command_type
        status, answer, text = self._send("GET", path, namespace, params={"request_id": request_id})
        if status == 404 and answer is not None and answer.get("reason") == "receipt_not_found":
            return None
        if status in _ADMISSION_STATUSES and answer is not None:
            return Answer(status, _without_message(answer))
        raise self._fail("GET", route, status, answer, text)

    def _engine(
        self, namespace: str, workflow_id: str, tail: str, route_tail: str, body: Mapping[str, object] | None
    ) -> Mapping[str, object]:
        # A lifecycle or progress route: its body on success, a Refusal for the refusals it may give.
        path = f"/api/workflows/{_segment(workflow_id)}/{tail}"
        route = "/api/workflows/{workflow_id}/" + route_tail
        status, answer, text = self._send("POST", path, namespace, body)
        if status in (200, 201) and answer is not None:
            return answer
        if answer is not None and answer.get("reason") in _REFUSALS.get(status, ()):
            raise Refusal(str(answer["reason"]), str(answer.get("message", "")))
        raise self._fail("POST", route, status, answer, text)

    def _has_lifecycle_routes(self) -> bool:
        # A close of a workflow that never had a run: a server with the routes refuses it as
        # run_state (nothing written); one without answers 404 not_found or 405.
        path = f"/api/workflows/{_PROBE_WORKFLOW}/close"
        status, answer, text = self._send("POST", path, self._probe_namespace, {"status": "completed"})
        if status in (404, 405) and (
            answer is None or answer.get("reason") in ("not_found", "method_not_allowed")
        ):
            return False
        if status == 409 and answer is not None and answer.get("reason") == "run_state":
            return True
        raise self._fail("POST", "/api/workflows/{workflow_id}/close", status, answer, text)

    def _hook(self, name: str) -> Callable[..., object]:
        hook = None if self._hooks is None else getattr(self._hooks, name)
        if hook is None:
            raise NotImplementedError(f"{self.name} has no {name} (no lifecycle routes and no hook)")
        return hook  # type: ignore[no-any-return]

    def start_run(self, namespace: str, workflow_id: str) -> Mapping[str, object]:
        """Start a run (:data:`LIFECYCLE`)."""
        if not self._routes:
            return self._hook("start_run")(namespace, workflow_id)  # type: ignore[return-value]
        return self._engine(namespace, workflow_id, "runs", "runs", None)

    def close_run(self, namespace: str, workflow_id: str, status: str) -> Mapping[str, object]:
        """Close the current run as ``status`` (:data:`LIFECYCLE`)."""
        if not self._routes:
            return self._hook("close_run")(namespace, workflow_id, status)  # type: ignore[return-value]
        return self._engine(namespace, workflow_id, "close", "close", {"status": status})

    def continue_as_new(self, namespace: str, workflow_id: str) -> Mapping[str, object]:
        """Continue the current run as new (:data:`LIFECYCLE`); the successor."""
        if not self._routes:
            return self._hook("continue_as_new")(namespace, workflow_id)  # type: ignore[return-value]
        return self._engine(namespace, workflow_id, "continue-as-new", "continue-as-new", None)

    def apply_signal(self, namespace: str, workflow_id: str, command_id: str) -> Answer:
        """The engine delivers a signal (:data:`PROGRESS`)."""
        if not self._routes:
            return self._hook("apply_signal")(namespace, workflow_id, command_id)  # type: ignore[return-value]
        tail = f"signals/{_segment(command_id)}/apply"
        return _receipt(self._engine(namespace, workflow_id, tail, "signals/{command_id}/apply", None))

    def complete_update(self, namespace: str, workflow_id: str, update_id: str, result: object) -> Answer:
        """The engine completes an update (:data:`PROGRESS`); ``result`` travels as an envelope."""
        if not self._routes:
            return self._hook("complete_update")(namespace, workflow_id, update_id, result)  # type: ignore[return-value]
        tail = f"updates/{_segment(update_id)}/complete"
        body = {} if result is None else {"result": arguments_envelope(result)}
        return _receipt(self._engine(namespace, workflow_id, tail, "updates/{update_id}/complete", body))

    def fail_update(self, namespace: str, workflow_id: str, update_id: str, failure: str) -> Answer:
        """The engine fails an update (:data:`PROGRESS`)."""
        if not self._routes:
            return self._hook("fail_update")(namespace, workflow_id, update_id, failure)  # type: ignore[return-value]
        tail = f"updates/{_segment(update_id)}/fail"
        body = {"failure": failure}
        return _receipt(self._engine(namespace, workflow_id, tail, "updates/{update_id}/fail", body))

    def history(self, namespace: str, workflow_id: str) -> Sequence[Mapping[str, object]]:
        """Not over HTTP: the wire contract has no route for the event log."""
        raise NotImplementedError("the event log is not part of the wire contract")

    def prune(self, retention_days: int, now: datetime, dry_run: bool) -> Mapping[str, int]:
        """Not over HTTP: pruning is the engine's, not a caller's."""
        raise NotImplementedError("pruning is not part of the wire contract")

    def __repr__(self) -> str:
        return f"HttpTarget({self.name!r}, capabilities={sorted(self.capabilities)})"


def _receipt(body: Mapping[str, object]) -> Answer:
    # The engine routes answer 200 with the receipt; its http_status is what a caller's retry gets.
    status = body.get("http_status")
    return Answer(status if type(status) is int else 200, _without_message(body))


def _without_message(body: Mapping[str, object]) -> Mapping[str, object]:
    # The body as Admission.to_dict() has it: the wire adds a sentence for people to 409 and 422
    # answers, and to a failed update's answer the reason update_failed as well (docs/http.md,
    # "Where this adapter goes beyond the wire contract", 1).
    kept = {k: v for k, v in body.items() if k != "message"}
    if kept.get("outcome") == "failed" and kept.get("reason") == "update_failed":
        del kept["reason"]
    return kept
