"""The node: owns events partitions through a consumer group, folds them and runs the scheduler.

Kafka's group assignment is the ownership: there is no election of our own. Each owned partition
gets a transactional producer whose id is bound to the partition, so a new owner's producer fences
a zombie's, and the fold rejects whatever a zombie still manages to write.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import structlog
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.abc import ConsumerRebalanceListener
from aiokafka.errors import IllegalStateError, ProducerFenced
from aiokafka.structs import TopicPartition

from evsched.adapters import kafka
from evsched.adapters.clock import monotonic_s, now_ms
from evsched.adapters.index import PartitionIndex
from evsched.adapters.kafka import Record
from evsched.adapters.topics import Topics, ensure_topics
from evsched.core.planner import PlannerLimits
from evsched.runtime.gc_policy import tune_for_folding
from evsched.runtime.partition import OwnedPartition, open_index
from evsched.settings import Settings

log = structlog.get_logger("evsched.node")

# How long a partition that failed to open waits before the poll loop tries it again.
ORPHAN_RETRY_S = 2.0


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeConfig:
    settings: Settings
    node_id: str
    data_dir: Path
    limits: PlannerLimits = field(default_factory=PlannerLimits)
    max_idle_ms: int = 200
    max_records: int = 2_000

    @property
    def group_id(self) -> str:
        return f"{self.settings.namespace}.nodes"

    def transactional_id(self, partition: int) -> str:
        return f"{self.settings.namespace}.node.p{partition}"


class Node:
    """Run with ``await node.run(stop)``; returns once ``stop`` is set and partitions closed."""

    def __init__(self, config: NodeConfig) -> None:
        self.config = config
        self.topics = Topics(config.settings.namespace)
        self.owned: dict[int, OwnedPartition] = {}
        self._lock = asyncio.Lock()
        self._known_queues: set[str] = set()
        self._queues_lock = asyncio.Lock()
        self._consumer: AIOKafkaConsumer | None = None
        self._generation = 0  # bumped on every assignment change
        self._fenced: set[int] = set()  # fenced since the last assignment: not ours to reopen
        self._retry_at: dict[int, float] = {}
        self.log = log.bind(node_id=config.node_id)

    async def run(self, stop: asyncio.Event) -> None:
        consumer = kafka.consumer(
            self.config.settings,
            group_id=self.config.group_id,
            client_id=f"evsched-node-{self.config.node_id}",
            max_poll_records=self.config.max_records,
        )
        self._consumer = consumer
        consumer.subscribe([self.topics.events], listener=_Listener(self))
        await consumer.start()
        self.log.info("node_started", group_id=self.config.group_id)
        try:
            while not stop.is_set():
                await self._poll_once(consumer)
        finally:
            async with self._lock:
                await self._close_all()
            await consumer.stop()
            self.log.info("node_stopped")

    async def _poll_once(self, consumer: AIOKafkaConsumer) -> None:
        generation = self._generation
        batches = await consumer.getmany(
            timeout_ms=self._idle_ms(), max_records=self.config.max_records
        )
        # getmany(timeout_ms=0) may return without yielding: let heartbeats and fetches run.
        await asyncio.sleep(0)
        async with self._lock:
            if generation != self._generation:
                # The assignment changed while we fetched: these records may predate our seeks.
                # Drop them and fetch again from exactly where each partition's fold stands.
                for owner in self.owned.values():
                    consumer.seek(owner.tp, owner.projector.next_offset)
                return
            now = now_ms()
            by_partition: dict[int, list[Record]] = {}
            for tp, raws in batches.items():
                by_partition[tp.partition] = [kafka.to_record(r) for r in raws]
            # Partitions step concurrently: each waits on its own transaction, so one partition's
            # round trips to the broker overlap another's fold and plan instead of adding up.
            steps = []
            for partition, owner in list(self.owned.items()):
                records = by_partition.get(partition, [])
                if owner.has_work(records, now):
                    steps.append(self._step(consumer, owner, records, now))
            await asyncio.gather(*steps)
            await self._adopt_orphans(consumer)

    async def _adopt_orphans(self, consumer: AIOKafkaConsumer) -> None:
        """Open assigned partitions that failed to open or were dropped after an error."""
        now = monotonic_s()
        for tp in consumer.assignment():
            partition = tp.partition
            if partition in self.owned or partition in self._fenced:
                continue
            if self._retry_at.get(partition, 0.0) > now:
                continue
            self._retry_at[partition] = now + ORPHAN_RETRY_S
            try:
                await self._open(consumer, self._seek_to_index(consumer, partition))
            except Exception as exc:
                self.log.warning("partition_open_failed", partition=partition, error=repr(exc))

    async def _step(
        self, consumer: AIOKafkaConsumer, owner: OwnedPartition, records: list[Record], now: int
    ) -> None:
        try:
            position = await consumer.position(owner.tp)
            await owner.step(records, now, position)
        except IllegalStateError:
            return  # revoked while we polled; the listener closes it
        except ProducerFenced:
            # A newer producer holds this partition's transactional id: the group gave the
            # partition to someone else and we have not heard yet. Reopening would fence the new
            # owner back, so wait for our next assignment instead.
            self.log.warning("partition_fenced", partition=owner.partition)
            self._fenced.add(owner.partition)
            await self._drop(owner.partition)
        except Exception as exc:
            # Anything else (broker trouble, a producer that must be recreated): drop the
            # partition's in-memory work; _adopt_orphans reopens it from its index, which
            # stays consistent with the log.
            self.log.warning("partition_step_failed", partition=owner.partition, error=repr(exc))
            await self._drop(owner.partition)

    async def ensure_queues(self, queues: set[str]) -> None:
        """Create dispatch topics for queues this node has not sent to yet."""
        if queues <= self._known_queues:
            return
        async with self._queues_lock:  # partitions step concurrently: provision once
            await self._ensure_queues(queues - self._known_queues)

    async def _ensure_queues(self, queues: set[str]) -> None:
        if queues:
            settings = self.config.settings
            await ensure_topics(
                settings.bootstrap,
                settings.namespace,
                event_partitions=settings.event_partitions,
                queues=sorted(queues),
                **dict(settings.kafka_options),
            )
            self._known_queues |= queues

    def _idle_ms(self) -> int:
        """Sleep in the poll no longer than until the next due time of any owned partition."""
        wake = [w for o in self.owned.values() if (w := o.next_wake_at()) is not None]
        if not wake:
            return self.config.max_idle_ms
        return max(0, min(self.config.max_idle_ms, min(wake) - now_ms()))

    # --- ownership ---------------------------------------------------------------------------

    async def assign(self, partitions: Iterable[int]) -> None:
        consumer = self._consumer
        assert consumer is not None
        self._generation += 1
        self._fenced.clear()
        self._retry_at.clear()
        # Seek every partition to its index before anything awaits, and hold its fetches until
        # it is open: a fetch from the group's committed offset must never reach the fold first.
        indexes = [self._seek_to_index(consumer, p) for p in partitions]
        for index in indexes:
            try:
                await self._open(consumer, index)
            except Exception as exc:
                # Left paused and unowned: the poll loop retries it (see _adopt_orphans).
                self.log.warning(
                    "partition_open_failed", partition=index.partition, error=repr(exc)
                )

    def _seek_to_index(self, consumer: AIOKafkaConsumer, partition: int) -> PartitionIndex:
        tp = TopicPartition(self.topics.events, partition)
        consumer.pause(tp)
        index = open_index(self.config.data_dir, partition)
        consumer.seek(tp, index.applied_offset() + 1)
        return index

    async def revoke(self, partitions: Iterable[int]) -> None:
        self._generation += 1
        for partition in partitions:
            owner = self.owned.pop(partition, None)
            if owner is not None:
                await self._close(owner)
                self.log.info("partition_revoked", partition=partition)

    async def _open(self, consumer: AIOKafkaConsumer, index: PartitionIndex) -> None:
        partition = index.partition
        tp = TopicPartition(self.topics.events, partition)
        producer = kafka.producer(
            self.config.settings,
            client_id=f"evsched-node-{self.config.node_id}-p{partition}",
            transactional_id=self.config.transactional_id(partition),
        )
        try:
            # Starting the producer bumps the transactional epoch: a zombie owner is fenced here.
            await producer.start()
            committed = await consumer.committed(tp)
            end = (await consumer.end_offsets([tp]))[tp]
        except Exception:
            index.close()
            with contextlib.suppress(Exception):
                await producer.stop()
            raise
        owner = OwnedPartition(
            index=index,
            topics=self.topics,
            producer=producer,
            group_id=self.config.group_id,
            node_id=self.config.node_id,
            limits=self.config.limits,
            committed=committed,
            end_offset=end,
            ensure_queues=self.ensure_queues,
        )
        consumer.seek(tp, owner.resume_offset)
        consumer.resume(tp)
        self.owned[partition] = owner
        self.log.info(
            "partition_assigned",
            partition=partition,
            resume_offset=owner.resume_offset,
            committed=committed,
            end_offset=end,
        )

    async def _drop(self, partition: int) -> None:
        owner = self.owned.pop(partition, None)
        if owner is not None:
            await self._close(owner)

    async def _close(self, owner: OwnedPartition) -> None:
        with contextlib.suppress(Exception):
            await _stop_producer(owner.producer)
        owner.close()

    async def _close_all(self) -> None:
        await self.revoke(list(self.owned))


async def _stop_producer(producer: AIOKafkaProducer) -> None:
    await producer.stop()


class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]
    """Opens and closes owned partitions as the group assigns and revokes them."""

    def __init__(self, node: Node) -> None:
        self.node = node

    async def on_partitions_revoked(self, revoked: Iterable[TopicPartition]) -> None:
        async with self.node._lock:
            await self.node.revoke(tp.partition for tp in revoked)

    async def on_partitions_assigned(self, assigned: Iterable[TopicPartition]) -> None:
        async with self.node._lock:
            await self.node.assign(tp.partition for tp in assigned)


async def serve_node(config: NodeConfig) -> None:
    """Provision the base topics, run the node until SIGTERM or SIGINT, then close cleanly."""
    settings = config.settings
    await ensure_topics(
        settings.bootstrap,
        settings.namespace,
        event_partitions=settings.event_partitions,
        queues=[],
        **dict(settings.kafka_options),
    )
    tune_for_folding()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await Node(config).run(stop)
