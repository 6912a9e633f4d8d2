"""The DispatchFeed contract: ``testing.MemoryFeed`` and
``adapters.kafka.dispatch_feed.KafkaDispatchFeed``.

What the worker relies on: ``take`` returns at most what it asked for, commits what it returns
(another member of the pool never gets it again), takes nothing at ``max_records=0`` without
losing anything, and hands records over with their keys and headers. A MemoryFeed stands for a
whole pool (its queue is the pool's), so "another member" of it is the same object.

Records whose commit the group refused are not returned: only Kafka has a group that can
refuse, so that case is Kafka's alone (``test_a_commit_the_group_refused_returns_nothing``);
the twin commits every take, which is what the worker sees of a group that did not rebalance.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol, TypeVar

import pytest

from evsched.adapters.kafka.clients import GROUP_TIMEOUTS, consumer, producer
from evsched.adapters.kafka.dispatch_feed import KafkaDispatchFeed
from evsched.adapters.kafka.topics import Topics
from evsched.ports import DispatchFeed, Record
from evsched.settings import Settings
from evsched.testing import MemoryFeed
from tests.contract.conftest import eventually

Headers = tuple[tuple[str, bytes], ...]
T = TypeVar("T")


class FeedHarness(Protocol):
    feed: DispatchFeed
    topic: str

    async def put(self, value: bytes, *, key: bytes, headers: Headers = ()) -> None:
        """Put a record on the pool's dispatch topic, as a node does."""
        ...

    async def next_member(self) -> DispatchFeed:
        """Another member of the same pool, started, once ``feed`` has left it."""
        ...


async def collect(feed: DispatchFeed, count: int, *, max_records: int = 10) -> list[Record]:
    """Take until ``count`` records came; every take returns at most ``max_records``."""
    got: list[Record] = []

    async def more() -> list[Record] | None:
        batch = await feed.take(max_records, 0.2)
        assert len(batch) <= max_records
        got.extend(batch)
        return got if len(got) >= count else None

    await eventually(more, f"{count} records taken")
    return got


def values(records: list[Record]) -> list[bytes | None]:
    return [r.value for r in records]


class DispatchFeedContract:
    """The suite; a subclass provides the ``harness`` fixture."""

    async def test_take_returns_at_most_what_was_asked_in_order(self, harness: FeedHarness) -> None:
        sent = [f"d{i}".encode() for i in range(5)]
        for value in sent:
            await harness.put(value, key=b"job-1")
        taken = await collect(harness.feed, 5, max_records=2)
        assert values(taken) == sent

    async def test_what_was_taken_is_committed_for_the_pool(self, harness: FeedHarness) -> None:
        for value in (b"a", b"b", b"c"):
            await harness.put(value, key=b"job-1")
        assert values(await collect(harness.feed, 3)) == [b"a", b"b", b"c"]
        member = await harness.next_member()
        await harness.put(b"fresh", key=b"job-1")
        assert values(await collect(member, 1)) == [b"fresh"]

    async def test_zero_takes_nothing_and_loses_nothing(self, harness: FeedHarness) -> None:
        await harness.put(b"live", key=b"job-1")
        assert values(await collect(harness.feed, 1)) == [b"live"]  # the feed is in its pool
        await harness.put(b"held-1", key=b"job-1")
        await harness.put(b"held-2", key=b"job-1")
        for _ in range(3):
            assert await harness.feed.take(0, 0.2) == []
        assert values(await collect(harness.feed, 2)) == [b"held-1", b"held-2"]

    async def test_keys_and_headers_arrive_as_put(self, harness: FeedHarness) -> None:
        headers = (("evsched-signature", b"\x00\x01sig"), ("traceparent", b"00-ab-cd-01"))
        await harness.put(b"payload", key=b"job-7", headers=headers)
        (record,) = await collect(harness.feed, 1)
        assert (record.topic, record.key, record.value) == (harness.topic, b"job-7", b"payload")
        assert record.headers == headers


# --- the twin -------------------------------------------------------------------------------------


class MemoryHarness:
    def __init__(self) -> None:
        self.topic = "ns.dispatch.default"
        self.memory = MemoryFeed(self.topic)
        self.feed: DispatchFeed = self.memory

    async def put(self, value: bytes, *, key: bytes, headers: Headers = ()) -> None:
        self.memory.put(value, key=key, headers=headers)

    async def next_member(self) -> DispatchFeed:
        return self.memory  # the pool's queue itself: what one member took is gone for all


class TestMemoryFeed(DispatchFeedContract):
    @pytest.fixture
    async def harness(self) -> AsyncIterator[FeedHarness]:
        memory = MemoryHarness()
        await memory.feed.start()
        yield memory
        await memory.feed.close()


# --- Kafka ----------------------------------------------------------------------------------------

ConsumerFactory = Callable[[], Any]


class KafkaHarness:
    def __init__(self, settings: Settings, make: Callable[[str], ConsumerFactory]) -> None:
        self.settings = settings
        self.topic = Topics(settings.namespace).dispatch("default")
        self._make = make
        self._members = 0
        self.feed: DispatchFeed = self.member()
        self._producer = producer(settings, client_id="evsched-contract-node")

    def member(self) -> KafkaDispatchFeed:
        self._members += 1
        return KafkaDispatchFeed(self._make(f"evsched-contract-{self._members}"), [self.topic])

    async def start(self) -> None:
        await self._producer.start()
        await self.feed.start()

    async def close(self) -> None:
        await self.feed.close()
        await self._producer.stop()

    async def put(
        self, value: bytes, *, key: bytes, headers: Headers = (), partition: int | None = None
    ) -> None:
        await self._producer.send_and_wait(
            self.topic, value, key=key, headers=list(headers), partition=partition
        )

    async def next_member(self) -> DispatchFeed:
        await self.feed.close()
        self.feed = self.member()
        await self.feed.start()
        return self.feed


