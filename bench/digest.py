"""Intent digest speed beside its peers and the sha256 floor, measured in one run.

Every candidate turns the same nested payload into a SHA-256 hex digest:

- ``admission``: ``admission.intent_digest`` (validation, canonical encoding
  of the whole intent record, sha256);
- ``rfc8785``: JSON Canonicalization Scheme (RFC 8785) + sha256;
- ``canonicaljson``: Matrix canonical JSON + sha256;
- ``cbor2-canonical``: ``cbor2.dumps(canonical=True)`` + sha256;
- ``sha256 floor``: sha256 of the already encoded bytes, no encoding at all.

Candidates are interleaved: each round runs every candidate once for a batch,
in a shuffled order, so drift of the machine affects all of them alike. The
table reports the median time per digest and the ratio to the fastest peer
(higher is better for admission: peer time / admission time).

Usage: ``python bench/digest.py [--rounds N] [--markdown]``; needs the
``bench`` extra (``pip install -e '.[bench]'``).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import canonicaljson
import cbor2
import rfc8785

# bench/admission.py would shadow the package when run as a script.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or os.getcwd()).resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))

import admission  # noqa: E402
from admission.intent import _encoding as encoding  # noqa: E402


def payload(items: int, seed: int = 7) -> dict[str, object]:
    """A nested order-like payload: maps, lists, text (some non-ASCII), ints, floats, bools, null."""
    rnd = random.Random(seed)
    return {
        "order_id": "ord-2026-11-29-000417",
        "customer": {"name": "Zoë Ångström", "email": "zoe@example.com", "tier": 3, "vip": False},
        "items": [
            {
                "sku": f"SKU-{i:05d}",
                "qty": rnd.randint(1, 9),
                "price": round(rnd.uniform(1, 500), 2),
                "tags": ["gift", "fragile", "eu"][: rnd.randint(0, 3)],
                "attributes": {"colour": rnd.choice(["red", "vert", "青"]), "size": rnd.randint(30, 48)},
                "backorder": rnd.random() < 0.2,
                "note": None,
            }
            for i in range(items)
        ],
        "total": 1234.5,
        "currency": "EUR",
    }


def sizes(value: dict[str, object]) -> tuple[int, int]:
    return len(canonicaljson.encode_canonical_json(value)), len(admission.canonical_encode(value))


def measure(candidates: dict[str, Callable[[], object]], rounds: int, batch: int) -> dict[str, float]:
    samples: dict[str, list[float]] = {name: [] for name in candidates}
    order = list(candidates)
    rng = random.Random(0)
    for _ in range(rounds):
        rng.shuffle(order)
        for name in order:
            fn = candidates[name]
            start = time.perf_counter()
            for _ in range(batch):
                fn()
            samples[name].append((time.perf_counter() - start) / batch)
    return {name: statistics.median(values) for name, values in samples.items()}


def run(label: str, value: dict[str, object], rounds: int) -> list[tuple[str, str, float, str]]:
    encoded = admission.canonical_encode(value)
    expected = admission.intent_digest("update", "place_order", value)
    candidates: dict[str, Callable[[], object]] = {
        "admission": lambda: admission.intent_digest("update", "place_order", value),
        "rfc8785": lambda: hashlib.sha256(rfc8785.dumps(value)).hexdigest(),
        "canonicaljson": lambda: hashlib.sha256(canonicaljson.encode_canonical_json(value)).hexdigest(),
        "cbor2-canonical": lambda: hashlib.sha256(cbor2.dumps(value, canonical=True)).hexdigest(),
        "sha256 floor": lambda: hashlib.sha256(encoded).hexdigest(),
    }
    assert candidates["admission"]() == expected
    # Aim at ~20 ms per batch so timer resolution does not matter.
    probe = measure({"admission": candidates["admission"]}, 3, 3)["admission"]
    batch = max(1, int(0.02 / probe))
    medians = measure(candidates, rounds, batch)
    fastest_peer = min(medians[n] for n in ("rfc8785", "canonicaljson", "cbor2-canonical"))
    rows = []
    for name, seconds in sorted(medians.items(), key=lambda kv: kv[1]):
        if name == "admission":
            ratio = f"{fastest_peer / seconds:.2f}x the fastest peer"
        else:
            ratio = f"{medians['admission'] / seconds:.2f}x admission's time"
        rows.append((label, name, seconds, ratio))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=31, help="interleaved rounds (default 31)")
    parser.add_argument("--markdown", action="store_true", help="print a Markdown table")
    args = parser.parse_args(argv)
    cases = [("~2 KiB", payload(14)), ("~200 KiB", payload(1500))]
    print(
        f"# python {sys.version.split()[0]}, admission {admission.__version__}, "
        f"accelerated={getattr(encoding, 'ACCELERATED', False)}, rounds={args.rounds}"
    )
    for label, value in cases:
        json_size, cbor_size = sizes(value)
        print(f"# {label}: canonical JSON {json_size} bytes, intent-v1 {cbor_size} bytes")
    rows = [row for label, value in cases for row in run(label, value, args.rounds)]
    if args.markdown:
        print("| payload | candidate | median per digest | ratio |")
        print("|---|---|---:|---|")
        for label, name, seconds, ratio in rows:
            print(f"| {label} | {name} | {seconds * 1e6:,.1f} µs | {ratio} |")
    else:
        for label, name, seconds, ratio in rows:
            print(f"{label:9} {name:16} {seconds * 1e6:12,.1f} µs   {ratio}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
