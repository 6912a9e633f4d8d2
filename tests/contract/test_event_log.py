"""The EventLog contract: ``testing.MemoryLog``, ``adapters.kafka.event_log.KafkaEventLog`` and
``adapters.kafka.rdkafka_event_log.RdkafkaEventLog`` (librdkafka) alike.

What the engine relies on: an append returns once the record is in the log, offsets grow per
partition, one key keeps its order, the events topic reports the broker's append time, and a
write that did not happen is a PublishError (after which the log still works).
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Protocol

import pytest
from aiokafka.structs import TopicPartition

from evsched.adapters.clock import SYSTEM_CLOCK
from evsched.adapters.kafka import clients as kafka
from evsched.adapters.kafka.event_log import KafkaEventLog
from evsched.adapters.kafka.partition_log import partition_for
from evsched.adapters.kafka.rdkafka_event_log import RdkafkaEventLog
from evsched.adapters.kafka.topics import Topics
from evsched.errors import PublishError
from evsched.ports import Appended, EventLog, Outbound
from evsched.settings import Settings
from evsched.testing import MemoryLog

# Broker and test read the same machine clock, in whole milliseconds, rounded differently.
CLOCK_SLACK_MS = 5


@dataclass(frozen=True, slots=True)
class Stored:
    """A record as read back from the log."""

    partition: int
    offset: int
    key: str
    value: bytes


class LogHarness(Protocol):
    log: EventLog
    topic: str

    async def stored(self) -> list[Stored]:
        """Every record of ``topic``, in offset order per partition."""
        ...

    async def refused_append(self) -> None:
        """An append the implementation refuses (it must raise PublishError)."""
        ...


class EventLogContract:
    """The suite; a subclass provides the ``harness`` fixture."""

    async def test_an_append_returns_once_its_record_is_in_the_log(
        self, harness: LogHarness
    ) -> None:
        appended = await harness.log.append(harness.topic, "job-1", b"first")
        assert appended.topic == harness.topic
        assert Stored(appended.partition, appended.offset, "job-1", b"first") in (
            await harness.stored()
        )

    async def test_offsets_grow_per_partition(self, harness: LogHarness) -> None:
        acks = [await harness.log.append(harness.topic, f"job-{i % 6}", b"v") for i in range(18)]
        per_partition: dict[int, list[int]] = defaultdict(list)
        for ack in acks:
            per_partition[ack.partition].append(ack.offset)
        for partition, offsets in per_partition.items():
            assert offsets == sorted(set(offsets)), f"partition {partition}: {offsets}"

    async def test_one_key_keeps_its_order(self, harness: LogHarness) -> None:
        values = [f"step-{i}".encode() for i in range(10)]
        acks = [await harness.log.append(harness.topic, "job-ordered", v) for v in values]
        assert len({ack.partition for ack in acks}) == 1, "one key, one partition"
        assert [ack.offset for ack in acks] == sorted(ack.offset for ack in acks)
        read = [s.value for s in await harness.stored() if s.key == "job-ordered"]
        assert read == values

    async def test_many_appends_ack_each_record_and_pin_explicit_partitions(
        self, harness: LogHarness
    ) -> None:
        count = await harness.log.partition_count(harness.topic)
        assert count >= 1
        pinned = [Outbound("queue-q", f"p{p}".encode(), partition=p) for p in range(count)]
        keyed = [Outbound(f"job-{i}", b"many") for i in range(5)]
        acks = await harness.log.append_many(harness.topic, [*pinned, *keyed])
        assert not [a for a in acks if isinstance(a, PublishError)]
        assert [a.partition for a in acks[:count] if isinstance(a, Appended)] == list(range(count))
        stored = await harness.stored()
        for ack in acks:
            assert isinstance(ack, Appended)
            assert any((s.partition, s.offset) == (ack.partition, ack.offset) for s in stored)

    async def test_an_atomic_batch_is_in_the_log_once_acknowledged(
        self, harness: LogHarness
    ) -> None:
        records = [Outbound(f"job-a{i}", f"atomic-{i}".encode()) for i in range(4)]
        acks = await harness.log.append_atomic(harness.topic, records)
        assert len(acks) == 4
        wanted = {(ack.partition, r.value) for ack, r in zip(acks, records, strict=True)}

        async def visible() -> bool:
            # A committed transaction's markers are written after the commit is acknowledged,
            # one partition at a time: a read_committed reader sees each partition's part of the
            # batch whole moments later (Kafka 4 makes the moment longer), never a piece of one
            # partition's part. Across partitions Kafka promises no common moment.
            found = {(s.partition, s.value) for s in await harness.stored()} & wanted
            for partition in {p for p, _ in wanted}:
                part = {v for p, v in wanted if p == partition}
                seen = {v for p, v in found if p == partition}
                assert seen in (set(), part), f"partition {partition} shows a piece: {seen}"
            return found == wanted

        deadline = asyncio.get_running_loop().time() + 30
        while not await visible():
            assert asyncio.get_running_loop().time() < deadline, "the batch never became visible"
            await asyncio.sleep(0.05)

    async def test_an_ack_carries_the_append_time_of_the_events_topic(
        self, harness: LogHarness
    ) -> None:
        before = SYSTEM_CLOCK.now_ms()
        first = await harness.log.append(harness.topic, "job-t", b"a")
        second = await harness.log.append(harness.topic, "job-t", b"b")
        after = SYSTEM_CLOCK.now_ms()
        assert first.log_at is not None and second.log_at is not None
        assert before - CLOCK_SLACK_MS <= first.log_at <= second.log_at <= after + CLOCK_SLACK_MS

    async def test_a_refused_append_is_a_publish_error_and_the_log_goes_on(
        self, harness: LogHarness
    ) -> None:
        with pytest.raises(PublishError):
            await harness.refused_append()
        appended = await harness.log.append(harness.topic, "job-after", b"after")
        stored = await harness.stored()
        assert [s.value for s in stored] == [b"after"]
        assert stored[0].offset == appended.offset


# --- the twin -------------------------------------------------------------------------------------


class MemoryHarness:
    def __init__(self) -> None:
        # A clock makes the twin stamp its acknowledgements, as the LogAppendTime events topic.
        self.memory = MemoryLog(clock=SYSTEM_CLOCK)
        self.log: EventLog = self.memory
        self.topic = "ns.events"

    async def stored(self) -> list[Stored]:
        records = [r for r in self.memory.records if r.topic == self.topic]
        return [Stored(0, r.offset, r.key, r.value) for r in records]

    async def refused_append(self) -> None:
        self.memory.fail_next()
        await self.log.append(self.topic, "job-refused", b"refused")


class TestMemoryLog(EventLogContract):
    @pytest.fixture
    async def harness(self) -> AsyncIterator[LogHarness]:
        memory = MemoryHarness()
        await memory.log.start()
        yield memory
        await memory.log.close()


# --- Kafka ----------------------------------------------------------------------------------------


MakeLog = Callable[[Settings, str], EventLog]
# Both Kafka clients behind the port (EVSCHED_KAFKA_CLIENT picks one in a process).
CLIENTS: dict[str, MakeLog] = {
    "aiokafka": lambda settings, client_id: KafkaEventLog(settings, client_id=client_id),
    "confluent": lambda settings, client_id: RdkafkaEventLog(settings, client_id=client_id),
}


class KafkaHarness:
    def __init__(self, settings: Settings, make_log: MakeLog) -> None:
        self.settings = settings
        self.log: EventLog = make_log(settings, "evsched-contract")
        self.topic = Topics(settings.namespace).events

    async def stored(self) -> list[Stored]:
        reader = kafka.consumer(self.settings, group_id=None, client_id="evsched-contract-read")
        await reader.start()
        try:
            tps = [TopicPartition(self.topic, p) for p in range(self.settings.event_partitions)]
            reader.assign(tps)
            ends = await reader.end_offsets(tps)
            stored: list[Stored] = []
            for tp in tps:
                reader.seek(tp, 0)
                while await reader.position(tp) < ends[tp]:
                    batch = await reader.getmany(tp, timeout_ms=1_000)
                    stored += [
                        Stored(r.partition, r.offset, r.key.decode(), r.value)
                        for r in batch.get(tp, [])
                    ]
            return stored
        finally:
            await reader.stop()

    async def headers_at(self, partition: int, offset: int) -> tuple[tuple[str, bytes], ...]:
        reader = kafka.consumer(self.settings, group_id=None, client_id="evsched-contract-read")
        await reader.start()
        try:
            tp = TopicPartition(self.topic, partition)
            reader.assign([tp])
            reader.seek(tp, offset)
            batch = await reader.getmany(tp, timeout_ms=5_000, max_records=1)
            [record] = batch[tp]
            return tuple(record.headers)
        finally:
            await reader.stop()

    async def refused_append(self) -> None:
        # Beyond the producer's max_request_size (1 MB): refused before it is sent.
        await self.log.append(self.topic, "job-refused", b"x" * (2 << 20))


@pytest.mark.broker
class TestKafkaEventLog(EventLogContract):
    @pytest.fixture(params=sorted(CLIENTS))
    def make_log(self, request: pytest.FixtureRequest) -> MakeLog:
        return CLIENTS[request.param]

    @pytest.fixture
    async def harness(self, settings: Settings, make_log: MakeLog) -> AsyncIterator[LogHarness]:
        real = KafkaHarness(settings, make_log)
        await real.log.start()
        yield real
        await real.log.close()

    async def test_a_key_lands_on_its_murmur2_partition(self, harness: LogHarness) -> None:
        # Routing rests on it: whichever client wrote a key, the node owning its partition reads it.
        count = await harness.log.partition_count(harness.topic)
        keys = [f"job-{i}" for i in range(24)]
        acks = [await harness.log.append(harness.topic, k, b"routed") for k in keys]
        assert [a.partition for a in acks] == [partition_for(k, count) for k in keys]

    async def test_headers_reach_the_log(self, harness: LogHarness) -> None:
        # A worker's proof travels as a header (adapters.proofs).
        assert isinstance(harness, KafkaHarness)
        headers = (("evsched-proof", b"\x01proof"), ("other", b""))
        ack = await harness.log.append(harness.topic, "job-h", b"with-headers", headers)
        assert await harness.headers_at(ack.partition, ack.offset) == headers

    async def test_an_unreachable_broker_is_a_publish_error(
        self, settings: Settings, make_log: MakeLog
    ) -> None:
        nowhere = Settings(bootstrap="127.0.0.1:1", namespace=settings.namespace)
        log = make_log(nowhere, "evsched-contract-nowhere")
        with pytest.raises(PublishError, match=r"127\.0\.0\.1:1"):
            await log.append(Topics(nowhere.namespace).events, "job-1", b"lost")
        await log.close()
