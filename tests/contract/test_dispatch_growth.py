"""A worker pool's feed on a dispatch topic that grows while it reads: a record written to a new
partition before the pool noticed the partition is still taken, however old it is by then."""

from __future__ import annotations

import pytest

from evsched.adapters.kafka.clients import GROUP_TIMEOUTS, consumer, producer
from evsched.adapters.kafka.dispatch_feed import KafkaDispatchFeed
from evsched.adapters.kafka.topic_growth import ShrinkRefused, grow_partitions
from evsched.adapters.kafka.topics import TopicMissing, Topics, partition_count
from evsched.ports import Record
from evsched.settings import Settings
from tests.contract.conftest import eventually

pytestmark = pytest.mark.broker


def member(settings: Settings, topic: str, *, lookback_ms: int) -> KafkaDispatchFeed:
    group = f"{settings.namespace}.workers.growth"

    def make() -> object:
        # Metadata read again every second: the test needs the pool to notice the growth soon,
        # but only after the record was written.
        return consumer(
            settings,
            group_id=group,
            client_id="evsched-contract-growth",
            metadata_max_age_ms=1_000,
            **GROUP_TIMEOUTS,
        )

    return KafkaDispatchFeed(make, [topic], start_lookback_ms=lookback_ms)


async def test_a_record_on_an_added_partition_is_taken(settings: Settings) -> None:
    topic = Topics(settings.namespace).dispatch("default")
    before = await partition_count(settings.bootstrap, topic)
    # No look-back at all: a pool new to a partition would start at its end, so only the
    # "added partition starts at its first record" rule can deliver what is written there.
    feed = member(settings, topic, lookback_ms=0)
    send = producer(settings, client_id="evsched-contract-node")
    await send.start()
    await feed.start()
    try:
        taken: list[Record] = []

        async def took(value: bytes) -> list[Record] | None:
            taken.extend(await feed.take(10, 0.2))
            return taken if value in [r.value for r in taken] else None

        async def reading() -> list[Record] | None:
            # Until the pool has joined and positioned, a record may land behind its start.
            await send.send_and_wait(topic, b"old", key=b"job-0", partition=0)
            return await took(b"old")

        await eventually(reading, "the pool reading partition 0")
        growth = await grow_partitions(settings, topic, before + 2)
        assert (growth.before, growth.after) == (before, before + 2)
        # A producer of its own: the first one's metadata does not know the new partitions yet.
        late = producer(settings, client_id="evsched-contract-node-2")
        await late.start()
        try:
            await late.send_and_wait(topic, b"new", key=b"job-1", partition=before + 1)
        finally:
            await late.stop()
        await eventually(lambda: took(b"new"), "the record on the added partition taken", 60.0)
        assert [r.value for r in taken].count(b"new") == 1
    finally:
        await feed.close()
        await send.stop()


async def test_growing_refuses_to_shrink_and_a_missing_topic(settings: Settings) -> None:
    topic = Topics(settings.namespace).dispatch("default")
    count = await partition_count(settings.bootstrap, topic)
    with pytest.raises(ShrinkRefused, match=f"has {count} partitions"):
        await grow_partitions(settings, topic, count - 1)
    same = await grow_partitions(settings, topic, count)
    assert (same.before, same.after) == (count, count)
    with pytest.raises(TopicMissing):
        await grow_partitions(settings, Topics(settings.namespace).dispatch("nope"), 4)
    assert await partition_count(settings.bootstrap, topic) == count
