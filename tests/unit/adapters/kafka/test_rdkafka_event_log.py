"""RdkafkaEventLog's error handling without a broker (its producer stubbed): a fatal producer
error makes a new producer for one more attempt, other errors are PublishError at once, a
batch that met a fatal error leaves the next call a fresh producer, and an unacknowledged append
names its short partition from a describe of the topic alone."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest
from confluent_kafka import (
    TIMESTAMP_CREATE_TIME,
    TIMESTAMP_LOG_APPEND_TIME,
    KafkaError,
    KafkaException,
)

from evsched.adapters.kafka import rdkafka_event_log
from evsched.adapters.kafka.partition_log import partition_for
from evsched.adapters.kafka.rdkafka_event_log import RdkafkaEventLog
from evsched.adapters.kafka.rdkafka_producer import PolledProducer, producer_config
from evsched.adapters.kafka.replicas import PartitionReplicas
from evsched.errors import NotEnoughReplicas, PublishError
from evsched.ports import Appended, Outbound
from evsched.settings import Settings

TOPIC = "ns.events"
FATAL = KafkaError(KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER, "sequence gap", fatal=True)
TOO_LARGE = KafkaError(KafkaError.MSG_SIZE_TOO_LARGE, "too large")


class Acked:
    """An acknowledged confluent_kafka.Message, as far as the adapter reads one."""

    def __init__(self, partition: int, offset: int, kind: int = TIMESTAMP_LOG_APPEND_TIME) -> None:
        self._at = (partition, offset, kind)

    def partition(self) -> int:
        return self._at[0]

    def offset(self) -> int:
        return self._at[1]

    def timestamp(self) -> tuple[int, int]:
        return self._at[2], 1_700_000_000_000


class StubProducer:
    """PolledProducer's surface; each made one takes the next outcome list from ``plans``."""

    made: list[StubProducer] = []
    plans: list[list[KafkaError | None]] = []

    def __init__(self, config: Any, *, bootstrap: str) -> None:
        self.outcomes = StubProducer.plans.pop(0)
        self.closed = False
        StubProducer.made.append(self)

    async def start(self) -> None:
        return None

    def send(
        self, topic: str, key: bytes, value: bytes, *, partition: int | None = None,
        headers: Sequence[tuple[str, bytes]] = (),
    ) -> asyncio.Future[Any]:  # fmt: skip
        future = asyncio.get_running_loop().create_future()
        err = self.outcomes.pop(0)
        if err is None:
            future.set_result(Acked(partition or 0, len(self.outcomes)))
        else:
            future.set_exception(KafkaException(err))
        return future

    def is_fatal(self, exc: BaseException) -> bool:
        return isinstance(exc, KafkaException) and exc.args[0].fatal()

    async def close(self, timeout_s: float) -> None:
        self.closed = True


@pytest.fixture
def stubbed(monkeypatch: pytest.MonkeyPatch) -> type[StubProducer]:
    StubProducer.made, StubProducer.plans = [], []
    monkeypatch.setattr(rdkafka_event_log, "PolledProducer", StubProducer)
    return StubProducer


async def test_a_fatal_error_makes_a_new_producer_that_sends_again(
    stubbed: type[StubProducer],
) -> None:
    stubbed.plans = [[FATAL], [None]]
    log = RdkafkaEventLog(Settings(), client_id="c")
    ack = await log.append(TOPIC, "job-1", b"v")
    assert ack == Appended(TOPIC, 0, 0, 1_700_000_000_000)
    assert [p.closed for p in stubbed.made] == [True, False]
    await log.close()


async def test_a_second_fatal_error_is_a_publish_error(stubbed: type[StubProducer]) -> None:
    stubbed.plans = [[FATAL], [FATAL]]
    log = RdkafkaEventLog(Settings(), client_id="c")
    with pytest.raises(PublishError, match="sequence gap"):
        await log.append(TOPIC, "job-1", b"v")
    assert len(stubbed.made) == 2
    await log.close()


async def test_an_error_that_is_not_fatal_keeps_the_producer(stubbed: type[StubProducer]) -> None:
    stubbed.plans = [[TOO_LARGE, None]]
    log = RdkafkaEventLog(Settings(), client_id="c")
    with pytest.raises(PublishError, match="too large"):
        await log.append(TOPIC, "job-1", b"v")
    assert isinstance(await log.append(TOPIC, "job-2", b"v"), Appended)
    assert len(stubbed.made) == 1
    await log.close()


