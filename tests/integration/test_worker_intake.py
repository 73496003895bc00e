"""Worker intake under racing producers (real OS processes) and its rule as a property (contract §1)."""

from __future__ import annotations

import hashlib
import multiprocessing
from collections import Counter
from multiprocessing.synchronize import Barrier

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine, func, select

from admission.conformance import intent_values
from admission.errors import QueueFullError
from admission.intent import MAX_DEPTH, canonical_encode
from admission.sql import SqlWorkerStore, create_admission_engine, worker_events, worker_records
from admission.worker import MAX_CONTENT, DurableWorker, Scope, WorkerLimits
from tests.support.processes import running

CTX = multiprocessing.get_context("spawn")
SCOPE = {"tenant": "t1", "account": "a1"}
PRODUCERS = 4


def _produce(url: str, keys: list[str], limit: int, barrier: Barrier, results: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    engine = create_admission_engine(url)
    worker = DurableWorker(
        SqlWorkerStore(engine), Scope.parse(SCOPE), file_lock=False, limits=WorkerLimits(max_waiting=limit)
    )
    barrier.wait()
    answers = []
    for key in keys:
        try:
            answers.append(worker.accept({**SCOPE, "source_key": key, "payload": key}).outcome)
        except QueueFullError:
            answers.append("queue_full")
    results.put(answers)
    engine.dispose()


def race(url: str, keys_per_producer: list[list[str]], limit: int) -> Counter[str]:
    barrier = CTX.Barrier(len(keys_per_producer))
    results = CTX.Queue()
    processes = [
        CTX.Process(target=_produce, args=(url, keys, limit, barrier, results)) for keys in keys_per_producer
    ]
    with running(*processes):
        answers = [results.get(timeout=120) for _ in processes]
    return Counter(a for batch in answers for a in batch)


def count(url: str, table: object) -> int:
    engine = create_admission_engine(url)
    try:
        with engine.connect() as conn:
            return int(conn.execute(select(func.count()).select_from(table)).scalar_one())  # type: ignore[arg-type]
    finally:
        engine.dispose()


def test_racing_producers_of_one_key_get_one_accept_and_duplicates(db_url: str) -> None:
    tally = race(db_url, [["same"] * 3 for _ in range(PRODUCERS)], limit=128)
    assert tally == Counter({"accepted": 1, "duplicate": 3 * PRODUCERS - 1})
    assert count(db_url, worker_records) == 1 and count(db_url, worker_events) == 1


def test_racing_producers_never_overrun_the_queue_bound(db_url: str) -> None:
    keys = [[f"p{p}-{i}" for i in range(10)] for p in range(PRODUCERS)]
    tally = race(db_url, keys, limit=25)
    assert tally == Counter({"accepted": 25, "queue_full": 10 * PRODUCERS - 25})
    assert count(db_url, worker_records) == 25


# A payload sits one level down in the record, whose whole encoding must fit in MAX_CONTENT.
PAYLOADS = intent_values(max_depth=MAX_DEPTH - 1, max_size=MAX_CONTENT // 2)


@settings(max_examples=25, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(first=PAYLOADS, second=PAYLOADS, key=st.integers(0, 10**9))
def test_a_replay_is_duplicate_exactly_when_the_canonical_content_is_equal(
    engine: Engine, first: object, second: object, key: int
) -> None:
    worker = DurableWorker(
        SqlWorkerStore(engine), Scope.parse(SCOPE), file_lock=False, limits=WorkerLimits(max_waiting=10**6)
    )
    # Digests, not leading bytes: deep or wide values often share their first bytes.
    digests = [hashlib.sha256(canonical_encode(v)).hexdigest()[:16] for v in (first, second)]
    source_key = f"k{key}-{digests[0]}-{digests[1]}"
    answer = worker.accept({**SCOPE, "source_key": source_key, "payload": first})
    assume(answer.outcome == "accepted")  # not the same example drawn again
    replay = worker.accept({**SCOPE, "source_key": source_key, "payload": second})
    same = canonical_encode(first) == canonical_encode(second)
    assert replay.outcome == ("duplicate" if same else "conflict")
    assert replay.write_id == answer.write_id
