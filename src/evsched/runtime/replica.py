"""The read replica: the same fold over every events partition, emitting nothing.

Serves reads (job state, timelines) with read-your-writes: a writer waits until the replica has
applied the offset its produce returned. ``rebuild`` folds a partition from the start into a fresh
index, which must equal the live one at the same offset.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import structlog
from aiokafka import AIOKafkaConsumer
from aiokafka.partitioner import murmur2
from aiokafka.structs import TopicPartition

from evsched.adapters import kafka
from evsched.adapters.clock import monotonic_s
from evsched.adapters.index import PartitionIndex
from evsched.adapters.topics import Topics, partition_count
from evsched.core.state import JobState, TimelineEntry
from evsched.errors import EvschedError
from evsched.runtime.projector import CommitHook, Projector
from evsched.settings import Settings

log = structlog.get_logger("evsched.replica")

# A partition whose fold failed is retried after this wait, doubled per failure in a row.
RETRY_FIRST_S = 1.0
RETRY_MAX_S = 30.0


def partition_for(key: str, partitions: int) -> int:
    """Kafka's default partitioner for keyed records (murmur2), as every client computes it."""
    hashed: int = murmur2(key.encode())
    return (hashed & 0x7FFFFFFF) % partitions


class Replica:
    """Folds all partitions of ``<ns>.events`` into local indexes under ``data_dir``."""

    def __init__(
        self,
        settings: Settings,
        data_dir: Path,
        *,
        client_id: str = "evsched-replica",
        on_commit: CommitHook | None = None,
    ):
        self.settings = settings
        self.topic = Topics(settings.namespace).events
        self.data_dir = data_dir
        self.client_id = client_id
        # Told what every committed batch folded (e.g. metrics), after it is in the index.
        self.on_commit = on_commit
        self.projectors: dict[int, Projector] = {}
        self._consumer: AIOKafkaConsumer | None = None
        self._changed = asyncio.Condition()
        self._task: asyncio.Task[None] | None = None
        # Partitions whose last fold failed, with the reason: paused, retried after a wait.
        self.failing: dict[int, str] = {}
        self._failures: dict[int, int] = {}
        self._retry_at: dict[int, float] = {}

    async def start(self) -> None:
        count = await partition_count(
            self.settings.bootstrap, self.topic, **dict(self.settings.kafka_options)
        )
        consumer = kafka.consumer(self.settings, group_id=None, client_id=self.client_id)
        await consumer.start()
        self._consumer = consumer
        tps = [TopicPartition(self.topic, p) for p in range(count)]
        consumer.assign(tps)
        for tp in tps:
            index = PartitionIndex(self.data_dir / f"p{tp.partition:04d}", tp.partition)
            self.projectors[tp.partition] = Projector(index, on_commit=self.on_commit)
            consumer.seek(tp, index.applied_offset() + 1)
        self._task = asyncio.create_task(self._run(consumer), name="evsched-replica")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._consumer is not None:
            await self._consumer.stop()
        for projector in self.projectors.values():
            projector.index.close()
        self.projectors.clear()

    async def __aenter__(self) -> Replica:
        await self.start()
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.stop()

    async def _run(self, consumer: AIOKafkaConsumer) -> None:
        while True:
            self._resume_due(consumer)
            try:
                batches = await consumer.getmany(timeout_ms=100, max_records=5_000)
            except kafka.KafkaError as exc:
                log.warning("replica_fetch_failed", error=repr(exc), retry_in_s=RETRY_FIRST_S)
                await asyncio.sleep(RETRY_FIRST_S)
                continue
            for tp, raws in batches.items():
                self._apply(consumer, tp, raws)
            if batches:
                async with self._changed:
                    self._changed.notify_all()

    def _apply(self, consumer: AIOKafkaConsumer, tp: TopicPartition, raws: list[Any]) -> None:
        """Fold one partition's batch; a failure pauses that partition alone, never the loop.

        The fold refuses what it cannot carry out, so this is a second line of defence: the
        partition is retried from its index's offset after a growing wait, and shows in
        ``failing`` (and the log) meanwhile. Reads of the other partitions go on.
        """
        partition = tp.partition
        projector = self.projectors[partition]
        try:
            projector.commit(projector.fold(kafka.to_record(r) for r in raws))
        except Exception as exc:
            failures = self._failures.get(partition, 0) + 1
            self._failures[partition] = failures
            wait_s = min(RETRY_MAX_S, RETRY_FIRST_S * 2 ** min(failures - 1, 16))
            self.failing[partition] = f"fold failed at offset {raws[0].offset}: {exc!r}"
            log.error(
                "replica_partition_failed",
                partition=partition,
                offset=raws[0].offset,
                error=repr(exc),
                failures=failures,
                retry_in_s=wait_s,
            )
            # Fold the batch again from what the index holds, once the wait is over.
            projector.next_offset = projector.index.applied_offset() + 1
            consumer.pause(tp)
            consumer.seek(tp, projector.next_offset)
            self._retry_at[partition] = monotonic_s() + wait_s
            return
        if self.failing.pop(partition, None) is not None:
            log.info("replica_partition_recovered", partition=partition)
            self._failures.pop(partition, None)

    def _resume_due(self, consumer: AIOKafkaConsumer) -> None:
        now = monotonic_s()
        for partition, at in list(self._retry_at.items()):
            if at <= now:
                del self._retry_at[partition]
                consumer.resume(TopicPartition(self.topic, partition))

    # --- reads ---------------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        """Started, and its fold loop has not stopped (a crashed loop serves stale reads)."""
        return self._task is not None and not self._task.done()

    async def lag(self) -> dict[int, int]:
        """Records per partition between what this replica has read and the log's end.

        Asks the broker for the end offsets (so it raises when the broker is unreachable); the
        read position is past transaction markers, which the applied offset never reaches.
        """
        consumer = self._consumer
        if consumer is None:
            raise EvschedError("the replica is not started")
        tps = [TopicPartition(self.topic, p) for p in sorted(self.projectors)]
        try:
            ends = await consumer.end_offsets(tps)
            return {tp.partition: max(0, ends[tp] - await consumer.position(tp)) for tp in tps}
        except kafka.KafkaError as exc:
            raise EvschedError(f"cannot read the end offsets of {self.topic}: {exc!r}") from exc

    def partition_of(self, key: str) -> int:
        return partition_for(key, len(self.projectors))

    def index(self, partition: int) -> PartitionIndex:
        return self.projectors[partition].index

    async def job(self, job_id: str) -> JobState | None:
        return self.index(self.partition_of(job_id)).job(job_id)

    def timeline(self, job_id: str) -> list[TimelineEntry]:
        return self.index(self.partition_of(job_id)).timeline(job_id)

    async def wait_for(self, partition: int, offset: int, timeout_s: float = 10.0) -> None:
        """Return once ``offset`` of ``partition`` is folded; TimeoutError after ``timeout_s``."""
        deadline = monotonic_s() + timeout_s
        async with self._changed:
            while self.index(partition).applied_offset() < offset:
                remaining = deadline - monotonic_s()
                if remaining <= 0:
                    raise TimeoutError(f"replica did not reach offset {offset} of p{partition}")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), remaining)


async def rebuild_partition(
    settings: Settings, partition: int, until_offset: int, data_dir: Path
) -> PartitionIndex:
    """Fold ``partition`` from its start through ``until_offset`` into a fresh index."""
    topic = Topics(settings.namespace).events
    tp = TopicPartition(topic, partition)
    index = PartitionIndex(data_dir, partition)
    projector = Projector(index)
    consumer = kafka.consumer(settings, group_id=None, client_id="evsched-rebuild")
    await consumer.start()
    try:
        consumer.assign([tp])
        consumer.seek(tp, index.applied_offset() + 1)
        while index.applied_offset() < until_offset:
            batch = await consumer.getmany(tp, timeout_ms=500, max_records=5_000)
            records = [kafka.to_record(r) for r in batch.get(tp, []) if r.offset <= until_offset]
            if not records and await consumer.position(tp) > until_offset:
                break
            projector.commit(projector.fold(records))
    finally:
        await consumer.stop()
    return index
