"""Encrypted input at rest: what the database holds of an ``aes-gcm`` card number, read back directly.

Every test that admits through the HTTP app then reads every column of every
table of the database (SQLite and PostgreSQL) and looks for the plaintext:
its UTF-8 bytes, its digits alone, its canonical encoding, and the JSON and
CBOR forms of the whole arguments.  In ``"envelope"`` mode none of them may
be anywhere; in ``"plaintext"`` mode (the default, docs/http.md) they are in
``workflow_commands.arguments`` and nowhere else.
"""

from __future__ import annotations

import base64
import json
import warnings
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from sqlalchemy import Engine, MetaData, func, select, update

with warnings.catch_warnings():
    # The framework's test client warns about its own future; it is not ours to fix.
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

from admission.errors import CodecError, InvalidValueError
from admission.http import (
    AesGcmCodec,
    CborCodec,
    JsonCodec,
    codecs_from,
    create_app,
    envelope,
    open_arguments,
    render_json_value,
)
from admission.intent import canonical_decode, canonical_encode, encode_intent, receipt_token
from admission.receipts import AdmissionService, MemoryStore, SealedArguments, Store, sealed_max_size
from admission.sql import audit, workflow_commands
from tests.integration.test_http import serving
from tests.support.strategies import ARGUMENTS, same

pytestmark = pytest.mark.filterwarnings("ignore:Using `httpx` with `starlette.testclient`")

KEY = bytes(range(32))
NS = "tenant-a"
CARD = "4111 1111 1111 1111"
OTHER_CARD = "5500 0000 0000 0004"
ARGS: dict[str, Any] = {"card": CARD, "amount": 12.5}


def needles(arguments: dict[str, Any]) -> list[bytes]:
    """Every form of the plaintext a database could hold."""
    card = str(arguments["card"])
    encoded = canonical_encode(arguments)
    return [
        card.encode("utf-8"),
        card.replace(" ", "").encode("ascii"),
        canonical_encode(card),
        encoded,
        render_json_value(arguments).encode("utf-8"),
        base64.b64encode(encoded),
    ]


def columns_holding(engine: Engine, arguments: dict[str, Any]) -> set[tuple[str, str]]:
    """The (table, column) pairs of the whole database where any form of the plaintext appears."""
    found: set[tuple[str, str]] = set()
    metadata = MetaData()
    metadata.reflect(engine)
    assert "workflow_commands" in metadata.tables and "workflow_history_events" in metadata.tables
    forms = needles(arguments)
    with engine.connect() as conn:
        for table in metadata.sorted_tables:
            for row in conn.execute(select(table)):
                for column, value in row._mapping.items():
                    if isinstance(value, str):
                        data = value.encode("utf-8", "surrogatepass")
                    elif isinstance(value, (bytes, bytearray, memoryview)):
                        data = bytes(value)
                    else:
                        continue
                    if any(form in data for form in forms):
                        found.add((table.name, str(column)))
    return found


def stored_arguments(engine: Engine) -> list[bytes]:
    with engine.connect() as conn:
        rows = conn.execute(
            select(workflow_commands.c.arguments).order_by(workflow_commands.c.command_sequence)
        )
        return [bytes(value) for (value,) in rows]


def count_commands(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(workflow_commands)).scalar_one())


def codec() -> AesGcmCodec:
    return AesGcmCodec(KEY, "k1")


def client_for(service: AdmissionService, **options: Any) -> TestClient:
    codecs = codecs_from(JsonCodec(), CborCodec(), codec())
    return TestClient(create_app(service, codecs=codecs, **options), raise_server_exceptions=False)


def post(client: TestClient, path: str, body: dict[str, Any]) -> Any:
    return client.post(path, json=body, headers={"X-Namespace": NS})


def admit_a_card_twice_and_another_once(client: TestClient, service: AdmissionService) -> dict[str, Any]:
    """The same card under two nonces (retained), another card under the same key (conflict)."""
    service.start_run(NS, "wf-1")
    sealed = envelope(codec(), ARGS)
    first = post(client, "/api/workflows/wf-1/update/pay", {"request_id": "pay-1", "input": sealed})
    again = envelope(codec(), ARGS)
    assert again["blob"] != sealed["blob"]  # a new nonce
    retry = post(client, "/api/workflows/wf-1/update/pay", {"request_id": "pay-1", "input": again})
    other = envelope(codec(), {**ARGS, "card": OTHER_CARD})
    changed = post(client, "/api/workflows/wf-1/update/pay", {"request_id": "pay-1", "input": other})
    assert (first.status_code, retry.status_code, changed.status_code) == (202, 202, 409)
    assert (first.json()["retained"], retry.json()["retained"]) == (False, True)
    assert retry.json()["command_id"] == first.json()["command_id"]
    assert changed.json()["reason"] == "request_id_conflict"
    assert changed.json()["conflict"] == ["arguments"]
    # A keyless signal with the card, handed to the successor run by continue-as-new:
    # the handoff and its event must not bring the plaintext back either.
    note = post(client, "/api/workflows/wf-1/signal/note", {"input": envelope(codec(), ARGS)})
    assert note.status_code == 202
    service.continue_as_new(NS, "wf-1")
    service.complete_update(NS, "wf-1", first.json()["update_id"], {"approved": True})
    return {"first": first.json(), "blob": sealed["blob"]}


