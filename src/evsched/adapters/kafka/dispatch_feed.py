"""The DispatchFeed on Kafka: a worker pool's consumer group on its queues' dispatch topics."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import structlog
from aiokafka import ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import CommitFailedError, IllegalStateError

from evsched.adapters.clock import SYSTEM_CLOCK
from evsched.adapters.kafka.client_logs import group_joined
from evsched.adapters.kafka.clients import (
    GROWTH_NOTICE_MS,
    KafkaError,
    consumer,
    group_timeouts,
    to_record,
)
from evsched.errors import BrokerUnavailable, RebalanceCommitFailed
from evsched.ports import Clock, Record
from evsched.settings import Settings

log = structlog.get_logger("evsched.worker")
# Where a pool with no committed offset starts on a dispatch partition: records of the last
# minute, twice the default dispatch timeout (older ones are past their start deadline).
START_LOOKBACK_MS = 60_000
# The metadata of every commit of a pool: the topic's partition count the member knew then.
LAYOUT = "partitions="


class KafkaDispatchFeed:
    """A consumer in group ``<ns>.workers.<pool>`` on the dispatch topics of the pool's queues.

    It fetches only as many records as the worker can start; while the worker is full, its
    partitions are paused and polled, so the group does not evict it for being idle.

    It hands records out in turn across its partitions (in offset order within each). aiokafka
    hands out what it fetched in the order of its fetch response, and a pause drops what it
    holds, so a worker that took a free slot's worth at a time after each pause drained the
    first partitions of the response and starved the last: in the priority test a node's four
    leased jobs waited 2.5 s for a start while the other node's were started. The feed so keeps
    up to a take's worth per partition that it read but has not handed out (uncommitted: after
    a crash or a rebalance whoever owns the partition reads them again from the commit).

    Where the pool has no committed offset yet (a new pool, or a queue newly added to it), it
    starts at the records of the last ``start_lookback_ms``, not at offset 0: anything older is
    past its start deadline and would only be skipped, or re-run a job that has long finished.
    That start is committed at once, so every later member of the pool starts there as well.

    A partition added to a topic the pool already reads (``evsched queues partitions``) starts
    at its first record instead: nodes may have written to it before the pool noticed it, and
    its records are all younger than the partition; those past their start deadline are
    dropped by the worker like any stale dispatch, and their leases expire and are granted again.
    Every commit carries, as its metadata, how many partitions the topic had for the member
    (``partitions=N``): a fresh partition numbered at least the N of a sibling's commit did not
    exist when the pool read that sibling. (Only "some sibling is committed" would not do: the
    members of a new pool position their partitions at the same time, and one would take
    another's fresh commit for a sign that the topic grew, and read it from the beginning.)
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
        # The partitions ``position_new`` is giving a start: paused, and no take resumes them.
        self._held: set[TopicPartition] = set()
        # Read but not handed out yet, per partition in offset order; the last partition served.
        self._read: dict[TopicPartition, deque[Any]] = {}
        self._last: TopicPartition | None = None

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
                settings,
                group_id=group_id,
                client_id=client_id,
                # A dispatch topic grown while the pool runs is noticed (and rebalanced) this soon.
                metadata_max_age_ms=GROWTH_NOTICE_MS,
                **group_timeouts(settings),
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
        if self._topics:
            group_joined()  # a subscribed consumer's start returns once it has its assignment

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
            if paused := c.paused() - self._held:
                c.resume(*paused)
            await self._read_ahead(max_records)
            if not self._read:
                batches = await c.getmany(timeout_ms=int(timeout_s * 1000), max_records=max_records)
                self._keep(batches)
                await self._read_ahead(max_records)  # the rest of that fetch, every partition
        except KafkaError as exc:
            log.warning("dispatch_poll_failed", error=repr(exc))
            await asyncio.sleep(timeout_s)  # back off, then let the loop poll again
            return []
        batches = self._in_turn(max_records)
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
            self._read.clear()  # read past a commit that may no longer be this member's
            return []
        return [to_record(raw) for records in batches.values() for raw in records]

    async def _read_ahead(self, wanted: int) -> None:
        """Top each readable partition's read records up to ``wanted`` from what the client
        already fetched (no wait)."""
        c = self._consumer
        for tp in sorted(c.assignment() - c.paused()):
            short = wanted - len(self._read.get(tp, ()))
            if short > 0:
                self._keep(await c.getmany(tp, timeout_ms=0, max_records=short))

    def _keep(self, batches: dict[Any, list[Any]]) -> None:
        for tp, records in batches.items():
            if records:
                self._read.setdefault(tp, deque()).extend(records)

    def _in_turn(self, count: int) -> dict[Any, list[Any]]:
        """Up to ``count`` read records, a partition at a time, from the first after the last
        partition served (in topic and partition order, wrapping round)."""
        assigned = self._consumer.assignment()
        self._read = {tp: rs for tp, rs in self._read.items() if rs and tp in assigned}
        order = sorted(self._read)  # TopicPartition sorts by topic, then partition
        after = [tp for tp in order if self._last is not None and tp > self._last]
        order = after + [tp for tp in order if tp not in after]
        taken: dict[Any, list[Any]] = {}
        while count > 0 and any(self._read[tp] for tp in order):
            for tp in order:
                if count > 0 and self._read[tp]:
                    taken.setdefault(tp, []).append(self._read[tp].popleft())
                    count -= 1
                    self._last = tp
        self._read = {tp: rs for tp, rs in self._read.items() if rs}
        return taken

    def forget(self, revoked: Iterable[TopicPartition]) -> None:
        """Drop what was read from partitions this member no longer owns: their next owner reads
        them from the commit."""
        for tp in revoked:
            self._read.pop(tp, None)

    async def position_new(self, assigned: Iterable[TopicPartition]) -> None:
        """Give partitions the pool has never committed a start, and commit it.

        Every assigned partition is paused first, before anything is awaited, and stays out of
        every take until its start is committed. Otherwise the fetcher reads a fresh partition
        from its earliest offset meanwhile (``auto_offset_reset``), a take commits what it read,
        and the seek and commit below put an older start over that commit: the pool runs those
        records again (the contract test caught it under load), and older ones than the lookback.
        """
        held = list(assigned)
        self._consumer.pause(*held)
        self._held = set(held)
        try:
            await self._position_new(held)
        finally:
            self._held = set()
            # As after any rebalance: a worker that is full pauses them again at its next take.
            self._consumer.resume(*held)

    async def _position_new(self, assigned: Sequence[TopicPartition]) -> None:
        c = self._consumer
        fresh = [tp for tp in assigned if await c.committed(tp) is None]
        if not fresh:
            return
        added = await self._added(fresh)
        starts = await self._recent_starts([tp for tp in fresh if tp not in added])
        if added:
            starts |= await c.beginning_offsets(added)
        for tp, offset in starts.items():
            c.seek(tp, offset)
        log.info(
            "dispatch_start_positioned",
            offsets=_named(starts),
            lookback_ms=self._lookback_ms,
            added=sorted(f"{tp.topic}[{tp.partition}]" for tp in added),
        )
        try:
            await c.commit(self._with_layout(starts))
        except KafkaError as exc:  # the next take commits it; until then a rebalance re-decides
            log.warning("dispatch_start_commit_failed", error=repr(exc))

    async def _added(self, fresh: Sequence[TopicPartition]) -> list[TopicPartition]:
        """The partitions of ``fresh`` that were added to their topic since the pool read it."""
        c = self._consumer
        added: list[TopicPartition] = []
        for topic in sorted({tp.topic for tp in fresh}):
            siblings = [
                TopicPartition(topic, p)
                for p in sorted(c.partitions_for_topic(topic) or ())
                if TopicPartition(topic, p) not in fresh
            ]
            seen = [_layout(m) for m in (await _committed_metadata(c, siblings)).values()]
            known = [n for n in seen if n is not None]
            if known:
                added += [tp for tp in fresh if tp.topic == topic and tp.partition >= min(known)]
        return added

    def _with_layout(self, offsets: dict[Any, int]) -> dict[Any, tuple[int, str]]:
        """``offsets`` with the metadata of each commit: its topic's partition count now."""
        layout = {tp.topic: self._consumer.partitions_for_topic(tp.topic) for tp in offsets}
        # Without metadata for the topic, nothing is recorded rather than a count of 0.
        return {
            tp: (o, f"{LAYOUT}{len(layout[tp.topic])}" if layout[tp.topic] else "")
            for tp, o in offsets.items()
        }

    async def _recent_starts(self, fresh: Sequence[TopicPartition]) -> dict[TopicPartition, int]:
        """The first offset of the last ``lookback_ms`` on each of ``fresh``."""
        if not fresh:
            return {}
        c = self._consumer
        since = self._clock.now_ms() - self._lookback_ms
        # The ends first: a record written between the two requests is then either found by
        # time or at or after its partition's end, never skipped.
        ends = await c.end_offsets(fresh)
        found = await c.offsets_for_times(dict.fromkeys(fresh, since))
        return {tp: ends[tp] if found.get(tp) is None else found[tp].offset for tp in fresh}

    async def _commit(self, offsets: dict[Any, int]) -> None:
        """Commit what was taken; RebalanceCommitFailed when the group took the partitions."""
        try:
            await self._consumer.commit(self._with_layout(offsets))
        except (CommitFailedError, IllegalStateError) as exc:
            # CommitFailedError: the group rebalanced under this member (e.g. it was evicted
            # after a freeze). IllegalStateError: a rebalance began, or ended, without these
            # partitions here. Either way the group refused the commit.
            raise RebalanceCommitFailed(f"the group refused the commit: {exc!r}") from exc
        except KafkaError as exc:
            # Anything else: the records may be dispatched again, which fencing makes safe;
            # dropping them could lose them.
            log.warning("dispatch_commit_failed", error=repr(exc))


async def _committed_metadata(c: Any, tps: Sequence[TopicPartition]) -> dict[TopicPartition, str]:
    """The metadata of each committed offset of ``tps`` (never committed ones are missing).

    aiokafka's ``committed()`` returns the offset alone; its group coordinator's fetch (what
    ``committed()`` calls) also has the metadata.
    """
    found = await c._coordinator.fetch_committed_offsets(list(tps))
    return {tp: meta.metadata or "" for tp, meta in found.items() if meta.offset >= 0}


def _layout(metadata: str) -> int | None:
    """The partition count a commit's metadata recorded, None when it recorded none."""
    count = metadata.removeprefix(LAYOUT)
    return int(count) if metadata.startswith(LAYOUT) and count.isdigit() else None


def _named(offsets: dict[Any, int]) -> dict[str, int]:
    return {f"{tp.topic}[{tp.partition}]": offset for tp, offset in sorted(offsets.items())}


class _StartWhereLive(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, feed: KafkaDispatchFeed) -> None:
        self._feed = feed

    async def on_partitions_revoked(self, revoked: Iterable[TopicPartition]) -> None:
        self._feed.forget(revoked)

    async def on_partitions_assigned(self, assigned: Iterable[TopicPartition]) -> None:
        assigned = list(assigned)
        self._feed.forget(assigned)  # they are read again from their commit
        await self._feed.position_new(assigned)
