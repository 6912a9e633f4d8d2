"""Dispatch partitions apart from the events partitions: the setting, the topic check, and where a
worker pool starts on a partition it has never read (a new pool, or a partition added since)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import pytest
from aiokafka import TopicPartition
from structlog.testing import capture_logs

from evsched.adapters.kafka.dispatch_feed import KafkaDispatchFeed
from evsched.adapters.kafka.topics import ObservedTopic, find_mismatches, topic_specs
from evsched.settings import Settings, SettingsError
from evsched.testing import FrozenClock

TOPIC = "ns.dispatch.default"
NOW_MS = 1_000_000


def test_the_setting_is_read_from_the_environment_and_defaults_to_none() -> None:
    assert Settings.from_env({}).dispatch_partitions is None
    assert Settings.from_env({"EVSCHED_DISPATCH_PARTITIONS": ""}).dispatch_partitions is None
    settings = Settings.from_env({"EVSCHED_DISPATCH_PARTITIONS": "12"})
    assert settings.dispatch_partitions == 12
    assert "dispatch_partitions=12" in repr(settings)


@pytest.mark.parametrize("bad", ["0", "-3", "many"])
def test_a_bad_value_names_the_variable(bad: str) -> None:
    with pytest.raises(SettingsError, match="EVSCHED_DISPATCH_PARTITIONS"):
        Settings.from_env({"EVSCHED_DISPATCH_PARTITIONS": bad})


def test_dispatch_topics_get_their_own_count_and_the_others_keep_the_events_count() -> None:
    specs = topic_specs("ns", event_partitions=1, queues=["a", "b"], dispatch_partitions=4)
    counts = {spec.name: spec.partitions for spec in specs}
    assert counts == {
        "ns.events": 1,
        "ns.dispatch.a": 4,
        "ns.dispatch.b": 4,
        "ns.effects": 1,
        "ns.state": 1,
    }
    unset = topic_specs("ns", event_partitions=3, queues=["a"])
    assert {spec.name: spec.partitions for spec in unset}["ns.dispatch.a"] == 3


def observed(spec_configs: Any, partitions: int) -> ObservedTopic:
    return ObservedTopic(partitions=partitions, replication_factor=1, configs=spec_configs)


def test_a_grown_dispatch_topic_is_fine_and_a_smaller_one_is_reported() -> None:
    [events, dispatch, *_] = topic_specs(
        "ns", event_partitions=2, queues=["q"], dispatch_partitions=4
    )
    assert find_mismatches(dispatch, observed(dispatch.configs, 4)) == []
    assert find_mismatches(dispatch, observed(dispatch.configs, 9)) == []
    [fewer] = find_mismatches(dispatch, observed(dispatch.configs, 3))
    assert (fewer.topic, fewer.setting, fewer.actual, fewer.expected) == (
        "ns.dispatch.q",
        "partitions",
        "3",
        ">= 4",
    )
    # The events topic's count is the namespace's for life: more is as wrong as fewer.
    [more] = find_mismatches(events, observed(events.configs, 3))
    assert (more.setting, more.expected) == ("partitions", "2")


@dataclass
class Found:
    offset: int
    metadata: str = ""


class Coordinator:
    def __init__(self, committed: dict[int, tuple[int, str]]) -> None:
        self.committed = committed

    async def fetch_committed_offsets(self, tps: list[TopicPartition]) -> dict[Any, Found]:
        return {tp: Found(*self.committed.get(tp.partition, (-1, ""))) for tp in tps}


class Consumer:
    """What position_new asks of aiokafka's consumer, over a fixed layout of one topic.

    ``committed`` maps a partition to its committed offset and the commit's metadata.
    """

    def __init__(
        self, partitions: int, committed: dict[int, tuple[int, str]], by_time: dict[int, int]
    ):
        self.partitions = partitions
        self._coordinator = Coordinator(committed)
        self._by_time = by_time
        self.asked_since: set[int] = set()
        self.seeks: dict[int, int] = {}
        self.commits: list[dict[int, tuple[int, str]]] = []
        self.paused_now: set[TopicPartition] = set()
        # The partitions paused at each committed() and commit(): while the start is decided.
        self.paused_while_deciding: list[set[TopicPartition]] = []
        self.gate = asyncio.Event()  # committed() waits for it
        self.gate.set()

    def subscribe(self, topics: object, listener: object = None) -> None:
        return None

    async def start(self) -> None:
        return None

    def pause(self, *partitions: TopicPartition) -> None:
        self.paused_now |= set(partitions)

    def resume(self, *partitions: TopicPartition) -> None:
        self.paused_now -= set(partitions)

    def paused(self) -> set[TopicPartition]:
        return set(self.paused_now)

    def assignment(self) -> set[TopicPartition]:
        return {TopicPartition(TOPIC, p) for p in range(self.partitions)}

    async def getmany(
        self, *partitions: TopicPartition, timeout_ms: int, max_records: int
    ) -> dict[Any, Any]:
        return {}

    async def committed(self, tp: TopicPartition) -> int | None:
        self.paused_while_deciding.append(set(self.paused_now))
        await self.gate.wait()
        found = self._coordinator.committed.get(tp.partition)
        return None if found is None else found[0]

    def partitions_for_topic(self, topic: str) -> set[int]:
        return set(range(self.partitions)) if topic == TOPIC else set()

    async def end_offsets(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        return {tp: 50 for tp in tps}

    async def beginning_offsets(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        return {tp: 0 for tp in tps}

    async def offsets_for_times(
        self, times: dict[TopicPartition, int]
    ) -> dict[TopicPartition, Found | None]:
        self.asked_since |= set(times.values())
        return {tp: _found(self._by_time.get(tp.partition)) for tp in times}

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.seeks[tp.partition] = offset

    async def commit(self, offsets: dict[TopicPartition, tuple[int, str]]) -> None:
        self.paused_while_deciding.append(set(self.paused_now))
        self.commits.append({tp.partition: o for tp, o in offsets.items()})


def _found(offset: int | None) -> Found | None:
    return None if offset is None else Found(offset)


async def feed_over(client: Consumer) -> KafkaDispatchFeed:
    feed = KafkaDispatchFeed(lambda: client, [TOPIC], clock=FrozenClock(NOW_MS))
    await feed.start()
    return feed


def tps(*partitions: int) -> list[TopicPartition]:
    return [TopicPartition(TOPIC, p) for p in partitions]


async def test_a_new_pool_starts_at_the_last_minute_of_records() -> None:
    client = Consumer(2, committed={}, by_time={0: 40})
    with capture_logs() as logs:
        await (await feed_over(client)).position_new(tps(0, 1))
    # p0 has records of the last minute from offset 40; p1 none: it starts at its end. The
    # commit records the topic's partition count as the member knows it.
    assert client.seeks == {0: 40, 1: 50}
    assert client.commits == [{0: (40, "partitions=2"), 1: (50, "partitions=2")}]
    assert client.asked_since == {NOW_MS - 60_000}
    [positioned] = [e for e in logs if e["event"] == "dispatch_start_positioned"]
    assert positioned["added"] == []


async def test_a_partition_added_to_a_topic_the_pool_reads_starts_at_its_first_record() -> None:
    # The pool committed p0..p2 while the topic had 3; it grew to 5: p3 and p4 are new to it.
    # Records written there before the pool noticed them may be older than the look-back.
    before = {p: (7, "partitions=3") for p in range(3)}
    client = Consumer(5, committed=before, by_time={3: 30, 4: 30})
    with capture_logs() as logs:
        await (await feed_over(client)).position_new(tps(2, 3, 4))
    assert client.seeks == {3: 0, 4: 0}
    assert client.commits == [{3: (0, "partitions=5"), 4: (0, "partitions=5")}]
    assert client.asked_since == set()
    [positioned] = [e for e in logs if e["event"] == "dispatch_start_positioned"]
    assert positioned["added"] == [f"{TOPIC}[3]", f"{TOPIC}[4]"]


async def test_the_members_of_a_new_pool_do_not_take_each_other_for_a_growth() -> None:
    # Another member of the same new pool committed p0 and p1 a moment ago, knowing the topic's
    # 4 partitions: p2 and p3 existed then, so they start at the last minute, not at 0.
    client = Consumer(4, committed={0: (9, "partitions=4"), 1: (9, "partitions=4")}, by_time={})
    await (await feed_over(client)).position_new(tps(2, 3))
    assert client.seeks == {2: 50, 3: 50}


async def test_commits_without_a_partition_count_prove_no_growth() -> None:
    # Commits of an older evsched carry no metadata: such a pool starts new partitions at the
    # last minute, as before.
    client = Consumer(3, committed={0: (1, ""), 1: (1, "other")}, by_time={2: 5})
    await (await feed_over(client)).position_new(tps(2))
    assert client.seeks == {2: 5}


async def test_any_sibling_committed_before_the_growth_marks_it() -> None:
    # One member already committed p0 knowing the new count (6); p1 was last committed before
    # (4): p4 and p5 are still new to the pool.
    committed = {0: (3, "partitions=6"), 1: (3, "partitions=4"), 2: (3, ""), 3: (3, "")}
    client = Consumer(6, committed=committed, by_time={})
    await (await feed_over(client)).position_new(tps(4, 5))
    assert client.seeks == {4: 0, 5: 0}


async def test_partitions_the_pool_has_committed_are_left_where_they_are() -> None:
    client = Consumer(2, committed={0: (3, ""), 1: (4, "")}, by_time={})
    await (await feed_over(client)).position_new(tps(0, 1))
    assert client.seeks == {}
    assert client.commits == []


async def test_a_topic_without_metadata_records_no_count() -> None:
    client = Consumer(0, committed={}, by_time={})
    await (await feed_over(client)).position_new(tps(0))
    assert client.commits == [{0: (50, "")}]


async def test_the_partitions_stay_paused_until_their_start_is_committed() -> None:
    # Unpaused, the fetcher reads a fresh partition from its earliest offset meanwhile, a take
    # commits that, and the start's commit goes over it: the pool takes those records again.
    client = Consumer(2, committed={0: (3, "")}, by_time={1: 40})
    await (await feed_over(client)).position_new(tps(0, 1))
    assert client.commits == [{1: (40, "partitions=2")}]
    assert client.paused_while_deciding == [set(tps(0, 1))] * 3  # two committed(), one commit
    assert client.paused_now == set()  # resumed once decided


async def test_a_take_while_the_start_is_decided_leaves_those_partitions_paused() -> None:
    client = Consumer(2, committed={}, by_time={})
    client.gate.clear()
    feed = await feed_over(client)
    deciding = asyncio.create_task(feed.position_new(tps(0, 1)))
    while not client.paused_while_deciding:  # until it waits in its first committed()
        await asyncio.sleep(0)
    client.pause(TopicPartition(TOPIC, 7))  # paused by a full worker: a take resumes that one
    assert await feed.take(10, 0.0) == []
    assert client.paused_now == set(tps(0, 1))
    client.gate.set()
    await deciding
    assert client.paused_now == set()
