"""The events topic's read side on aiokafka: a partition reader and the node's group consumer.

Both speak plain partition numbers and ``ports.Record``s, and map the client's errors to
evsched's own: a partition no longer assigned raises ``PartitionRevoked``, any other client
failure ``BrokerUnavailable``. Nothing above the adapters sees an aiokafka type.
"""

from __future__ import annotations

import contextlib
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from aiokafka import AIOKafkaConsumer
from aiokafka.abc import ConsumerRebalanceListener
from aiokafka.errors import IllegalStateError, KafkaError
from aiokafka.partitioner import murmur2
from aiokafka.structs import TopicPartition

from evsched.adapters.kafka import clients as kafka
from evsched.adapters.kafka.client_logs import group_joined
from evsched.errors import BrokerUnavailable, PartitionRevoked
from evsched.ports import Record
from evsched.settings import Settings


def partition_for(key: str, partitions: int) -> int:
    """Kafka's default partitioner for keyed records (murmur2), as every client computes it."""
    hashed: int = murmur2(key.encode())
    return (hashed & 0x7FFFFFFF) % partitions


@contextlib.contextmanager
def broker_errors(what: str) -> Iterator[None]:
    """Raise the client's errors met inside as evsched's own, naming ``what`` was attempted."""
    try:
        yield
    except IllegalStateError as exc:  # a KafkaError too: checked first
        raise PartitionRevoked(f"{what}: {exc}") from exc
    except KafkaError as exc:
        raise BrokerUnavailable(f"{what}: {exc!r}") from exc


async def start_consumer(consumer: AIOKafkaConsumer, what: str) -> None:
    """Start ``consumer``; one that fails to start is stopped, so nothing is left open."""
    with broker_errors(what):
        try:
            await consumer.start()
        except BaseException:
            with contextlib.suppress(Exception):
                await consumer.stop()
            raise


class _Reader:
    """Reads of an assigned (or group-assigned) set of partitions of one topic."""

    def __init__(self, topic: str, consumer: AIOKafkaConsumer) -> None:
        self.topic = topic
        self._consumer = consumer

    async def close(self) -> None:
        with contextlib.suppress(KafkaError):
            await self._consumer.stop()

    def _tp(self, partition: int) -> TopicPartition:
        return TopicPartition(self.topic, partition)

    def seek(self, partition: int, offset: int) -> None:
        with broker_errors(f"seek p{partition}"):
            self._consumer.seek(self._tp(partition), offset)

    async def position(self, partition: int) -> int:
        with broker_errors(f"position of p{partition}"):
            position: int = await self._consumer.position(self._tp(partition))
            return position

    async def start_offsets(self, partitions: Collection[int]) -> dict[int, int]:
        with broker_errors(f"start offsets of {self.topic}"):
            found = await self._consumer.beginning_offsets([self._tp(p) for p in partitions])
        return {tp.partition: offset for tp, offset in found.items()}

    async def end_offsets(self, partitions: Collection[int]) -> dict[int, int]:
        with broker_errors(f"end offsets of {self.topic}"):
            found = await self._consumer.end_offsets([self._tp(p) for p in partitions])
        return {tp.partition: offset for tp, offset in found.items()}

    async def offsets_after(
        self, partitions: Collection[int], at_ms: int
    ) -> dict[int, tuple[int, int] | None]:
        """Per partition, the first record whose log time is after ``at_ms``: (offset, log
        time), or None when there is none yet (``log_cut.Positions``)."""
        with broker_errors(f"offsets of {self.topic} by time"):
            found = await self._consumer.offsets_for_times(
                {self._tp(p): at_ms + 1 for p in partitions}
            )
        return {
            tp.partition: None if hit is None else (hit.offset, hit.timestamp)
            for tp, hit in found.items()
        }

    async def read(
        self, partitions: Collection[int], timeout_s: float, max_records: int
    ) -> dict[int, list[Record]]:
        tps = [self._tp(p) for p in partitions]
        with broker_errors(f"fetch from {self.topic}"):
            batches = await self._consumer.getmany(
                *tps, timeout_ms=round(timeout_s * 1000), max_records=max_records
            )
        return {tp.partition: [kafka.to_record(r) for r in raws] for tp, raws in batches.items()}


