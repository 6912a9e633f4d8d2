"""Reading a range of offsets of the events log from Kafka, for exports: no group, no commits."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from types import TracebackType
from typing import Any

from aiokafka.structs import TopicPartition

from evsched.adapters.kafka import clients as kafka
from evsched.errors import BrokerUnavailable
from evsched.ports import Record
from evsched.settings import Settings

FETCH_RECORDS = 10_000
# Larger fetches than a node's: an export is throughput, not latency.
FETCH_OPTIONS = {"max_partition_fetch_bytes": 8 << 20, "fetch_max_bytes": 64 << 20}


@asynccontextmanager
async def _broker_errors(what: str) -> AsyncIterator[None]:
    try:
        yield
    except kafka.KafkaError as exc:
        raise BrokerUnavailable(f"{what} failed: {exc!r}") from exc


class KafkaRangeReader:
    """Reads offsets ``[low, high)`` of one topic's partitions; BrokerUnavailable on failure.

    Used as ``async with KafkaRangeReader(settings, topic) as reader``.
    """

    def __init__(
        self, settings: Settings, topic: str, *, client_id: str = "evsched-export"
    ) -> None:
        self._settings = settings
        self.topic = topic
        self._client_id = client_id
        self._consumer: Any = None

    async def __aenter__(self) -> KafkaRangeReader:
        consumer = kafka.consumer(
            self._settings, group_id=None, client_id=self._client_id, **FETCH_OPTIONS
        )
        async with _broker_errors(f"reaching Kafka at {self._settings.bootstrap}"):
            try:
                await consumer.start()
            except kafka.KafkaError:
                await consumer.stop()
                raise
        self._consumer = consumer
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            async with _broker_errors("closing the export's consumer"):
                await consumer.stop()

    async def bounds(self, partitions: list[int]) -> dict[int, tuple[int, int]]:
        """Per partition, its first offset and its end offset (the next one to be written)."""
        tps = [TopicPartition(self.topic, p) for p in partitions]
        async with _broker_errors(f"reading the offsets of {self.topic}"):
            self._consumer.assign(tps)
            firsts: Mapping[TopicPartition, int] = await self._consumer.beginning_offsets(tps)
            ends: Mapping[TopicPartition, int] = await self._consumer.end_offsets(tps)
        return {tp.partition: (firsts[tp], ends[tp]) for tp in tps}

    async def batches(self, partition: int, low: int, high: int) -> AsyncIterator[list[Record]]:
        """The records at offsets ``[low, high)`` of ``partition``, a batch at a time.

        A batch may be empty (nothing fetched in time); transaction markers take offsets that
        no record has, so reading stops at the consumer's position, not at a record's offset.
        """
        tp = TopicPartition(self.topic, partition)
        c = self._consumer
        async with _broker_errors(f"reading {self.topic}[{partition}]"):
            c.seek(tp, low)
            while low < high and await c.position(tp) < high:
                batch = await c.getmany(tp, timeout_ms=500, max_records=FETCH_RECORDS)
                yield [kafka.to_record(raw) for raw in batch.get(tp, []) if raw.offset < high]
