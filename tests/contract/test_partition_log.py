"""The PartitionLog contract: ``testing.MemoryPartitionLog`` and
``adapters.kafka.partition_log.KafkaPartitionLog`` alike.

What the restore path relies on: read_committed reads return committed records in offset order and
never an aborted one; transaction markers take offsets, so the position (not the last record)
says how far a partition was read, and reaches the end offset; a seek reads from there on, below
the log's start from its start; the start offset says where retention cut the log.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Protocol

import pytest
from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic, RecordsToDelete

from evsched.adapters.kafka.partition_log import KafkaPartitionLog
from evsched.ports import PartitionLog, Record
from evsched.settings import Settings
from evsched.testing import MemoryPartitionLog
from tests.conftest import unique_name

PARTITION = 0


class Harness(Protocol):
    async def transaction(self, values: Sequence[bytes], *, commit: bool) -> None:
        """Write ``values`` to partition 0 in one transaction, committed or aborted."""
        ...

    async def trim(self, start: int) -> None:
        """Delete every record of partition 0 below ``start``, as retention does."""
        ...

    async def reader(self) -> PartitionLog:
        """A started reader of partition 0."""
        ...


async def read_to_end(log: PartitionLog) -> list[Record]:
    end = (await log.end_offsets([PARTITION]))[PARTITION]
    records: list[Record] = []
    while await log.position(PARTITION) < end:
        batches = await log.read([PARTITION], 1.0, 100)
        records += batches.get(PARTITION, [])
    return records


class PartitionLogContract:
    """The suite; a subclass provides the ``harness`` fixture."""

    async def test_committed_records_in_order_and_the_position_reaches_the_end(
        self, harness: Harness
    ) -> None:
        await harness.transaction([b"a", b"b"], commit=True)
        await harness.transaction([b"x", b"y", b"z"], commit=False)
        await harness.transaction([b"c"], commit=True)
        log = await harness.reader()
        try:
            assert (await log.start_offsets([PARTITION]))[PARTITION] == 0
            end = (await log.end_offsets([PARTITION]))[PARTITION]
            # 3 committed records, 3 aborted ones and a marker after each transaction.
            assert end == 9
            log.seek(PARTITION, 0)
            records = await read_to_end(log)
            assert [r.value for r in records] == [b"a", b"b", b"c"]
            offsets = [r.offset for r in records]
            assert offsets == sorted(offsets) and offsets[:2] == [0, 1] and offsets[2] > 5
            assert all(r.partition == PARTITION for r in records)
            assert await log.position(PARTITION) == end  # past the last marker
            assert await log.read([PARTITION], 0.2, 100) == {}  # nothing more, in time

            log.seek(PARTITION, 1)  # from the middle
            assert [r.value for r in await read_to_end(log)] == [b"b", b"c"]
        finally:
            await log.close()

    async def test_a_trimmed_log_reports_its_start_and_reads_from_there(
        self, harness: Harness
    ) -> None:
        await harness.transaction([b"a", b"b"], commit=True)
        await harness.transaction([b"c", b"d"], commit=True)
        await harness.trim(3)  # the first transaction and its marker are gone
        log = await harness.reader()
        try:
            assert (await log.start_offsets([PARTITION]))[PARTITION] == 3
            log.seek(PARTITION, 0)  # below the start: from the start
            assert [r.value for r in await read_to_end(log)] == [b"c", b"d"]
        finally:
            await log.close()


class MemoryHarness:
    def __init__(self) -> None:
        self.log = MemoryPartitionLog(partitions=1)

    async def transaction(self, values: Sequence[bytes], *, commit: bool) -> None:
        for value in values:
            if commit:
                self.log.append(PARTITION, value)
            else:
                self.log.mark(PARTITION)  # an aborted record: it takes its offset
        self.log.mark(PARTITION)

    async def trim(self, start: int) -> None:
        self.log.trim(PARTITION, start)

    async def reader(self) -> PartitionLog:
        await self.log.start()
        return self.log


class TestMemoryPartitionLog(PartitionLogContract):
    @pytest.fixture
    def harness(self) -> Harness:
        return MemoryHarness()


class KafkaHarness:
    def __init__(self, bootstrap: str, topic: str) -> None:
        self.settings = Settings(bootstrap=bootstrap, namespace=topic)
        self.topic = topic
        self.producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap, transactional_id=f"{topic}.tx", enable_idempotence=True
        )

    async def transaction(self, values: Sequence[bytes], *, commit: bool) -> None:
        await self.producer.begin_transaction()
        for value in values:
            await self.producer.send_and_wait(self.topic, value, partition=PARTITION)
        if commit:
            await self.producer.commit_transaction()
        else:
            await self.producer.abort_transaction()

    async def trim(self, start: int) -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=self.settings.bootstrap)
        await admin.start()
        try:
            await admin.delete_records(
                {TopicPartition(self.topic, PARTITION): RecordsToDelete(start)}
            )
        finally:
            await admin.close()

    async def reader(self) -> PartitionLog:
        log = KafkaPartitionLog(self.settings, self.topic, [PARTITION], client_id="contract")
        await log.start()
        return log


class TestKafkaPartitionLog(PartitionLogContract):
    @pytest.fixture
    async def harness(self, kafka_bootstrap: str) -> AsyncIterator[Harness]:
        topic = unique_name("partition-log")
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


@pytest.mark.broker
async def test_the_kafka_reader_fetches_only_the_partitions_it_is_asked_for(
    kafka_bootstrap: str,
) -> None:
    """Not part of the port's contract (the twin has no fetch buffers): the adapter pauses the
    assigned partitions a read does not name, so a standby copy reading a few of them does not
    fetch the rest for nothing, and a paused partition still reads from where it was."""
    topic = unique_name("partition-log-pause")
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, num_partitions=2, replication_factor=1)])
    finally:
        await admin.close()
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
    await producer.start()
    try:
        for partition in (0, 1):
            for i in range(3):
                await producer.send_and_wait(
                    topic, f"p{partition}-{i}".encode(), partition=partition
                )
    finally:
        await producer.stop()
    settings = Settings(bootstrap=kafka_bootstrap, namespace=topic)
    log = KafkaPartitionLog(settings, topic, [0, 1], client_id="contract-pause")
    await log.start()
    try:
        first = await log.read([0], 5.0, 100)
        assert [r.value for r in first[0]] == [b"p0-0", b"p0-1", b"p0-2"]
        assert log._consumer.paused() == {TopicPartition(topic, 1)}  # the adapter's own consumer
        second = await log.read([1], 5.0, 100)
        assert [r.value for r in second[1]] == [b"p1-0", b"p1-1", b"p1-2"]
        assert log._consumer.paused() == {TopicPartition(topic, 0)}
    finally:
        await log.close()