class KafkaPartitionLog(_Reader):
    """``ports.PartitionLog`` over a read_committed consumer without a group (assigned by hand)."""

    def __init__(
        self,
        settings: Settings,
        topic: str,
        partitions: Iterable[int],
        *,
        client_id: str,
        **options: Any,
    ) -> None:
        super().__init__(
            topic, kafka.consumer(settings, group_id=None, client_id=client_id, **options)
        )
        self.partitions = sorted(partitions)

    async def start(self) -> None:
        await start_consumer(self._consumer, f"start a reader of {self.topic}")
        self._consumer.assign([self._tp(p) for p in self.partitions])

    async def __aenter__(self) -> KafkaPartitionLog:
        await self.start()
        return self

    async def read(
        self, partitions: Collection[int], timeout_s: float, max_records: int
    ) -> dict[int, list[Record]]:
        """Records of ``partitions``; the other assigned partitions are paused until asked for.

        A standby copy reads a few of the partitions it is assigned (not the node's own, not
        those caught up to the group's offset): unpaused, the consumer would keep fetching the
        rest into its buffers for nothing.
        """
        wanted = {self._tp(p) for p in partitions}
        with broker_errors(f"pause the partitions of {self.topic} not read"):
            self._consumer.pause(*(tp for tp in self._consumer.assignment() if tp not in wanted))
            self._consumer.resume(*wanted)
        return await super().read(partitions, timeout_s, max_records)

    async def __aexit__(self, *_: object) -> None:
        await self.close()


class Rebalance(Protocol):
    """Told by the group consumer which partitions it loses and gets, in that order."""

    async def revoked(self, partitions: list[int]) -> None: ...

    async def assigned(self, partitions: list[int]) -> None: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupMembership:
    """Who the node's group member is and what it reads, on either client (aiokafka here,
    librdkafka in ``rdkafka_group``)."""

    settings: Settings
    topic: str
    group_id: str
    client_id: str
    max_records: int


class KafkaGroupConsumer(_Reader):
    """The node's member of the events topic's consumer group: reads what the group assigns.

    Offsets are never committed here (the node's transactions carry them); ``listener`` is
    called around every rebalance, possibly before ``start`` returns.
    """

    def __init__(self, member: GroupMembership, *, listener: Rebalance) -> None:
        consumer = kafka.consumer(
            member.settings,
            group_id=member.group_id,
            client_id=member.client_id,
            max_poll_records=member.max_records,
            **kafka.group_timeouts(member.settings),
        )
        super().__init__(member.topic, consumer)
        consumer.subscribe([member.topic], listener=_Listener(listener))

    async def start(self) -> None:
        await start_consumer(self._consumer, f"join the group of {self.topic}")
        group_joined()  # a subscribed consumer's start returns once it has its assignment

    def assignment(self) -> set[int]:
        return {tp.partition for tp in self._consumer.assignment()}

    def member_id(self) -> str | None:
        """This consumer's member id in the group (None until it joined, or once it left)."""
        # aiokafka keeps it on its group coordinator only; "" is Kafka's unknown member id.
        member = getattr(getattr(self._consumer, "_coordinator", None), "member_id", "")
        return str(member) or None

    def pause(self, partition: int) -> None:
        with broker_errors(f"pause p{partition}"):
            self._consumer.pause(self._tp(partition))

    def resume(self, partition: int) -> None:
        with broker_errors(f"resume p{partition}"):
            self._consumer.resume(self._tp(partition))

    async def committed(self, partition: int) -> int | None:
        """The group's committed offset of ``partition`` (None: nothing committed yet)."""
        with broker_errors(f"committed offset of p{partition}"):
            offset: int | None = await self._consumer.committed(self._tp(partition))
            return offset

    async def read_all(self, timeout_s: float, max_records: int) -> dict[int, list[Record]]:
        """Records of every assigned, unpaused partition."""
        return await self.read((), timeout_s, max_records)


class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, target: Rebalance) -> None:
        self.target = target

    async def on_partitions_revoked(self, revoked: Iterable[TopicPartition]) -> None:
        await self.target.revoked([tp.partition for tp in revoked])

    async def on_partitions_assigned(self, assigned: Iterable[TopicPartition]) -> None:
        await self.target.assigned([tp.partition for tp in assigned])
