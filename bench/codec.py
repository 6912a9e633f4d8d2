"""Throughput of the Avro event codec; the last line is ``key=value`` pairs for scripts to read.

Run: ``.venv/bin/python bench/codec.py [events_per_kind]``.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

from evsched.adapters.avro import decode_event, encode_event
from evsched.core.events import (
    AttemptStarted,
    AttemptSucceeded,
    Effect,
    Event,
    JobEnqueued,
    JobLeased,
    LeaseRenewed,
    TraceContext,
)

COMMON = {
    "event_id": "8b0e4c36-2f5d-4c8e-9a51-6f0e2d7c1a93",
    "job_id": "3f1c2b7a-9d4e-5f60-8a1b-2c3d4e5f6a7b",
    "emitted_at": 1_767_225_600_000,
}
SMALL: list[Event] = [
    JobLeased(**COMMON, source="node-1", token=7, attempt=2, lease_ms=30_000),
    AttemptStarted(**COMMON, source="worker-a", token=7, worker_id="worker-a", lease_ms=60_000),
    LeaseRenewed(**COMMON, source="worker-a", token=7, lease_ms=60_000),
]
LARGE: list[Event] = [
    JobEnqueued(
        **COMMON,
        source="api",
        task="billing.send_invoice",
        queue="billing",
        args=b'{"invoice_id": 91234, "customer": "c-5521", "channel": "email"}',
        run_at=1_767_225_660_000,
        idempotency_key="invoice-91234",
        body_digest=bytes(32),
        labels={"team": "billing", "tier": "gold"},
        trace=TraceContext(traceparent="00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
    ),
    AttemptSucceeded(
        **COMMON,
        source="worker-a",
        token=7,
        result=b'{"sent": true}',
        effects=(Effect(kind="email.sent", payload=b'{"to": "c-5521"}'),),
    ),
]


def _rate(events: list[Event], rounds: int, step: Callable[[Event], object]) -> float:
    start = time.perf_counter()
    for _ in range(rounds):
        for event in events:
            step(event)
    return rounds * len(events) / (time.perf_counter() - start)


def _measure(name: str, events: list[Event], rounds: int) -> tuple[float, float]:
    encoded = {id(event): encode_event(event) for event in events}
    encode_rate = _rate(events, rounds, encode_event)
    decode_rate = _rate(events, rounds, lambda event: decode_event(encoded[id(event)]))
    sizes = "/".join(str(len(encoded[id(event)])) for event in events)
    print(f"{name:<6} {sizes:<10} B  encode {encode_rate:>9,.0f}/s  decode {decode_rate:>9,.0f}/s")
    return encode_rate, decode_rate


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 50_000
    small_encode, small_decode = _measure("small", SMALL, rounds)
    large_encode, large_decode = _measure("large", LARGE, rounds)
    print(
        f"small_encode_per_s={small_encode:.0f} small_decode_per_s={small_decode:.0f} "
        f"large_encode_per_s={large_encode:.0f} large_decode_per_s={large_decode:.0f}"
    )


if __name__ == "__main__":
    main()
