"""The raw Kafka bound on a broker, and the records a run wrote per job.

Not a test: it measures. One idempotent ``acks=all`` producer sends ~300-byte records to a fresh
topic as fast as it can for ``--seconds`` (records/s counted to the last acknowledgement), then one
consumer reads them all back (records/s); the topic is deleted afterwards. The smaller of the two
rates, divided by the records evsched writes per job, is the most jobs/s this broker could carry.
``count_records`` counts those records from the log of a run. Prints one final line::

    produce_records_per_s=<N> consume_records_per_s=<N> bound_records_per_s=<N>

Run: ``.venv/bin/python bench/kafka_bound.py --bootstrap 127.0.0.1:19092 --seconds 10``.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

IN_FLIGHT = 20_000  # sends awaiting their acknowledgement, at most


@dataclass(frozen=True, slots=True)
class Bound:
    produce_per_s: float
    consume_per_s: float

    @property
    def records_per_s(self) -> float:
        return min(self.produce_per_s, self.consume_per_s)

    def line(self) -> str:
        return (
            f"produce_records_per_s={self.produce_per_s:.0f} "
            f"consume_records_per_s={self.consume_per_s:.0f} "
            f"bound_records_per_s={self.records_per_s:.0f}"
        )


async def produce(bootstrap: str, topic: str, seconds: float, size: int) -> tuple[int, float]:
    """Send for ``seconds``; returns (records acknowledged, records/s up to the last ack)."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True, acks="all")
    await producer.start()
    try:
        value = os.urandom(size)
        window: collections.deque[asyncio.Future[object]] = collections.deque()
        started = time.perf_counter()
        sent = 0
        while time.perf_counter() - started < seconds:
            for _ in range(500):
                window.append(await producer.send(topic, value))
            sent += 500
            while len(window) > IN_FLIGHT:
                await window.popleft()
        await asyncio.gather(*window)
        return sent, sent / (time.perf_counter() - started)
    finally:
        await producer.stop()


async def consume(bootstrap: str, topic: str, partitions: int, count: int) -> float:
    """Read ``count`` records from the start of the topic; returns records/s."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        max_partition_fetch_bytes=8 << 20,
    )
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        started, read = time.perf_counter(), 0
        while read < count:
            batches = await consumer.getmany(timeout_ms=1000, max_records=10_000)
            read += sum(len(records) for records in batches.values())
        return read / (time.perf_counter() - started)
    finally:
        await consumer.stop()


async def _wait_leaders(admin: AIOKafkaAdminClient, topic: str, timeout_s: float = 60) -> None:
    """Until every partition of a new topic has a leader (else the first sends are retried)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        (described,) = await admin.describe_topics([topic])
        partitions = described["partitions"]
        if partitions and all(p["leader"] >= 0 for p in partitions):
            return
        await asyncio.sleep(0.1)
    raise TimeoutError(f"{topic}: partitions without a leader after {timeout_s:.0f} s")


async def measure(bootstrap: str, *, seconds: float, size: int = 300, partitions: int = 6) -> Bound:
    """Produce then consume on a topic of its own, deleted afterwards."""
    topic = f"bench-bound-{uuid.uuid4().hex[:10]}"
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, partitions, 1)])
        await _wait_leaders(admin, topic)
        count, produce_per_s = await produce(bootstrap, topic, seconds, size)
        consume_per_s = await consume(bootstrap, topic, partitions, count)
        return Bound(produce_per_s, consume_per_s)
    finally:
        await admin.delete_topics([topic])
        await admin.close()


async def log_ends(bootstrap: str, prefix: str) -> dict[TopicPartition, int]:
    """The end offset of every partition of every topic named ``<prefix>...``."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        names = [t for t in await admin.list_topics() if t.startswith(prefix)]
        described = await admin.describe_topics(names) if names else []
    finally:
        await admin.close()
    tps = [
        TopicPartition(topic["topic"], partition["partition"])
        for topic in described
        for partition in topic["partitions"]
    ]
    return await _ends(bootstrap, tps) if tps else {}


async def _ends(bootstrap: str, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap)
    await consumer.start()
    try:
        return dict(await consumer.end_offsets(tps))
    finally:
        await consumer.stop()


async def count_records(bootstrap: str, since: Mapping[TopicPartition, int]) -> dict[str, int]:
    """Records written to each topic after the offsets ``since`` (from ``log_ends``), up to now.

    Reads uncommitted too: an aborted transaction's records cost the broker as much. Transaction
    markers take offsets but are no records, so they are not counted.
    """
    ends = await _ends(bootstrap, list(since)) if since else {}
    wanted = {tp: end for tp, end in ends.items() if end > since[tp]}
    counts: dict[str, int] = collections.Counter()
    if not wanted:
        return counts
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, max_partition_fetch_bytes=8 << 20
    )
    await consumer.start()
    try:
        consumer.assign(list(wanted))
        for tp in wanted:
            consumer.seek(tp, since[tp])
        while [tp for tp in wanted if await consumer.position(tp) < wanted[tp]]:
            batches = await consumer.getmany(timeout_ms=500, max_records=10_000)
            for tp, records in batches.items():
                counts[tp.topic] += sum(1 for r in records if r.offset < wanted[tp])
        return counts
    finally:
        await consumer.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bootstrap", default=os.environ.get("EVSCHED_KAFKA_BOOTSTRAP"), required=False)
    p.add_argument("--seconds", type=float, default=10.0, help="how long the producer sends")
    p.add_argument("--size", type=int, default=300, help="bytes per record value")
    p.add_argument("--partitions", type=int, default=6)
    args = p.parse_args()
    if not args.bootstrap:
        p.error("--bootstrap (or EVSCHED_KAFKA_BOOTSTRAP) is required")
    bound = asyncio.run(
        measure(args.bootstrap, seconds=args.seconds, size=args.size, partitions=args.partitions)
    )
    print(bound.line())


if __name__ == "__main__":
    main()
