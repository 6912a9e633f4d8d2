"""The chaos soak's foreign producer: hostile records written straight to evsched's topics.

A plain aiokafka producer (no evsched client) writes, per round, one record of each enabled kind:

- ``garbage``: random bytes on the events topic, half of them behind a valid-looking ``C3 01``
  single-object header; each is counted, and the audit compares the count with the undecodable
  records it finds;
- ``huge_id``: a JobEnqueued whose job id is longer than 65,535 bytes;
- ``bad_queue``: a JobEnqueued on a queue that cannot be a topic name (empty, a space, 300 chars);
- ``overflow``: a JobEnqueued, then a JobLeased with token 2**63-1 (the next lease overflows) or
  with a lease of 2**63-1 ms;
- ``forged_dispatch``: a dispatch record no node decided, for a job that does not exist (every
  other round with a job id longer than 65,535 bytes, which the worker then writes itself).

Every job id it makes is in ``injected``, so the audit leaves those jobs out; it never touches a
job the load generator enqueued.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from dataclasses import dataclass, field

from aiokafka import AIOKafkaProducer

from evsched.adapters.avro import encode_dispatch, encode_event
from evsched.adapters.kafka.topics import Topics
from evsched.core.dispatch import Dispatch
from evsched.core.events import JobEnqueued, JobLeased

KINDS = ("garbage", "huge_id", "bad_queue", "overflow", "forged_dispatch")
HUGE = 70_000  # bytes: above the 65,535 an index key can hold
MAX_LONG = 2**63 - 1
BAD_QUEUES = ("", "bad queue!", "q" * 300)


@dataclass
class Hostile:
    """Writes hostile rounds; ``sent`` counts what the broker acknowledged, per kind."""

    bootstrap: str
    namespace: str
    kinds: tuple[str, ...] = KINDS
    seed: int = 1
    dispatch_queue: str = "default"
    injected: set[str] = field(default_factory=set)
    sent: Counter[str] = field(default_factory=Counter)
    failed: Counter[str] = field(default_factory=Counter)
    _round: int = 0
    _producer: AIOKafkaProducer | None = None

    async def start(self) -> None:
        self._producer = AIOKafkaProducer(
            bootstrap_servers=self.bootstrap, acks="all", max_request_size=4 << 20
        )
        await self._producer.start()

    async def stop(self) -> None:
        if self._producer is not None:
            await self._producer.stop()

    async def round(self) -> None:
        """One record (or pair) of every enabled kind; a failed send is counted, not raised."""
        self._round += 1
        for kind in self.kinds:
            try:
                await getattr(self, f"_{kind}")(self._round)
            except Exception:  # the broker may be down: that is part of the soak
                self.failed[kind] += 1
            else:
                self.sent[kind] += 1

    async def _send(self, topic: str, key: bytes, value: bytes) -> None:
        assert self._producer is not None
        await self._producer.send_and_wait(topic, value, key=key)

    def _job(self, prefix: str, n: int, pad: int = 0) -> str:
        job_id = f"chaos-{prefix}-{n}-{self.seed}" + "x" * pad
        self.injected.add(job_id)
        return job_id

    async def _garbage(self, n: int) -> None:
        rng = random.Random(self.seed * 1_000_003 + n)
        body = rng.randbytes(rng.randrange(1, 200))
        value = (b"\xc3\x01" + rng.randbytes(8) + body) if n % 2 else body
        await self._send(Topics(self.namespace).events, rng.randbytes(8), value)

    async def _huge_id(self, n: int) -> None:
        await self._enqueue(self._job("huge", n, HUGE), "default")

    async def _bad_queue(self, n: int) -> None:
        await self._enqueue(self._job("badq", n), BAD_QUEUES[n % len(BAD_QUEUES)])

    async def _overflow(self, n: int) -> None:
        job_id = self._job("ovf", n)
        await self._enqueue(job_id, "default")
        token, lease_ms = (MAX_LONG, 1_000) if n % 2 else (1, MAX_LONG)
        lease = JobLeased(
            event_id=f"{job_id}-lease",
            job_id=job_id,
            emitted_at=_now_ms(),
            source="node-forged",
            token=token,
            attempt=1,
            lease_ms=lease_ms,
        )
        await self._send(Topics(self.namespace).events, job_id.encode(), encode_event(lease))

    async def _forged_dispatch(self, n: int) -> None:
        job_id = self._job("fd", n, HUGE if n % 2 == 0 else 0)
        now = _now_ms()
        dispatch = Dispatch(
            job_id=job_id,
            token=1,
            attempt=1,
            max_attempts=1,
            task="chaos.noop",
            queue=self.dispatch_queue,
            args=b"{}",
            timeout_ms=10_000,
            lease_ms=60_000,
            run_at=now,
            enqueued_at=now,
            leased_at=now,
            partition=0,
        )
        topic = Topics(self.namespace).dispatch(self.dispatch_queue)
        await self._send(topic, job_id.encode(), encode_dispatch(dispatch))

    async def _enqueue(self, job_id: str, queue: str) -> None:
        event = JobEnqueued(
            event_id=f"{job_id}-enqueue",
            job_id=job_id,
            emitted_at=_now_ms(),
            source="foreign",
            task="chaos.noop",
            queue=queue,
            args=b"{}",
        )
        await self._send(Topics(self.namespace).events, job_id.encode(), encode_event(event))


def _now_ms() -> int:
    return time.time_ns() // 1_000_000
