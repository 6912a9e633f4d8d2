"""The chaos soak's readers of the topics: the events topic followed into the audit, and effects.

Both read with ``read_committed`` from the start of every partition: what an aborted transaction
wrote is not part of the log.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition

from chaos_audit import Auditor, LogRecord
from chaos_cluster import Soak
from evsched.adapters.avro import decode_event
from evsched.adapters.kafka.topics import Topics, partition_count
from evsched.errors import DecodeError


class Follower:
    """Reads the events topic from its start while the soak runs; feeds each record to the audit."""

    def __init__(self, soak: Soak, auditor: Auditor) -> None:
        self.soak, self.auditor = soak, auditor
        self.topic = Topics(soak.namespace).events
        self.tps = [TopicPartition(self.topic, p) for p in range(soak.args.partitions)]
        self.consumer: AIOKafkaConsumer | None = None

    async def start(self) -> None:
        self.consumer = AIOKafkaConsumer(
            bootstrap_servers=self.soak.bootstrap,
            isolation_level="read_committed",
            enable_auto_commit=False,
            fetch_max_wait_ms=100,
            max_partition_fetch_bytes=8 << 20,
        )
        await self.consumer.start()
        self.consumer.assign(self.tps)
        await self.consumer.seek_to_beginning(*self.tps)

    async def stop(self) -> None:
        if self.consumer is not None:
            await self.consumer.stop()

    async def read(self, timeout_ms: int = 500) -> int:
        """Feed what arrived; the number of records fed."""
        assert self.consumer is not None
        batches = await self.consumer.getmany(timeout_ms=timeout_ms, max_records=20_000)
        fed = 0
        for raws in batches.values():
            for raw in raws:
                self.auditor.feed(LogRecord(raw.partition, raw.offset, raw.timestamp, _decode(raw)))
                fed += 1
        return fed

    async def follow(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self.read()
            except Exception as exc:  # the broker is down for a while: keep following
                print(f"follower: {exc!r}")
                await asyncio.sleep(1)

    async def ends(self) -> dict[int, int]:
        """The end offset of every events partition now."""
        assert self.consumer is not None
        ends = await self.consumer.end_offsets(self.tps)
        return {tp.partition: end for tp, end in ends.items()}

    async def catch_up(self) -> None:
        """Read up to the current end of every partition."""
        assert self.consumer is not None
        ends = await self.consumer.end_offsets(self.tps)
        while [tp for tp in self.tps if await self.consumer.position(tp) < ends[tp]]:
            await self.read(200)


def _decode(raw: Any) -> Any:
    try:
        return decode_event(raw.value or b"")
    except DecodeError:
        return None


async def read_effects(soak: Soak) -> list[tuple[str, int, int]]:
    """(job id, token, effect index) of every committed record of the effects topic."""
    topic = Topics(soak.namespace).effects
    count = await partition_count(soak.bootstrap, topic)
    consumer = AIOKafkaConsumer(bootstrap_servers=soak.bootstrap, isolation_level="read_committed")
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(count)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        found: list[tuple[str, int, int]] = []
        while [tp for tp in tps if await consumer.position(tp) < ends[tp]]:
            batches = await consumer.getmany(timeout_ms=200, max_records=20_000)
            found += [_effect_id(r) for rs in batches.values() for r in rs]
        return found
    finally:
        await consumer.stop()


def _effect_id(record: Any) -> tuple[str, int, int]:
    headers = {k: v for k, v in record.headers or ()}
    return (
        headers["evsched-job-id"].decode(),
        int(headers["evsched-token"]),
        int(headers["evsched-effect-index"]),
    )
