"""``ports.JobFeed`` on Kafka: one group-less read_committed consumer shared by every follow.

Every partition of the topic is assigned and paused; a partition is resumed (from the lowest
offset any follow of it asks for) while someone follows a job on it, and paused again after. So a
follower reads only the partitions of the jobs it follows, from where they matter, and never
joins a group or commits anything.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator
from typing import Any

import structlog
from aiokafka.structs import TopicPartition

from evsched.adapters.kafka import clients as kafka
from evsched.adapters.kafka.partition_log import broker_errors, partition_for, start_consumer
from evsched.adapters.kafka.topics import partition_count
from evsched.errors import BrokerUnavailable, EvschedError
from evsched.ports import Record
from evsched.settings import Settings

log = structlog.get_logger("evsched.follow")

READ_WAIT_MS = 200
RETRY_S = 1.0
# A follower waits on one job's next event: fetch as soon as anything is there.
LATENCY_OPTIONS = {"fetch_max_wait_ms": 100, "fetch_min_bytes": 1, "max_poll_records": 2_000}


class _Follow:
    """One caller's follow: the job's key, and the next offset it has not been given yet."""

    __slots__ = ("key", "next", "partition", "queue")

    def __init__(self, key: bytes, partition: int, offset: int) -> None:
        self.key = key
        self.partition = partition
        self.next = offset
        self.queue: asyncio.Queue[Record] = asyncio.Queue()


class KafkaJobFeed:
    """Follows jobs of ``topic`` (the events topic); use on the loop that started it."""

    def __init__(
        self, settings: Settings, topic: str, *, client_id: str, partitions: int | None = None
    ) -> None:
        self._settings = settings
        self.topic = topic
        self._client_id = client_id
        self._consumer: Any = None  # made in start(): aiokafka binds it to the running loop
        self._count = partitions
        self._follows: dict[int, list[_Follow]] = {}
        # Bumped by every seek of a partition: a fetch begun before it may return records from
        # before the seek (and move the position past it), so they are dropped and the
        # partition sought again.
        self._epochs: dict[int, int] = {}
        self._read_to: dict[int, int] = {}
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        if self._count is None:
            try:
                self._count = await partition_count(
                    self._settings.bootstrap, self.topic, **dict(self._settings.kafka_options)
                )
            except EvschedError as exc:
                raise BrokerUnavailable(str(exc)) from exc
        self._consumer = kafka.consumer(
            self._settings, group_id=None, client_id=self._client_id, **LATENCY_OPTIONS
        )
        what = f"start a follower of {self.topic}"
        await start_consumer(self._consumer, what)
        with broker_errors(what):
            tps = [self._tp(p) for p in range(self._count)]
            self._consumer.assign(tps)
            self._consumer.pause(*tps)
        self._task = asyncio.create_task(self._run(), name=f"evsched-follow-{self.topic}")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._consumer is not None:
            with contextlib.suppress(kafka.KafkaError):
                await self._consumer.stop()

    async def partition_of(self, job_id: str) -> int:
        if self._count is None:
            raise EvschedError("the job feed is not started")
        return partition_for(job_id, self._count)

    async def follow(
        self, job_id: str, partition: int, offset: int
    ) -> AsyncGenerator[Record, None]:
        if self._count is None or not 0 <= partition < self._count:
            raise EvschedError(f"{self.topic} has no partition {partition}")
        watch = _Follow(job_id.encode(), partition, max(0, offset))
        self._add(watch)
        try:
            while True:
                yield await watch.queue.get()
        finally:
            self._remove(watch)

    def _tp(self, partition: int) -> TopicPartition:
        return TopicPartition(self.topic, partition)

    def _add(self, watch: _Follow) -> None:
        partition = watch.partition
        others = self._follows.setdefault(partition, [])
        others.append(watch)
        if len(others) == 1 or watch.next < self._read_to.get(partition, 0):
            # Newly followed, or asked from before what was read: read again from there.
            self._seek(partition, watch.next)
            if len(others) == 1:
                self._consumer.resume(self._tp(partition))
        self._changed.set()

    def _remove(self, watch: _Follow) -> None:
        left = self._follows.get(watch.partition, [])
        if watch in left:
            left.remove(watch)
        if not left:
            self._follows.pop(watch.partition, None)
            with contextlib.suppress(Exception):  # closing: the consumer may be gone already
                self._consumer.pause(self._tp(watch.partition))

    def _seek(self, partition: int, offset: int) -> None:
        self._consumer.seek(self._tp(partition), offset)
        self._epochs[partition] = self._epochs.get(partition, 0) + 1
        self._read_to[partition] = offset

    async def _run(self) -> None:
        while True:
            if not self._follows:
                self._changed.clear()
                await self._changed.wait()
                continue
            epochs = dict(self._epochs)
            try:
                batches = await self._consumer.getmany(
                    timeout_ms=READ_WAIT_MS, max_records=LATENCY_OPTIONS["max_poll_records"]
                )
            except kafka.KafkaError as exc:
                log.warning("follow_fetch_failed", topic=self.topic, error=repr(exc))
                await asyncio.sleep(RETRY_S)
                continue
            sought = {p for p, epoch in self._epochs.items() if epoch != epochs.get(p, 0)}
            for partition in sought:
                # A fetch begun before the seek may have moved the position past it when it
                # returned: seek again, now that no fetch is under way.
                self._consumer.seek(self._tp(partition), self._read_to[partition])
            for tp, raws in batches.items():
                if raws and tp.partition not in sought:
                    self._deliver(tp.partition, raws)

    def _deliver(self, partition: int, raws: list[Any]) -> None:
        follows = self._follows.get(partition, [])
        for raw in raws:
            # Most records are other jobs': match on the raw key, convert only what is given.
            record: Record | None = None
            for watch in follows:
                if raw.key == watch.key and raw.offset >= watch.next:
                    record = record or kafka.to_record(raw)
                    watch.next = raw.offset + 1
                    watch.queue.put_nowait(record)
        last = raws[-1].offset + 1
        self._read_to[partition] = max(self._read_to.get(partition, 0), last)