# -- the database, read directly ------------------------------------------------------------------


def test_envelope_mode_keeps_an_encrypted_card_number_out_of_every_table(
    service: AdmissionService, engine: Engine
) -> None:
    seen = admit_a_card_twice_and_another_once(client_for(service, store_arguments="envelope"), service)
    assert columns_holding(engine, ARGS) == set()
    assert columns_holding(engine, {**ARGS, "card": OTHER_CARD}) == set()
    assert count_commands(engine) == 2  # the update and the signal; the retry and the conflict wrote nothing
    update_row = stored_arguments(engine)[0]
    # What is kept is the envelope exactly as the first request sent it ...
    assert json.loads(str(canonical_decode(update_row, max_size=sealed_max_size(1 << 20)))) == {
        "codec": "aes-gcm",
        "blob": seen["blob"],
    }
    # ... which whoever holds the key reads back, and nobody else.
    assert open_arguments(codecs_from(codec()), update_row) == ARGS
    with pytest.raises(CodecError, match="failed authentication"):
        open_arguments(codecs_from(AesGcmCodec(bytes(32), "k1")), update_row)
    # The digest is still the plaintext's (contract §3).
    receipt = service.receipt(NS, "wf-1", "update", "pay-1")
    assert receipt is not None and receipt.command_id == seen["first"]["command_id"]
    with engine.connect() as conn:
        digest = conn.execute(
            select(workflow_commands.c.intent_digest).where(workflow_commands.c.request_id.is_not(None))
        ).scalar_one()
    assert digest == encode_intent("update", "pay", ARGS, None).digest


def test_the_deep_audit_notes_sealed_arguments_and_still_finds_a_tampered_key(
    service: AdmissionService, engine: Engine
) -> None:
    # Sealed rows cannot be re-digested without the key: a note, not a fault ...
    admit_a_card_twice_and_another_once(client_for(service, store_arguments="envelope"), service)
    report = audit(engine)
    assert report.ok and set(report.counts) == {"sealed"} and report.counts["sealed"] == 2
    # ... but the rest of the row is still checked: a changed command key is found.
    with engine.begin() as conn:
        conn.execute(
            update(workflow_commands)
            .where(workflow_commands.c.request_id.is_not(None))
            .values(request_id=receipt_token("update", "pay-2"))
        )
    assert "context_mismatch" in audit(engine).counts


def test_plaintext_mode_keeps_the_decrypted_arguments_in_the_commands_table_only(
    service: AdmissionService, engine: Engine
) -> None:
    # The default, documented in docs/http.md: the database holds the decrypted arguments.
    admit_a_card_twice_and_another_once(client_for(service), service)
    assert columns_holding(engine, ARGS) == {("workflow_commands", "arguments")}
    assert columns_holding(engine, {**ARGS, "card": OTHER_CARD}) == set()  # a conflict writes nothing
    assert canonical_decode(stored_arguments(engine)[0]) == ARGS
    assert open_arguments(codecs_from(), stored_arguments(engine)[0]) == ARGS  # no key needed


def test_envelope_mode_stores_json_and_cbor_envelopes_as_received_too(
    service: AdmissionService, engine: Engine
) -> None:
    client = client_for(service, store_arguments="envelope")
    service.start_run(NS, "wf-1")
    as_json = {"codec": "json", "blob": '{ "amount": 12.5,  "card": "x" }'}
    assert post(client, "/api/workflows/wf-1/signal/a", {"input": as_json}).status_code == 202
    assert post(client, "/api/workflows/wf-1/signal/b", {}).status_code == 202
    sealed, empty = stored_arguments(engine)
    assert json.loads(str(canonical_decode(sealed))) == as_json  # the blob's own spacing kept
    assert canonical_decode(empty) == []  # no envelope was received: the arguments [] are stored
    assert open_arguments(codecs_from(), sealed) == {"amount": 12.5, "card": "x"}


