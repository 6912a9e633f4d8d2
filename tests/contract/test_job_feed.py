"""The JobFeed contract: ``testing.MemoryJobFeed`` and ``adapters.kafka.job_feed.KafkaJobFeed``.

What results and the worker's fence rely on: a follow yields exactly the followed job's records
at or after its offset, in offset order, those appended later included; follows of one
partition from different offsets (one below what another already read) each get all of theirs.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Protocol

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from evsched.adapters.kafka.job_feed import KafkaJobFeed
from evsched.ports import JobFeed, Record
from evsched.settings import Settings
from evsched.testing import MemoryJobFeed, MemoryLog
from tests.conftest import unique_name
from tests.contract.conftest import DEADLINE_S


class Harness(Protocol):
    async def append(self, key: str, value: bytes) -> int:
        """Write ``value`` under ``key`` to partition 0; its offset."""
        ...

    async def feed(self) -> JobFeed:
        """A started feed of the topic."""
        ...


async def take(follow: AsyncIterator[Record], count: int) -> list[Record]:
    async with asyncio.timeout(DEADLINE_S):
        return [await anext(follow) for _ in range(count)]


class JobFeedContract:
    async def test_a_follow_yields_its_jobs_records_from_the_offset_on(
        self, harness: Harness
    ) -> None:
        await harness.append("other", b"o1")
        first = await harness.append("job", b"j1")
        await harness.append("job", b"j2")
        feed = await harness.feed()
        try:
            assert await feed.partition_of("job") == 0
            follow = feed.follow("job", 0, first + 1)
            waiting = asyncio.ensure_future(take(follow, 2))
            await harness.append("other", b"o2")
            await harness.append("job", b"j3")
            records = await waiting
            assert [r.value for r in records] == [b"j2", b"j3"]
            assert records[0].offset < records[1].offset
            assert all(r.key == b"job" and r.partition == 0 for r in records)
            await follow.aclose()
        finally:
            await feed.close()

    async def test_follows_of_one_partition_from_different_offsets_each_get_theirs(
        self, harness: Harness
    ) -> None:
        a0 = await harness.append("a", b"a0")
        await harness.append("b", b"b0")
        await harness.append("a", b"a1")
        feed = await harness.feed()
        try:
            late = feed.follow("a", 0, a0 + 1)
            assert [r.value for r in await take(late, 1)] == [b"a1"]
            early = feed.follow("b", 0, 0)  # below what the first follow read already
            assert [r.value for r in await take(early, 1)] == [b"b0"]
            await harness.append("a", b"a2")
            await harness.append("b", b"b1")
            assert [r.value for r in await take(late, 1)] == [b"a2"]
            assert [r.value for r in await take(early, 1)] == [b"b1"]
            await late.aclose()
            await early.aclose()
        finally:
            await feed.close()


class MemoryHarness:
    def __init__(self) -> None:
        self.log = MemoryLog()

    async def append(self, key: str, value: bytes) -> int:
        return (await self.log.append("t.events", key, value)).offset

    async def feed(self) -> JobFeed:
        feed = MemoryJobFeed(self.log, "t.events")
        await feed.start()
        return feed


class TestMemoryJobFeed(JobFeedContract):
    @pytest.fixture
    def harness(self) -> Harness:
        return MemoryHarness()


class KafkaHarness:
    def __init__(self, bootstrap: str, topic: str) -> None:
        self.settings = Settings(bootstrap=bootstrap, namespace=topic)
        self.topic = topic
        self.producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True)

    async def append(self, key: str, value: bytes) -> int:
        sent = await self.producer.send_and_wait(self.topic, value, key=key.encode(), partition=0)
        offset: int = sent.offset
        return offset

    async def feed(self) -> JobFeed:
        feed = KafkaJobFeed(self.settings, self.topic, client_id="contract-follow")
        await feed.start()
        return feed


@pytest.mark.broker
class TestKafkaJobFeed(JobFeedContract):
    @pytest.fixture
    async def harness(self, kafka_bootstrap: str) -> AsyncIterator[Harness]:
        topic = unique_name("job-feed")
        admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
        await admin.start()
        try:
            await admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])
        finally:
            await admin.close()
        harness = KafkaHarness(kafka_bootstrap, topic)
        await harness.producer.start()
        try:
            yield harness
        finally:
            await harness.producer.stop()
