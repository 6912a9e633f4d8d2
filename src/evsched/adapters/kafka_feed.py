"""The DispatchFeed on Kafka: a worker pool's consumer group on its queues' dispatch topics."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import structlog
from aiokafka import ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import CommitFailedError, IllegalStateError

from evsched.adapters.clock import SYSTEM_CLOCK
from evsched.adapters.kafka import KafkaError, consumer, group_timeouts, to_record
from evsched.errors import BrokerUnavailable, RebalanceCommitFailed
from evsched.ports import Clock, Record
from evsched.settings import Settings

log = structlog.get_logger("evsched.worker")
# Where a pool with no committed offset starts on a dispatch partition: records of the last
# minute, twice the default dispatch timeout (older ones are past their start deadline).
START_LOOKBACK_MS = 60_000


class KafkaDispatchFeed:
    """A consumer in group ``<ns>.workers.<pool>`` on the dispatch topics of the pool's queues.

    It fetches only as many records as the worker can start; while the worker is full, its
    partitions are paused and polled, so the group does not evict it for being idle.

    Where the pool has no committed offset yet (a new pool, or a queue newly added to it), it
    starts at the records of the last ``start_lookback_ms``, not at offset 0: anything older is
    past its start deadline and would only be skipped, or re-run a job that has long finished.
    That start is committed at once, so every later member of the pool starts there as well.
    """

    def __init__(
        self,
        consumer_factory: Callable[[], Any],
        topics: Sequence[str] = (),
        *,
        start_lookback_ms: int = START_LOOKBACK_MS,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self._factory = consumer_factory
        self._topics = tuple(topics)
        self._lookback_ms = start_lookback_ms
        self._clock = clock
        self._consumer: Any = None

    @classmethod
    def for_pool(
        cls,
        settings: Settings,
        topics: Sequence[str],
        *,
        group_id: str,
        client_id: str,
        start_lookback_ms: int = START_LOOKBACK_MS,
    ) -> KafkaDispatchFeed:
        """The feed of pool ``group_id``, with the group timeouts every evsched member uses."""
        return cls(
            lambda: consumer(
                settings, group_id=group_id, client_id=client_id, **group_timeouts(settings)
            ),
            topics,
            start_lookback_ms=start_lookback_ms,
        )

    async def start(self) -> None:
        """Join the pool; BrokerUnavailable when the consumer cannot start."""
        self._consumer = self._factory()
        if self._topics:
            self._consumer.subscribe(self._topics, listener=_StartWhereLive(self))
        try:
            await self._consumer.start()
        except KafkaError as exc:
            await self.close()
            raise BrokerUnavailable(f"the worker's consumer could not start: {exc!r}") from exc

    async def close(self) -> None:
        if self._consumer is not None:
            try:
                await self._consumer.stop()
            except KafkaError as exc:  # leaving the group is best effort: its session ends it
                log.warning("dispatch_consumer_stop_failed", error=repr(exc))

    async def take(self, max_records: int, timeout_s: float) -> list[Record]:
        c = self._consumer
        try:
            if max_records <= 0:
                c.pause(*c.assignment())
                await c.getmany(timeout_ms=0)
                return []
            if paused := c.paused():
                c.resume(*paused)
            batches = await c.getmany(timeout_ms=int(timeout_s * 1000), max_records=max_records)
        except KafkaError as exc:
            log.warning("dispatch_poll_failed", error=repr(exc))
            await asyncio.sleep(timeout_s)  # back off, then let the loop poll again
            return []
        if not batches:
            return []
        offsets = {tp: rs[-1].offset + 1 for tp, rs in batches.items()}
        try:
            await self._commit(offsets)
        except RebalanceCommitFailed as exc:
            # The offsets stay where they were, and whoever owns the partitions after the
            # rebalance (another member, or this one after rejoining) reads these records again
            # from there. Running them here as well would run the same live token twice, which
            # fencing cannot tell apart.
            log.warning("dispatch_dropped_after_rebalance", offsets=_named(offsets), error=str(exc))
            return []
        return [to_record(raw) for records in batches.values() for raw in records]

    async def position_new(self, assigned: Iterable[TopicPartition]) -> None:
        """Give partitions the pool has never committed a start, and commit it."""
        c = self._consumer
        fresh = [tp for tp in assigned if await c.committed(tp) is None]
        if not fresh:
            return
        since = self._clock.now_ms() - self._lookback_ms
        # The ends first: a record written between the two requests is then either found by
        # time or at or after its partition's end, never skipped.
        ends = await c.end_offsets(fresh)
        found = await c.offsets_for_times(dict.fromkeys(fresh, since))
        starts = {tp: ends[tp] if found.get(tp) is None else found[tp].offset for tp in fresh}
        for tp, offset in starts.items():
            c.seek(tp, offset)
        log.info("dispatch_start_positioned", offsets=_named(starts), lookback_ms=self._lookback_ms)
        try:
            await c.commit(starts)
        except KafkaError as exc:  # the next take commits it; until then a rebalance re-decides
            log.warning("dispatch_start_commit_failed", error=repr(exc))

    async def _commit(self, offsets: dict[Any, int]) -> None:
        """Commit what was taken; RebalanceCommitFailed when the group took the partitions."""
        try:
            await self._consumer.commit(offsets)
        except (CommitFailedError, IllegalStateError) as exc:
            # CommitFailedError: the group rebalanced under this member (e.g. it was evicted
            # after a freeze). IllegalStateError: a rebalance began, or ended, without these
            # partitions here. Either way the group refused the commit.
            raise RebalanceCommitFailed(f"the group refused the commit: {exc!r}") from exc
        except KafkaError as exc:
            # Anything else: the records may be dispatched again, which fencing makes safe;
            # dropping them could lose them.
            log.warning("dispatch_commit_failed", error=repr(exc))


def _named(offsets: dict[Any, int]) -> dict[str, int]:
    return {f"{tp.topic}[{tp.partition}]": offset for tp, offset in sorted(offsets.items())}


class _StartWhereLive(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, feed: KafkaDispatchFeed) -> None:
        self._feed = feed

    async def on_partitions_revoked(self, revoked: Iterable[TopicPartition]) -> None:
        return None

    async def on_partitions_assigned(self, assigned: Iterable[TopicPartition]) -> None:
        await self._feed.position_new(assigned)