def pool_of(settings: Settings, **extra: Any) -> Callable[[str], ConsumerFactory]:
    """Consumer factories of one pool's members, as ``KafkaDispatchFeed.for_pool`` makes them."""
    group = f"{settings.namespace}.workers.contract"
    options = {**GROUP_TIMEOUTS, **extra}
    return lambda client_id: (
        lambda: consumer(settings, group_id=group, client_id=client_id, **options)
    )


class _HeldCommit:
    """Wraps a member's consumer: once ``armed``, its next commit waits for ``release``."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.armed = False
        self.waiting = asyncio.Event()
        self.release = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def commit(self, offsets: Any = None) -> None:
        if self.armed:
            self.armed = False
            self.waiting.set()
            await self.release.wait()
        await self.inner.commit(offsets)


class _SlowStart:
    """Wraps a member's consumer: its first ``committed`` (where the feed begins deciding a fresh
    partition's start) waits for ``release``; every member after the first passes at once."""

    def __init__(self, inner: Any, deciding: asyncio.Event, release: asyncio.Event) -> None:
        self.inner = inner
        self.deciding = deciding
        self.release = release

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def committed(self, tp: Any) -> Any:
        self.deciding.set()
        await self.release.wait()
        return await self.inner.committed(tp)


@pytest.mark.broker
class TestKafkaDispatchFeed(DispatchFeedContract):
    @pytest.fixture
    async def harness(self, settings: Settings) -> AsyncIterator[FeedHarness]:
        real = KafkaHarness(settings, pool_of(settings))
        await real.start()
        yield real
        await real.close()

    async def test_a_worker_taking_a_slot_at_a_time_serves_every_partition_in_turn(
        self, harness: KafkaHarness
    ) -> None:
        # A worker with one slot: it takes one record, is full (a take of 0 pauses its
        # partitions), and takes one more when the slot frees. aiokafka hands out what it
        # fetched in its fetch response's order and drops it on a pause, so the first partition
        # of the response was served until it was empty: the one record on the last partition
        # came after the other 40 (the priority test's high jobs waited seconds that way).
        for i in range(20):
            await harness.put(b"zero-%d" % i, key=b"a", partition=0)
            await harness.put(b"one-%d" % i, key=b"b", partition=1)
        await harness.put(b"two", key=b"c", partition=2)
        got: list[Record] = []
        while len(got) < 6:
            got += await collect(harness.feed, 1, max_records=1)
            assert await harness.feed.take(0, 0.0) == []
        served = [r.partition for r in got]
        # In turn (the last record may come a fetch after the others: one round later at most).
        assert 2 in served[:4] and max(served.count(0), served.count(1)) <= 3, served
        assert [r.value for r in got if r.partition == 0] == [b"zero-0", b"zero-1", b"zero-2"]

    async def test_a_commit_the_group_refused_returns_nothing(self, settings: Settings) -> None:
        # A member stuck between fetching and committing (a frozen worker) past its poll
        # interval leaves the group; the other member gets the partitions and the record.
        # When the stuck commit finally goes, the group refuses it: the record is the other
        # member's to run, and running it here too would run one live token twice.
        pool = pool_of(settings, max_poll_interval_ms=2_000)
        held: list[_HeldCommit] = []

        def stuck(client_id: str) -> ConsumerFactory:
            def make() -> _HeldCommit:
                held.append(_HeldCommit(pool(client_id)()))
                return held[-1]

            return make

        real = KafkaHarness(settings, stuck)
        await real.start()
        other = KafkaDispatchFeed(pool("evsched-contract-other"), [real.topic])
        try:
            await real.put(b"first", key=b"job-1")
            assert values(await collect(real.feed, 1)) == [b"first"]
            held[0].armed = True
            await real.put(b"refused", key=b"job-1")
            stuck_take = asyncio.create_task(real.feed.take(5, 5.0))
            await _within(held[0].waiting.wait(), "the stuck member fetched the record")
            await other.start()
            assert values(await collect(other, 1)) == [b"refused"]
            held[0].release.set()
            assert await _within(stuck_take, "the stuck take") == []
        finally:
            await other.close()
            await real.close()

    async def test_nothing_is_taken_while_a_fresh_partitions_start_is_decided(
        self, settings: Settings
    ) -> None:
        # ci6, ci16 (under load): while the first member was still deciding its start, its
        # fetcher read a, b and c from the earliest offset and a take committed them; then the
        # start's seek and commit put offset 0 back, and the next member took them again.
        pool = pool_of(settings)
        deciding, release = asyncio.Event(), asyncio.Event()

        def slow(client_id: str) -> ConsumerFactory:
            return lambda: _SlowStart(pool(client_id)(), deciding, release)

        real = KafkaHarness(settings, slow)
        await real.start()
        try:
            await _within(deciding.wait(), "the member deciding its partitions' start")
            for value in (b"a", b"b", b"c"):
                await real.put(value, key=b"job-1")
            for _ in range(6):  # 3 s: the fetcher read them in well under that when unheld
                assert await real.feed.take(10, 0.5) == []
            release.set()
            assert values(await collect(real.feed, 3)) == [b"a", b"b", b"c"]
            member = await real.next_member()
            await real.put(b"fresh", key=b"job-1")
            assert values(await collect(member, 1)) == [b"fresh"]
        finally:
            release.set()
            await real.close()


async def _within(step: Awaitable[T], what: str, timeout_s: float = 30.0) -> T:
    try:
        return await asyncio.wait_for(step, timeout_s)
    except TimeoutError:
        raise AssertionError(f"not within {timeout_s} s: {what}") from None