async def test_a_batch_reports_each_record_and_a_fatal_one_renews_the_producer(
    stubbed: type[StubProducer],
) -> None:
    stubbed.plans = [[None, FATAL, None], [None]]
    log = RdkafkaEventLog(Settings(), client_id="c")
    results = await log.append_many(TOPIC, [Outbound(f"k{i}", b"v", partition=i) for i in range(3)])
    assert [type(r) for r in results] == [Appended, PublishError, Appended]
    assert stubbed.made[0].closed
    assert isinstance(await log.append(TOPIC, "job-after", b"v"), Appended)
    assert len(stubbed.made) == 2
    await log.close()


class UnackedProducer(StubProducer):
    """A producer whose records are never acknowledged (their partition lacks replicas), and
    which cannot be asked for metadata: a look at the cluster must not need it."""

    def send(
        self, topic: str, key: bytes, value: bytes, *, partition: int | None = None,
        headers: Sequence[tuple[str, bytes]] = (),
    ) -> asyncio.Future[Any]:  # fmt: skip
        return asyncio.get_running_loop().create_future()


def three_partitions_one_short(short: int) -> dict[int, PartitionReplicas]:
    return {
        p: PartitionReplicas(
            topic=TOPIC, partition=p, leader=1, replicas=(1, 2, 3),
            isr=(1, 2) if p == short else (1, 2, 3), min_isr=3,
        )
        for p in range(3)
    }  # fmt: skip


async def test_an_unacked_append_names_its_short_partition_from_the_describe_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # librdkafka's own metadata request (list_topics) went unanswered for 25 s after a broker
    # died: the partition count now comes from the describe that names the replicas.
    monkeypatch.setattr(rdkafka_event_log, "PolledProducer", UnackedProducer)
    key = next(k for k in (f"job-{i}" for i in range(100)) if partition_for(k, 3) == 2)
    asked: list[str] = []

    async def describe(settings: Settings, topic: str) -> dict[int, PartitionReplicas]:
        asked.append(topic)
        return three_partitions_one_short(2)

    monkeypatch.setattr(rdkafka_event_log, "describe_partitions", describe)
    StubProducer.made, StubProducer.plans = [], [[]]
    log = RdkafkaEventLog(Settings(), client_id="c", ack_timeout_s=20)
    started = asyncio.get_running_loop().time()
    with pytest.raises(NotEnoughReplicas, match=r"partition 2 of 'ns.events' has 2 in-sync"):
        await asyncio.wait_for(log.append(TOPIC, key, b"v"), 10)
    assert asyncio.get_running_loop().time() - started < 5  # at the first look, not at 20 s
    assert asked == [TOPIC]
    await log.close()


def test_create_time_is_not_reported_as_the_log_append_time() -> None:
    assert rdkafka_event_log.appended(TOPIC, Acked(1, 2, TIMESTAMP_CREATE_TIME)).log_at is None


async def test_closing_fails_what_the_producer_still_holds() -> None:
    # No broker: the record stays queued; closing without waiting purges it and says so.
    nowhere = Settings(bootstrap="127.0.0.1:1")
    producer = PolledProducer(producer_config(nowhere, client_id="c"), bootstrap=nowhere.bootstrap)
    held = producer.send(TOPIC, b"k", b"v")
    await producer.close(0.0)
    assert held.done()
    with pytest.raises(KafkaException) as failed:
        held.result()
    assert failed.value.args[0].code() == KafkaError._PURGE_QUEUE


async def test_an_unreachable_cluster_fails_the_start_soon() -> None:
    nowhere = Settings(bootstrap="127.0.0.1:1")
    producer = PolledProducer(producer_config(nowhere, client_id="c"), bootstrap=nowhere.bootstrap)
    try:
        with pytest.raises(PublishError, match=r"cannot reach Kafka at 127\.0\.0\.1:1"):
            await asyncio.wait_for(producer.start(), 5)
    finally:
        await producer.close(0.0)


async def test_a_report_for_an_ack_given_up_on_is_told_to_on_late() -> None:
    # The log keeps a refused record's ack until the producer reports it (closing sooner then).
    nowhere = Settings(bootstrap="127.0.0.1:1")
    producer = PolledProducer(producer_config(nowhere, client_id="c"), bootstrap=nowhere.bootstrap)
    late: list[asyncio.Future[Any]] = []
    producer.on_late = late.append
    given_up = producer.send(TOPIC, b"k", b"v")
    given_up.set_exception(PublishError("refused"))  # as AckWatch fails an overdue ack
    await producer.close(0.0)  # the purge reports the record
    assert late == [given_up]
    with pytest.raises(PublishError):
        given_up.result()  # the watch's error stands
