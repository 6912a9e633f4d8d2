"""What the engine needs from the broker, proven on a real one: idempotence, transactions, fencing,
read_committed and LogAppendTime."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.errors import ProducerFenced
from aiokafka.structs import ConsumerRecord

from evsched.adapters.clock import SYSTEM_CLOCK
from evsched.adapters.kafka.event_log import KafkaEventLog
from evsched.adapters.kafka.topics import Topics
from evsched.settings import Settings

pytestmark = pytest.mark.broker

TIMESTAMP_CREATE_TIME = 0
TIMESTAMP_LOG_APPEND_TIME = 1
LONG_AGO_MS = 1_000_000  # 1970-01-01T00:16:40Z: no broker clock says this
TEN_YEARS_MS = 10 * 365 * 86_400_000


async def read_until(
    bootstrap: str,
    topic: str,
    done: bytes,
    *,
    isolation_level: str = "read_uncommitted",
    timeout_s: float = 30.0,
) -> list[ConsumerRecord[bytes, bytes]]:
    """Every record of ``topic`` from the start up to the one whose value is ``done``."""
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        isolation_level=isolation_level,
        fetch_max_wait_ms=100,
    )
    records: list[ConsumerRecord[bytes, bytes]] = []
    async with consumer, asyncio.timeout(timeout_s):
        async for record in consumer:
            records.append(record)
            if record.value == done:
                return records
    raise AssertionError("unreachable: the consumer iterates until cancelled")


@pytest.fixture
async def transactional(kafka_bootstrap: str, namespace: str) -> AsyncIterator[AIOKafkaProducer]:
    producer = AIOKafkaProducer(
        bootstrap_servers=kafka_bootstrap, transactional_id=f"{namespace}-tx"
    )
    async with producer:
        yield producer


async def test_idempotent_producer_round_trip(kafka_bootstrap: str, namespace: str) -> None:
    topic = Topics(namespace).dispatch("default")
    sent = [f"job-{i}".encode() for i in range(5)]
    async with AIOKafkaProducer(
        bootstrap_servers=kafka_bootstrap, enable_idempotence=True
    ) as producer:
        results = [await producer.send_and_wait(topic, value, key=b"job") for value in sent]

    # One key, one partition: the offsets are that partition's, in send order.
    assert len({r.partition for r in results}) == 1
    assert [r.offset for r in results] == sorted({r.offset for r in results})
    records = await read_until(kafka_bootstrap, topic, done=sent[-1])
    assert [r.value for r in records] == sent
    assert [r.offset for r in records] == [r.offset for r in results]


async def test_read_committed_sees_committed_transactions_only(
    kafka_bootstrap: str, namespace: str, transactional: AIOKafkaProducer
) -> None:
    topic = Topics(namespace).dispatch("default")
    async with transactional.transaction():
        await transactional.send_and_wait(topic, b"committed-1", key=b"k")
        await transactional.send_and_wait(topic, b"committed-2", key=b"k")
    await transactional.begin_transaction()
    await transactional.send_and_wait(topic, b"aborted", key=b"k")
    await transactional.abort_transaction()
    async with transactional.transaction():
        await transactional.send_and_wait(topic, b"committed-3", key=b"k")

    committed = await read_until(
        kafka_bootstrap, topic, done=b"committed-3", isolation_level="read_committed"
    )
    everything = await read_until(kafka_bootstrap, topic, done=b"committed-3")

    assert [r.value for r in committed] == [b"committed-1", b"committed-2", b"committed-3"]
    # The aborted record was written; only read_committed hides it.
    assert b"aborted" in [r.value for r in everything]


async def test_same_transactional_id_fences_the_older_producer(
    kafka_bootstrap: str, namespace: str, transactional: AIOKafkaProducer
) -> None:
    topic = Topics(namespace).dispatch("default")
    await transactional.begin_transaction()
    await transactional.send_and_wait(topic, b"from-zombie", key=b"k")

    successor = AIOKafkaProducer(
        bootstrap_servers=kafka_bootstrap, transactional_id=f"{namespace}-tx"
    )
    async with successor:
        with pytest.raises(ProducerFenced):
            await transactional.commit_transaction()
        async with successor.transaction():
            await successor.send_and_wait(topic, b"from-successor", key=b"k")

    committed = await read_until(
        kafka_bootstrap, topic, done=b"from-successor", isolation_level="read_committed"
    )
    assert [r.value for r in committed] == [b"from-successor"]


async def test_events_topic_stamps_log_append_time(kafka_bootstrap: str, namespace: str) -> None:
    names = Topics(namespace)
    async with AIOKafkaProducer(
        bootstrap_servers=kafka_bootstrap, enable_idempotence=True
    ) as producer:
        event = await producer.send_and_wait(
            names.events, b"event", key=b"job", timestamp_ms=LONG_AGO_MS
        )
        hint = await producer.send_and_wait(
            names.dispatch("default"), b"hint", key=b"job", timestamp_ms=LONG_AGO_MS
        )

    # The produce result carries the broker's append time, not the producer's claim.
    assert event.timestamp_type == TIMESTAMP_LOG_APPEND_TIME
    assert event.timestamp is not None
    assert event.timestamp > LONG_AGO_MS + TEN_YEARS_MS
    [consumed] = await read_until(kafka_bootstrap, names.events, done=b"event")
    assert consumed.timestamp_type == TIMESTAMP_LOG_APPEND_TIME
    assert consumed.timestamp == event.timestamp
    # A CreateTime topic keeps the producer's timestamp: the setting is what makes the difference.
    assert (hint.timestamp_type, hint.timestamp) == (TIMESTAMP_CREATE_TIME, LONG_AGO_MS)


async def test_an_append_to_the_events_topic_reports_the_brokers_append_time(
    kafka_bootstrap: str, namespace: str
) -> None:
    # A worker judges its start by this time (issue 9, C.7): the broker's, not its own.
    names = Topics(namespace)
    log = KafkaEventLog(Settings(bootstrap=kafka_bootstrap, namespace=namespace), client_id="t")
    await log.start()
    try:
        before = SYSTEM_CLOCK.now_ms()
        event = await log.append(names.events, "job", b"event")
        hint = await log.append(names.dispatch("default"), "job", b"hint")
        after = SYSTEM_CLOCK.now_ms()
    finally:
        await log.close()
    assert event.log_at is not None
    assert before - 5_000 <= event.log_at <= after + 5_000
    assert hint.log_at is None  # a CreateTime topic: no broker time to report
