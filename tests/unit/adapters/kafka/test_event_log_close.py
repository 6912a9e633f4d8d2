"""Closing the Kafka event log after an append was refused for too few in-sync replicas, with no
broker (the producer holds each record until its partition takes writes, the cluster is a
function): while the refused record is still held, closing drops what the producer holds at once;
once it landed (the brokers are back), closing waits for the appends in flight, as usual."""

from __future__ import annotations

import asyncio
import functools
from dataclasses import dataclass
from typing import Any

import pytest

from evsched.adapters.kafka import event_log as kafka_log
from evsched.adapters.kafka.event_log import KafkaEventLog
from evsched.adapters.kafka.replicas import PartitionReplicas, ReplicaCheck, acknowledged
from evsched.errors import NotEnoughReplicas
from evsched.ports import Appended
from evsched.settings import Settings

NOWHERE = Settings(bootstrap="127.0.0.1:1", namespace="ns")
TOPIC = "ns.events"
DELIVERY_S = 0.05  # how long a record takes to land once its partition takes writes


@dataclass(frozen=True)
class Metadata:
    partition: int
    offset: int
    timestamp: int = 0
    timestamp_type: int = 0


class HoldingProducer:
    """An idempotent producer as seen from outside: each record waits until its partition takes
    writes (``writable``), then lands after ``DELIVERY_S``; stop() first delivers what it holds,
    and records failed by ``fail_all`` (kafka.stop_producer past its timeout) are dropped."""

    def __init__(self) -> None:
        self._message_accumulator = self
        self.writable = asyncio.Event()
        self.held: list[asyncio.Future[Metadata]] = []
        self.landed = 0
        self.dropped: BaseException | None = None
        self._deliveries: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        return None

    async def partitions_for(self, topic: str) -> set[int]:
        return {0}

    async def send(self, topic: str, value: bytes, key: bytes | None = None) -> Any:
        record: asyncio.Future[Metadata] = asyncio.get_running_loop().create_future()
        self.held.append(record)
        delivery = asyncio.create_task(self._deliver(record))
        self._deliveries.add(delivery)
        delivery.add_done_callback(self._deliveries.discard)
        return record

    async def _deliver(self, record: asyncio.Future[Metadata]) -> None:
        await self.writable.wait()
        await asyncio.sleep(DELIVERY_S)
        if not record.done():
            record.set_result(Metadata(partition=0, offset=self.landed))
            self.landed += 1

    def fail_all(self, exc: BaseException) -> None:
        self.dropped = exc
        for record in self.held:
            if not record.done():
                record.set_exception(exc)

    async def stop(self) -> None:
        await asyncio.gather(*self.held, return_exceptions=True)


@pytest.fixture
def producer(monkeypatch: pytest.MonkeyPatch) -> HoldingProducer:
    made = HoldingProducer()
    monkeypatch.setattr("evsched.adapters.kafka.clients.producer", lambda settings, **_: made)
    # Look at the cluster after 10 ms without an ack, not after a second.
    monkeypatch.setattr(
        kafka_log, "acknowledged", functools.partial(acknowledged, check_after_s=0.01)
    )
    return made


def event_log(producer: HoldingProducer) -> KafkaEventLog:
    """The event log, its partition short of in-sync replicas until the producer's is writable."""

    async def describe(topic: str) -> dict[int, PartitionReplicas]:
        isr = (1, 2) if producer.writable.is_set() else (1,)
        return {
            0: PartitionReplicas(
                topic=topic, partition=0, leader=1, replicas=(1, 2), isr=isr, min_isr=2
            )
        }

    log = KafkaEventLog(NOWHERE, client_id="c")
    log._replicas = ReplicaCheck(describe, fresh_s=0.0)
    return log


async def test_closing_while_a_refused_record_is_held_drops_what_the_producer_holds(
    producer: HoldingProducer,
) -> None:
    log = event_log(producer)
    with pytest.raises(NotEnoughReplicas):
        await log.append(TOPIC, "job-1", b"v")
    async with asyncio.timeout(1):  # not the 10 s stop timeout: it could not land anyway
        await log.close()
    assert producer.dropped is not None and producer.landed == 0
    await asyncio.sleep(0.01)  # the dropped record's append ends: the log forgets it
    assert not log._refused  # reused, the log closes as usual


async def test_closing_once_the_refused_record_landed_waits_for_the_appends_in_flight(
    producer: HoldingProducer,
) -> None:
    log = event_log(producer)
    with pytest.raises(NotEnoughReplicas):
        await log.append(TOPIC, "job-1", b"v")
    producer.writable.set()  # the brokers are back: the refused record lands
    async with asyncio.timeout(5):
        while producer.landed < 1:
            await asyncio.sleep(0.01)
    later = asyncio.create_task(log.append(TOPIC, "job-2", b"v"))
    async with asyncio.timeout(5):
        while len(producer.held) < 2:  # in flight: sent, not acknowledged yet
            await asyncio.sleep(0.001)
    await log.close()
    # Before: the refusal stuck, the close dropped job-2's record at once (PublishError).
    appended = await later
    assert isinstance(appended, Appended) and appended.offset == 1
    assert producer.dropped is None and producer.landed == 2