def test_admission_serve_store_envelope_keeps_the_card_encrypted_at_rest(
    db_url: str, service: AdmissionService, engine: Engine
) -> None:
    service.start_run(NS, "wf-1")
    key_env = {"ADMISSION_AES_GCM_KEY": base64.b64encode(KEY).decode(), "ADMISSION_AES_GCM_KEY_ID": "k1"}
    with (
        serving(db_url, "--store-envelope", env=key_env) as (base, announced),
        httpx.Client(base_url=base) as http,
    ):
        assert announced["stored_arguments"] == "envelope"
        body = {"request_id": "pay-1", "input": envelope(codec(), ARGS)}
        first = http.post("/api/workflows/wf-1/update/pay", json=body, headers={"X-Namespace": NS})
        body["input"] = envelope(codec(), ARGS)
        retry = http.post("/api/workflows/wf-1/update/pay", json=body, headers={"X-Namespace": NS})
    assert (first.status_code, retry.status_code) == (202, 202)
    assert retry.json()["retained"] is True
    assert columns_holding(engine, ARGS) == set()
    assert open_arguments(codecs_from(codec()), stored_arguments(engine)[0]) == ARGS


def test_create_app_refuses_an_unknown_store_arguments_mode(service: AdmissionService) -> None:
    with pytest.raises(ValueError, match="store_arguments must be one of plaintext, envelope"):
        create_app(service, store_arguments="ciphertext")  # type: ignore[arg-type]


# -- the service: sealed arguments on memory, SQLite and PostgreSQL ----------------------------------


@pytest.mark.parametrize(
    ("stored", "reason"),
    [
        ("", "non-empty str"),
        (b"blob", "non-empty str"),
        ("\ud800", "surrogate"),
        ("x" * (sealed_max_size(64) + 1), "size"),
    ],
)
def test_a_sealed_form_that_cannot_be_stored_is_refused_before_any_write(
    store: Store, stored: object, reason: str
) -> None:
    service = AdmissionService(store, max_size=64)
    service.start_run(NS, "wf-1")
    with pytest.raises(InvalidValueError, match=reason) as refused:
        service.admit_signal(NS, "wf-1", "note", SealedArguments([1], stored), request_id="k")  # type: ignore[arg-type]
    assert refused.value.field == "arguments"
    assert service.receipt(NS, "wf-1", "signal", "k") is None
    assert [e.event_type for e in service.history(NS, "wf-1")] == ["RunStarted"]


def test_sealed_plaintext_is_validated_like_any_arguments(store: Store) -> None:
    service = AdmissionService(store)
    service.start_run(NS, "wf-1")
    with pytest.raises(InvalidValueError) as refused:
        service.admit_signal(NS, "wf-1", "note", SealedArguments("not a list", "{}"), request_id="k")
    assert refused.value.field == "arguments"
    assert service.receipt(NS, "wf-1", "signal", "k") is None


def test_sealed_arguments_never_show_their_plaintext() -> None:
    sealed = SealedArguments(ARGS, json.dumps(envelope(codec(), ARGS)))
    assert CARD not in repr(sealed) and "blob" not in repr(sealed)
    assert repr(sealed) == f"SealedArguments(<dict>, stored=<{len(sealed.stored)} chars>)"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(arguments=ARGUMENTS)
def test_sealed_arguments_are_one_intent_with_their_plaintext(arguments: Any) -> None:
    # For every value: admitted sealed, the digest is the plaintext's, the row holds
    # only the sealed text, a new sealing of the same plaintext is retained, and
    # the same plaintext sent in clear under the key is retained too.
    store = MemoryStore()
    service = AdmissionService(store)
    service.start_run(NS, "wf-1")
    aes = codec()
    first = service.admit_update(
        NS, "wf-1", "pay", SealedArguments(arguments, aes.encode(arguments)), request_id="k"
    )
    again = service.admit_update(
        NS, "wf-1", "pay", SealedArguments(arguments, aes.encode(arguments)), request_id="k"
    )
    clear = service.admit_update(NS, "wf-1", "pay", arguments, request_id="k")
    assert (first.retained, again.retained, clear.retained) == (False, True, True)
    assert first.command_id == again.command_id == clear.command_id
    found = store.read_receipts(NS, "wf-1", "update", [receipt_token("update", "k"), "k"])
    assert [row.id for row, _ in found] == [first.command_id]
    row = found[0][0]
    assert row.intent_digest == encode_intent("update", "pay", arguments, None).digest
    kept = canonical_decode(row.arguments or b"", max_size=sealed_max_size(1 << 20))
    assert type(kept) is str
    assert same(aes.decode(kept), arguments)
